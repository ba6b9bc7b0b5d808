//! Standard attention backward from the stored probabilities P (`[b, h, n_q, n_kv]`):
//! dP = dO V^T and dS = P * (dP - rowsum(dO * O)) into a second n_q x n_kv buffer (as a
//! framework materializes it), dQ = dS K / sqrt(d) in the same row pass; then per key/value
//! row block dV = sum_h P_h^T dO_h and dK = sum_h dS_h^T Q_h / sqrt(d) over the query heads
//! sharing that key/value head. Time O(b*h*n_q*n_kv*d) (4 matmuls); extra memory the dS
//! buffer (4*b*h*n_q*n_kv bytes) plus, for bf16/f16, per-worker f32 copies of one head.

use rayon::prelude::*;

use super::blocks::{head_row_blocks, split_bytes};
use super::gemm::{sgemm, MatRef};
use super::naive::ROW_BLOCK;
use super::softmax::softmax_grad_rows;
use super::vecops;
use super::workspace::{carve, Workspace};
use crate::problem::{Grads, Inputs, Shape};

/// Work items of the two parallel passes; the workspace serves the larger.
pub fn items(shape: &Shape) -> usize {
    let q = shape.batch * shape.heads * shape.seq_q.div_ceil(ROW_BLOCK);
    let kv = shape.batch * shape.kv_heads * shape.seq_kv.div_ceil(ROW_BLOCK);
    q.max(kv)
}

/// Heap bytes of the per-block lists: (dS, dQ) blocks in the row pass, then (dK, dV).
pub fn bookkeeping_bytes(shape: &Shape) -> u64 {
    let q = shape.batch * shape.heads * shape.seq_q.div_ceil(ROW_BLOCK);
    let kv = shape.batch * shape.kv_heads * shape.seq_kv.div_ceil(ROW_BLOCK);
    2 * split_bytes(q.max(kv))
}

/// Per-worker floats: widened K and V (row pass) or one widened Q head (column pass).
pub fn worker_floats(shape: &Shape, widen: bool) -> usize {
    if widen {
        (2 * shape.seq_kv * shape.head_dim).max(shape.seq_q * shape.head_dim)
    } else {
        0
    }
}

pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[allow(clippy::too_many_arguments)]
pub fn backward(
    inputs: &Inputs,
    out: &[f32],
    d_out: &[f32],
    probs: &[f32],
    ds: &mut [f32],
    ws: &Workspace,
    grads: &mut Grads,
) {
    let s = inputs.shape;
    let (d, nq, nkv) = (s.head_dim, s.seq_q, s.seq_kv);
    let scale = s.scale();
    let widen = inputs.dtype().size_bytes() != 4;
    let nqb = nq.div_ceil(ROW_BLOCK);

    // Row pass: dS and dQ per (head, query row block).
    let ds_blocks = head_row_blocks(ds, nq, nkv, ROW_BLOCK);
    let dq_blocks = head_row_blocks(&mut grads.dq, nq, d, ROW_BLOCK);
    ds_blocks
        .into_par_iter()
        .zip(dq_blocks)
        .enumerate()
        .for_each(|(item, (ds_b, dq_b))| {
            let (head, blk) = (item / nqb, item % nqb);
            let (b, h) = (head / s.heads, head % s.heads);
            let (q_off, kv_off) = (s.q_head_offset(b, h), s.kv_head_offset(b, h));
            let row0 = blk * ROW_BLOCK;
            let rows = dq_b.len() / d;
            let mut guard = ws.acquire();
            let lens = if widen { [nkv * d, nkv * d] } else { [0; 2] };
            let [ks, vs] = carve(&mut guard, lens);
            let k = vecops::widen(&inputs.k, kv_off, nkv * d, ks);
            let v = vecops::widen(&inputs.v, kv_off, nkv * d, vs);
            let go = &d_out[q_off + row0 * d..][..rows * d];
            let o = &out[q_off + row0 * d..][..rows * d];
            let p = &probs[(head * nq + row0) * nkv..][..rows * nkv];
            sgemm(
                1.0,
                MatRef::new(go, rows, d),
                MatRef::new(v, nkv, d).t(),
                0.0,
                ds_b,
                nkv,
            );
            let mut dd = [0.0f32; ROW_BLOCK];
            for (r, x) in dd[..rows].iter_mut().enumerate() {
                *x = dot(&go[r * d..(r + 1) * d], &o[r * d..(r + 1) * d]);
            }
            softmax_grad_rows(ds_b, p, &dd[..rows], nkv);
            sgemm(
                scale,
                MatRef::new(ds_b, rows, nkv),
                MatRef::new(k, nkv, d),
                0.0,
                dq_b,
                d,
            );
        });

    // Column pass: dV and dK per (key/value head, key row block), summed over the group.
    let ds: &[f32] = ds;
    let nkb = nkv.div_ceil(ROW_BLOCK);
    let dk_blocks = head_row_blocks(&mut grads.dk, nkv, d, ROW_BLOCK);
    let dv_blocks = head_row_blocks(&mut grads.dv, nkv, d, ROW_BLOCK);
    dk_blocks
        .into_par_iter()
        .zip(dv_blocks)
        .enumerate()
        .for_each(|(item, (dk_b, dv_b))| {
            let (kv_head, blk) = (item / nkb, item % nkb);
            let (b, g) = (kv_head / s.kv_heads, kv_head % s.kv_heads);
            let j0 = blk * ROW_BLOCK;
            let jn = dk_b.len() / d;
            let mut guard = ws.acquire();
            let [qs] = carve(&mut guard, [if widen { nq * d } else { 0 }]);
            for (t, h) in (g * s.group()..(g + 1) * s.group()).enumerate() {
                let head = b * s.heads + h;
                let beta = if t == 0 { 0.0 } else { 1.0 };
                let q_off = s.q_head_offset(b, h);
                let q = vecops::widen(&inputs.q, q_off, nq * d, qs);
                let go = &d_out[q_off..][..nq * d];
                let at = head * nq * nkv + j0;
                sgemm(
                    1.0,
                    columns_t(&probs[at..], jn, nq, nkv),
                    MatRef::new(go, nq, d),
                    beta,
                    dv_b,
                    d,
                );
                sgemm(
                    scale,
                    columns_t(&ds[at..], jn, nq, nkv),
                    MatRef::new(q, nq, d),
                    beta,
                    dk_b,
                    d,
                );
            }
        });
}

/// The first `cols` columns of a row-major matrix with row stride `stride` and `rows` rows,
/// transposed, as a view (`cols x rows`).
fn columns_t(data: &[f32], cols: usize, rows: usize, stride: usize) -> MatRef<'_> {
    MatRef {
        data,
        rows: cols,
        cols: rows,
        rs: 1,
        cs: stride,
    }
}
