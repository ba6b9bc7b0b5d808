//! How a sequence of n tokens is spread over p devices: contiguous blocks whose lengths
//! differ by at most one (Ring and Tree Attention, t = n/p), or Striped Attention's stripes
//! (token k on device k mod p; Transformers Inference Optimization Toolset). Plus the fallible copy of a device's rows out of a
//! `[heads, n, d]` tensor. O(rows * d) per copy.

use super::plan::even_chunks;
use crate::backend::cpu::decode::Positions;
use crate::error::{Error, Result};
use crate::problem::Tensor;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    Contiguous,
    Striped,
    /// Contiguous shards of the first `prefill` tokens (a ring prefill's), and every token
    /// after them on the last device: decoding appends each new key and value to the last
    /// shard (Shyam et al.'s generation protocol).
    Appended {
        prefill: usize,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub placement: Placement,
    pub p: usize,
    pub n: usize,
}

impl Layout {
    /// Tokens on device `i`.
    pub fn len(&self, i: usize) -> usize {
        match self.placement {
            Placement::Contiguous => even_chunks(0..self.n, self.p)[i].len(),
            Placement::Striped => (self.n + self.p - 1 - i) / self.p,
            Placement::Appended { prefill } => {
                let base = even_chunks(0..prefill.min(self.n), self.p)[i].len();
                if i + 1 == self.p {
                    base + self.n.saturating_sub(prefill)
                } else {
                    base
                }
            }
        }
    }

    /// Positions of device `i`'s tokens.
    pub fn positions(&self, i: usize) -> Positions {
        match self.placement {
            Placement::Contiguous => Positions {
                start: even_chunks(0..self.n, self.p)[i].start as i64,
                stride: 1,
            },
            Placement::Striped => Positions {
                start: i as i64,
                stride: self.p as i64,
            },
            Placement::Appended { prefill } => Positions {
                start: even_chunks(0..prefill.min(self.n), self.p)[i].start as i64,
                stride: 1,
            },
        }
    }

    pub fn lens(&self) -> Vec<usize> {
        (0..self.p).map(|i| self.len(i)).collect()
    }
}

/// Rows `positions(0..rows)` of every one of `heads` consecutive `[n, d]` matrices of `src`,
/// packed as `[heads, rows, d]` in `src`'s dtype (a device's own copy of its shard).
pub fn gather(
    src: &Tensor,
    heads: usize,
    n: usize,
    d: usize,
    pos: Positions,
    rows: usize,
    what: &str,
) -> Result<Tensor> {
    let g = Gather {
        heads,
        n,
        d,
        pos,
        rows,
        what,
    };
    Ok(match src {
        Tensor::F32(s) => Tensor::F32(g.rows(s)?),
        Tensor::Bf16(s) => Tensor::Bf16(g.rows(s)?),
        Tensor::F16(s) => Tensor::F16(g.rows(s)?),
    })
}

struct Gather<'a> {
    heads: usize,
    n: usize,
    d: usize,
    pos: Positions,
    rows: usize,
    what: &'a str,
}

impl Gather<'_> {
    /// The packed rows, allocated fallibly (`OutOfMemory` under the memory budget).
    fn rows<T: Copy>(&self, src: &[T]) -> Result<Vec<T>> {
        let len = self.heads * self.rows * self.d;
        let mut out: Vec<T> = Vec::new();
        out.try_reserve_exact(len).map_err(|_| {
            Error::OutOfMemory(format!(
                "{}: {} bytes could not be allocated",
                self.what,
                len * std::mem::size_of::<T>()
            ))
        })?;
        for h in 0..self.heads {
            for r in 0..self.rows {
                let off = (h * self.n + self.pos.at(r) as usize) * self.d;
                out.extend_from_slice(&src[off..off + self.d]);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_every_token_once() {
        for placement in [
            Placement::Contiguous,
            Placement::Striped,
            Placement::Appended { prefill: 7 },
        ] {
            for (n, p) in [(10, 3), (3, 5), (16, 4), (1, 1), (7, 3)] {
                let l = Layout { placement, p, n };
                let mut seen = vec![0; n];
                for i in 0..p {
                    let pos = l.positions(i);
                    for r in 0..l.len(i) {
                        seen[pos.at(r) as usize] += 1;
                    }
                }
                assert!(seen.iter().all(|&c| c == 1), "{placement:?} n {n} p {p}");
            }
        }
    }

    #[test]
    fn appended_tokens_go_to_the_last_shard() {
        let l = Layout {
            placement: Placement::Appended { prefill: 10 },
            p: 3,
            n: 13,
        };
        assert_eq!(l.lens(), vec![4, 3, 6]);
        assert_eq!(l.positions(2).start, 7);
    }

    #[test]
    fn gather_packs_the_rows_of_every_head() {
        let src = Tensor::F32((0..2 * 5 * 2).map(|x| x as f32).collect());
        let pos = Positions {
            start: 1,
            stride: 3,
        };
        let t = gather(&src, 2, 5, 2, pos, 2, "test").unwrap();
        assert_eq!(
            t,
            Tensor::F32(vec![2.0, 3.0, 8.0, 9.0, 12.0, 13.0, 18.0, 19.0])
        );
    }
}
