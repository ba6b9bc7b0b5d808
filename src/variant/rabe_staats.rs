//! `rabe-staats` (Figure 1: chunked, per-chunk summaries) and `rabe-staats-seq` (the O(1)
//! single-query loop), Rabe & Staats (kernels: `backend::cpu::chunked`). Both take a sliding
//! `window` in the forward (key chunks before every row's window skipped).

use super::{single_device_windowed, wrong_saved, Saved, Variant, VariantInfo};
use crate::backend::cpu::chunked as kernel;
use crate::backend::cpu::chunked_bwd as bwd;
use crate::backend::cpu::isa::Isa;
use crate::backend::cpu::tiles::ReadPath;
use crate::backend::cpu::workspace::{try_scratch, Workspace};
use crate::backend::cuda::plan::GpuAlgo;
use crate::error::Result;
use crate::problem::{Case, Grads, Inputs, Mode};

pub struct RabeStaats;
pub struct RabeStaatsSeq;

pub static RABE_STAATS: RabeStaats = RabeStaats;
pub static RABE_STAATS_SEQ: RabeStaatsSeq = RabeStaatsSeq;

static CHUNKED_INFO: VariantInfo = VariantInfo {
    name: "rabe-staats",
    description: "query chunks x key chunks, each key chunk summarized (exp-values, exp-sums, max), rescaled by the global max",
    source: "Rabe & Staats 2021 (Self-attention does not need O(n^2) memory), Figure 1 (query_chunk 1024, key_chunk 4096); backward Sec. 5.2",
    modes: &[Mode::Fwd, Mode::FwdBwd],
    default_q_chunk: Some(kernel::DEFAULT_Q_CHUNK),
    default_kv_chunk: Some(kernel::DEFAULT_KV_CHUNK),
    numerically_safe: true,
};

static SEQ_INFO: VariantInfo = VariantInfo {
    name: "rabe-staats-seq",
    description:
        "one query at a time, keys one at a time, running max m*, sum s*, value v* (O(d) memory per worker, O(1) in n)",
    source: "Rabe & Staats 2021 (Self-attention does not need O(n^2) memory), Sec. 2-3",
    modes: &[Mode::Fwd],
    default_q_chunk: None,
    default_kv_chunk: None,
    numerically_safe: true,
};

/// Effective (query, key) chunks: the case's, else the paper's defaults, clamped to n.
fn chunks(case: &Case) -> (usize, usize) {
    case.chunks_or(kernel::DEFAULT_Q_CHUNK, kernel::DEFAULT_KV_CHUNK)
}

/// Floats of the forward's one chunk buffer on kernel path `isa` (shared by the workers).
fn chunk_floats(case: &Case, isa: Isa) -> usize {
    let (qc, kc) = chunks(case);
    let path = ReadPath::of(case.dtype, isa, case.shape.head_dim);
    kernel::chunked_lens(&case.shape, qc, kc, path).iter().sum()
}

/// Figure 1 into `out`; `exact` when the output feeds the backward.
fn forward(case: &Case, isa: Isa, inputs: &Inputs, exact: bool, out: &mut [f32]) -> Result<()> {
    let mut buf = try_scratch(chunk_floats(case, isa), "rabe-staats chunk buffer")?;
    let (causal, chunks) = (case.causal, chunks(case));
    let window = case.window;
    // `precision = highest` keeps P in f32 for PV, as the backward's forward does.
    let exact = exact || case.highest();
    kernel::forward_chunked(inputs, causal, window, exact, chunks, isa, &mut buf, out);
    Ok(())
}

impl Variant for RabeStaats {
    fn cuda(&self) -> Option<GpuAlgo> {
        Some(GpuAlgo::Chunked)
    }

    fn info(&self) -> &'static VariantInfo {
        &CHUNKED_INFO
    }

    /// One device; a sliding window in the forward only (the checkpointed backward has none).
    fn unsupported(&self, case: &Case) -> Option<String> {
        single_device_windowed(&CHUNKED_INFO, case, false)
    }

    fn predict_workspace_bytes(&self, case: &Case, isa: Isa) -> u64 {
        Workspace::bytes(1, chunk_floats(case, isa))
    }

    fn forward_cpu(&self, case: &Case, isa: Isa, inputs: &Inputs, out: &mut [f32]) -> Result<()> {
        forward(case, isa, inputs, false, out)
    }

    /// Nothing is kept between the passes; the backward's chunk slabs and summaries are
    /// allocated per worker.
    fn predict_train_workspace_bytes(&self, case: &Case, isa: Isa) -> u64 {
        let fwd = Workspace::bytes(1, chunk_floats(case, isa));
        let (bwd_workers, bwd_floats) = bwd_layout(case);
        let (_, kc) = chunks(case);
        let bwd =
            Workspace::bytes(bwd_workers, bwd_floats) + bwd::bookkeeping_bytes(&case.shape, kc);
        fwd.max(bwd)
    }

    fn forward_train_cpu(
        &self,
        case: &Case,
        isa: Isa,
        inputs: &Inputs,
        out: &mut [f32],
    ) -> Result<Saved> {
        forward(case, isa, inputs, true, out)?;
        Ok(Saved::Nothing)
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
        let Saved::Nothing = saved else {
            return Err(wrong_saved(self.info()));
        };
        let (workers, floats) = bwd_layout(case);
        let ws = Workspace::new(workers, floats, "rabe-staats backward chunk workspace")?;
        bwd::backward(
            inputs,
            case.causal,
            chunks(case),
            isa,
            out,
            d_out,
            &ws,
            grads,
        );
        Ok(())
    }
}

/// (workers, floats per worker) of the checkpointed backward.
fn bwd_layout(case: &Case) -> (usize, usize) {
    let (qc, kc) = chunks(case);
    let workers = case.threads.min(bwd::items(&case.shape, qc)).max(1);
    let floats = bwd::worker_lens(&case.shape, qc, kc, case.dtype.size_bytes() != 4)
        .iter()
        .sum();
    (workers, floats)
}

fn seq_workers(case: &Case) -> usize {
    case.threads
        .min(kernel::sequential_items(&case.shape))
        .max(1)
}

impl Variant for RabeStaatsSeq {
    fn info(&self) -> &'static VariantInfo {
        &SEQ_INFO
    }

    /// One device; a sliding window (its only mode is the forward).
    fn unsupported(&self, case: &Case) -> Option<String> {
        single_device_windowed(&SEQ_INFO, case, false)
    }

    fn predict_workspace_bytes(&self, case: &Case, _isa: Isa) -> u64 {
        Workspace::bytes(
            seq_workers(case),
            kernel::sequential_worker_floats(&case.shape),
        )
    }

    /// The O(1)-memory loop is scalar by design (one query, one key at a time): `isa` does
    /// not change it.
    fn forward_cpu(&self, case: &Case, _isa: Isa, inputs: &Inputs, out: &mut [f32]) -> Result<()> {
        let ws = Workspace::new(
            seq_workers(case),
            kernel::sequential_worker_floats(&case.shape),
            "rabe-staats-seq state",
        )?;
        kernel::forward_sequential(inputs, case.causal, case.window, &ws, out);
        Ok(())
    }
}
