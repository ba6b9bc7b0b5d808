//! The f64 oracle by blocks of query rows: for a run of consecutive query rows of one head,
//! S = Q_blk K^T over the union of the keys those rows see, scaled by 1/sqrt(d), masked per
//! row to exactly the row oracle's keys (`Shape::sink_range` then `Shape::key_range`),
//! softmax in f64 with the row max subtracted, O = P V (a row with no visible key is 0): the
//! same definition as `exact_row_of`, as two f64 GEMMs (ndarray `dot`, matrixmultiply
//! underneath) instead of per-row dot products. Time O(B n_k d) per block of B rows over
//! n_k keys; extra memory O(B n_k + n_k d) f64 per block in flight.

use std::ops::Range;

use ndarray::Array2;

use crate::problem::{Inputs, Shape};

/// Query rows per block: the GEMMs' M. 64 rows amortize the gather of the block's keys
/// (n_k d values) over 64 rows of work, and keep the causal triangle's waste (a block's
/// first rows see up to B - 1 fewer keys than its last) under B / 2 keys a row.
pub const BLOCK_ROWS: usize = 64;

/// Scores per block at most (B n_k f64, 8 MiB): a block over a long key range takes fewer
/// rows, so a block in flight per thread stays small at any length.
pub const BLOCK_SCORES: usize = 1 << 20;

/// Runs of consecutive rows shorter than this stay on the row oracle: a GEMM of a few rows
/// gains nothing over the row-by-row dot products.
pub const MIN_BLOCK_ROWS: usize = 4;

/// Where one query row lives, for the blocked oracle: its query at `q_off` (O at the same
/// offset in the checked output's layout is `out_off`), the keys of its head from `kv_off`,
/// and row `i` of the sequence `seq` whose mask (`key_range`, `sink_range`) it follows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowAt {
    pub out_off: usize,
    pub q_off: usize,
    pub kv_off: usize,
    pub seq: Shape,
    pub i: usize,
}

impl RowAt {
    /// Whether `next` is the row after `self` in the same sequence and head (its query
    /// stored right after this one), so the two can share a block.
    pub fn followed_by(&self, next: &RowAt, d: usize) -> bool {
        next.i == self.i + 1
            && next.q_off == self.q_off + d
            && next.out_off == self.out_off + d
            && next.kv_off == self.kv_off
            && next.seq == self.seq
    }
}

/// The exact outputs (`rows.len() x head_dim`, row-major) of query rows `rows` of the
/// sequence `seq`, the query of row `rows.start` at `q_off` and the next ones after it, the
/// keys and values of their head from `kv_off`; mask `(causal, window, sinks)`.
pub fn exact_block(
    inputs: &Inputs,
    seq: &Shape,
    (q_off, kv_off): (usize, usize),
    rows: Range<usize>,
    (causal, window, sinks): (bool, Option<usize>, usize),
) -> Vec<f64> {
    let d = inputs.shape.head_dim;
    let nb = rows.len();
    // Each row's keys, exactly the row oracle's: its sinks, then its window.
    let masks: Vec<(Range<usize>, Range<usize>)> = rows
        .clone()
        .map(|i| {
            (
                seq.sink_range(causal, window, sinks, i),
                seq.key_range(causal, window, i),
            )
        })
        .collect();
    // The union of the block's keys: the sinks (always before every row's window, as
    // `sink_range` ends at the window's start) then the span of the non-empty windows.
    let sink_end = masks.iter().map(|m| m.0.end).max().unwrap_or(0);
    let (lo, hi) = masks
        .iter()
        .filter(|m| !m.1.is_empty())
        .fold((usize::MAX, 0), |(lo, hi), m| {
            (lo.min(m.1.start), hi.max(m.1.end))
        });
    let keys: Vec<usize> = (0..sink_end)
        .chain(lo.max(sink_end)..hi.max(sink_end))
        .collect();
    let mut out = vec![0.0f64; nb * d];
    if keys.is_empty() {
        return out;
    }
    let q = Array2::from_shape_fn((nb, d), |(r, x)| inputs.q.get_f64(q_off + r * d + x));
    let k = Array2::from_shape_fn((keys.len(), d), |(j, x)| {
        inputs.k.get_f64(kv_off + keys[j] * d + x)
    });
    let v = Array2::from_shape_fn((keys.len(), d), |(j, x)| {
        inputs.v.get_f64(kv_off + keys[j] * d + x)
    });
    let scale = 1.0 / (d as f64).sqrt();
    let mut p = q.dot(&k.t());
    let mut sums = vec![0.0f64; nb];
    for ((mut prow, (sink, win)), sum) in p.rows_mut().into_iter().zip(&masks).zip(&mut sums) {
        let seen = |j: usize| sink.contains(&j) || win.contains(&j);
        let m = keys
            .iter()
            .zip(prow.iter())
            .filter(|(&j, _)| seen(j))
            .map(|(_, &s)| scale * s)
            .fold(f64::NEG_INFINITY, f64::max);
        for (&j, s) in keys.iter().zip(prow.iter_mut()) {
            *s = if seen(j) { (scale * *s - m).exp() } else { 0.0 };
            *sum += *s;
        }
    }
    let o = p.dot(&v);
    for ((orow, src), &sum) in out.chunks_mut(d).zip(o.rows()).zip(&sums) {
        // A row with no visible key is 0, as in every variant.
        if sum > 0.0 {
            orow.iter_mut()
                .zip(src.iter())
                .for_each(|(a, b)| *a = b / sum);
        }
    }
    out
}

/// The runs of `at` (row positions, in order) that the blocked oracle computes: maximal runs
/// of rows each `followed_by` the next, cut into blocks of at most `BLOCK_ROWS` rows and
/// `BLOCK_SCORES` scores; runs shorter than `MIN_BLOCK_ROWS` are returned as single rows
/// (for the row oracle). Every index of `at` is in exactly one range, in order.
pub fn blocks(at: &[RowAt], d: usize, causal: bool, window: Option<usize>) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < at.len() {
        let mut end = start + 1;
        while end < at.len() && at[end - 1].followed_by(&at[end], d) {
            end += 1;
        }
        if end - start < MIN_BLOCK_ROWS {
            out.extend((start..end).map(|i| i..i + 1));
        } else {
            // The widest key span of a row of this sequence bounds a block's scores.
            let seq = &at[start].seq;
            let last = at[end - 1].i;
            let span = seq.key_range(causal, window, last).end.max(1);
            let rows = (BLOCK_SCORES / span).clamp(MIN_BLOCK_ROWS, BLOCK_ROWS);
            let mut s = start;
            while s < end {
                let e = (s + rows).min(end);
                out.push(s..e);
                s = e;
            }
        }
        start = end;
    }
    out
}
