//! KV-cache bytes per token per layer for the attention designs with `h` query heads of
//! d_h: MHA caches K and V of every head (2 h d_h values), GQA of its g KV heads
//! (2 g d_h), MLA one latent vector and one RoPE key part shared by all heads (d_c + d_r;
//! DeepSeek-V2 Sec. 2.1 and Table 1, the Transformers Inference Optimization Toolset's
//! "Multi-head latent attention"). O(1), exact from the shapes.

use crate::problem::{DType, Mla};

/// Bytes of KV cache per token per layer for `heads` query heads of `head_dim`: MHA
/// caches 2 h d_h values, GQA with g KV heads 2 g d_h, MLA d_c + d_r (DeepSeek-V2 Table 1:
/// MLA's cache equals GQA's with 2.25 groups when d_c = 4 d_h and d_r = d_h / 2).
pub fn cache_bytes_per_token(cache: CacheKind, head_dim: usize, dtype: DType) -> u64 {
    let values = match cache {
        CacheKind::Mha { heads } => 2 * heads * head_dim,
        CacheKind::Gqa { kv_heads } => 2 * kv_heads * head_dim,
        CacheKind::Mla(m) => m.cache_values_per_token(),
    };
    (values * dtype.size_bytes()) as u64
}

/// Which cache `cache_bytes_per_token` counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheKind {
    Mha { heads: usize },
    Gqa { kv_heads: usize },
    Mla(Mla),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_per_token_is_the_seeds_claim() {
        // DeepSeek-V2's numbers: 128 heads of 128, d_c 512, d_r 64, bf16.
        let m = Mla::DEEPSEEK_V2;
        let mla = cache_bytes_per_token(CacheKind::Mla(m), 128, DType::Bf16);
        let mha = cache_bytes_per_token(CacheKind::Mha { heads: 128 }, 128, DType::Bf16);
        let gqa = cache_bytes_per_token(CacheKind::Gqa { kv_heads: 8 }, 128, DType::Bf16);
        assert_eq!(mla, 2 * 576);
        assert_eq!(mha, 2 * 2 * 128 * 128);
        assert_eq!(gqa, 2 * 2 * 8 * 128);
        // 32768 / 576: the 56.9x reduction against MHA; GQA-8 caches 4096 / 576 = 3.6x more.
        assert!((mha as f64 / mla as f64 - 56.888).abs() < 1e-3);
        assert!((gqa as f64 / mla as f64 - 3.5556).abs() < 1e-3);
        // DeepSeek-V2 Table 1: MLA's cache is GQA's with 2.25 groups (d_c = 4 d_h, d_r = d_h/2).
        assert_eq!(mla as f64, 2.25 * 2.0 * 128.0 * 2.0);
        assert_eq!(
            cache_bytes_per_token(CacheKind::Mla(m), 7, DType::F32),
            4 * 576
        );
    }
}
