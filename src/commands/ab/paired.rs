//! Paired statistics of an interleaved A/B run: each round of a case times the baseline (A)
//! and the current build (B) back to back, so a round's ratio B/A compares calls made at one
//! machine speed, whatever the host does over minutes. A case's ratio is the median of its
//! rounds' ratios; a group's (one kernel: variant, mode, dtype) is the geometric mean of its
//! cases' ratios, with a 95% two-level bootstrap interval (cases resampled, then each
//! picked case's rounds), so both the round-to-round noise and the spread between cases
//! widen it. Cost: O(B · Σ rounds) time for B resamples, O(Σ rounds) memory.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::compare::time::{median, Interval, CONFIDENCE};

/// ln(B/A) of each round where both medians are positive and finite.
pub fn log_ratios(rounds: &[(f64, f64)]) -> Vec<f64> {
    rounds
        .iter()
        .filter(|(a, b)| *a > 0.0 && *b > 0.0 && a.is_finite() && b.is_finite())
        .map(|(a, b)| (b / a).ln())
        .collect()
}

/// The case's ratio B/A: the median of its rounds' ratios; `None` without a round.
pub fn case_ratio(log_ratios: &[f64]) -> Option<f64> {
    (!log_ratios.is_empty()).then(|| median(&mut log_ratios.to_vec()).exp())
}

/// The group's geometric-mean ratio of its cases (each the median of its rounds' log
/// ratios) and its two-level bootstrap interval. `None` when no case has a round.
pub fn group_interval(cases: &[Vec<f64>], resamples: usize, seed: u64) -> Option<Interval> {
    let cases: Vec<&Vec<f64>> = cases.iter().filter(|c| !c.is_empty()).collect();
    if cases.is_empty() || resamples == 0 {
        return None;
    }
    let mean_of_medians = |meds: &mut dyn Iterator<Item = f64>| {
        let (sum, n) = meds.fold((0.0, 0usize), |(s, n), m| (s + m, n + 1));
        sum / n as f64
    };
    let estimate = mean_of_medians(&mut cases.iter().map(|c| median(&mut c.to_vec())));
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut buf = Vec::new();
    let mut stats: Vec<f64> = (0..resamples)
        .map(|_| {
            let mut sum = 0.0;
            for _ in 0..cases.len() {
                let c = cases[rng.random_range(0..cases.len())];
                buf.clear();
                buf.extend((0..c.len()).map(|_| c[rng.random_range(0..c.len())]));
                sum += median(&mut buf);
            }
            sum / cases.len() as f64
        })
        .collect();
    stats.sort_by(f64::total_cmp);
    let tail = (1.0 - CONFIDENCE) / 2.0;
    let at = |q: f64| stats[((q * (stats.len() - 1) as f64).round() as usize).min(stats.len() - 1)];
    Some(Interval {
        ratio: estimate.exp(),
        lo: at(tail).exp(),
        hi: at(1.0 - tail).exp(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::time::{classify, TimeVerdict};
    use rand_distr::{Distribution, LogNormal};

    /// `cases` cases of `rounds` rounds: each round's A and B share a machine speed that
    /// drifts by up to 2.5x between rounds (the VM's slow phases), B is `effect` times A,
    /// and each timing has its own noise of `sigma` with an occasional 1.5x outlier on
    /// either side.
    fn group(cases: usize, rounds: usize, effect: f64, sigma: f64, seed: u64) -> Vec<Vec<f64>> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let noise = LogNormal::new(0.0, sigma).unwrap();
        (0..cases)
            .map(|c| {
                let base = 1e-5 * (1 + c) as f64;
                let rounds: Vec<(f64, f64)> = (0..rounds)
                    .map(|r| {
                        let speed = 1.0 + 1.5 * rng.random::<f64>();
                        let outlier = |k| if (c + r) % 9 == k { 1.5 } else { 1.0 };
                        let a = base * speed * noise.sample(&mut rng) * outlier(4);
                        let b = base * speed * effect * noise.sample(&mut rng) * outlier(7);
                        (a, b)
                    })
                    .collect();
                log_ratios(&rounds)
            })
            .collect()
    }

    #[test]
    fn drift_shared_by_a_round_cancels() {
        for seed in 0..20 {
            let g = group(12, 7, 1.0, 0.05, seed);
            let iv = group_interval(&g, 1000, seed).unwrap();
            assert_eq!(
                classify(&iv, 0.10),
                TimeVerdict::Same,
                "seed {seed}: {iv:?}"
            );
        }
    }

    #[test]
    fn a_30_percent_slower_kernel_is_slower_and_faster_is_faster() {
        for seed in 0..20 {
            let slow = group_interval(&group(12, 7, 1.3, 0.05, seed), 1000, seed).unwrap();
            assert_eq!(
                classify(&slow, 0.10),
                TimeVerdict::Slower,
                "seed {seed}: {slow:?}"
            );
            assert!((slow.ratio - 1.3).abs() < 0.05, "{slow:?}");
            let fast = group_interval(&group(12, 7, 0.7, 0.05, seed), 1000, seed).unwrap();
            assert_eq!(
                classify(&fast, 0.10),
                TimeVerdict::Faster,
                "seed {seed}: {fast:?}"
            );
        }
    }

    #[test]
    fn a_single_case_of_few_rounds_is_not_judged_confidently() {
        // One case, three rounds with 20% noise: the interval must be wide, not a verdict.
        let g = group(1, 3, 1.0, 0.2, 1);
        let iv = group_interval(&g, 1000, 0).unwrap();
        assert!(iv.hi / iv.lo > 1.1, "{iv:?}");
    }

    #[test]
    fn case_ratio_is_the_median_of_the_rounds() {
        let r = log_ratios(&[(1.0, 2.0), (1.0, 1.0), (2.0, 3.0), (0.0, 1.0)]);
        assert_eq!(r.len(), 3);
        assert!((case_ratio(&r).unwrap() - 1.5).abs() < 1e-12);
        assert_eq!(case_ratio(&[]), None);
        assert_eq!(group_interval(&[vec![]], 10, 0), None);
    }
}
