//! `flash-varlen`: FlashAttention-2's forward over a ragged batch (`Case::batch_spec`),
//! packed without padding as a varlen GPU kernel takes it: `[1, heads, total, d]` with
//! cumulative offsets of each sequence's rows and keys (kernel:
//! `backend::cpu::flash::forward_varlen`). Each sequence attends to its own keys only,
//! causal bottom-right per sequence, so a prefill beside decodes of long caches costs each
//! its own pairs (FLOPs counted per sequence). Extra memory: flash's tiles,
//! O(B_r*B_c + B_r*d) per worker, and the two offset arrays (8 bytes a sequence each).

use super::{single_device_full_attention, Variant, VariantInfo};
use crate::backend::cpu::flash as kernel;
use crate::backend::cpu::isa::Isa;
use crate::backend::cpu::workspace::Workspace;
use crate::error::{Error, Result};
use crate::problem::{Case, Inputs, Mode};

pub struct FlashVarlen;

pub static FLASH_VARLEN: FlashVarlen = FlashVarlen;

static INFO: VariantInfo = VariantInfo {
    name: "flash-varlen",
    description: "FlashAttention-2 order over a ragged batch (batch_spec) packed without padding, each sequence against its own keys",
    source: "FlashAttention-2 (Dao 2023) with variable-length sequences (cumulative offsets), as serving batches them (Transformers Inference Optimization Toolset, 2024)",
    modes: &[Mode::Fwd],
    default_q_chunk: Some(kernel::DEFAULT_Q_CHUNK),
    default_kv_chunk: Some(kernel::DEFAULT_KV_CHUNK),
    numerically_safe: true,
};

/// (operand path, workers, floats per worker): a worker per head at most.
fn layout(case: &Case, isa: Isa) -> (kernel::FlashPath, usize, usize) {
    let s = &case.shape;
    let (bq, bk) = case.chunks_or(kernel::DEFAULT_Q_CHUNK, kernel::DEFAULT_KV_CHUNK);
    let workers = case.threads.min(s.batch * s.heads).max(1);
    // `precision = highest` keeps P in f32 for PV (bf16 widened, not paired).
    let path = kernel::path(case.dtype, isa, s.head_dim, case.highest());
    let longest = case.batch_spec.as_ref().map_or(s.seq_q, |b| {
        b.sequences().map(|(q, _)| q).max().unwrap_or(0)
    });
    let group = kernel::amx_group_rows(longest, bq);
    let floats = kernel::worker_lens(s, bq, bk, path, group).iter().sum();
    (path, workers, floats)
}

impl Variant for FlashVarlen {
    fn info(&self) -> &'static VariantInfo {
        &INFO
    }

    fn ragged(&self) -> bool {
        true
    }

    fn packed_only(&self) -> bool {
        true
    }

    /// The tiles, the two offset arrays, and one hand-out flag per head.
    fn predict_workspace_bytes(&self, case: &Case, isa: Isa) -> u64 {
        let (_, workers, floats) = layout(case, isa);
        let sequences = case.batch_spec.as_ref().map_or(0, |b| b.len());
        let word = std::mem::size_of::<usize>() as u64;
        Workspace::bytes(workers, floats)
            + 2 * word * (sequences as u64 + 1)
            + word * (case.shape.batch * case.shape.heads) as u64
    }

    fn unsupported(&self, case: &Case) -> Option<String> {
        if let Some(why) = single_device_full_attention(&INFO, case) {
            return Some(why);
        }
        case.batch_spec
            .is_none()
            .then(|| "variant flash-varlen runs a ragged batch: give it a batch_spec".into())
    }

    fn forward_cpu(&self, case: &Case, isa: Isa, inputs: &Inputs, out: &mut [f32]) -> Result<()> {
        let spec = case
            .batch_spec
            .as_ref()
            .ok_or_else(|| Error::Unsupported("flash-varlen needs a batch_spec".into()))?;
        let (cu_q, cu_kv) = (spec.offsets(false), spec.offsets(true));
        let (path, workers, floats) = layout(case, isa);
        let ws = Workspace::new(workers, floats, "flash-varlen tile workspace")?;
        let chunks = case.chunks_or(kernel::DEFAULT_Q_CHUNK, kernel::DEFAULT_KV_CHUNK);
        kernel::forward_varlen(
            inputs,
            case.causal,
            chunks,
            (&cu_q, &cu_kv),
            path,
            isa,
            &ws,
            out,
        );
        Ok(())
    }
}
