//! The f64 gradient oracle: for O = softmax(QK^T/sqrt(d)) V and an upstream gradient dO,
//! dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dO * O)), dQ = dS K / sqrt(d),
//! dK = dS^T Q / sqrt(d), with dK, dV summed over the query heads that share a key/value
//! head (GQA), over each row's keys (`Shape::key_range`: causal bound and sliding window;
//! and `Shape::sink_range`, the attention sinks before the window).
//! Computed in f64 from the same storage-rounded inputs. `grads` is exact over
//! every row, time O(b*h*n_q*n_kv*d); `dq_row` gives one row of dQ in O(n_kv*d).

use crate::problem::Inputs;

/// dQ (`[b, h, n_q, d]`), dK and dV (`[b, kv_heads, n_kv, d]`) in f64.
pub struct Grads64 {
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
}

/// The keys a row attends to: its sinks, then its window.
fn row_keys(inputs: &Inputs, (causal, window, sinks): Mask, i: usize) -> Vec<usize> {
    let s = &inputs.shape;
    s.sink_range(causal, window, sinks, i)
        .chain(s.key_range(causal, window, i))
        .collect()
}

/// The keys a row attends to (`row_keys`), its softmax probabilities over them, and the
/// exact output row.
fn row_probs(
    inputs: &Inputs,
    mask: Mask,
    b: usize,
    h: usize,
    i: usize,
) -> (Vec<usize>, Vec<f64>, Vec<f64>) {
    let s = &inputs.shape;
    let d = s.head_dim;
    let q_off = s.q_head_offset(b, h) + i * d;
    let keys = row_keys(inputs, mask, i);
    let kv_off = s.kv_head_offset(b, h);
    let scale = 1.0 / (d as f64).sqrt();
    let scores: Vec<f64> = keys
        .iter()
        .map(|&j| {
            scale
                * (0..d)
                    .map(|x| inputs.q.get_f64(q_off + x) * inputs.k.get_f64(kv_off + j * d + x))
                    .sum::<f64>()
        })
        .collect();
    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut p: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
    let sum: f64 = p.iter().sum();
    p.iter_mut().for_each(|x| *x /= sum);
    let mut o = vec![0.0; d];
    for (&j, pj) in keys.iter().zip(&p) {
        for (x, ox) in o.iter_mut().enumerate() {
            *ox += pj * inputs.v.get_f64(kv_off + j * d + x);
        }
    }
    (keys, p, o)
}

/// The causal flag, sliding window and attention sinks of the attention differentiated.
pub type Mask = (bool, Option<usize>, usize);

/// dS of one query row: P * (dO V^T - rowsum(dO * O)).
#[allow(clippy::too_many_arguments)]
fn row_ds(
    inputs: &Inputs,
    keys: &[usize],
    p: &[f64],
    o: &[f64],
    d_out: &[f32],
    b: usize,
    h: usize,
    i: usize,
) -> Vec<f64> {
    let s = &inputs.shape;
    let d = s.head_dim;
    let kv_off = s.kv_head_offset(b, h);
    let go = &d_out[s.q_head_offset(b, h) + i * d..][..d];
    let dd: f64 = go.iter().zip(o).map(|(g, x)| *g as f64 * x).sum();
    p.iter()
        .zip(keys)
        .map(|(pj, &j)| {
            let dp: f64 = (0..d)
                .map(|x| go[x] as f64 * inputs.v.get_f64(kv_off + j * d + x))
                .sum();
            pj * (dp - dd)
        })
        .collect()
}

/// One row of dQ, exact. Rows that see no key have a zero gradient.
pub fn dq_row(inputs: &Inputs, mask: Mask, d_out: &[f32], id: (usize, usize, usize)) -> Vec<f64> {
    let (b, h, i) = id;
    let s = &inputs.shape;
    let d = s.head_dim;
    let mut dq = vec![0.0; d];
    if row_keys(inputs, mask, i).is_empty() {
        return dq;
    }
    let (keys, p, o) = row_probs(inputs, mask, b, h, i);
    let ds = row_ds(inputs, &keys, &p, &o, d_out, b, h, i);
    let kv_off = s.kv_head_offset(b, h);
    let scale = 1.0 / (d as f64).sqrt();
    for (&j, dsj) in keys.iter().zip(&ds) {
        for (x, g) in dq.iter_mut().enumerate() {
            *g += scale * dsj * inputs.k.get_f64(kv_off + j * d + x);
        }
    }
    dq
}

/// All three gradients, exact, over every row (rows in parallel, dK/dV summed per head).
pub fn grads(inputs: &Inputs, mask: Mask, d_out: &[f32]) -> Grads64 {
    use rayon::prelude::*;
    let s = inputs.shape;
    let d = s.head_dim;
    let scale = 1.0 / (d as f64).sqrt();
    let mut dq = vec![0.0; s.q_len()];
    let mut dk = vec![0.0; s.kv_len()];
    let mut dv = vec![0.0; s.kv_len()];
    // Per query head: its dQ rows and its contribution to dK, dV of its key/value head.
    let per_head: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> = (0..s.batch * s.heads)
        .into_par_iter()
        .map(|bh| {
            let (b, h) = (bh / s.heads, bh % s.heads);
            let kv_off = s.kv_head_offset(b, h);
            let q_off = s.q_head_offset(b, h);
            let mut dq_h = vec![0.0; s.seq_q * d];
            let mut dk_h = vec![0.0; s.seq_kv * d];
            let mut dv_h = vec![0.0; s.seq_kv * d];
            for i in 0..s.seq_q {
                let (keys, p, o) = row_probs(inputs, mask, b, h, i);
                if keys.is_empty() {
                    continue;
                }
                let ds = row_ds(inputs, &keys, &p, &o, d_out, b, h, i);
                let go = &d_out[q_off + i * d..][..d];
                for (&j, (pj, dsj)) in keys.iter().zip(p.iter().zip(&ds)) {
                    for x in 0..d {
                        dv_h[j * d + x] += pj * go[x] as f64;
                        dk_h[j * d + x] += scale * dsj * inputs.q.get_f64(q_off + i * d + x);
                        dq_h[i * d + x] += scale * dsj * inputs.k.get_f64(kv_off + j * d + x);
                    }
                }
            }
            (dq_h, dk_h, dv_h)
        })
        .collect();
    for (bh, (dq_h, dk_h, dv_h)) in per_head.into_iter().enumerate() {
        let (b, h) = (bh / s.heads, bh % s.heads);
        let q_off = s.q_head_offset(b, h);
        let kv_off = s.kv_head_offset(b, h);
        dq[q_off..q_off + dq_h.len()].copy_from_slice(&dq_h);
        for (t, x) in dk[kv_off..kv_off + dk_h.len()].iter_mut().zip(&dk_h) {
            *t += x;
        }
        for (t, x) in dv[kv_off..kv_off + dv_h.len()].iter_mut().zip(&dv_h) {
            *t += x;
        }
    }
    Grads64 { dq, dk, dv }
}

/// Check all three gradients exactly when the full f64 oracle costs at most this many
/// multiply-adds (about 10 s on 2 cores); above it only sampled rows of dQ are checked
/// (dK and dV need every query row, so they cannot be sampled cheaply).
pub const ALL_GRADS_MAX_MACS: u64 = 1 << 31;

/// Error of gradients against the oracle.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GradErrorStats {
    /// max |g - exact| over the gradients checked (inf if any is non-finite).
    pub max_abs: f64,
    /// `max_abs` / the largest |exact| entry over the same gradients (normwise).
    pub max_rel: f64,
    /// Query rows of dQ checked.
    pub rows: usize,
    /// Whether dK and dV (all rows) were checked too.
    pub full: bool,
    pub non_finite: usize,
}

impl GradErrorStats {
    /// What was checked, for the CSV: "dq,dk,dv" or "dq".
    pub fn scope(&self) -> &'static str {
        if self.full {
            "dq,dk,dv"
        } else {
            "dq"
        }
    }
}

fn fold(acc: &mut (f64, f64, usize), got: f32, want: f64) {
    if got.is_finite() {
        acc.0 = acc.0.max((got as f64 - want).abs());
    } else {
        acc.0 = f64::INFINITY;
        acc.2 += 1;
    }
    acc.1 = acc.1.max(want.abs());
}

/// Compares `grads` with the oracle: everything when affordable, else `sample` dQ rows.
pub fn check(
    inputs: &Inputs,
    mask: Mask,
    d_out: &[f32],
    got: &crate::problem::Grads,
    sample: usize,
) -> GradErrorStats {
    use rayon::prelude::*;
    let s = &inputs.shape;
    let macs = 6 * (s.batch * s.heads * s.seq_q) as u64 * s.seq_kv as u64 * s.head_dim as u64;
    let mut acc = (0.0f64, 0.0f64, 0usize);
    if macs <= ALL_GRADS_MAX_MACS {
        let exact = grads(inputs, mask, d_out);
        for (g_t, w_t) in [
            (&got.dq, &exact.dq),
            (&got.dk, &exact.dk),
            (&got.dv, &exact.dv),
        ] {
            for (g, w) in g_t.iter().zip(w_t.iter()) {
                fold(&mut acc, *g, *w);
            }
        }
        return stats(acc, s.batch * s.heads * s.seq_q, true);
    }
    let rows = super::rows_to_check_within(s, sample, super::ROW_ORACLE_MAX_MACS);
    let d = s.head_dim;
    let exact: Vec<Vec<f64>> = rows
        .par_iter()
        .map(|&id| dq_row(inputs, mask, d_out, id))
        .collect();
    for (&(b, h, i), want) in rows.iter().zip(&exact) {
        let off = s.q_head_offset(b, h) + i * d;
        for (g, w) in got.dq[off..off + d].iter().zip(want) {
            fold(&mut acc, *g, *w);
        }
    }
    stats(acc, rows.len(), false)
}

fn stats(
    (max_abs, max_ref, non_finite): (f64, f64, usize),
    rows: usize,
    full: bool,
) -> GradErrorStats {
    GradErrorStats {
        max_abs,
        max_rel: if max_ref > 0.0 {
            max_abs / max_ref
        } else {
            max_abs
        },
        rows,
        full,
        non_finite,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{DType, InputDist, Shape, Tensor};
    use crate::reference::reference_row_sinks;

    /// L = sum(O * dO) in f64, the scalar whose gradient the oracle computes.
    fn loss(inputs: &Inputs, (causal, window, sinks): Mask, d_out: &[f32]) -> f64 {
        let s = &inputs.shape;
        let d = s.head_dim;
        let mut l = 0.0;
        for b in 0..s.batch {
            for h in 0..s.heads {
                for i in 0..s.seq_q {
                    let o = reference_row_sinks(inputs, causal, (window, sinks), (b, h, i));
                    let off = s.q_head_offset(b, h) + i * d;
                    l += o
                        .iter()
                        .zip(&d_out[off..off + d])
                        .map(|(a, g)| a * *g as f64)
                        .sum::<f64>();
                }
            }
        }
        l
    }

    fn with(t: &Tensor, i: usize, delta: f64) -> Tensor {
        let Tensor::F32(v) = t else {
            unreachable!("f32 fixtures")
        };
        let mut v = v.clone();
        v[i] += delta as f32;
        Tensor::F32(v)
    }

    /// Central differences of the f64 loss match the oracle's gradients (f32 inputs moved by
    /// a representable step, so the perturbation is exact), with and without a mask, a
    /// sliding window and attention sinks.
    #[test]
    fn oracle_matches_finite_differences() {
        for mask in [
            (false, None, 0),
            (true, None, 0),
            (false, Some(2), 0),
            (true, Some(2), 0),
            (false, Some(2), 1),
            (true, Some(1), 2),
        ] {
            let shape = Shape {
                batch: 1,
                heads: 2,
                kv_heads: 1,
                seq_q: 3,
                seq_kv: 4,
                head_dim: 3,
            };
            let inputs = Inputs::generate(shape, DType::F32, InputDist::Normal, 1.0, 5);
            let d_out: Vec<f32> = (0..shape.q_len())
                .map(|i| ((i * 7 % 5) as f32 - 2.0) * 0.3)
                .collect();
            let g = grads(&inputs, mask, &d_out);
            let eps = 1.0 / 1024.0;
            let fd = |which: usize, i: usize| {
                let mut plus = inputs.clone();
                let mut minus = inputs.clone();
                match which {
                    0 => (plus.q, minus.q) = (with(&inputs.q, i, eps), with(&inputs.q, i, -eps)),
                    1 => (plus.k, minus.k) = (with(&inputs.k, i, eps), with(&inputs.k, i, -eps)),
                    _ => (plus.v, minus.v) = (with(&inputs.v, i, eps), with(&inputs.v, i, -eps)),
                }
                (loss(&plus, mask, &d_out) - loss(&minus, mask, &d_out)) / (2.0 * eps)
            };
            for (which, exact) in [(0, &g.dq), (1, &g.dk), (2, &g.dv)] {
                for (i, e) in exact.iter().enumerate() {
                    let f = fd(which, i);
                    assert!(
                        (f - e).abs() < 1e-5,
                        "tensor {which} elem {i}: fd {f} vs oracle {e}"
                    );
                }
            }
            for i in 0..shape.seq_q {
                for h in 0..2 {
                    let row = dq_row(&inputs, mask, &d_out, (0, h, i));
                    let off = shape.q_head_offset(0, h) + i * 3;
                    assert_eq!(row, g.dq[off..off + 3].to_vec());
                }
            }
        }
    }
}
