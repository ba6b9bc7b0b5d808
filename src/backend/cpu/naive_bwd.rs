//! Standard attention backward from the stored probabilities P (`[b, h, n_q, n_kv]`):
//! dP = dO V^T and dS = P * (dP - rowsum(dO * O)) into a second n_q x n_kv buffer (as a
//! framework materializes it), dQ = dS K / sqrt(d) in the same row pass; then per key/value
//! row block dV = sum_h P_h^T dO_h and dK = sum_h dS_h^T Q_h / sqrt(d) over the query heads
//! sharing that key/value head; every product on the forward's register tiles
//! (`tiles::gemm`), V^T packed per row block; causal products stop at the keys a row block
//! sees and start at the first query row a key block is seen by. Time O(b*h*n_q*n_kv*d)
//! (4 matmuls); extra memory the dS buffer (4*b*h*n_q*n_kv bytes, scratch a warm call
//! reuses, as P) plus per worker one head's V^T and, for bf16/f16, f32 copies of one
//! head's K (or Q).

use rayon::prelude::*;

use super::blocks::{head_row_blocks, split_bytes};
use super::isa::Isa;
use super::naive::ROW_BLOCK;
use super::softmax::softmax_grad_rows;
use super::tiles::{gemm, pack_t, pad_lanes, AOp, BOp, Out};
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

/// Per-worker floats: V^T (d rows of `pad_lanes(n_kv)`) and K widened (16-bit inputs) in
/// the row pass, or one widened Q head in the column pass, whichever is larger.
pub fn worker_floats(shape: &Shape, widen: bool) -> usize {
    let (d, nq, nkv) = (shape.head_dim, shape.seq_q, shape.seq_kv);
    let w = usize::from(widen);
    (d * pad_lanes(nkv) + w * nkv * d).max(w * nq * d)
}

pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[allow(clippy::too_many_arguments)]
pub fn backward(
    inputs: &Inputs,
    causal: bool,
    isa: Isa,
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
    let ldt = pad_lanes(nkv);

    // Row pass: dS (scaled by 1/sqrt(d), which both dQ and dK take) and dQ per (head, query
    // row block).
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
            // Causal: P is zero past the keys the block's last row sees, and so is dS: the
            // products stop there.
            let seen = s.visible_keys(causal, row0 + rows - 1);
            if seen == 0 {
                dq_b.fill(0.0);
                return;
            }
            let mut guard = ws.acquire();
            let [vt, ks] = carve(&mut guard, [d * ldt, if widen { nkv * d } else { 0 }]);
            let k = vecops::widen(&inputs.k, kv_off, seen * d, ks);
            pack_t(isa, &inputs.v, kv_off, seen, d, ldt, vt);
            let go = &d_out[q_off + row0 * d..][..rows * d];
            let o = &out[q_off + row0 * d..][..rows * d];
            let p = &probs[(head * nq + row0) * nkv..][..rows * nkv];
            let vt = BOp::new(vt, d, seen, ldt);
            gemm(isa, AOp::rows(go, rows, d), vt, ds_b, nkv, Out::Store);
            let mut dd = [0.0f32; ROW_BLOCK];
            for (r, x) in dd[..rows].iter_mut().enumerate() {
                *x = dot(&go[r * d..(r + 1) * d], &o[r * d..(r + 1) * d]);
            }
            softmax_grad_rows(ds_b, p, &dd[..rows], (seen, nkv), scale);
            // dS is scratch (its contents unspecified): the zeros past `seen` that the column
            // pass reads, up to the end of the key block holding `seen` (its blocks start
            // at multiples of ROW_BLOCK, and no row of this block sees a later one).
            let end = seen.next_multiple_of(ROW_BLOCK).min(nkv);
            for row in ds_b.chunks_mut(nkv) {
                row[seen..end].fill(0.0);
            }
            let ds_rows = AOp {
                data: &*ds_b,
                rows,
                k: seen,
                rs: nkv,
                cs: 1,
            };
            gemm(isa, ds_rows, BOp::new(k, seen, d, d), dq_b, d, Out::Store);
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
            // Causal: the query rows before the first that sees key j0 have zero P and dS
            // in these columns.
            let i0 = s.first_row_seeing(causal, j0);
            if i0 >= nq {
                dk_b.fill(0.0);
                dv_b.fill(0.0);
                return;
            }
            let n = nq - i0;
            let mut guard = ws.acquire();
            let [qs] = carve(&mut guard, [if widen { nq * d } else { 0 }]);
            for (t, h) in (g * s.group()..(g + 1) * s.group()).enumerate() {
                let head = b * s.heads + h;
                let add = || if t == 0 { Out::Store } else { Out::Add };
                let q_off = s.q_head_offset(b, h) + i0 * d;
                let q = vecops::widen(&inputs.q, q_off, n * d, qs);
                let go = &d_out[q_off..][..n * d];
                let at = (head * nq + i0) * nkv + j0;
                // The group's P and dS columns j0.., transposed, in place.
                let pt = AOp::transposed(&probs[at..], jn, n, nkv);
                gemm(isa, pt, BOp::new(go, n, d, d), dv_b, d, add());
                let dst = AOp::transposed(&ds[at..], jn, n, nkv);
                gemm(isa, dst, BOp::new(q, n, d, d), dk_b, d, add());
            }
        });
}
