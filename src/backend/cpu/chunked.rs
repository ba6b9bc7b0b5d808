//! Rabe & Staats, "Self-attention does not need O(n^2) memory" (seed 001).
//!
//! `forward_chunked` is Figure 1: per query chunk, every key chunk is summarized independently
//! (exp-values E·V_j, exp-weight sums, chunk max m_j of the scores scaled by 1/sqrt(d)), all
//! summaries are kept, then rescaled by the global max and divided. Time O(n_q*n_kv*d);
//! extra memory per worker q_c*k_c (one score chunk) + (n_kv/k_c)*q_c*(d+2) (the summaries)
//! plus k_c*d (K_j^T panels; plus widened copies for low-precision inputs), i.e. O(sqrt n)
//! with the paper's chunk choices. Built from the same tiles as `naive` (`tiles`): the
//! chunk's scores are the same QK^T panels, row softmax and PV, in partial sums of <= 256
//! terms, so the two differ only by the algorithm.
//!
//! `forward_sequential` is Sections 2-3: one query at a time, keys one at a time, keeping
//! only v* in R^d, s* and m* (the O(1)-memory loop). Time O(n_q*n_kv*d); extra memory O(d)
//! per worker. Its dot products run over d terms in order, as the algorithm is stated.

use rayon::prelude::*;

use super::isa::Isa;
use super::sched::{for_each_item, Blocks};
use super::simd::LOG2E;
use super::tiles::{
    as_u16, bf16_bits, gemm, gemm_bf16, pack_pairs_t, pack_t, softmax_row, AOp, BOp, Out, Path,
    PANEL,
};
use super::workspace::{carve, Workspace};
use crate::problem::{Inputs, Shape};

/// The paper's defaults (`query_chunk_size = 1024`, `key_chunk_size = 4096`), each clamped
/// to `min(chunk, n)` as in the paper's code.
pub const DEFAULT_Q_CHUNK: usize = 1024;
pub const DEFAULT_KV_CHUNK: usize = 4096;

/// Query rows of a chunk computed together against one key chunk (the loop inside
/// `summarize_chunk`, cut for the cache): their rows of the q_c x k_c slab are computed,
/// exponentiated and multiplied by V_j while in L2, as `naive` does with its row blocks.
pub const STRIP: usize = 64;

/// Query rows per work item of the sequential loop (its memory does not depend on it).
pub const SEQ_ROW_BLOCK: usize = 64;

pub fn chunked_items(shape: &Shape, q_chunk: usize) -> usize {
    shape.batch * shape.heads * shape.seq_q.div_ceil(q_chunk)
}

/// Per-worker scratch floats of `forward_chunked`, in the order they are carved.
pub fn chunked_worker_lens(shape: &Shape, qc: usize, kc: usize, path: Path) -> [usize; 7] {
    let d = shape.head_dim;
    let nkc = shape.seq_kv.div_ceil(kc);
    let kt = kc.div_ceil(PANEL) * PANEL * d;
    let (qw, kt, vw) = match path {
        Path::F32 => (0, kt, 0),
        Path::Widen => (qc * d, kt, kc * d),
        Path::Bf16Dot => (0, kt / 2, kc * d),
    };
    [
        qw,           // widened query chunk
        kt,           // K_j^T in 64-key panels (bf16 pairs take half)
        vw,           // widened value chunk
        qc * kc,      // attn_weights of one key chunk, exponentiated in place
        nkc * qc * d, // exp_values of every key chunk
        nkc * qc,     // exp_weights sums of every key chunk
        nkc * qc,     // max_score of every key chunk
    ]
}

pub fn forward_chunked(
    inputs: &Inputs,
    causal: bool,
    (qc, kc): (usize, usize),
    isa: Isa,
    ws: &Workspace,
    out: &mut [f32],
) {
    let s = inputs.shape;
    let (d, nq, nkv) = (s.head_dim, s.seq_q, s.seq_kv);
    let nkc = nkv.div_ceil(kc);
    let nqc = nq.div_ceil(qc);
    let bh = s.batch * s.heads;
    let path = Path::of(inputs.dtype(), isa, d);
    let lens = chunked_worker_lens(&s, qc, kc, path);
    let scale = s.scale();
    let c = scale * LOG2E;
    let outs = Blocks::new(out, nq, d, qc);
    let (q16, k16) = (bf16_bits(&inputs.q), bf16_bits(&inputs.k));
    for_each_item(ws, bh * nqc, |buf, i| {
        // Head by head; causal: within a head the query chunks that see the most key
        // chunks first, so the last items handed out are the cheapest.
        let (head, qi) = if causal {
            (i / nqc, nqc - 1 - i % nqc)
        } else {
            (i / nqc, i % nqc)
        };
        let (b, h) = (head / s.heads, head % s.heads);
        let (q_off, kv_off) = (s.q_head_offset(b, h), s.kv_head_offset(b, h));
        let o = outs.take(head, qi);
        let row0 = qi * qc;
        let rows = o.len() / d;
        let [qw, kt, vw, sc, values, weights, maxes] = carve(buf, lens);
        // The scale 1/sqrt(d) is applied to the scores inside the exp (c), not to a copy of
        // the query chunk: the same scaled scores, and bf16 queries stay bf16 pairs.
        let q = match path {
            Path::Bf16Dot => &[][..],
            _ => inputs.q.rows_f32(q_off + row0 * d, rows * d, qw),
        };
        let q16 = q16.unwrap_or_default();
        let last_visible = s.visible_keys(causal, row0 + rows - 1);
        for j in 0..nkc {
            let k0 = j * kc;
            let kn = kc.min(nkv - k0);
            let (m_j, w_j) = (&mut maxes[j * qc..][..rows], &mut weights[j * qc..][..rows]);
            let v_j = &mut values[j * qc * d..][..rows * d];
            if k0 >= last_visible {
                // Every key of this chunk is masked for every row: an empty summary.
                m_j.fill(f32::NEG_INFINITY);
                w_j.fill(0.0);
                v_j.fill(0.0);
                continue;
            }
            let kv_at = kv_off + k0 * d;
            match path {
                Path::Bf16Dot => {
                    let k = &k16.unwrap_or_default()[kv_at..];
                    pack_pairs_t(k, kn, d, PANEL, as_u16(kt));
                }
                _ => pack_t(&inputs.k, kv_at, kn, d, PANEL, kt),
            }
            let v: &[f32] = match inputs.v.as_f32() {
                Some(v) => &v[kv_at..][..kn * d],
                None => {
                    inputs.v.copy_to_f32(kv_at, &mut vw[..kn * d]);
                    &vw[..kn * d]
                }
            };
            // The strips of the chunk write disjoint rows of the slab and the summaries, so
            // they may run on any worker: when there are fewer query chunks than threads
            // (one head, n <= 2 q_c) the idle workers take strips of the busy chunk.
            let (kt, kt16) = match path {
                Path::Bf16Dot => (&[][..], &*as_u16(kt)),
                _ => (&*kt, &[][..]),
            };
            let strips = sc[..rows * kn]
                .par_chunks_mut(STRIP * kn)
                .zip(m_j.par_chunks_mut(STRIP))
                .zip(w_j.par_chunks_mut(STRIP))
                .zip(v_j.par_chunks_mut(STRIP * d))
                .enumerate();
            strips.for_each(|(si, (((p, m_s), w_s), v_s))| {
                let r0 = si * STRIP;
                let sr = m_s.len();
                if s.visible_keys(causal, row0 + r0 + sr - 1) <= k0 {
                    m_s.fill(f32::NEG_INFINITY);
                    w_s.fill(0.0);
                    v_s.fill(0.0);
                    return;
                }
                for (pi, j0) in (0..kn).step_by(PANEL).enumerate() {
                    let jn = PANEL.min(kn - j0);
                    let panel = pi * PANEL * d;
                    match path {
                        Path::Bf16Dot => {
                            let q = &q16[q_off + (row0 + r0) * d..][..sr * d];
                            let a = AOp {
                                data: q,
                                rows: sr,
                                k: d / 2,
                                rs: d,
                                cs: 2,
                            };
                            let b = BOp {
                                data: &kt16[panel..][..PANEL * d],
                                k: d / 2,
                                n: jn,
                                ld: 2 * PANEL,
                            };
                            gemm_bf16(isa, a, b, &mut p[j0..], kn, Out::Store);
                        }
                        _ => {
                            let a = AOp {
                                data: &q[r0 * d..][..sr * d],
                                rows: sr,
                                k: d,
                                rs: d,
                                cs: 1,
                            };
                            let b = BOp {
                                data: &kt[panel..][..PANEL * d],
                                k: d,
                                n: jn,
                                ld: PANEL,
                            };
                            gemm(isa, a, b, &mut p[j0..], kn, Out::Store);
                        }
                    }
                }
                for (r, row) in p.chunks_mut(kn).enumerate() {
                    let visible = s.visible_keys(causal, row0 + r0 + r).saturating_sub(k0);
                    let (m, w) = softmax_row(isa, row, visible, c, true, false);
                    m_s[r] = m * scale;
                    w_s[r] = w;
                }
                let a = AOp {
                    data: &*p,
                    rows: sr,
                    k: kn,
                    rs: kn,
                    cs: 1,
                };
                let b = BOp {
                    data: v,
                    k: kn,
                    n: d,
                    ld: d,
                };
                gemm(isa, a, b, v_s, d, Out::Store);
            });
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
