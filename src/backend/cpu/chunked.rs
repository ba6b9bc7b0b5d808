//! Rabe & Staats, "Self-attention does not need O(n^2) memory" (seed 001).
//!
//! `forward_chunked` is Figure 1: per query chunk (q pre-scaled by 1/sqrt(d)), every key chunk
//! is summarized independently (exp-values E·V_j, exp-weight sums, chunk max m_j), all
//! summaries are kept, then rescaled by the global max and divided. Time O(n_q*n_kv*d);
//! extra memory per worker q_c*k_c (one score chunk) + (n_kv/k_c)*q_c*(d+2) (the summaries)
//! + q_c*d (the scaled query chunk), i.e. O(sqrt n) with the paper's chunk choices.
//!
//! `forward_sequential` is Sections 2-3: one query at a time, keys one at a time, keeping
//! only v* in R^d, s* and m* (the O(1)-memory loop). Time O(n_q*n_kv*d); extra memory O(d)
//! per worker. Its dot products run over d terms in order, as the algorithm is stated.

use rayon::prelude::*;

use super::gemm::{sgemm, MatRef};
use super::softmax::{exp_sub_sum, mask_from, row_max};
use super::workspace::{carve, Workspace};
use crate::problem::{Inputs, Shape};

/// The paper's defaults (`query_chunk_size = 1024`, `key_chunk_size = 4096`), each clamped
/// to `min(chunk, n)` as in the paper's code.
pub const DEFAULT_Q_CHUNK: usize = 1024;
pub const DEFAULT_KV_CHUNK: usize = 4096;

/// Query rows per work item of the sequential loop (its memory does not depend on it).
pub const SEQ_ROW_BLOCK: usize = 64;

pub fn chunked_items(shape: &Shape, q_chunk: usize) -> usize {
    shape.batch * shape.heads * shape.seq_q.div_ceil(q_chunk)
}

/// Per-worker scratch floats of `forward_chunked`, in the order they are carved.
pub fn chunked_worker_lens(shape: &Shape, qc: usize, kc: usize, widen: bool) -> [usize; 7] {
    let d = shape.head_dim;
    let nkc = shape.seq_kv.div_ceil(kc);
    let kv = if widen { kc * d } else { 0 };
    [
        qc * d,       // the scaled query chunk
        kv,           // widened key chunk
        kv,           // widened value chunk
        qc * kc,      // attn_weights of one key chunk, exponentiated in place
        nkc * qc * d, // exp_values of every key chunk
        nkc * qc,     // exp_weights sums of every key chunk
        nkc * qc,     // max_score of every key chunk
    ]
}

pub fn forward_chunked(
    inputs: &Inputs,
    causal: bool,
    qc: usize,
    kc: usize,
    ws: &Workspace,
    out: &mut [f32],
) {
    let s = inputs.shape;
    let (d, nq, nkv) = (s.head_dim, s.seq_q, s.seq_kv);
    let nkc = nkv.div_ceil(kc);
    let widen = inputs.dtype().size_bytes() != 4;
    let scale = s.scale();
    out.par_chunks_mut(nq * d)
        .enumerate()
        .for_each(|(head, out_h)| {
            let (b, h) = (head / s.heads, head % s.heads);
            let (q_off, kv_off) = (s.q_head_offset(b, h), s.kv_head_offset(b, h));
            out_h
                .par_chunks_mut(qc * d)
                .enumerate()
                .for_each(|(qi, o)| {
                    let row0 = qi * qc;
                    let rows = o.len() / d;
                    let mut guard = ws.acquire();
                    let [qs, ks, vs, sc, values, weights, maxes] =
                        carve(&mut guard, chunked_worker_lens(&s, qc, kc, widen));
                    // query = query / sqrt(d), as the paper does before the key loop.
                    let qs = &mut qs[..rows * d];
                    inputs.q.copy_to_f32(q_off + row0 * d, qs);
                    for x in qs.iter_mut() {
                        *x *= scale;
                    }
                    let last_visible = s.visible_keys(causal, row0 + rows - 1);
                    for j in 0..nkc {
                        let k0 = j * kc;
                        let kn = kc.min(nkv - k0);
                        let (m_j, w_j) =
                            (&mut maxes[j * qc..][..rows], &mut weights[j * qc..][..rows]);
                        let v_j = &mut values[j * qc * d..][..rows * d];
                        if k0 >= last_visible {
                            // Every key of this chunk is masked for every row: an empty summary.
                            m_j.fill(f32::NEG_INFINITY);
                            w_j.fill(0.0);
                            v_j.fill(0.0);
                            continue;
                        }
                        let k = inputs.k.rows_f32(kv_off + k0 * d, kn * d, ks);
                        let v = inputs.v.rows_f32(kv_off + k0 * d, kn * d, vs);
                        let p = &mut sc[..rows * kn];
                        sgemm(
                            1.0,
                            MatRef::new(qs, rows, d),
                            MatRef::new(k, kn, d).t(),
                            0.0,
                            p,
                            kn,
                        );
                        for (r, row) in p.chunks_mut(kn).enumerate() {
                            let visible = s.visible_keys(causal, row0 + r).saturating_sub(k0);
                            mask_from(row, visible);
                            m_j[r] = row_max(row);
                            w_j[r] = exp_sub_sum(row, m_j[r]);
                        }
                        sgemm(
                            1.0,
                            MatRef::new(p, rows, kn),
                            MatRef::new(v, kn, d),
                            0.0,
                            v_j,
                            d,
                        );
                    }
                    // global_max, max_diffs = exp(chunk_max - global_max), then the weighted sums.
                    for r in 0..rows {
                        let global = (0..nkc)
                            .map(|j| maxes[j * qc + r])
                            .fold(f32::NEG_INFINITY, f32::max);
                        let o_r = &mut o[r * d..(r + 1) * d];
                        o_r.fill(0.0);
                        if global == f32::NEG_INFINITY {
                            continue; // no visible key: output 0
                        }
                        let mut all_weights = 0.0f32;
                        for j in 0..nkc {
                            let m = maxes[j * qc + r];
                            if m == f32::NEG_INFINITY {
                                continue;
                            }
                            let diff = (m - global).exp();
                            all_weights += weights[j * qc + r] * diff;
                            let v_jr = &values[(j * qc + r) * d..][..d];
                            for (acc, x) in o_r.iter_mut().zip(v_jr) {
                                *acc += x * diff;
                            }
                        }
                        for x in o_r.iter_mut() {
                            *x /= all_weights;
                        }
                    }
                });
        });
}

pub fn sequential_items(shape: &Shape) -> usize {
    shape.batch * shape.heads * shape.seq_q.div_ceil(SEQ_ROW_BLOCK)
}

/// Per-worker scratch floats of `forward_sequential`: v*, and widened q, k, v rows.
pub fn sequential_worker_floats(shape: &Shape) -> usize {
    4 * shape.head_dim
}

pub fn forward_sequential(inputs: &Inputs, causal: bool, ws: &Workspace, out: &mut [f32]) {
    let s = inputs.shape;
    let (d, nq) = (s.head_dim, s.seq_q);
    let scale = s.scale();
    out.par_chunks_mut(nq * d)
        .enumerate()
        .for_each(|(head, out_h)| {
            let (b, h) = (head / s.heads, head % s.heads);
            let (q_off, kv_off) = (s.q_head_offset(b, h), s.kv_head_offset(b, h));
            out_h
                .par_chunks_mut(SEQ_ROW_BLOCK * d)
                .enumerate()
                .for_each(|(blk, o)| {
                    let mut guard = ws.acquire();
                    let [v_star, qs, ks, vs] = carve(&mut guard, [d; 4]);
                    for (r, o_r) in o.chunks_mut(d).enumerate() {
                        let row = blk * SEQ_ROW_BLOCK + r;
                        let q = inputs.q.rows_f32(q_off + row * d, d, qs);
                        v_star.fill(0.0);
                        let (mut m_star, mut s_star) = (f32::NEG_INFINITY, 0.0f32);
                        for i in 0..s.visible_keys(causal, row) {
                            let k = inputs.k.rows_f32(kv_off + i * d, d, ks);
                            let s_i = scale * q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>();
                            let m_i = m_star.max(s_i);
                            let (old, new) = ((m_star - m_i).exp(), (s_i - m_i).exp());
                            let v = inputs.v.rows_f32(kv_off + i * d, d, vs);
                            for (acc, x) in v_star.iter_mut().zip(v) {
                                *acc = *acc * old + x * new;
                            }
                            s_star = s_star * old + new;
                            m_star = m_i;
                        }
                        for (y, x) in o_r.iter_mut().zip(v_star.iter()) {
                            *y = if s_star > 0.0 { x / s_star } else { 0.0 };
                        }
                    }
                });
        });
}
