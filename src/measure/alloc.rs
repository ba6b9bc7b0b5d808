//! Counting global allocator: exact live and peak heap bytes of the process (the memory
//! meter) and an emulated memory budget; costs two or three relaxed atomics per allocation.
//!
//! Bytes are counted as requested (`Layout::size`), not as the system allocator rounds them,
//! so the figures are the algorithm's own and do not depend on the libc in use.
//!
//! # Memory budget
//!
//! With [`set_limit`] an allocation (or a growing `realloc`) of at least
//! [`LARGE_ALLOCATION_BYTES`] that would raise the live bytes above the limit returns null.
//! Fallible requests (`Vec::try_reserve_exact`) then report an error that the caller turns
//! into an `oom` record. Smaller requests are always served, because an infallible small
//! allocation that fails aborts the process. Consequently **every large allocation made
//! while a limit is set must be fallible**: an infallible one (`vec![0.0; n]`) that is
//! refused aborts through `handle_alloc_error`.
//!
//! # Concurrency
//!
//! The counters are process-wide: everything every thread allocates is counted, so a meter
//! measures one call only if nothing else allocates meanwhile (the runner measures one case
//! at a time). Tests that assert on the meter or set a limit run alone in their own test binary
//! (`tests/alloc_exact.rs`, `tests/memory.rs`); unit tests that run cases hold [`test_lock`].

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

/// Requests of at least this many bytes are subject to the memory budget.
pub const LARGE_ALLOCATION_BYTES: u64 = 1 << 20;

/// `Counters::limit` value meaning "no limit".
const NO_LIMIT: u64 = u64::MAX;

/// The bookkeeping, kept apart from the allocator so tests can exercise it on a private
/// instance with exact byte counts.
struct Counters {
    current: AtomicU64,
    peak: AtomicU64,
    limit: AtomicU64,
}

impl Counters {
    const fn new() -> Counters {
        Counters {
            current: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            limit: AtomicU64::new(NO_LIMIT),
        }
    }

    /// Adds `bytes` to the live count for a block whose size becomes `final_size`
    /// (`bytes < final_size` for a growing realloc). Returns false, changing nothing, when
    /// the budget refuses it.
    #[inline]
    fn reserve(&self, bytes: u64, final_size: u64) -> bool {
        let limit = self.limit.load(Relaxed);
        if limit == NO_LIMIT || final_size < LARGE_ALLOCATION_BYTES {
            let now = self.current.fetch_add(bytes, Relaxed) + bytes;
            self.peak.fetch_max(now, Relaxed);
            return true;
        }
        // A CAS loop so that two threads cannot both pass the check and overshoot together.
        let mut cur = self.current.load(Relaxed);
        loop {
            let now = match cur.checked_add(bytes) {
                Some(n) if n <= limit => n,
                _ => return false,
            };
            match self
                .current
                .compare_exchange_weak(cur, now, Relaxed, Relaxed)
            {
                Ok(_) => {
                    self.peak.fetch_max(now, Relaxed);
                    return true;
                }
                Err(actual) => cur = actual,
            }
        }
    }

    #[inline]
    fn release(&self, bytes: u64) {
        self.current.fetch_sub(bytes, Relaxed);
    }

    fn reset_peak(&self) {
        self.peak.store(self.current.load(Relaxed), Relaxed);
    }
}

static COUNTERS: Counters = Counters::new();

/// Blocks of at least this many bytes start on a cache line ([`LARGE_ALIGN`]).
pub const ALIGN_FROM_BYTES: usize = 4096;

/// The alignment of large blocks: a cache line, which is also a whole AVX-512 vector.
pub const LARGE_ALIGN: usize = 64;

/// The layout a block is served with: large blocks aligned to a cache line. The system
/// allocator returns 16-byte aligned memory, and for large blocks (served by `mmap`) 16
/// bytes past a page; an f32 input tensor read in place by the kernels (V in `P V`) then
/// has every 64-byte vector load split across two cache lines.
#[inline]
fn served(layout: Layout) -> Layout {
    if layout.size() >= ALIGN_FROM_BYTES && layout.align() < LARGE_ALIGN {
        // A size too close to isize::MAX to round up to a cache line keeps its layout (no
        // allocator could serve it anyway).
        Layout::from_size_align(layout.size(), LARGE_ALIGN).unwrap_or(layout)
    } else {
        layout
    }
}

/// The process's global allocator (declared in `lib.rs`): `System`, counted, with large
/// blocks aligned to a cache line ([`served`]).
pub struct CountingAllocator;

unsafe impl GlobalAlloc for CountingAllocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let size = layout.size() as u64;
        if !COUNTERS.reserve(size, size) {
            return std::ptr::null_mut();
        }
        let p = System.alloc(served(layout));
        if p.is_null() {
            COUNTERS.release(size);
        }
        p
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let size = layout.size() as u64;
        if !COUNTERS.reserve(size, size) {
            return std::ptr::null_mut();
        }
        let p = System.alloc_zeroed(served(layout));
        if p.is_null() {
            COUNTERS.release(size);
        }
        p
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, served(layout));
        COUNTERS.release(layout.size() as u64);
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = layout.size() as u64;
        let new = new_size as u64;
        if new > old {
            // Growth is budgeted by the final size: a Vec that grows past the limit fails
            // exactly as one allocated at that size would.
            let grow = new - old;
            if !COUNTERS.reserve(grow, new) {
                return std::ptr::null_mut();
            }
            let p = realloc_served(ptr, layout, new_size);
            if p.is_null() {
                COUNTERS.release(grow);
            }
            p
        } else {
            let p = realloc_served(ptr, layout, new_size);
            if !p.is_null() {
                COUNTERS.release(old - new);
            }
            p
        }
    }
}

/// `System.realloc` of a block served as `served(layout)` to `new_size` bytes, served as
/// `served` of the new layout: when the two alignments differ (the block crosses
/// [`ALIGN_FROM_BYTES`]), a new block, a copy and a free.
///
/// # Safety
/// As `GlobalAlloc::realloc`.
unsafe fn realloc_served(ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
    let old = served(layout);
    // SAFETY (caller): `new_size` rounded up to the alignment does not overflow isize.
    let new = served(Layout::from_size_align_unchecked(new_size, layout.align()));
    if old.align() == new.align() {
        return System.realloc(ptr, old, new_size);
    }
    let p = System.alloc(new);
    if !p.is_null() {
        std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
        System.dealloc(ptr, old);
    }
    p
}

/// Heap bytes live now (whole process).
pub fn current_bytes() -> u64 {
    COUNTERS.current.load(Relaxed)
}

/// High-water mark of [`current_bytes`] since the last [`reset_peak`] (or process start).
pub fn peak_bytes() -> u64 {
    COUNTERS.peak.load(Relaxed)
}

/// Restarts the high-water mark from the bytes live now.
pub fn reset_peak() {
    COUNTERS.reset_peak();
}

/// Sets (or with `None` removes) the memory budget in live heap bytes; see the module doc.
/// The budget counts everything live in the process, inputs and outputs included.
pub fn set_limit(limit: Option<u64>) {
    COUNTERS.limit.store(limit.unwrap_or(NO_LIMIT), Relaxed);
}

/// The memory budget now in force, if any.
pub fn limit() -> Option<u64> {
    match COUNTERS.limit.load(Relaxed) {
        NO_LIMIT => None,
        l => Some(l),
    }
}

/// Measures the peak heap overhead of whatever runs between [`OverheadMeter::start`] and
/// [`OverheadMeter::finish`]: the peak live bytes minus the bytes live at `start`.
///
/// Everything allocated before `start` and still live (inputs, the output buffer) is in the
/// baseline and so excluded, which is exactly the paper's "peak bytes during the call minus
/// its inputs and outputs" when inputs and outputs are allocated before the meter starts.
/// Starting a meter resets the process-wide peak, so meters do not nest.
#[derive(Debug)]
#[must_use = "call finish() to read the overhead"]
pub struct OverheadMeter {
    baseline: u64,
}

impl OverheadMeter {
    /// Records the live bytes as the baseline and resets the peak.
    pub fn start() -> OverheadMeter {
        let baseline = current_bytes();
        reset_peak();
        OverheadMeter { baseline }
    }

    /// Bytes live at `start`.
    pub fn baseline(&self) -> u64 {
        self.baseline
    }

    /// Peak live bytes since `start`, minus the baseline.
    pub fn finish(self) -> u64 {
        peak_bytes().saturating_sub(self.baseline)
    }
}

static TEST_LOCK: Mutex<()> = Mutex::new(());

/// Serializes tests that touch the process-wide counters (set a limit, or assert on a
/// meter): tests of one binary run on parallel threads. Not for use outside tests (it is
/// not reentrant). A poisoned lock is recovered, so one failed test does not fail others.
#[doc(hidden)]
pub fn test_lock() -> MutexGuard<'static, ()> {
    TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn counters_track_live_and_peak_exactly() {
        let c = Counters::new();
        assert!(c.reserve(100, 100));
        assert!(c.reserve(50, 50));
        c.release(100);
        assert_eq!(c.current.load(Relaxed), 50);
        assert_eq!(c.peak.load(Relaxed), 150);
        c.reset_peak();
        assert_eq!(c.peak.load(Relaxed), 50);
        assert!(c.reserve(10, 10));
        assert_eq!(c.peak.load(Relaxed), 60);
    }

    #[test]
    fn counters_budget_only_large_requests() {
        let c = Counters::new();
        c.limit.store(3 * MIB, Relaxed);
        assert!(c.reserve(2 * MIB, 2 * MIB));
        // Over the budget: a large request is refused and changes nothing...
        assert!(!c.reserve(2 * MIB, 2 * MIB));
        assert_eq!(c.current.load(Relaxed), 2 * MIB);
        assert_eq!(c.peak.load(Relaxed), 2 * MIB);
        // ...a small growth of a block that ends up large is refused too...
        assert!(!c.reserve(MIB + 1, 2 * MIB));
        // ...while small requests are always served, even past the limit.
        assert!(c.reserve(MIB - 1, MIB - 1));
        assert!(c.reserve(MIB - 1, MIB - 1));
        assert_eq!(c.current.load(Relaxed), 4 * MIB - 2);
        // Exactly at the limit is allowed.
        let c = Counters::new();
        c.limit.store(MIB, Relaxed);
        assert!(c.reserve(MIB, MIB));
    }

    #[test]
    fn large_blocks_start_on_a_cache_line_through_every_realloc() {
        let aligned = |v: &Vec<f32>| (v.as_ptr() as usize).is_multiple_of(LARGE_ALIGN);
        // Large blocks (mmap'd by glibc, 16 bytes past a page without the rule) are aligned.
        for n in [ALIGN_FROM_BYTES / 4, 1 << 18, 1 << 20] {
            let v: Vec<f32> = std::hint::black_box(vec![1.0; n]);
            assert!(aligned(&v), "{n} floats at {:p}", v.as_ptr());
        }
        // A block that grows across the threshold, and stays large, keeps its values and
        // gets the alignment; shrunk below it, it still keeps its values.
        let mut v: Vec<f32> = (0..100).map(|i| i as f32).collect();
        for cap in [ALIGN_FROM_BYTES / 4 + 1, 1 << 16, 1 << 20] {
            v.reserve_exact(cap - v.len());
            assert!(aligned(&v), "capacity {}", v.capacity());
            assert!(v.iter().enumerate().all(|(i, x)| *x == i as f32));
        }
        v.shrink_to_fit();
        assert_eq!(v.capacity(), 100);
        assert!(v.iter().enumerate().all(|(i, x)| *x == i as f32));
        // The layout served: small or already over-aligned requests are left alone.
        let l = |size, align| served(Layout::from_size_align(size, align).unwrap());
        assert_eq!(l(ALIGN_FROM_BYTES, 4).align(), LARGE_ALIGN);
        assert_eq!(l(ALIGN_FROM_BYTES - 1, 4).align(), 4);
        assert_eq!(l(ALIGN_FROM_BYTES, 4096).align(), 4096);
        assert_eq!(l(ALIGN_FROM_BYTES, 4).size(), ALIGN_FROM_BYTES);
        assert_eq!(l(isize::MAX as usize - 3, 4).align(), 4);
    }
}
