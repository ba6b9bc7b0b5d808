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
use super::sched::{for_each_index, Blocks};
use super::simd::LOG2E;
use super::tiles::{
    as_u16, bf16_bits, gemm, gemm_bf16, interleave_rows, pack_pairs_t, pack_t, round_bf16_in_place,
    softmax_row, AOp, BOp, Out, Path, LANES_MAX, PANEL,
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

/// Floats of the one chunk buffer of `forward_chunked`, in the order they are carved. One
/// query chunk is in flight at a time, shared by all workers, as in the paper's `lax.map`
/// over query chunks: the memory does not grow with the thread count.
pub fn chunked_lens(shape: &Shape, qc: usize, kc: usize, path: Path) -> [usize; 7] {
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

/// Figure 1 into `out`, with `buf` of `chunked_lens` floats in all; `exact` when the output
/// feeds the backward (bf16 P is then not rounded for PV). Query chunks run one at
/// a time (heads in order); the workers share each chunk: they pack K_j^T panel by panel,
/// then take its 64-row strips (`STRIP`) for every key chunk, then its rows for the final
/// rescaling. A chunk thus splits into q_c/64 balanced items whatever the number of heads
/// and chunks, so one head with n = q_c still keeps every core busy.
pub fn forward_chunked(
    inputs: &Inputs,
    causal: bool,
    exact: bool,
    (qc, kc): (usize, usize),
    isa: Isa,
    buf: &mut [f32],
    out: &mut [f32],
) {
    let s = inputs.shape;
    let (d, nq, nkv) = (s.head_dim, s.seq_q, s.seq_kv);
    let nkc = nkv.div_ceil(kc);
    let path = Path::of(inputs.dtype(), isa, d);
    // bf16 on AVX512_BF16: both products by `vdpbf16ps` (P rounded to bf16 for PV, as
    // `flash` does) when V's rows are whole vectors, unless the output feeds the backward
    // (`exact`); else PV in f32 on a widened V_j.
    let bf16_pv = path == Path::Bf16Dot && !exact && d.is_multiple_of(LANES_MAX);
    let [qw, kt, vw, sc, values, weights, maxes] = carve(buf, chunked_lens(&s, qc, kc, path));
    let q16 = bf16_bits(&inputs.q).unwrap_or_default();
    let k16 = bf16_bits(&inputs.k).unwrap_or_default();
    for (head, out_h) in out.chunks_mut(nq * d).enumerate() {
        let (b, h) = (head / s.heads, head % s.heads);
        let (q_off, kv_off) = (s.q_head_offset(b, h), s.kv_head_offset(b, h));
        for (qi, o) in out_h.chunks_mut(qc * d).enumerate() {
            let row0 = qi * qc;
            let rows = o.len() / d;
            // The scale 1/sqrt(d) is applied to the scores inside the exp, not to a copy of
            // the query chunk: the same scaled scores, and bf16 queries stay bf16 pairs.
            let q = match path {
                Path::Bf16Dot => Query::Pairs(&q16[q_off + row0 * d..][..rows * d]),
                _ => Query::F32(inputs.q.rows_f32(q_off + row0 * d, rows * d, qw)),
            };
            let last_visible = s.visible_keys(causal, row0 + rows - 1);
            for j in 0..nkc {
                let k0 = j * kc;
                let kn = kc.min(nkv - k0);
                let m_j = &mut maxes[j * qc..][..rows];
                let w_j = &mut weights[j * qc..][..rows];
                let v_j = &mut values[j * qc * d..][..rows * d];
                if k0 >= last_visible {
                    // Every key of this chunk is masked for every row: an empty summary.
                    m_j.fill(f32::NEG_INFINITY);
                    w_j.fill(0.0);
                    v_j.fill(0.0);
                    continue;
                }
                let kv_at = kv_off + k0 * d;
                let key_chunk = match path {
                    Path::Bf16Dot => {
                        let kt = as_u16(kt);
                        kt.par_chunks_mut(PANEL * d)
                            .take(kn.div_ceil(PANEL))
                            .enumerate()
                            .for_each(|(pi, panel)| {
                                let (j0, jn) = (pi * PANEL, PANEL.min(kn - pi * PANEL));
                                let k = &k16[kv_at + j0 * d..];
                                pack_pairs_t(k, jn, d, PANEL, panel);
                            });
                        KeyChunk::Pairs(&*kt)
                    }
                    _ => {
                        kt.par_chunks_mut(PANEL * d)
                            .take(kn.div_ceil(PANEL))
                            .enumerate()
                            .for_each(|(pi, panel)| {
                                let (j0, jn) = (pi * PANEL, PANEL.min(kn - pi * PANEL));
                                pack_t(&inputs.k, kv_at + j0 * d, jn, d, PANEL, panel);
                            });
                        KeyChunk::F32(&*kt)
                    }
                };
                let values_j = if bf16_pv {
                    // V_j as bf16 row pairs for the bf16 PV tile, 64 rows (32 pairs) a piece.
                    let vp = as_u16(vw);
                    let v16 = bf16_bits(&inputs.v).unwrap_or_default();
                    vp[..kn.div_ceil(2) * 2 * d]
                        .par_chunks_mut(PANEL * d)
                        .enumerate()
                        .for_each(|(pi, dst)| {
                            let (j0, jn) = (pi * PANEL, PANEL.min(kn - pi * PANEL));
                            interleave_rows(isa, &v16[kv_at + j0 * d..][..jn * d], jn, d, dst);
                        });
                    Values::Pairs(&vp[..kn.div_ceil(2) * 2 * d])
                } else {
                    Values::F32(match inputs.v.as_f32() {
                        Some(v) => &v[kv_at..][..kn * d],
                        None => {
                            vw[..kn * d].par_chunks_mut(PANEL * d).enumerate().for_each(
                                |(pi, w)| inputs.v.copy_to_f32(kv_at + pi * PANEL * d, w),
                            );
                            &vw[..kn * d]
                        }
                    })
                };
                let chunk = Chunk {
                    isa,
                    d,
                    kn,
                    scale: s.scale(),
                    q,
                    k: key_chunk,
                    v: values_j,
                };
                // Causal: the strips that see the most keys first, so the last ones handed
                // out are the cheapest.
                let strips = rows.div_ceil(STRIP);
                let scores = Blocks::new(&mut sc[..rows * kn], rows, kn, STRIP);
                let (m_j, w_j) = (
                    Blocks::new(m_j, rows, 1, STRIP),
                    Blocks::new(w_j, rows, 1, STRIP),
                );
                let v_j = Blocks::new(v_j, rows, d, STRIP);
                for_each_index(strips, |i| {
                    let si = if causal { strips - 1 - i } else { i };
                    let r0 = si * STRIP;
                    let visible =
                        |r: usize| s.visible_keys(causal, row0 + r0 + r).saturating_sub(k0);
                    let (p, m_s) = (scores.take(0, si), m_j.take(0, si));
                    let (w_s, v_s) = (w_j.take(0, si), v_j.take(0, si));
                    chunk.summarize_strip(r0, visible, p, m_s, w_s, v_s);
                });
            }
            let (maxes, weights, values) = (&*maxes, &*weights, &*values);
            o.par_chunks_mut(STRIP * d)
                .enumerate()
                .for_each(|(si, o_s)| {
                    for (r, o_r) in o_s.chunks_mut(d).enumerate() {
                        combine_row(si * STRIP + r, qc, nkc, maxes, weights, values, o_r);
                    }
                });
        }
    }
}

/// The query chunk as the QK^T tile reads it: f32 rows, or bf16 pairs for `vdpbf16ps`.
#[derive(Clone, Copy)]
enum Query<'a> {
    F32(&'a [f32]),
    Pairs(&'a [u16]),
}

/// V_j as the PV tile reads it: f32 rows, or bf16 row pairs `[ceil(k_n/2)][d][2]`.
#[derive(Clone, Copy)]
enum Values<'a> {
    F32(&'a [f32]),
    Pairs(&'a [u16]),
}

/// K_j^T packed in 64-key panels: f32, or bf16 key pairs.
#[derive(Clone, Copy)]
enum KeyChunk<'a> {
    F32(&'a [f32]),
    Pairs(&'a [u16]),
}

/// One (query chunk, key chunk) pair of Figure 1's `summarize_chunk`, shared by the workers.
struct Chunk<'a> {
    isa: Isa,
    d: usize,
    kn: usize,
    scale: f32,
    q: Query<'a>,
    k: KeyChunk<'a>,
    v: Values<'a>,
}

impl Chunk<'_> {
    /// Rows `r0..r0 + m_s.len()` of the chunk against the key chunk: their scores `p`
    /// (exponentiated in place), chunk max `m_s` (of the scaled scores), exp sums `w_s` and
    /// exp-values `v_s`. `visible(r)` is how many keys of the chunk row `r0 + r` sees.
    fn summarize_strip(
        &self,
        r0: usize,
        visible: impl Fn(usize) -> usize,
        p: &mut [f32],
        m_s: &mut [f32],
        w_s: &mut [f32],
        v_s: &mut [f32],
    ) {
        let (d, kn, isa) = (self.d, self.kn, self.isa);
        let sr = m_s.len();
        if visible(sr - 1) == 0 {
            m_s.fill(f32::NEG_INFINITY);
            w_s.fill(0.0);
            v_s.fill(0.0);
            return;
        }
        // Causal: the strip's last row sees the most keys; the panels past them are not
        // computed, and the product with V stops there too.
        let seen = visible(sr - 1).min(kn);
        for (pi, j0) in (0..seen).step_by(PANEL).enumerate() {
            let jn = PANEL.min(seen - j0);
            let panel = pi * PANEL * d;
            match (self.q, self.k) {
                (Query::Pairs(q), KeyChunk::Pairs(kt)) => {
                    let a = AOp {
                        data: &q[r0 * d..][..sr * d],
                        rows: sr,
                        k: d / 2,
                        rs: d,
                        cs: 2,
                    };
                    let b = BOp {
                        data: &kt[panel..][..PANEL * d],
                        k: d / 2,
                        n: jn,
                        ld: 2 * PANEL,
                    };
                    gemm_bf16(isa, a, b, &mut p[j0..], kn, Out::Store);
                }
                (Query::F32(q), KeyChunk::F32(kt)) => {
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
                _ => unreachable!("query and keys take the same operand path"),
            }
        }
        let c = self.scale * LOG2E;
        for (r, row) in p.chunks_mut(kn).enumerate() {
            let (m, w) = softmax_row(isa, &mut row[..seen], visible(r), c, true, false);
            m_s[r] = m * self.scale;
            w_s[r] = w;
        }
        match self.v {
            Values::Pairs(vp) => {
                for row in p.chunks_mut(kn) {
                    round_bf16_in_place(isa, row, seen);
                }
                let pairs = seen.div_ceil(2);
                let a = AOp {
                    data: &*as_u16(p),
                    rows: sr,
                    k: pairs,
                    rs: 2 * kn,
                    cs: 2,
                };
                let b = BOp {
                    data: &vp[..pairs * 2 * d],
                    k: pairs,
                    n: d,
                    ld: 2 * d,
                };
                gemm_bf16(isa, a, b, v_s, d, Out::Store);
            }
            Values::F32(v) => {
                let a = AOp {
                    data: &*p,
                    rows: sr,
                    k: seen,
                    rs: kn,
                    cs: 1,
                };
                let b = BOp {
                    data: &v[..seen * d],
                    k: seen,
                    n: d,
                    ld: d,
                };
                gemm(isa, a, b, v_s, d, Out::Store);
            }
        }
    }
}

/// Row `r` of the chunk's output from its summaries: global_max, max_diffs =
/// exp(chunk_max - global_max), then the weighted sums divided by the weighted exp sums.
fn combine_row(
    r: usize,
    qc: usize,
    nkc: usize,
    maxes: &[f32],
    weights: &[f32],
    values: &[f32],
    o_r: &mut [f32],
) {
    let d = o_r.len();
    let global = (0..nkc)
        .map(|j| maxes[j * qc + r])
        .fold(f32::NEG_INFINITY, f32::max);
    o_r.fill(0.0);
    if global == f32::NEG_INFINITY {
        return; // no visible key: output 0
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
