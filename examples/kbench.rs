//! Kernel micro-benchmark for tuning on a shared machine: runs one case's forward `reps`
//! times on a given kernel path and prints GFLOP/s by wall time and per CPU-second of the
//! process's threads (from /proc/self/task/*/schedstat), which stays meaningful when other
//! processes share the cores. Calls are timed as the runner times them: warm, on a worker
//! of the case's thread pool.
//!
//!   cargo run --release --example kbench -- flash 4096 8 64 f32 0 1 avx512-bf16 5

use std::time::Instant;

use attnbench::backend::cpu::isa::Isa;
use attnbench::backend::cpu::workspace::WarmCalls;
use attnbench::problem::{Case, DType, InputDist, Inputs, Shape};
use attnbench::runner::{forward_with, pool};
use attnbench::variant::VariantId;

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
    let a: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: &str| a.get(i).cloned().unwrap_or_else(|| d.to_string());
    let variant: VariantId = arg(1, "flash").parse().expect("variant");
    let n: usize = arg(2, "4096").parse().expect("n");
    let heads: usize = arg(3, "8").parse().expect("heads");
    let d: usize = arg(4, "64").parse().expect("d");
    let dtype: DType = arg(5, "f32").parse().expect("dtype");
    let causal = arg(6, "0") == "1";
    let threads: usize = arg(7, "1").parse().expect("threads");
    let isa_name = arg(8, Isa::detect().name());
    let isa = Isa::ALL
        .into_iter()
        .find(|i| i.name() == isa_name)
        .expect("isa");
    let reps: usize = arg(9, "5").parse::<usize>().expect("reps").max(1);
    let qc: Option<usize> = a.get(10).and_then(|x| x.parse().ok());
    let kc: Option<usize> = a.get(11).and_then(|x| x.parse().ok());
    let base = Case::cpu_fwd(variant, Shape::self_attention(heads, n, d), dtype, threads);
    let case = Case {
        q_chunk: base.q_chunk.map(|c| qc.unwrap_or(c).min(n)),
        kv_chunk: base.kv_chunk.map(|c| kc.unwrap_or(c).min(n)),
        causal,
        ..base
    };
    let inputs = Inputs::generate(case.shape, dtype, InputDist::Normal, 1.0, 0);
    let mut out = vec![0.0f32; case.shape.out_len()];
    // As the runner times: the loop on a worker of the case's pool, warm (each call reuses
    // the scratch buffers the previous one freed), after one warm-up call.
    let (walls, best_cpu) = pool(threads).expect("thread pool").install(|| {
        let _warm = WarmCalls::start();
        forward_with(&case, isa, &inputs, &mut out).expect("forward");
        let mut walls = Vec::with_capacity(reps);
        let mut best_cpu = f64::INFINITY;
        for _ in 0..reps {
            let (c0, t0) = (cpu_ns(), Instant::now());
            forward_with(&case, isa, &inputs, &mut out).expect("forward");
            let wall = t0.elapsed().as_secs_f64();
            let cpu = (cpu_ns() - c0) as f64 * 1e-9;
            walls.push(wall);
            best_cpu = best_cpu.min(cpu);
        }
        (walls, best_cpu)
    });
    let mut walls = walls;
    walls.sort_by(f64::total_cmp);
    let best_wall = walls[0];
    let median_wall = walls[walls.len() / 2];
    let gf = case.flops() / 1e9;
    println!(
        "{} {} n={n} h={heads} d={d} causal={causal} t={threads} {isa}: wall {:.1} GFLOP/s (median {:.1}), {:.1} GFLOP/cpu-s ({:.1} per thread-second x {threads})",
        variant.name(),
        dtype,
        gf / best_wall,
        gf / median_wall,
        gf / best_cpu * threads as f64,
        gf / best_cpu,
    );
}
