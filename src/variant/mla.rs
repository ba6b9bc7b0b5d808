//! `mla-decode`: multi-head latent attention decode (DeepSeek-V2 Sec. 2.1, as the
//! Transformers Inference Optimization Toolset presents it under "Multi-head latent
//! attention", with DeepSeek-V2's decoupled RoPE key) with the up-projections absorbed into
//! the query and output sides, so a call reads only the latent cache: (d_c + d_r) values
//! per cached token for all heads (kernel: `backend::cpu::mla`). The cache of each batch
//! element is cut into `splits` parts (Flash-Decoding's split-KV) combined exactly.
//! Time O(b h seq_q (n (2 d_c + d_r) + 2 d_c d_h)); extra memory `MlaPlan::buffer_floats`
//! plus one scratch per worker (`MlaPlan::worker_floats`), O(b h seq_q d_c (splits + 2)).

use super::{Variant, VariantInfo};
use crate::backend::cpu::isa::Isa;
use crate::backend::cpu::mla::{amx_fits, mla_decode, MlaBuffers, MlaPlan};
use crate::backend::cpu::workspace::{carve, try_zeroed, Workspace};
use crate::error::{Error, Result};
use crate::problem::{Case, DType, Inputs, Mode, Shape};

/// Keys per block: 256 latent rows of d_c = 512 f32 are 512 KiB, so a block widened from
/// bf16 and the scores of 128 rows stay within a core's L2 while both SGEMMs read it.
pub const MLA_BLOCK: usize = 256;

pub struct MlaDecode {
    info: &'static VariantInfo,
}

pub static MLA_DECODE: MlaDecode = MlaDecode {
    info: &VariantInfo {
        name: "mla-decode",
        description: "decode over a multi-head latent attention cache (latent_dim + rope_dim values a token, shared by all heads), W_UK and W_UV absorbed into the query and output sides; split-KV with an exact log-sum-exp combine",
        source: "DeepSeek-V2 (2024) Sec. 2.1 as in the Transformers Inference Optimization Toolset (2024), \"Multi-head latent attention\"; split-KV of Flash-Decoding",
        modes: &[Mode::Decode],
        default_q_chunk: None,
        default_kv_chunk: Some(MLA_BLOCK),
        numerically_safe: true,
    },
};

/// Splits per batch element, by flash-decoding's rule (`decode::parts_for`): the batch
/// elements are the units, key blocks of `MLA_BLOCK`.
pub fn default_splits(shape: &Shape, threads: usize) -> usize {
    super::decode::parts_for(shape.seq_kv, shape.batch, threads, MLA_BLOCK)
}

impl MlaDecode {
    /// The call's plan; `None` for a case without MLA dimensions (skipped by the runner).
    fn plan(&self, case: &Case, isa: Isa) -> Option<MlaPlan> {
        let m = case.mla?;
        let s = &case.shape;
        Some(MlaPlan {
            batch: s.batch,
            heads: s.heads,
            seq_q: s.seq_q,
            seq_kv: s.seq_kv,
            head_dim: s.head_dim,
            latent_dim: m.latent_dim,
            rope_dim: m.rope_dim,
            causal: case.causal,
            splits: case
                .splits
                .unwrap_or_else(|| default_splits(s, case.threads))
                .max(1),
            bk: case.kv_chunk.unwrap_or(MLA_BLOCK).max(1),
            widen: case.dtype != DType::F32,
            amx: isa == Isa::AmxBf16
                && case.dtype == DType::Bf16
                && amx_fits(m.latent_dim, m.rope_dim),
            threads: case.threads,
        })
    }
}

impl Variant for MlaDecode {
    fn info(&self) -> &'static VariantInfo {
        self.info
    }

    fn reads_mla(&self) -> bool {
        true
    }

    /// The shared buffers (q_lat, partials, o_lat, outputs by head) and the workers'
    /// scratch.
    fn predict_workspace_bytes(&self, case: &Case, isa: Isa) -> u64 {
        self.plan(case, isa).map_or(0, |p| {
            4 * p.buffer_floats() as u64 + Workspace::bytes(p.workers(), p.worker_floats())
        })
    }

    /// Every block's scores and values go through the packing SGEMM.
    fn uses_packing_gemm(&self, _case: &Case) -> bool {
        true
    }

    fn unsupported(&self, case: &Case) -> Option<String> {
        if case.window.is_some() {
            return Some("mla-decode has no sliding-window support".into());
        }
        if case.devices != 1 {
            return Some(format!(
                "mla-decode runs on one device (devices = {} requested)",
                case.devices
            ));
        }
        if case.batch_spec.is_some() {
            return Some("mla-decode runs batches of equal lengths only (no batch_spec)".into());
        }
        match case.mla {
            None => Some("mla-decode needs latent_dim and rope_dim".into()),
            Some(m) => m.unsupported(),
        }
    }

    fn default_splits(&self, shape: &Shape, threads: usize) -> Option<usize> {
        Some(default_splits(shape, threads))
    }

    /// The latent cache and the RoPE keys, each token once: b n (d_c + d_r) values (every
    /// part of a causal case's span is read: its union is the whole cache).
    fn kv_read_bytes(&self, case: &Case) -> Option<u64> {
        let m = case.mla?;
        let s = &case.shape;
        Some((s.batch * s.seq_kv * m.cache_values_per_token() * case.dtype.size_bytes()) as u64)
    }

    fn forward_cpu(&self, case: &Case, isa: Isa, inputs: &Inputs, out: &mut [f32]) -> Result<()> {
        let p = self
            .plan(case, isa)
            .ok_or_else(|| Error::Runtime("mla-decode needs latent_dim and rope_dim".into()))?;
        let x = inputs
            .mla
            .as_deref()
            .filter(|x| Some(x.mla) == case.mla)
            .ok_or_else(|| {
                Error::Runtime(format!(
                    "{}: the inputs hold no MLA cache of its dimensions",
                    case.id()
                ))
            })?;
        let name = self.info.name;
        let rows = p.batch * p.rows();
        let dc = p.latent_dim;
        let mut buf = try_zeroed(p.buffer_floats(), name)?;
        let [q_lat, part_o, part_lse, o_lat, o_head] = carve(
            &mut buf,
            [
                rows * dc,
                p.splits * rows * dc,
                p.splits * rows,
                rows * dc,
                rows * p.head_dim,
            ],
        );
        let ws = Workspace::new(p.workers(), p.worker_floats(), name)?;
        let bufs = MlaBuffers {
            q_lat,
            part_o,
            part_lse,
            o_lat,
            o_head,
        };
        mla_decode(&p, x, bufs, &ws, out);
        Ok(())
    }
}
