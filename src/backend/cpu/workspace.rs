//! Per-worker scratch memory, allocated fallibly once before a kernel's parallel loop so the
//! hot loop never allocates and an over-budget request is an `OutOfMemory` error, not an
//! abort. Cost: `workers * floats_per_worker * 4` bytes, where `workers = min(threads, items)`.

use std::alloc::{alloc_zeroed, Layout};
use std::sync::{Mutex, MutexGuard};

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

/// One scratch buffer per concurrently running work item.
pub struct Workspace {
    buffers: Vec<Mutex<Vec<f32>>>,
}

impl Workspace {
    /// Number of buffers needed to run `items` work items on the current rayon pool.
    pub fn workers_for(items: usize) -> usize {
        rayon::current_num_threads().min(items).max(1)
    }

    pub fn new(workers: usize, floats_per_worker: usize, what: &str) -> Result<Workspace> {
        let buffers = (0..workers)
            .map(|_| try_zeroed(floats_per_worker, what).map(Mutex::new))
            .collect::<Result<Vec<_>>>()?;
        Ok(Workspace { buffers })
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
    /// the scan at the rayon thread index makes a collision rare.
    pub fn acquire(&self) -> MutexGuard<'_, Vec<f32>> {
        let n = self.buffers.len();
        let start = rayon::current_thread_index().unwrap_or(0) % n;
        loop {
            for i in 0..n {
                if let Ok(g) = self.buffers[(start + i) % n].try_lock() {
                    return g;
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

    #[test]
    fn carve_splits_in_order() {
        let mut buf: Vec<f32> = (0..10).map(|x| x as f32).collect();
        let [a, b, c] = carve(&mut buf, [2, 3, 4]);
        assert_eq!(a, &[0.0, 1.0]);
        assert_eq!(b, &[2.0, 3.0, 4.0]);
        assert_eq!(c, &[5.0, 6.0, 7.0, 8.0]);
    }

    #[test]
    fn workspace_hands_out_distinct_buffers() {
        let ws = Workspace::new(2, 4, "test").unwrap();
        let a = ws.acquire();
        let b = ws.acquire();
        assert_ne!(a.as_ptr(), b.as_ptr());
    }
}
