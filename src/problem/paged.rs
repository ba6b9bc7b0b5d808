//! The paged KV cache of serving (PagedAttention, Kwon et al. 2023, as the Transformers
//! Inference Optimization Toolset describes it under "PagedAttention / vLLM"): each
//! sequence's cache cut into pages of `page_size` tokens that sit anywhere in one pool of
//! physical pages, found through a block table. The layout is the one a GPU kernel reads:
//! the pool `[pages, kv_heads, page_size, head_dim]` (one head's tokens of a page
//! contiguous, FlashInfer's "HND"), the block table `[batch, pages_per_seq]` of u32
//! physical page indices, row-major. Building the pool from the logical cache costs one
//! copy of it; the pages a sequence does not fill hold NaN, so a kernel that reads past
//! the sequence's end shows as an error, not as a quiet zero.

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use super::{Shape, Tensor};

/// Where the pages of a sequence sit in the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum PageOrder {
    /// A seeded permutation of the pool, as a server's page allocator leaves it after a
    /// while: consecutive pages of a sequence are nowhere near each other.
    Shuffled,
    /// Page j of sequence b is physical page b * pages_per_seq + j: the logical cache
    /// itself, so a ratio against it isolates the cost of the indirection.
    Contiguous,
}

impl PageOrder {
    pub const ALL: [PageOrder; 2] = [PageOrder::Shuffled, PageOrder::Contiguous];

    pub fn name(self) -> &'static str {
        match self {
            PageOrder::Shuffled => "shuffled",
            PageOrder::Contiguous => "contiguous",
        }
    }
}

impl fmt::Display for PageOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PageOrder {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        PageOrder::ALL
            .into_iter()
            .find(|o| o.name() == s)
            .ok_or_else(|| {
                format!("unknown page_order `{s}` (expected one of: shuffled, contiguous)")
            })
    }
}

/// How a case's KV cache is paged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Paging {
    /// Tokens per page.
    pub page_size: usize,
    pub order: PageOrder,
}

impl Paging {
    /// The page size serving engines default to (vLLM's block size).
    pub const DEFAULT_PAGE_SIZE: usize = 16;

    /// Pages per sequence: the last one holds the remainder.
    pub fn pages_per_seq(&self, shape: &Shape) -> usize {
        shape.seq_kv.div_ceil(self.page_size.max(1))
    }

    /// Entries of the block table: one per page of every sequence.
    pub fn table_len(&self, shape: &Shape) -> usize {
        shape.batch * self.pages_per_seq(shape)
    }

    /// Elements of one physical page (all KV heads).
    pub fn page_elems(&self, shape: &Shape) -> usize {
        shape.kv_heads * self.page_size * shape.head_dim
    }

    /// Elements of the K (or V) pool.
    pub fn pool_len(&self, shape: &Shape) -> usize {
        self.table_len(shape) * self.page_elems(shape)
    }

    /// Why this paging does not fit the shape, if so.
    pub fn unsupported(&self, shape: &Shape) -> Option<String> {
        if self.page_size == 0 {
            return Some("page_size must be at least 1 token".into());
        }
        (self.page_size > shape.seq_kv).then(|| {
            format!(
                "page_size {} is larger than the cache of {} tokens (seq_kv)",
                self.page_size, shape.seq_kv
            )
        })
    }
}

/// The pool of physical pages and the block table of one case: input, like the cache.
#[derive(Clone, Debug, PartialEq)]
pub struct PagedKv {
    pub paging: Paging,
    /// `[batch, pages_per_seq]`: the physical page of page j of sequence b.
    pub table: Vec<u32>,
    /// `[pages, kv_heads, page_size, head_dim]`, in the cache's storage dtype.
    pub k: Tensor,
    pub v: Tensor,
}

impl PagedKv {
    /// The pool holding the logical cache `k`, `v` (`[batch, kv_heads, seq_kv, d]`) page by
    /// page, in the order `paging.order` gives (a permutation seeded by `seed`).
    pub fn build(shape: &Shape, k: &Tensor, v: &Tensor, paging: Paging, seed: u64) -> PagedKv {
        let n = paging.table_len(shape);
        let mut table: Vec<u32> = (0..n as u32).collect();
        if paging.order == PageOrder::Shuffled {
            // Apart from the inputs' stream, so the cache's values do not change with it.
            let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7061_6765_645f_6b76);
            table.shuffle(&mut rng);
        }
        PagedKv {
            paging,
            k: scatter(shape, &paging, &table, k),
            v: scatter(shape, &paging, &table, v),
            table,
        }
    }

    /// Element offset in the pool of kv head `g`'s first token of physical page `page`.
    pub fn page_offset(&self, shape: &Shape, page: u32, g: usize) -> usize {
        (page as usize * shape.kv_heads + g) * self.paging.page_size * shape.head_dim
    }
}

/// The logical cache copied into the pool's pages; unfilled slots NaN.
fn scatter(shape: &Shape, paging: &Paging, table: &[u32], src: &Tensor) -> Tensor {
    fn fill<T: Copy>(shape: &Shape, paging: &Paging, table: &[u32], src: &[T], nan: T) -> Vec<T> {
        let (p, d) = (paging.page_size, shape.head_dim);
        let pps = paging.pages_per_seq(shape);
        let mut pool = vec![nan; paging.pool_len(shape)];
        for b in 0..shape.batch {
            for g in 0..shape.kv_heads {
                let head = (b * shape.kv_heads + g) * shape.seq_kv * d;
                for j in 0..pps {
                    let tokens = p.min(shape.seq_kv - j * p);
                    let phys = table[b * pps + j] as usize;
                    let dst = (phys * shape.kv_heads + g) * p * d;
                    let from = head + j * p * d;
                    pool[dst..dst + tokens * d].copy_from_slice(&src[from..from + tokens * d]);
                }
            }
        }
        pool
    }
    match src {
        Tensor::F32(x) => Tensor::F32(fill(shape, paging, table, x, f32::NAN)),
        Tensor::Bf16(x) => Tensor::Bf16(fill(shape, paging, table, x, half::bf16::NAN)),
        Tensor::F16(x) => Tensor::F16(fill(shape, paging, table, x, half::f16::NAN)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{DType, InputDist, Inputs};

    fn shape() -> Shape {
        Shape {
            batch: 2,
            heads: 4,
            kv_heads: 2,
            seq_q: 1,
            seq_kv: 37,
            head_dim: 3,
        }
    }

    #[test]
    fn every_logical_key_is_found_through_the_block_table() {
        let s = shape();
        let x = Inputs::generate(s, DType::Bf16, InputDist::Normal, 1.0, 3);
        for order in PageOrder::ALL {
            for page_size in [1, 4, 16, 37] {
                let paging = Paging { page_size, order };
                let kv = PagedKv::build(&s, &x.k, &x.v, paging, 9);
                let pps = paging.pages_per_seq(&s);
                let mut sorted = kv.table.clone();
                sorted.sort();
                assert_eq!(sorted, (0..(2 * pps) as u32).collect::<Vec<_>>());
                for b in 0..s.batch {
                    for g in 0..s.kv_heads {
                        for t in 0..s.seq_kv {
                            let page = kv.table[b * pps + t / page_size];
                            let at = kv.page_offset(&s, page, g) + (t % page_size) * s.head_dim;
                            let logical = ((b * s.kv_heads + g) * s.seq_kv + t) * s.head_dim;
                            for e in 0..s.head_dim {
                                assert_eq!(kv.k.get_f64(at + e), x.k.get_f64(logical + e));
                                assert_eq!(kv.v.get_f64(at + e), x.v.get_f64(logical + e));
                            }
                        }
                    }
                }
                // The slots past the last token are NaN, and only they.
                let nan = (0..kv.k.len())
                    .filter(|&i| kv.k.get_f64(i).is_nan())
                    .count();
                let pad = pps * page_size - s.seq_kv;
                assert_eq!(nan, s.batch * s.kv_heads * pad * s.head_dim, "{page_size}");
            }
        }
    }

    #[test]
    fn shuffled_order_is_seeded_and_moves_pages() {
        let s = shape();
        let x = Inputs::generate(s, DType::F32, InputDist::Normal, 1.0, 3);
        let p = Paging {
            page_size: 1,
            order: PageOrder::Shuffled,
        };
        let a = PagedKv::build(&s, &x.k, &x.v, p, 9);
        assert_eq!(a, PagedKv::build(&s, &x.k, &x.v, p, 9));
        assert_ne!(a.table, PagedKv::build(&s, &x.k, &x.v, p, 10).table);
        assert!(a.table.windows(2).filter(|w| w[1] == w[0] + 1).count() < a.table.len() / 2);
    }

    #[test]
    fn bad_page_sizes_are_named() {
        let s = shape();
        let p = |page_size| Paging {
            page_size,
            order: PageOrder::Shuffled,
        };
        assert!(p(0).unsupported(&s).unwrap().contains("at least 1"));
        assert!(p(38).unsupported(&s).unwrap().contains("seq_kv"));
        assert_eq!(p(37).unsupported(&s), None);
    }
}
