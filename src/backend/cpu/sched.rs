//! Work distribution of the forward kernels: `workers` rayon tasks (one per workspace
//! buffer) take work items from a shared counter, so a worker that finishes early takes the
//! next item instead of idling (dynamic scheduling). Callers map the counter to items in
//! order of decreasing cost (for causal masks: the query blocks that see the most keys
//! first), which keeps the two halves of a causal problem within one small item of each
//! other. O(items) atomic flags of bookkeeping, no per-item allocation.
//!
//! A kernel whose work comes in dependent phases (Rabe–Staats: pack a key chunk, then
//! summarize the query chunk's strips against it, ...) runs them in one parallel region
//! ([`team`]): every thread of the pool runs the same sequence of phases, sharing each
//! phase's items, with a spinning barrier between phases. A phase boundary then costs a
//! few hundred nanoseconds instead of putting the other threads to sleep and waking them
//! (tens of microseconds each on a virtual machine, more than a small phase's work).

use std::cell::Cell;
use std::marker::PhantomData;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

use rayon::prelude::*;

use super::workspace::Workspace;

/// Runs `f(i)` for every `i` in `0..n`, each exactly once, on up to all the pool's threads,
/// `i` handed out in increasing order (items that need no scratch of their own: the strips
/// of a shared chunk buffer).
pub fn for_each_index(n: usize, f: impl Fn(usize) + Sync) {
    let next = AtomicUsize::new(0);
    let workers = rayon::current_num_threads().min(n);
    (0..workers).into_par_iter().for_each(|_| loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= n {
            break;
        }
        f(i);
    });
}

/// Runs `f(scratch, i)` for every `i` in `0..n`, each exactly once, on up to
/// `ws.workers()` workers; `i` is handed out in increasing order.
pub fn for_each_item(ws: &Workspace, n: usize, f: impl Fn(&mut [f32], usize) + Sync) {
    for_each_item_with(ws, n, |buf, _: &mut (), i| f(buf, i));
}

/// [`for_each_item`] with a per-worker state `S` (starting at `S::default()`, kept across
/// the worker's items): what its scratch currently holds, e.g. which head's K^T is packed.
pub fn for_each_item_with<S: Default>(
    ws: &Workspace,
    n: usize,
    f: impl Fn(&mut [f32], &mut S, usize) + Sync,
) {
    let next = AtomicUsize::new(0);
    let workers = ws.workers().min(n);
    (0..workers).into_par_iter().for_each(|_| {
        let mut buf = ws.acquire();
        let mut state = S::default();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                break;
            }
            f(&mut buf, &mut state, i);
        }
    });
}

/// How long a worker spins at a barrier before it sleeps when the region has more workers
/// than the machine has cores: a barrier's usual wait is the other workers' last item, but
/// a worker the machine has descheduled can take milliseconds, and a spinning worker would
/// keep its core from the very worker it waits for.
const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(50);

/// The spin when every worker can have a core of its own: a sleeping vCPU has to be woken
/// by the host, which takes milliseconds when the host is busy (on the Zen 5, rabe-staats
/// bf16 h = 8, d = 64, n = 8192 on 2 threads slept 9 to 301 times in 6 calls, up to 7% of
/// its time), while spinning costs only a core nothing else of the region needs.
const SPIN_OWN_CORES: Duration = Duration::from_millis(2);

/// How long workers of a region of `size` spin at a barrier before they sleep.
fn spin_limit(size: usize) -> Duration {
    static CORES: OnceLock<usize> = OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if size <= cores {
        SPIN_OWN_CORES
    } else {
        SPIN_BEFORE_SLEEP
    }
}

/// The shared state of a parallel region ([`team`]).
struct TeamState {
    size: usize,
    /// How long a waiting worker spins before it sleeps ([`spin_limit`]).
    spin: Duration,
    /// Item counters of even and odd phases: the last worker to reach a phase's barrier
    /// resets that phase's counter for the phase after next.
    next: [AtomicUsize; 2],
    arrived: AtomicUsize,
    generation: AtomicUsize,
    /// Set when a worker panicked, so the others leave their barriers instead of waiting.
    poisoned: AtomicBool,
    /// Workers sleeping at a barrier wait on `wake` under `lock`.
    lock: Mutex<()>,
    wake: Condvar,
    sleepers: AtomicUsize,
}

impl TeamState {
    /// Wakes the sleeping workers (after `generation` or `poisoned` changed).
    fn wake_all(&self) {
        // Under the lock: a worker that checked the state under it and is about to wait
        // cannot miss this notification.
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.sleepers.load(Ordering::Acquire) > 0 {
            self.wake.notify_all();
        }
    }

    /// Waits until `generation` moves past `seen`: spinning first, then sleeping.
    fn wait(&self, seen: usize) {
        let open = || self.generation.load(Ordering::Acquire) != seen;
        let check_poison = || {
            if self.poisoned.load(Ordering::Acquire) {
                panic!("another worker of the parallel region panicked");
            }
        };
        let start = std::time::Instant::now();
        let mut spins = 0u32;
        while !open() {
            check_poison();
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) && start.elapsed() > self.spin {
                let mut g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
                self.sleepers.fetch_add(1, Ordering::AcqRel);
                while !open() && !self.poisoned.load(Ordering::Acquire) {
                    g = self.wake.wait(g).unwrap_or_else(|e| e.into_inner());
                }
                self.sleepers.fetch_sub(1, Ordering::AcqRel);
                drop(g);
                check_poison();
                return;
            }
        }
    }
}

/// One worker's handle in a parallel region: every worker calls the same sequence of
/// [`Member::for_each`] (the phases), so they agree on the phase numbers.
pub struct Member<'t> {
    team: &'t TeamState,
    index: usize,
    phase: Cell<usize>,
}

/// The phase an item runs in, and which worker runs it: buffers handed out per phase
/// ([`Blocks::take_in`]) or per item ([`Blocks::take_own`]) borrow it, so nothing an item
/// takes outlives the item.
pub struct Phase {
    id: usize,
    worker: usize,
    item: usize,
}

/// Runs `f` once on every thread of the current pool, all at the same time (a parallel
/// region); inside, [`Member::for_each`] shares out one phase's items. A panic in one
/// worker ends every worker's region and is propagated. Call it from a kernel's top level,
/// never from inside another parallel loop of the same pool: two regions waiting at their
/// barriers for each other's threads would never finish.
pub fn team(f: impl Fn(&Member) + Sync) {
    let size = rayon::current_num_threads();
    let state = TeamState {
        size,
        spin: spin_limit(size),
        next: [AtomicUsize::new(0), AtomicUsize::new(0)],
        arrived: AtomicUsize::new(0),
        generation: AtomicUsize::new(0),
        poisoned: AtomicBool::new(false),
        lock: Mutex::new(()),
        wake: Condvar::new(),
        sleepers: AtomicUsize::new(0),
    };
    rayon::broadcast(|ctx| {
        let member = Member {
            team: &state,
            index: ctx.index(),
            phase: Cell::new(0),
        };
        if let Err(e) = catch_unwind(AssertUnwindSafe(|| f(&member))) {
            state.poisoned.store(true, Ordering::Release);
            state.wake_all();
            resume_unwind(e);
        }
    });
}

impl Member<'_> {
    /// Runs `f(phase, i)` for every `i` in `0..n`, each exactly once on some worker of the
    /// region, `i` handed out in increasing order; returns when every worker has finished
    /// the phase, so what the phase wrote is visible to all in the next.
    pub fn for_each(&self, n: usize, f: impl Fn(&Phase, usize)) {
        let id = self.phase.get();
        self.phase.set(id + 1);
        let t = self.team;
        let next = &t.next[id % 2];
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                break;
            }
            let phase = Phase {
                id,
                worker: self.index,
                item: i,
            };
            f(&phase, i);
        }
        // Barrier. Arriving releases this worker's writes; the last to arrive resets the
        // phase's counter and opens the barrier (releasing all of them to the others).
        let generation = t.generation.load(Ordering::Acquire);
        if t.arrived.fetch_add(1, Ordering::AcqRel) + 1 == t.size {
            t.arrived.store(0, Ordering::Relaxed);
            next.store(0, Ordering::Relaxed);
            t.generation.store(generation + 1, Ordering::Release);
            t.wake_all();
            return;
        }
        t.wait(generation);
    }
}

/// The (head, row block) blocks of a `[heads, rows, width]` buffer, each handed out at most
/// once ([`Blocks::take`]) or at most once per phase of a parallel region
/// ([`Blocks::take_in`]), to whichever worker runs its item.
pub struct Blocks<'a> {
    ptr: *mut f32,
    rows: usize,
    width: usize,
    block: usize,
    per_head: usize,
    /// Per block: 0 if never taken, [`TAKEN_FOR_GOOD`] after `take`, 1 + the id of the
    /// last phase that took it by `take_in`, or that in the high half and 1 + the item in
    /// the low half after `take_own`.
    taken: Vec<AtomicUsize>,
    _buf: PhantomData<&'a mut [f32]>,
}

/// `Blocks::taken` of a block handed out by `take` (outside any phase).
const TAKEN_FOR_GOOD: usize = usize::MAX;

/// Whether a block whose `taken` is `flag` was handed out in `phase`: by `take_in` (flag
/// 1 + phase id) or to one of its items by `take_own` (the same in the flag's high half).
fn taken_in(flag: usize, phase: &Phase) -> bool {
    flag != TAKEN_FOR_GOOD && (flag == phase.id + 1 || flag >> 32 == phase.id + 1)
}

// SAFETY: `Blocks` only hands out disjoint sub-slices of the buffer it borrows mutably, each
// at most once (the `taken` flags), so sharing it between threads cannot create aliasing
// mutable references.
unsafe impl Send for Blocks<'_> {}
// SAFETY: as above.
unsafe impl Sync for Blocks<'_> {}

impl<'a> Blocks<'a> {
    pub fn new(buf: &'a mut [f32], rows: usize, width: usize, block: usize) -> Blocks<'a> {
        let block = block.max(1);
        let per_head = rows.div_ceil(block);
        let heads = buf.len().checked_div(rows * width).unwrap_or(0);
        Blocks {
            ptr: buf.as_mut_ptr(),
            rows,
            width,
            block,
            per_head,
            taken: (0..heads * per_head).map(|_| AtomicUsize::new(0)).collect(),
            _buf: PhantomData,
        }
    }

    /// Block `blk` of head `head` (`block` rows, the last of a head may be short).
    /// Panics if it was taken before.
    pub fn take(&self, head: usize, blk: usize) -> &'a mut [f32] {
        let index = self.index(head, blk);
        assert!(
            self.taken[index].swap(TAKEN_FOR_GOOD, Ordering::AcqRel) != TAKEN_FOR_GOOD,
            "block ({head}, {blk}) handed out twice"
        );
        // SAFETY: the block is in bounds (`index`) and was never handed out before (the
        // flag), so no other live reference overlaps it.
        unsafe { self.slice(head, blk) }
    }

    /// Block `blk` of head `head` for one item of `phase`: the same block may be taken
    /// again in a later phase, by any worker. Panics if it was taken before in this phase.
    // The block is borrowed from the buffer `Blocks` holds mutably; its exclusivity is the
    // per-phase flag, as for `take`.
    #[allow(clippy::mut_from_ref)]
    pub fn take_in<'p>(&'p self, phase: &'p Phase, head: usize, blk: usize) -> &'p mut [f32] {
        let index = self.index(head, blk);
        let prev = self.taken[index].swap(phase.id + 1, Ordering::AcqRel);
        assert!(
            !taken_in(prev, phase) && prev != TAKEN_FOR_GOOD,
            "block ({head}, {blk}) handed out twice in phase {}",
            phase.id
        );
        // SAFETY: in bounds (`index`); handed out once in this phase (the flag), and a block
        // taken in an earlier phase was borrowed for that phase's item only (`'p`), which
        // returned before the barrier that ends the phase.
        unsafe { self.slice(head, blk) }
    }

    /// Block `worker` (of head 0) for the item of `phase` that runs on that worker: a
    /// worker's own slot, which each of its items may take once.
    // As `take_in`: exclusivity is the per-item stamp (one worker runs one item at a time).
    #[allow(clippy::mut_from_ref)]
    pub fn take_own<'p>(&'p self, phase: &'p Phase) -> &'p mut [f32] {
        let index = self.index(0, phase.worker);
        let stamp = ((phase.id + 1) << 32) | (phase.item + 1);
        let prev = self.taken[index].swap(stamp, Ordering::AcqRel);
        assert!(
            prev != stamp && prev != phase.id + 1 && prev != TAKEN_FOR_GOOD,
            "worker {}'s block handed out twice in one item, or also by take_in, in phase {}",
            phase.worker,
            phase.id
        );
        // SAFETY: in bounds (`index`); block `worker` is taken only by that worker's items
        // (`take_in` in the same phase would have left `phase.id + 1`, checked), once per
        // item (the stamp), and each item's borrow ends with the item (`'p`).
        unsafe { self.slice(0, phase.worker) }
    }

    /// The whole buffer to read in `phase`, which takes none of its blocks: what earlier
    /// phases wrote (packed operand tiles, shared by every item of the phase). Panics if a
    /// block was taken in this phase before.
    pub fn view_in<'p>(&'p self, phase: &'p Phase) -> &'p [f32] {
        assert!(
            self.taken
                .iter()
                .all(|t| !taken_in(t.load(Ordering::Acquire), phase)),
            "buffer viewed in phase {} that writes it",
            phase.id
        );
        let len = self.taken.len() / self.per_head.max(1) * self.rows * self.width;
        // SAFETY: the buffer holds heads * rows * width floats; the phase writes none of it
        // (checked), and writes of earlier phases ended at their barriers.
        unsafe { std::slice::from_raw_parts(self.ptr, len) }
    }

    fn index(&self, head: usize, blk: usize) -> usize {
        assert!(blk < self.per_head, "row block {blk} out of range");
        let index = head * self.per_head + blk;
        assert!(index < self.taken.len(), "head {head} out of range");
        index
    }

    /// # Safety
    /// `(head, blk)` is in range and no other live reference overlaps the block.
    unsafe fn slice(&self, head: usize, blk: usize) -> &'a mut [f32] {
        let row0 = blk * self.block;
        let rows = self.block.min(self.rows - row0);
        let start = (head * self.rows + row0) * self.width;
        // SAFETY: head < heads, so start + rows * width is within the borrowed buffer;
        // exclusivity is the caller's.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), rows * self.width) }
    }
}

/// A `[rows, width]` buffer handed out, in each phase of a parallel region, as the blocks
/// of `block` rows of one window of rows (the query chunk the phase works on): each block
/// at most once per phase. Its bookkeeping is one window's blocks, whatever the size of the
/// buffer.
pub struct Windows<'a> {
    ptr: *mut f32,
    rows: usize,
    width: usize,
    block: usize,
    /// The window of the phase that last took a block: (1 + phase id) << 32 | first row.
    window: AtomicU64,
    /// Per block of a window: 1 + the id of the last phase that took it.
    taken: Vec<AtomicUsize>,
    _buf: PhantomData<&'a mut [f32]>,
}

// SAFETY: as for `Blocks`: only disjoint sub-slices are handed out, each once per phase,
// all within one window per phase (checked).
unsafe impl Send for Windows<'_> {}
// SAFETY: as above.
unsafe impl Sync for Windows<'_> {}

impl<'a> Windows<'a> {
    /// `buf` holds rows of `width` floats; windows have at most `window_rows` rows.
    pub fn new(buf: &'a mut [f32], width: usize, block: usize, window_rows: usize) -> Windows<'a> {
        let block = block.max(1);
        Windows {
            ptr: buf.as_mut_ptr(),
            rows: buf.len().checked_div(width).unwrap_or(0),
            width,
            block,
            window: AtomicU64::new(0),
            taken: (0..window_rows.div_ceil(block))
                .map(|_| AtomicUsize::new(0))
                .collect(),
            _buf: PhantomData,
        }
    }

    /// Block `blk` of the window of `rows` rows from `row0`, for one item of `phase`.
    /// Panics if the block was taken before in this phase, or if the phase took blocks of
    /// another window.
    // As `Blocks::take_in`: exclusivity is the per-phase flag.
    #[allow(clippy::mut_from_ref)]
    pub fn take_in<'p>(
        &'p self,
        phase: &'p Phase,
        row0: usize,
        rows: usize,
        blk: usize,
    ) -> &'p mut [f32] {
        assert!(row0 + rows <= self.rows, "window out of bounds");
        assert!(
            blk * self.block < rows && blk < self.taken.len(),
            "block {blk} out of range"
        );
        let stamp = ((phase.id as u64 + 1) << 32) | row0 as u64;
        let mut seen = self.window.load(Ordering::Acquire);
        while seen >> 32 != phase.id as u64 + 1 {
            match self
                .window
                .compare_exchange(seen, stamp, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => seen = stamp,
                Err(now) => seen = now,
            }
        }
        assert_eq!(seen, stamp, "two windows in phase {}", phase.id);
        let prev = self.taken[blk].swap(phase.id + 1, Ordering::AcqRel);
        assert!(
            prev != phase.id + 1,
            "block {blk} handed out twice in phase {}",
            phase.id
        );
        let first = row0 + blk * self.block;
        let n = self.block.min(row0 + rows - first);
        // SAFETY: rows first..first + n lie in the buffer (checked); in this phase only this
        // window's blocks are handed out, each once (checked), and blocks of earlier phases
        // were borrowed for their items only (`'p`), which ended at the phase barrier.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(first * self.width), n * self.width) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn every_item_runs_once_and_blocks_cover_the_buffer() {
        let ws = Workspace::new(2, 4, "test").unwrap();
        let mut buf = vec![0.0f32; 2 * 5 * 3];
        let seen = Mutex::new(Vec::new());
        {
            let blocks = Blocks::new(&mut buf, 5, 3, 2);
            for_each_item(&ws, 6, |_, i| {
                let b = blocks.take(i / 3, i % 3);
                b.fill(i as f32 + 1.0);
                seen.lock().unwrap().push(i);
            });
        }
        let mut seen = seen.into_inner().unwrap();
        seen.sort();
        assert_eq!(seen, (0..6).collect::<Vec<_>>());
        assert_eq!(buf[0], 1.0);
        assert_eq!(buf[12], 3.0); // head 0, rows 4..5
        assert_eq!(buf[15], 4.0); // head 1, row 0
        assert!(buf.iter().all(|x| *x > 0.0));
    }

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
    }

    #[test]
    fn a_team_runs_every_item_of_every_phase_once_after_the_phase_before() {
        const PHASES: usize = 40;
        for threads in [1, 2, 3] {
            let rows = 7;
            let mut a: Vec<f32> = (0..rows).map(|i| i as f32).collect();
            let mut b = vec![0.0f32; rows];
            let runs = AtomicUsize::new(0);
            {
                let (a, b) = (
                    Blocks::new(&mut a, rows, 1, 1),
                    Blocks::new(&mut b, rows, 1, 1),
                );
                pool(threads).install(|| {
                    team(|t| {
                        // Phase k: row i of one buffer becomes 1 + row i + 1 of the other,
                        // which the previous phase wrote: right only if every item of the
                        // previous phase finished first.
                        for k in 0..PHASES {
                            let (src, dst) = if k % 2 == 0 { (&a, &b) } else { (&b, &a) };
                            t.for_each(rows, |ph, i| {
                                // Uneven items, so the workers arrive at different times.
                                for _ in 0..(i * 997 % 5000) {
                                    std::hint::spin_loop();
                                }
                                dst.take_in(ph, 0, i)[0] = src.view_in(ph)[(i + 1) % rows] + 1.0;
                                runs.fetch_add(1, Ordering::Relaxed);
                            });
                        }
                    });
                });
            }
            assert_eq!(
                runs.load(Ordering::Relaxed),
                PHASES * rows,
                "{threads} threads"
            );
            // After K phases row i holds (i + K) mod rows + K; K even leaves it in `a`.
            for (i, x) in a.iter().enumerate() {
                assert_eq!(
                    *x,
                    ((i + PHASES) % rows + PHASES) as f32,
                    "{threads} threads"
                );
            }
        }
    }

    #[test]
    fn a_worker_kept_waiting_past_the_spin_sleeps_and_is_woken() {
        // One item outlasts the spin, so the other workers fall asleep at the barrier; the
        // last to arrive must wake them (a lost wake-up hangs here), and the next phase
        // must see the first one's write. With 2 and 3 workers: at most as many as cores
        // (on a 2-core machine) and more.
        for threads in [2, 3] {
            let flag = AtomicUsize::new(0);
            let seen = AtomicUsize::new(0);
            pool(threads).install(|| {
                team(|t| {
                    t.for_each(1, |_, _| {
                        std::thread::sleep(5 * spin_limit(threads));
                        flag.store(1, Ordering::Relaxed);
                    });
                    t.for_each(threads, |_, _| {
                        seen.fetch_add(flag.load(Ordering::Relaxed), Ordering::Relaxed);
                    });
                })
            });
            assert_eq!(seen.load(Ordering::Relaxed), threads, "{threads} threads");
        }
    }

    #[test]
    fn a_panic_in_one_worker_ends_the_region_instead_of_hanging() {
        let caught = std::panic::catch_unwind(|| {
            pool(2).install(|| {
                team(|t| {
                    t.for_each(2, |_, i| assert!(i != 1, "item 1 fails"));
                    t.for_each(2, |_, _| {});
                })
            })
        });
        assert!(caught.is_err());
    }

    #[test]
    fn windows_hand_out_one_window_per_phase() {
        let mut buf = vec![0.0f32; 10 * 2];
        let w = Windows::new(&mut buf, 2, 3, 4);
        pool(1).install(|| {
            team(|t| {
                t.for_each(1, |ph, _| {
                    // Rows 5..9 in blocks of 3: 5..8, then 8..9.
                    assert_eq!(w.take_in(ph, 5, 4, 0).len(), 6);
                    assert_eq!(w.take_in(ph, 5, 4, 1).len(), 2);
                    let twice = catch_unwind(AssertUnwindSafe(|| w.take_in(ph, 5, 4, 1).len()));
                    assert!(twice.is_err(), "a block twice in a phase");
                    let other = catch_unwind(AssertUnwindSafe(|| w.take_in(ph, 0, 4, 0).len()));
                    assert!(other.is_err(), "a second window in the phase");
                });
                // The next phase may take the same block again, of any window.
                t.for_each(1, |ph, _| assert_eq!(w.take_in(ph, 0, 4, 1).len(), 2));
            })
        });
    }

    #[test]
    #[should_panic(expected = "twice")]
    fn a_block_cannot_be_taken_twice() {
        let mut buf = vec![0.0f32; 8];
        let blocks = Blocks::new(&mut buf, 4, 2, 2);
        let _a = blocks.take(0, 1);
        let _b = blocks.take(0, 1);
    }
}
