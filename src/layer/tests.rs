//! The three designs against the f64 oracle and against each other, on ragged shapes.

use super::*;
use crate::backend::cpu::isa::Isa;
use crate::problem::VariantId;
use crate::problem::{DType, Device, Mode, Shape, UpstreamGrad};

const DESIGNS: [VariantId; 3] = [
    VariantId::LayerVanilla,
    VariantId::LayerMemEff,
    VariantId::LayerBpt,
];

fn case(v: VariantId, mode: Mode, dims: Dims4, causal: bool, q_chunk: usize) -> Case {
    case_in(DType::F32, v, mode, dims, causal, q_chunk)
}

fn case_in(
    dtype: DType,
    v: VariantId,
    mode: Mode,
    (b, s, a, d): Dims4,
    causal: bool,
    q_chunk: usize,
) -> Case {
    Case {
        variant: v,
        mode,
        device: Device::Cpu,
        dtype,
        shape: Shape {
            batch: b,
            heads: a,
            kv_heads: a,
            seq_q: s,
            seq_kv: s,
            head_dim: d,
        },
        q_chunk: (v == VariantId::LayerBpt).then_some(q_chunk),
        kv_chunk: Some(16),
        causal,
        window: None,
        devices: 1,
        splits: None,
        allreduce: None,
        threads: 2,
        input_dist: InputDist::Normal,
        input_scale: 1.0,
        seed: 7,
        d_out: UpstreamGrad::Random,
        external: None,
        paging: None,
        prefill_chunk: None,
        batch_spec: None,
        kernel_path: None,
        prefix_len: None,
        kv_dtype: None,
        mla: None,
        sinks: None,
        precision: None,
    }
}

struct Run {
    out: Vec<f32>,
    dx: Vec<f32>,
    dp: Vec<f32>,
}

fn run(c: &Case) -> (Run, Vec<f32>, Vec<f32>, Vec<f32>) {
    let (params, x) = generate(c);
    let d_out = c.d_out.make(&c.shape, c.seed);
    let n = c.tokens_len();
    let train = c.mode == Mode::LayerTrain;
    let mut r = Run {
        out: vec![f32::NAN; n],
        dx: vec![f32::NAN; if train { n } else { 0 }],
        dp: vec![f32::NAN; if train { params.len() } else { 0 }],
    };
    let pool = crate::run::pool(c.threads).unwrap();
    pool.install(|| {
        run_once(
            &crate::variant::layer_plan(c).unwrap(),
            Isa::detect(),
            &params,
            &x,
            &d_out,
            &mut r.out,
            &mut r.dx,
            &mut r.dp,
        )
    })
    .unwrap();
    (r, params, x, d_out)
}

/// max |a - b| / max |b|.
fn rel(a: &[f32], b: &[f32]) -> f64 {
    let m = b.iter().fold(0.0f64, |m, v| m.max(v.abs() as f64));
    let d = a
        .iter()
        .zip(b)
        .fold(0.0f64, |m, (x, y)| m.max((*x as f64 - *y as f64).abs()));
    d / m.max(f64::MIN_POSITIVE)
}

/// (b, s, a, d)
type Dims4 = (usize, usize, usize, usize);

const SHAPES: [(Dims4, bool, usize); 4] = [
    // (b, s, a, d), causal, BPT query block (not dividing s, or larger than s)
    ((1, 70, 2, 16), true, 24),
    ((2, 45, 4, 8), true, 16),
    ((2, 33, 2, 16), false, 10),
    ((1, 20, 1, 32), true, 64),
];

#[test]
fn every_design_matches_the_oracle_forward_and_training() {
    for (dims, causal, qc) in SHAPES {
        for v in DESIGNS {
            for mode in [Mode::LayerFwd, Mode::LayerTrain] {
                let c = case(v, mode, dims, causal, qc);
                let (r, params, x, d_out) = run(&c);
                let grads =
                    (mode == Mode::LayerTrain).then_some((&d_out[..], &r.dx[..], &r.dp[..]));
                let e = check(&c, &params, &x, &r.out, grads);
                let what = format!("{v} {mode} {dims:?} causal {causal} q_chunk {qc}");
                assert_eq!(e.non_finite, 0, "{what}");
                assert_eq!(e.out_rows, dims.0 * dims.1, "{what}: not fully checked");
                assert!(
                    e.out_max_rel <= 1e-5,
                    "{what}: output rel err {:e}",
                    e.out_max_rel
                );
                if mode == Mode::LayerTrain {
                    let (abs, r) = e.grad.expect("gradients checked");
                    assert!(r <= 1e-5, "{what}: gradient rel err {r:e} (abs {abs:e})");
                }
            }
        }
    }
}

/// A causal training step too large for the full oracle: the outputs of `spread_rows` and
/// the dx of the last `SPREAD_ROWS` tokens are checked, exactly, and a wrong dx there shows.
#[test]
fn a_large_causal_training_step_checks_the_last_tokens_dx() {
    let c = case(
        VariantId::LayerBpt,
        Mode::LayerTrain,
        (1, 4096, 2, 16),
        true,
        256,
    );
    let (mut r, params, x, d_out) = run(&c);
    let e = check(&c, &params, &x, &r.out, Some((&d_out, &r.dx, &r.dp)));
    assert_eq!((e.out_rows, e.grad_rows), (3 * SPREAD_ROWS, SPREAD_ROWS));
    assert!(
        e.grad_last_rows,
        "the full oracle ran: make the case larger"
    );
    let (_, rel) = e.grad.expect("the last tokens' dx checked");
    assert!(rel <= 1e-5, "gradient rel err {rel:e}");
    let n = r.dx.len();
    r.dx[n - 5] *= 1.01;
    let e = check(&c, &params, &x, &r.out, Some((&d_out, &r.dx, &r.dp)));
    let (_, bad) = e.grad.unwrap();
    assert!(
        bad > 10.0 * rel.max(1e-7),
        "a 1% error in dx: {bad:e} against {rel:e}"
    );
}

/// bf16 and f16 storage of Q, K and V: outputs within the dtype's tolerance, gradients
/// within twice it (the backward reads the rounded operands as well).
#[test]
fn half_precision_storage_stays_within_the_dtype_tolerance() {
    for dtype in [DType::Bf16, DType::F16] {
        for (dims, causal, qc) in SHAPES {
            for v in DESIGNS {
                let c = case_in(dtype, v, Mode::LayerTrain, dims, causal, qc);
                let (r, params, x, d_out) = run(&c);
                let e = check(&c, &params, &x, &r.out, Some((&d_out, &r.dx, &r.dp)));
                let what = format!("{v} {dtype} {dims:?} causal {causal}");
                let tol = dtype.tolerance();
                assert!(
                    e.out_max_rel <= tol,
                    "{what}: output rel err {:e}",
                    e.out_max_rel
                );
                let (_, g) = e.grad.expect("gradients checked");
                assert!(g <= 2.0 * tol, "{what}: gradient rel err {g:e}");
                // Not a disguised f32 run: rounding Q, K, V shows in the error.
                assert!(
                    e.out_max_rel > 1e-6,
                    "{what}: error {:e} looks like f32",
                    e.out_max_rel
                );
            }
        }
    }
}

/// The acceptance's cross-check: the three designs give the same output, dx and parameter
/// gradient within 1e-5 relative.
#[test]
fn the_three_designs_agree() {
    for (dims, causal, qc) in SHAPES {
        let runs: Vec<Run> = DESIGNS
            .iter()
            .map(|v| run(&case(*v, Mode::LayerTrain, dims, causal, qc)).0)
            .collect();
        for (i, r) in runs.iter().enumerate().skip(1) {
            let what = format!("{} vs {} {dims:?}", DESIGNS[i], DESIGNS[0]);
            assert!(rel(&r.out, &runs[0].out) <= 1e-5, "{what}: out");
            assert!(rel(&r.dx, &runs[0].dx) <= 1e-5, "{what}: dx");
            for q in params::Param::ALL {
                let rg = q.range(dims.2 * dims.3);
                let e = rel(&r.dp[rg.clone()], &runs[0].dp[rg]);
                assert!(e <= 1e-5, "{what}: {} rel {e:e}", q.name());
            }
        }
    }
}

/// BPT's buffers hold full-sequence K, V (and their gradients) but only block-sized
/// activations; memory-efficient's FFN activations are full-sequence. The planned bytes
/// grow linearly in s for both and quadratically for vanilla.
#[test]
fn planned_activation_bytes_scale_as_the_designs_promise() {
    let isa = Isa::detect();
    let bytes = |v: VariantId, s: usize| {
        let c = case(v, Mode::LayerTrain, (1, s, 4, 64), true, 256);
        crate::variant::layer_plan(&c).unwrap().predict_bytes(isa) as f64
    };
    // Growth from s to 2s against growth from 2s to 4s: 2 for an affine function of s,
    // towards 4 for a quadratic one.
    let growth = |v: VariantId| {
        let (a, b, c) = (bytes(v, 2048), bytes(v, 4096), bytes(v, 8192));
        (c - b) / (b - a)
    };
    for v in [VariantId::LayerMemEff, VariantId::LayerBpt] {
        let g = growth(v);
        assert!((g - 2.0).abs() < 0.05, "{v}: growth ratio {g}, not linear");
    }
    let g = growth(VariantId::LayerVanilla);
    assert!(g > 3.0, "vanilla: growth ratio {g}, not quadratic");
    let (m, p) = (
        bytes(VariantId::LayerMemEff, 8192),
        bytes(VariantId::LayerBpt, 8192),
    );
    assert!(m / p >= 2.0, "memeff {m} vs bpt {p}: less than 2x apart");
}
