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
use attnbench::problem::{Case, DType, InputDist, Inputs, Shape};
use attnbench::runner::{forward_with, pool};
use attnbench::variant::VariantId;

fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: &str| a.get(i).cloned().unwrap_or_else(|| d.to_string());
    let variant: VariantId = arg(1, "naive").parse().expect("variant");
    let n: usize = arg(2, "8192").parse().expect("n");
    let heads: usize = arg(3, "1").parse().expect("heads");
    let d: usize = arg(4, "128").parse().expect("d");
    let dtype: DType = arg(5, "bf16").parse().expect("dtype");
    let causal = arg(6, "0") == "1";
    let threads: usize = arg(7, "2").parse().expect("threads");
    let rounds: usize = arg(8, "10").parse::<usize>().expect("rounds").max(1);
    let per: usize = arg(9, "3")
        .parse::<usize>()
        .expect("calls per block")
        .max(1);
    let isa = Isa::detect();
    let shape = Shape::self_attention(heads, n, d);
    let case = |t: usize| Case {
        causal,
        ..Case::cpu_fwd(variant, shape, dtype, t)
    };
    let (one, many) = (case(1), case(threads));
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
        gf / quantile(&t1, 0.5),
        gf / quantile(&tn, 0.5),
        quantile(&ratio, 0.5),
        quantile(&ratio, 0.25),
        quantile(&ratio, 0.75),
        quantile(&ratio, 0.0),
    );
}
