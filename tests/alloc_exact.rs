//! Exact byte counts of the counting allocator and its budget. One `#[test]` in its own
//! binary: with any other test (or the harness's output capture) running on another thread,
//! an allocation or free between a meter's baseline and its peak would shift the figure, a
//! meter's start would reset another's peak, and a budget would refuse another test's block.

use attnbench::measure::alloc;
use attnbench::measure::calibrate::calibrate_with;

#[test]
fn exact_allocation_accounting() {
    meter_sees_a_large_block();
    meter_excludes_what_was_live_before_start();
    global_limit_refuses_large_fallible_requests();
    realloc_growth_is_counted();
    block_bookkeeping_allocates_what_predictions_count();
    a_calibration_leaves_no_thread_behind();
}

const MIB: u64 = 1 << 20;

fn meter_sees_a_large_block() {
    let meter = alloc::OverheadMeter::start();
    let block: Vec<u8> = std::hint::black_box(Vec::with_capacity(64 * MIB as usize));
    let live = alloc::current_bytes();
    drop(block);
    let overhead = meter.finish();
    assert!(overhead >= 64 * MIB, "overhead {overhead}");
    assert!(alloc::peak_bytes() >= live);
}

fn meter_excludes_what_was_live_before_start() {
    let before: Vec<u8> = std::hint::black_box(Vec::with_capacity(64 * MIB as usize));
    let meter = alloc::OverheadMeter::start();
    assert!(meter.baseline() >= 64 * MIB);
    let small: Vec<u8> = std::hint::black_box(Vec::with_capacity(1024));
    drop(small);
    let overhead = meter.finish();
    assert!(overhead < 64 * MIB, "overhead {overhead}");
    drop(before);
}

/// Restores "no limit" even if the check panics.
struct LimitGuard;
impl Drop for LimitGuard {
    fn drop(&mut self) {
        alloc::set_limit(None);
    }
}

fn global_limit_refuses_large_fallible_requests() {
    let _restore = LimitGuard;
    let headroom = 256 * MIB;
    alloc::set_limit(Some(alloc::current_bytes() + headroom));
    assert!(alloc::limit().is_some());

    let mut ok: Vec<u8> = std::hint::black_box(Vec::new());
    assert!(ok.try_reserve_exact(64 * MIB as usize).is_ok());
    drop(ok);

    let mut too_big: Vec<u8> = Vec::new();
    assert!(too_big.try_reserve_exact(2 * headroom as usize).is_err());

    // Growing past the limit fails and leaves the block as it was.
    let mut grow: Vec<u8> = vec![7; 2 * MIB as usize];
    assert!(grow.try_reserve_exact(2 * headroom as usize).is_err());
    assert_eq!(grow.len(), 2 * MIB as usize);
    assert!(grow.iter().all(|&b| b == 7));
    drop(grow);

    alloc::set_limit(None);
    assert_eq!(alloc::limit(), None);
}

/// Growing a block in place (realloc) is counted by its growth.
fn realloc_growth_is_counted() {
    const MIB: usize = 1 << 20;
    let meter = alloc::OverheadMeter::start();
    // black_box: in release builds unused allocations may be elided.
    let mut v: Vec<u8> = std::hint::black_box(Vec::with_capacity(8 * MIB));
    v.reserve_exact(40 * MIB);
    let v = std::hint::black_box(v);
    let cap = v.capacity() as u64;
    drop(v);
    // The test harness's own threads allocate and free small buffers (output capture) at
    // any moment, so the figure can fall short of `cap` by a few KiB; growth that was not
    // counted would read 8 MiB, far below this bound.
    let seen = meter.finish();
    assert!(
        seen + (1 << 20) >= cap,
        "meter saw {seen} of a {cap}-byte block"
    );
}

/// The per-block lists kernels build (split outputs, locked accumulation blocks) allocate
/// exactly what the predictions count for them.
fn block_bookkeeping_allocates_what_predictions_count() {
    use attnbench::backend::cpu::blocks::{head_row_blocks, split_bytes, LockedBlocks};
    let (heads, rows, width, block) = (3usize, 1000usize, 8, 7);
    let blocks = heads * rows.div_ceil(block);
    let mut a = vec![0.0f32; heads * rows * width];
    let mut b = vec![0.0f32; heads * rows * width];
    let meter = alloc::OverheadMeter::start();
    let split = head_row_blocks(&mut a, rows, width, block);
    assert_eq!(split.len(), blocks);
    drop(split);
    assert_eq!(meter.finish(), split_bytes(blocks));
    for second in [false, true] {
        let meter = alloc::OverheadMeter::start();
        let locked = LockedBlocks::new(&mut a, second.then_some(&mut b[..]), rows, width, block);
        locked.add(blocks - 1, &[&[1.0; 8], &[1.0; 8]]);
        drop(locked);
        assert_eq!(meter.finish(), LockedBlocks::bytes(blocks));
    }
    // The last block holds the last 1000 % 7 = 6 rows; `add` filled its first 8 values.
    let last = a.len() - (rows % block) * width;
    assert_eq!(a[last..last + 8], [2.0; 8]);
    assert_eq!(b[last..last + 8], [1.0; 8]);
    assert_eq!(a[last + 8..], [0.0; 40]);
}

/// A calibration leaves no thread behind that allocates or frees later: a sweep counts its
/// first cases right after it, and with a pool of its own, dropped on return, its threads
/// were still exiting then (each pushing a 2072-byte block of deferred frees to crossbeam's
/// epoch collector, freed in turn whenever a later call collects it).
fn a_calibration_leaves_no_thread_behind() {
    let threads = || std::fs::read_dir("/proc/self/task").map(|d| d.count()).ok();
    std::hint::black_box(calibrate_with(3, 16, 64 << 10));
    let (live, running) = (alloc::current_bytes(), threads());
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(
        threads(),
        running,
        "a calibration thread exited after returning"
    );
    assert_eq!(
        alloc::current_bytes(),
        live,
        "bytes freed or allocated after"
    );
}
