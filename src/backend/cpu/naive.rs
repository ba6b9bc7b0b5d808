//! Standard (materialized) attention: S = QK^T/sqrt(d) for all heads at once (a
//! `[batch, heads, seq_q, seq_kv]` f32 tensor, as a framework materializes it), softmax of
//! each row (max subtracted unless `safe` is false, which shows the exp overflow once scores
//! reach 89), then O = PV. Time O(b*h*n_q*n_kv*d); extra memory 4*b*h*n_q*n_kv bytes plus, for
//! bf16/f16 inputs, per-worker f32 copies of one head's K and V and a query row block.

use rayon::prelude::*;

use super::gemm::{sgemm, MatRef};
use super::softmax::{exp_sub_sum, mask_from, row_max, scale_row};
use super::workspace::{carve, Workspace};
use crate::problem::{Inputs, Shape};

/// Query rows per work item: S rows are computed, normalized and multiplied by V while
/// still in cache. 64 rows x n_kv scores stay within L2 up to n_kv of a few thousand.
pub const ROW_BLOCK: usize = 64;

/// Work items (heads x row blocks) the parallel loop runs.
pub fn items(shape: &Shape) -> usize {
    shape.batch * shape.heads * shape.seq_q.div_ceil(ROW_BLOCK)
}

/// Elements of the materialized score tensor.
pub fn scores_len(shape: &Shape) -> usize {
    shape.batch * shape.heads * shape.seq_q * shape.seq_kv
}

/// Per-worker scratch floats: f32 copies of Q rows, K and V (only for low-precision inputs).
pub fn worker_floats(shape: &Shape, widen: bool) -> usize {
    if widen {
        ROW_BLOCK * shape.head_dim + 2 * shape.seq_kv * shape.head_dim
    } else {
        0
    }
}

/// `scores` has `scores_len` elements; `ws` buffers have `worker_floats` elements.
pub fn forward(
    inputs: &Inputs,
    causal: bool,
    safe: bool,
    scores: &mut [f32],
    ws: &Workspace,
    out: &mut [f32],
) {
    let s = inputs.shape;
    let (d, nq, nkv) = (s.head_dim, s.seq_q, s.seq_kv);
    let scale = s.scale();
    let widen = inputs.dtype().size_bytes() != 4;
    out.par_chunks_mut(nq * d)
        .zip(scores.par_chunks_mut(nq * nkv))
        .enumerate()
        .for_each(|(head, (out_h, s_h))| {
            let (b, h) = (head / s.heads, head % s.heads);
            let (q_off, kv_off) = (s.q_head_offset(b, h), s.kv_head_offset(b, h));
            out_h
                .par_chunks_mut(ROW_BLOCK * d)
                .zip(s_h.par_chunks_mut(ROW_BLOCK * nkv))
                .enumerate()
                .for_each(|(blk, (o, p))| {
                    let row0 = blk * ROW_BLOCK;
                    let rows = o.len() / d;
                    let mut guard = ws.acquire();
                    let lens = if widen {
                        [ROW_BLOCK * d, nkv * d, nkv * d]
                    } else {
                        [0; 3]
                    };
                    let [qs, ks, vs] = carve(&mut guard, lens);
                    let q = inputs.q.rows_f32(q_off + row0 * d, rows * d, qs);
                    let k = inputs.k.rows_f32(kv_off, nkv * d, ks);
                    let v = inputs.v.rows_f32(kv_off, nkv * d, vs);
                    sgemm(
                        scale,
                        MatRef::new(q, rows, d),
                        MatRef::new(k, nkv, d).t(),
                        0.0,
                        p,
                        nkv,
                    );
                    for (r, row) in p.chunks_mut(nkv).enumerate() {
                        mask_from(row, s.visible_keys(causal, row0 + r));
                        let m = if safe { row_max(row) } else { 0.0 };
                        let sum = exp_sub_sum(row, m);
                        // A row with no visible key has sum 0: its output is 0, not 0/0.
                        scale_row(row, if sum > 0.0 { 1.0 / sum } else { 0.0 });
                    }
                    sgemm(
                        1.0,
                        MatRef::new(p, rows, nkv),
                        MatRef::new(v, nkv, d),
                        0.0,
                        o,
                        d,
                    );
                });
        });
}
