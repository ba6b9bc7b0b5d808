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

use crate::backend::cpu::decode_path;
use crate::backend::cpu::isa::Isa;
use rayon::prelude::*;

use super::split_kv::{self, page_offsets, pool_of, whole_sequence, Cache, Schedule};
use super::{Variant, VariantInfo};
use crate::backend::cpu::decode::{
    attend_materialized, attend_sequential, materialized_scratch_len, sequential_scratch_len, span,
    Keys, Mask, Positions, RowState, KV_BLOCK,
};
use crate::backend::cpu::vecops;
use crate::backend::cpu::workspace::{carve, try_zeroed, Workspace};
use crate::backend::cuda::plan::GpuAlgo;
use crate::error::{Error, Result};
use crate::problem::Shape;
use crate::problem::{Case, DType, Device, Fp8Kv, Inputs, Mode, PageOrder, Paging, SeqLayout};

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
    parts_for(
        shape.seq_kv,
        shape.batch * shape.kv_heads,
        threads,
        KV_BLOCK,
    )
}

/// Parts to cut `keys` keys into when each part is computed for `units` independent items
/// (heads, sequences): enough (part, unit) items for `ITEMS_PER_THREAD` per thread, no part
/// shorter than `block` keys, at least one. The rule of every split-KV decode variant.
pub(super) fn parts_for(keys: usize, units: usize, threads: usize, block: usize) -> usize {
    (ITEMS_PER_THREAD * threads)
        .div_ceil(units.max(1))
        .min(keys.div_ceil(block.max(1)))
        .max(1)
}

/// The default split count of a ragged batch: parts of the whole cache (`variant::split_kv`),
/// 2 x `ITEMS_PER_THREAD` per thread, so that no decode's part holds more than a
/// quarter of a thread's share and sequences of unequal lengths still balance; no part
/// shorter than a key block.
pub fn ragged_default_splits(total_kv: usize, threads: usize) -> usize {
    (2 * ITEMS_PER_THREAD * threads)
        .min(total_kv.div_ceil(KV_BLOCK))
        .max(1)
}

/// The rows and keys of a decode case: query row r of a group sits at position
/// seq_kv - seq_q + (r mod seq_q); keys are the cache, contiguous.
pub(super) struct Geometry {
    pub mask: Mask,
    pub qpos: Positions,
    /// Rows per (batch, kv head) group: G * seq_q.
    pub rows: usize,
}

/// Cache indices from `start` on, one position apart.
fn contiguous(start: usize) -> Positions {
    Positions {
        start: start as i64,
        stride: 1,
    }
}

impl Geometry {
    pub fn of(case: &Case) -> Geometry {
        Geometry::of_sequence(case, case.shape.seq_q, case.shape.seq_kv)
    }

    /// One sequence of `seq_q` queries over `seq_kv` keys (of a ragged batch).
    pub fn of_sequence(case: &Case, seq_q: usize, seq_kv: usize) -> Geometry {
        Geometry {
            mask: Mask {
                causal: case.causal,
                window: case.window,
                kv_len: seq_kv,
                sinks: case.sinks.unwrap_or(0),
            },
            qpos: Positions {
                start: seq_kv as i64 - seq_q as i64,
                stride: 1,
            },
            rows: case.shape.group() * seq_q,
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
        self.token_range(r % seq_q.max(1), start, len)
    }

    /// Visible keys of the sequence's query token `t` among the `len` keys from `start`.
    pub fn token_range(&self, t: usize, start: usize, len: usize) -> std::ops::Range<usize> {
        self.mask.visible(self.qpos.at(t), contiguous(start), len)
    }

    /// `token_range`'s attention sinks: the keys of the run before both the sinks' end and
    /// the token's window (`Mask::sink_visible`); empty without sinks. Group row `r` is
    /// token `r % seq_q`.
    pub fn token_sink_range(&self, t: usize, start: usize, len: usize) -> std::ops::Range<usize> {
        self.mask
            .sink_visible(self.qpos.at(t), contiguous(start), len)
    }

    /// Whether the rows have sinks to attend besides their windows.
    pub fn has_sinks(&self) -> bool {
        self.mask.has_sinks()
    }
}

/// Bytes of the cached keys and values the queries attend (each once, every KV head): the
/// traffic a decode step cannot avoid; summed over the sequences of a ragged batch.
/// An FP8 cache: 1 byte per value, and the scales of K and V (one per KV head of each
/// row of the batch; a packed ragged batch is one row).
pub(super) fn kv_read_bytes(case: &Case) -> u64 {
    let s = &case.shape;
    let seqs = case.seq_layout();
    let keys: usize = (0..seqs.len())
        .map(|b| {
            // The sinks the windows do not already read (rows' windows start at different
            // keys when seq_q > 1).
            let (w, sinks) = (attended(case, &seqs, b), attended_sinks(case, &seqs, b));
            let extra = if w.is_empty() {
                sinks.len()
            } else {
                sinks.end.min(w.start).saturating_sub(sinks.start)
            };
            w.len() + extra
        })
        .sum();
    let values = 2 * s.kv_heads * keys * s.head_dim;
    match case.kv_dtype {
        Some(_) => (values + 2 * 4 * s.kv_heads * s.batch) as u64,
        None => (values * case.dtype.size_bytes()) as u64,
    }
}

/// The keys sequence `b` of `seqs` attends: the union of its rows' visible ranges.
pub(super) fn attended(case: &Case, seqs: &SeqLayout, b: usize) -> std::ops::Range<usize> {
    let (q, kv) = (seqs.q_len(b), seqs.kv_len(b));
    let geo = Geometry::of_sequence(case, q, kv);
    span(geo.rows, &|r| geo.range(q, r, 0, kv)).0
}

/// The attention sinks sequence `b` of `seqs` attends before its rows' windows: the union
/// of their sink ranges (empty without sinks). Each row's sinks precede its own window, but
/// with several query rows the union may reach into `attended`.
pub(super) fn attended_sinks(case: &Case, seqs: &SeqLayout, b: usize) -> std::ops::Range<usize> {
    let (q, kv) = (seqs.q_len(b), seqs.kv_len(b));
    let geo = Geometry::of_sequence(case, q, kv);
    if !geo.has_sinks() {
        return 0..0;
    }
    span(geo.rows, &|r| geo.token_sink_range(r % q.max(1), 0, kv)).0
}

impl Decode {
    fn splits(&self, case: &Case) -> usize {
        case.splits
            .unwrap_or_else(|| default_splits(&case.shape, case.threads))
            .max(1)
    }

    /// flash-decoding's and paged-decode's items.
    fn schedule(&self, case: &Case) -> Option<Schedule> {
        matches!(self.kind, Kind::Split | Kind::Paged)
            .then(|| Schedule::of(case, self.splits(case), self.kind == Kind::Paged))
    }

    /// (workers, floats per worker); `sched`: the case's `schedule`.
    fn layout(&self, case: &Case, sched: Option<&Schedule>) -> (usize, usize) {
        let s = &case.shape;
        let rows = s.group() * s.seq_q;
        let d = s.head_dim;
        let (widen, widen_kv) = widens(case);
        let q = if widen { rows * d } else { 0 };
        let (items, floats) = match (self.kind, sched) {
            (_, Some(sched)) => (sched.len(), sched.worker_floats(case)),
            (Kind::Naive, _) => (0, q + materialized_scratch_len(KV_BLOCK, d, widen_kv)),
            _ => (0, q + 2 * rows + sequential_scratch_len(rows, d, widen_kv)),
        };
        let items = if items == 0 {
            s.batch * s.kv_heads
        } else {
            items
        };
        (case.threads.min(items).max(1), floats)
    }

    /// Entries of the block table paged-decode translates per call; 0 for the others.
    fn table_entries(&self, case: &Case) -> usize {
        match (self.kind, case.paging) {
            (Kind::Paged, Some(p)) => p.table_len(&case.seq_layout()),
            _ => 0,
        }
    }

    /// Partial outputs and logsumexps of flash-decoding, or the naive score matrix.
    fn buffers(&self, case: &Case, sched: Option<&Schedule>) -> usize {
        let s = &case.shape;
        match (self.kind, sched) {
            (_, Some(sched)) => sched.partial_rows() * (s.head_dim + 1),
            (Kind::Naive, _) => s.batch * s.heads * s.seq_q * s.seq_kv,
            _ => 0,
        }
    }
}

impl Variant for Decode {
    /// flash-decoding only; the other two decode variants have no CUDA kernels.
    fn cuda(&self) -> Option<GpuAlgo> {
        matches!(self.kind, Kind::Split).then_some(GpuAlgo::FlashDecoding)
    }

    fn info(&self) -> &'static VariantInfo {
        self.info
    }

    /// Partials or scores, the workers' scratch, paged-decode's block table, and a ragged
    /// batch's schedule tables.
    fn predict_workspace_bytes(&self, case: &Case, _isa: Isa) -> u64 {
        let sched = self.schedule(case);
        let (workers, floats) = self.layout(case, sched.as_ref());
        let tables = sched.as_ref().map_or(0, |s| s.table_bytes());
        4 * self.buffers(case, sched.as_ref()) as u64
            + Workspace::bytes(workers, floats)
            + 8 * self.table_entries(case) as u64
            + tables as u64
    }

    fn unsupported(&self, case: &Case) -> Option<String> {
        if case.devices != 1 {
            return Some(format!(
                "variant {} runs on one device (devices = {} requested)",
                self.info.name, case.devices
            ));
        }
        if case.kv_dtype.is_some() && case.device == Device::Cuda {
            return Some(format!(
                "variant {} has no CUDA kernel for an FP8 cache (kv_dtype) yet",
                self.info.name
            ));
        }
        if case.batch_spec.is_some() && case.device == Device::Cuda {
            return Some(format!(
                "variant {} has no CUDA kernel for a ragged batch (batch_spec) yet",
                self.info.name
            ));
        }
        match (self.kind, case.paging) {
            (Kind::Paged, None) => Some("paged-decode needs a page_size".into()),
            (Kind::Paged, Some(p)) => p.unsupported(&case.seq_layout()),
            _ => None,
        }
    }

    fn default_splits(&self, shape: &Shape, threads: usize) -> Option<usize> {
        match self.kind {
            // Items are whole sequences: the splits alone must fill the threads per sequence.
            Kind::Paged if whole_sequence(shape, shape.seq_q) => Some(default_splits(
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

    fn default_splits_ragged(&self, shape: &Shape, threads: usize) -> Option<usize> {
        matches!(self.kind, Kind::Split | Kind::Paged)
            .then(|| ragged_default_splits(shape.seq_kv, threads))
    }

    fn default_paging(&self) -> Option<Paging> {
        (self.kind == Kind::Paged).then_some(Paging {
            page_size: Paging::DEFAULT_PAGE_SIZE,
            order: PageOrder::Shuffled,
        })
    }

    /// flash-decoding and paged-decode run a ragged batch (decodes and prefill chunks of
    /// their own lengths, packed), the split-KV schedule balancing its parts.
    fn ragged(&self) -> bool {
        matches!(self.kind, Kind::Split | Kind::Paged)
    }

    fn kv_read_bytes(&self, case: &Case) -> Option<u64> {
        Some(kv_read_bytes(case))
    }

    /// flash-decoding, decode-online and decode-naive read an FP8 cache (widened block by
    /// block with its head's scale); paged-decode's pool holds the storage dtype only.
    fn fp8_kv(&self) -> bool {
        self.kind != Kind::Paged
    }

    /// decode-online and flash-decoding fold the sinks into their online softmax;
    /// decode-naive's one softmax per row and paged-decode's page walk take the window alone.
    fn sinks(&self) -> bool {
        matches!(self.kind, Kind::Online | Kind::Split)
    }

    fn forward_cpu(&self, case: &Case, isa: Isa, inputs: &Inputs, out: &mut [f32]) -> Result<()> {
        let isa = decode_path::loops_path(isa, case.kernel_path.is_some(), case.highest());
        let fp8 = fp8_of(case, inputs)?;
        // The schedule once per call: the workers' layout and the items both read it.
        let sched = self.schedule(case);
        let (workers, floats) = self.layout(case, sched.as_ref());
        match (self.kind, sched) {
            (Kind::Naive, _) => {
                let scores = self.buffers(case, None);
                let mut scores = try_zeroed(scores, "decode-naive score matrix S")?;
                let ws = Workspace::new(workers, floats, "decode-naive workspace")?;
                naive(case, isa, inputs, fp8, &mut scores, &ws, out);
            }
            // decode-online, the kind left with no schedule.
            (_, None) => {
                let ws = Workspace::new(workers, floats, "decode-online state")?;
                online(case, isa, inputs, fp8, &ws, out);
            }
            (_, Some(sched)) => {
                let name = self.info.name;
                // The block table as element offsets of the pages (head 0), once per call.
                let pool = match self.kind {
                    Kind::Paged => Some(pool_of(case, inputs)?),
                    _ => None,
                };
                let table = pool.map(|p| page_offsets(&case.shape, p)).transpose()?;
                let rows = sched.partial_rows();
                let mut part_o = try_zeroed(rows * case.shape.head_dim, name)?;
                let mut part_lse = try_zeroed(rows, name)?;
                let ws = Workspace::new(workers, floats, name)?;
                let cache = match (pool, &table) {
                    (Some(pool), Some(offsets)) => Cache::Paged { pool, offsets },
                    _ => Cache::Contiguous,
                };
                split_kv::run(
                    case,
                    isa,
                    inputs,
                    fp8,
                    &sched,
                    cache,
                    &mut part_o,
                    &mut part_lse,
                    &ws,
                );
                let d = case.shape.head_dim;
                split_kv::combine_parts(&sched, d, &part_o, &part_lse, out);
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

/// (Q widened into scratch, K and V widened block by block) for `case`.
pub(super) fn widens(case: &Case) -> (bool, bool) {
    let q = case.dtype != DType::F32;
    (q, q || case.kv_dtype.is_some())
}

/// The FP8 cache `case` reads, if it names one; an error if the inputs lack it (a harness
/// bug: `Inputs::try_prepared_for` builds it).
pub(super) fn fp8_of<'a>(case: &Case, inputs: &'a Inputs) -> Result<Option<&'a Fp8Kv>> {
    case.kv_dtype
        .map(|f| {
            inputs.fp8_kv(f).ok_or_else(|| {
                Error::Runtime(format!("{}: the inputs hold no {f} cache", case.id()))
            })
        })
        .transpose()
}

fn naive(
    case: &Case,
    isa: Isa,
    inputs: &Inputs,
    fp8: Option<&Fp8Kv>,
    scores: &mut [f32],
    ws: &Workspace,
    out: &mut [f32],
) {
    let s = &case.shape;
    let geo = Geometry::of(case);
    let (d, rows) = (s.head_dim, geo.rows);
    out.par_chunks_mut(rows * d)
        .zip(scores.par_chunks_mut(rows * s.seq_kv))
        .enumerate()
        .for_each(|(gi, (o, sc))| {
            let (q_off, kv_off) = group_offsets(s, gi);
            let mut guard = ws.acquire();
            let (widen, widen_kv) = widens(case);
            let [qs, scratch] = carve(
                &mut guard,
                [
                    if widen { rows * d } else { 0 },
                    materialized_scratch_len(KV_BLOCK, d, widen_kv),
                ],
            );
            let q = vecops::widen(&inputs.q, q_off, rows * d, qs);
            let keys = Keys {
                k: &inputs.k,
                v: &inputs.v,
                base: kv_off,
                len: s.seq_kv,
                pages: None,
                isa,
                fp8,
            };
            let range = |r| geo.range(s.seq_q, r, 0, s.seq_kv);
            attend_materialized(q, rows, &range, keys, d, s.scale(), sc, o, scratch);
        });
}

fn online(
    case: &Case,
    isa: Isa,
    inputs: &Inputs,
    fp8: Option<&Fp8Kv>,
    ws: &Workspace,
    out: &mut [f32],
) {
    let s = &case.shape;
    let geo = Geometry::of(case);
    let (d, rows) = (s.head_dim, geo.rows);
    out.par_chunks_mut(rows * d)
        .enumerate()
        .for_each(|(gi, o)| {
            let (q_off, kv_off) = group_offsets(s, gi);
            let mut guard = ws.acquire();
            let (widen, widen_kv) = widens(case);
            let [qs, m, l, scratch] = carve(
                &mut guard,
                [
                    if widen { rows * d } else { 0 },
                    rows,
                    rows,
                    sequential_scratch_len(rows, d, widen_kv),
                ],
            );
            let q = vecops::widen(&inputs.q, q_off, rows * d, qs);
            let keys = Keys {
                k: &inputs.k,
                v: &inputs.v,
                base: kv_off,
                len: s.seq_kv,
                pages: None,
                isa,
                fp8,
            };
            let range = |r| geo.range(s.seq_q, r, 0, s.seq_kv);
            let mut state = RowState { acc: o, m, l };
            state.reset();
            // Sinks first, then the window: the online softmax folds any order exactly.
            if geo.has_sinks() {
                let sinks = |r| geo.token_sink_range(r % s.seq_q.max(1), 0, s.seq_kv);
                attend_sequential(q, rows, &sinks, keys, d, s.scale(), &mut state, scratch);
            }
            attend_sequential(q, rows, &range, keys, d, s.scale(), &mut state, scratch);
            state.finish(None);
        });
}
