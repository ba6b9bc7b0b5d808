//! A transformer layer (GPT block: pre-LN, QKV projection, causal attention, output
//! projection, residual, LN, GELU FFN with n_inner = 4h, residual) in the three memory
//! designs BPT compares (Liu & Abbeel Sec. 3 and Algorithm 1; docs/papers.md, Liu & Abbeel, 2.3):
//! vanilla, memory-efficient and blockwise parallel. Forward 24*b*s*h^2 FLOPs plus
//! attention. Arithmetic is f32; with a bf16 or f16 case the attention operands Q, K, V are
//! stored in that dtype (K and V of every token are BPT's largest buffers) and the
//! parameters and input are rounded to it.

pub mod decoder;
pub mod ops;
pub mod oracle;
pub mod params;
pub mod pipeline;
pub mod plan;
pub mod store;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;

pub use crate::problem::Design;
use crate::problem::{Case, InputDist};

/// The static share of a `layers`-deep model beside the measured layer (docs/papers.md
/// 1.2, "inferred floor"): `problem::model_rest_bytes` of the case.
pub fn static_bytes(case: &Case, layers: usize) -> u64 {
    crate::problem::model_rest_bytes(
        case.hidden(),
        case.tokens_len(),
        layers,
        case.mode == crate::problem::Mode::LayerTrain,
    )
}

/// The case's seeded parameters and layer input x (`[b, s, h]`, distributed like attention
/// inputs), both rounded to the storage dtype's values: the oracle sees the same numbers.
pub fn generate(case: &Case) -> (Vec<f32>, Vec<f32>) {
    let mut p = params::generate(case.hidden(), case.seed);
    let mut x = generate_input(case);
    for v in [&mut p, &mut x] {
        round_to(case.dtype, v);
    }
    (p, x)
}

/// Rounds every value to the nearest value of `dtype`.
pub fn round_to(dtype: crate::problem::DType, v: &mut [f32]) {
    use crate::problem::DType;
    match dtype {
        DType::F32 => {}
        DType::Bf16 => v
            .par_iter_mut()
            .for_each(|x| *x = half::bf16::from_f32(*x).to_f32()),
        DType::F16 => v
            .par_iter_mut()
            .for_each(|x| *x = half::f16::from_f32(*x).to_f32()),
    }
}

fn generate_input(case: &Case) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(case.seed);
    let f = case.input_scale as f32;
    (0..case.tokens_len())
        .map(|_| {
            let x: f32 = match case.input_dist {
                InputDist::Normal => StandardNormal.sample(&mut rng),
                InputDist::Uniform => rng.random::<f32>(),
            };
            x * f
        })
        .collect()
}

/// Error of a layer call against the f64 oracle.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LayerError {
    pub out_max_abs: f64,
    /// `out_max_abs` over the largest |reference| of the checked rows.
    pub out_max_rel: f64,
    /// Tokens whose output was checked.
    pub out_rows: usize,
    /// Gradients: the largest |difference| over dx and every parameter tensor (or, when
    /// `grad_last_rows`, over the dx of the last tokens alone), and the largest per-tensor
    /// ratio of that to the tensor's largest |reference|.
    pub grad: Option<(f64, f64)>,
    /// Tokens whose dx was checked.
    pub grad_rows: usize,
    /// Only the dx of the last `grad_rows` tokens of the first sequence was checked.
    pub grad_last_rows: bool,
    pub non_finite: usize,
}

/// Oracle cost, in multiply-adds, under which every output and gradient is checked.
pub const FULL_CHECK_MAX_MACS: u64 = 1 << 30;

/// Tokens of a block of `spread_rows`.
pub const SPREAD_ROWS: usize = 64;

/// The tokens whose outputs a causal layer above `FULL_CHECK_MAX_MACS` checks: blocks of
/// `SPREAD_ROWS` at the start, the middle and the end of the sequence (errors that grow
/// with the position show), all `n` tokens when they are no more.
pub fn spread_rows(n: usize) -> Vec<std::ops::Range<usize>> {
    let b = SPREAD_ROWS;
    if n <= 3 * b {
        return std::iter::once(0..n).collect();
    }
    let mid = n / 2 - b / 2;
    vec![0..b, mid..mid + b, n - b..n]
}

/// Checks `out` (and, with `grads = (d_out, dx, dp)`, the gradients) against the f64
/// oracle: everything when affordable; otherwise the outputs of `spread_rows` of the first
/// sequence (`oracle::causal_rows`: the keys and values of every earlier token, as
/// blocked f64 GEMMs) and the dx of its last `SPREAD_ROWS` tokens
/// (`oracle::causal_last_rows_dx`, exact from their upstream gradient alone); the parameter
/// gradients, sums over every token, need the whole backward and are not checked then.
pub fn check(
    case: &Case,
    params: &[f32],
    x: &[f32],
    out: &[f32],
    grads: Option<(&[f32], &[f32], &[f32])>,
) -> LayerError {
    let s = &case.shape;
    let (h, n) = (case.hidden(), s.seq_q);
    let macs = |n: usize| (n * n * h + 12 * n * h * h) as u64 * if grads.is_some() { 3 } else { 1 };
    let mut e = LayerError::default();
    let mut ref_max = 0.0f64;
    let fold = |got: &[f32], want: &[f64], max_abs: &mut f64, ref_max: &mut f64, nf: &mut usize| {
        for (g, w) in got.iter().zip(want) {
            if !g.is_finite() {
                *nf += 1;
                continue;
            }
            *max_abs = max_abs.max((*g as f64 - w).abs());
            *ref_max = ref_max.max(w.abs());
        }
    };
    if (s.batch as u64) * macs(n) <= FULL_CHECK_MAX_MACS || !case.causal {
        let seq = n * h;
        let mut dp_ref = vec![0.0f64; params.len()];
        let mut dx_err = (0.0f64, 0.0f64);
        let mut non_finite = 0usize;
        for b in 0..s.batch {
            let xs = &x[b * seq..(b + 1) * seq];
            let dout = grads.map(|(d, _, _)| &d[b * seq..(b + 1) * seq]);
            let ex = oracle::sequence(s.heads, case.causal, params, xs, dout);
            fold(
                &out[b * seq..(b + 1) * seq],
                &ex.out,
                &mut e.out_max_abs,
                &mut ref_max,
                &mut non_finite,
            );
            if let Some((_, dx, _)) = grads {
                fold(
                    &dx[b * seq..(b + 1) * seq],
                    &ex.dx,
                    &mut dx_err.0,
                    &mut dx_err.1,
                    &mut non_finite,
                );
                dp_ref.iter_mut().zip(&ex.dp).for_each(|(a, b)| *a += b);
            }
        }
        e.out_rows = s.batch * n;
        e.grad_rows = e.out_rows;
        if let Some((_, _, dp)) = grads {
            let mut worst = (dx_err.0, dx_err.0 / dx_err.1.max(f64::MIN_POSITIVE));
            for q in params::Param::ALL {
                let r = q.range(h);
                let (mut ma, mut rm) = (0.0, 0.0);
                fold(
                    &dp[r.clone()],
                    &dp_ref[r],
                    &mut ma,
                    &mut rm,
                    &mut non_finite,
                );
                worst.0 = f64::max(worst.0, ma);
                worst.1 = worst.1.max(ma / rm.max(f64::MIN_POSITIVE));
            }
            e.grad = Some(worst);
        }
        e.non_finite = non_finite;
    } else {
        let ranges = spread_rows(n);
        let want = oracle::causal_rows(s.heads, params, &x[..n * h], &ranges);
        let got: Vec<f32> = ranges
            .iter()
            .flat_map(|r| &out[r.start * h..r.end * h])
            .copied()
            .collect();
        let mut nf = 0;
        fold(&got, &want, &mut e.out_max_abs, &mut ref_max, &mut nf);
        e.out_rows = got.len() / h;
        if let Some((d_out, dx, _)) = grads {
            let last = (n - SPREAD_ROWS.min(n)) * h..n * h;
            let want =
                oracle::causal_last_rows_dx(s.heads, params, &x[..n * h], &d_out[last.clone()]);
            let (mut max_abs, mut dx_max) = (0.0, 0.0);
            fold(&dx[last.clone()], &want, &mut max_abs, &mut dx_max, &mut nf);
            e.grad = Some((max_abs, max_abs / f64::max(dx_max, f64::MIN_POSITIVE)));
            e.grad_rows = last.len() / h;
            e.grad_last_rows = true;
        }
        e.non_finite = nf;
    }
    e.out_max_rel = e.out_max_abs / ref_max.max(f64::MIN_POSITIVE);
    e
}

/// Runs a layer call once on the CPU (inside the caller's pool) as `plan` lays it out
/// (`crate::variant::layer_plan`): `out`, and for training also `dx` and `dp`.
#[allow(clippy::too_many_arguments)]
pub fn run_once(
    plan: &plan::Plan,
    isa: crate::backend::cpu::isa::Isa,
    params: &[f32],
    x: &[f32],
    d_out: &[f32],
    out: &mut [f32],
    dx: &mut [f32],
    dp: &mut [f32],
) -> crate::error::Result<()> {
    if plan.train {
        pipeline::train(plan, isa, params, x, d_out, out, dx, dp)
    } else {
        pipeline::forward(plan, isa, params, x, out)
    }
}

/// Fills `v` with NaN: outputs and gradients are poisoned before the checked call, so a value
/// the layer forgets to write shows as an error.
pub fn poison(v: &mut [f32]) {
    v.par_iter_mut().for_each(|x| *x = f32::NAN);
}

#[cfg(test)]
mod tests;
