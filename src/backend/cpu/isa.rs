//! Instruction-set paths of the CPU kernels: which ones this CPU can run
//! (`is_x86_feature_detected!`) and which one runs by default, chosen by what the core
//! measures, not by which instructions exist. Paths are passed down explicitly, so tests
//! run every path the machine has and a case may force one (`kernel_path`). Nothing but
//! the CPU decides the default: environment variables never change which path runs.
//!
//! The choice: where AVX512_BF16 exists, bf16 inputs are multiplied either as bf16 pairs
//! (`vdpbf16ps`) or widened to f32 and multiplied with FMA. Zen 4 and 5 run `vdpbf16ps` at
//! twice the FMA's FLOP rate, a Xeon of family 6 model 207 at half of it (85 against 172
//! GFLOP/s per core), where the widening path is 1.6 to 1.9x faster. A short probe times
//! both peak loops on one core (interleaved, best of [`PROBE_RUNS`], about 10 ms, once per
//! process) and [`choose`] keeps the pair path only where its rate is at least the FMA's.

use std::sync::OnceLock;
use std::time::Instant;

use serde::{Deserialize, Serialize};

pub use crate::problem::Isa;

/// Rounds of each peak loop per probe run (about 1 ms at 100 GFLOP/s).
const PROBE_ITERS: usize = 200_000;
/// Timed runs of each loop (best kept), after one warm-up each.
const PROBE_RUNS: usize = 7;
/// The pair path is kept where its FLOP rate is at least this fraction of the FMA's: at
/// equal rates it still reads half the bytes of a packed K panel and skips the widening.
pub const BF16_DOT_MIN_RATIO: f64 = 1.0;

impl Isa {
    /// Whether this CPU can run the path (asked of the CPU once; every kernel call checks
    /// its path, several times per row block).
    #[inline]
    pub fn available(self) -> bool {
        static AVAILABLE: OnceLock<[bool; Isa::ALL.len()]> = OnceLock::new();
        let by_discriminant = || {
            let mut a = [false; Isa::ALL.len()];
            for isa in Isa::ALL {
                a[isa as usize] = isa.has_features();
            }
            a
        };
        AVAILABLE.get_or_init(by_discriminant)[self as usize]
    }

    /// Whether this CPU can run the path, from the feature flags.
    fn has_features(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let avx512 = || {
                is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("f16c")
            };
            match self {
                Isa::AmxBf16 => avx512() && super::amx::usable(),
                Isa::Avx512Bf16 => avx512() && is_x86_feature_detected!("avx512bf16"),
                Isa::Avx512 => avx512(),
                Isa::Avx2 => {
                    is_x86_feature_detected!("avx2")
                        && is_x86_feature_detected!("fma")
                        && is_x86_feature_detected!("f16c")
                }
                Isa::Portable => true,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Isa::Portable
        }
    }

    /// The paths this CPU runs, widest first.
    pub fn available_paths() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.available()).collect()
    }

    /// The widest path this CPU's instructions allow.
    pub fn widest() -> Isa {
        Isa::ALL
            .into_iter()
            .find(|i| i.available())
            .unwrap_or(Isa::Portable)
    }

    /// The path kernels run unless a case forces one: the measured choice
    /// ([`PathChoice::of_this_cpu`], probed the first time it is asked).
    pub fn detect() -> Isa {
        PathChoice::of_this_cpu().chosen
    }

    /// `name` as a path this CPU runs; the error lists the ones it does.
    pub fn parse_available(name: &str) -> Result<Isa, String> {
        let isa: Isa = name.parse()?;
        if isa.available() {
            Ok(isa)
        } else {
            Err(format!(
                "kernel path '{isa}' is not available on this CPU (it runs {})",
                Isa::available_paths()
                    .iter()
                    .map(|i| i.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        }
    }
}

/// The default path of this CPU and the one-core rates behind it (`meta.json`'s
/// `cpu_kernel_path_choice`, `attnbench list`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PathChoice {
    /// The widest path the instructions allow.
    pub widest: Isa,
    /// The path kernels run by default.
    pub chosen: Isa,
    /// f32 FMA peak of one core on the widest path, GFLOP/s (2 per multiply-add).
    pub fma_gflops: f64,
    /// bf16 pair (`vdpbf16ps`) peak of one core, GFLOP/s; only where the widest path has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bf16_dot_gflops: Option<f64>,
    /// AMX bf16 tile (`tdpbf16ps`) peak of one core, GFLOP/s; only where the CPU and OS
    /// offer the tiles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amx_gflops: Option<f64>,
}

/// The AMX peak loop: a tenth of the vector loops' rounds (each round is 64x the work).
fn amx_peak() -> (f64, f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: called only where `Isa::AmxBf16` is available, so the tiles are usable.
    return unsafe { super::amx::peak_loop(PROBE_ITERS / 10) };
    #[cfg(not(target_arch = "x86_64"))]
    (0.0, 0.0)
}

impl PathChoice {
    /// This CPU's choice, probed once per process.
    pub fn of_this_cpu() -> &'static PathChoice {
        static CHOICE: OnceLock<PathChoice> = OnceLock::new();
        CHOICE.get_or_init(PathChoice::probe)
    }

    /// Times the FMA, (where the CPU has them) the bf16 pair and the AMX tile peak loops on
    /// the calling thread, interleaved, and chooses.
    fn probe() -> PathChoice {
        let widest = Isa::widest();
        let timed = |run: &dyn Fn() -> (f64, f32)| {
            let t0 = Instant::now();
            let (flops, v) = run();
            let dt = t0.elapsed().as_secs_f64();
            std::hint::black_box(v);
            flops / dt.max(1e-9) / 1e9
        };
        let pairs = Isa::Avx512Bf16.available();
        let amx = Isa::AmxBf16.available();
        let (mut fma, mut dot, mut tiles) = (0.0f64, 0.0f64, 0.0f64);
        for run in 0..=PROBE_RUNS {
            let f = timed(&|| super::tiles::peak_loop(widest, false, PROBE_ITERS));
            let d = if pairs {
                timed(&|| super::tiles::peak_loop(Isa::Avx512Bf16, true, PROBE_ITERS))
            } else {
                0.0
            };
            let a = if amx { timed(&amx_peak) } else { 0.0 };
            if run > 0 {
                fma = fma.max(f);
                dot = dot.max(d);
                tiles = tiles.max(a);
            }
        }
        let bf16_dot_gflops = pairs.then_some(dot);
        let amx_gflops = amx.then_some(tiles);
        PathChoice {
            widest,
            chosen: choose(widest, fma, bf16_dot_gflops, amx_gflops),
            fma_gflops: fma,
            bf16_dot_gflops,
            amx_gflops,
        }
    }

    /// One line for `attnbench list` and logs.
    pub fn summary(&self) -> String {
        let why = match self.bf16_dot_gflops {
            Some(dot) => format!(
                "bf16 pairs (vdpbf16ps) at {dot:.0} GFLOP/s per core against f32 FMA at {:.0}: bf16 {}",
                self.fma_gflops,
                if self.chosen.bf16_dot() {
                    "multiplied as pairs"
                } else {
                    "widened to f32"
                }
            ),
            None => format!(
                "the widest this CPU runs (f32 FMA at {:.0} GFLOP/s per core)",
                self.fma_gflops
            ),
        };
        let why = match self.amx_gflops {
            Some(a) => format!(
                "AMX tiles (tdpbf16ps) at {a:.0} GFLOP/s per core: {}; {why}",
                if self.chosen == Isa::AmxBf16 {
                    "flash's bf16 forward on them"
                } else {
                    "not used"
                }
            ),
            None => why,
        };
        format!("{} by default, measured: {why}", self.chosen)
    }
}

/// The default path: `amx-bf16` where the AMX tiles' rate is at least the FMA's; else the
/// widest vector path, except that bf16 is widened to f32 (`avx512`) where the pair
/// instruction's rate is below [`BF16_DOT_MIN_RATIO`] of the FMA's.
pub fn choose(
    widest: Isa,
    fma_gflops: f64,
    bf16_dot_gflops: Option<f64>,
    amx_gflops: Option<f64>,
) -> Isa {
    if widest == Isa::AmxBf16 && amx_gflops.is_some_and(|a| a >= fma_gflops) {
        return Isa::AmxBf16;
    }
    match bf16_dot_gflops {
        Some(dot) if dot < BF16_DOT_MIN_RATIO * fma_gflops => Isa::Avx512,
        Some(_) => Isa::Avx512Bf16,
        None if widest == Isa::AmxBf16 => Isa::Avx512,
        None => widest,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detected_path_is_available_and_portable_always_is() {
        assert!(Isa::detect().available());
        assert!(Isa::widest().available());
        assert!(Isa::Portable.available());
        println!("kernel paths here: {:?}", Isa::available_paths());
        println!("{}", PathChoice::of_this_cpu().summary());
    }

    #[test]
    fn pairs_are_kept_where_they_are_faster_and_widened_where_slower() {
        // Zen 4's calibration (results/cpu_perf_zen4/meta.json, one core): 117.5 GFLOP/s FMA,
        // 235.7 bf16 pairs.
        assert_eq!(
            choose(Isa::Avx512Bf16, 117.5, Some(235.7), None),
            Isa::Avx512Bf16
        );
        // The Xeon of family 6 model 207: 172 FMA, 85 pairs.
        assert_eq!(
            choose(Isa::Avx512Bf16, 172.0, Some(85.0), None),
            Isa::Avx512
        );
        // At equal rates the pairs stay (half the bytes, no widening).
        assert_eq!(
            choose(Isa::Avx512Bf16, 100.0, Some(100.0), None),
            Isa::Avx512Bf16
        );
        // Without the instruction the widest path is the choice, whatever the rates.
        for isa in [Isa::Avx512, Isa::Avx2, Isa::Portable] {
            assert_eq!(choose(isa, 50.0, None, None), isa);
        }
    }

    #[test]
    fn amx_tiles_are_chosen_where_faster_and_the_vector_rule_decides_otherwise() {
        // This VM's probe (Xeon with AMX, `attnbench list`): about 170 FMA, 85 pairs, and
        // the tiles far above both; the tiles win.
        assert_eq!(
            choose(Isa::AmxBf16, 170.0, Some(85.0), Some(1500.0)),
            Isa::AmxBf16
        );
        // Tiles slower than the FMA (a hypothetical throttled unit): the vector rule, which
        // widens here and keeps pairs where they are faster.
        assert_eq!(
            choose(Isa::AmxBf16, 170.0, Some(85.0), Some(100.0)),
            Isa::Avx512
        );
        assert_eq!(
            choose(Isa::AmxBf16, 100.0, Some(200.0), Some(50.0)),
            Isa::Avx512Bf16
        );
        // Without the AMX rate (the OS refused the tiles) the widest is never AMX.
        assert_eq!(choose(Isa::AmxBf16, 170.0, Some(85.0), None), Isa::Avx512);
        assert_eq!(choose(Isa::AmxBf16, 170.0, None, None), Isa::Avx512);
    }

    #[test]
    fn a_path_this_cpu_lacks_is_refused_with_the_list() {
        for isa in Isa::ALL {
            match Isa::parse_available(isa.name()) {
                Ok(i) => assert!(i.available() && i == isa),
                Err(e) => {
                    assert!(!isa.available());
                    assert!(e.contains("not available") && e.contains("portable"), "{e}");
                }
            }
        }
        assert!(Isa::parse_available("sse2").is_err());
    }
}
