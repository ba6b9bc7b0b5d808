//! `chunked-prefill`: a prompt of n tokens prefilled in steps of `prefill_chunk` tokens, one
//! after another, each step attending its tokens to the KV cache written so far
//! (Transformers Inference Optimization Toolset, "Chunked prefill"), with flash's kernel
//! (FlashAttention-2 order) per step: `backend::cpu::flash::forward_steps`. Causal
//! self-attention; output and FLOPs are one causal `flash` call's, time adds the steps'
//! (each a parallel region of its own), and the longest step bounds how long a decode
//! batched with the prompt waits. Extra memory: flash's tiles, O(B_r*B_c + B_r*d) per
//! worker, with B_r = gcd(prefill_chunk, q_chunk) so that steps are whole query blocks.

use std::time::Instant;

use super::{single_device_full_attention, Variant, VariantInfo};
use crate::backend::cpu::flash as kernel;
use crate::backend::cpu::isa::Isa;
use crate::backend::cpu::workspace::Workspace;
use crate::error::{Error, Result};
use crate::problem::{Case, Inputs, Mode};

pub struct ChunkedPrefill;

pub static CHUNKED_PREFILL: ChunkedPrefill = ChunkedPrefill;

/// Prompt tokens per step when the config names none (vLLM's token budget per step of
/// chunked prefill is of this order).
pub const DEFAULT_PREFILL_CHUNK: usize = 512;

static INFO: VariantInfo = VariantInfo {
    name: "chunked-prefill",
    description: "causal prefill in steps of prefill_chunk tokens, one after another, each attending to the KV cache written so far (flash per step)",
    source: "Chunked prefill, as in the Transformers Inference Optimization Toolset (2024), with FlashAttention-2's loop order per step",
    modes: &[Mode::Fwd],
    default_q_chunk: Some(kernel::DEFAULT_Q_CHUNK),
    default_kv_chunk: Some(kernel::DEFAULT_KV_CHUNK),
    numerically_safe: true,
};

fn greatest_common_divisor(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        greatest_common_divisor(b, a % b)
    }
}

/// The prompt chunk of the case.
fn chunk(case: &Case) -> usize {
    case.prefill_chunk.unwrap_or(DEFAULT_PREFILL_CHUNK).max(1)
}

/// (B_r, B_c): flash's, with B_r dividing the chunk so that every step is whole blocks.
fn tiles(case: &Case) -> (usize, usize) {
    let (bq, bk) = case.chunks_or(kernel::DEFAULT_Q_CHUNK, kernel::DEFAULT_KV_CHUNK);
    (greatest_common_divisor(chunk(case), bq).max(1), bk)
}

/// (operand path, workers, floats per worker, query blocks per item).
fn layout(case: &Case, isa: Isa) -> (kernel::FlashPath, usize, usize, usize) {
    let s = &case.shape;
    let (bq, bk) = tiles(case);
    let workers = case.threads.min(kernel::items(s, bq)).max(1);
    // `precision = highest` keeps P in f32 for PV (bf16 widened, not paired).
    let path = kernel::path(case.dtype, isa, s.head_dim, case.highest());
    let group = kernel::steps_group(s, (bq, chunk(case)), path, workers);
    let floats = kernel::worker_lens(s, bq, bk, path, group).iter().sum();
    (path, workers, floats, group)
}

impl Variant for ChunkedPrefill {
    fn info(&self) -> &'static VariantInfo {
        &INFO
    }

    /// The tiles, and the output blocks' hand-out flags (one word per item of every head:
    /// a query block, or on the AMX path a group of a step's blocks; small chunks make
    /// many).
    fn predict_workspace_bytes(&self, case: &Case, isa: Isa) -> u64 {
        let (_, workers, floats, group) = layout(case, isa);
        let s = &case.shape;
        let blocks = s.batch * s.heads * s.seq_q.div_ceil(tiles(case).0 * group);
        Workspace::bytes(workers, floats) + (blocks * std::mem::size_of::<usize>()) as u64
    }

    fn unsupported(&self, case: &Case) -> Option<String> {
        let s = &case.shape;
        if let Some(why) = single_device_full_attention(&INFO, case) {
            return Some(why);
        }
        if !case.causal {
            return Some(
                "variant chunked-prefill is causal (each chunk attends to the cache written before it): set causal = true"
                    .into(),
            );
        }
        if s.seq_q != s.seq_kv {
            return Some(format!(
                "variant chunked-prefill prefills a prompt, whose cache is the prompt (seq_kv {} must equal seq_len {})",
                s.seq_kv, s.seq_q
            ));
        }
        (chunk(case) > s.seq_q).then(|| {
            format!(
                "prefill_chunk {} is larger than the prompt of {} tokens (seq_len)",
                chunk(case),
                s.seq_q
            )
        })
    }

    fn default_prefill_chunk(&self) -> Option<usize> {
        Some(DEFAULT_PREFILL_CHUNK)
    }

    fn steps(&self, case: &Case) -> usize {
        case.shape.seq_q.div_ceil(chunk(case))
    }

    fn forward_cpu(&self, case: &Case, isa: Isa, inputs: &Inputs, out: &mut [f32]) -> Result<()> {
        self.forward_cpu_steps(case, isa, inputs, out, &mut [])
    }

    fn forward_cpu_steps(
        &self,
        case: &Case,
        isa: Isa,
        inputs: &Inputs,
        out: &mut [f32],
        step_s: &mut [f64],
    ) -> Result<()> {
        if let Some(why) = self.unsupported(case) {
            return Err(Error::Unsupported(why));
        }
        let (path, workers, floats, _) = layout(case, isa);
        let ws = Workspace::new(workers, floats, "chunked-prefill tile workspace")?;
        let mut t0 = Instant::now();
        kernel::forward_steps(inputs, tiles(case), chunk(case), path, isa, &ws, out, |c| {
            if let Some(t) = step_s.get_mut(c) {
                *t = t0.elapsed().as_secs_f64();
            }
            t0 = Instant::now();
        });
        Ok(())
    }
}
