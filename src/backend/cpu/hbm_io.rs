//! FlashAttention's IO claim counted (Dao et al. 2022, Theorem 2; Transformers Inference
//! Optimization Toolset, "FlashAttention"; docs/papers.md): the elements each forward loop
//! order moves between slow memory ("HBM") and fast memory ("SRAM"), tile by tile. Three
//! orders, each written once as an iteration over its tiles that drives a [`Traffic`]:
//! [`standard`] (the paper's Algorithm 0: S = QK^T, P = softmax(S), O = PV through HBM),
//! [`flash1`] (the blog's FlashAttention forward: K/V blocks outside, Q blocks inside, O, l
//! and m read and written back every inner step) and [`flash2`] (the `flash` kernel's own
//! schedule: Q blocks outside, its key tiles `flash::key_tiles` inside, O written once).
//! Registers and on-chip tiles are not counted. Cost: O(1) per tile visited (flash1 visits
//! ⌈L/B_Q⌉·⌈L/B_KV⌉), no allocation.
//!
//! Not `softmax_passes::Access`: that one counts element by element on real data, and the
//! standard order moves 4L² elements, 1.7e10 at L = 64K.

use super::flash::key_tiles;
use crate::problem::Shape;

/// A matrix or vector in slow memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tensor {
    Q,
    K,
    V,
    /// The scores QK^T (standard order).
    S,
    /// softmax(S) (standard order).
    P,
    O,
    /// The running row sums ℓ (flash1).
    RowSum,
    /// The running row maxima m (flash1).
    RowMax,
}

/// Where a loop order reports what it moves.
pub trait Traffic {
    /// `elements` of `t` read from slow memory into fast memory.
    fn read(&mut self, t: Tensor, elements: usize);
    /// `elements` of `t` written from fast memory to slow memory.
    fn write(&mut self, t: Tensor, elements: usize);
}

/// Elements read and written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    pub reads: u64,
    pub writes: u64,
}

impl Moved {
    pub fn total(&self) -> u64 {
        self.reads + self.writes
    }
}

impl Traffic for Moved {
    fn read(&mut self, _: Tensor, elements: usize) {
        self.reads += elements as u64;
    }
    fn write(&mut self, _: Tensor, elements: usize) {
        self.writes += elements as u64;
    }
}

/// The blocks of `n` rows in steps of `b`: (first row, rows) of each, the last one short.
pub fn tiles(n: usize, b: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n).step_by(b.max(1)).map(move |r| (r, b.min(n - r)))
}

/// The blog's block sizes for fast memory of `m` elements and head dimension `d`:
/// (B_Q, B_KV) = (min(⌈M/4d⌉, d), ⌈M/4d⌉). Why 4d: K_j, V_j, Q_i and O_i, each B·d, fill M.
pub fn blog_blocks(m: usize, d: usize) -> (usize, usize) {
    let b_kv = m.div_ceil(4 * d);
    (b_kv.min(d), b_kv)
}

/// Standard attention (Dao et al. 2022, Algorithm 0) over L queries and keys of dimension
/// `d`, row blocks of `b`: (1) read Q and K, write S = QK^T; (2) read S, write
/// P = softmax(S), a row block at a time; (3) read P and V, write O = PV. A product reads
/// each operand once (the paper's accounting in its Theorem 2, which a matrix product
/// whose on-chip reuse fits M gives), so the block size changes the tiles, not the count.
pub fn standard<T: Traffic>(t: &mut T, l: usize, d: usize, b: usize) {
    // (1) S = QK^T.
    for (_, rows) in tiles(l, b) {
        t.read(Tensor::Q, rows * d);
    }
    for (_, keys) in tiles(l, b) {
        t.read(Tensor::K, keys * d);
    }
    for (_, rows) in tiles(l, b) {
        for (_, keys) in tiles(l, b) {
            t.write(Tensor::S, rows * keys);
        }
    }
    // (2) P = softmax(S), row block by row block.
    for (_, rows) in tiles(l, b) {
        t.read(Tensor::S, rows * l);
        t.write(Tensor::P, rows * l);
    }
    // (3) O = PV.
    for (_, rows) in tiles(l, b) {
        for (_, keys) in tiles(l, b) {
            t.read(Tensor::P, rows * keys);
        }
    }
    for (_, keys) in tiles(l, b) {
        t.read(Tensor::V, keys * d);
    }
    for (_, rows) in tiles(l, b) {
        t.write(Tensor::O, rows * d);
    }
}

/// The blog's FlashAttention forward (FlashAttention-1's loop order) with blocks
/// (B_Q, B_KV) = `(bq, bkv)`: O, ℓ and m initialized in HBM; per K/V block j, K_j and V_j
/// read once; per Q block i inside it, Q_i, O_i, ℓ_i and m_i read and O_i, ℓ_i, m_i
/// written back.
pub fn flash1<T: Traffic>(t: &mut T, l: usize, d: usize, (bq, bkv): (usize, usize)) {
    for (_, rows) in tiles(l, bq) {
        t.write(Tensor::O, rows * d);
        t.write(Tensor::RowSum, rows);
        t.write(Tensor::RowMax, rows);
    }
    for (_, keys) in tiles(l, bkv) {
        t.read(Tensor::K, keys * d);
        t.read(Tensor::V, keys * d);
        for (_, rows) in tiles(l, bq) {
            t.read(Tensor::Q, rows * d);
            t.read(Tensor::O, rows * d);
            t.read(Tensor::RowSum, rows);
            t.read(Tensor::RowMax, rows);
            t.write(Tensor::O, rows * d);
            t.write(Tensor::RowSum, rows);
            t.write(Tensor::RowMax, rows);
        }
    }
}

/// The `flash` kernel's forward (FlashAttention-2's loop order) as `flash::forward` tiles
/// it: per head and query block of `bq` rows, Q_i read once (packed), K_j and V_j read per
/// key tile of its schedule (`flash::key_tiles`: causal blocks above the diagonal and keys
/// outside a window skipped), the running max, sum and O kept on chip, O_i written once.
pub fn flash2<T: Traffic>(
    t: &mut T,
    s: &Shape,
    causal: bool,
    (window, sinks): (Option<usize>, usize),
    (bq, bk): (usize, usize),
) {
    let d = s.head_dim;
    for _head in 0..s.batch * s.heads {
        for (row0, rows) in tiles(s.seq_q, bq) {
            t.read(Tensor::Q, rows * d);
            for (_, keys) in key_tiles(s, causal, (window, sinks), (row0, rows), bk) {
                t.read(Tensor::K, keys * d);
                t.read(Tensor::V, keys * d);
            }
            t.write(Tensor::O, rows * d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts per tensor, to check a hand count term by term.
    #[derive(Default)]
    struct PerTensor(Vec<(Tensor, bool, usize)>);

    impl Traffic for PerTensor {
        fn read(&mut self, t: Tensor, n: usize) {
            self.0.push((t, false, n));
        }
        fn write(&mut self, t: Tensor, n: usize) {
            self.0.push((t, true, n));
        }
    }

    impl PerTensor {
        fn sum(&self, t: Tensor, write: bool) -> usize {
            self.0
                .iter()
                .filter(|e| e.0 == t && e.1 == write)
                .map(|e| e.2)
                .sum()
        }
    }

    #[test]
    fn standard_by_hand() {
        // L = 5, d = 3, blocks of 2 (2, 2, 1): Q, K, V read once (15 each), S written (25),
        // S read (25), P written (25) and read (25), O written (15).
        let mut c = PerTensor::default();
        standard(&mut c, 5, 3, 2);
        let want = [
            (Tensor::Q, false, 15),
            (Tensor::K, false, 15),
            (Tensor::S, true, 25),
            (Tensor::S, false, 25),
            (Tensor::P, true, 25),
            (Tensor::P, false, 25),
            (Tensor::V, false, 15),
            (Tensor::O, true, 15),
        ];
        for (t, w, n) in want {
            assert_eq!(c.sum(t, w), n, "{t:?} write={w}");
        }
        let mut m = Moved::default();
        standard(&mut m, 5, 3, 2);
        assert_eq!((m.reads, m.writes, m.total()), (95, 65, 160));
        // The block size changes the tiles, not the count.
        for b in [1, 3, 5, 8] {
            let mut o = Moved::default();
            standard(&mut o, 5, 3, b);
            assert_eq!(o, m, "b={b}");
        }
    }

    #[test]
    fn flash1_by_hand() {
        // L = 5, d = 2, B_Q = 2 (blocks 2, 2, 1), B_KV = 3 (blocks 3, 2).
        // Init: O 10, ℓ 5, m 5 written. Per K/V block: K_j, V_j read (6 + 6, then 4 + 4);
        // per K/V block, over its Q blocks: Q 10, O 10, ℓ 5, m 5 read; O 10, ℓ 5, m 5 written.
        let mut c = PerTensor::default();
        flash1(&mut c, 5, 2, (2, 3));
        assert_eq!(c.sum(Tensor::K, false), 10);
        assert_eq!(c.sum(Tensor::V, false), 10);
        assert_eq!(c.sum(Tensor::Q, false), 20);
        assert_eq!(c.sum(Tensor::O, false), 20);
        assert_eq!(c.sum(Tensor::O, true), 10 + 20);
        assert_eq!(c.sum(Tensor::RowSum, false), 10);
        assert_eq!(c.sum(Tensor::RowSum, true), 5 + 10);
        assert_eq!(c.sum(Tensor::RowMax, false), 10);
        assert_eq!(c.sum(Tensor::RowMax, true), 5 + 10);
        let mut m = Moved::default();
        flash1(&mut m, 5, 2, (2, 3));
        assert_eq!((m.reads, m.writes), (80, 60));
        // Inner steps: 3 Q blocks × 2 K/V blocks, each 7 events; plus 3 × 3 init writes and
        // 2 × 2 K/V reads.
        assert_eq!(c.0.len(), 3 * 2 * 7 + 9 + 4);
    }

    #[test]
    fn flash2_by_hand() {
        // L = 10, d = 4, B_r = 4 (blocks 4, 4, 2), B_c = 3 (tiles 3, 3, 3, 1).
        // Non-causal: Q 40 read, every block reads all 10 keys of K and V (3 × 80), O 40
        // written.
        let s = Shape::self_attention(1, 10, 4);
        let mut m = Moved::default();
        flash2(&mut m, &s, false, (None, 0), (4, 3));
        assert_eq!((m.reads, m.writes), (40 + 240, 40));
        // Causal: block 0 (rows 0..4) sees keys 0..4, block 1 keys 0..8, block 2 all 10:
        // K and V 2 × 4 × (4 + 8 + 10) = 176.
        let mut c = Moved::default();
        flash2(&mut c, &s, true, (None, 0), (4, 3));
        assert_eq!((c.reads, c.writes), (40 + 176, 40));
        // Window of 2, causal: rows 4..8 see keys 3..8 (5), rows 8..10 keys 7..10 (3),
        // rows 0..4 keys 0..4 (4): 2 × 4 × 12 = 96. With 1 sink: block 1 adds key 0
        // (before its start 3), block 2 key 0 too: 2 × 4 × 2 more.
        let mut w = Moved::default();
        flash2(&mut w, &s, true, (Some(2), 0), (4, 3));
        assert_eq!(w.reads, 40 + 96);
        let mut k = Moved::default();
        flash2(&mut k, &s, true, (Some(2), 1), (4, 3));
        assert_eq!(k.reads, 40 + 96 + 16);
    }

    #[test]
    fn blog_blocks_follow_the_post() {
        // M = 16384, d = 64: ⌈16384/256⌉ = 64 = d; d = 128: 32; M = 100, d = 8: ⌈100/32⌉ = 4.
        assert_eq!(blog_blocks(16384, 64), (64, 64));
        assert_eq!(blog_blocks(16384, 128), (32, 32));
        assert_eq!(blog_blocks(262144, 64), (64, 1024));
        assert_eq!(blog_blocks(100, 8), (4, 4));
        let t: Vec<_> = tiles(5, 2).collect();
        assert_eq!(t, [(0, 2), (2, 2), (4, 1)]);
    }
}
