//! Split-KV decoding (Flash-Decoding, Dao et al. 2023) for `flash-decoding` and
//! `paged-decode` (`variant::decode`): each sequence's attended keys are cut into parts,
//! one work item per (part, sequence, KV head) (or per (part, sequence), every KV head at
//! once, for paged-decode's decode rows), each giving (partial output, logsumexp) per row,
//! combined exactly afterwards. A batch of equal lengths cuts every sequence into `splits`
//! parts; a ragged batch (`BatchSpec`, packed) cuts its whole cache into `splits` parts of
//! about equal length, so a long sequence gets more parts than a short one and the items
//! stay balanced (as FlashInfer's scheduler balances a batch), and its sequences may mix
//! decodes with prefill chunks (a continuous-batching step in one call): a sequence with
//! more query rows than one item should hold is cut into query tiles of `ITEM_ROWS` rows
//! per KV head, so a prefill chunk's items stay SGEMM-sized and a causal tile skips the
//! keys after its last token (such a sequence keeps its keys in one part: its tiles are
//! its items, and more parts would only multiply its partials). Cost: the keys read once per item; extra memory the
//! partials, splits x rows x (d + 1) floats, and for a ragged batch its item table,
//! O(items).

use std::ops::Range;

use rayon::prelude::*;

use super::decode::{attended, Geometry};
use crate::backend::cpu::combine::combine;
use crate::backend::cpu::decode::{
    attend, attend_paged_heads, scratch_len, Keys, Pages, RowState, GEMM_MIN_ROWS, KV_BLOCK,
};
use crate::backend::cpu::isa::Isa;
use crate::backend::cpu::vecops;
use crate::backend::cpu::workspace::{carve, Workspace};
use crate::error::{Error, Result};
use crate::problem::{Case, Fp8Kv, Inputs, PagedKv, SeqLayout, Shape};
use crate::sim::plan::even_chunks;

/// Query rows (all heads of a KV head's group) one item of a ragged batch holds at most:
/// a prefill chunk's rows are cut into tiles of `ITEM_ROWS / G` tokens, so an item's
/// scores stay `ITEM_ROWS x kv_chunk` and its product an SGEMM of a few panels.
pub(super) const ITEM_ROWS: usize = 128;

/// One work item: part `part` of sequence `seq`'s attended keys for KV heads
/// `kv_head..kv_head + kv_count` and the sequence's query tokens `q_start..q_start +
/// q_len` (a tile), writing partial rows `row..row + rows`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Item {
    pub seq: usize,
    pub part: usize,
    pub kv_head: usize,
    pub kv_count: usize,
    pub q_start: usize,
    pub q_len: usize,
    /// Every KV head of the sequence at once, page by page (`attend_paged_heads`).
    pub whole: bool,
    pub row: usize,
    pub rows: usize,
}

/// The items of one call and where their partials go: part-major, so the partial rows of
/// part p are one block, the sequences in order, each `heads x q_b` rows (by query tile,
/// then head, then the tile's tokens).
pub(super) struct Schedule {
    pub seqs: SeqLayout,
    heads: usize,
    kv_heads: usize,
    /// Whether paged-decode's items of decode rows are whole sequences.
    paged: bool,
    splits: usize,
    plan: Plan,
}

enum Plan {
    /// Equal lengths: every sequence has the same parts; items follow by arithmetic (no
    /// allocation but the parts, as before ragged batches existed).
    Batched {
        parts: Vec<Range<usize>>,
        whole: bool,
    },
    /// A ragged batch: each sequence's parts (`parts[first[b]..first[b + 1]]`), the first
    /// partial row of each (same index) and the items in order.
    Ragged {
        parts: Vec<Range<usize>>,
        first: Vec<usize>,
        block: Vec<usize>,
        items: Vec<Item>,
    },
}

/// Whether paged-decode runs the rows of a sequence with `q` queries every KV head at once
/// (`attend_paged_heads`: each page read as one stretch), which it does for decode rows;
/// with `GEMM_MIN_ROWS` rows or more per KV head (long query chunks), items are (sequence,
/// head) and a key block's pages are gathered for the SGEMM.
pub(super) fn whole_sequence(s: &Shape, q: usize) -> bool {
    s.group() * q < GEMM_MIN_ROWS
}

/// Query tokens of one tile of a ragged batch's sequence of `q` queries: all of them when
/// they fit `ITEM_ROWS` rows per KV head.
fn tile_tokens(group: usize, q: usize) -> usize {
    (ITEM_ROWS / group.max(1)).max(1).min(q.max(1))
}

impl Schedule {
    pub fn of(case: &Case, splits: usize, paged: bool) -> Schedule {
        let s = &case.shape;
        let seqs = case.seq_layout();
        let splits = splits.max(1);
        let plan = if !seqs.packed() {
            Plan::Batched {
                parts: even_chunks(attended(case, &seqs, 0), splits),
                whole: paged && whole_sequence(s, s.seq_q),
            }
        } else {
            let spans: Vec<Range<usize>> =
                (0..seqs.len()).map(|b| attended(case, &seqs, b)).collect();
            let total: usize = spans.iter().map(|r| r.len()).sum();
            let per = total.div_ceil(splits).max(1);
            // A sequence of several query tiles has its tiles as items: cutting its keys
            // too would only multiply its partials.
            let counts: Vec<usize> = spans
                .iter()
                .enumerate()
                .map(|(b, r)| {
                    let q = seqs.q_len(b);
                    if tile_tokens(s.group(), q) < q {
                        1
                    } else {
                        r.len().div_ceil(per).max(1)
                    }
                })
                .collect();
            // Every table allocated at its exact length: the prediction counts them.
            let mut parts = Vec::with_capacity(counts.iter().sum());
            let mut first = Vec::with_capacity(seqs.len() + 1);
            first.push(0);
            for (r, &n) in spans.iter().zip(&counts) {
                parts.extend(even_chunks(r.clone(), n));
                first.push(parts.len());
            }
            // (whole sequence, KV heads per item, query tokens per tile) of sequence b.
            let cut = |b: usize| {
                let q = seqs.q_len(b);
                let whole = paged && whole_sequence(s, q);
                (
                    whole,
                    if whole { s.kv_heads } else { 1 },
                    tile_tokens(s.group(), q),
                )
            };
            let n_items = (0..seqs.len())
                .map(|b| {
                    let (_, per_item, tile) = cut(b);
                    counts[b] * seqs.q_len(b).div_ceil(tile) * (s.kv_heads / per_item)
                })
                .sum();
            let mut block = vec![0; parts.len()];
            let mut items = Vec::with_capacity(n_items);
            let most = counts.iter().copied().max();
            let mut row = 0;
            for p in 0..most.unwrap_or(0) {
                for b in (0..seqs.len()).filter(|&b| p < counts[b]) {
                    let q = seqs.q_len(b);
                    block[first[b] + p] = row;
                    let (whole, per_item, tile) = cut(b);
                    for q_start in (0..q).step_by(tile) {
                        let q_len = tile.min(q - q_start);
                        for g in (0..s.kv_heads).step_by(per_item) {
                            items.push(Item {
                                seq: b,
                                part: p,
                                kv_head: g,
                                kv_count: per_item,
                                q_start,
                                q_len,
                                whole,
                                row: row + q_start * s.heads + g * s.group() * q_len,
                                rows: per_item * s.group() * q_len,
                            });
                        }
                    }
                    row += s.heads * q;
                }
            }
            Plan::Ragged {
                parts,
                first,
                block,
                items,
            }
        };
        Schedule {
            seqs,
            heads: s.heads,
            kv_heads: s.kv_heads,
            paged,
            splits,
            plan,
        }
    }

    /// Bytes of the tables a ragged batch's schedule holds while its items run: the
    /// sequences' offsets, parts, partial blocks and items (0 for a batch of equal lengths,
    /// whose items follow by arithmetic).
    pub fn table_bytes(&self) -> usize {
        use std::mem::size_of;
        match &self.plan {
            Plan::Batched { .. } => 0,
            Plan::Ragged {
                parts,
                first,
                block,
                items,
            } => {
                2 * size_of::<usize>() * (self.seqs.len() + 1)
                    + parts.len() * size_of::<Range<usize>>()
                    + (first.len() + block.len()) * size_of::<usize>()
                    + items.len() * size_of::<Item>()
            }
        }
    }

    /// Work items.
    pub fn len(&self) -> usize {
        match &self.plan {
            Plan::Batched { whole, .. } => {
                self.splits * self.seqs.len() * if *whole { 1 } else { self.kv_heads }
            }
            Plan::Ragged { items, .. } => items.len(),
        }
    }

    /// Item `i`, in the order their partials lie.
    pub fn item(&self, i: usize) -> Item {
        match &self.plan {
            Plan::Batched { whole, .. } => {
                let k = if *whole { 1 } else { self.kv_heads };
                let kv_count = self.kv_heads / k;
                let rows = kv_count * (self.heads / self.kv_heads) * self.seqs.q_len(0);
                let per_part = self.seqs.len() * k;
                Item {
                    seq: (i % per_part) / k,
                    part: i / per_part,
                    kv_head: (i % k) * kv_count,
                    kv_count,
                    q_start: 0,
                    q_len: self.seqs.q_len(0),
                    whole: *whole,
                    row: i * rows,
                    rows,
                }
            }
            Plan::Ragged { items, .. } => items[i],
        }
    }

    /// The rows of every item when they are all equal (a batch of equal lengths).
    fn equal_rows(&self) -> Option<usize> {
        matches!(self.plan, Plan::Batched { .. }).then(|| self.item(0).rows)
    }

    /// Parts of sequence `b`.
    fn parts_of(&self, b: usize) -> usize {
        match &self.plan {
            Plan::Batched { parts, .. } => parts.len(),
            Plan::Ragged { first, .. } => first[b + 1] - first[b],
        }
    }

    /// Keys of part `p` of sequence `b`.
    pub fn part(&self, b: usize, p: usize) -> Range<usize> {
        match &self.plan {
            Plan::Batched { parts, .. } => parts[p].clone(),
            Plan::Ragged { parts, first, .. } => parts[first[b] + p].clone(),
        }
    }

    /// First partial row of sequence `b`'s block in part `p`.
    fn block(&self, b: usize, p: usize) -> usize {
        match &self.plan {
            Plan::Batched { .. } => (p * self.seqs.len() + b) * self.heads * self.seqs.q_len(0),
            Plan::Ragged { first, block, .. } => block[first[b] + p],
        }
    }

    /// Query tokens per tile of sequence `b` (a batch of equal lengths: one tile).
    fn tile(&self, b: usize) -> usize {
        let q = self.seqs.q_len(b);
        match &self.plan {
            Plan::Batched { .. } => q.max(1),
            Plan::Ragged { .. } => tile_tokens(self.heads / self.kv_heads.max(1), q),
        }
    }

    /// Partial rows of all parts (each holds `head_dim` output values and a logsumexp).
    pub fn partial_rows(&self) -> usize {
        (0..self.seqs.len())
            .map(|b| self.parts_of(b) * self.heads * self.seqs.q_len(b))
            .sum()
    }

    /// Floats of one worker's workspace: the largest item's.
    pub fn worker_floats(&self, case: &Case) -> usize {
        let d = case.shape.head_dim;
        let (widen, widen_kv) = super::decode::widens(case);
        let floats = |item: Item| {
            let gathers =
                widen || !contiguous(&self.seqs, item, item.kv_count * case.shape.group());
            let q = if gathers { item.rows * d } else { 0 };
            let scratch = if item.whole {
                scratch_len(item.rows, merged_block(case), d, widen_kv, false)
            } else {
                scratch_len(item.rows, bk(case), d, widen_kv, self.paged)
            };
            q + 2 * item.rows + scratch
        };
        match &self.plan {
            Plan::Batched { .. } => floats(self.item(0)),
            Plan::Ragged { items, .. } => items.iter().map(|&i| floats(i)).max().unwrap_or(0),
        }
    }
}

pub(super) fn bk(case: &Case) -> usize {
    case.kv_chunk.unwrap_or(KV_BLOCK).max(1)
}

/// Keys per block where `attend` gathers a paged block for the SGEMM (`GEMM_MIN_ROWS`
/// rows or more): the case's block, at most as many keys as keep 4 x keys x d floats
/// within half of this core's L2 (`cache::l2_bytes`, read from the machine), at least 16:
/// the gathered K and V and, when the rule was measured, the `matrixmultiply` SGEMM's
/// packed copies of both (the tiles now pack only K^T, 256 keys at a time, so it is on the
/// safe side). Why: at 1024 keys, d = 128,
/// the 2 MiB they take spilled a 1 MiB L2 and the gather cost paged-decode 10% against
/// flash-decoding on 4 new tokens (docs/internals/paged-decode.md). A smaller block only
/// moves the online softmax's rescaling points; the scratch stays sized for the case's.
pub(super) fn gather_block(case: &Case) -> usize {
    let l2 = crate::backend::cpu::cache::l2_bytes();
    gather_block_in(bk(case), case.shape.head_dim, l2)
}

fn gather_block_in(bk: usize, d: usize, l2_bytes: usize) -> usize {
    let fit = l2_bytes / 2 / (4 * d.max(1) * std::mem::size_of::<f32>());
    bk.min(fit.max(16))
}

/// Keys per block of `attend_paged_heads`: the case's block shared by the KV heads, so the
/// values a block prefetches (every head's) stay the size one head's block would be and
/// still sit in L2 when they are accumulated; at least one page.
pub(super) fn merged_block(case: &Case) -> usize {
    let page = case.paging.map_or(1, |p| p.page_size);
    (bk(case) / case.shape.kv_heads.max(1)).max(page).max(1)
}

/// Where the items read the cache: the logical K and V, or a pool of pages with its block
/// table as element offsets.
#[derive(Clone, Copy)]
pub(super) enum Cache<'a> {
    Contiguous,
    Paged {
        pool: &'a PagedKv,
        offsets: &'a [usize],
    },
}

/// The pool of the case's paging among its inputs.
pub(super) fn pool_of<'a>(case: &Case, inputs: &'a Inputs) -> Result<&'a PagedKv> {
    case.paging.and_then(|p| inputs.pool(p)).ok_or_else(|| {
        Error::Runtime(format!(
            "{}: the inputs hold no page pool for this paging",
            case.id()
        ))
    })
}

/// The block table of `pool` as the element offset of each page (KV head 0), in a buffer
/// the memory counter sees: the paging's own overhead.
pub(super) fn page_offsets(shape: &Shape, pool: &PagedKv) -> Result<Vec<usize>> {
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

/// Sequence `b`'s keys `part` in `pool` (`offsets`: the block table as element offsets),
/// from element `base` of each page (a KV head's slice; 0 for every head).
fn pool_keys<'a>(
    pool: &'a PagedKv,
    offsets: &'a [usize],
    b: usize,
    base: usize,
    part: &Range<usize>,
    isa: Isa,
) -> Keys<'a> {
    Keys {
        k: &pool.k,
        v: &pool.v,
        base,
        len: part.len(),
        pages: Some(Pages {
            size: pool.paging.page_size,
            offsets: &offsets[pool.indptr[b]..pool.indptr[b + 1]],
            first: part.start,
        }),
        isa,
        fp8: None,
    }
}

/// Whether an item's query rows (`heads` query heads) are one run in Q: every token of
/// its sequence, in heads that lie one after another.
fn contiguous(seqs: &SeqLayout, item: Item, heads: usize) -> bool {
    item.q_len == seqs.q_len(item.seq) && seqs.heads_contiguous(heads)
}

/// An item's query rows (its heads, its tile of tokens) as one f32 run: borrowed where
/// they are one run of f32 already, else copied (widened) into `qs`.
fn query_rows<'a>(
    q: &'a crate::problem::Tensor,
    seqs: &SeqLayout,
    item: Item,
    heads: Range<usize>,
    d: usize,
    qs: &'a mut [f32],
) -> &'a [f32] {
    let (b, n) = (item.seq, item.q_len * d);
    let at = |h| seqs.q_row(b, h, item.q_start) * d;
    if contiguous(seqs, item, heads.len()) {
        return vecops::widen(q, at(heads.start), heads.len() * n, qs);
    }
    for (i, h) in heads.clone().enumerate() {
        vecops::widen_into(q, at(h), &mut qs[i * n..(i + 1) * n]);
    }
    &qs[..heads.len() * n]
}

/// Runs every item into its partial rows of `part_o` (`partial_rows x d`) and `part_lse`.
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    case: &Case,
    isa: Isa,
    inputs: &Inputs,
    fp8: Option<&Fp8Kv>,
    sched: &Schedule,
    cache: Cache,
    part_o: &mut [f32],
    part_lse: &mut [f32],
    ws: &Workspace,
) {
    let d = case.shape.head_dim;
    let one = |i: usize, o: &mut [f32], lse: &mut [f32]| {
        run_item(
            case,
            isa,
            inputs,
            fp8,
            sched,
            cache,
            sched.item(i),
            o,
            lse,
            ws,
        )
    };
    match sched.equal_rows() {
        Some(rows) => part_o
            .par_chunks_mut(rows * d)
            .zip(part_lse.par_chunks_mut(rows))
            .enumerate()
            .for_each(|(i, (o, lse))| one(i, o, lse)),
        None => split_run(sched, 0..sched.len(), d, part_o, part_lse, &one),
    }
}

/// Items `items` over their partials (`o`, `lse` start at the first item's), halved
/// recursively with `rayon::join`: items of unequal rows, each given its own slices
/// without a table of them.
fn split_run(
    sched: &Schedule,
    items: Range<usize>,
    d: usize,
    o: &mut [f32],
    lse: &mut [f32],
    one: &(impl Fn(usize, &mut [f32], &mut [f32]) + Sync),
) {
    match items.len() {
        0 => {}
        1 => one(items.start, o, lse),
        n => {
            let mid = items.start + n / 2;
            let at = sched.item(mid).row - sched.item(items.start).row;
            let (o1, o2) = o.split_at_mut(at * d);
            let (l1, l2) = lse.split_at_mut(at);
            rayon::join(
                || split_run(sched, items.start..mid, d, o1, l1, one),
                || split_run(sched, mid..items.end, d, o2, l2, one),
            );
        }
    }
}

/// One item: the online softmax of its rows over its part of the keys, into `o`, `lse`.
#[allow(clippy::too_many_arguments)]
fn run_item(
    case: &Case,
    isa: Isa,
    inputs: &Inputs,
    fp8: Option<&Fp8Kv>,
    sched: &Schedule,
    cache: Cache,
    item: Item,
    o: &mut [f32],
    lse: &mut [f32],
    ws: &Workspace,
) {
    let s = &case.shape;
    let (d, b, group) = (s.head_dim, item.seq, s.group());
    let geo = Geometry::of_sequence(case, sched.seqs.q_len(b), sched.seqs.kv_len(b));
    let part = sched.part(b, item.part);
    let heads = item.kv_head * group..(item.kv_head + item.kv_count) * group;
    let (widen, widen_kv) = super::decode::widens(case);
    let gathers = widen || !contiguous(&sched.seqs, item, heads.len());
    let (rows, paged) = (item.rows, matches!(cache, Cache::Paged { .. }));
    let block = match cache {
        _ if item.whole => merged_block(case),
        Cache::Paged { .. } if rows >= GEMM_MIN_ROWS => gather_block(case),
        _ => bk(case),
    };
    let mut guard = ws.acquire();
    let [qs, m, l, scratch] = carve(
        &mut guard,
        [
            if gathers { rows * d } else { 0 },
            rows,
            rows,
            scratch_len(rows, block, d, widen_kv, paged && !item.whole),
        ],
    );
    let q = query_rows(&inputs.q, &sched.seqs, item, heads, d, qs);
    let range = |r| geo.token_range(item.q_start + r % item.q_len, part.start, part.len());
    let mut state = RowState { acc: o, m, l };
    state.reset();
    match cache {
        Cache::Paged { pool, offsets } if item.whole => {
            let keys = pool_keys(pool, offsets, b, 0, &part, isa);
            let stride = pool.paging.page_size * d;
            let (h, scale) = (s.kv_heads, s.scale());
            attend_paged_heads(
                q, h, geo.rows, &range, keys, stride, d, scale, block, &mut state, scratch,
            );
        }
        _ => {
            let keys = match cache {
                Cache::Paged { pool, offsets } => {
                    let base = item.kv_head * pool.paging.page_size * d;
                    pool_keys(pool, offsets, b, base, &part, isa)
                }
                Cache::Contiguous => Keys {
                    k: &inputs.k,
                    v: &inputs.v,
                    base: sched.seqs.kv_base(b, item.kv_head) + part.start * d,
                    len: part.len(),
                    pages: None,
                    isa,
                    fp8,
                },
            };
            let scale = s.scale();
            attend(q, rows, &range, keys, d, scale, block, &mut state, scratch);
            // Attention sinks (flash-decoding's contiguous cache only: paged-decode takes
            // none) precede the windows the parts cut, so the first part reads them too.
            if item.part == 0 && geo.has_sinks() && matches!(cache, Cache::Contiguous) {
                let (kv, base) = (sched.seqs.kv_len(b), sched.seqs.kv_base(b, item.kv_head));
                let sinks = |r| geo.token_sink_range(item.q_start + r % item.q_len, 0, kv);
                let keys = Keys {
                    base,
                    len: kv,
                    ..keys
                };
                attend(q, rows, &sinks, keys, d, scale, block, &mut state, scratch);
            }
        }
    }
    state.finish(Some(lse));
}

/// out[row] = the exact combination of that row's partials over its sequence's parts.
pub(super) fn combine_parts(
    sched: &Schedule,
    d: usize,
    part_o: &[f32],
    part_lse: &[f32],
    out: &mut [f32],
) {
    out.par_chunks_mut(d.max(1)).enumerate().for_each(|(r, o)| {
        let (b, h, i) = sched.seqs.row_of(r);
        let (q, tile) = (sched.seqs.q_len(b), sched.tile(b));
        // Tile t's rows come after the t earlier (full) tiles of every head, by head.
        let t0 = i / tile * tile;
        let within = t0 * sched.heads + h * tile.min(q - t0) + (i - t0);
        let parts = (0..sched.parts_of(b)).map(|p| {
            let at = sched.block(b, p) + within;
            (&part_o[at * d..(at + 1) * d], part_lse[at])
        });
        combine(parts, o);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{BatchSpec, DType, VariantId};
    use crate::variant::DefaultCase;

    fn case(spec: Option<&str>, kv_heads: usize, paged: bool) -> Case {
        let dense = Shape {
            batch: 3,
            heads: 4,
            kv_heads,
            seq_q: 1,
            seq_kv: 300,
            head_dim: 8,
        };
        let v = if paged {
            VariantId::PagedDecode
        } else {
            VariantId::FlashDecoding
        };
        let mut c = Case::cpu_fwd(v, dense, DType::F32, 2);
        if let Some(spec) = spec {
            let spec: BatchSpec = spec.parse().unwrap();
            c.shape = spec.packed(&dense);
            c.batch_spec = Some(spec);
        }
        c
    }

    /// Every partial row is written by exactly one item, and the items of a batch of equal
    /// lengths follow the arithmetic order the ragged table would give.
    #[test]
    fn items_tile_the_partials_once() {
        for spec in [None, Some("q1kv1000+4xq1kv50+q140kv200+q3kv7")] {
            for (kv_heads, paged) in [(4, false), (2, false), (2, true), (1, true)] {
                let c = case(spec, kv_heads, paged);
                for splits in [1, 3, 8] {
                    let sched = Schedule::of(&c, splits, paged);
                    let mut seen = vec![0u8; sched.partial_rows()];
                    let mut next = 0;
                    for i in 0..sched.len() {
                        let it = sched.item(i);
                        assert_eq!(it.row, next, "{spec:?} {kv_heads} {paged} {splits}");
                        next += it.rows;
                        seen[it.row..it.row + it.rows]
                            .iter_mut()
                            .for_each(|x| *x += 1);
                        assert_eq!(it.rows, it.kv_count * c.shape.group() * it.q_len);
                    }
                    assert!(seen.iter().all(|&x| x == 1));
                    // Every sequence's parts cover its attended keys in order.
                    for b in 0..sched.seqs.len() {
                        let n = sched.parts_of(b);
                        assert_eq!(sched.part(b, 0).start, 0);
                        assert_eq!(sched.part(b, n - 1).end, sched.seqs.kv_len(b));
                        for p in 1..n {
                            assert_eq!(sched.part(b, p).start, sched.part(b, p - 1).end);
                        }
                    }
                }
            }
        }
    }

    /// The gathered block fits half of L2 with its packed copies: 256 keys of d = 128 in
    /// 1 MiB, 512 in 2 MiB; never above the case's block nor under 16 keys.
    #[test]
    fn gather_blocks_fit_half_of_l2() {
        assert_eq!(gather_block_in(1024, 128, 1 << 20), 256);
        assert_eq!(gather_block_in(1024, 128, 2 << 20), 512);
        assert_eq!(gather_block_in(100, 128, 2 << 20), 100);
        assert_eq!(gather_block_in(1024, 4096, 256 << 10), 16);
    }

    /// A ragged batch's parts are about total / splits keys: the long sequence gets most;
    /// a sequence of several query tiles (129 tokens at 1 head per KV head) keeps its keys
    /// whole.
    #[test]
    fn ragged_parts_balance_the_work() {
        let c = case(Some("q1kv1000+4xq1kv50+q129kv1200"), 4, false);
        let sched = Schedule::of(&c, 12, false);
        assert_eq!(sched.parts_of(0), 5);
        assert!((1..5).all(|b| sched.parts_of(b) == 1));
        assert!((0..5).all(|p| sched.part(0, p).len() == 200));
        assert_eq!((sched.parts_of(5), sched.part(5, 0)), (1, 0..1200));
    }
}
