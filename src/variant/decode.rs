//! Single-device decode: `seq_q` new queries (1 by default) against a KV cache of `seq_kv`
//! keys, memory-bound (kernels: `backend::cpu::decode`, `combine`). Every variant reads
//! each cached key and value once per call, for all query heads of a GQA group at once.
//! - `decode-naive`: materialized scores over the cache, 4·b·h·seq_q·seq_kv bytes extra;
//! - `decode-online`: one pass, running max and sums per row (Rabe & Staats Sec. 3), O(G·d)
//!   per worker;
//! - `flash-decoding`: the attended cache cut into `splits` parts processed in parallel,
//!   each giving (partial output, logsumexp), combined exactly (docs/papers.md, Other sources (Flash-Decoding));
//!   extra memory splits·b·h·seq_q·(d+1) floats plus tiles;
//! - `paged-decode`: flash-decoding over a paged cache (PagedAttention, Kwon et al. 2023, as
//!   the Transformers Inference Optimization Toolset describes it; `problem::paged`): the
//!   same splits and combine, each key block read page by page through the block table;
//!   extra memory flash-decoding's plus the block table as element offsets, 8 bytes a page.
//!
//! All three support a sliding `window` (Transformers Inference Optimization Toolset) and causal masks for seq_q > 1.

use crate::backend::cpu::isa::Isa;
use rayon::prelude::*;

use super::{Variant, VariantInfo};
use crate::backend::cpu::combine::combine;
use crate::backend::cpu::decode::{
    attend, attend_materialized, attend_paged_heads, attend_sequential, materialized_scratch_len,
    scratch_len, sequential_scratch_len, span, Keys, Mask, Pages, Positions, RowState,
    GEMM_MIN_ROWS, KV_BLOCK,
};
use crate::backend::cpu::vecops;
use crate::backend::cpu::workspace::{carve, try_zeroed, Workspace};
use crate::backend::cuda::plan::GpuAlgo;
use crate::error::{Error, Result};
use crate::problem::{Case, DType, Inputs, Mode, PageOrder, Paging, Shape};
use crate::sim::plan::even_chunks;

/// Which loop order.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Naive,
    Online,
    Split,
    /// Split over a paged cache.
    Paged,
}

pub struct Decode {
    kind: Kind,
    info: &'static VariantInfo,
}

pub static DECODE_NAIVE: Decode = Decode {
    kind: Kind::Naive,
    info: &VariantInfo {
        name: "decode-naive",
        description:
            "decode: all scores of the new queries over the cache materialized, softmax, then PV",
        source: "standard attention over a KV cache, as in the Transformers Inference Optimization Toolset (2024)",
        modes: &[Mode::Decode],
        default_q_chunk: None,
        default_kv_chunk: None,
        numerically_safe: true,
    },
};

pub static DECODE_ONLINE: Decode = Decode {
    kind: Kind::Online,
    info: &VariantInfo {
        name: "decode-online",
        description:
            "decode: one pass over the cache, key by key, running max and sums per query row",
        source: "Rabe & Staats 2021, Sec. 3 (one key at a time, running max and sums)",
        modes: &[Mode::Decode],
        default_q_chunk: None,
        default_kv_chunk: None,
        numerically_safe: true,
    },
};

pub static FLASH_DECODING: Decode = Decode {
    kind: Kind::Split,
    info: &VariantInfo {
        name: "flash-decoding",
        description: "decode: cache cut into `splits` parts in parallel, each (partial output, logsumexp) by online softmax over key blocks, combined exactly",
        source: "Flash-Decoding (Dao et al. 2023): split-KV with an exact log-sum-exp combine",
        modes: &[Mode::Decode],
        default_q_chunk: None,
        default_kv_chunk: Some(KV_BLOCK),
        numerically_safe: true,
    },
};

pub static PAGED_DECODE: Decode = Decode {
    kind: Kind::Paged,
    info: &VariantInfo {
        name: "paged-decode",
        description: "decode: flash-decoding over a paged KV cache, each key block read page by page through a block table (page_size, page_order)",
        source: "PagedAttention (Kwon et al. 2023, vLLM) as in the Transformers Inference Optimization Toolset (2024), with Flash-Decoding's split-KV",
        modes: &[Mode::Decode],
        default_q_chunk: None,
        default_kv_chunk: Some(KV_BLOCK),
        numerically_safe: true,
    },
};

/// Work items of flash-decoding wanted per thread: a few, so uneven splits still balance.
const ITEMS_PER_THREAD: usize = 2;

/// The default split count: enough (b, kv head, split) items to keep every thread busy,
/// but no split shorter than one key block.
pub fn default_splits(shape: &Shape, threads: usize) -> usize {
    let heads = (shape.batch * shape.kv_heads).max(1);
    let want = (ITEMS_PER_THREAD * threads).div_ceil(heads);
    want.min(shape.seq_kv.div_ceil(KV_BLOCK)).max(1)
}

/// The rows and keys of a decode case: query row r of a group sits at position
/// seq_kv - seq_q + (r mod seq_q); keys are the cache, contiguous.
pub(super) struct Geometry {
    pub mask: Mask,
    pub qpos: Positions,
    /// Rows per (batch, kv head) group: G * seq_q.
    pub rows: usize,
}

impl Geometry {
    pub fn of(case: &Case) -> Geometry {
        let s = &case.shape;
        Geometry {
            mask: Mask {
                causal: case.causal,
                window: case.window,
                kv_len: s.seq_kv,
            },
            qpos: Positions {
                start: s.seq_kv as i64 - s.seq_q as i64,
                stride: 1,
            },
            rows: s.group() * s.seq_q,
        }
    }

    /// Visible keys of group row `r` among the `len` keys starting at cache index `start`.
    pub fn range(
        &self,
        seq_q: usize,
        r: usize,
        start: usize,
        len: usize,
    ) -> std::ops::Range<usize> {
        let keys = Positions {
            start: start as i64,
            stride: 1,
        };
        self.mask.visible(self.qpos.at(r % seq_q.max(1)), keys, len)
    }
}

/// Bytes of the cached keys and values the queries attend (each once, every KV head): the
/// traffic a decode step cannot avoid.
pub(super) fn kv_read_bytes(case: &Case) -> u64 {
    let s = &case.shape;
    let geo = Geometry::of(case);
    let (keys, _) = span(geo.rows, &|r| geo.range(s.seq_q, r, 0, s.seq_kv));
    (2 * s.batch * s.kv_heads * keys.len() * s.head_dim * case.dtype.size_bytes()) as u64
}

impl Decode {
    fn splits(&self, case: &Case) -> usize {
        case.splits
            .unwrap_or_else(|| default_splits(&case.shape, case.threads))
            .max(1)
    }

    fn items(&self, case: &Case) -> usize {
        let groups = case.shape.batch * case.shape.kv_heads;
        match self.kind {
            Kind::Paged if whole_sequences(&case.shape) => case.shape.batch * self.splits(case),
            Kind::Split | Kind::Paged => groups * self.splits(case),
            _ => groups,
        }
    }

    /// (workers, floats per worker).
    fn layout(&self, case: &Case) -> (usize, usize) {
        let s = &case.shape;
        let rows = match self.kind {
            // paged-decode's items of whole sequences hold every head's rows.
            Kind::Paged if whole_sequences(s) => s.heads * s.seq_q,
            _ => s.group() * s.seq_q,
        };
        let d = s.head_dim;
        let widen = case.dtype != DType::F32;
        let q = if widen { rows * d } else { 0 };
        let floats = match self.kind {
            Kind::Naive => q + materialized_scratch_len(KV_BLOCK, d, widen),
            Kind::Online => q + 2 * rows + sequential_scratch_len(rows, d, widen),
            Kind::Split => q + 2 * rows + scratch_len(rows, bk(case), d, widen, false),
            Kind::Paged if whole_sequences(s) => {
                q + 2 * rows + scratch_len(rows, merged_block(case), d, widen, false)
            }
            Kind::Paged => q + 2 * rows + scratch_len(rows, bk(case), d, widen, true),
        };
        (case.threads.min(self.items(case)).max(1), floats)
    }

    /// Entries of the block table paged-decode translates per call; 0 for the others.
    fn table_entries(&self, case: &Case) -> usize {
        match (self.kind, case.paging) {
            (Kind::Paged, Some(p)) => p.table_len(&case.shape),
            _ => 0,
        }
    }

    /// Partial outputs and logsumexps of flash-decoding, or the naive score matrix.
    fn buffers(&self, case: &Case) -> usize {
        let s = &case.shape;
        match self.kind {
            Kind::Naive => s.batch * s.heads * s.seq_q * s.seq_kv,
            Kind::Online => 0,
            Kind::Split | Kind::Paged => {
                self.splits(case) * s.batch * s.heads * s.seq_q * (s.head_dim + 1)
            }
        }
    }
}

fn bk(case: &Case) -> usize {
    case.kv_chunk.unwrap_or(KV_BLOCK).max(1)
}

impl Variant for Decode {
    /// flash-decoding only; the other two decode variants have no CUDA kernels.
    fn cuda(&self) -> Option<GpuAlgo> {
        matches!(self.kind, Kind::Split).then_some(GpuAlgo::FlashDecoding)
    }

    /// The decode kernels (`backend::cpu::decode`) run their score and value products
    /// through the packing SGEMM.
    fn uses_packing_gemm(&self, _case: &Case) -> bool {
        true
    }

    fn info(&self) -> &'static VariantInfo {
        self.info
    }

    fn predict_workspace_bytes(&self, case: &Case, _isa: Isa) -> u64 {
        let (workers, floats) = self.layout(case);
        4 * self.buffers(case) as u64
            + Workspace::bytes(workers, floats)
            + 8 * self.table_entries(case) as u64
    }

    fn unsupported(&self, case: &Case) -> Option<String> {
        if case.devices != 1 {
            return Some(format!(
                "variant {} runs on one device (devices = {} requested)",
                self.info.name, case.devices
            ));
        }
        match (self.kind, case.paging) {
            (Kind::Paged, None) => Some("paged-decode needs a page_size".into()),
            (Kind::Paged, Some(p)) => p.unsupported(&case.shape),
            _ => None,
        }
    }

    fn default_splits(&self, shape: &Shape, threads: usize) -> Option<usize> {
        match self.kind {
            // Items are whole sequences: the splits alone must fill the threads per sequence.
            Kind::Paged if whole_sequences(shape) => Some(default_splits(
                &Shape {
                    kv_heads: 1,
                    ..*shape
                },
                threads,
            )),
            Kind::Split | Kind::Paged => Some(default_splits(shape, threads)),
            _ => None,
        }
    }

    fn default_paging(&self) -> Option<Paging> {
        (self.kind == Kind::Paged).then_some(Paging {
            page_size: Paging::DEFAULT_PAGE_SIZE,
            order: PageOrder::Shuffled,
        })
    }

    fn kv_read_bytes(&self, case: &Case) -> Option<u64> {
        Some(kv_read_bytes(case))
    }

    fn forward_cpu(&self, case: &Case, _isa: Isa, inputs: &Inputs, out: &mut [f32]) -> Result<()> {
        let (workers, floats) = self.layout(case);
        match self.kind {
            Kind::Naive => {
                let mut scores = try_zeroed(self.buffers(case), "decode-naive score matrix S")?;
                let ws = Workspace::new(workers, floats, "decode-naive workspace")?;
                naive(case, inputs, &mut scores, &ws, out);
            }
            Kind::Online => {
                let ws = Workspace::new(workers, floats, "decode-online state")?;
                online(case, inputs, &ws, out);
            }
            Kind::Split | Kind::Paged => {
                let s = &case.shape;
                let rows = s.batch * s.heads * s.seq_q;
                let splits = self.splits(case);
                let name = self.info.name;
                // The block table as element offsets of the pages (head 0), once per call.
                let pool = match self.kind {
                    Kind::Paged => Some(pool_of(case, inputs)?),
                    _ => None,
                };
                let table = pool.map(|p| page_offsets(&case.shape, p)).transpose()?;
                let mut part_o = try_zeroed(splits * rows * s.head_dim, name)?;
                let mut part_lse = try_zeroed(splits * rows, name)?;
                let ws = Workspace::new(workers, floats, name)?;
                let cache = match (pool, &table) {
                    (Some(pool), Some(offsets)) => Cache::Paged { pool, offsets },
                    _ => Cache::Contiguous,
                };
                match cache {
                    Cache::Paged { pool, offsets } if whole_sequences(s) => split_pages(
                        case,
                        inputs,
                        pool,
                        offsets,
                        splits,
                        &mut part_o,
                        &mut part_lse,
                        &ws,
                    ),
                    _ => split_kv(case, inputs, cache, splits, &mut part_o, &mut part_lse, &ws),
                }
                combine_splits(case, splits, &part_o, &part_lse, out);
            }
        }
        Ok(())
    }
}

/// Offsets of group `gi` = b * kv_heads + g: its first Q/O row element and its K/V base.
fn group_offsets(s: &Shape, gi: usize) -> (usize, usize) {
    let (b, g) = (gi / s.kv_heads, gi % s.kv_heads);
    let q = s.q_head_offset(b, g * s.group());
    let kv = (b * s.kv_heads + g) * s.seq_kv * s.head_dim;
    (q, kv)
}

fn naive(case: &Case, inputs: &Inputs, scores: &mut [f32], ws: &Workspace, out: &mut [f32]) {
    let s = &case.shape;
    let geo = Geometry::of(case);
    let (d, rows) = (s.head_dim, geo.rows);
    out.par_chunks_mut(rows * d)
        .zip(scores.par_chunks_mut(rows * s.seq_kv))
        .enumerate()
        .for_each(|(gi, (o, sc))| {
            let (q_off, kv_off) = group_offsets(s, gi);
            let mut guard = ws.acquire();
            let widen = inputs.q.dtype() != DType::F32;
            let [qs, scratch] = carve(
                &mut guard,
                [
                    if widen { rows * d } else { 0 },
                    materialized_scratch_len(KV_BLOCK, d, widen),
                ],
            );
            let q = vecops::widen(&inputs.q, q_off, rows * d, qs);
            let keys = Keys {
                k: &inputs.k,
                v: &inputs.v,
                base: kv_off,
                len: s.seq_kv,
                pages: None,
            };
            let range = |r| geo.range(s.seq_q, r, 0, s.seq_kv);
            attend_materialized(q, rows, &range, keys, d, s.scale(), sc, o, scratch);
        });
}

fn online(case: &Case, inputs: &Inputs, ws: &Workspace, out: &mut [f32]) {
    let s = &case.shape;
    let geo = Geometry::of(case);
    let (d, rows) = (s.head_dim, geo.rows);
    out.par_chunks_mut(rows * d)
        .enumerate()
        .for_each(|(gi, o)| {
            let (q_off, kv_off) = group_offsets(s, gi);
            let mut guard = ws.acquire();
            let widen = inputs.q.dtype() != DType::F32;
            let [qs, m, l, scratch] = carve(
                &mut guard,
                [
                    if widen { rows * d } else { 0 },
                    rows,
                    rows,
                    sequential_scratch_len(rows, d, widen),
                ],
            );
            let q = vecops::widen(&inputs.q, q_off, rows * d, qs);
            let keys = Keys {
                k: &inputs.k,
                v: &inputs.v,
                base: kv_off,
                len: s.seq_kv,
                pages: None,
            };
            let range = |r| geo.range(s.seq_q, r, 0, s.seq_kv);
            let mut state = RowState { acc: o, m, l };
            state.reset();
            attend_sequential(q, rows, &range, keys, d, s.scale(), &mut state, scratch);
            state.finish(None);
        });
}

/// The pool of the case's paging among its inputs.
fn pool_of<'a>(case: &Case, inputs: &'a Inputs) -> Result<&'a crate::problem::PagedKv> {
    case.paging.and_then(|p| inputs.pool(p)).ok_or_else(|| {
        Error::Runtime(format!(
            "{}: the inputs hold no page pool for this paging",
            case.id()
        ))
    })
}

/// The block table of `pool` as the element offset of each page (KV head 0), in a buffer
/// the memory counter sees: the paging's own overhead.
fn page_offsets(shape: &Shape, pool: &crate::problem::PagedKv) -> Result<Vec<usize>> {
    let mut offsets = Vec::new();
    offsets.try_reserve_exact(pool.table.len()).map_err(|_| {
        Error::OutOfMemory(format!(
            "paged-decode block table: {} bytes could not be allocated",
            8 * pool.table.len()
        ))
    })?;
    offsets.extend(pool.table.iter().map(|&p| pool.page_offset(shape, p, 0)));
    Ok(offsets)
}

/// Whether paged-decode's work items are whole sequences (every KV head of one sequence,
/// `attend_paged_heads`: each page read as one stretch), which it does for decode rows;
/// with `GEMM_MIN_ROWS` rows or more per KV head (long query chunks), items are (sequence,
/// head) and a key block's pages are gathered for the SGEMM.
fn whole_sequences(s: &Shape) -> bool {
    s.group() * s.seq_q < GEMM_MIN_ROWS
}

/// Keys per block of `attend_paged_heads`: the case's block shared by the KV heads, so the
/// values a block prefetches (every head's) stay the size one head's block would be and
/// still sit in L2 when they are accumulated; at least one page.
fn merged_block(case: &Case) -> usize {
    let page = case.paging.map_or(1, |p| p.page_size);
    (bk(case) / case.shape.kv_heads.max(1)).max(page).max(1)
}

/// paged-decode's (split, sequence) items: every head of the sequence over the split's
/// part of its pages, into `part_o` (`[splits, b, h, seq_q, d]`) and `part_lse`.
#[allow(clippy::too_many_arguments)]
fn split_pages(
    case: &Case,
    inputs: &Inputs,
    pool: &crate::problem::PagedKv,
    offsets: &[usize],
    splits: usize,
    part_o: &mut [f32],
    part_lse: &mut [f32],
    ws: &Workspace,
) {
    let s = &case.shape;
    let geo = Geometry::of(case);
    let (d, rows) = (s.head_dim, geo.rows);
    let total = s.heads * s.seq_q;
    let (attended, _) = span(rows, &|r| geo.range(s.seq_q, r, 0, s.seq_kv));
    let parts = even_chunks(attended, splits);
    let (bk, page) = (merged_block(case), pool.paging.page_size);
    part_o
        .par_chunks_mut(total * d)
        .zip(part_lse.par_chunks_mut(total))
        .enumerate()
        .for_each(|(item, (o, lse))| {
            let (split, b) = (item / s.batch, item % s.batch);
            let part = &parts[split];
            let mut guard = ws.acquire();
            let widen = inputs.q.dtype() != DType::F32;
            let [qs, m, l, scratch] = carve(
                &mut guard,
                [
                    if widen { total * d } else { 0 },
                    total,
                    total,
                    scratch_len(total, bk, d, widen, false),
                ],
            );
            let q = vecops::widen(&inputs.q, s.q_head_offset(b, 0), total * d, qs);
            let keys = pool_keys(pool, offsets, s, b, 0, part);
            let range = |r| geo.range(s.seq_q, r, part.start, part.len());
            let mut state = RowState { acc: o, m, l };
            state.reset();
            let h = s.kv_heads;
            attend_paged_heads(
                q,
                h,
                rows,
                &range,
                keys,
                page * d,
                d,
                s.scale(),
                bk,
                &mut state,
                scratch,
            );
            state.finish(Some(lse));
        });
}

/// Sequence `b`'s keys `part` in `pool` (`offsets`: the block table as element offsets),
/// from element `base` of each page (a KV head's slice; 0 for every head).
fn pool_keys<'a>(
    pool: &'a crate::problem::PagedKv,
    offsets: &'a [usize],
    s: &Shape,
    b: usize,
    base: usize,
    part: &std::ops::Range<usize>,
) -> Keys<'a> {
    let pps = pool.paging.pages_per_seq(s);
    Keys {
        k: &pool.k,
        v: &pool.v,
        base,
        len: part.len(),
        pages: Some(Pages {
            size: pool.paging.page_size,
            offsets: &offsets[b * pps..(b + 1) * pps],
            first: part.start,
        }),
    }
}

/// Where split_kv reads the cache: the logical K and V, or a pool of pages.
#[derive(Clone, Copy)]
enum Cache<'a> {
    Contiguous,
    Paged {
        pool: &'a crate::problem::PagedKv,
        offsets: &'a [usize],
    },
}

/// Every (split, group) item: the online softmax over its part of the attended cache, into
/// its slots of `part_o` (`[splits, b, h, seq_q, d]`) and `part_lse` (`[splits, b, h, seq_q]`).
fn split_kv(
    case: &Case,
    inputs: &Inputs,
    cache: Cache,
    splits: usize,
    part_o: &mut [f32],
    part_lse: &mut [f32],
    ws: &Workspace,
) {
    let s = &case.shape;
    let geo = Geometry::of(case);
    let (d, rows) = (s.head_dim, geo.rows);
    let groups = s.batch * s.kv_heads;
    let (attended, _) = span(rows, &|r| geo.range(s.seq_q, r, 0, s.seq_kv));
    let parts = even_chunks(attended, splits);
    let bk = bk(case);
    let paged = matches!(cache, Cache::Paged { .. });
    part_o
        .par_chunks_mut(rows * d)
        .zip(part_lse.par_chunks_mut(rows))
        .enumerate()
        .for_each(|(item, (o, lse))| {
            let (split, gi) = (item / groups, item % groups);
            let part = &parts[split];
            let (q_off, kv_off) = group_offsets(s, gi);
            let mut guard = ws.acquire();
            let widen = inputs.q.dtype() != DType::F32;
            let [qs, m, l, scratch] = carve(
                &mut guard,
                [
                    if widen { rows * d } else { 0 },
                    rows,
                    rows,
                    scratch_len(rows, bk, d, widen, paged),
                ],
            );
            let q = vecops::widen(&inputs.q, q_off, rows * d, qs);
            let keys = match cache {
                Cache::Contiguous => Keys {
                    k: &inputs.k,
                    v: &inputs.v,
                    base: kv_off + part.start * d,
                    len: part.len(),
                    pages: None,
                },
                Cache::Paged { pool, offsets } => {
                    let (b, g) = (gi / s.kv_heads, gi % s.kv_heads);
                    pool_keys(pool, offsets, s, b, g * pool.paging.page_size * d, part)
                }
            };
            let range = |r| geo.range(s.seq_q, r, part.start, part.len());
            let mut state = RowState { acc: o, m, l };
            state.reset();
            attend(q, rows, &range, keys, d, s.scale(), bk, &mut state, scratch);
            state.finish(Some(lse));
        });
}

/// out[row] = the exact combination of the splits' (o, lse) of that row.
fn combine_splits(case: &Case, splits: usize, part_o: &[f32], part_lse: &[f32], out: &mut [f32]) {
    let d = case.shape.head_dim;
    let rows = out.len() / d.max(1);
    out.par_chunks_mut(d.max(1)).enumerate().for_each(|(r, o)| {
        let parts = (0..splits).map(|sp| {
            let i = sp * rows + r;
            (&part_o[i * d..(i + 1) * d], part_lse[i])
        });
        combine(parts, o);
    });
}
