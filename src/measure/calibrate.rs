//! Machine calibration for `meta.json` and rooflines: the f32 FMA peak (and the bf16
//! `vdpbf16ps` peak where the CPU has it) of the kernels' instruction-set path, SGEMM
//! GFLOP/s (`matrixmultiply`, row panels over threads), memory copy bandwidth and read
//! bandwidth (the copy's source summed at the widest path's loads); about 1.6 s on 2 cores
//! with the defaults, and 2 × 256 MiB of extra memory for the copy buffers (halved until
//! they fit).

use std::time::Instant;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::backend::cpu::isa::Isa;
use crate::backend::cpu::tiles::peak_loop;
use crate::backend::cpu::vecops::read_sum;

/// Default SGEMM size (square n × n × n).
pub const SGEMM_N: usize = 1024;
/// Default size of the copied buffer (source and destination are each this large): far
/// beyond any last-level cache, so the copy measures DRAM bandwidth.
pub const COPY_BYTES: u64 = 256 << 20;
/// Timed SGEMM runs (best is kept), after one warm-up.
const SGEMM_RUNS: usize = 5;
/// Timed copies (best is kept), after one warm-up.
const COPY_RUNS: usize = 3;
/// Smallest copy buffer tried when a memory budget refuses larger ones.
const MIN_COPY_BYTES: u64 = 1 << 20;
/// Rounds of the peak loops per thread and run (about 25 ms at 117 GFLOP/s per core).
const PEAK_ITERS: usize = 4_000_000;
/// Timed runs of the peak loops (best is kept), after one warm-up.
const PEAK_RUNS: usize = 3;

/// Measured machine peaks (best of a few runs, so an upper estimate of sustained rates).
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Calibration {
    /// Threads used (the rayon pool size).
    pub threads: usize,
    /// f32 GEMM rate: 2 n³ / best time, in 10⁹ FLOP/s.
    pub sgemm_gflops: f64,
    pub sgemm_n: usize,
    /// Copy bandwidth counting bytes read plus bytes written: 2 × `copy_bytes` / best time,
    /// in 10⁹ B/s (0 if no buffer could be allocated).
    pub copy_gbytes_per_s: f64,
    /// Size of the copied buffer actually used (it may be smaller than asked for under a
    /// memory budget).
    pub copy_bytes: u64,
    /// Read bandwidth: the copy's source summed (reads alone, `copy_bytes` per pass) /
    /// best time, in 10⁹ B/s; the roofline of a kernel that only streams its inputs, such
    /// as decode. None in results calibrated before it was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_gbytes_per_s: Option<f64>,
    /// Wall time the calibration took.
    pub seconds: f64,
    /// The kernels' default instruction-set path (`attnbench list`); the peaks are those of
    /// the widest path, whose FMA loop it shares.
    #[serde(default)]
    pub kernel_isa: String,
    /// f32 FMA peak: independent register FMA chains on every thread, 2 FLOPs per
    /// multiply-add, in 10⁹ FLOP/s. "Percent of peak" in reports is relative to this.
    #[serde(default)]
    pub fma_peak_gflops: f64,
    /// bf16 pair peak (`vdpbf16ps`, AVX512_BF16 only, whether or not the default path
    /// uses it), 2 FLOPs per multiply-add.
    #[serde(default)]
    pub bf16_peak_gflops: Option<f64>,
}

/// Calibrates with the defaults ([`SGEMM_N`], [`COPY_BYTES`]). `threads == 0` means all
/// available cores.
pub fn calibrate(threads: usize) -> Calibration {
    calibrate_with(threads, SGEMM_N, COPY_BYTES)
}

/// Calibrates with an `n × n × n` SGEMM and a copy of `copy_bytes` (rounded down to whole
/// f32s). `threads == 0` means all available cores.
pub fn calibrate_with(threads: usize, n: usize, copy_bytes: u64) -> Calibration {
    let start = Instant::now();
    let threads = if threads == 0 {
        std::thread::available_parallelism().map_or(1, |t| t.get())
    } else {
        threads
    };
    // The sweep's own kept pool (`measure::pool`), never a pool of its own: a dropped pool's
    // threads exit after the calibration returns, and each leaves a 2 KiB block of
    // deferred frees (crossbeam's epoch) that lands in, or is freed inside, a later case's
    // memory count. If no pool can be built, measure on the calling thread and say so in
    // `threads`.
    let pool = crate::measure::pool::pool(threads).ok();
    let pool = pool.as_deref();
    let threads = if pool.is_some() { threads } else { 1 };
    let run = |job: &mut (dyn FnMut() + Send)| match pool {
        Some(p) => p.install(job),
        None => job(),
    };

    // The best wall time of `runs` runs of `job` on the pool, after one warm-up run.
    let best_of = |runs: usize, job: &mut (dyn FnMut() + Send)| {
        let mut best = f64::INFINITY;
        for i in 0..=runs {
            let mut dt = 0.0;
            run(&mut || {
                let t0 = Instant::now();
                job();
                dt = t0.elapsed().as_secs_f64();
            });
            if i > 0 {
                best = best.min(dt);
            }
        }
        best
    };

    let n = n.max(1);
    let sgemm_best = {
        let a: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32 * 0.25 - 0.5).collect();
        let b: Vec<f32> = (0..n * n).map(|i| (i % 5) as f32 * 0.25 - 0.5).collect();
        let mut c = vec![0.0f32; n * n];
        let rows = n.div_ceil(threads);
        let best = best_of(SGEMM_RUNS, &mut || {
            c.par_chunks_mut(rows * n)
                .enumerate()
                .for_each(|(p, panel)| sgemm_panel(&a, &b, panel, p * rows, n));
        });
        std::hint::black_box(&c);
        best
    };
    let sgemm_gflops = 2.0 * (n as f64).powi(3) / sgemm_best / 1e9;

    let (copy_bytes, copy_best, read_best) = match copy_buffers(copy_bytes) {
        Some((src, mut dst)) => {
            let chunk = src.len().div_ceil(threads).max(1);
            let best = best_of(COPY_RUNS, &mut || {
                dst.par_chunks_mut(chunk)
                    .zip(src.par_chunks(chunk))
                    .for_each(|(d, s)| d.copy_from_slice(s));
            });
            std::hint::black_box(&dst);
            let read_best = best_of(COPY_RUNS, &mut || {
                let sum: f32 = src
                    .par_chunks(chunk)
                    .map(|x| read_sum(Isa::widest(), x))
                    .sum();
                std::hint::black_box(sum);
            });
            ((src.len() * 4) as u64, best, read_best)
        }
        None => (0, f64::INFINITY, f64::INFINITY),
    };
    let copy_gbytes_per_s = if copy_bytes == 0 {
        0.0
    } else {
        2.0 * copy_bytes as f64 / copy_best / 1e9
    };
    let read_gbytes_per_s = (copy_bytes > 0).then(|| copy_bytes as f64 / read_best / 1e9);

    // The peaks of the widest path: its FMA loop is the default path's, and the bf16 pair
    // peak is measured wherever the instruction exists, chosen or not (`isa::choose`).
    let isa = Isa::widest();
    let peak = |bf16: bool, iters: usize| {
        let mut best = f64::INFINITY;
        let mut flops = 0.0;
        for i in 0..=PEAK_RUNS {
            // One loop on every worker (`broadcast`), never two on one: with a parallel
            // iterator the calling thread ran both loops whenever the idle second core was
            // slow to steal one (a 2-thread peak measured at the 1-thread figure).
            let t0 = Instant::now();
            let f: Vec<(f64, f32)> = match pool {
                Some(p) => p.broadcast(|_| peak_loop(isa, bf16, iters)),
                None => vec![peak_loop(isa, bf16, iters)],
            };
            let dt = t0.elapsed().as_secs_f64();
            flops = f.iter().map(|x| x.0).sum();
            std::hint::black_box(f);
            if i > 0 {
                best = best.min(dt);
            }
        }
        flops / best / 1e9
    };
    let iters = (PEAK_ITERS as f64 * (n as f64 / SGEMM_N as f64).powi(3)).max(1000.0) as usize;
    let fma_peak_gflops = peak(false, iters);
    let bf16_peak_gflops = isa.bf16_dot().then(|| peak(true, iters / 2));

    Calibration {
        threads,
        sgemm_gflops,
        sgemm_n: n,
        copy_gbytes_per_s,
        copy_bytes,
        read_gbytes_per_s,
        seconds: start.elapsed().as_secs_f64(),
        kernel_isa: Isa::detect().name().to_string(),
        fma_peak_gflops,
        bf16_peak_gflops,
    }
}

/// `panel` = rows `row0..` of C = A·B (all n × n, row-major), one single-threaded sgemm.
fn sgemm_panel(a: &[f32], b: &[f32], panel: &mut [f32], row0: usize, n: usize) {
    let m = panel.len() / n;
    let a_rows = &a[row0 * n..(row0 + m) * n];
    // SAFETY: a_rows is m × n, b is n × n and panel is m × n, all row-major with the given
    // strides and in bounds; panel does not alias the inputs.
    unsafe {
        matrixmultiply::sgemm(
            m,
            n,
            n,
            1.0,
            a_rows.as_ptr(),
            n as isize,
            1,
            b.as_ptr(),
            n as isize,
            1,
            0.0,
            panel.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// Source and destination of `bytes` each, both written (so no page is first touched
/// inside the timed copy). Halves the size while allocation fails (memory budget).
fn copy_buffers(bytes: u64) -> Option<(Vec<f32>, Vec<f32>)> {
    let mut bytes = bytes;
    while bytes >= 4 {
        let len = usize::try_from(bytes / 4).ok()?;
        let mut src: Vec<f32> = Vec::new();
        let mut dst: Vec<f32> = Vec::new();
        if src.try_reserve_exact(len).is_ok() && dst.try_reserve_exact(len).is_ok() {
            src.extend((0..len).map(|i| (i & 0xff) as f32));
            dst.resize(len, 1.0);
            return Some((src, dst));
        }
        if bytes <= MIN_COPY_BYTES {
            return None;
        }
        bytes /= 2;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduced_calibration_is_positive_and_finite() {
        let c = calibrate_with(2, 96, 4 << 20);
        assert_eq!(c.threads, 2);
        assert_eq!(c.sgemm_n, 96);
        assert_eq!(c.copy_bytes, 4 << 20);
        for x in [
            c.sgemm_gflops,
            c.copy_gbytes_per_s,
            c.read_gbytes_per_s.unwrap(),
            c.seconds,
            c.fma_peak_gflops,
        ] {
            assert!(x.is_finite() && x > 0.0, "{c:?}");
        }
        let json = serde_json::to_string(&c).unwrap();
        let back: Calibration = serde_json::from_str(&json).unwrap();
        assert_eq!(back.sgemm_n, 96);
    }

    #[test]
    fn ragged_panels_compute_the_product() {
        // 3 threads over 10 rows: panels of 4, 4 and 2 rows.
        let n = 10;
        let a: Vec<f32> = (0..n * n).map(|i| (i % 3) as f32).collect();
        let b: Vec<f32> = (0..n * n).map(|i| (i % 4) as f32).collect();
        let mut c = vec![0.0f32; n * n];
        let rows = n.div_ceil(3);
        for (p, panel) in c.chunks_mut(rows * n).enumerate() {
            sgemm_panel(&a, &b, panel, p * rows, n);
        }
        for i in 0..n {
            for j in 0..n {
                let want: f32 = (0..n).map(|k| a[i * n + k] * b[k * n + j]).sum();
                assert_eq!(c[i * n + j], want);
            }
        }
    }

    #[test]
    fn thread_count_zero_means_all_cores() {
        let c = calibrate_with(0, 16, 64 << 10);
        assert!(c.threads >= 1);
        assert!(c.sgemm_gflops > 0.0);
    }

    /// The default calibration, within its budget: `cargo test --lib -- --ignored full_cal`.
    #[test]
    #[ignore = "takes about 1.5 s and 512 MiB"]
    fn full_calibration_fits_its_time_budget() {
        let c = calibrate(0);
        eprintln!("{c:?}");
        assert!(c.seconds < 3.0, "{c:?}");
        assert_eq!(c.copy_bytes, COPY_BYTES);
    }
}
