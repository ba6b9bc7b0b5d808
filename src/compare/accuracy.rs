//! Error gate of one case: `max_abs_err` against the f64 oracle may not grow by more than a
//! factor (default 2x) *and* exceed the dtype's tolerance; and a case that was `ok` may not
//! become anything else (`error`, `oom`, `timeout`, `skipped`). O(1).
//!
//! Both conditions, because either alone misfires: the error of an exact algorithm in f32 is
//! rounding noise that can double with a harmless change of summation order while staying
//! far below the tolerance, and a bf16 case sits near its tolerance in every build.

use serde::Serialize;

use crate::results::record::Status;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ErrVerdict {
    /// Grew beyond the factor and above the tolerance (or became non-finite): a regression.
    Worse,
    Same,
    /// Shrank by more than the factor from above the tolerance.
    Better,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ErrResult {
    pub verdict: ErrVerdict,
    pub baseline: f64,
    pub current: f64,
    /// The dtype's tolerance (`attnbench list`).
    pub tolerance: f64,
}

/// Gates the current `max_abs_err` against the baseline's with growth `factor` (> 1).
pub fn gate(baseline: f64, current: f64, tolerance: f64, factor: f64) -> ErrResult {
    let became_non_finite = !current.is_finite() && baseline.is_finite();
    let verdict = if became_non_finite || (current > factor * baseline && current > tolerance) {
        ErrVerdict::Worse
    } else if baseline > factor * current && baseline > tolerance {
        ErrVerdict::Better
    } else {
        ErrVerdict::Same
    };
    ErrResult {
        verdict,
        baseline,
        current,
        tolerance,
    }
}

/// How a case's status moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StatusChange {
    /// Was `ok`, is not: a regression.
    Lost,
    /// The same status on both sides.
    Same,
    /// Was not `ok`, is now.
    Fixed,
    /// Moved between two non-`ok` statuses (e.g. `skipped` -> `oom`): reported, not gated.
    Changed,
}

pub fn status_change(baseline: Status, current: Status) -> StatusChange {
    match (baseline == Status::Ok, current == Status::Ok) {
        _ if baseline == current => StatusChange::Same,
        (true, false) => StatusChange::Lost,
        (false, true) => StatusChange::Fixed,
        _ => StatusChange::Changed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubling_below_the_tolerance_is_noise() {
        // f32: tolerance 1e-5; 4e-7 -> 1.2e-6 triples but stays far below.
        assert_eq!(gate(4e-7, 1.2e-6, 1e-5, 2.0).verdict, ErrVerdict::Same);
    }

    #[test]
    fn growth_beyond_the_factor_and_the_tolerance_is_worse() {
        assert_eq!(gate(4e-6, 2e-5, 1e-5, 2.0).verdict, ErrVerdict::Worse);
        // Above the tolerance but within the factor: bf16 near its limit.
        assert_eq!(gate(1.5e-2, 1.7e-2, 1.6e-2, 2.0).verdict, ErrVerdict::Same);
        assert_eq!(
            gate(1e-3, f64::INFINITY, 1e-5, 2.0).verdict,
            ErrVerdict::Worse
        );
        assert_eq!(gate(1e-3, f64::NAN, 1e-5, 2.0).verdict, ErrVerdict::Worse);
        assert_eq!(gate(2e-5, 4e-6, 1e-5, 2.0).verdict, ErrVerdict::Better);
    }

    /// The gate's edges: growth of exactly the factor, or ending exactly at the
    /// tolerance, is not yet worse; a shrink of exactly the factor, or from exactly the
    /// tolerance, is not yet better; a large shrink from below the tolerance is noise.
    #[test]
    fn the_factor_and_the_tolerance_are_strict_bounds() {
        // 2 x 1e-4 is exact in binary: current == factor * baseline, above the tolerance.
        assert_eq!(gate(1e-4, 2e-4, 1e-5, 2.0).verdict, ErrVerdict::Same);
        // current == tolerance, 10x the baseline.
        assert_eq!(gate(1e-6, 1e-5, 1e-5, 2.0).verdict, ErrVerdict::Same);
        // baseline == factor * current, above the tolerance.
        assert_eq!(gate(2e-4, 1e-4, 1e-5, 2.0).verdict, ErrVerdict::Same);
        // baseline == tolerance, 10x the current.
        assert_eq!(gate(1e-5, 1e-6, 1e-5, 2.0).verdict, ErrVerdict::Same);
        // A 4x shrink far below the tolerance: rounding noise, not better.
        assert_eq!(gate(4e-6, 1e-6, 1e-5, 2.0).verdict, ErrVerdict::Same);
    }

    #[test]
    fn losing_ok_is_a_regression_in_any_direction() {
        for s in [Status::Error, Status::Oom, Status::Timeout, Status::Skipped] {
            assert_eq!(status_change(Status::Ok, s), StatusChange::Lost);
            assert_eq!(status_change(s, Status::Ok), StatusChange::Fixed);
            assert_eq!(status_change(s, s), StatusChange::Same);
        }
        assert_eq!(
            status_change(Status::Skipped, Status::Oom),
            StatusChange::Changed
        );
        assert_eq!(status_change(Status::Ok, Status::Ok), StatusChange::Same);
    }
}
