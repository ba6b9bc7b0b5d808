//! Splitting `[heads, rows, width]` buffers into per-(head, row block) slices, so parallel
//! work items own disjoint parts of an output; and lock-guarded blocks for outputs that
//! several items accumulate into (dQ in the flash backward, dK/dV in the chunked one).
//! O(number of blocks) bookkeeping, no copies.

use std::sync::Mutex;

/// Disjoint slices of `buf` (`heads` consecutive `[rows, width]` matrices), one per
/// (head, block of `block` rows), in head-major order. The last block of a head may be short.
pub fn head_row_blocks(
    buf: &mut [f32],
    rows: usize,
    width: usize,
    block: usize,
) -> Vec<&mut [f32]> {
    if rows * width == 0 {
        return Vec::new();
    }
    buf.chunks_mut(rows * width)
        .flat_map(|head| head.chunks_mut(block * width))
        .collect()
}

/// Number of row blocks per head.
pub fn blocks_per_head(rows: usize, block: usize) -> usize {
    rows.div_ceil(block)
}

/// Row blocks of one or two outputs behind one lock each; `add` accumulates a contribution.
pub struct LockedBlocks<'a> {
    blocks: Vec<Mutex<Vec<&'a mut [f32]>>>,
}

impl<'a> LockedBlocks<'a> {
    /// Blocks of every output in `outs` (same geometry), locked together per block index.
    pub fn new(outs: Vec<&'a mut [f32]>, rows: usize, width: usize, block: usize) -> Self {
        let mut split: Vec<std::vec::IntoIter<&'a mut [f32]>> = outs
            .into_iter()
            .map(|o| head_row_blocks(o, rows, width, block).into_iter())
            .collect();
        let n = split.first().map_or(0, |s| s.len());
        let blocks = (0..n)
            .map(|_| Mutex::new(split.iter_mut().filter_map(Iterator::next).collect()))
            .collect();
        LockedBlocks { blocks }
    }

    /// Adds `contribs[k]` elementwise into output `k` of block `index`, under its lock.
    pub fn add(&self, index: usize, contribs: &[&[f32]]) {
        let mut guard = self.blocks[index].lock().unwrap_or_else(|e| e.into_inner());
        for (dst, src) in guard.iter_mut().zip(contribs) {
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
            let locked = LockedBlocks::new(vec![&mut a, &mut b], 4, 2, 2);
            locked.add(1, &[&[1.0, 2.0, 3.0, 4.0], &[1.0; 4]]);
            locked.add(1, &[&[1.0; 4], &[1.0; 4]]);
        }
        assert_eq!(a, vec![0.0, 0.0, 0.0, 0.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(b, vec![1.0, 1.0, 1.0, 1.0, 3.0, 3.0, 3.0, 3.0]);
    }
}
