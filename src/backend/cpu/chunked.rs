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
use super::sched::{team, Blocks, Windows};
use super::simd::LOG2E;
use super::tiles::{
    as_u16, as_u16_ref, bf16_bits, gemm, gemm_bf16, interleave_rows, pack_pairs_t, pack_t,
    softmax_row, softmax_row_bf16, AOp, BOp, Out, Path, LANES_MAX, PANEL,
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
pub fn chunked_lens(shape: &Shape, qc: usize, kc: usize, path: Path) -> [usize; 6] {
    let d = shape.head_dim;
    let nkc = shape.seq_kv.div_ceil(kc);
    let panels = kc.div_ceil(PANEL) * PANEL * d;
    // V_j is widened to f32 on the bf16 pair path too when the output feeds the backward.
    let (qw, kt, vw) = match path {
        Path::F32 => (0, panels, 0),
        Path::Widen => (qc * d, panels, panels),
        Path::Bf16Dot => (0, panels / 2, panels),
    };
    [
        qw,           // widened query chunk
        kt,           // K_j^T in 64-key panels (bf16 pairs take half)
        vw,           // V_j widened, or in bf16 row pairs, 64 keys a panel
        qc * kc,      // attn_weights of one key chunk, exponentiated in place
        nkc * qc * d, // exp_values of every key chunk
        nkc * qc * 2, // max_score and exp_weights of every key chunk
    ]
}

/// Floats of one 64-key panel of K_j^T on `path` (bf16 pairs take half).
fn panel_floats(d: usize, path: Path) -> usize {
    match path {
        Path::Bf16Dot => PANEL * d / 2,
        _ => PANEL * d,
    }
}

/// Figure 1 into `out`, with `buf` of `chunked_lens` floats in all (any contents: every
/// value is written before it is read); `exact` when the output feeds the backward (bf16 P
/// is then not rounded for PV).
///
/// Query chunks run one at a time (heads in order), shared by all workers in one parallel
/// region (`sched::team`): for each key chunk the query chunk sees, the workers pack the
/// panels of K_j^T (and V_j) it needs that are not packed yet, then take the chunk's 64-row
/// strips (`STRIP`), the most expensive first; with the last key chunk a strip also combines
/// its rows' summaries into the output. A chunk thus splits into q_c/64 balanced items
/// whatever the number of heads and chunks, so one head with n = q_c keeps every core busy.
/// The key chunks of consecutive query chunks run in alternating order, so a packed key
/// chunk is reused by the next query chunk (with one key chunk, K and V are packed once per
/// head, and under a causal mask each key is packed once, when it first becomes visible).
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
    let [qw, kt, vw, sc, values, stats] = carve(buf, chunked_lens(&s, qc, kc, path));
    let npanels = kc.div_ceil(PANEL);
    let kt = Blocks::new(kt, npanels, panel_floats(d, path), 1);
    // V_j as bf16 pairs takes half a widened panel's floats.
    let v_panel = if bf16_pv { PANEL * d / 2 } else { PANEL * d };
    let vw = Blocks::new(vw, npanels, v_panel, 1);
    let qw = Blocks::new(qw, qc, d, STRIP);
    let sc = Blocks::new(sc, qc, kc, STRIP);
    // Per row, the exp-values, and the (max, weight sum), of every key chunk: a strip's
    // summaries are a block of each that its item owns.
    let values = Blocks::new(values, qc, nkc * d, STRIP);
    let stats = Blocks::new(stats, qc, nkc * 2, STRIP);
    let outs = Windows::new(out, d, STRIP, qc);
    let (q16, k16, v16) = (
        bf16_bits(&inputs.q).unwrap_or_default(),
        bf16_bits(&inputs.k).unwrap_or_default(),
        bf16_bits(&inputs.v).unwrap_or_default(),
    );
    let scale = s.scale();
    team(|team| {
        // Which key chunk kt/vw hold (its offset in K) and how many of its keys; every
        // worker follows the same sequence, so all agree.
        let mut packed: Option<(usize, usize)> = None;
        for head in 0..s.batch * s.heads {
            let (b, h) = (head / s.heads, head % s.heads);
            let (q_off, kv_off) = (s.q_head_offset(b, h), s.kv_head_offset(b, h));
            for (qi, row0) in (0..nq).step_by(qc).enumerate() {
                let rows = qc.min(nq - row0);
                let strips = rows.div_ceil(STRIP);
                // Key chunks from the last one any row of the query chunk sees are skipped
                // (their summaries would be empty).
                let last_visible = s.visible_keys(causal, row0 + rows - 1).min(nkv);
                let chunks = last_visible.div_ceil(kc);
                for step in 0..chunks.max(1) {
                    let j = if qi % 2 == 0 {
                        step
                    } else {
                        chunks.max(1) - 1 - step
                    };
                    let k0 = j * kc;
                    let kn = kc.min(nkv - k0).min(last_visible.saturating_sub(k0));
                    let kv_at = kv_off + k0 * d;
                    let have = match packed {
                        Some((at, keys)) if at == kv_at => keys,
                        _ => 0,
                    };
                    if have < kn {
                        // A partly packed last panel is packed again, whole.
                        let first = have / PANEL;
                        team.for_each(kn.div_ceil(PANEL) - first, |ph, i| {
                            let pi = first + i;
                            let (j0, jn) = (pi * PANEL, PANEL.min(kn - pi * PANEL));
                            let kp = kt.take_in(ph, 0, pi);
                            match path {
                                Path::Bf16Dot => {
                                    pack_pairs_t(&k16[kv_at + j0 * d..], jn, d, PANEL, as_u16(kp))
                                }
                                _ => pack_t(&inputs.k, kv_at + j0 * d, jn, d, PANEL, kp),
                            }
                            // f32 V is read in place.
                            if bf16_pv {
                                let v = &v16[kv_at + j0 * d..][..jn * d];
                                interleave_rows(isa, v, jn, d, as_u16(vw.take_in(ph, 0, pi)));
                            } else if path != Path::F32 {
                                let vp = &mut vw.take_in(ph, 0, pi)[..jn * d];
                                inputs.v.copy_to_f32(kv_at + j0 * d, vp);
                            }
                        });
                        packed = Some((kv_at, kn));
                    }
                    let last = step + 1 == chunks.max(1);
                    team.for_each(strips, |ph, i| {
                        // Causal: the strips that see the most keys first, so the last ones
                        // handed out are the cheapest.
                        let si = if causal { strips - 1 - i } else { i };
                        let r0 = si * STRIP;
                        let sr = STRIP.min(rows - r0);
                        let visible = |r: usize| {
                            s.visible_keys(causal, row0 + r0 + r)
                                .saturating_sub(k0)
                                .min(kn)
                        };
                        let mut sums = Sums {
                            values: values.take_in(ph, 0, si),
                            stats: stats.take_in(ph, 0, si),
                            chunks: nkc,
                            d,
                        };
                        if kn > 0 {
                            let q = match path {
                                Path::Bf16Dot => {
                                    Query::Pairs(&q16[q_off + (row0 + r0) * d..][..sr * d])
                                }
                                // f32 queries are read in place, others widened.
                                Path::F32 => Query::F32(inputs.q.rows_f32(
                                    q_off + (row0 + r0) * d,
                                    sr * d,
                                    &mut [],
                                )),
                                Path::Widen => {
                                    let w = qw.take_in(ph, 0, si);
                                    let at = q_off + (row0 + r0) * d;
                                    Query::F32(inputs.q.rows_f32(at, sr * d, w))
                                }
                            };
                            let k = kt.view_in(ph);
                            let strip = Strip {
                                isa,
                                d,
                                kn,
                                scale,
                                q,
                                k: match path {
                                    Path::Bf16Dot => KeyChunk::Pairs(as_u16_ref(k)),
                                    _ => KeyChunk::F32(k),
                                },
                                v: match inputs.v.as_f32() {
                                    Some(v) => Values::F32(&v[kv_at..][..kn * d]),
                                    None if bf16_pv => Values::Pairs(as_u16_ref(vw.view_in(ph))),
                                    None => Values::F32(&vw.view_in(ph)[..kn * d]),
                                },
                            };
                            let p = &mut sc.take_in(ph, 0, si)[..sr * kn];
                            strip.summarize(visible, p, &mut sums, j);
                        }
                        if last {
                            let o = outs.take_in(ph, head * nq + row0, rows, si);
                            for (r, o_r) in o.chunks_mut(d).enumerate() {
                                sums.combine_row(r, chunks, o_r);
                            }
                        }
                    });
                }
            }
        }
    });
}

/// The query strip as the QK^T tile reads it: f32 rows, or bf16 pairs for `vdpbf16ps`.
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

/// One strip of a query chunk against one key chunk of `kn` keys: Figure 1's
/// `summarize_chunk` for the strip's rows.
struct Strip<'a> {
    isa: Isa,
    d: usize,
    kn: usize,
    scale: f32,
    q: Query<'a>,
    k: KeyChunk<'a>,
    v: Values<'a>,
}

impl Strip<'_> {
    /// The strip's scores against the key chunk `j` in `p` (rows of `kn`, exponentiated
    /// in place), and its rows' summaries of chunk `j` in `sums`: the chunk max of the
    /// scaled scores, the exp sum and the d exp-values. `visible(r)` is how many keys of
    /// the chunk row r sees.
    fn summarize(
        &self,
        visible: impl Fn(usize) -> usize,
        p: &mut [f32],
        sums: &mut Sums,
        j: usize,
    ) {
        let (d, kn, isa) = (self.d, self.kn, self.isa);
        let sr = p.len() / kn;
        let (vs, ss) = (sums.chunks * d, sums.chunks * 2);
        let (values, stats) = (&mut *sums.values, &mut *sums.stats);
        // Causal: the strip's last row sees the most keys; the panels past them are not
        // computed, and the product with V stops there too.
        let seen = visible(sr - 1);
        if seen == 0 {
            for r in 0..sr {
                stats[r * ss + 2 * j] = f32::NEG_INFINITY;
                stats[r * ss + 2 * j + 1] = 0.0;
                values[r * vs + j * d..][..d].fill(0.0);
            }
            return;
        }
        for (pi, j0) in (0..seen).step_by(PANEL).enumerate() {
            let jn = PANEL.min(seen - j0);
            let panel = pi * PANEL * d;
            match (self.q, self.k) {
                (Query::Pairs(q), KeyChunk::Pairs(kt)) => {
                    let a = AOp {
                        data: q,
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
                        data: q,
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
        // Softmax of each row, max subtracted, not normalized; for the bf16 PV tile the
        // probabilities are written as bf16 over the row itself.
        let c = self.scale * LOG2E;
        let pairs_pv = matches!(self.v, Values::Pairs(_));
        for (r, row) in p.chunks_mut(kn).enumerate() {
            let (m, w) = if pairs_pv {
                softmax_row_bf16(isa, &mut row[..seen], visible(r), c)
            } else {
                softmax_row(isa, &mut row[..seen], visible(r), c, true, false)
            };
            stats[r * ss + 2 * j] = m * self.scale;
            stats[r * ss + 2 * j + 1] = w;
        }
        let v_s = &mut values[j * d..];
        match self.v {
            Values::Pairs(vp) => {
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
                gemm_bf16(isa, a, b, v_s, vs, Out::Store);
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
                gemm(isa, a, b, v_s, vs, Out::Store);
            }
        }
    }
}

/// A strip's summaries of every key chunk: per row, the exp-values of each chunk
/// (`[rows][chunks][d]`) and its (max, exp sum) (`[rows][chunks][2]`).
struct Sums<'p> {
    values: &'p mut [f32],
    stats: &'p mut [f32],
    chunks: usize,
    d: usize,
}

impl Sums<'_> {
    /// Output row `r` of the strip from its summaries of the first `chunks` key chunks:
    /// global_max, max_diffs = exp(chunk_max - global_max), then the weighted sums
    /// divided by the weighted exp sums.
    fn combine_row(&self, r: usize, chunks: usize, o_r: &mut [f32]) {
        let d = self.d;
        let values = &self.values[r * self.chunks * d..][..chunks * d];
        let stats = &self.stats[r * self.chunks * 2..][..chunks * 2];
        let global = stats
            .chunks_exact(2)
            .map(|x| x[0])
            .fold(f32::NEG_INFINITY, f32::max);
        o_r.fill(0.0);
        if global == f32::NEG_INFINITY {
            return; // no visible key: output 0
        }
        let mut all_weights = 0.0f32;
        for (st, v) in stats.chunks_exact(2).zip(values.chunks_exact(d)) {
            if st[0] == f32::NEG_INFINITY {
                continue;
            }
            let diff = (st[0] - global).exp();
            all_weights += st[1] * diff;
            for (acc, x) in o_r.iter_mut().zip(v) {
                *acc += x * diff;
            }
        }
        for x in o_r.iter_mut() {
            *x /= all_weights;
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{DType, InputDist};

    /// The chunk buffer may hold anything (a warm timing loop hands it over from the
    /// previous call): the output is bit for bit that of a zero-filled buffer, on every
    /// path, mask and dtype, with several query and key chunks (partial ones included).
    #[test]
    fn a_buffer_of_any_contents_gives_the_same_output() {
        for (nq, nkv, d, qc, kc) in [
            (200, 150, 16, 64, 64),
            (70, 100, 12, 32, 40),
            (9, 200, 32, 4, 128),
        ] {
            let shape = Shape {
                batch: 2,
                heads: 2,
                kv_heads: 1,
                seq_q: nq,
                seq_kv: nkv,
                head_dim: d,
            };
            for dtype in [DType::F32, DType::Bf16, DType::F16] {
                let inputs = Inputs::generate(shape, dtype, InputDist::Normal, 1.0, 5);
                for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
                    for causal in [false, true] {
                        for exact in [false, true] {
                            let run = |fill: f32| {
                                let path = Path::of(dtype, isa, d);
                                let mut buf =
                                    vec![fill; chunked_lens(&shape, qc, kc, path).iter().sum()];
                                let mut out = vec![fill; shape.out_len()];
                                rayon::ThreadPoolBuilder::new()
                                    .num_threads(3)
                                    .build()
                                    .unwrap()
                                    .install(|| {
                                        forward_chunked(
                                            &inputs,
                                            causal,
                                            exact,
                                            (qc, kc),
                                            isa,
                                            &mut buf,
                                            &mut out,
                                        )
                                    });
                                out
                            };
                            let what = format!(
                                "{dtype} {isa} causal {causal} exact {exact} {nq}x{nkv}x{d}"
                            );
                            let (o0, o1) = (run(0.0), run(f32::NAN));
                            assert!(o1.iter().all(|x| x.is_finite()), "{what}");
                            assert_eq!(o0, o1, "{what}");
                        }
                    }
                }
            }
        }
    }
}
