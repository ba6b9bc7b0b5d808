//! Tunes `cache::pass_rows` on a shared machine: times one case's forward (naive or
//! rabe-staats) with several rows-per-pass counts in alternation, one call each per round,
//! and prints each count's median GFLOP/s and its median ratio to the first count's call of
//! the same round (a slow stretch of the host falls on every count alike). `rule` stands for
//! the count `cache::pass_rows` picks on this machine.
//!
//!   cargo run --release --example pass_rows -- naive 4096 2 64 f32 0 1 30 64,rule,16

use std::time::Instant;

use attnbench::backend::cpu::cache;
use attnbench::backend::cpu::isa::Isa;
use attnbench::backend::cpu::tiles::ReadPath;
use attnbench::backend::cpu::workspace::WarmCalls;
use attnbench::problem::{InputDist, Inputs};
use attnbench::run::{forward_with, pool};

mod common;

fn main() {
    let case = common::case(["naive", "4096", "2", "64", "f32", "0", "1"]);
    let rounds = common::parse::<usize>(8, "20", "rounds").max(1);
    let (variant, dtype, threads) = (case.variant, case.dtype, case.threads);
    let (n, heads, d, causal) = (
        case.shape.seq_kv,
        case.shape.heads,
        case.shape.head_dim,
        case.causal,
    );
    let keys = match case.kv_chunk {
        Some(kc) => kc.min(n),
        None => n,
    };
    // K and V as the kernels hold them (bf16 pairs where they multiply pairs).
    let path = ReadPath::of(dtype, Isa::detect(), d);
    let rule = cache::pass_rows(keys, path.kv_bytes(d, path.bf16_pv(d, false)));
    let counts: Vec<usize> = common::arg(9, "64,rule")
        .split(',')
        .map(|x| match x {
            "rule" => rule,
            x => x.parse().expect("rows per pass"),
        })
        .collect();
    println!(
        "L2 {} KiB, L3 {} MiB{}; the rule's rows per pass over {keys} keys at d = {d}: {rule}",
        cache::l2_bytes() >> 10,
        cache::l3_bytes() >> 20,
        if cache::sizes_known() {
            ""
        } else {
            " (assumed)"
        }
    );
    let isa = Isa::detect();
    let inputs = Inputs::generate(case.shape, dtype, InputDist::Normal, 1.0, 0);
    let mut out = vec![0.0f32; case.shape.out_len()];
    let gf = case.flops() / 1e9;
    // As the runner times: on a worker of the case's pool, warm, after a warm-up call each.
    let gflops = pool(threads).expect("thread pool").install(|| {
        let _warm = WarmCalls::start();
        let mut call = |rows: usize| {
            let t0 = Instant::now();
            cache::with_pass_rows(rows, || forward_with(&case, isa, &inputs, &mut out))
                .expect("forward");
            gf / t0.elapsed().as_secs_f64()
        };
        for &rows in &counts {
            call(rows);
        }
        let mut gflops = vec![Vec::with_capacity(rounds); counts.len()];
        for _ in 0..rounds {
            for (g, &rows) in gflops.iter_mut().zip(&counts) {
                g.push(call(rows));
            }
        }
        gflops
    });
    for (g, rows) in gflops.iter().zip(&counts) {
        let ratio: Vec<f64> = g.iter().zip(&gflops[0]).map(|(x, y)| x / y).collect();
        println!(
            "{} {dtype} n={n} h={heads} d={d} causal={causal} t={threads}, {rows:>2} rows: median {:.1} GFLOP/s (best {:.1}); ratio to {} rows: median {:.3} (quartiles {:.3}..{:.3})",
            variant.name(),
            common::quantile(g, 0.5),
            common::quantile(g, 1.0),
            counts[0],
            common::quantile(&ratio, 0.5),
            common::quantile(&ratio, 0.25),
            common::quantile(&ratio, 0.75),
        );
    }
}
