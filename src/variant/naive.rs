//! `naive` and `naive-unsafe`: standard attention with the score matrix materialized
//! (kernel: `backend::cpu::naive`). Extra memory 4*b*h*n_q*n_kv bytes: the O(n^2) baseline
//! of every paper. Takes a sliding `window` (panels before every row's window skipped).

use super::{single_device_windowed, wrong_saved, Saved, Variant, VariantInfo};
use crate::backend::cpu::isa::Isa;
use crate::backend::cpu::naive as kernel;
use crate::backend::cpu::naive_bwd as bwd;
use crate::backend::cpu::tiles::ReadPath;
use crate::backend::cpu::workspace::{try_scratch, Workspace};
use crate::backend::cuda::plan::GpuAlgo;
use crate::error::Result;
use crate::problem::{Case, Grads, Inputs, Mode};

pub struct Naive {
    info: &'static VariantInfo,
    safe: bool,
}

pub static NAIVE: Naive = Naive {
    info: &VariantInfo {
        name: "naive",
        description: "materialized S = QK^T/sqrt(d), safe softmax (row max subtracted), then PV",
        source: "standard attention, the baseline of Rabe & Staats 2021 (Sec. 1)",
        modes: &[Mode::Fwd, Mode::FwdBwd],
        default_q_chunk: None,
        default_kv_chunk: None,
        numerically_safe: true,
    },
    safe: true,
};

pub static NAIVE_UNSAFE: Naive = Naive {
    info: &VariantInfo {
        name: "naive-unsafe",
        description:
            "naive without max subtraction: exp overflows to inf once scores reach ~89 (f32)",
        source:
            "Rabe & Staats 2021, Sec. 3 (numerical stability): softmax without the max subtracted",
        modes: &[Mode::Fwd],
        default_q_chunk: None,
        default_kv_chunk: None,
        numerically_safe: false,
    },
    safe: false,
};

fn workers(case: &Case) -> usize {
    case.threads.min(kernel::items(&case.shape)).max(1)
}

fn widen(case: &Case) -> bool {
    case.dtype.size_bytes() != 4
}

/// Floats per worker of the forward on kernel path `isa`; `exact` when its output feeds
/// the backward.
fn worker_floats(case: &Case, isa: Isa, exact: bool) -> usize {
    let path = ReadPath::of(case.dtype, isa, case.shape.head_dim);
    kernel::worker_lens(&case.shape, path, exact).iter().sum()
}

impl Variant for Naive {
    /// cuBLAS S, the softmax kernel (with or without max subtraction, like the CPU pair),
    /// cuBLAS P V.
    fn cuda(&self) -> Option<GpuAlgo> {
        Some(GpuAlgo::Naive { safe: self.safe })
    }

    fn info(&self) -> &'static VariantInfo {
        self.info
    }

    /// One device; a sliding window in both passes (the backward reads the stored P, zero
    /// outside the window).
    fn unsupported(&self, case: &Case) -> Option<String> {
        single_device_windowed(self.info, case, true)
    }

    fn predict_workspace_bytes(&self, case: &Case, isa: Isa) -> u64 {
        4 * kernel::scores_len(&case.shape) as u64
            + Workspace::bytes(workers(case), worker_floats(case, isa, case.highest()))
    }

    fn forward_cpu(&self, case: &Case, isa: Isa, inputs: &Inputs, out: &mut [f32]) -> Result<()> {
        let mut scores = try_scratch(kernel::scores_len(&case.shape), "naive score matrix S")?;
        let ws = Workspace::scratch(
            workers(case),
            worker_floats(case, isa, case.highest()),
            "naive workspace",
        )?;
        // `precision = highest` keeps P in f32 for PV, as the backward's forward does.
        kernel::forward(
            inputs,
            case.causal,
            case.window,
            self.safe,
            case.highest(),
            isa,
            &mut scores,
            &ws,
            out,
        );
        Ok(())
    }

    /// P is kept (4 n_q n_kv bytes per head) and the backward adds dS of the same size:
    /// the 8 n^2 bytes of Rabe–Staats Table 3's standard differentiation.
    fn predict_train_workspace_bytes(&self, case: &Case, isa: Isa) -> u64 {
        let s = &case.shape;
        let scores = 4 * kernel::scores_len(s) as u64;
        let fwd = Workspace::bytes(workers(case), worker_floats(case, isa, true));
        let bwd_workers = case.threads.min(bwd::items(s)).max(1);
        let bwd = scores
            + Workspace::bytes(bwd_workers, bwd::worker_floats(s, widen(case)))
            + bwd::bookkeeping_bytes(s);
        scores + fwd.max(bwd)
    }

    fn forward_train_cpu(
        &self,
        case: &Case,
        isa: Isa,
        inputs: &Inputs,
        out: &mut [f32],
    ) -> Result<Saved> {
        let mut probs = try_scratch(kernel::scores_len(&case.shape), "naive probabilities P")?;
        let ws = Workspace::scratch(
            workers(case),
            worker_floats(case, isa, true),
            "naive workspace",
        )?;
        kernel::forward(
            inputs,
            case.causal,
            case.window,
            self.safe,
            true,
            isa,
            &mut probs,
            &ws,
            out,
        );
        Ok(Saved::Probabilities(probs))
    }

    fn backward_cpu(
        &self,
        case: &Case,
        isa: Isa,
        inputs: &Inputs,
        out: &[f32],
        saved: &Saved,
        d_out: &[f32],
        grads: &mut Grads,
    ) -> Result<()> {
        let Saved::Probabilities(probs) = saved else {
            return Err(wrong_saved(self.info()));
        };
        let s = &case.shape;
        let mut ds = try_scratch(kernel::scores_len(s), "naive score gradient dS")?;
        let ws = Workspace::new(
            case.threads.min(bwd::items(s)).max(1),
            bwd::worker_floats(s, widen(case)),
            "naive backward workspace",
        )?;
        bwd::backward(
            inputs,
            case.causal,
            isa,
            out,
            d_out,
            probs,
            &mut ds,
            &ws,
            grads,
        );
        Ok(())
    }
}
