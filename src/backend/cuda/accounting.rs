//! Byte accounting of the device allocator (live, peak, limit), pure Rust so it is tested
//! without a device: the memory-overhead figure is `peak - live` before the checked call, as
//! the CPU's counting allocator gives it (docs/methodology.md, "Memory overhead"). O(1) per event.

/// Live and peak bytes of the buffers a [`Counter`]'s owner has handed out, and an optional
/// limit (the config's memory budget emulating a smaller device).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counter {
    live: u64,
    peak: u64,
    limit: Option<u64>,
    allocations: u64,
}

/// An allocation the limit refuses: it is recorded as `oom`, never attempted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverLimit {
    pub live: u64,
    pub requested: u64,
    pub limit: u64,
}

impl Counter {
    /// Accounts for `bytes` about to be allocated, or refuses them (nothing changes then).
    pub fn reserve(&mut self, bytes: u64) -> Result<(), OverLimit> {
        if let Some(limit) = self.limit {
            if self.live.saturating_add(bytes) > limit {
                return Err(OverLimit {
                    live: self.live,
                    requested: bytes,
                    limit,
                });
            }
        }
        self.live += bytes;
        self.peak = self.peak.max(self.live);
        self.allocations += 1;
        Ok(())
    }

    /// Takes back a reservation whose allocation failed, or a freed buffer.
    pub fn release(&mut self, bytes: u64) {
        debug_assert!(bytes <= self.live, "released more than is live");
        self.live = self.live.saturating_sub(bytes);
    }

    pub fn live(&self) -> u64 {
        self.live
    }

    pub fn peak(&self) -> u64 {
        self.peak
    }

    /// Allocations made so far (reservations accepted).
    pub fn allocations(&self) -> u64 {
        self.allocations
    }

    /// Starts a measurement: the peak becomes what is live now.
    pub fn reset_peak(&mut self) {
        self.peak = self.live;
    }

    pub fn set_limit(&mut self, limit: Option<u64>) {
        self.limit = limit;
    }
}

/// The driver allocates in pages: the bytes `cuMemGetInfo`'s free figure drops by for one
/// allocation of `bytes` lie within a page of `bytes` (rounded up to whole pages, or less
/// when a small allocation lands in a page the driver already holds); the cross-check
/// accepts one page of slack per allocation, either way.
pub fn driver_slack(allocations: u64, granularity: u64) -> u64 {
    allocations * granularity
}

/// Whether the driver's used-memory delta agrees with the allocator's count.
pub fn agrees(counted: u64, driver_delta: u64, allocations: u64, granularity: u64) -> bool {
    driver_delta.abs_diff(counted) <= driver_slack(allocations, granularity)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_tracks_the_high_water_mark_since_reset() {
        let mut c = Counter::default();
        c.reserve(100).unwrap();
        c.reserve(50).unwrap();
        c.release(50);
        assert_eq!((c.live(), c.peak()), (100, 150));
        c.reset_peak();
        assert_eq!(c.peak(), 100);
        c.reserve(30).unwrap();
        c.release(30);
        // The overhead: peak minus what was live when it started.
        assert_eq!(c.peak() - 100, 30);
        assert_eq!(c.allocations(), 3);
    }

    #[test]
    fn the_limit_refuses_without_changing_the_count() {
        let mut c = Counter::default();
        c.set_limit(Some(100));
        c.reserve(60).unwrap();
        let e = c.reserve(41).unwrap_err();
        assert_eq!(
            e,
            OverLimit {
                live: 60,
                requested: 41,
                limit: 100
            }
        );
        assert_eq!((c.live(), c.peak()), (60, 60));
        c.reserve(40).unwrap();
        c.set_limit(None);
        c.reserve(1 << 40).unwrap();
    }

    #[test]
    fn driver_cross_check_allows_page_rounding_only() {
        let g = 2 << 20;
        assert!(agrees(3 << 20, 4 << 20, 1, g));
        assert!(agrees(3 << 20, 3 << 20, 1, g));
        // A small allocation inside a page the driver already held.
        assert!(agrees(1 << 10, 0, 1, g));
        assert!(!agrees(3 << 20, 0, 1, g));
        assert!(!agrees(1 << 20, 8 << 20, 2, g));
        assert!(agrees(1 << 20, 4 << 20, 2, g));
        // No allocation: the driver's figure must not move more than nothing.
        assert!(agrees(0, 0, 0, g));
        assert!(!agrees(0, 1, 0, g));
    }
}
