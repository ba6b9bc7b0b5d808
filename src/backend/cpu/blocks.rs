//! Splitting `[heads, rows, width]` buffers into per-(head, row block) slices, so parallel
//! work items own disjoint parts of an output; and lock-guarded blocks for outputs that
//! several items accumulate into (dQ in the flash backward, dK/dV in the chunked one).
//! O(number of blocks) bookkeeping, no copies.

use std::sync::Mutex;

/// Disjoint slices of `buf` (`heads` consecutive `[rows, width]` matrices), one per
/// (head, block of `block` rows), in head-major order. The last block of a head may be short.
/// The list is allocated with its exact length: `split_bytes` counts it for predictions.
pub fn head_row_blocks(
    buf: &mut [f32],
    rows: usize,
    width: usize,
    block: usize,
) -> Vec<&mut [f32]> {
    if rows * width == 0 {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(buf.len() / (rows * width) * blocks_per_head(rows, block));
    out.extend(block_iter(buf, rows, width, block));
    out
}

fn block_iter(
    buf: &mut [f32],
    rows: usize,
    width: usize,
    block: usize,
) -> impl Iterator<Item = &mut [f32]> {
    buf.chunks_mut(rows * width)
        .flat_map(move |head| head.chunks_mut(block * width))
}

/// Number of row blocks per head.
pub fn blocks_per_head(rows: usize, block: usize) -> usize {
    rows.div_ceil(block)
}

/// Heap bytes of a `head_row_blocks` list (or of a list of as many `Option` slices).
pub fn split_bytes(blocks: usize) -> u64 {
    (blocks * std::mem::size_of::<&mut [f32]>()) as u64
}

type Guarded<'a> = Mutex<[Option<&'a mut [f32]>; 2]>;

/// Row blocks of one or two outputs behind one lock each; `add` accumulates a contribution.
pub struct LockedBlocks<'a> {
    blocks: Vec<Guarded<'a>>,
}

impl<'a> LockedBlocks<'a> {
    /// Blocks of `first` and, if given, `second` (same geometry), locked together per block.
    pub fn new(
        first: &'a mut [f32],
        second: Option<&'a mut [f32]>,
        rows: usize,
        width: usize,
        block: usize,
    ) -> Self {
        let n = first.len() / (rows * width).max(1) * blocks_per_head(rows, block);
        let mut blocks = Vec::with_capacity(n);
        let a = block_iter(first, rows, width, block);
        match second {
            Some(second) => {
                let b = block_iter(second, rows, width, block);
                blocks.extend(a.zip(b).map(|(x, y)| Mutex::new([Some(x), Some(y)])));
            }
            None => blocks.extend(a.map(|x| Mutex::new([Some(x), None]))),
        }
        LockedBlocks { blocks }
    }

    /// Heap bytes of a `LockedBlocks` over `blocks` blocks (for predictions).
    pub fn bytes(blocks: usize) -> u64 {
        (blocks * std::mem::size_of::<Guarded<'static>>()) as u64
    }

    /// Adds `contribs[k]` elementwise into output `k` of block `index`, under its lock.
    pub fn add(&self, index: usize, contribs: &[&[f32]]) {
        let mut guard = self.blocks[index].lock().unwrap_or_else(|e| e.into_inner());
        for (dst, src) in guard.iter_mut().flatten().zip(contribs) {
            for (d, s) in dst.iter_mut().zip(src.iter()) {
                *d += s;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_every_head_without_straddling() {
        let mut buf: Vec<f32> = (0..2 * 5 * 3).map(|x| x as f32).collect();
        let blocks = head_row_blocks(&mut buf, 5, 3, 2);
        let lens: Vec<usize> = blocks.iter().map(|b| b.len()).collect();
        assert_eq!(lens, vec![6, 6, 3, 6, 6, 3]);
        assert_eq!(blocks[3][0], 15.0);
        assert_eq!(blocks_per_head(5, 2), 3);
    }

    #[test]
    fn locked_adds_accumulate_into_both_outputs() {
        let (mut a, mut b) = (vec![0.0f32; 8], vec![1.0f32; 8]);
        {
            let locked = LockedBlocks::new(&mut a, Some(&mut b), 4, 2, 2);
            locked.add(1, &[&[1.0, 2.0, 3.0, 4.0], &[1.0; 4]]);
            locked.add(1, &[&[1.0; 4], &[1.0; 4]]);
        }
        assert_eq!(a, vec![0.0, 0.0, 0.0, 0.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(b, vec![1.0, 1.0, 1.0, 1.0, 3.0, 3.0, 3.0, 3.0]);
    }
}
