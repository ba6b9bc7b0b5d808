//! FlashAttention-2 backward from the stored row logsumexp L (Dao 2023; docs/papers.md
//! 2.4): D = rowsum(dO * O); outer loop over key/value blocks j (the parallel work items,
//! each owning dK_j and dV_j), inner loop over the query blocks i of every query head that
//! shares the key/value head: P = exp(Q_i K_j^T / sqrt(d) - L_i), dV_j += P^T dO_i,
//! dS = P * (dO_i V_j^T - D_i), dK_j += dS^T Q_i / sqrt(d), dQ_i += dS K_j / sqrt(d) (added
//! under dQ_i's lock, the CPU stand-in for the GPU's atomic adds). Causal: query blocks that
//! see nothing of block j are skipped; with a sliding window (`Shape::key_range`) so are
//! those whose first row's window starts after block j and that hold no attention sink, and
//! keys before a row's window start, sinks aside, are masked. The products run on the
//! forward's register tiles (`block_grads`), K_j^T and V_j^T packed once per item, dS
//! formed over P (no dP buffer up to d = 256), rows of K_j^T, V_j^T, P and dS at
//! `tiles::skew_stride` (off the L1's power-of-two set aliasing). Time
//! O(b*h*n_q*n_kv*d) (5 matmuls incl. the recomputed S); extra memory D (4*b*h*n_q bytes)
//! and per-worker tiles, O(1) in n.

use rayon::prelude::*;

use super::block_grads::{ds_in_place, probs_from_lse, products, scores, Acc, Block};
use super::blocks::{head_row_blocks, split_bytes, LockedBlocks};
use super::isa::Isa;
use super::naive_bwd::dot;
use super::softmax::mask_from;
use super::tiles::{pack_t, skew_stride};
use super::vecops;
use super::workspace::{carve, Workspace};
use crate::problem::{Grads, Inputs, Shape};

pub fn items(shape: &Shape, bk: usize) -> usize {
    shape.batch * shape.kv_heads * shape.seq_kv.div_ceil(bk)
}

/// Heap bytes of the per-block lists: dQ's locked blocks, dK's and dV's blocks.
pub fn bookkeeping_bytes(shape: &Shape, bq: usize, bk: usize) -> u64 {
    let q_blocks = shape.batch * shape.heads * shape.seq_q.div_ceil(bq);
    LockedBlocks::bytes(q_blocks) + 2 * split_bytes(items(shape, bk))
}

/// Per-worker scratch floats, in the order they are carved: Q_i and K_j widened (16-bit
/// inputs), K_j^T and V_j^T (d rows of `skew_stride(bk)`), P then dS (bq rows of
/// `skew_stride(bk)`), dP (the same, only for head dims above `KC`:
/// `block_grads::ds_in_place`), dK_j and dV_j, dQ_i.
pub fn worker_lens(shape: &Shape, bq: usize, bk: usize, widen: bool) -> [usize; 9] {
    let d = shape.head_dim;
    let (q, k) = if widen { (bq * d, bk * d) } else { (0, 0) };
    let ld = skew_stride(bk);
    let (t, p) = (d * ld, bq * ld);
    let dp = if ds_in_place(d) { 0 } else { p };
    [q, k, t, t, p, dp, bk * d, bk * d, bq * d]
}

/// Floats of D = rowsum(dO * O), one per query row.
pub fn d_len(shape: &Shape) -> usize {
    shape.batch * shape.heads * shape.seq_q
}

#[allow(clippy::too_many_arguments)]
pub fn backward(
    inputs: &Inputs,
    causal: bool,
    (window, sinks): (Option<usize>, usize),
    (bq, bk): (usize, usize),
    isa: Isa,
    out: &[f32],
    d_out: &[f32],
    lse: &[f32],
    dd: &mut [f32],
    ws: &Workspace,
    grads: &mut Grads,
) {
    let s = inputs.shape;
    let (d, nq, nkv) = (s.head_dim, s.seq_q, s.seq_kv);
    let scale = s.scale();
    let widen = inputs.dtype().size_bytes() != 4;
    dd.par_iter_mut().enumerate().for_each(|(row, x)| {
        *x = dot(&d_out[row * d..(row + 1) * d], &out[row * d..(row + 1) * d]);
    });
    let dd: &[f32] = dd;
    grads.dq.fill(0.0);
    let dq = LockedBlocks::new(&mut grads.dq, None, nq, d, bq);
    let nqb = nq.div_ceil(bq);
    let nkb = nkv.div_ceil(bk);
    // K^T, V^T, P and dS rows off the L1's power-of-two aliasing (`skew_stride`).
    let ldt = skew_stride(bk);
    let dk_blocks = head_row_blocks(&mut grads.dk, nkv, d, bk);
    let dv_blocks = head_row_blocks(&mut grads.dv, nkv, d, bk);
    dk_blocks
        .into_par_iter()
        .zip(dv_blocks)
        .enumerate()
        .for_each(|(item, (dk_j, dv_j))| {
            let (kv_head, kj) = (item / nkb, item % nkb);
            let (b, g) = (kv_head / s.kv_heads, kv_head % s.kv_heads);
            let k0 = kj * bk;
            let kn = dk_j.len() / d;
            let mut guard = ws.acquire();
            let [qs, ks, kt, vt, p, dp, dk_acc, dv_acc, dq_tmp] =
                carve(&mut guard, worker_lens(&s, bq, bk, widen));
            let kv_off = (b * s.kv_heads + g) * nkv * d;
            let k = vecops::widen(&inputs.k, kv_off + k0 * d, kn * d, ks);
            // K_j^T and V_j^T once per key block: the B operands of S and dP.
            pack_t(isa, &inputs.k, kv_off + k0 * d, kn, d, ldt, kt);
            pack_t(isa, &inputs.v, kv_off + k0 * d, kn, d, ldt, vt);
            let (dk_acc, dv_acc) = (&mut dk_acc[..kn * d], &mut dv_acc[..kn * d]);
            dk_acc.fill(0.0);
            dv_acc.fill(0.0);
            for h in g * s.group()..(g + 1) * s.group() {
                let head = b * s.heads + h;
                let q_off = s.q_head_offset(b, h);
                for qi in 0..nqb {
                    let row0 = qi * bq;
                    let rows = bq.min(nq - row0);
                    if s.visible_keys(causal, row0 + rows - 1) <= k0 {
                        continue; // every row of this block is masked for block j
                    }
                    // A row's window start never decreases: the first row's is the least.
                    let lo = |r: usize| s.key_range(causal, window, row0 + r).start;
                    if window.is_some() && lo(0) >= k0 + kn && k0 >= sinks {
                        continue; // block j is before every row's window, no sink in it
                    }
                    let q = vecops::widen(&inputs.q, q_off + row0 * d, rows * d, qs);
                    let block = Block {
                        q,
                        k,
                        kt,
                        vt,
                        ldt,
                        d_out: &d_out[q_off + row0 * d..][..rows * d],
                        d_rows: &dd[head * nq + row0..][..rows],
                        rows,
                        kn,
                        d,
                        ldp: ldt,
                    };
                    let p = &mut p[..rows * ldt];
                    scores(isa, q, kt, ldt, (rows, kn, d), p, ldt);
                    if causal {
                        for (r, row) in p.chunks_mut(ldt).enumerate() {
                            let row = &mut row[..kn];
                            mask_from(row, s.visible_keys(true, row0 + r).saturating_sub(k0));
                        }
                    }
                    if window.is_some() && lo(rows - 1) > k0 {
                        // Keys before a row's window, the sinks among them aside.
                        let first = sinks.saturating_sub(k0).min(kn);
                        for (r, row) in p.chunks_mut(ldt).enumerate() {
                            let n = lo(r).saturating_sub(k0).min(kn);
                            row[first.min(n)..n].fill(f32::NEG_INFINITY);
                        }
                    }
                    probs_from_lse(isa, p, &lse[head * nq + row0..][..rows], (kn, ldt), scale);
                    let dq_t = &mut dq_tmp[..rows * d];
                    let acc = |c, add| Acc { c, add };
                    let dp = (!ds_in_place(d)).then(|| &mut dp[..rows * ldt]);
                    products(
                        isa,
                        &block,
                        p,
                        dp,
                        scale,
                        acc(&mut *dv_acc, true),
                        acc(&mut *dk_acc, true),
                        acc(dq_t, false),
                    );
                    dq.add(head * nqb + qi, &[dq_t]);
                }
            }
            dk_j.copy_from_slice(dk_acc);
            dv_j.copy_from_slice(dv_acc);
        });
}
