//! Warm-up, timed repetitions and the stopping rule (wall clock, `std::time::Instant`); costs
//! the repetitions themselves plus O(reps log reps) bookkeeping between them, untimed.
//!
//! # Semantics of [`time_repetitions`]
//!
//! 1. **Warm-up**: untimed calls, at least `warmup` of them and, with `warmup_s`, until
//!    that many seconds of warm-up have passed. Warm-up stops early once its own elapsed
//!    time exceeds `max_time_s`, or when the interrupt flag is set.
//! 2. **Timed repetitions**: at least one, each timed alone with `Instant` (the closure call
//!    only; the bookkeeping between calls is not timed). After each one, in this order:
//!    - the interrupt flag is set: stop with [`StopReason::Interrupted`] and return what was
//!      measured (at least one sample);
//!    - `reps == max_reps`: stop with [`StopReason::MaxReps`];
//!    - at least `min_reps` calls made and the total timed time `>= max_time_s`: stop with
//!      [`StopReason::TimeCap`]. `min_reps` wins over the cap: a config that asks for 5
//!      timings gets 5 (a comparison needs them), so a slow case runs `min_reps` calls
//!      whatever their duration; a config that wants one call of a slow case says
//!      `min_reps = 1`;
//!    - `reps >= max(min_reps, 3)`, total timed time `>= min_time_s` and the relative
//!      spread (MAD / median) `< rel_spread`: stop with [`StopReason::Converged`]. The
//!      spread of one or two samples says nothing about the noise, so convergence needs
//!      three ([`MIN_CONVERGED_REPS`]); a fixed count of one or two calls is `max_reps`.
//! 3. An error from the closure (warm-up or timed) is returned at once.
//!
//! `max_reps == 0` is treated as 1. A case is thus bounded by about `2 * max_time_s` plus
//! one call of overshoot, or by `min_reps` calls where those take longer, plus the untimed
//! bookkeeping: the spread (a sort of the samples)
//! is checked after each of the first 64 calls and then about every `reps / 32` calls, so
//! it stays small even for hundreds of thousands of microsecond calls.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::stats::Summary;
use crate::error::{Error, Result};

/// Fewest timed calls whose spread can stop the loop as converged.
pub const MIN_CONVERGED_REPS: usize = 3;

/// When to stop repeating a measurement (see the module doc for the exact rule).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StopRule {
    /// Untimed calls before the first timed one.
    pub warmup: usize,
    /// Keep warming up (untimed calls) until this many seconds have passed, after the
    /// `warmup` calls: a machine whose second core has been idle can take some
    /// milliseconds before a 2-thread call really runs on two cores.
    #[serde(default)]
    pub warmup_s: f64,
    /// Timed calls made before anything but `max_reps` or an interrupt stops the loop
    /// (convergence and the time cap alike).
    pub min_reps: usize,
    /// Hard cap on timed calls.
    pub max_reps: usize,
    /// Timed seconds required before convergence may stop the loop.
    pub min_time_s: f64,
    /// Cap on timed seconds per case once `min_reps` calls are made (and, separately, on
    /// warm-up seconds).
    pub max_time_s: f64,
    /// Target relative spread (MAD / median), e.g. 0.02 for 2 %.
    pub rel_spread: f64,
}

impl Default for StopRule {
    /// 1 warm-up call; 5..=100 repetitions; stop after at least 0.1 s once MAD/median is
    /// under 2 %, or after 10 s.
    fn default() -> Self {
        StopRule {
            warmup: 1,
            warmup_s: 0.0,
            min_reps: 5,
            max_reps: 100,
            min_time_s: 0.1,
            max_time_s: 10.0,
            rel_spread: 0.02,
        }
    }
}

/// Why the timed loop ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// Enough repetitions and time, and the spread is under the target.
    Converged,
    /// `max_reps` timed calls were made.
    MaxReps,
    /// `max_time_s` of timed calls was spent.
    TimeCap,
    /// The interrupt flag was set (Ctrl-C); the samples so far are returned.
    Interrupted,
}

impl StopReason {
    pub fn name(self) -> &'static str {
        match self {
            StopReason::Converged => "converged",
            StopReason::MaxReps => "max_reps",
            StopReason::TimeCap => "time_cap",
            StopReason::Interrupted => "interrupted",
        }
    }
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The timed samples of one case and their summary.
#[derive(Clone, Debug, PartialEq)]
pub struct Timing {
    /// Seconds per timed call, in call order.
    pub samples: Vec<f64>,
    pub summary: Summary,
    pub stopped_by: StopReason,
}

/// Runs `f` under `rule`: warm-up, then timed repetitions until the stopping rule (see the
/// module doc). Errors from `f` propagate immediately.
pub fn time_repetitions<F>(rule: &StopRule, interrupted: &AtomicBool, mut f: F) -> Result<Timing>
where
    F: FnMut() -> Result<()>,
{
    time_measured_repetitions(rule, interrupted, || {
        let t0 = Instant::now();
        f()?;
        Ok(t0.elapsed().as_secs_f64())
    })
}

/// [`time_repetitions`] for calls that measure themselves: `f` returns the seconds of its
/// own call (the GPU backend's CUDA-event time, which excludes the host's launch overhead
/// and the L2 flush before it). The stopping rule is the same.
pub fn time_measured_repetitions<F>(
    rule: &StopRule,
    interrupted: &AtomicBool,
    mut f: F,
) -> Result<Timing>
where
    F: FnMut() -> Result<f64>,
{
    let is_interrupted = || interrupted.load(Ordering::Relaxed);
    warm_up(rule, interrupted, || f().map(|_| ()))?;
    let mut samples = Vec::with_capacity(rule.max_reps.clamp(1, 1024));
    let mut total = 0.0;
    loop {
        let t = f()?;
        samples.push(t);
        total += t;
        if let Some(stopped_by) = rule.decide(&samples, total, is_interrupted()) {
            return Timing::of(samples, stopped_by);
        }
    }
}

/// The warm-up of the rule (step 1 of the module doc): untimed calls of `f`.
pub fn warm_up<F>(rule: &StopRule, interrupted: &AtomicBool, mut f: F) -> Result<()>
where
    F: FnMut() -> Result<()>,
{
    let warm_start = Instant::now();
    let mut calls = 0;
    while calls < rule.warmup || warm_start.elapsed().as_secs_f64() < rule.warmup_s {
        if interrupted.load(Ordering::Relaxed) {
            break;
        }
        f()?;
        calls += 1;
        if warm_start.elapsed().as_secs_f64() > rule.max_time_s {
            break;
        }
    }
    Ok(())
}

impl StopRule {
    /// Whether the timed loop stops after these samples, whose sum is `total` (step 2 of the
    /// module doc, in its order), and why; `None` = make another timed call.
    pub fn decide(&self, samples: &[f64], total: f64, interrupted: bool) -> Option<StopReason> {
        let reps = samples.len();
        if interrupted {
            Some(StopReason::Interrupted)
        } else if reps >= self.max_reps.max(1) {
            Some(StopReason::MaxReps)
        } else if reps >= self.min_reps && total >= self.max_time_s {
            Some(StopReason::TimeCap)
        } else if reps >= self.min_reps.max(MIN_CONVERGED_REPS)
            && total >= self.min_time_s
            && spread_due(reps)
            && Summary::of(samples).is_some_and(|s| s.relative_spread() < self.rel_spread)
        {
            Some(StopReason::Converged)
        } else {
            None
        }
    }
}

/// Whether the spread is checked after `reps` calls: after each of the first 64, then at
/// the counts with at most 6 significant bits (32 per doubling, at most `reps / 32` apart),
/// so a case of very many short calls sorts its samples O(log reps) times, not after every
/// call, and stops at most 1/32 later than it could.
fn spread_due(reps: usize) -> bool {
    reps <= 64 || reps.trailing_zeros() + 5 >= reps.ilog2()
}

impl Timing {
    /// The timing of these samples (at least one), stopped for `stopped_by`.
    pub fn of(samples: Vec<f64>, stopped_by: StopReason) -> Result<Timing> {
        let summary = Summary::of(&samples)
            .ok_or_else(|| Error::Runtime("timer: no samples recorded".into()))?;
        Ok(Timing {
            samples,
            summary,
            stopped_by,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Busy-waits, so the duration is steady even on a loaded machine's scheduler.
    fn spin(d: Duration) {
        let t = Instant::now();
        while t.elapsed() < d {
            std::hint::spin_loop();
        }
    }

    fn rule() -> StopRule {
        StopRule {
            warmup: 2,
            warmup_s: 0.0,
            min_reps: 5,
            max_reps: 50,
            min_time_s: 0.0,
            max_time_s: 10.0,
            rel_spread: 1e9,
        }
    }

    #[test]
    fn converges_after_min_reps_with_warmup_untimed() {
        let flag = AtomicBool::new(false);
        let mut calls = 0;
        let t = time_repetitions(&rule(), &flag, || {
            calls += 1;
            spin(Duration::from_micros(200));
            Ok(())
        })
        .unwrap();
        assert_eq!(t.stopped_by, StopReason::Converged);
        assert_eq!(t.samples.len(), 5);
        assert_eq!(t.summary.reps, 5);
        assert_eq!(calls, 2 + 5);
        assert!(t.samples.iter().all(|&s| s >= 200e-6));
        assert!(t.summary.min >= 200e-6);
    }

    #[test]
    fn the_spread_is_checked_often_early_and_rarely_late() {
        assert!((1..=64).all(spread_due));
        // 64, then 32 per doubling: 64 + 32 * log2(200000 / 64) = 436.
        let checks = (1..=200_000).filter(|&r| spread_due(r)).count();
        assert!(checks < 450, "{checks} sorts for 200000 calls");
        // Never more than reps / 32 + 1 calls between two checks.
        let due: Vec<usize> = (1..=200_000).filter(|&r| spread_due(r)).collect();
        for w in due.windows(2) {
            assert!(w[1] - w[0] <= w[0] / 32 + 1, "{} -> {}", w[0], w[1]);
        }
    }

    #[test]
    fn one_or_two_samples_never_count_as_converged() {
        let flag = AtomicBool::new(false);
        for min_reps in [0, 1, 2] {
            let r = StopRule { min_reps, ..rule() };
            let t = time_repetitions(&r, &flag, || Ok(())).unwrap();
            assert_eq!(t.stopped_by, StopReason::Converged, "min_reps {min_reps}");
            assert_eq!(t.samples.len(), MIN_CONVERGED_REPS, "min_reps {min_reps}");
        }
        // A fixed single call is still possible, by max_reps.
        let r = StopRule {
            min_reps: 1,
            max_reps: 1,
            ..rule()
        };
        let t = time_repetitions(&r, &flag, || Ok(())).unwrap();
        assert_eq!((t.samples.len(), t.stopped_by), (1, StopReason::MaxReps));
    }

    #[test]
    fn min_time_keeps_it_running_past_min_reps() {
        let flag = AtomicBool::new(false);
        let r = StopRule {
            min_time_s: 0.02,
            ..rule()
        };
        // Calls that report 1/2048 s each (sums exact in binary): the 41st brings the total
        // to 0.02 s, far past min_reps = 5. A clock would make the count depend on the load.
        let t = time_measured_repetitions(&r, &flag, || Ok(1.0 / 2048.0)).unwrap();
        assert_eq!(t.stopped_by, StopReason::Converged);
        assert_eq!(t.samples.len(), 41);
    }

    #[test]
    fn max_reps_is_respected_when_spread_never_converges() {
        let flag = AtomicBool::new(false);
        let r = StopRule {
            rel_spread: 0.0, // never reached
            max_reps: 12,
            ..rule()
        };
        let mut calls = 0;
        let t = time_repetitions(&r, &flag, || {
            calls += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(t.stopped_by, StopReason::MaxReps);
        assert_eq!(t.samples.len(), 12);
        assert_eq!(calls, 2 + 12);
    }

    #[test]
    fn zero_max_reps_still_times_once() {
        let flag = AtomicBool::new(false);
        let r = StopRule {
            warmup: 0,
            max_reps: 0,
            ..rule()
        };
        let t = time_repetitions(&r, &flag, || Ok(())).unwrap();
        assert_eq!(t.samples.len(), 1);
        assert_eq!(t.stopped_by, StopReason::MaxReps);
    }

    #[test]
    fn min_reps_beats_the_time_cap() {
        let flag = AtomicBool::new(false);
        let r = StopRule {
            warmup: 1,
            min_reps: 7,
            max_reps: 1000,
            max_time_s: 0.01,
            ..rule()
        };
        // Calls that report 1/256 s each: the cap is crossed at the 3rd, min_reps asks for 7.
        let t = time_measured_repetitions(&r, &flag, || Ok(1.0 / 256.0)).unwrap();
        assert_eq!(t.stopped_by, StopReason::TimeCap);
        assert_eq!(t.samples.len(), 7);
    }

    #[test]
    fn the_time_cap_stops_the_loop_once_min_reps_are_made() {
        let flag = AtomicBool::new(false);
        let r = StopRule {
            warmup: 1,
            min_reps: 2,
            max_reps: 1000,
            max_time_s: 0.01,
            rel_spread: 0.0,
            ..rule()
        };
        // 1/256 s per call against a 0.01 s cap: the 3rd call crosses it.
        let t = time_measured_repetitions(&r, &flag, || Ok(1.0 / 256.0)).unwrap();
        assert_eq!(t.stopped_by, StopReason::TimeCap);
        assert_eq!(t.samples.len(), 3);
    }

    #[test]
    fn warmup_s_keeps_warming_up_after_the_warmup_calls_untimed() {
        let flag = AtomicBool::new(false);
        let r = StopRule {
            warmup: 1,
            warmup_s: 0.02,
            ..rule()
        };
        let start = Instant::now();
        let mut began = Vec::new();
        let t = time_repetitions(&r, &flag, || {
            began.push(start.elapsed().as_secs_f64());
            spin(Duration::from_millis(2));
            Ok(())
        })
        .unwrap();
        // The first timed call begins after 20 ms of warm-up, not after the one 2 ms call.
        // (How many warm-up calls that took depends on the machine's load.)
        assert_eq!(t.samples.len(), 5);
        let warm = began.len() - 5;
        assert!(began[warm] >= 0.02, "{began:?}");
    }

    #[test]
    fn warmup_stops_at_the_time_cap() {
        let flag = AtomicBool::new(false);
        // Many warm-up calls, or a long warm-up time: the cap bounds either.
        for (warmup, warmup_s) in [(1000, 0.0), (1, 10.0)] {
            let r = StopRule {
                warmup,
                warmup_s,
                max_time_s: 0.005,
                ..rule()
            };
            let mut calls = 0;
            let t = time_repetitions(&r, &flag, || {
                calls += 1;
                spin(Duration::from_millis(2));
                Ok(())
            })
            .unwrap();
            assert_eq!(t.stopped_by, StopReason::TimeCap);
            assert!(calls < 10, "{calls}");
        }
    }

    #[test]
    fn interruption_returns_what_was_measured() {
        let flag = AtomicBool::new(false);
        let r = StopRule {
            rel_spread: 0.0,
            max_reps: 1000,
            ..rule()
        };
        let mut calls = 0;
        let t = time_repetitions(&r, &flag, || {
            calls += 1;
            if calls == 5 {
                flag.store(true, Ordering::Relaxed);
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(t.stopped_by, StopReason::Interrupted);
        // 2 warm-up calls, then timed calls 3, 4 and 5 (the flag is seen after the 5th).
        assert_eq!(t.samples.len(), 3);
        assert_eq!(t.stopped_by.name(), "interrupted");
    }

    #[test]
    fn interrupted_before_start_still_gives_one_sample() {
        let flag = AtomicBool::new(true);
        let mut calls = 0;
        let t = time_repetitions(&rule(), &flag, || {
            calls += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(t.stopped_by, StopReason::Interrupted);
        assert_eq!(t.samples.len(), 1);
        assert_eq!(calls, 1);
    }

    #[test]
    fn errors_propagate_immediately() {
        let flag = AtomicBool::new(false);
        let mut calls = 0;
        let r = time_repetitions(&rule(), &flag, || {
            calls += 1;
            if calls == 4 {
                Err(Error::OutOfMemory("workspace".into()))
            } else {
                Ok(())
            }
        });
        assert!(matches!(r, Err(Error::OutOfMemory(_))));
        assert_eq!(calls, 4);
        let mut calls = 0;
        let r = time_repetitions(&rule(), &flag, || {
            calls += 1;
            Err(Error::Runtime("first warm-up".into()))
        });
        assert!(matches!(r, Err(Error::Runtime(_))));
        assert_eq!(calls, 1);
    }
}
