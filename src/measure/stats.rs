//! Summary statistics of timing samples: median, min, max and MAD (median absolute
//! deviation); O(n log n) time and O(n) extra memory for n samples.

use serde::{Deserialize, Serialize};

/// Summary of a set of samples (seconds, for timings).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Number of samples.
    pub reps: usize,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// Median absolute deviation from the median, unscaled (no 1.4826 normal factor).
    pub mad: f64,
}

impl Summary {
    /// Summarizes `samples`; `None` when there are none. The median of an even count is the
    /// mean of the two middle values. NaN samples sort last (IEEE total order).
    pub fn of(samples: &[f64]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let median = median_of_sorted(&sorted);
        let mut dev: Vec<f64> = sorted.iter().map(|x| (x - median).abs()).collect();
        dev.sort_by(f64::total_cmp);
        Some(Summary {
            reps: sorted.len(),
            median,
            min: sorted[0],
            max: sorted[sorted.len() - 1],
            mad: median_of_sorted(&dev),
        })
    }

    /// MAD relative to the median (0 when the median is 0): the noise figure the stopping
    /// rule compares with its target.
    pub fn relative_spread(&self) -> f64 {
        if self.median == 0.0 {
            0.0
        } else {
            self.mad / self.median.abs()
        }
    }
}

/// Median of a non-empty sorted slice.
fn median_of_sorted(s: &[f64]) -> f64 {
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        0.5 * (s[n / 2 - 1] + s[n / 2])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_has_no_summary() {
        assert_eq!(Summary::of(&[]), None);
    }

    #[test]
    fn odd_count() {
        // sorted: 1 2 3 4 100; median 3; |x-3|: 2 1 0 1 97 -> sorted 0 1 1 2 97 -> MAD 1
        let s = Summary::of(&[3.0, 1.0, 100.0, 2.0, 4.0]).unwrap();
        assert_eq!(s.reps, 5);
        assert_eq!(s.median, 3.0);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 100.0);
        assert_eq!(s.mad, 1.0);
        assert!((s.relative_spread() - 1.0 / 3.0).abs() < 1e-15);
    }

    #[test]
    fn even_count() {
        // sorted: 1 2 4 10; median 3; |x-3|: 2 1 1 7 -> sorted 1 1 2 7 -> MAD 1.5
        let s = Summary::of(&[10.0, 2.0, 1.0, 4.0]).unwrap();
        assert_eq!(s.reps, 4);
        assert_eq!(s.median, 3.0);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 10.0);
        assert_eq!(s.mad, 1.5);
        assert_eq!(s.relative_spread(), 0.5);
    }

    #[test]
    fn single_sample_and_zero_median() {
        let s = Summary::of(&[0.25]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.mad), (0.25, 0.25, 0.25, 0.0));
        assert_eq!(s.relative_spread(), 0.0);
        let z = Summary::of(&[0.0, 0.0, 1.0]).unwrap();
        assert_eq!(z.median, 0.0);
        assert_eq!(z.relative_spread(), 0.0);
    }
}
