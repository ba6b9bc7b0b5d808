//! Time verdict of one case: a percentile-bootstrap 95% interval of the ratio of medians
//! (current / baseline) from the raw repetition samples, classified against a relative
//! threshold. Cost: O(B · (n_b + n_c)) time for B resamples, O(B + n_b + n_c) memory.
//!
//! The median, not the mean, because a benchmark's noise is one-sided outliers (preemption,
//! page faults); resampling both runs, because both are noisy. With threshold `t`:
//! `slower` when the whole interval is above `1 + t`, `faster` when it is below `1 / (1 + t)`
//! (symmetric in log scale), `same` when it lies between the two, and `unclear` when it
//! straddles either bound: the data cannot tell, so the verdict says so instead of guessing.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// Two-sided confidence of the interval.
pub const CONFIDENCE: f64 = 0.95;

/// Fewest timed repetitions on each side for an interval: the bootstrap of one or two
/// samples gives an interval of (nearly) zero width whatever the noise, which would turn a
/// single pair of timings into a confident `slower` or `same`.
pub const MIN_REPS: usize = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TimeVerdict {
    Slower,
    Unclear,
    Faster,
    Same,
}

impl TimeVerdict {
    pub fn name(self) -> &'static str {
        match self {
            TimeVerdict::Slower => "slower",
            TimeVerdict::Unclear => "unclear",
            TimeVerdict::Faster => "faster",
            TimeVerdict::Same => "same",
        }
    }
}

/// The ratio of medians (current / baseline) and its bootstrap interval.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Interval {
    pub ratio: f64,
    pub lo: f64,
    pub hi: f64,
}

impl Interval {
    /// The interval for times scaled by `k` (machine normalization is a constant factor).
    pub fn scaled(self, k: f64) -> Interval {
        Interval {
            ratio: self.ratio * k,
            lo: self.lo * k,
            hi: self.hi * k,
        }
    }
}

/// Median in O(n) by selection; reorders `v`. `v` must be non-empty.
pub fn median(v: &mut [f64]) -> f64 {
    let n = v.len();
    let (_, &mut upper, _) = v.select_nth_unstable_by(n / 2, f64::total_cmp);
    if n % 2 == 1 {
        upper
    } else {
        let lower = v[..n / 2].iter().copied().fold(f64::NEG_INFINITY, f64::max);
        0.5 * (lower + upper)
    }
}

/// A stable 64-bit hash of a case id (FNV-1a), so each case gets its own bootstrap stream
/// whatever the order of the rows; the run's seed enters by xor of `seed · ⌊2^64 / φ⌋`, so
/// one id gets a different stream for every seed.
pub fn case_seed(seed: u64, case_id: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in case_id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The ratio of medians and its percentile-bootstrap interval at [`CONFIDENCE`], from
/// `resamples` resamples of each side. `None` when a side is empty or has a zero median.
pub fn bootstrap_ratio(
    baseline: &[f64],
    current: &[f64],
    resamples: usize,
    seed: u64,
) -> Option<Interval> {
    if baseline.is_empty() || current.is_empty() || resamples == 0 {
        return None;
    }
    let mb = median(&mut baseline.to_vec());
    let mc = median(&mut current.to_vec());
    if !(mb > 0.0 && mc.is_finite() && mb.is_finite()) {
        return None;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut resample = |src: &[f64], buf: &mut Vec<f64>| {
        buf.clear();
        buf.extend((0..src.len()).map(|_| src[rng.random_range(0..src.len())]));
        median(buf)
    };
    let (mut bb, mut cb) = (Vec::new(), Vec::new());
    let mut ratios: Vec<f64> = (0..resamples)
        .filter_map(|_| {
            let b = resample(baseline, &mut bb);
            let c = resample(current, &mut cb);
            (b > 0.0).then(|| c / b)
        })
        .collect();
    if ratios.is_empty() {
        return None;
    }
    ratios.sort_by(f64::total_cmp);
    let tail = (1.0 - CONFIDENCE) / 2.0;
    Some(Interval {
        ratio: mc / mb,
        lo: percentile(&ratios, tail),
        hi: percentile(&ratios, 1.0 - tail),
    })
}

/// The `q` quantile of ascending, non-empty `sorted`: the value at the nearest rank,
/// position `round(q · (len − 1))`. A `q` outside [0, 1] gives the nearest end, so a
/// rounding slip in the caller's `q` cannot index out of bounds.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    let i = (q * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The verdict of an interval against a relative threshold `t` (> 0), as the module doc says.
pub fn classify(iv: &Interval, threshold: f64) -> TimeVerdict {
    let up = 1.0 + threshold;
    let down = 1.0 / up;
    if iv.lo > up {
        TimeVerdict::Slower
    } else if iv.hi < down {
        TimeVerdict::Faster
    } else if iv.lo >= down && iv.hi <= up {
        TimeVerdict::Same
    } else {
        TimeVerdict::Unclear
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_distr::{Distribution, LogNormal};

    /// `n` timings around `center` with multiplicative noise of about `sigma` (log-normal)
    /// and, like a real machine, an occasional slow outlier.
    fn samples(center: f64, sigma: f64, n: usize, seed: u64) -> Vec<f64> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let noise = LogNormal::new(0.0, sigma).unwrap();
        (0..n)
            .map(|i| {
                let outlier = if i % 7 == 3 { 1.5 } else { 1.0 };
                center * noise.sample(&mut rng) * outlier
            })
            .collect()
    }

    fn verdict(base: &[f64], cur: &[f64], seed: u64) -> (TimeVerdict, Interval) {
        let iv = bootstrap_ratio(base, cur, 2000, seed).unwrap();
        (classify(&iv, 0.10), iv)
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&mut [7.0]), 7.0);
    }

    #[test]
    fn identical_runs_are_the_same() {
        for seed in 0..20 {
            let s = samples(1e-3, 0.03, 20, seed);
            let (v, iv) = verdict(&s, &s, seed);
            assert_eq!(v, TimeVerdict::Same, "seed {seed}: {iv:?}");
            assert_eq!(iv.ratio, 1.0);
        }
    }

    #[test]
    fn a_30_percent_slowdown_is_slower() {
        for seed in 0..20 {
            let base = samples(1e-3, 0.03, 20, seed);
            let cur = samples(1.3e-3, 0.03, 20, seed + 1000);
            let (v, iv) = verdict(&base, &cur, seed);
            assert_eq!(v, TimeVerdict::Slower, "seed {seed}: {iv:?}");
            // And the same samples scaled exactly, as the acceptance test does.
            let scaled: Vec<f64> = base.iter().map(|t| t * 1.3).collect();
            let (v, iv) = verdict(&base, &scaled, seed);
            assert_eq!(v, TimeVerdict::Slower, "seed {seed}: {iv:?}");
            assert!((iv.ratio - 1.3).abs() < 1e-12);
        }
    }

    #[test]
    fn a_30_percent_speedup_is_faster() {
        let base = samples(1e-3, 0.03, 20, 1);
        let cur: Vec<f64> = base.iter().map(|t| t / 1.3).collect();
        assert_eq!(verdict(&base, &cur, 1).0, TimeVerdict::Faster);
    }

    #[test]
    fn a_small_shift_inside_the_noise_is_never_slower() {
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..50 {
            // 5 % slower, with 10 % noise and few repetitions: not provably beyond 10 %.
            let base = samples(1e-3, 0.10, 8, seed);
            let cur = samples(1.05e-3, 0.10, 8, seed + 1000);
            let (v, iv) = verdict(&base, &cur, seed);
            assert_ne!(v, TimeVerdict::Slower, "seed {seed}: {iv:?}");
            assert_ne!(v, TimeVerdict::Faster, "seed {seed}: {iv:?}");
            seen.insert(v);
        }
        // Noisy and short, so the honest answer is often "unclear".
        assert!(seen.contains(&TimeVerdict::Unclear), "{seen:?}");
    }

    #[test]
    fn the_interval_contains_the_ratio_and_is_deterministic_for_a_seed() {
        let base = samples(2e-3, 0.05, 15, 3);
        let cur = samples(2.2e-3, 0.05, 12, 4);
        let a = bootstrap_ratio(&base, &cur, 1000, 9).unwrap();
        let b = bootstrap_ratio(&base, &cur, 1000, 9).unwrap();
        assert_eq!(a, b);
        assert!(a.lo <= a.ratio && a.ratio <= a.hi, "{a:?}");
    }

    #[test]
    fn straddling_a_bound_is_unclear() {
        let iv = |lo, hi| Interval { ratio: 1.0, lo, hi };
        assert_eq!(classify(&iv(1.05, 1.2), 0.1), TimeVerdict::Unclear);
        assert_eq!(classify(&iv(0.8, 0.95), 0.1), TimeVerdict::Unclear);
        assert_eq!(classify(&iv(0.8, 1.2), 0.1), TimeVerdict::Unclear);
        assert_eq!(classify(&iv(0.95, 1.05), 0.1), TimeVerdict::Same);
        assert_eq!(classify(&iv(1.11, 1.2), 0.1), TimeVerdict::Slower);
        assert_eq!(classify(&iv(0.8, 0.9), 0.1), TimeVerdict::Faster);
    }

    #[test]
    fn degenerate_inputs_give_no_interval() {
        assert!(bootstrap_ratio(&[], &[1.0], 100, 0).is_none());
        assert!(bootstrap_ratio(&[1.0], &[], 100, 0).is_none());
        assert!(bootstrap_ratio(&[1.0], &[1.0], 0, 0).is_none());
        assert!(bootstrap_ratio(&[0.0, 0.0], &[1.0], 100, 0).is_none());
        // A zero baseline median gives none even when some resamples' medians are positive
        // (>= 2 of 3 draws hit the 5.0 in 7/27 of them): the point ratio itself is undefined.
        assert!(bootstrap_ratio(&[0.0, 0.0, 5.0], &[1.0; 3], 1000, 0).is_none());
        // A non-finite median on either side: no ratio to bound.
        assert!(bootstrap_ratio(&[1.0], &[f64::INFINITY], 100, 0).is_none());
        assert!(bootstrap_ratio(&[f64::INFINITY], &[1.0], 100, 0).is_none());
    }

    #[test]
    fn a_resample_with_a_zero_baseline_median_is_dropped() {
        // Baseline median 2.5, but a resample of [0, 0, 5, 5] has median 0 when >= 3 of its 4
        // draws hit a 0 (5/16 of them): c / 0 would put infinity in the interval, so those
        // are dropped. The rest give 1/2.5 (6/11 of them) or 1/5 (5/11), so the interval is
        // exactly [0.2, 0.4].
        let iv = bootstrap_ratio(&[0.0, 0.0, 5.0, 5.0], &[1.0; 4], 1000, 0).unwrap();
        assert_eq!((iv.ratio, iv.lo, iv.hi), (0.4, 0.2, 0.4));
    }

    #[test]
    fn the_interval_holds_the_middle_95_percent_of_resampled_medians() {
        // Baseline constant, so each resampled ratio is the median of 9 draws from `cur`:
        // 0.5 when >= 5 draws hit the two 0.5s (P = 0.0304), 2.0 when >= 5 hit the one 2.0
        // (P = 0.0015), else 1.0. Of 100 000 resamples the 0.5s fill some 3 040 ranks, more
        // than the 2 500 below the 2.5 % rank (10 sigma), and the 2.0s some 145, fewer than
        // the 2 500 above the 97.5 % one: the interval is exactly [0.5, 1.0].
        let cur = [0.5, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0];
        let iv = bootstrap_ratio(&[1.0; 3], &cur, 100_000, 7).unwrap();
        assert_eq!((iv.ratio, iv.lo, iv.hi), (1.0, 0.5, 1.0));
    }

    #[test]
    fn percentile_is_the_nearest_rank_clamped_to_the_ends() {
        let v: Vec<f64> = (0..=40).map(f64::from).collect();
        // Rank round(q · 40): 0.975 -> 39, not the maximum; 0.025 -> 1, not the minimum.
        assert_eq!(percentile(&v, 0.975), 39.0);
        assert_eq!(percentile(&v, 0.025), 1.0);
        assert_eq!(percentile(&v, 0.5), 20.0);
        // Outside [0, 1]: the nearest end.
        assert_eq!(percentile(&v, 1.5), 40.0);
        assert_eq!(percentile(&v, -0.5), 0.0);
        assert_eq!(percentile(&[3.0], 0.975), 3.0);
    }

    #[test]
    fn touching_a_bound_is_not_beyond_it() {
        // t = 0.25: up = 1.25 and down = 1 / 1.25 = 0.8, both exact (0.8 as f64 rounds it).
        let iv = |lo, hi| Interval { ratio: 1.0, lo, hi };
        // `slower` and `faster` need the whole interval strictly beyond the bound...
        assert_eq!(classify(&iv(1.25, 1.3), 0.25), TimeVerdict::Unclear);
        assert_eq!(classify(&iv(0.7, 0.8), 0.25), TimeVerdict::Unclear);
        // ...while `same` includes both bounds.
        assert_eq!(classify(&iv(0.8, 1.25), 0.25), TimeVerdict::Same);
    }

    #[test]
    fn case_seed_is_fnv1a_of_the_id_xor_the_mixed_seed() {
        // The published FNV-1a 64-bit vectors: the ids' streams do not move between versions.
        assert_eq!(case_seed(0, ""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(case_seed(0, "a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(case_seed(0, "foobar"), 0x8594_4171_f739_67e8);
        // The seed enters by xor of seed · 0x9e37_79b9_7f4a_7c15.
        assert_eq!(case_seed(1, "a") ^ case_seed(0, "a"), 0x9e37_79b9_7f4a_7c15);
        assert_eq!(
            case_seed(3, "foobar") ^ case_seed(0, "foobar"),
            0x9e37_79b9_7f4a_7c15u64.wrapping_mul(3)
        );
    }

    #[test]
    fn scaling_multiplies_the_ratio_and_both_bounds() {
        let iv = Interval {
            ratio: 1.0,
            lo: 0.5,
            hi: 2.0,
        };
        let want = Interval {
            ratio: 3.0,
            lo: 1.5,
            hi: 6.0,
        };
        assert_eq!(iv.scaled(3.0), want);
    }

    #[test]
    fn verdict_names_are_the_report_words() {
        let names = [
            TimeVerdict::Slower,
            TimeVerdict::Unclear,
            TimeVerdict::Faster,
            TimeVerdict::Same,
        ]
        .map(TimeVerdict::name);
        assert_eq!(names, ["slower", "unclear", "faster", "same"]);
    }
}
