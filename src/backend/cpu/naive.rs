//! Standard (materialized) attention: S = QK^T/sqrt(d) for all heads at once (a
//! `[batch, heads, seq_q, seq_kv]` f32 tensor, as a framework materializes it), softmax of
//! each row (max subtracted unless `safe` is false, which shows the exp overflow once scores
//! reach 89), then O = PV. Time O(b*h*n_q*n_kv*d); extra memory 4*b*h*n_q*n_kv bytes plus
//! per-worker K^T panels of one key/value head, one row block of scores (and, for bf16/f16
//! inputs, f32 copies of its V and of a query row block, or on AVX512_BF16 its V in row
//! pairs and a bf16 copy of the row block of P): the list is `worker_lens`.
//!
//! Built from the same tiles as `chunked` and `flash` (`tiles`): QK^T row block x 64-key
//! K^T panels, the vectorized row softmax, and PV with V read in place, its key loop summed
//! in partial sums of <= 256 terms. bf16 inputs on AVX512_BF16 use `vdpbf16ps` (on the
//! amx-bf16 path AMX tiles, `amx_gemm`) for QK^T and, unless the output feeds the backward
//! (`exact`), for PV with P rounded to bf16, as `flash` and `rabe-staats` do; the
//! materialized P always holds the f32 probabilities.
//!
//! A row block's scores are computed, exponentiated and multiplied by V in the worker's
//! cached copy, in passes of as many rows as keep their scores in L2 (`cache::pass_rows`:
//! the copy is sized for the whole block, so the workspace does not depend on the machine),
//! and every probability is written to the n^2 matrix by non-temporal stores:
//! the matrix is far larger than the caches, so its lines go straight to memory instead of
//! being read first and written back later (a third of the matrix's memory traffic).
//!
//! Sliding window (`Shape::key_range`): a strip's scores start at the whole 64-key panel
//! holding its first row's window start (the panels before it, outside every row's window,
//! are not computed and P gets their zeros), and the keys before each row's start are
//! masked; the matrix keeps its full size.

use super::cache;
use super::isa::Isa;
use super::products::{self, Operand};
use super::sched::{for_each_item_with, Blocks};
use super::simd::LOG2E;
use super::tiles::{
    as_u16, as_u16_ref, bf16_bits, interleave_rows, pack_pairs_t, pack_t, scale_stream,
    scale_stream_pairs, softmax_row, store_fence, ReadPath, PANEL,
};
use super::vecops;
use super::workspace::{carve, Workspace};
use crate::problem::{Inputs, Shape};

/// Query rows per work item; within it, passes of `cache::pass_rows` rows compute,
/// normalize and multiply their scores by V while they are still in L2.
pub const ROW_BLOCK: usize = 64;

/// Work items (heads x row blocks) the parallel loop runs.
pub fn items(shape: &Shape) -> usize {
    shape.batch * shape.heads * shape.seq_q.div_ceil(ROW_BLOCK)
}

/// Elements of the materialized score tensor.
pub fn scores_len(shape: &Shape) -> usize {
    shape.batch * shape.heads * shape.seq_q * shape.seq_kv
}

/// Per-worker scratch floats, in the order they are carved: the K^T panels of one key/value
/// head (bf16 pairs take half), its V widened to f32 or paired as bf16 rows, a widened
/// query row block (f16, and bf16 off the pair path), the bf16 copy of one row block of P
/// (bf16 PV), and the cached copy of one row block of scores.
pub fn worker_lens(shape: &Shape, path: ReadPath, exact: bool) -> [usize; 5] {
    let d = shape.head_dim;
    let nkv = shape.seq_kv;
    let kt = nkv.div_ceil(PANEL) * PANEL * d;
    let block = ROW_BLOCK * nkv;
    match path {
        ReadPath::F32 => [kt, 0, 0, 0, block],
        ReadPath::Widen => [kt, nkv * d, ROW_BLOCK * d, 0, block],
        ReadPath::Bf16Dot if path.bf16_pv(d, exact) => [
            kt / 2,
            nkv.div_ceil(2) * d,
            0,
            ROW_BLOCK * nkv.div_ceil(2),
            block,
        ],
        ReadPath::Bf16Dot => [kt / 2, nkv * d, 0, 0, block],
    }
}

/// `scores` has `scores_len` elements, of any contents: every entry is written (P, zero
/// where a key is masked). `ws` buffers have `worker_lens` floats in all, of any contents.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    inputs: &Inputs,
    causal: bool,
    window: Option<usize>,
    safe: bool,
    exact: bool,
    isa: Isa,
    scores: &mut [f32],
    ws: &Workspace,
    out: &mut [f32],
) {
    let s = inputs.shape;
    let (d, nq, nkv) = (s.head_dim, s.seq_q, s.seq_kv);
    let path = ReadPath::of(inputs.dtype(), isa, d);
    let c = s.scale() * LOG2E;
    let nqb = nq.div_ceil(ROW_BLOCK);
    let lens = worker_lens(&s, path, exact);
    let pv16 = path.bf16_pv(d, exact);
    // Query rows per pass over the keys: their scores stay in L2.
    let sub = cache::pass_rows(nkv, path.kv_bytes(d, pv16));
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
            let [kt, vw, qw, pw, sc] = carve(buf, lens);
            let sc = &mut sc[..rows * nkv];
            if *packed != Some(kv_off) {
                match path {
                    ReadPath::Bf16Dot => {
                        let k = &k16.unwrap_or_default()[kv_off..];
                        pack_pairs_t(isa, k, nkv, d, PANEL, as_u16(kt));
                    }
                    _ => pack_t(isa, &inputs.k, kv_off, nkv, d, PANEL, kt),
                }
                if pv16 {
                    interleave_rows(isa, &v16[kv_off..][..nkv * d], nkv, d, as_u16(vw));
                } else if path != ReadPath::F32 {
                    vecops::widen_into(&inputs.v, kv_off, &mut vw[..nkv * d]);
                }
                *packed = Some(kv_off);
            }

            // The block's query rows as the QK^T tile reads them (f32 widened if need be).
            let q = match path {
                ReadPath::Bf16Dot => Operand::Pairs(&q16.unwrap_or_default()[q_off + row0 * d..]),
                _ => Operand::F32(vecops::widen(&inputs.q, q_off + row0 * d, rows * d, qw)),
            };
            let block = Block {
                shape: &s,
                isa,
                causal,
                window,
                safe,
                c,
                pv16,
                kt: match path {
                    ReadPath::Bf16Dot => Operand::Pairs(as_u16_ref(kt)),
                    _ => Operand::F32(kt),
                },
                v: match inputs.v.as_f32() {
                    Some(v) => Operand::F32(&v[kv_off..][..nkv * d]),
                    None if pv16 => Operand::Pairs(as_u16_ref(vw)),
                    None => Operand::F32(&vw[..nkv * d]),
                },
            };
            let strips = o.chunks_mut(sub * d).zip(p.chunks_mut(sub * nkv));
            for (i, (o, p)) in strips.enumerate() {
                let (r0, rows) = (i * sub, o.len() / d);
                let q = q.slice(r0 * d, rows * d);
                block.strip(row0 + r0, q, &mut sc[..rows * nkv], pw, p, o);
            }
        },
    );
}

/// The operands the strips of one row block share: its head's packed K^T panels and V.
struct Block<'a> {
    shape: &'a Shape,
    isa: Isa,
    causal: bool,
    window: Option<usize>,
    safe: bool,
    /// The score scale times log2(e).
    c: f32,
    pv16: bool,
    kt: Operand<'a>,
    /// V as f32 rows (read in place, or widened), or in bf16 row pairs (bf16 PV).
    v: Operand<'a>,
}

impl Block<'_> {
    /// Query rows `row0..` (as many as `o` holds, `q` their rows as the QK^T tile reads
    /// them): their scores into `sc` (rows of n_kv), the probabilities streamed to their
    /// rows `p` of P, the output into `o`; `pw` holds the bf16 copy of the strip's P for
    /// bf16 PV.
    fn strip(
        &self,
        row0: usize,
        q: Operand,
        sc: &mut [f32],
        pw: &mut [f32],
        p: &mut [f32],
        o: &mut [f32],
    ) {
        let s = self.shape;
        let (d, nkv, isa, c) = (s.head_dim, s.seq_kv, self.isa, self.c);
        let rows = o.len() / d;
        // Causal: the strip's last row sees the most keys; the panels past them are not
        // computed (P gets their zeros) and PV stops there.
        let seen = s.visible_keys(self.causal, row0 + rows - 1).min(nkv);
        if seen == 0 {
            for dst in p.chunks_mut(nkv) {
                scale_stream(isa, &mut [], 0.0, dst, false);
            }
            store_fence(isa);
            o.fill(0.0);
            return;
        }
        // Sliding window: from the panel of the first row's window start (a row's start never
        // decreases, so the panels before it are outside every row's window).
        let lo = |r: usize| s.key_range(self.causal, self.window, row0 + r).start;
        let w0 = match self.window {
            Some(_) => lo(0) / PANEL * PANEL,
            None => 0,
        };
        // S = Q K^T (raw scores; the scale is in c).
        let kt = self.kt.skip(w0 * d);
        products::scores(isa, q, kt, rows, d, seen - w0, &mut sc[w0..], nkv);
        // Softmax of each row in the cached copy, the probabilities streamed to P (and,
        // for bf16 PV, rounded into the pairs the PV tile reads).
        let stride = 2 * nkv.div_ceil(2);
        let p16 = as_u16(pw);
        for (r, (row, dst)) in sc.chunks_mut(nkv).zip(p.chunks_mut(nkv)).enumerate() {
            let visible = s.visible_keys(self.causal, row0 + r);
            let row = if self.window.is_some() {
                // Keys before the row's window start: -inf; P's panels before w0: zeros.
                row[w0..lo(r)].fill(f32::NEG_INFINITY);
                scale_stream(isa, &mut [], 0.0, &mut dst[..w0], false);
                &mut row[w0..seen]
            } else {
                &mut row[..seen]
            };
            let dst = &mut dst[w0..];
            let (_, sum) = softmax_row(isa, row, visible - w0, c, self.safe, false);
            let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
            if self.pv16 {
                let pairs = &mut p16[r * stride..][..stride];
                scale_stream_pairs(isa, row, inv, dst, pairs);
            } else {
                scale_stream(isa, row, inv, dst, true);
            }
        }
        store_fence(isa);
        let (p, ldp) = if self.pv16 {
            (Operand::Pairs(&p16[..rows * stride]), stride)
        } else {
            (Operand::F32(&sc[w0..]), nkv)
        };
        let v = self.v.skip(w0 * d);
        products::values(isa, p, ldp, v, rows, seen - w0, d, o, d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::kernel_paths::{for_each_path, on_pool};

    /// The score matrix and the workspace may hold anything (a warm timing loop hands them
    /// over from the previous call): the kernel writes every entry of P, and its output and
    /// P are bit for bit those of zero-filled buffers, on every path, mask and dtype. The
    /// rows per pass (`cache::pass_rows`) only cut the work for the cache: any count gives
    /// the same bits too (causal passes compute only the keys their last row sees).
    #[test]
    fn buffers_of_any_contents_and_any_pass_rows_give_the_same_probabilities_and_output() {
        // Rows not a multiple of the row block; more keys than queries (causal rows see
        // different counts); a head dim that is a multiple of 16 (bf16 PV) and one that is not.
        for (nq, nkv, d) in [(70, 100, 16), (5, 37, 12), (130, 130, 32)] {
            let shape = Shape {
                batch: 1,
                heads: 2,
                kv_heads: 1,
                seq_q: nq,
                seq_kv: nkv,
                head_dim: d,
            };
            for_each_path(shape, 3, |k| {
                let run = |fill: f32, rows: usize| {
                    let path = ReadPath::of(k.dtype, k.isa, d);
                    let floats = worker_lens(&shape, path, k.exact).iter().sum();
                    let ws = Workspace::scratch(2, floats, "test").unwrap();
                    ws.fill(fill);
                    let mut p = vec![fill; scores_len(&shape)];
                    let mut out = vec![fill; shape.out_len()];
                    on_pool(2, || {
                        cache::with_pass_rows(rows, || {
                            forward(
                                k.inputs, k.causal, None, true, k.exact, k.isa, &mut p, &ws,
                                &mut out,
                            )
                        })
                    });
                    (p, out)
                };
                let (p0, o0) = run(0.0, ROW_BLOCK);
                let (p1, o1) = run(f32::NAN, ROW_BLOCK);
                let what = k.name();
                assert!(o1.iter().all(|x| x.is_finite()), "{what}: output");
                assert_eq!(
                    p0.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    p1.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{what}: P"
                );
                assert_eq!(o0, o1, "{what}: output");
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                for rows in [12, 5, 1] {
                    let (p, o) = run(f32::NAN, rows);
                    assert!(bits(&p) == bits(&p0), "{what}: P, {rows} rows per pass");
                    assert!(
                        bits(&o) == bits(&o0),
                        "{what}: output, {rows} rows per pass"
                    );
                }
                // Each row of P is a distribution over the keys it sees.
                for (r, row) in p1.chunks(nkv).enumerate() {
                    let vis = shape.visible_keys(k.causal, r % nq);
                    assert!(row[vis..].iter().all(|x| *x == 0.0), "{what}: masked");
                    let sum: f32 = row.iter().sum();
                    assert!((sum - 1.0).abs() < 1e-5, "{what}: row {r} sums to {sum}");
                }
            });
        }
    }
}
