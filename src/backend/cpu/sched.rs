//! Work distribution of the forward kernels: `workers` rayon tasks (one per workspace
//! buffer) take work items from a shared counter, so a worker that finishes early takes the
//! next item instead of idling (dynamic scheduling). Callers map the counter to items in
//! order of decreasing cost (for causal masks: the query blocks that see the most keys
//! first), which keeps the two halves of a causal problem within one small item of each
//! other. O(items) atomic flags of bookkeeping, no per-item allocation.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

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

/// The (head, row block) blocks of a `[heads, rows, width]` buffer, each handed out at most
/// once, to whichever worker runs its item.
pub struct Blocks<'a> {
    ptr: *mut f32,
    rows: usize,
    width: usize,
    block: usize,
    per_head: usize,
    taken: Vec<AtomicBool>,
    _buf: PhantomData<&'a mut [f32]>,
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
            taken: (0..heads * per_head)
                .map(|_| AtomicBool::new(false))
                .collect(),
            _buf: PhantomData,
        }
    }

    /// Block `blk` of head `head` (`block` rows, the last of a head may be short).
    /// Panics if it was taken before.
    pub fn take(&self, head: usize, blk: usize) -> &'a mut [f32] {
        let index = head * self.per_head + blk;
        assert!(blk < self.per_head, "row block {blk} out of range");
        assert!(
            !self.taken[index].swap(true, Ordering::AcqRel),
            "block ({head}, {blk}) handed out twice"
        );
        let row0 = blk * self.block;
        let rows = self.block.min(self.rows - row0);
        let start = (head * self.rows + row0) * self.width;
        // SAFETY: head < heads (the flag index was in bounds), so start + rows * width is
        // within the borrowed buffer; blocks are disjoint and each is returned once (the
        // flag), so no two live mutable slices overlap.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), rows * self.width) }
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

    #[test]
    #[should_panic(expected = "twice")]
    fn a_block_cannot_be_taken_twice() {
        let mut buf = vec![0.0f32; 8];
        let blocks = Blocks::new(&mut buf, 4, 2, 2);
        let _a = blocks.take(0, 1);
        let _b = blocks.take(0, 1);
    }
}
