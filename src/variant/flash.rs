//! `flash`: FlashAttention-2 loop order with online softmax (kernel: `backend::cpu::flash`).
//! Extra memory O(B_r*B_c + B_r*d) per worker, independent of n. Takes a sliding `window`
//! (key blocks before every row's window skipped), in the backward too.

use super::{single_device_windowed, wrong_saved, Saved, Variant, VariantInfo};
use crate::backend::cpu::flash as kernel;
use crate::backend::cpu::flash_bwd as bwd;
use crate::backend::cpu::isa::Isa;
use crate::backend::cpu::workspace::{try_zeroed, Workspace};
use crate::backend::cuda::plan::GpuAlgo;
use crate::error::Result;
use crate::problem::{Case, Grads, Inputs, Mode};

pub struct Flash;

pub static FLASH: Flash = Flash;

static INFO: VariantInfo = VariantInfo {
    name: "flash",
    description: "FlashAttention-2 order: per query block, stream key/value blocks with running max, sum and output; one division",
    source: "FlashAttention-2 (Dao 2023) forward loop order, as in the Transformers Inference Optimization Toolset (2024)",
    modes: &[Mode::Fwd, Mode::FwdBwd],
    default_q_chunk: Some(kernel::DEFAULT_Q_CHUNK),
    default_kv_chunk: Some(kernel::DEFAULT_KV_CHUNK),
    numerically_safe: true,
};

/// (B_r, B_c): the case's chunks, else the defaults, clamped to n: the kernel's tile rule
/// (also what the count of its reads and writes tiles with, `run::hbm_io`).
pub fn chunks(case: &Case) -> (usize, usize) {
    case.chunks_or(kernel::DEFAULT_Q_CHUNK, kernel::DEFAULT_KV_CHUNK)
}

/// (operand path, workers, floats per worker) of the forward on kernel path `isa`; `exact`
/// for the forward of a training step (P kept in f32), as `precision = highest` keeps it.
fn layout(case: &Case, isa: Isa, exact: bool) -> (kernel::FlashPath, usize, usize) {
    let s = &case.shape;
    let (bq, bk) = chunks(case);
    let workers = case.threads.min(kernel::items(s, bq)).max(1);
    let path = kernel::path(case.dtype, isa, s.head_dim, exact || case.highest());
    let group = kernel::amx_group_cap(s, bq, case.window);
    let floats = kernel::worker_lens(s, bq, bk, path, group).iter().sum();
    (path, workers, floats)
}

impl Variant for Flash {
    fn cuda(&self) -> Option<GpuAlgo> {
        Some(GpuAlgo::Flash)
    }

    fn info(&self) -> &'static VariantInfo {
        &INFO
    }

    /// One device; a sliding window and its sinks in both passes (on the CPU:
    /// `Case::sinks_problem`).
    fn unsupported(&self, case: &Case) -> Option<String> {
        single_device_windowed(&INFO, case, true)
    }

    fn sinks(&self) -> bool {
        true
    }

    fn predict_workspace_bytes(&self, case: &Case, isa: Isa) -> u64 {
        let (_, workers, floats) = layout(case, isa, false);
        Workspace::bytes(workers, floats)
    }

    fn forward_cpu(&self, case: &Case, isa: Isa, inputs: &Inputs, out: &mut [f32]) -> Result<()> {
        let (path, workers, floats) = layout(case, isa, false);
        let ws = Workspace::new(workers, floats, "flash tile workspace")?;
        kernel::forward(
            inputs,
            case.causal,
            (case.window, case.sinks.unwrap_or(0)),
            chunks(case),
            path,
            isa,
            &ws,
            out,
            None,
        );
        Ok(())
    }

    /// L is kept (4 bytes per query row); the backward adds D (as many) and its tiles.
    fn predict_train_workspace_bytes(&self, case: &Case, isa: Isa) -> u64 {
        let (bq, bk) = chunks(case);
        let (_, workers, floats) = layout(case, isa, true);
        let rows = 4 * bwd::d_len(&case.shape) as u64;
        let (bwd_workers, bwd_floats) = bwd_layout(case, bq, bk);
        let fwd = Workspace::bytes(workers, floats);
        let bwd = rows
            + Workspace::bytes(bwd_workers, bwd_floats)
            + bwd::bookkeeping_bytes(&case.shape, bq, bk);
        rows + fwd.max(bwd)
    }

    fn forward_train_cpu(
        &self,
        case: &Case,
        isa: Isa,
        inputs: &Inputs,
        out: &mut [f32],
    ) -> Result<Saved> {
        let (path, workers, floats) = layout(case, isa, true);
        let mut lse = try_zeroed(bwd::d_len(&case.shape), "flash logsumexp L")?;
        let ws = Workspace::new(workers, floats, "flash tile workspace")?;
        let lse_out = Some(&mut lse[..]);
        kernel::forward(
            inputs,
            case.causal,
            (case.window, case.sinks.unwrap_or(0)),
            chunks(case),
            path,
            isa,
            &ws,
            out,
            lse_out,
        );
        Ok(Saved::LogSumExp(lse))
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
        let Saved::LogSumExp(lse) = saved else {
            return Err(wrong_saved(self.info()));
        };
        let (bq, bk) = chunks(case);
        let (workers, floats) = bwd_layout(case, bq, bk);
        let mut dd = try_zeroed(bwd::d_len(&case.shape), "flash D = rowsum(dO * O)")?;
        let ws = Workspace::new(workers, floats, "flash backward tiles")?;
        bwd::backward(
            inputs,
            case.causal,
            (case.window, case.sinks.unwrap_or(0)),
            (bq, bk),
            isa,
            out,
            d_out,
            lse,
            &mut dd,
            &ws,
            grads,
        );
        Ok(())
    }
}

/// (workers, floats per worker) of the backward's tiles.
fn bwd_layout(case: &Case, bq: usize, bk: usize) -> (usize, usize) {
    let workers = case.threads.min(bwd::items(&case.shape, bk)).max(1);
    let floats = bwd::worker_lens(&case.shape, bq, bk, case.dtype.size_bytes() != 4)
        .iter()
        .sum();
    (workers, floats)
}
