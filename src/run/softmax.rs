//! The measurements of the blog's softmax claims (Transformers Inference Optimization
//! Toolset, "Online softmax" and kernel fusion; docs/papers.md): exact load/store counts of
//! naive, safe and online softmax at each timed length, the counted traffic of the unfused
//! and fused L×L softmax, naive's overflow at x = 89 in f32 and bf16 against safe and online,
//! and the three timed interleaved on one uniform [0, 1) f32 vector of 1M and 64M elements
//! (1M and 4M when quick). Cost: a counted call and the timed rounds per length (each
//! algorithm at least `min_time_s`), two vectors of the largest length (input, output).

use std::sync::atomic::AtomicBool;

use half::bf16;

use crate::backend::cpu::softmax_passes::{
    fused_rows, softmax_f64, unfused_rows, uniform, Algorithm, Counter, Plain,
};
use crate::error::{Error, Result};
use crate::measure::softmax_timing::{time_interleaved, Rounds};
use crate::results::softmax::{SoftmaxRow, MATRIX, OVERFLOW, VECTOR};

/// The blog's vector length (1,000,000 uniform [0, 1) f32) and the large one of
/// REPRODUCTION.md 1.4.
pub const LENGTHS: [usize; 2] = [1_000_000, 64_000_000];
pub const QUICK_LENGTHS: [usize; 2] = [1_000_000, 4_000_000];

/// The timed lengths of a run, quick or not.
pub fn lengths(quick: bool) -> [usize; 2] {
    if quick {
        QUICK_LENGTHS
    } else {
        LENGTHS
    }
}
/// L of the counted L×L softmax.
pub const MATRIX_SIDES: [usize; 3] = [1, 7, 64];
/// The overflow inputs: one element at x_max, the rest `OVERFLOW_BASE` + uniform [0, 1);
/// exp(88) < f32::MAX < exp(89). The base keeps every output a normal f32 (about e^-17 of
/// the largest), so the relative error of each is meaningful, and the sum of the naive
/// exps finite at 88 (4095 · e^71 ≪ f32::MAX).
pub const OVERFLOW_AT: [f32; 2] = [88.0, 89.0];
pub const OVERFLOW_LEN: usize = 4096;
pub const OVERFLOW_BASE: f32 = 70.0;
pub const SEED: u64 = 42;

/// Counted traffic of the unfused and fused softmax of one L×L matrix.
fn matrix_rows(l: usize) -> Vec<SoftmaxRow> {
    let s = uniform(l * l, SEED);
    let (mut e, mut sums, mut p) = (vec![0.0; l * l], vec![0.0; l], vec![0.0; l * l]);
    let mut unfused = Counter::default();
    unfused_rows(&mut unfused, l, &s, &mut e, &mut sums, &mut p);
    let (mut row, mut out) = (vec![0.0; l], vec![0.0; l]);
    let mut fused = Counter::default();
    fused_rows(&mut fused, l, &s, &mut row, &mut out, &mut p);
    [("unfused", unfused), ("fused", fused)]
        .into_iter()
        .map(|(name, c)| {
            let mut r = SoftmaxRow::counted(MATRIX, name, "f32", l, (l * l) as u64);
            r.loads = c.loads;
            r.stores = c.stores;
            r
        })
        .collect()
}

/// Each algorithm on uniform inputs with one element at each `OVERFLOW_AT`, the inputs as
/// f32 and rounded to bf16 (computed in f32: bf16 has f32's exponent range, so an exp that
/// overflows f32 overflows bf16 too).
fn overflow_rows() -> Vec<SoftmaxRow> {
    let mut rows = Vec::new();
    for dtype in ["f32", "bf16"] {
        for &big in &OVERFLOW_AT {
            let mut x: Vec<f32> = uniform(OVERFLOW_LEN, SEED)
                .iter()
                .map(|u| OVERFLOW_BASE + u)
                .collect();
            x[OVERFLOW_LEN / 3] = big;
            if dtype == "bf16" {
                x.iter_mut().for_each(|v| *v = bf16::from_f32(*v).to_f32());
            }
            let want = softmax_f64(&x);
            let mut y = vec![0.0f32; x.len()];
            for alg in Algorithm::ALL {
                alg.run(&mut Plain, &x, &mut y);
                let finite = y.iter().all(|v| v.is_finite());
                let mut r = SoftmaxRow::counted(
                    OVERFLOW,
                    alg.name(),
                    dtype,
                    OVERFLOW_LEN,
                    OVERFLOW_LEN as u64,
                );
                r.x_max = Some(f64::from(big));
                r.finite = Some(finite);
                r.max_rel_err = finite.then(|| {
                    y.iter()
                        .zip(&want)
                        .map(|(&g, &w)| (f64::from(g) - w).abs() / w)
                        .fold(0.0, f64::max)
                });
                rows.push(r);
            }
        }
    }
    rows
}

/// Every row of `softmax.csv` (see the module doc); progress on stderr.
pub fn measure(quick: bool, interrupted: &AtomicBool) -> Result<Vec<SoftmaxRow>> {
    let mut rows = Vec::new();
    for &l in &MATRIX_SIDES {
        rows.extend(matrix_rows(l));
    }
    rows.extend(overflow_rows());
    let min_time_s = if quick { 0.2 } else { 0.5 };
    for n in lengths(quick) {
        eprintln!("softmax: n = {n}: counting, then naive, safe, online interleaved");
        let x = uniform(n, SEED);
        let mut y = vec![0.0f32; n];
        let rounds = Rounds {
            min_time_s,
            min_rounds: 10,
            max_rounds: 100_000,
            seed: SEED,
        };
        let timed = time_interleaved(&x, &rounds, interrupted)
            .ok_or_else(|| Error::Runtime("softmax: no timed calls".into()))?;
        for t in timed {
            let alg = t.algorithm;
            let mut c = Counter::default();
            alg.run(&mut c, &x, &mut y);
            let mut r = SoftmaxRow::counted(VECTOR, alg.name(), "f32", n, n as u64);
            r.loads = c.loads;
            r.stores = c.stores;
            r.median_s = Some(t.summary.median);
            r.calls = Some(t.samples.len());
            r.gb_per_s = Some((c.loads + c.stores) as f64 * 4.0 / t.summary.median / 1e9);
            eprintln!(
                "softmax: n = {n} {:>6}: median {:.3} ms over {} calls",
                alg.name(),
                t.summary.median * 1e3,
                t.samples.len()
            );
            rows.push(r);
        }
    }
    Ok(rows)
}
