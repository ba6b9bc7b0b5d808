//! `flash`: FlashAttention-2 loop order with online softmax (kernel: `backend::cpu::flash`).
//! Extra memory O(B_r*B_c + B_r*d) per worker, independent of n.

use super::{Variant, VariantInfo};
use crate::backend::cpu::flash as kernel;
use crate::backend::cpu::workspace::Workspace;
use crate::error::Result;
use crate::problem::{Case, Inputs, Mode};

pub struct Flash;

pub static FLASH: Flash = Flash;

static INFO: VariantInfo = VariantInfo {
    name: "flash",
    description: "FlashAttention-2 order: per query block, stream key/value blocks with running max, sum and output; one division",
    source: "seed 003 FlashAttention (FA2 forward); REPRODUCTION.md 2.4",
    modes: &[Mode::Fwd],
    default_q_chunk: Some(kernel::DEFAULT_Q_CHUNK),
    default_kv_chunk: Some(kernel::DEFAULT_KV_CHUNK),
    numerically_safe: true,
};

/// (B_r, B_c, workers, floats per worker).
fn layout(case: &Case) -> (usize, usize, usize, usize) {
    let s = &case.shape;
    let bq = case
        .q_chunk
        .unwrap_or(kernel::DEFAULT_Q_CHUNK)
        .min(s.seq_q)
        .max(1);
    let bk = case
        .kv_chunk
        .unwrap_or(kernel::DEFAULT_KV_CHUNK)
        .min(s.seq_kv)
        .max(1);
    let workers = case.threads.min(kernel::items(s, bq)).max(1);
    let floats = kernel::worker_lens(s, bq, bk, case.dtype.size_bytes() != 4)
        .iter()
        .sum();
    (bq, bk, workers, floats)
}

impl Variant for Flash {
    fn info(&self) -> &'static VariantInfo {
        &INFO
    }

    fn predict_workspace_bytes(&self, case: &Case) -> u64 {
        let (_, _, workers, floats) = layout(case);
        Workspace::bytes(workers, floats)
    }

    fn forward_cpu(&self, case: &Case, inputs: &Inputs, out: &mut [f32]) -> Result<()> {
        let (bq, bk, workers, floats) = layout(case);
        let ws = Workspace::new(workers, floats, "flash tile workspace")?;
        kernel::forward(inputs, case.causal, bq, bk, &ws, out);
        Ok(())
    }
}
