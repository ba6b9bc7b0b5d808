//! Thread scaling of one case's forward on a shared machine: rounds of a block of calls on
//! 1 thread, then a block on `threads`, each block warm (the first call of a block is not
//! timed, and the block warms up for at least 50 ms, as `configs/cpu_perf.toml` does), and
//! prints the median of each round's ratio (1-thread median time over `threads` median
//! time), so a slow stretch of the host falls on both sides of a ratio alike.
//!
//!   cargo run --release --example scaling -- naive 8192 1 128 bf16 0 2 10 3

use std::time::{Duration, Instant};

use attnbench::backend::cpu::isa::Isa;
use attnbench::backend::cpu::workspace::{WarmCalls, WarmStash};
use attnbench::problem::{Case, InputDist, Inputs};
use attnbench::run::{forward_with, pool};
use attnbench::variant::DefaultCase;

mod common;

fn main() {
    let many = common::case(["naive", "8192", "1", "128", "bf16", "0", "2"]);
    let rounds = common::parse::<usize>(8, "10", "rounds").max(1);
    let per = common::parse::<usize>(9, "3", "calls per block").max(1);
    // On one thread, as the config's sweep makes it (a case's defaults depend on its threads).
    let one = Case {
        causal: many.causal,
        ..Case::cpu_fwd(many.variant, many.shape, many.dtype, 1)
    };
    let (variant, dtype, threads, shape) = (many.variant, many.dtype, many.threads, many.shape);
    let (n, heads, d, causal) = (shape.seq_kv, shape.heads, shape.head_dim, many.causal);
    let isa = Isa::detect();
    let inputs = Inputs::generate(shape, dtype, InputDist::Normal, 1.0, 0);
    let mut out = vec![0.0f32; shape.out_len()];
    let gf = one.flops() / 1e9;
    let mut stash = [WarmStash::default(), WarmStash::default()];
    // One block: warm-up calls until 50 ms, then `per` timed calls; the median time.
    let mut block = |c: &Case, stash: &mut WarmStash| -> f64 {
        pool(c.threads).expect("thread pool").install(|| {
            let warm = WarmCalls::resume(std::mem::take(stash));
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_millis(50) {
                forward_with(c, isa, &inputs, &mut out).expect("forward");
            }
            let mut times: Vec<f64> = (0..per)
                .map(|_| {
                    let t = Instant::now();
                    forward_with(c, isa, &inputs, &mut out).expect("forward");
                    t.elapsed().as_secs_f64()
                })
                .collect();
            *stash = warm.suspend();
            times.sort_by(f64::total_cmp);
            times[times.len() / 2]
        })
    };
    let (mut t1, mut tn, mut ratio) = (vec![], vec![], vec![]);
    for _ in 0..rounds {
        let [s1, sn] = &mut stash;
        let a = block(&one, s1);
        let b = block(&many, sn);
        t1.push(a);
        tn.push(b);
        ratio.push(a / b);
    }
    println!(
        "{} {dtype} n={n} h={heads} d={d} causal={causal}: 1 thread {:.1} GFLOP/s, {threads} threads {:.1}; scaling median {:.3} (quartiles {:.3}..{:.3}, min {:.3})",
        variant.name(),
        gf / common::quantile(&t1, 0.5),
        gf / common::quantile(&tn, 0.5),
        common::quantile(&ratio, 0.5),
        common::quantile(&ratio, 0.25),
        common::quantile(&ratio, 0.75),
        common::quantile(&ratio, 0.0),
    );
}
