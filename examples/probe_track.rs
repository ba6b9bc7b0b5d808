//! Does the machine-speed probe (`measure::probe`) track the kernels' speed on this machine?
//! Alternates, on one thread: the probe, the register-only FMA peak loop of the calibration,
//! then `inner` forward calls of one f32 case; prints the Pearson correlation of the
//! kernel's GFLOP/s with each yardstick's, per step and over windows of `window` steps, and
//! the kernel's range. README "Comparing runs" quotes its output.
//!
//!   cargo run --release --example probe_track -- flash 256 2 2000 20 50

use std::time::Instant;

use attnbench::backend::cpu::isa::Isa;
use attnbench::backend::cpu::tiles::peak_loop;
use attnbench::backend::cpu::workspace::WarmCalls;
use attnbench::measure::probe::probe_thread;
use attnbench::problem::VariantId;
use attnbench::problem::{Case, DType, InputDist, Inputs, Shape};
use attnbench::run::{forward, pool};
use attnbench::variant::DefaultCase;

fn pearson(x: &[f64], y: &[f64]) -> f64 {
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (a, b) in x.iter().zip(y) {
        sxy += (a - mx) * (b - my);
        sxx += (a - mx) * (a - mx);
        syy += (b - my) * (b - my);
    }
    sxy / (sxx * syy).sqrt()
}

fn windows(x: &[f64], w: usize) -> Vec<f64> {
    x.chunks_exact(w)
        .map(|c| c.iter().sum::<f64>() / w as f64)
        .collect()
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: &str| a.get(i).cloned().unwrap_or_else(|| d.to_string());
    let variant: VariantId = arg(1, "flash").parse().expect("variant");
    let n: usize = arg(2, "256").parse().expect("n");
    let heads: usize = arg(3, "2").parse().expect("heads");
    let steps: usize = arg(4, "2000").parse().expect("steps");
    let inner: usize = arg(5, "20").parse().expect("inner");
    let window: usize = arg(6, "50").parse().expect("window");
    let case = Case::cpu_fwd(variant, Shape::self_attention(heads, n, 64), DType::F32, 1);
    let inputs = Inputs::generate(case.shape, DType::F32, InputDist::Normal, 1.0, 0);
    let mut out = vec![0.0f32; case.shape.out_len()];
    let isa = Isa::detect();
    let (mut kern, mut probe, mut fma) = (Vec::new(), Vec::new(), Vec::new());
    pool(1).expect("pool").install(|| {
        let _warm = WarmCalls::start();
        forward(&case, &inputs, &mut out).expect("forward");
        for _ in 0..steps {
            probe.push(probe_thread());
            let t = Instant::now();
            let (flops, v) = peak_loop(isa, false, 20_000);
            std::hint::black_box(v);
            fma.push(flops / t.elapsed().as_secs_f64() / 1e9);
            let t = Instant::now();
            for _ in 0..inner {
                forward(&case, &inputs, &mut out).expect("forward");
            }
            kern.push(case.flops() * inner as f64 / t.elapsed().as_secs_f64() / 1e9);
        }
    });
    let (kw, pw, fw) = (
        windows(&kern, window),
        windows(&probe, window),
        windows(&fma, window),
    );
    let range = |x: &[f64]| {
        let mut s = x.to_vec();
        s.sort_by(f64::total_cmp);
        (s[0], s[s.len() / 2], s[s.len() - 1])
    };
    println!(
        "{} f32 n={n} h={heads} d=64 t=1 {isa}, {steps} steps of {inner} calls",
        variant.name()
    );
    println!(
        "correlation with the kernel, per step: probe {:.2}, FMA loop {:.2}; over windows of {window}: probe {:.2}, FMA loop {:.2}",
        pearson(&probe, &kern),
        pearson(&fma, &kern),
        pearson(&pw, &kw),
        pearson(&fw, &kw)
    );
    for (name, x) in [("kernel", &kw), ("probe", &pw), ("FMA loop", &fw)] {
        let (lo, mid, hi) = range(x);
        println!("{name} GFLOP/s over windows: min {lo:.1}, median {mid:.1}, max {hi:.1}");
    }
}
