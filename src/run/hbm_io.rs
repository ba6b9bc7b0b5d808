//! The counts of the blog's FlashAttention IO claim (Transformers Inference Optimization
//! Toolset, "FlashAttention"; Dao et al. 2022, Theorem 2): every loop order of
//! `backend::cpu::hbm_io` over one head of L queries and keys, for each (L, d) of the grid
//! and, for the blog's FlashAttention, each fast-memory size M. The `flash` kernel's order
//! tiles with the kernel's own rule (`variant::flash_chunks` on its default case). Cost:
//! one visit per tile, about 3·10^7 for the whole grid (a few tens of ms).

use crate::backend::cpu::hbm_io::{blog_blocks, flash1, flash2, standard, Moved};
use crate::problem::{Case, DType, Shape, VariantId};
use crate::results::hbm_io::{IoRow, FLASH1, FLASH2, STANDARD};
use crate::variant::{flash_chunks, DefaultCase};

/// L: 1K to 64K, powers of 2.
pub const SEQ_LENS: [usize; 7] = [
    1 << 10,
    1 << 11,
    1 << 12,
    1 << 13,
    1 << 14,
    1 << 15,
    1 << 16,
];
/// d: the head dimensions of most models.
pub const HEAD_DIMS: [usize; 2] = [64, 128];
/// M in elements: 8K to 256K, i.e. 32 KiB to 1 MiB of f32. Why: it brackets one GPU SM's
/// shared memory (A100 192 KiB, H100 228 KiB: 48K to 57K f32) and, at both d, the size where
/// the tiled order starts to move fewer elements than the standard one (about 3d²).
pub const SRAM_ELEMENTS: [usize; 6] = [1 << 13, 1 << 14, 1 << 15, 1 << 16, 1 << 17, 1 << 18];
/// The row block the standard order iterates with (its count does not depend on it).
pub const STANDARD_BLOCK: usize = 64;

fn row(
    order: &str,
    l: usize,
    d: usize,
    m: Option<usize>,
    (b_q, b_kv): (usize, usize),
    c: Moved,
) -> IoRow {
    IoRow {
        order: order.into(),
        seq_len: l,
        head_dim: d,
        sram_elements: m,
        b_q,
        b_kv,
        reads: c.reads,
        writes: c.writes,
    }
}

/// Every count of the grid: per (d, L) the standard order and the kernel's, then the
/// blog's FlashAttention at each M.
pub fn count() -> Vec<IoRow> {
    let mut rows = Vec::new();
    for d in HEAD_DIMS {
        for l in SEQ_LENS {
            let mut c = Moved::default();
            standard(&mut c, l, d, STANDARD_BLOCK);
            let b = STANDARD_BLOCK.min(l);
            rows.push(row(STANDARD, l, d, None, (b, b), c));

            let case = Case::cpu_fwd(
                VariantId::Flash,
                Shape::self_attention(1, l, d),
                DType::F32,
                1,
            );
            let tiles = flash_chunks(&case);
            let mut c = Moved::default();
            flash2(
                &mut c,
                &case.shape,
                case.causal,
                (case.window, case.sinks.unwrap_or(0)),
                tiles,
            );
            rows.push(row(FLASH2, l, d, None, tiles, c));

            for m in SRAM_ELEMENTS {
                let blocks = blog_blocks(m, d);
                let mut c = Moved::default();
                flash1(&mut c, l, d, blocks);
                rows.push(row(FLASH1, l, d, Some(m), blocks, c));
            }
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_order_tiles_with_the_kernels_defaults() {
        let rows = count();
        assert_eq!(
            rows.len(),
            HEAD_DIMS.len() * SEQ_LENS.len() * (2 + SRAM_ELEMENTS.len())
        );
        // The flash kernel's B_r = 64 and B_c = 256 (variant `flash`'s defaults).
        let k = rows
            .iter()
            .find(|r| r.order == FLASH2 && r.seq_len == 1024 && r.head_dim == 64)
            .unwrap();
        assert_eq!((k.b_q, k.b_kv), (64, 256));
        // One head, L = 1024, d = 64: Q read and O written once (65536 each), K and V read
        // once per query block (16 blocks × 2 × 65536).
        assert_eq!((k.reads, k.writes), (65536 + 16 * 2 * 65536, 65536));
    }
}
