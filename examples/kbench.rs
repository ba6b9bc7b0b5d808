//! Kernel micro-benchmark for tuning on a shared machine: runs one case's forward (or, with
//! `bwd`, its training step) `reps` times on a given kernel path and prints GFLOP/s by wall
//! time and per CPU-second of the process's threads over all the calls (from
//! /proc/self/task/*/schedstat), which stays meaningful when other processes share the
//! cores. Calls are timed as the runner times them: warm, on a worker of the case's thread
//! pool. In `bwd` mode the wall figures are the backward's own (2.5 forwards' FLOPs, timed
//! inside the step) and the CPU figure is the whole step's (3.5 forwards' FLOPs).
//!
//!   cargo run --release --example kbench -- flash 4096 8 64 f32 0 1 avx512-bf16 5
//!   cargo run --release --example kbench -- flash 4096 8 64 f32 0 1 avx2 5 64 256 bwd

use std::time::Instant;

use attnbench::backend::cpu::isa::Isa;
use attnbench::backend::cpu::workspace::WarmCalls;
use attnbench::problem::{Case, Grads, InputDist, Inputs, Mode};
use attnbench::run::{forward_with, pool, train_step_with};

mod common;

fn cpu_ns() -> u64 {
    let mut total = 0;
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for e in dir.flatten() {
            let p = e.path().join("schedstat");
            if let Ok(s) = std::fs::read_to_string(p) {
                total += s
                    .split_whitespace()
                    .next()
                    .and_then(|x| x.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    total
}

fn main() {
    let base = common::case(["flash", "4096", "8", "64", "f32", "0", "1"]);
    let isa_name = common::arg(8, Isa::detect().name());
    let isa = Isa::ALL
        .into_iter()
        .find(|i| i.name() == isa_name)
        .expect("isa");
    let reps = common::parse::<usize>(9, "5", "reps").max(1);
    let qc: Option<usize> = common::arg(10, "").parse().ok();
    let kc: Option<usize> = common::arg(11, "").parse().ok();
    let bwd = match common::arg(12, "fwd").as_str() {
        "fwd" => false,
        "bwd" => true,
        other => {
            eprintln!("argument 12 (mode): '{other}' is neither fwd nor bwd");
            std::process::exit(2)
        }
    };
    let n = base.shape.seq_kv;
    let case = Case {
        q_chunk: base.q_chunk.map(|c| qc.unwrap_or(c).min(n)),
        kv_chunk: base.kv_chunk.map(|c| kc.unwrap_or(c).min(n)),
        mode: if bwd { Mode::FwdBwd } else { base.mode },
        ..base
    };
    let (variant, dtype, threads) = (case.variant, case.dtype, case.threads);
    let (heads, d, causal) = (case.shape.heads, case.shape.head_dim, case.causal);
    let inputs = Inputs::generate(case.shape, dtype, InputDist::Normal, 1.0, 0);
    let mut out = vec![0.0f32; case.shape.out_len()];
    // As the runner times: the loop on a worker of the case's pool, warm (each call reuses
    // the scratch buffers the previous one freed), after one warm-up call.
    // CPU time over all the calls: the kernel's counter advances at scheduler ticks, so one
    // short call may read 0.
    let (walls, cpu_total) = if bwd {
        train_walls(&case, isa, &inputs, &mut out, reps)
    } else {
        pool(threads).expect("thread pool").install(|| {
            let _warm = WarmCalls::start();
            forward_with(&case, isa, &inputs, &mut out).expect("forward");
            let mut walls = Vec::with_capacity(reps);
            let c0 = cpu_ns();
            for _ in 0..reps {
                let t0 = Instant::now();
                forward_with(&case, isa, &inputs, &mut out).expect("forward");
                walls.push(t0.elapsed().as_secs_f64());
            }
            (walls, (cpu_ns() - c0) as f64 * 1e-9)
        })
    };
    let mut walls = walls;
    walls.sort_by(f64::total_cmp);
    let best_wall = walls[0];
    let median_wall = walls[walls.len() / 2];
    // The backward's FLOPs are the step's less one forward's (3.5 - 1 forwards).
    let gf = if bwd {
        case.flops() * 2.5 / 3.5 / 1e9
    } else {
        case.flops() / 1e9
    };
    let per_cpu = if cpu_total > 0.0 {
        let g = case.flops() / 1e9 * reps as f64 / cpu_total;
        format!(
            "{:.1} GFLOP/cpu-s ({g:.1} per thread-second x {threads})",
            g * threads as f64
        )
    } else {
        "CPU time not readable".to_string()
    };
    println!(
        "{} {}{} n={n} h={heads} d={d} causal={causal} t={threads} {isa}: wall {:.1} GFLOP/s (median {:.1}), {per_cpu}",
        variant.name(),
        dtype,
        if bwd { " bwd" } else { "" },
        gf / best_wall,
        gf / median_wall,
    );
}

/// Walls of `reps` warm backward passes (each timed inside its training step, after one
/// warm-up step) and the CPU seconds of the whole steps.
fn train_walls(
    case: &Case,
    isa: Isa,
    inputs: &Inputs,
    out: &mut [f32],
    reps: usize,
) -> (Vec<f64>, f64) {
    let s = &case.shape;
    let d_out = case.d_out.make(s, case.seed);
    let mut grads = Grads {
        dq: vec![0.0; s.q_len()],
        dk: vec![0.0; s.kv_len()],
        dv: vec![0.0; s.kv_len()],
    };
    // On a worker of the case's pool, so the step's own `install` runs inline there.
    pool(case.threads).expect("thread pool").install(|| {
        let mut step = || train_step_with(case, isa, inputs, &d_out, out, &mut grads);
        let _warm = WarmCalls::start();
        step().expect("training step");
        let c0 = cpu_ns();
        let walls = (0..reps).map(|_| step().expect("training step")).collect();
        (walls, (cpu_ns() - c0) as f64 * 1e-9)
    })
}
