//! Rabe & Staats memory-efficient differentiation (Rabe & Staats Sec. 5.2; docs/papers.md, Rabe & Staats):
//! the forward keeps only Q, K, V, O; the backward recomputes each chunk instead of storing
//! it (the checkpointing of `summarize_chunk`). Per query chunk (a parallel work item, owning
//! its dQ rows): pass 1 over key chunks recomputes the chunk summaries (max m_j, sum w_j),
//! giving L = M + log sum_j w_j e^(m_j - M); D = rowsum(dO * O); pass 2 over key chunks
//! recomputes P = exp(S - L), then dV_j += P^T dO, dS = P * (dO V_j^T - D),
//! dQ += dS K_j / sqrt(d), dK_j += dS^T Q / sqrt(d) (dK_j, dV_j added under their chunk's
//! lock), on the forward's register tiles (`block_grads`), in 64-row strips that take
//! only the keys their last row sees (causal). Time O(n_q*n_kv*d) with 8
//! matmul units against standard attention's 6; extra memory per worker two q_c x k_c
//! slabs, the summaries and O(q_c*d + k_c*d): O(sqrt n) with the paper's chunks, and no
//! n_q x n_kv matrix ever.

use rayon::prelude::*;

use super::block_grads::{probs_from_lse, products, scores, Acc, Block};
use super::blocks::LockedBlocks;
use super::chunked::STRIP;
use super::isa::Isa;
use super::naive_bwd::dot;
use super::softmax::mask_from;
use super::tiles::{self, pack_t, pad_lanes};
use super::vecops;
use super::workspace::{carve, Workspace};
use crate::problem::{Grads, Inputs, Shape};

pub fn items(shape: &Shape, qc: usize) -> usize {
    shape.batch * shape.heads * shape.seq_q.div_ceil(qc)
}

/// Heap bytes of the per-block list: dK's and dV's locked blocks.
pub fn bookkeeping_bytes(shape: &Shape, kc: usize) -> u64 {
    LockedBlocks::bytes(shape.batch * shape.kv_heads * shape.seq_kv.div_ceil(kc))
}

/// Per-worker scratch floats, in the order they are carved.
pub fn worker_lens(shape: &Shape, qc: usize, kc: usize, widen: bool) -> [usize; 12] {
    let d = shape.head_dim;
    let nkc = shape.seq_kv.div_ceil(kc);
    let k = if widen { kc * d } else { 0 };
    let t = d * pad_lanes(kc);
    [
        qc * d,   // the scaled query chunk
        k,        // widened key chunk
        t,        // K_j^T
        t,        // V_j^T
        qc * kc,  // S, then P, of one key chunk
        qc * kc,  // dP, then dS
        nkc * qc, // recomputed chunk maxima m_j
        nkc * qc, // recomputed chunk sums w_j
        2 * qc,   // L and D of the query chunk
        qc * d,   // dQ accumulator
        kc * d,   // dK_j contribution
        kc * d,   // dV_j contribution
    ]
}

#[allow(clippy::too_many_arguments)]
pub fn backward(
    inputs: &Inputs,
    causal: bool,
    (qc, kc): (usize, usize),
    isa: Isa,
    out: &[f32],
    d_out: &[f32],
    ws: &Workspace,
    grads: &mut Grads,
) {
    let s = inputs.shape;
    let (d, nq, nkv) = (s.head_dim, s.seq_q, s.seq_kv);
    let scale = s.scale();
    let widen = inputs.dtype().size_bytes() != 4;
    let nkc = nkv.div_ceil(kc);
    let ldt = pad_lanes(kc);
    grads.dk.fill(0.0);
    grads.dv.fill(0.0);
    let dkv = LockedBlocks::new(&mut grads.dk, Some(&mut grads.dv), nkv, d, kc);
    // Nested chunking (no per-block list): the workspace does not depend on n_q, so a part
    // of the query rows measures the whole case's memory (extrapolation relies on it).
    grads
        .dq
        .par_chunks_mut(nq * d)
        .enumerate()
        .for_each(|(head, dq_h)| {
            dq_h.par_chunks_mut(qc * d)
                .enumerate()
                .for_each(|(ci, dq_c)| {
                    let (b, h) = (head / s.heads, head % s.heads);
                    let (q_off, kv_off) = (s.q_head_offset(b, h), s.kv_head_offset(b, h));
                    let kv_block0 = (b * s.kv_heads + h / s.group()) * nkc;
                    let row0 = ci * qc;
                    let rows = dq_c.len() / d;
                    let mut guard = ws.acquire();
                    let [qs, ks, kt, vt, p, dp, maxes, sums, ld, dq_acc, dk_t, dv_t] =
                        carve(&mut guard, worker_lens(&s, qc, kc, widen));
                    let qs = &mut qs[..rows * d];
                    vecops::widen_into(&inputs.q, q_off + row0 * d, qs);
                    qs.iter_mut().for_each(|x| *x *= scale);
                    let go = &d_out[q_off + row0 * d..][..rows * d];
                    let o = &out[q_off + row0 * d..][..rows * d];
                    let last_visible = s.visible_keys(causal, row0 + rows - 1);
                    // Causal rows see a prefix of the keys that grows with the row: strips of
                    // `STRIP` rows take only the keys their last row sees, as the forward does.
                    let strips = rows.div_ceil(STRIP);
                    let strip = |i: usize| (i * STRIP, STRIP.min(rows - i * STRIP));
                    let sees =
                        |r: usize, k0: usize| s.visible_keys(causal, row0 + r).saturating_sub(k0);
                    let log2e = std::f32::consts::LOG2_E;

                    // Pass 1: the forward's chunk summaries again, then L per row.
                    for j in 0..nkc {
                        let (k0, kn) = (j * kc, kc.min(nkv - j * kc));
                        let (m_j, w_j) =
                            (&mut maxes[j * qc..][..rows], &mut sums[j * qc..][..rows]);
                        m_j.fill(f32::NEG_INFINITY);
                        w_j.fill(0.0);
                        if k0 >= last_visible {
                            continue;
                        }
                        pack_t(isa, &inputs.k, kv_off + k0 * d, kn, d, ldt, kt);
                        for (r0, sr) in (0..strips).map(strip) {
                            let seen = sees(r0 + sr - 1, k0).min(kn);
                            if seen == 0 {
                                continue; // the strip sees nothing of chunk j
                            }
                            let p = &mut p[r0 * kn..];
                            let q = &qs[r0 * d..][..sr * d];
                            scores(isa, q, kt, ldt, (sr, seen, d), p, kn);
                            for (r, row) in p.chunks_mut(kn).take(sr).enumerate() {
                                let vis = sees(r0 + r, k0).min(seen);
                                // The scores are scaled already: 2^(s log2 e - m log2 e).
                                (m_j[r0 + r], w_j[r0 + r]) = tiles::softmax_row(
                                    isa,
                                    &mut row[..seen],
                                    vis,
                                    log2e,
                                    true,
                                    false,
                                );
                            }
                        }
                    }
                    let (l, dd) = ld.split_at_mut(qc);
                    for r in 0..rows {
                        let big = (0..nkc)
                            .map(|j| maxes[j * qc + r])
                            .fold(f32::NEG_INFINITY, f32::max);
                        l[r] = if big == f32::NEG_INFINITY {
                            f32::NEG_INFINITY
                        } else {
                            let w: f32 = (0..nkc)
                                .filter(|&j| maxes[j * qc + r] > f32::NEG_INFINITY)
                                .map(|j| sums[j * qc + r] * (maxes[j * qc + r] - big).exp())
                                .sum();
                            big + w.ln()
                        };
                        dd[r] = dot(&go[r * d..(r + 1) * d], &o[r * d..(r + 1) * d]);
                    }

                    // Pass 2: P from L, and the four gradient products per key chunk.
                    let dq_acc = &mut dq_acc[..rows * d];
                    dq_acc.fill(0.0);
                    for j in 0..nkc {
                        let (k0, kn) = (j * kc, kc.min(nkv - j * kc));
                        if k0 >= last_visible {
                            continue;
                        }
                        // The keys of chunk j that any row sees; the last strip sees them all.
                        let kmax = kn.min(last_visible - k0);
                        let k = vecops::widen(&inputs.k, kv_off + k0 * d, kmax * d, ks);
                        pack_t(isa, &inputs.k, kv_off + k0 * d, kmax, d, ldt, kt);
                        pack_t(isa, &inputs.v, kv_off + k0 * d, kmax, d, ldt, vt);
                        // The last strip first: it stores dK_j and dV_j, the others add.
                        for i in (0..strips).rev() {
                            let (r0, sr) = strip(i);
                            let seen = sees(r0 + sr - 1, k0).min(kmax);
                            if seen == 0 {
                                continue;
                            }
                            let (p, dp) = (&mut p[r0 * kn..], &mut dp[r0 * kn..]);
                            let q = &qs[r0 * d..][..sr * d];
                            scores(isa, q, kt, ldt, (sr, seen, d), p, kn);
                            for (r, row) in p.chunks_mut(kn).take(sr).enumerate() {
                                mask_from(&mut row[..seen], sees(r0 + r, k0));
                            }
                            probs_from_lse(isa, p, &l[r0..r0 + sr], (seen, kn), 1.0);
                            let block = Block {
                                q,
                                k: &k[..seen * d],
                                kt,
                                vt,
                                ldt,
                                d_out: &go[r0 * d..][..sr * d],
                                d_rows: &dd[r0..r0 + sr],
                                rows: sr,
                                kn: seen,
                                d,
                                ldp: kn,
                            };
                            let add = i + 1 < strips; // the last strip stored them
                            let acc = |c, add| Acc { c, add };
                            // Q is pre-scaled, so dS^T Qs is already dS^T Q / sqrt(d); dQ is
                            // scaled once at the end.
                            products(
                                isa,
                                &block,
                                p,
                                Some(dp),
                                1.0,
                                acc(&mut dv_t[..seen * d], add),
                                acc(&mut dk_t[..seen * d], add),
                                acc(&mut dq_acc[r0 * d..][..sr * d], true),
                            );
                        }
                        dkv.add(kv_block0 + j, &[&dk_t[..kmax * d], &dv_t[..kmax * d]]);
                    }
                    for (y, x) in dq_c.iter_mut().zip(dq_acc.iter()) {
                        *y = x * scale;
                    }
                });
        });
}
