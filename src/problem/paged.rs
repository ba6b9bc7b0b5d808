//! The paged KV cache of serving (PagedAttention, Kwon et al. 2023, as the Transformers
//! Inference Optimization Toolset describes it under "PagedAttention / vLLM"): each
//! sequence's cache cut into pages of `page_size` tokens that sit anywhere in one pool of
//! physical pages, found through a block table. The layout is the one a GPU kernel reads:
//! the pool `[pages, kv_heads, page_size, head_dim]` (one head's tokens of a page
//! contiguous, FlashInfer's "HND"), the block table of u32 physical page indices, each
//! sequence's pages in order (`[batch, pages_per_seq]` row-major for a batch of equal
//! lengths) from `indptr`, the cumulative page counts (FlashInfer's `kv_indptr` and
//! `kv_indices`), so a ragged batch's sequences have as many pages as they fill. Building the pool from the logical cache costs one
//! copy of it; the pages a sequence does not fill hold NaN, so a kernel that reads past
//! the sequence's end shows as an error, not as a quiet zero.

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use super::{SeqLayout, Shape, Tensor};

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

    /// Pages of sequence `b`: the last one holds the remainder.
    pub fn pages_of(&self, seqs: &SeqLayout, b: usize) -> usize {
        seqs.kv_len(b).div_ceil(self.page_size.max(1))
    }

    /// Entries of the block table: one per page of every sequence.
    pub fn table_len(&self, seqs: &SeqLayout) -> usize {
        (0..seqs.len()).map(|b| self.pages_of(seqs, b)).sum()
    }

    /// Elements of one physical page (all KV heads).
    pub fn page_elems(&self, shape: &Shape) -> usize {
        shape.kv_heads * self.page_size * shape.head_dim
    }

    /// Elements of the K (or V) pool.
    pub fn pool_len(&self, shape: &Shape, seqs: &SeqLayout) -> usize {
        self.table_len(seqs) * self.page_elems(shape)
    }

    /// Why this paging does not fit the sequences, if so.
    pub fn unsupported(&self, seqs: &SeqLayout) -> Option<String> {
        if self.page_size == 0 {
            return Some("page_size must be at least 1 token".into());
        }
        let longest = seqs.max_kv_len();
        (self.page_size > longest).then(|| {
            format!(
                "page_size {} is larger than the cache of {longest} tokens (seq_kv{})",
                self.page_size,
                if seqs.packed() {
                    ", the longest sequence's"
                } else {
                    ""
                }
            )
        })
    }
}

/// The pool of physical pages and the block table of one case: input, like the cache.
#[derive(Clone, Debug, PartialEq)]
pub struct PagedKv {
    pub paging: Paging,
    /// The physical page of page j of sequence b: `table[indptr[b] + j]`.
    pub table: Vec<u32>,
    /// `[0, pages of sequence 0, ...]`: where each sequence's pages start in `table`.
    pub indptr: Vec<usize>,
    /// `[pages, kv_heads, page_size, head_dim]`, in the cache's storage dtype.
    pub k: Tensor,
    pub v: Tensor,
}

impl PagedKv {
    /// The pool holding the logical cache `k`, `v` (laid out as `seqs` says) page by page,
    /// in the order `paging.order` gives (a permutation seeded by `seed`).
    pub fn build(
        shape: &Shape,
        seqs: &SeqLayout,
        k: &Tensor,
        v: &Tensor,
        paging: Paging,
        seed: u64,
    ) -> crate::error::Result<PagedKv> {
        let n = paging.table_len(seqs);
        let mut indptr = vec![0];
        for b in 0..seqs.len() {
            indptr.push(indptr[b] + paging.pages_of(seqs, b));
        }
        let mut table: Vec<u32> = (0..n as u32).collect();
        if paging.order == PageOrder::Shuffled {
            // Apart from the inputs' stream, so the cache's values do not change with it.
            let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7061_6765_645f_6b76);
            table.shuffle(&mut rng);
        }
        let place = Placement {
            shape,
            seqs,
            paging: &paging,
            table: &table,
            indptr: &indptr,
        };
        Ok(PagedKv {
            paging,
            k: place.scatter(k, "page pool K")?,
            v: place.scatter(v, "page pool V")?,
            table,
            indptr,
        })
    }

    /// Element offset in the pool of kv head `g`'s first token of physical page `page`.
    pub fn page_offset(&self, shape: &Shape, page: u32, g: usize) -> usize {
        (page as usize * shape.kv_heads + g) * self.paging.page_size * shape.head_dim
    }
}

/// Where the pages of a cache go.
struct Placement<'a> {
    shape: &'a Shape,
    seqs: &'a SeqLayout,
    paging: &'a Paging,
    table: &'a [u32],
    indptr: &'a [usize],
}

impl Placement<'_> {
    /// The logical cache copied into the pool's pages; unfilled slots NaN.
    fn scatter(&self, src: &Tensor, what: &str) -> crate::error::Result<Tensor> {
        Ok(match src {
            Tensor::F32(x) => Tensor::F32(self.fill(x, f32::NAN, what)?),
            Tensor::Bf16(x) => Tensor::Bf16(self.fill(x, half::bf16::NAN, what)?),
            Tensor::F16(x) => Tensor::F16(self.fill(x, half::f16::NAN, what)?),
        })
    }

    fn fill<T: Copy>(&self, src: &[T], nan: T, what: &str) -> crate::error::Result<Vec<T>> {
        let (s, seqs) = (self.shape, self.seqs);
        let (p, d) = (self.paging.page_size, s.head_dim);
        let len = self.paging.pool_len(s, seqs);
        let mut pool = super::try_collect(len, std::iter::repeat(nan), what)?;
        for b in 0..seqs.len() {
            let len = seqs.kv_len(b);
            for g in 0..s.kv_heads {
                let head = seqs.kv_base(b, g);
                for j in 0..self.paging.pages_of(seqs, b) {
                    let tokens = p.min(len - j * p);
                    let phys = self.table[self.indptr[b] + j] as usize;
                    let dst = (phys * s.kv_heads + g) * p * d;
                    let from = head + j * p * d;
                    pool[dst..dst + tokens * d].copy_from_slice(&src[from..from + tokens * d]);
                }
            }
        }
        Ok(pool)
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

    /// The batch of `shape()`, and a ragged batch of the same heads packed.
    fn layouts() -> Vec<(Shape, SeqLayout)> {
        let s = shape();
        let spec: crate::problem::BatchSpec = "q1kv37+2xq1kv5+q3kv20".parse().unwrap();
        let packed = spec.packed(&s);
        vec![
            (s, SeqLayout::of(&s, None)),
            (packed, SeqLayout::of(&packed, Some(&spec))),
        ]
    }

    #[test]
    fn every_logical_key_is_found_through_the_block_table() {
        for (s, seqs) in layouts() {
            let x = Inputs::generate(s, DType::Bf16, InputDist::Normal, 1.0, 3);
            for order in PageOrder::ALL {
                for page_size in [1, 4, 16, 37] {
                    let paging = Paging { page_size, order };
                    let kv = PagedKv::build(&s, &seqs, &x.k, &x.v, paging, 9).unwrap();
                    let n = paging.table_len(&seqs);
                    let mut sorted = kv.table.clone();
                    sorted.sort();
                    assert_eq!(sorted, (0..n as u32).collect::<Vec<_>>());
                    assert_eq!(kv.indptr.len(), seqs.len() + 1);
                    let mut pad = 0;
                    for b in 0..seqs.len() {
                        let len = seqs.kv_len(b);
                        let pages = kv.indptr[b + 1] - kv.indptr[b];
                        assert_eq!(pages, len.div_ceil(page_size));
                        pad += pages * page_size - len;
                        for g in 0..s.kv_heads {
                            for t in 0..len {
                                let page = kv.table[kv.indptr[b] + t / page_size];
                                let at = kv.page_offset(&s, page, g) + (t % page_size) * s.head_dim;
                                let logical = seqs.kv_base(b, g) + t * s.head_dim;
                                for e in 0..s.head_dim {
                                    assert_eq!(kv.k.get_f64(at + e), x.k.get_f64(logical + e));
                                    assert_eq!(kv.v.get_f64(at + e), x.v.get_f64(logical + e));
                                }
                            }
                        }
                    }
                    // The slots past each sequence's last token are NaN, and only they.
                    let nan = (0..kv.k.len())
                        .filter(|&i| kv.k.get_f64(i).is_nan())
                        .count();
                    assert_eq!(nan, s.kv_heads * pad * s.head_dim, "{page_size}");
                }
            }
        }
    }

    #[test]
    fn shuffled_order_is_seeded_and_moves_pages() {
        let s = shape();
        let seqs = SeqLayout::of(&s, None);
        let x = Inputs::generate(s, DType::F32, InputDist::Normal, 1.0, 3);
        let p = Paging {
            page_size: 1,
            order: PageOrder::Shuffled,
        };
        let build = |seed| PagedKv::build(&s, &seqs, &x.k, &x.v, p, seed).unwrap();
        let a = build(9);
        assert_eq!(a, build(9));
        assert_ne!(a.table, build(10).table);
        assert!(a.table.windows(2).filter(|w| w[1] == w[0] + 1).count() < a.table.len() / 2);
    }

    #[test]
    fn bad_page_sizes_are_named() {
        let p = |page_size| Paging {
            page_size,
            order: PageOrder::Shuffled,
        };
        // A ragged batch's short sequences may sit in one part-filled page; only a page
        // longer than every sequence is refused.
        for (_, seqs) in layouts() {
            assert!(p(0).unsupported(&seqs).unwrap().contains("at least 1"));
            assert!(p(38).unsupported(&seqs).unwrap().contains("seq_kv"));
            assert_eq!(p(37).unsupported(&seqs), None);
        }
    }
}
