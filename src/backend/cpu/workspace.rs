//! Per-worker scratch memory, allocated fallibly once before a kernel's parallel loop so the
//! hot loop never allocates and an over-budget request is an `OutOfMemory` error, not an
//! abort. Cost: `workers * floats_per_worker * 4` bytes, where `workers = min(threads, items)`.
//!
//! Timed calls run warm ([`WarmCalls`]): a buffer that a kernel asks for by [`try_scratch`]
//! (contents unspecified, the kernel writes before it reads) is handed the same-sized
//! buffer the previous call freed, as a framework's caching allocator would, so a timed
//! call does not pay the operating system for zeroing fresh pages (naive attention's n^2
//! matrix spent a fifth of its time there). Outside a warm timing loop, and so in the
//! memory counter, every buffer is a fresh allocation that the counting allocator sees.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard, TryLockError};

use crate::error::{Error, Result};

/// A zero-filled `Vec<f32>` of `len` elements, or `OutOfMemory` if the allocator refuses
/// (the counting allocator refuses large requests over the memory budget). Zeroed
/// allocation lets the system hand out fresh zero pages instead of a memset, so a large
/// buffer costs what the kernel touches.
pub fn try_zeroed(len: usize, what: &str) -> Result<Vec<f32>> {
    if len == 0 {
        return Ok(Vec::new());
    }
    let oom = || {
        Error::OutOfMemory(format!(
            "{what}: {} bytes could not be allocated",
            len as u64 * 4
        ))
    };
    let layout = Layout::array::<f32>(len).map_err(|_| oom())?;
    // SAFETY: the layout has non-zero size; a non-null result is a zeroed block of `len`
    // f32s (all-zero bits are 0.0) from the global allocator with exactly the layout `Vec`
    // uses for this capacity, so `Vec` may own and free it.
    unsafe {
        let ptr = alloc_zeroed(layout) as *mut f32;
        if ptr.is_null() {
            return Err(oom());
        }
        advise_huge_pages(ptr as *mut u8, layout.size());
        Ok(Vec::from_raw_parts(ptr, len, len))
    }
}

/// Asks the kernel to back the whole 2 MiB pages of a large fresh buffer with transparent
/// huge pages. A fresh buffer is faulted in as the kernel first touches it; with 4 KiB
/// pages naive attention's n^2 score matrix (and Rabe–Staats' 16 MiB slab) would spend a
/// large part of each call in page faults, which measures the OS, not the algorithm. Purely
/// advisory: contents and accounting are unchanged, and a refusal is ignored.
fn advise_huge_pages(ptr: *mut u8, bytes: usize) {
    const HUGE: usize = 2 << 20;
    #[cfg(target_os = "linux")]
    {
        let start = (ptr as usize).next_multiple_of(HUGE);
        let end = (ptr as usize + bytes) / HUGE * HUGE;
        if end > start {
            // SAFETY: [start, end) lies inside the allocation just made; MADV_HUGEPAGE only
            // changes how the kernel backs those pages, never their contents or mapping.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, bytes, HUGE);
}

/// Alignment of kernel scratch buffers: a cache line, and a whole AVX-512 vector, so rows
/// whose stride is a multiple of 16 floats never straddle two lines.
pub const SCRATCH_ALIGN: usize = 64;

/// An owned, [`SCRATCH_ALIGN`]-aligned allocation of `len` initialized f32s.
struct Block {
    ptr: std::ptr::NonNull<f32>,
    len: usize,
}

// SAFETY: `Block` owns its allocation exclusively, as a `Vec<f32>` does.
unsafe impl Send for Block {}
// SAFETY: shared access only reads (through `Scratch`'s `Deref`).
unsafe impl Sync for Block {}

impl Block {
    fn layout(len: usize) -> Option<Layout> {
        Layout::from_size_align(len.checked_mul(4)?, SCRATCH_ALIGN).ok()
    }

    /// A zero-filled block (fresh zero pages from the system for a large one).
    fn zeroed(len: usize, what: &str) -> Result<Block> {
        if len == 0 {
            return Ok(Block {
                ptr: std::ptr::NonNull::dangling(),
                len: 0,
            });
        }
        let oom = || {
            Error::OutOfMemory(format!(
                "{what}: {} bytes could not be allocated",
                len as u64 * 4
            ))
        };
        let layout = Block::layout(len).ok_or_else(oom)?;
        // SAFETY: the layout has non-zero size; a non-null result is a zeroed, aligned block
        // of `len` f32s (all-zero bits are 0.0), freed in `Drop` with the same layout.
        let ptr = unsafe { alloc_zeroed(layout) } as *mut f32;
        let ptr = std::ptr::NonNull::new(ptr).ok_or_else(oom)?;
        advise_huge_pages(ptr.as_ptr() as *mut u8, layout.size());
        Ok(Block { ptr, len })
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if let Some(layout) = Block::layout(self.len).filter(|_| self.len > 0) {
            // SAFETY: allocated in `zeroed` with this layout and not freed since.
            unsafe { dealloc(self.ptr.as_ptr() as *mut u8, layout) }
        }
    }
}

thread_local! {
    /// The buffers freed by the calls of this thread's warm timing loop, while one runs
    /// (`None` otherwise).
    static FREED: RefCell<Option<Vec<Block>>> = const { RefCell::new(None) };
}

/// While alive, the calling thread's timing loop runs warm: [`Scratch`] buffers from
/// [`try_scratch`] dropped on this thread are kept and handed to the next request of the
/// same length. Dropping it frees them. Create it on the thread that makes the timed calls
/// (the kernels allocate and free their buffers on the calling thread: a pool's `install`
/// from its own worker runs inline).
pub struct WarmCalls(());

impl WarmCalls {
    pub fn start() -> WarmCalls {
        let stale = FREED.with(|f| f.borrow_mut().replace(Vec::new()));
        drop(stale);
        WarmCalls(())
    }
}

/// Fills every buffer the warm loop on this thread keeps with `value` (tests: the next call
/// must not read a scratch value it did not write).
#[cfg(test)]
pub fn poison_freed(value: f32) {
    FREED.with(|f| {
        for b in f.borrow_mut().iter_mut().flatten() {
            // SAFETY: the block holds `len` initialized f32s and is owned by the list.
            unsafe { std::slice::from_raw_parts_mut(b.ptr.as_ptr(), b.len) }.fill(value);
        }
    });
}

/// The buffers a warm timing loop kept, set aside while other loops run on the thread
/// (interleaved timing: each case keeps its own, as it would timed alone).
#[derive(Default)]
pub struct WarmStash(Vec<Block>);

impl WarmCalls {
    /// Starts a warm loop on the calling thread with the buffers `stash` kept.
    pub fn resume(stash: WarmStash) -> WarmCalls {
        let stale = FREED.with(|f| f.borrow_mut().replace(stash.0));
        drop(stale);
        WarmCalls(())
    }

    /// Ends the loop, keeping its buffers for a later [`WarmCalls::resume`].
    pub fn suspend(self) -> WarmStash {
        let kept = FREED.with(|f| f.borrow_mut().take());
        std::mem::forget(self);
        WarmStash(kept.unwrap_or_default())
    }
}

impl Drop for WarmCalls {
    fn drop(&mut self) {
        // Taken out first, so the buffers are freed outside the borrow.
        let freed = FREED.with(|f| f.borrow_mut().take());
        drop(freed);
    }
}

/// A kernel's scratch buffer of f32s, aligned to [`SCRATCH_ALIGN`]. One made by
/// [`try_scratch`] goes back to the warm timing loop's buffers when dropped (if one runs on
/// the dropping thread).
pub struct Scratch {
    block: Option<Block>,
    recycle: bool,
}

impl Scratch {
    /// A fresh, zero-filled buffer (never recycled).
    pub fn zeroed(len: usize, what: &str) -> Result<Scratch> {
        Ok(Scratch {
            block: Some(Block::zeroed(len, what)?),
            recycle: false,
        })
    }
}

impl Deref for Scratch {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match &self.block {
            // SAFETY: the block holds `len` initialized f32s, owned by `self`.
            Some(b) => unsafe { std::slice::from_raw_parts(b.ptr.as_ptr(), b.len) },
            None => &[],
        }
    }
}

impl DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut [f32] {
        match &mut self.block {
            // SAFETY: as `deref`, borrowed mutably through `self`.
            Some(b) => unsafe { std::slice::from_raw_parts_mut(b.ptr.as_ptr(), b.len) },
            None => &mut [],
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let Some(block) = self.block.take() else {
            return;
        };
        if !self.recycle || block.len == 0 {
            return;
        }
        let kept = FREED.with(|f| match f.borrow_mut().as_mut() {
            Some(freed) => {
                freed.push(block);
                None
            }
            None => Some(block),
        });
        drop(kept);
    }
}

/// A buffer of `len` f32s whose contents are unspecified (zeros, or what the previous call
/// of a warm timing loop left; always initialized floats): for buffers the kernel writes
/// before it reads. In a warm timing loop ([`WarmCalls`]) a buffer of the same length freed
/// by the previous call is reused; if there is none a fresh, zeroed one is allocated and
/// the kept buffers stay for the requests after it (a call that frees one buffer before
/// asking for another of a different length keeps both, so its next call finds all of its
/// buffers); should the memory budget refuse the fresh one, the kept buffers are freed and
/// it is asked for once more.
pub fn try_scratch(len: usize, what: &str) -> Result<Scratch> {
    let reused = FREED.with(|f| {
        let mut f = f.borrow_mut();
        let freed = f.as_mut()?;
        let i = freed.iter().position(|b| b.len == len)?;
        Some(freed.swap_remove(i))
    });
    let block = match reused {
        Some(block) => block,
        None => Block::zeroed(len, what).or_else(|_| {
            let kept = FREED.with(|f| f.borrow_mut().as_mut().map(std::mem::take));
            drop(kept);
            Block::zeroed(len, what)
        })?,
    };
    Ok(Scratch {
        block: Some(block),
        recycle: true,
    })
}

/// One scratch buffer per concurrently running work item.
pub struct Workspace {
    buffers: Vec<Mutex<Scratch>>,
}

impl Workspace {
    /// Number of buffers needed to run `items` work items on the current rayon pool.
    pub fn workers_for(items: usize) -> usize {
        rayon::current_num_threads().min(items).max(1)
    }

    /// Zero-filled buffers, freshly allocated.
    pub fn new(workers: usize, floats_per_worker: usize, what: &str) -> Result<Workspace> {
        let buffers = (0..workers)
            .map(|_| Scratch::zeroed(floats_per_worker, what).map(Mutex::new))
            .collect::<Result<Vec<_>>>()?;
        Ok(Workspace { buffers })
    }

    /// Buffers of unspecified contents ([`try_scratch`]): for kernels that write every
    /// scratch value before reading it.
    pub fn scratch(workers: usize, floats_per_worker: usize, what: &str) -> Result<Workspace> {
        let buffers = (0..workers)
            .map(|_| try_scratch(floats_per_worker, what).map(Mutex::new))
            .collect::<Result<Vec<_>>>()?;
        Ok(Workspace { buffers })
    }

    /// Fills every buffer with `value` (tests: a kernel of unspecified scratch contents must
    /// not read what it did not write).
    #[cfg(test)]
    pub fn fill(&self, value: f32) {
        for b in &self.buffers {
            b.lock().unwrap_or_else(|e| e.into_inner()).fill(value);
        }
    }

    /// Number of buffers (the most work items that can run at once).
    pub fn workers(&self) -> usize {
        self.buffers.len()
    }

    /// Exact bytes `new(workers, floats_per_worker)` allocates (for the variants' predictions).
    pub fn bytes(workers: usize, floats_per_worker: usize) -> u64 {
        (workers * floats_per_worker * 4) as u64
    }

    /// A free buffer. At most `workers` items run at once, so one is always free; starting
    /// the scan at the rayon thread index makes a collision rare. A buffer whose item
    /// panicked is free too: skipping it can leave the other items spinning for ever (when
    /// it was the last one free), and the call's panic never reaching its caller (scratch
    /// holds nothing to protect).
    pub fn acquire(&self) -> MutexGuard<'_, Scratch> {
        let n = self.buffers.len();
        let start = rayon::current_thread_index().unwrap_or(0) % n;
        loop {
            for i in 0..n {
                match self.buffers[(start + i) % n].try_lock() {
                    Ok(g) => return g,
                    Err(TryLockError::Poisoned(p)) => return p.into_inner(),
                    Err(TryLockError::WouldBlock) => {}
                }
            }
            std::thread::yield_now();
        }
    }
}

/// Splits one scratch buffer into named sub-slices of the given lengths, in order.
pub fn carve<'a, const N: usize>(buf: &'a mut [f32], lens: [usize; N]) -> [&'a mut [f32]; N] {
    let mut rest = buf;
    let mut out: [&'a mut [f32]; N] = std::array::from_fn(|_| Default::default());
    for (slot, len) in out.iter_mut().zip(lens) {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(len);
        *slot = head;
        rest = tail;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer whose item panicked is handed out again (the item's panic reaches the
    /// caller; the others must not spin on the poisoned lock).
    #[test]
    fn a_buffer_left_by_a_panicking_item_is_acquired_again() {
        let ws = Workspace::new(1, 4, "test").unwrap();
        let panicked = std::thread::scope(|s| {
            s.spawn(|| {
                let _held = ws.acquire();
                panic!("an item fails while holding its buffer");
            })
            .join()
        });
        assert!(panicked.is_err());
        assert!(ws.buffers[0].is_poisoned());
        assert_eq!(ws.acquire().len(), 4);
    }

    #[test]
    fn carve_splits_in_order() {
        let mut buf: Vec<f32> = (0..10).map(|x| x as f32).collect();
        let [a, b, c] = carve(&mut buf, [2, 3, 4]);
        assert_eq!(a, &[0.0, 1.0]);
        assert_eq!(b, &[2.0, 3.0, 4.0]);
        assert_eq!(c, &[5.0, 6.0, 7.0, 8.0]);
    }

    #[test]
    fn a_warm_loop_hands_a_freed_buffer_to_the_next_request_of_its_length() {
        {
            let _warm = WarmCalls::start();
            let mut a = try_scratch(1000, "test").unwrap();
            a[7] = 3.0;
            let ptr = a.as_ptr();
            drop(a);
            let b = try_scratch(1000, "test").unwrap();
            assert_eq!(b.as_ptr(), ptr, "the freed buffer is reused");
            assert_eq!(b[7], 3.0, "as the previous call left it");
            drop(b);
            // Another length: a fresh, zeroed one, the kept one staying for a later request.
            let c = try_scratch(999, "test").unwrap();
            assert!(c.iter().all(|x| *x == 0.0));
            assert_eq!(c.as_ptr() as usize % SCRATCH_ALIGN, 0);
            let e = try_scratch(1000, "test").unwrap();
            assert_eq!(e.as_ptr(), ptr, "kept past the other length's request");
        }
        // Outside the loop nothing is kept: a new request is a fresh, zeroed buffer.
        let d = try_scratch(999, "test").unwrap();
        assert!(d.iter().all(|x| *x == 0.0));
        FREED.with(|f| assert!(f.borrow().is_none()));
    }

    #[test]
    fn two_suspended_loops_on_one_thread_keep_their_own_buffers() {
        // Loop A keeps a 1000-float buffer, loop B a 500-float one, alternating on this
        // thread; neither frees the other's (each request of B would otherwise free A's).
        let mut a_stash = WarmStash::default();
        let mut b_stash = WarmStash::default();
        let mut ptrs = (None, None);
        for _ in 0..3 {
            let warm = WarmCalls::resume(std::mem::take(&mut a_stash));
            let a = try_scratch(1000, "a").unwrap();
            assert_eq!(*ptrs.0.get_or_insert(a.as_ptr()), a.as_ptr());
            drop(a);
            a_stash = warm.suspend();
            FREED.with(|f| assert!(f.borrow().is_none()));
            let warm = WarmCalls::resume(std::mem::take(&mut b_stash));
            let b = try_scratch(500, "b").unwrap();
            assert_eq!(*ptrs.1.get_or_insert(b.as_ptr()), b.as_ptr());
            drop(b);
            b_stash = warm.suspend();
        }
        assert_eq!(a_stash.0.len(), 1);
        assert_eq!(b_stash.0.len(), 1);
    }

    #[test]
    fn workspace_hands_out_distinct_buffers() {
        let ws = Workspace::new(2, 4, "test").unwrap();
        let a = ws.acquire();
        let b = ws.acquire();
        assert_ne!(a.as_ptr(), b.as_ptr());
    }
}
