//! The f64 oracle, the only ground truth: O = softmax(QK^T/sqrt(d)) V per query row, in f64,
//! from the same (storage-rounded) inputs the variants see, max subtracted, same causal
//! convention (bottom-right aligned; a row with no visible key is 0), sliding window and
//! attention sinks. Time O(n_kv*d) per row checked: runs of consecutive rows as blocked f64
//! GEMMs (`block`, ndarray), lone rows one by one (`exact_row_of`, the independent check of
//! the blocked form); rows are all rows when that is affordable, else a deterministic sample.

pub mod block;
pub mod grad;

use crate::problem::{BatchSpec, Case, Inputs, SeqLayout, Shape};
use block::RowAt;

/// Check every row when the oracle costs at most this many multiply-adds (counted as
/// 2 n_q n_kv d per head, the mask ignored); above it, sample `error_rows` rows. All rows
/// run as blocked GEMMs (`block`), at about the wall time the row-by-row oracle took for
/// `ROW_ORACLE_MAX_MACS` (docs/methodology.md, "Error").
pub const ALL_ROWS_MAX_MACS: u64 = 1 << 32;

/// The bound for oracles that go row by row (MLA's up-projected rows, the gradient
/// oracle's sampled dQ rows): about a second in f64 on one core.
pub const ROW_ORACLE_MAX_MACS: u64 = 1 << 28;

/// A query row: (batch, head, row).
pub type RowId = (usize, usize, usize);

/// The rows whose error is checked: all of them when cheap, else `sample` rows spread evenly
/// over the flattened (batch, head, row) index, always including the first and the last.
pub fn rows_to_check(shape: &Shape, sample: usize) -> Vec<RowId> {
    rows_to_check_within(shape, sample, ALL_ROWS_MAX_MACS)
}

/// `rows_to_check` with all rows up to `max_macs` multiply-adds.
pub fn rows_to_check_within(shape: &Shape, sample: usize, max_macs: u64) -> Vec<RowId> {
    let total = shape.batch * shape.heads * shape.seq_q;
    let macs = 2 * total as u64 * shape.seq_kv as u64 * shape.head_dim as u64;
    let picks: Vec<usize> = if macs <= max_macs || sample >= total {
        (0..total).collect()
    } else if sample <= 1 {
        vec![total - 1]
    } else {
        let mut v: Vec<usize> = (0..sample)
            .map(|i| i * (total - 1) / (sample - 1))
            .collect();
        v.dedup();
        v
    };
    picks
        .into_iter()
        .map(|i| {
            let (bh, row) = (i / shape.seq_q, i % shape.seq_q);
            (bh / shape.heads, bh % shape.heads, row)
        })
        .collect()
}

/// `rows_to_check` for `case`, with the oracle's cost per row of an MLA case (its keys and
/// values up-projected per token: 2 d_c d_h + d_r multiply-adds a key) in the bound, and the
/// row oracle's bound for it (MLA rows are not blocked).
pub fn rows_to_check_case(case: &Case, sample: usize) -> Vec<RowId> {
    match case.mla {
        Some(m) => {
            let s = &case.shape;
            // The shape whose standard count is the MLA oracle's: d_c d_h + d_r per key.
            let as_std = Shape {
                head_dim: m.latent_dim * s.head_dim + m.rope_dim,
                ..*s
            };
            rows_to_check_within(&as_std, sample, ROW_ORACLE_MAX_MACS)
        }
        None => rows_to_check(&case.shape, sample),
    }
}

/// The exact output row (length `head_dim`) of query row `id`.
pub fn reference_row(inputs: &Inputs, causal: bool, id: RowId) -> Vec<f64> {
    reference_row_masked(inputs, causal, None, id)
}

/// `reference_row` with a sliding window: the row attends to `Shape::key_range`.
pub fn reference_row_masked(
    inputs: &Inputs,
    causal: bool,
    window: Option<usize>,
    id: RowId,
) -> Vec<f64> {
    reference_row_sinks(inputs, causal, (window, 0), id)
}

/// `reference_row_masked` with attention sinks: the row attends to its
/// `Shape::sink_range` and its `Shape::key_range`.
pub fn reference_row_sinks(
    inputs: &Inputs,
    causal: bool,
    (window, sinks): (Option<usize>, usize),
    id: RowId,
) -> Vec<f64> {
    exact_range(
        inputs,
        &[at_dense(&inputs.shape, id)],
        (causal, window, sinks),
    )
}

/// Row `id` = (0, head, packed row) of a ragged batch packed as `[1, heads, total, d]`
/// (`seqs`, from its `BatchSpec`): the row of its own sequence against that sequence's
/// keys only.
pub fn reference_row_ragged(
    inputs: &Inputs,
    seqs: &SeqLayout,
    causal: bool,
    (window, sinks): (Option<usize>, usize),
    id: RowId,
) -> Vec<f64> {
    let at = at_ragged(&inputs.shape, seqs, id);
    exact_range(inputs, &[at], (causal, window, sinks))
}

/// The exact output of the query row at `q_off` against keys `keys` of the head at `kv_off`
/// (scores scaled by 1/sqrt(d)).
pub fn exact_row(
    inputs: &Inputs,
    q_off: usize,
    kv_off: usize,
    keys: std::ops::Range<usize>,
) -> Vec<f64> {
    exact_row_of(inputs, q_off, kv_off, keys)
}

/// `exact_row` over any set of keys (indices of the head's keys, each once).
pub fn exact_row_of(
    inputs: &Inputs,
    q_off: usize,
    kv_off: usize,
    keys: impl Iterator<Item = usize> + Clone,
) -> Vec<f64> {
    let d = inputs.shape.head_dim;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0f64; d];
    if keys.clone().next().is_none() {
        return out;
    }
    let scores: Vec<f64> = keys
        .clone()
        .map(|j| {
            let k_off = kv_off + j * d;
            scale
                * (0..d)
                    .map(|x| inputs.q.get_f64(q_off + x) * inputs.k.get_f64(k_off + x))
                    .sum::<f64>()
        })
        .collect();
    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut sum = 0.0;
    for (j, sc) in keys.zip(&scores) {
        let p = (sc - m).exp();
        sum += p;
        let v_off = kv_off + j * d;
        for (x, o) in out.iter_mut().enumerate() {
            *o += p * inputs.v.get_f64(v_off + x);
        }
    }
    for o in &mut out {
        *o /= sum;
    }
    out
}

/// Multi-head latent attention's exact output row `id` = (b, h, i) in its UNABSORBED form
/// (DeepSeek-V2 Eqs. 9-19): every visible token's key K^h_t = [c_t W_UK^h, k_r,t] and value
/// V^h_t = c_t W_UV^h up-projected from the latent cache, then softmax attention of
/// [q_nope, q_rope] scaled by 1/sqrt(d_h + d_r); causal bottom-right aligned. Costs
/// O(n (2 d_c d_h + d_r)) per row, f64 throughout.
pub fn mla_row(s: &Shape, x: &crate::problem::MlaInputs, causal: bool, id: RowId) -> Vec<f64> {
    let (b, h, i) = id;
    let (dc, dr, dh) = (x.mla.latent_dim, x.mla.rope_dim, s.head_dim);
    let scale = x.mla.scale(dh);
    let keys = s.key_range(causal, None, i);
    let mut out = vec![0.0f64; dh];
    if keys.is_empty() {
        return out;
    }
    let row = (b * s.heads + h) * s.seq_q + i;
    let qn: Vec<f64> = (0..dh).map(|j| x.q_nope.get_f64(row * dh + j)).collect();
    let qr: Vec<f64> = (0..dr).map(|j| x.q_rope.get_f64(row * dr + j)).collect();
    let w = h * dc * dh;
    let (mut kn, mut v) = (vec![0.0f64; dh], vec![0.0f64; dh]);
    let mut scores = Vec::with_capacity(keys.len());
    let mut values = Vec::with_capacity(keys.len() * dh);
    for t in keys {
        let tok = b * s.seq_kv + t;
        kn.fill(0.0);
        v.fill(0.0);
        for c in 0..dc {
            let ct = x.c.get_f64(tok * dc + c);
            for j in 0..dh {
                kn[j] += ct * x.w_uk.get_f64(w + c * dh + j);
                v[j] += ct * x.w_uv.get_f64(w + c * dh + j);
            }
        }
        let nope: f64 = kn.iter().zip(&qn).map(|(a, b)| a * b).sum();
        let rope: f64 = (0..dr)
            .map(|j| qr[j] * x.k_rope.get_f64(tok * dr + j))
            .sum();
        scores.push(scale * (nope + rope));
        values.extend_from_slice(&v);
    }
    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut sum = 0.0;
    for (t, sc) in scores.iter().enumerate() {
        let p = (sc - m).exp();
        sum += p;
        for (o, vv) in out.iter_mut().zip(&values[t * dh..(t + 1) * dh]) {
            *o += p * vv;
        }
    }
    for o in &mut out {
        *o /= sum;
    }
    out
}

/// Error of an output against the oracle over some rows.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ErrorStats {
    /// max |out - exact| (inf when the output has a non-finite value).
    pub max_abs: f64,
    /// `max_abs` divided by the largest |exact| over the same rows (normwise relative error).
    pub max_rel: f64,
    pub rows: usize,
    /// Output elements that are NaN or infinite.
    pub non_finite: usize,
}

/// Compares `out` (`[batch, heads, seq_q, head_dim]`) with the oracle on `rows`, in parallel.
pub fn check(inputs: &Inputs, causal: bool, out: &[f32], rows: &[RowId]) -> ErrorStats {
    check_masked(inputs, causal, None, out, rows)
}

/// `check` with a sliding window.
pub fn check_masked(
    inputs: &Inputs,
    causal: bool,
    window: Option<usize>,
    out: &[f32],
    rows: &[RowId],
) -> ErrorStats {
    check_sinks(inputs, causal, (window, 0), out, rows)
}

/// `check_masked` with attention sinks beside the window.
pub fn check_sinks(
    inputs: &Inputs,
    causal: bool,
    window: (Option<usize>, usize),
    out: &[f32],
    rows: &[RowId],
) -> ErrorStats {
    let ats = rows.iter().map(|&id| at_dense(&inputs.shape, id)).collect();
    check_blocked(inputs, out, rows, (causal, window), ats)
}

/// Where dense row `(b, h, row)` of `s` lives.
fn at_dense(s: &Shape, (b, h, row): RowId) -> RowAt {
    let off = s.q_head_offset(b, h) + row * s.head_dim;
    RowAt {
        out_off: off,
        q_off: off,
        kv_off: s.kv_head_offset(b, h),
        seq: *s,
        i: row,
    }
}

/// Where packed row `(0, h, row)` of a ragged batch lives: row `i` of its own sequence
/// (`seqs`), against that sequence's keys only.
fn at_ragged(s: &Shape, seqs: &SeqLayout, (_, h, row): RowId) -> RowAt {
    let (b, _, i) = seqs.row_of(seqs.q_row(0, h, row));
    RowAt {
        out_off: s.q_head_offset(0, h) + row * s.head_dim,
        q_off: seqs.q_row(b, h, i) * s.head_dim,
        kv_off: seqs.kv_base(b, h / s.group()),
        seq: Shape {
            batch: 1,
            seq_q: seqs.q_len(b),
            seq_kv: seqs.kv_len(b),
            ..*s
        },
        i,
    }
}

/// The case's output against the oracle on `rows`: its mask and window, and for a ragged
/// batch (`Case::batch_spec`) each row against its own sequence.
pub fn check_case(case: &Case, inputs: &Inputs, out: &[f32], rows: &[RowId]) -> ErrorStats {
    if let Some(x) = &inputs.mla {
        if case.mla.is_some() {
            return check_rows(inputs, out, rows, |id| {
                mla_row(&inputs.shape, x, case.causal, id)
            });
        }
    }
    let window = (case.window, case.sinks.unwrap_or(0));
    match &case.batch_spec {
        Some(spec) => check_ragged(inputs, spec, case.causal, window, out, rows),
        None => check_sinks(inputs, case.causal, window, out, rows),
    }
}

/// `check_masked` for a ragged batch packed as `[1, heads, total, d]`: each row against
/// its own sequence.
pub fn check_ragged(
    inputs: &Inputs,
    spec: &BatchSpec,
    causal: bool,
    window: (Option<usize>, usize),
    out: &[f32],
    rows: &[RowId],
) -> ErrorStats {
    // The sequences' offsets once, not per row.
    let seqs = SeqLayout::of(&inputs.shape, Some(spec));
    let ats = rows
        .iter()
        .map(|&id| at_ragged(&inputs.shape, &seqs, id))
        .collect();
    check_blocked(inputs, out, rows, (causal, window), ats)
}

/// `check_rows` with row `rows[k]` placed at `ats[k]`: runs of consecutive rows of one
/// head as blocked GEMMs (`block::blocks`), the other rows by the row oracle.
fn check_blocked(
    inputs: &Inputs,
    out: &[f32],
    rows: &[RowId],
    (causal, (window, sinks)): (bool, (Option<usize>, usize)),
    ats: Vec<RowAt>,
) -> ErrorStats {
    let ranges = block::blocks(&ats, inputs.shape.head_dim, causal, window);
    check_ranges(inputs, out, rows, &ranges, |r| {
        exact_range(inputs, &ats[r], (causal, window, sinks))
    })
}

/// The exact outputs of `ats` (one row, or one of `block::blocks`' blocks), row after row:
/// a block by `block::exact_block`, a lone row by `exact_row_of` on the same keys (the row
/// oracle, `reference_row_sinks` and `reference_row_ragged`, the independent check of the
/// blocked form).
fn exact_range(
    inputs: &Inputs,
    ats: &[RowAt],
    (causal, window, sinks): (bool, Option<usize>, usize),
) -> Vec<f64> {
    let a = &ats[0];
    if ats.len() == 1 {
        let keys = a
            .seq
            .sink_range(causal, window, sinks, a.i)
            .chain(a.seq.key_range(causal, window, a.i));
        exact_row_of(inputs, a.q_off, a.kv_off, keys)
    } else {
        block::exact_block(
            inputs,
            &a.seq,
            (a.q_off, a.kv_off),
            a.i..a.i + ats.len(),
            (causal, window, sinks),
        )
    }
}

fn check_rows(
    inputs: &Inputs,
    out: &[f32],
    rows: &[RowId],
    exact_of: impl Fn(RowId) -> Vec<f64> + Sync,
) -> ErrorStats {
    let ranges: Vec<_> = (0..rows.len()).map(|i| i..i + 1).collect();
    check_ranges(inputs, out, rows, &ranges, |r| exact_of(rows[r.start]))
}

/// Compares `out` with the oracle on `rows`, in parallel over `ranges` (indices into `rows`,
/// each once): `exact_of(range)` is the exact output of those rows, row after row.
fn check_ranges(
    inputs: &Inputs,
    out: &[f32],
    rows: &[RowId],
    ranges: &[std::ops::Range<usize>],
    exact_of: impl Fn(std::ops::Range<usize>) -> Vec<f64> + Sync,
) -> ErrorStats {
    use rayon::prelude::*;
    let s = &inputs.shape;
    let d = s.head_dim;
    let (max_abs, max_ref, non_finite) = ranges
        .par_iter()
        .map(|r| {
            let exact = exact_of(r.clone());
            let mut acc = (0.0f64, 0.0f64, 0usize);
            for (id, exact) in rows[r.clone()].iter().zip(exact.chunks(d)) {
                let off = s.q_head_offset(id.0, id.1) + id.2 * d;
                for (got, want) in out[off..off + d].iter().zip(exact) {
                    let err = if got.is_finite() {
                        (*got as f64 - want).abs()
                    } else {
                        acc.2 += 1;
                        f64::INFINITY
                    };
                    acc.0 = acc.0.max(err);
                    acc.1 = acc.1.max(want.abs());
                }
            }
            acc
        })
        .reduce(
            || (0.0, 0.0, 0),
            |a, b| (a.0.max(b.0), a.1.max(b.1), a.2 + b.2),
        );
    ErrorStats {
        max_abs,
        max_rel: if max_ref > 0.0 {
            max_abs / max_ref
        } else {
            max_abs
        },
        rows: rows.len(),
        non_finite,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{DType, InputDist, Tensor};

    #[test]
    fn one_key_returns_its_value() {
        let shape = Shape {
            batch: 1,
            heads: 1,
            kv_heads: 1,
            seq_q: 2,
            seq_kv: 1,
            head_dim: 2,
        };
        let inputs = Inputs {
            shape,
            q: Tensor::F32(vec![1.0, 2.0, -3.0, 0.5]),
            k: Tensor::F32(vec![0.3, 0.7]),
            v: Tensor::F32(vec![5.0, -6.0]),
            paged: Vec::new(),
            fp8: Vec::new(),
            mla: None,
        };
        assert_eq!(reference_row(&inputs, false, (0, 0, 1)), vec![5.0, -6.0]);
        // Causal with seq_q > seq_kv: row 0 sees no key.
        assert_eq!(reference_row(&inputs, true, (0, 0, 0)), vec![0.0, 0.0]);
    }

    #[test]
    fn equal_scores_average_the_values() {
        let shape = Shape {
            batch: 1,
            heads: 1,
            kv_heads: 1,
            seq_q: 1,
            seq_kv: 2,
            head_dim: 1,
        };
        let inputs = Inputs {
            shape,
            q: Tensor::F32(vec![0.0]),
            k: Tensor::F32(vec![1.0, 2.0]),
            v: Tensor::F32(vec![1.0, 3.0]),
            paged: Vec::new(),
            fp8: Vec::new(),
            mla: None,
        };
        assert_eq!(reference_row(&inputs, false, (0, 0, 0)), vec![2.0]);
    }

    #[test]
    fn sampled_rows_are_deterministic_and_cover_the_ends() {
        let shape = Shape {
            batch: 2,
            heads: 4,
            kv_heads: 4,
            seq_q: 65536,
            seq_kv: 65536,
            head_dim: 64,
        };
        let rows = rows_to_check(&shape, 100);
        assert_eq!(rows.len(), 100);
        assert_eq!(rows[0], (0, 0, 0));
        assert_eq!(*rows.last().unwrap(), (1, 3, 65535));
        assert_eq!(rows, rows_to_check(&shape, 100));
        let small = Shape {
            seq_q: 8,
            seq_kv: 8,
            ..shape
        };
        assert_eq!(rows_to_check(&small, 3).len(), 2 * 4 * 8);
    }

    #[test]
    fn non_finite_outputs_are_counted_as_infinite_error() {
        let shape = Shape {
            batch: 1,
            heads: 1,
            kv_heads: 1,
            seq_q: 1,
            seq_kv: 3,
            head_dim: 2,
        };
        let inputs = Inputs::generate(shape, DType::F32, InputDist::Normal, 1.0, 1);
        let e = check(&inputs, false, &[f32::NAN, 0.0], &rows_to_check(&shape, 10));
        assert_eq!(e.non_finite, 1);
        assert!(e.max_abs.is_infinite());
    }

    /// The exact outputs of `rows` through the check path's blocks (`block::blocks`,
    /// `exact_range`) against the row oracle `row_of`, each row to 1e-12 of its largest
    /// |value| (a row with no visible key: exactly 0); returns how many rows were blocked.
    fn assert_blocked_equals_rows(
        inputs: &Inputs,
        rows: &[RowId],
        ats: Vec<RowAt>,
        mask: (bool, Option<usize>, usize),
        row_of: impl Fn(RowId) -> Vec<f64>,
    ) -> usize {
        let d = inputs.shape.head_dim;
        let ranges = block::blocks(&ats, d, mask.0, mask.1);
        // The ranges cover every row once, in order.
        let flat: Vec<usize> = ranges.iter().flat_map(|r| r.clone()).collect();
        assert_eq!(flat, (0..rows.len()).collect::<Vec<_>>());
        let mut blocked = 0;
        for r in ranges {
            let got = exact_range(inputs, &ats[r.clone()], mask);
            assert_eq!(got.len(), r.len() * d);
            if r.len() > 1 {
                blocked += r.len();
            }
            for (k, g) in r.zip(got.chunks(d)) {
                let want = row_of(rows[k]);
                let big = want.iter().fold(0.0f64, |m, w| m.max(w.abs()));
                for (a, b) in g.iter().zip(&want) {
                    assert!(
                        (a - b).abs() <= 1e-12 * big,
                        "row {:?} mask {mask:?}: {a} vs {b}",
                        rows[k]
                    );
                }
            }
        }
        blocked
    }

    const MASKS: [(bool, Option<usize>, usize); 6] = [
        (false, None, 0),
        (true, None, 0),
        (true, Some(7), 0),
        (true, Some(7), 3),
        (true, Some(40), 5),
        (false, Some(9), 2),
    ];

    /// The blocked oracle equals the row oracle on aligned and unaligned shapes (causal rows
    /// with no key included), causal or not, with windows and sinks, GQA, f32 and bf16
    /// inputs; on all rows and on a sample mixing runs and lone rows.
    #[test]
    fn blocked_oracle_equals_the_row_oracle() {
        for (seq_q, seq_kv) in [(70, 70), (37, 100), (100, 37), (1, 50), (200, 200)] {
            for (heads, kv_heads) in [(4, 4), (6, 2)] {
                for dtype in [DType::F32, DType::Bf16] {
                    let shape = Shape {
                        batch: 2,
                        heads,
                        kv_heads,
                        seq_q,
                        seq_kv,
                        head_dim: 16,
                    };
                    let x = Inputs::generate(shape, dtype, InputDist::Normal, 1.5, 7);
                    let all = rows_to_check(&shape, usize::MAX);
                    let sample: Vec<RowId> = all
                        .iter()
                        .copied()
                        .filter(|r| r.2 < 10 || r.2 % 17 == 0 || (30..33).contains(&r.2))
                        .collect();
                    for mask in MASKS {
                        for rows in [&all, &sample] {
                            let ats = rows.iter().map(|&id| at_dense(&shape, id)).collect();
                            let blocked = assert_blocked_equals_rows(&x, rows, ats, mask, |id| {
                                reference_row_sinks(&x, mask.0, (mask.1, mask.2), id)
                            });
                            // Every run of at least MIN_BLOCK_ROWS rows went through a GEMM.
                            assert_eq!(blocked > 0, seq_q >= block::MIN_BLOCK_ROWS);
                        }
                    }
                }
            }
        }
    }

    /// The same on a ragged batch: blocks never cross a sequence, each row against its own
    /// sequence's keys (`reference_row_ragged`).
    #[test]
    fn blocked_ragged_oracle_equals_the_row_oracle() {
        let spec: BatchSpec = "2xq70+3xq1kv130+q5kv9+q200kv260".parse().unwrap();
        for (heads, kv_heads) in [(4, 4), (6, 2)] {
            for dtype in [DType::F32, DType::Bf16] {
                let dense = Shape {
                    batch: 1,
                    heads,
                    kv_heads,
                    seq_q: 1,
                    seq_kv: 1,
                    head_dim: 16,
                };
                let shape = spec.packed(&dense);
                let x = Inputs::generate(shape, dtype, InputDist::Normal, 1.5, 9);
                let seqs = SeqLayout::of(&shape, Some(&spec));
                let rows = rows_to_check(&shape, usize::MAX);
                for mask in MASKS {
                    let ats = rows
                        .iter()
                        .map(|&id| at_ragged(&shape, &seqs, id))
                        .collect();
                    let blocked = assert_blocked_equals_rows(&x, &rows, ats, mask, |id| {
                        reference_row_ragged(&x, &seqs, mask.0, (mask.1, mask.2), id)
                    });
                    assert!(blocked > 0);
                }
            }
        }
    }

    /// The check path end to end: the row oracle's outputs rounded to f32, checked by the
    /// blocked path, err by at most the rounding; one value off shows in full.
    #[test]
    fn blocked_check_sees_what_the_row_oracle_sees() {
        let shape = Shape {
            batch: 2,
            heads: 6,
            kv_heads: 2,
            seq_q: 90,
            seq_kv: 120,
            head_dim: 16,
        };
        let x = Inputs::generate(shape, DType::Bf16, InputDist::Normal, 1.0, 3);
        let rows = rows_to_check(&shape, usize::MAX);
        for mask in MASKS {
            let mut out = vec![0.0f32; shape.batch * shape.heads * shape.seq_q * 16];
            for &id in &rows {
                let off = shape.q_head_offset(id.0, id.1) + id.2 * 16;
                let want = reference_row_sinks(&x, mask.0, (mask.1, mask.2), id);
                for (o, w) in out[off..off + 16].iter_mut().zip(want) {
                    *o = w as f32;
                }
            }
            let e = check_sinks(&x, mask.0, (mask.1, mask.2), &out, &rows);
            assert!(e.max_abs <= 1e-6, "{mask:?}: {e:?}");
            let off = shape.q_head_offset(1, 4) + 50 * 16 + 3;
            out[off] += 0.5;
            let e = check_sinks(&x, mask.0, (mask.1, mask.2), &out, &rows);
            assert!((e.max_abs - 0.5).abs() < 1e-6, "{mask:?}: {e:?}");
        }
    }

    /// Wall time of the row oracle at `ROW_ORACLE_MAX_MACS` against the blocked oracle at
    /// `ALL_ROWS_MAX_MACS` (the pair that sets the bound; docs/methodology.md). Run with
    /// `--ignored --nocapture`.
    #[test]
    #[ignore]
    fn time_row_oracle_against_blocked() {
        let at = |n: usize| Shape {
            batch: 1,
            heads: 8,
            kv_heads: 8,
            seq_q: n,
            seq_kv: n,
            head_dim: 64,
        };
        let macs = |s: &Shape| 2 * (s.heads * s.seq_q * s.seq_kv * s.head_dim) as u64;
        let (small, large) = (at(512), at(2048));
        assert_eq!(macs(&small), ROW_ORACLE_MAX_MACS);
        assert_eq!(macs(&large), ALL_ROWS_MAX_MACS);
        for dtype in [DType::F32, DType::Bf16] {
            for causal in [false, true] {
                let x = Inputs::generate(small, dtype, InputDist::Normal, 1.0, 1);
                let rows = rows_to_check(&small, usize::MAX);
                let out = vec![0.0f32; rows.len() * 64];
                let t = std::time::Instant::now();
                let e_rows = check_rows(&x, &out, &rows, |id| reference_row(&x, causal, id));
                let t_rows = t.elapsed().as_secs_f64();
                let e_blk = check(&x, causal, &out, &rows);
                assert!((e_rows.max_abs - e_blk.max_abs).abs() <= 1e-12 * e_rows.max_abs);
                let x = Inputs::generate(large, dtype, InputDist::Normal, 1.0, 1);
                let rows = rows_to_check(&large, 1);
                assert_eq!(rows.len(), 8 * 2048);
                let out = vec![0.0f32; rows.len() * 64];
                let t = std::time::Instant::now();
                check(&x, causal, &out, &rows);
                let t_blk = t.elapsed().as_secs_f64();
                println!(
                    "{dtype:?} causal={causal}: row oracle 2^28 MACs {t_rows:.3} s, blocked 2^32 MACs {t_blk:.3} s ({:.2}x)",
                    t_blk / t_rows
                );
            }
        }
    }
}
