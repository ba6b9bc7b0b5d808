//! Machine-speed probe: how fast this machine runs load-and-FMA code right now. A fixed
//! SGEMM small enough to live in L1 (`matrixmultiply`, 32 x 64 times 64 x 32, 20 KiB of
//! operands), timed in 5 bursts of 32 calls (about 70 us each) on every thread of the
//! case's pool, just before and just after its timed repetitions. A thread's rate is the
//! median of its bursts (a burst the scheduler interrupts does not count); the record keeps
//! the mean over threads of the two probes (`probe_gflops`). O(1) memory, about 0.7 ms per
//! case.
//!
//! Why: on a shared VM the same build runs some stretches of seconds 1.3x to 2x slower
//! (a sibling hyperthread or neighbour loading the core), and a start-of-sweep calibration
//! cannot see them. A pure register-FMA loop does not slow down in those stretches; this
//! probe's loads and FMAs do, as the kernels' do (docs/methodology.md, "Probe-normalized time", has the
//! measurement). `compare --normalize probe` divides each case's times by it.
//!
//! The probe is not attnbench's own tile code on purpose: a change to the kernels must not
//! move the yardstick they are normalized by.

use std::time::Instant;

/// Rows of A and C.
const M: usize = 32;
/// Inner dimension.
const K: usize = 64;
/// Columns of B and C.
const N: usize = 32;
/// SGEMM calls per timed burst (about 70 us at 60 GFLOP/s).
const CALLS: usize = 32;
/// Timed bursts per probe; the median burst rate is the probe's.
const BURSTS: usize = 5;

/// FLOPs of one burst.
const BURST_FLOPS: f64 = (2 * M * K * N * CALLS) as f64;

/// One probe on the calling thread: the median GFLOP/s of [`BURSTS`] bursts of [`CALLS`]
/// small SGEMMs on L1-resident operands.
pub fn probe_thread() -> f64 {
    let a: Vec<f32> = (0..M * K)
        .map(|i| ((i % 13) as f32 - 6.0) * 0.125)
        .collect();
    let b: Vec<f32> = (0..K * N)
        .map(|i| ((i % 11) as f32 - 5.0) * 0.125)
        .collect();
    let mut c = vec![0.0f32; M * N];
    // One untimed call brings the operands into L1.
    sgemm(&a, &b, &mut c);
    let mut rates = [0.0f64; BURSTS];
    for rate in &mut rates {
        let start = Instant::now();
        for _ in 0..CALLS {
            sgemm(&a, &b, &mut c);
        }
        let seconds = start.elapsed().as_secs_f64();
        std::hint::black_box(&c);
        *rate = BURST_FLOPS / seconds.max(1e-9) / 1e9;
    }
    rates.sort_by(f64::total_cmp);
    rates[BURSTS / 2]
}

fn sgemm(a: &[f32], b: &[f32], c: &mut [f32]) {
    // SAFETY: a is M x K, b is K x N and c is M x N, all row-major with the strides given.
    unsafe {
        matrixmultiply::sgemm(
            M,
            K,
            N,
            1.0,
            a.as_ptr(),
            K as isize,
            1,
            b.as_ptr(),
            N as isize,
            1,
            0.0,
            c.as_mut_ptr(),
            N as isize,
            1,
        );
    }
}

/// One probe on every thread of the current rayon pool at once (call it inside the case's
/// pool): the mean GFLOP/s per thread.
pub fn probe_pool() -> f64 {
    let rates = rayon::broadcast(|_| probe_thread());
    rates.iter().sum::<f64>() / rates.len().max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_measures_a_positive_finite_rate_on_every_thread() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let rate = pool.install(probe_pool);
        assert!(rate.is_finite() && rate > 0.0, "{rate}");
        // Bursts of 32 calls of 131 072 FLOPs: even a debug build on a loaded machine does
        // one in well under a second, and a release build at GFLOP/s.
        assert!(rate > 0.01, "{rate}");
    }

    #[test]
    fn the_probe_product_is_the_product() {
        let a: Vec<f32> = (0..M * K).map(|i| (i % 3) as f32).collect();
        let b: Vec<f32> = (0..K * N).map(|i| (i % 5) as f32).collect();
        let mut c = vec![-1.0f32; M * N];
        sgemm(&a, &b, &mut c);
        for i in 0..M {
            for j in 0..N {
                let want: f32 = (0..K).map(|k| a[i * K + k] * b[k * N + j]).sum();
                assert_eq!(c[i * N + j], want, "({i}, {j})");
            }
        }
    }
}
