//! Multi-head latent attention's cache and weights (DeepSeek-V2, Sec. 2.1, as the
//! Transformers Inference Optimization Toolset presents it under "Multi-head latent
//! attention", with the decoupled RoPE key of DeepSeek-V2 Sec. 2.1.3): per cached token one
//! compressed latent vector c_t of `latent_dim` (d_c) values and one RoPE key part k_r,t of
//! `rope_dim` (d_r) values, both shared by every query head; the per-head keys and values
//! are up-projections of the latent, K^h_t = [c_t W_UK^h, k_r,t] and V^h_t = c_t W_UV^h.
//! Generation costs O(b n (d_c + d_r) + h (seq_q (d_h + d_r) + 2 d_c d_h)) values.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::{DType, InputDist, Shape, Tensor};

/// The MLA dimensions of a case (`latent_dim`, `rope_dim` in configs). The case's shape
/// keeps its meaning for the query side: `heads` query heads h, `head_dim` the per-head
/// dimension d_h of the unabsorbed keys' non-RoPE part and of the values, `seq_kv` cached
/// tokens, `seq_q` new tokens; `kv_heads` is not read (the cache has no per-head part).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub struct Mla {
    pub latent_dim: usize,
    pub rope_dim: usize,
}

impl Mla {
    /// DeepSeek-V2's dimensions (d_c = 512 = 4 d_h, d_r = 64 = d_h / 2).
    pub const DEEPSEEK_V2: Mla = Mla {
        latent_dim: 512,
        rope_dim: 64,
    };

    /// Values cached per token: d_c + d_r (DeepSeek-V2 Table 1).
    pub fn cache_values_per_token(&self) -> usize {
        self.latent_dim + self.rope_dim
    }

    /// Softmax scale 1/sqrt(d_h + d_r): the unabsorbed keys' dimension (DeepSeek-V2 Eq. 17).
    pub fn scale(&self, head_dim: usize) -> f64 {
        1.0 / ((head_dim + self.rope_dim) as f64).sqrt()
    }

    /// Elements of each input of a case of `shape`: (C and K_r rows, q_nope, q_rope, each of
    /// W_UK and W_UV).
    pub fn lens(&self, s: &Shape) -> MlaLens {
        let tokens = s.batch * s.seq_kv;
        let rows = s.batch * s.heads * s.seq_q;
        MlaLens {
            c: tokens * self.latent_dim,
            k_rope: tokens * self.rope_dim,
            q_nope: rows * s.head_dim,
            q_rope: rows * self.rope_dim,
            w: s.heads * self.latent_dim * s.head_dim,
        }
    }

    /// Bytes of the MLA inputs in `dtype`: the cache, the queries and both up-projections
    /// (what `Case::io_bytes` counts for an MLA case, beside the f32 output).
    pub fn input_bytes(&self, s: &Shape, dtype: DType) -> u64 {
        let l = self.lens(s);
        ((l.c + l.k_rope + l.q_nope + l.q_rope + 2 * l.w) * dtype.size_bytes()) as u64
    }

    /// Why these dimensions cannot be run, if so (0 is refused where configs are read;
    /// this guards cases built elsewhere).
    pub fn unsupported(&self) -> Option<String> {
        if self.latent_dim == 0 {
            return Some("latent_dim must be at least 1".into());
        }
        if self.rope_dim == 0 {
            return Some("rope_dim must be at least 1 (the decoupled RoPE key part)".into());
        }
        None
    }
}

/// Element counts of the MLA inputs (`Mla::lens`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlaLens {
    pub c: usize,
    pub k_rope: usize,
    pub q_nope: usize,
    pub q_rope: usize,
    pub w: usize,
}

/// The seeded MLA inputs of a case, in its storage dtype: the latent cache C
/// `[b, n, d_c]`, the RoPE keys K_r `[b, n, d_r]`, the queries q_nope `[b, h, seq_q, d_h]`
/// and q_rope `[b, h, seq_q, d_r]`, the up-projections W_UK and W_UV `[h, d_c, d_h]`.
#[derive(Clone, Debug, PartialEq)]
pub struct MlaInputs {
    pub mla: Mla,
    pub c: Tensor,
    pub k_rope: Tensor,
    pub q_nope: Tensor,
    pub q_rope: Tensor,
    pub w_uk: Tensor,
    pub w_uv: Tensor,
}

/// Salt of the MLA stream: apart from Q, K, V's stream of the same seed.
const MLA_STREAM: u64 = 0x4d4c_415f_6361_6368;

impl MlaInputs {
    /// Seeded from (seed, shape, mla, dtype, dist, scale) only. The cache and the queries
    /// are drawn from `dist`; `scale` multiplies q_nope and q_rope by its square (the
    /// scores scale by its square, as they do for Q and K); W_UK and W_UV are drawn from
    /// `dist` times 1/sqrt(d_c), so the up-projected keys and values stay O(1) and the
    /// scores O(1) after the softmax scale.
    pub fn try_generate(
        shape: &Shape,
        mla: Mla,
        dtype: DType,
        dist: InputDist,
        scale: f64,
        seed: u64,
    ) -> crate::error::Result<MlaInputs> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ MLA_STREAM);
        let l = mla.lens(shape);
        let w_scale = 1.0 / (mla.latent_dim.max(1) as f32).sqrt();
        let q_scale = (scale * scale) as f32;
        let mut gen = |n: usize, f: f32, what: &str| {
            let values = (0..n).map(|_| dist.draw(&mut rng) * f);
            Tensor::try_collect_f32(n, values, dtype, what)
        };
        Ok(MlaInputs {
            mla,
            c: gen(l.c, 1.0, "MLA latent cache C")?,
            k_rope: gen(l.k_rope, 1.0, "MLA RoPE keys K_r")?,
            q_nope: gen(l.q_nope, q_scale, "MLA queries q_nope")?,
            q_rope: gen(l.q_rope, q_scale, "MLA queries q_rope")?,
            w_uk: gen(l.w, w_scale, "MLA up-projection W_UK")?,
            w_uv: gen(l.w, w_scale, "MLA up-projection W_UV")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_is_seeded_and_sized() {
        let s = Shape {
            batch: 2,
            heads: 3,
            kv_heads: 1,
            seq_q: 2,
            seq_kv: 5,
            head_dim: 4,
        };
        let m = Mla {
            latent_dim: 6,
            rope_dim: 2,
        };
        let a = MlaInputs::try_generate(&s, m, DType::Bf16, InputDist::Normal, 1.0, 3).unwrap();
        let b = MlaInputs::try_generate(&s, m, DType::Bf16, InputDist::Normal, 1.0, 3).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.c.len(), 2 * 5 * 6);
        assert_eq!(a.k_rope.len(), 2 * 5 * 2);
        assert_eq!(a.q_nope.len(), 2 * 3 * 2 * 4);
        assert_eq!(a.q_rope.len(), 2 * 3 * 2 * 2);
        assert_eq!(a.w_uk.len(), 3 * 6 * 4);
        assert_eq!(
            m.input_bytes(&s, DType::Bf16),
            2 * (60 + 20 + 48 + 24 + 2 * 72)
        );
        let c = MlaInputs::try_generate(&s, m, DType::Bf16, InputDist::Normal, 1.0, 4).unwrap();
        assert_ne!(a.c, c.c);
    }
}
