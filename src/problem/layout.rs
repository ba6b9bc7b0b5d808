//! Where each sequence of a case sits in Q, K, V and O: a batch of equal lengths
//! `[batch, heads, seq, d]`, or a ragged batch (`BatchSpec`) packed without padding as
//! `[1, heads, total, d]` with cumulative offsets (FlashAttention's varlen `cu_seqlens`).
//! Kernels that walk a batch sequence by sequence (split-KV decoding, the paged pool) read
//! offsets from here, so one code path serves both. Building it costs O(batch); every
//! lookup is O(1) but `row_of`, O(log batch).

use super::{BatchSpec, Shape};

/// The sequences of a case and their offsets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqLayout {
    lens: Lens,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

/// The sequences' lengths: one pair for a batch of equal lengths (no allocation, so a
/// kernel may build the layout inside a measured call), cumulative offsets when packed.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Lens {
    /// `[batch, heads, seq, d]`.
    Batched { batch: usize, q: usize, kv: usize },
    /// `[1, heads, total, d]`: `[0, q_0, q_0 + q_1, ...]` for the query rows and the keys
    /// (batch + 1 entries each).
    Packed { cu_q: Vec<usize>, cu_kv: Vec<usize> },
}

impl SeqLayout {
    /// The layout of `shape`, packed from `spec` when the case runs a ragged batch.
    pub fn of(shape: &Shape, spec: Option<&BatchSpec>) -> SeqLayout {
        let lens = match spec {
            Some(spec) => Lens::Packed {
                cu_q: spec.offsets(false),
                cu_kv: spec.offsets(true),
            },
            None => Lens::Batched {
                batch: shape.batch,
                q: shape.seq_q,
                kv: shape.seq_kv,
            },
        };
        SeqLayout {
            lens,
            heads: shape.heads,
            kv_heads: shape.kv_heads,
            head_dim: shape.head_dim,
        }
    }

    /// Sequences.
    pub fn len(&self) -> usize {
        match &self.lens {
            Lens::Batched { batch, .. } => *batch,
            Lens::Packed { cu_q, .. } => cu_q.len() - 1,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the batch is packed (ragged).
    pub fn packed(&self) -> bool {
        matches!(self.lens, Lens::Packed { .. })
    }

    /// Query rows of sequence `b` (per head).
    pub fn q_len(&self, b: usize) -> usize {
        match &self.lens {
            Lens::Batched { q, .. } => *q,
            Lens::Packed { cu_q, .. } => cu_q[b + 1] - cu_q[b],
        }
    }

    /// Keys of sequence `b` (per KV head).
    pub fn kv_len(&self, b: usize) -> usize {
        match &self.lens {
            Lens::Batched { kv, .. } => *kv,
            Lens::Packed { cu_kv, .. } => cu_kv[b + 1] - cu_kv[b],
        }
    }

    /// The longest sequence's keys.
    pub fn max_kv_len(&self) -> usize {
        (0..self.len()).map(|b| self.kv_len(b)).max().unwrap_or(0)
    }

    /// Index (in rows of `head_dim` elements) of query row `i` of head `h` of sequence `b`
    /// in Q and O.
    pub fn q_row(&self, b: usize, h: usize, i: usize) -> usize {
        match &self.lens {
            Lens::Batched { q, .. } => (b * self.heads + h) * q + i,
            Lens::Packed { cu_q, .. } => h * cu_q[cu_q.len() - 1] + cu_q[b] + i,
        }
    }

    /// Element offset of key 0 of KV head `g` of sequence `b` in K and V (the keys of one
    /// (sequence, KV head) are contiguous in both layouts).
    pub fn kv_base(&self, b: usize, g: usize) -> usize {
        let row = match &self.lens {
            Lens::Batched { kv, .. } => (b * self.kv_heads + g) * kv,
            Lens::Packed { cu_kv, .. } => g * cu_kv[cu_kv.len() - 1] + cu_kv[b],
        };
        row * self.head_dim
    }

    /// Whether the query rows of `n` consecutive heads of one sequence are one contiguous
    /// run (always when batched; packed, only for one head or one sequence).
    pub fn heads_contiguous(&self, n: usize) -> bool {
        !self.packed() || n <= 1 || self.len() == 1
    }

    /// (sequence, head, row) of Q/O row `row`: the inverse of `q_row`.
    pub fn row_of(&self, row: usize) -> (usize, usize, usize) {
        match &self.lens {
            Lens::Batched { q, .. } => {
                let n = (*q).max(1);
                let (bh, i) = (row / n, row % n);
                (bh / self.heads, bh % self.heads, i)
            }
            Lens::Packed { cu_q, .. } => {
                let total = cu_q[cu_q.len() - 1].max(1);
                let (h, t) = (row / total, row % total);
                // The last sequence whose first row is at or before t.
                let b = cu_q.partition_point(|&c| c <= t) - 1;
                (b, h, t - cu_q[b])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(batch: usize, seq_q: usize, seq_kv: usize) -> Shape {
        Shape {
            batch,
            heads: 4,
            kv_heads: 2,
            seq_q,
            seq_kv,
            head_dim: 3,
        }
    }

    #[test]
    fn batched_offsets_are_the_shapes() {
        let s = shape(3, 5, 7);
        let l = SeqLayout::of(&s, None);
        assert_eq!(l.len(), 3);
        assert!(!l.packed() && l.heads_contiguous(4));
        for b in 0..3 {
            for h in 0..4 {
                assert_eq!(l.q_row(b, h, 2) * 3, s.q_head_offset(b, h) + 2 * 3);
                assert_eq!(l.kv_base(b, h / 2), s.kv_head_offset(b, h));
                assert_eq!(l.row_of(l.q_row(b, h, 4)), (b, h, 4));
            }
        }
    }

    #[test]
    fn packed_offsets_follow_the_spec_and_invert() {
        let spec: BatchSpec = "2xq3kv10+q1kv4+q6".parse().unwrap();
        let s = spec.packed(&shape(1, 1, 1));
        let l = SeqLayout::of(&s, Some(&spec));
        assert_eq!((l.len(), l.max_kv_len(), l.q_len(3)), (4, 10, 6));
        assert_eq!((l.q_len(2), l.kv_len(2)), (1, 4));
        // Head 1 of sequence 3 starts after every row of head 0 (13) and sequences 0..3 (7).
        assert_eq!(l.q_row(3, 1, 0), 13 + 7);
        assert_eq!(l.kv_base(2, 1), (30 + 20) * 3);
        assert!(!l.heads_contiguous(2) && l.heads_contiguous(1));
        let mut seen = [false; 4 * 13];
        for b in 0..4 {
            for h in 0..4 {
                for i in 0..l.q_len(b) {
                    let r = l.q_row(b, h, i);
                    assert!(!seen[r]);
                    seen[r] = true;
                    assert_eq!(l.row_of(r), (b, h, i));
                }
            }
        }
        assert!(seen.iter().all(|&x| x));
    }
}
