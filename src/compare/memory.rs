//! Memory gate of one case: the measured overhead (counting allocator, exact) may not grow
//! beyond the user's threshold plus a small allowance for what the allocator sees that the
//! algorithm does not decide. O(1).
//!
//! For a given build and case the overhead is deterministic except for:
//! - rayon's job injector: a `crossbeam` block of 63 job slots (1520 bytes) is allocated
//!   every 63 jobs handed to a pool, so whether one lands inside the checked call depends on how
//!   many repetitions ran before it;
//! - progress-bar redraws on a terminal (a few hundred bytes; piped and CI runs have none);
//! - with more than one thread, how many workers hold a GEMM packing buffer at the same
//!   moment (1 up to `threads`, each at most `PACK_BYTES_MAX`, about 1.1 MiB), which is
//!   scheduling.
//!
//! Hence the allowance: [`ALLOWANCE_BYTES`] (2 KiB, which still catches a one-page, 4 KiB
//! increase even when the baseline had the injector block and the current run does not),
//! plus `(threads - 1) * PACK_BYTES_MAX`. Single-thread cases are gated to the byte that
//! matters; multi-thread cases only against changes larger than a packing buffer.

use serde::Serialize;

use crate::backend::cpu::gemm::PACK_BYTES_MAX;

/// Scheduling-independent noise floor of the overhead (see the module doc).
pub const ALLOWANCE_BYTES: u64 = 2048;

/// The allowance for a case on `threads` threads.
pub fn allowance(threads: usize) -> u64 {
    ALLOWANCE_BYTES + threads.saturating_sub(1) as u64 * PACK_BYTES_MAX
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MemVerdict {
    /// Grew beyond threshold + allowance: a regression.
    Higher,
    /// Within threshold + allowance either way.
    Same,
    /// Shrank by more than the allowance.
    Lower,
    /// Differs beyond the allowance, but the runs used different CPU kernel paths, whose
    /// workspaces differ by design (bf16 tiles widened to f32 on AVX2, kept as pairs on
    /// AVX512_BF16): not judged.
    Incomparable,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct MemResult {
    pub verdict: MemVerdict,
    pub baseline_bytes: u64,
    pub current_bytes: u64,
    /// current - baseline.
    pub delta_bytes: i64,
    /// What an increase may be before it counts: threshold + allowance.
    pub tolerated_bytes: u64,
}

/// Gates `current` against `baseline` for a case on `threads` threads.
pub fn gate(baseline: u64, current: u64, threads: usize, threshold: u64) -> MemResult {
    let tolerated = threshold.saturating_add(allowance(threads));
    let delta = current as i128 - baseline as i128;
    let verdict = if delta > i128::from(tolerated) {
        MemVerdict::Higher
    } else if -delta > i128::from(allowance(threads)) {
        MemVerdict::Lower
    } else {
        MemVerdict::Same
    };
    MemResult {
        verdict,
        baseline_bytes: baseline,
        current_bytes: current,
        delta_bytes: delta.clamp(i64::MIN.into(), i64::MAX.into()) as i64,
        tolerated_bytes: tolerated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_page_more_is_a_regression_on_one_thread() {
        let base = 1_179_776;
        assert_eq!(gate(base, base, 1, 0).verdict, MemVerdict::Same);
        assert_eq!(gate(base, base + 4096, 1, 0).verdict, MemVerdict::Higher);
        // Even when the baseline happened to hold the injector block and this run did not.
        assert_eq!(
            gate(base + 1520, base + 4096, 1, 0).verdict,
            MemVerdict::Higher
        );
        // The injector block alone is noise.
        assert_eq!(gate(base, base + 1520, 1, 0).verdict, MemVerdict::Same);
        assert_eq!(gate(base + 1520, base, 1, 0).verdict, MemVerdict::Same);
    }

    #[test]
    fn the_threshold_adds_to_the_allowance() {
        let r = gate(10_000, 10_000 + 4096, 1, 4096);
        assert_eq!(r.verdict, MemVerdict::Same);
        assert_eq!(r.tolerated_bytes, 4096 + ALLOWANCE_BYTES);
        assert_eq!(r.delta_bytes, 4096);
        assert_eq!(
            gate(10_000, 10_000 + 4096 + 2049, 1, 4096).verdict,
            MemVerdict::Higher
        );
    }

    #[test]
    fn multi_thread_cases_tolerate_one_packing_buffer_per_extra_thread() {
        let base = 2_244_736;
        // Observed on 2 threads: 2244736 or 2392192 depending on scheduling.
        assert_eq!(gate(base, 2_392_192, 2, 0).verdict, MemVerdict::Same);
        assert_eq!(gate(2_392_192, base, 2, 0).verdict, MemVerdict::Same);
        assert_eq!(
            gate(base, base + 2 * PACK_BYTES_MAX, 2, 0).verdict,
            MemVerdict::Higher
        );
    }

    /// Growth of exactly threshold + allowance is tolerated, one byte more is not; a drop
    /// of exactly the allowance is the same, one byte more is lower.
    #[test]
    fn the_tolerance_and_the_allowance_are_inclusive() {
        let base = 100_000;
        let at = |current| gate(base, current, 1, 4096).verdict;
        assert_eq!(at(base + 4096 + ALLOWANCE_BYTES), MemVerdict::Same);
        assert_eq!(at(base + 4096 + ALLOWANCE_BYTES + 1), MemVerdict::Higher);
        assert_eq!(at(base - ALLOWANCE_BYTES), MemVerdict::Same);
        assert_eq!(at(base - ALLOWANCE_BYTES - 1), MemVerdict::Lower);
    }

    #[test]
    fn a_large_drop_is_lower() {
        assert_eq!(gate(1 << 20, 1 << 19, 1, 0).verdict, MemVerdict::Lower);
        assert_eq!(gate(5000, 0, 1, 0).delta_bytes, -5000);
    }
}
