//! Standard (materialized) attention: S = QK^T/sqrt(d) for all heads at once (a
//! `[batch, heads, seq_q, seq_kv]` f32 tensor, as a framework materializes it), softmax of
//! each row (max subtracted unless `safe` is false, which shows the exp overflow once scores
//! reach 89), then O = PV. Time O(b*h*n_q*n_kv*d); extra memory 4*b*h*n_q*n_kv bytes plus
//! per-worker K^T panels of one key/value head (and, for bf16/f16 inputs, f32 copies of its
//! V and of a query row block, or on AVX512_BF16 its V in row pairs and a bf16 copy of one
//! row block of P): the list is `worker_lens`.
//!
//! Built from the same tiles as `chunked` and `flash` (`tiles`): QK^T row block x 64-key
//! K^T panels, the vectorized row softmax, and PV with V read in place, its key loop summed
//! in partial sums of <= 256 terms. bf16 inputs on AVX512_BF16 use `vdpbf16ps` for QK^T and,
//! unless the output feeds the backward (`exact`), for PV with P rounded to bf16, as `flash`
//! and `rabe-staats` do; S itself always holds the f32 probabilities.

use super::isa::Isa;
use super::sched::{for_each_item_with, Blocks};
use super::simd::LOG2E;
use super::tiles::{
    as_u16, bf16_bits, gemm, gemm_bf16, interleave_rows, pack_pairs_t, pack_t, round_bf16,
    softmax_row, AOp, BOp, Out, Path, LANES_MAX, PANEL,
};
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

/// Whether PV runs on bf16 pairs (`vdpbf16ps`, P rounded to bf16): bf16 inputs on
/// AVX512_BF16 with V rows of whole vectors, unless the output feeds the backward (`exact`).
pub fn bf16_pv(path: Path, head_dim: usize, exact: bool) -> bool {
    path == Path::Bf16Dot && !exact && head_dim.is_multiple_of(LANES_MAX)
}

/// Per-worker scratch floats, in the order they are carved: the K^T panels of one key/value
/// head (bf16 pairs take half), its V widened to f32 or paired as bf16 rows, a widened
/// query row block (f16, and bf16 off the pair path), and the bf16 copy of one row block of
/// P (bf16 PV).
pub fn worker_lens(shape: &Shape, path: Path, exact: bool) -> [usize; 4] {
    let d = shape.head_dim;
    let nkv = shape.seq_kv;
    let kt = nkv.div_ceil(PANEL) * PANEL * d;
    match path {
        Path::F32 => [kt, 0, 0, 0],
        Path::Widen => [kt, nkv * d, ROW_BLOCK * d, 0],
        Path::Bf16Dot if bf16_pv(path, d, exact) => {
            [kt / 2, nkv.div_ceil(2) * d, 0, ROW_BLOCK * nkv.div_ceil(2)]
        }
        Path::Bf16Dot => [kt / 2, nkv * d, 0, 0],
    }
}

/// `scores` has `scores_len` elements; `ws` buffers have `worker_lens` floats in all.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    inputs: &Inputs,
    causal: bool,
    safe: bool,
    exact: bool,
    isa: Isa,
    scores: &mut [f32],
    ws: &Workspace,
    out: &mut [f32],
) {
    let s = inputs.shape;
    let (d, nq, nkv) = (s.head_dim, s.seq_q, s.seq_kv);
    let path = Path::of(inputs.dtype(), isa, d);
    let c = s.scale() * LOG2E;
    let nqb = nq.div_ceil(ROW_BLOCK);
    let lens = worker_lens(&s, path, exact);
    let pv16 = bf16_pv(path, d, exact);
    let v16 = bf16_bits(&inputs.v).unwrap_or_default();
    let outs = Blocks::new(out, nq, d, ROW_BLOCK);
    let probs = Blocks::new(scores, nq, nkv, ROW_BLOCK);
    let (q16, k16) = (bf16_bits(&inputs.q), bf16_bits(&inputs.k));
    // Items in head-major order: a worker repacks K^T (and widens V) only when its next
    // item belongs to another key/value head (`packed`).
    for_each_item_with(
        ws,
        s.batch * s.heads * nqb,
        |buf, packed: &mut Option<usize>, i| {
            // Causal: within a head the row blocks that see the most keys first, so the last
            // items handed out are the cheapest.
            let (head, blk) = (i / nqb, i % nqb);
            let blk = if causal { nqb - 1 - blk } else { blk };
            let (b, h) = (head / s.heads, head % s.heads);
            let (q_off, kv_off) = (s.q_head_offset(b, h), s.kv_head_offset(b, h));
            let (o, p) = (outs.take(head, blk), probs.take(head, blk));
            let row0 = blk * ROW_BLOCK;
            let rows = o.len() / d;
            let [kt, vw, qw, pw] = carve(buf, lens);
            if *packed != Some(kv_off) {
                match path {
                    Path::Bf16Dot => {
                        let k = &k16.unwrap_or_default()[kv_off..];
                        pack_pairs_t(k, nkv, d, PANEL, as_u16(kt));
                    }
                    _ => pack_t(&inputs.k, kv_off, nkv, d, PANEL, kt),
                }
                if pv16 {
                    interleave_rows(isa, &v16[kv_off..][..nkv * d], nkv, d, as_u16(vw));
                } else if path != Path::F32 {
                    inputs.v.copy_to_f32(kv_off, &mut vw[..nkv * d]);
                }
                *packed = Some(kv_off);
            }

            // S = Q K^T, one 64-key panel of K^T at a time (raw scores; the scale is in c).
            let q = match path {
                Path::Bf16Dot => &[][..],
                _ => inputs.q.rows_f32(q_off + row0 * d, rows * d, qw),
            };
            let q16 = q16.unwrap_or_default();
            // Causal: the block's last row sees the most keys; the panels past them are not
            // computed (the softmax writes their zeros) and PV stops there.
            let seen = s.visible_keys(causal, row0 + rows - 1).min(nkv);
            if seen == 0 {
                p.fill(0.0);
                o.fill(0.0);
                return;
            }
            for (pi, j0) in (0..seen).step_by(PANEL).enumerate() {
                let jn = PANEL.min(seen - j0);
                let panel = pi * PANEL * d;
                match path {
                    Path::Bf16Dot => {
                        let q = &q16[q_off + row0 * d..][..rows * d];
                        let kt = &as_u16(kt)[panel..][..PANEL * d];
                        let a = AOp {
                            data: q,
                            rows,
                            k: d / 2,
                            rs: d,
                            cs: 2,
                        };
                        let b = BOp {
                            data: kt,
                            k: d / 2,
                            n: jn,
                            ld: 2 * PANEL,
                        };
                        gemm_bf16(isa, a, b, &mut p[j0..], nkv, Out::Store);
                    }
                    _ => {
                        let b = BOp {
                            data: &kt[panel..][..PANEL * d],
                            k: d,
                            n: jn,
                            ld: PANEL,
                        };
                        let a = AOp {
                            data: q,
                            rows,
                            k: d,
                            rs: d,
                            cs: 1,
                        };
                        gemm(isa, a, b, &mut p[j0..], nkv, Out::Store);
                    }
                }
            }
            for (r, row) in p.chunks_mut(nkv).enumerate() {
                softmax_row(isa, row, s.visible_keys(causal, row0 + r), c, safe, true);
            }
            if pv16 {
                // P's row block rounded to bf16 pairs (S keeps the f32 probabilities).
                let stride = 2 * nkv.div_ceil(2);
                let p16 = as_u16(pw);
                for (row, dst) in p.chunks(nkv).zip(p16.chunks_mut(stride)) {
                    round_bf16(isa, &row[..seen], dst);
                }
                let pairs = seen.div_ceil(2);
                let a = AOp {
                    data: &p16[..rows * stride],
                    rows,
                    k: pairs,
                    rs: stride,
                    cs: 2,
                };
                let b = BOp {
                    data: &as_u16(vw)[..pairs * 2 * d],
                    k: pairs,
                    n: d,
                    ld: 2 * d,
                };
                gemm_bf16(isa, a, b, o, d, Out::Store);
                return;
            }
            let v: &[f32] = match inputs.v.as_f32() {
                Some(v) => &v[kv_off..][..nkv * d],
                None => &vw[..nkv * d],
            };
            let a = AOp {
                data: &*p,
                rows,
                k: seen,
                rs: nkv,
                cs: 1,
            };
            let b = BOp {
                data: &v[..seen * d],
                k: seen,
                n: d,
                ld: d,
            };
            gemm(isa, a, b, o, d, Out::Store);
        },
    );
}
