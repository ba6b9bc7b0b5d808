//! Each CPU variant's workspace prediction against its closed form, written here as plain
//! arithmetic on the case (lengths, heads, head dim, threads, chunks) with the kernels'
//! documented block sizes as constants, not through the kernels' sizing functions: a
//! change to a kernel's allocation that its prediction follows (or a prediction that drops
//! a buffer) changes one side only and fails here. `tests/memory.rs` then checks the
//! prediction against the counting allocator.
//!
//! No allocator counter is read here, so these may run as several tests on parallel
//! threads (the measuring test is alone in its own binary).

use std::sync::Mutex;

#[path = "common/slack.rs"]
mod slack;

use attnbench::backend::cpu::isa::Isa;
use attnbench::problem::{
    Allreduce, BatchSpec, Case, DType, Fp8Format, Mla, Mode, PageOrder, Paging, Precision, Shape,
    VariantId,
};
use attnbench::variant::impossible::impossible;
use attnbench::variant::{DefaultCase, Registry, Saved};

// The kernels' documented block sizes (docs/reference/variants.md, the kernels' docs).
/// flash's query block B_r (`flash::DEFAULT_Q_CHUNK`).
const FLASH_BR: usize = 64;
/// flash's key block B_c (`flash::DEFAULT_KV_CHUNK`).
const FLASH_BC: usize = 256;
/// Query columns of flash's transposed tiles are padded to a multiple of this (`LANES_MAX`).
const LANES: usize = 16;
/// naive's query rows per work item (`naive::ROW_BLOCK`), also its backward's block.
const NAIVE_ROWS: usize = 64;
/// Keys per packed K^T panel of naive and Rabe–Staats (`tiles::PANEL`).
const PANEL: usize = 64;
/// Rabe & Staats' query and key chunks (Figure 1: 1024, 4096).
const RS_QC: usize = 1024;
const RS_KC: usize = 4096;
/// rabe-staats-seq's query rows per work item.
const SEQ_ROWS: usize = 64;
/// decode's key block (`decode::KV_BLOCK`).
const DECODE_BK: usize = 1024;
/// Query rows per KV head from which decode's `attend` may run the tiles' GEMM
/// (`GEMM_MIN_ROWS`).
const GEMM_MIN_ROWS: usize = 16;
/// Keys whose K^T that GEMM packs at a time (`decode::KT_KEYS`).
const KT_KEYS: usize = 256;
/// chunked-prefill's prompt chunk when the case names none.
const PREFILL_CHUNK: usize = 512;
/// BPT's query block (`blockwise_parallel_v1`'s q_chunk_size).
const BPT_BLOCK: usize = 1024;
/// One machine word (offsets, hand-out flags, block pointers' slices are two).
const WORD: u64 = std::mem::size_of::<usize>() as u64;
/// One output block of a backward's split lists: a `&mut [f32]` (pointer and length).
const SLICE: u64 = std::mem::size_of::<&mut [f32]>() as u64;
/// One locked block of two outputs (`LockedBlocks`): a mutex over two optional slices.
const LOCKED: u64 = std::mem::size_of::<Mutex<[Option<&mut [f32]>; 2]>>() as u64;

/// How the kernels read bf16/f16 operands on a path.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Read {
    /// f32 inputs, read in place.
    F32,
    /// bf16/f16 widened to f32 tile by tile.
    Widen,
    /// bf16 pairs (`vdpbf16ps` on avx512-bf16, AMX tiles on amx-bf16), with an even head
    /// dim.
    Pairs,
}

/// flash's operands: on the shared tiles, or bf16 on AMX tiles (amx-bf16, head dims of
/// whole 32s, a forward that does not feed the backward).
#[derive(Clone, Copy)]
enum FlashRead {
    Tiles(Read),
    Amx,
}

fn read(dtype: DType, isa: Isa, d: usize) -> Read {
    match dtype {
        DType::F32 => Read::F32,
        DType::Bf16 if matches!(isa, Isa::Avx512Bf16 | Isa::AmxBf16) && d.is_multiple_of(2) => {
            Read::Pairs
        }
        _ => Read::Widen,
    }
}

fn widen(c: &Case) -> bool {
    c.dtype != DType::F32
}

/// Whether decode widens K and V into scratch: low-precision storage, or an FP8 cache.
fn widen_kv(c: &Case) -> bool {
    widen(c) || c.kv_dtype.is_some()
}

/// Bytes of `workers` f32 buffers of `floats` each.
fn ws(workers: usize, floats: usize) -> u64 {
    4 * (workers * floats) as u64
}

fn clamp(chunk: Option<usize>, default: usize, n: usize) -> usize {
    chunk.unwrap_or(default).min(n).max(1)
}

// ---- naive -------------------------------------------------------------------------

/// naive's per-worker floats; `exact`: the forward feeds the backward (no bf16 P for PV).
fn naive_worker(c: &Case, isa: Isa, exact: bool) -> usize {
    let s = &c.shape;
    let (d, nkv) = (s.head_dim, s.seq_kv);
    let kt = nkv.div_ceil(PANEL) * PANEL * d; // one head's K^T in 64-key panels
    let scores = NAIVE_ROWS * nkv; // one row block of cached scores
    match read(c.dtype, isa, d) {
        Read::F32 => kt + scores,
        // K^T, V widened, one widened query row block, the scores
        Read::Widen => kt + nkv * d + NAIVE_ROWS * d + scores,
        // K^T as pairs (half), V as paired rows, P of one row block as bf16 pairs
        Read::Pairs if !exact && d.is_multiple_of(LANES) => {
            kt / 2 + nkv.div_ceil(2) * d + NAIVE_ROWS * nkv.div_ceil(2) + scores
        }
        // K^T as pairs, V widened to f32 (P stays f32)
        Read::Pairs => kt / 2 + nkv * d + scores,
    }
}

fn naive_workers(c: &Case) -> usize {
    let s = &c.shape;
    c.threads
        .min(s.batch * s.heads * s.seq_q.div_ceil(NAIVE_ROWS))
        .max(1)
}

fn naive_fwd(c: &Case, isa: Isa) -> u64 {
    let s = &c.shape;
    let scores = 4 * (s.batch * s.heads * s.seq_q * s.seq_kv) as u64; // S (P), all heads
                                                                      // `precision = highest` keeps P in f32 as the backward's forward does.
    scores + ws(naive_workers(c), naive_worker(c, isa, c.highest()))
}

fn naive_train(c: &Case, isa: Isa) -> u64 {
    let s = &c.shape;
    let p = 4 * (s.batch * s.heads * s.seq_q * s.seq_kv) as u64; // P kept for the backward
    let fwd = ws(naive_workers(c), naive_worker(c, isa, true)); // forward's worker buffers
    let q_items = s.batch * s.heads * s.seq_q.div_ceil(NAIVE_ROWS);
    let kv_items = s.batch * s.kv_heads * s.seq_kv.div_ceil(NAIVE_ROWS);
    let items = q_items.max(kv_items);
    let (d, nq, nkv) = (s.head_dim, s.seq_q, s.seq_kv);
    // V^T with keys padded to the widest vector and, for 16-bit inputs, widened K (row
    // pass), or one widened Q head (column pass)
    let vt = d * nkv.div_ceil(LANES) * LANES;
    let bwd_floats = if widen(c) {
        (vt + nkv * d).max(nq * d)
    } else {
        vt
    };
    let bwd = p // dS
        + ws(c.threads.min(items).max(1), bwd_floats)
        + 2 * SLICE * items as u64; // the (dS, dQ) and (dK, dV) block lists
    p + fwd.max(bwd)
}

// ---- flash and its kin --------------------------------------------------------------

/// flash's per-worker floats for tiles (bq, bk): Q^T, K_j and V_j copies, S^T, P^T pairs,
/// O^T and five column vectors. `group`: the query blocks whose running max and sum the AMX
/// path keeps (they share each packed key block).
fn flash_worker(d: usize, bq: usize, bk: usize, path: FlashRead, group: usize) -> usize {
    let nb = bq.div_ceil(LANES) * LANES; // query columns padded to the widest vector
    let st = bk * nb; // S^T
    let ot = d * nb; // O^T
    let cols = 5 * nb; // block max, running max, running sum, correction, visible keys
    let path = match path {
        FlashRead::Amx => {
            // Blocks rounded up to 32 rows and 32 keys: the Q block, K_j as pairs and V_j
            // interleaved (bf16, half a float each), S and P (bf16), the PV staging, the
            // correction, and each block's row max and sum (O accumulates in the output).
            let (nq, nk) = (bq.div_ceil(32) * 32, bk.div_ceil(32) * 32);
            return nq * d / 2
                + 2 * (nk * d / 2)
                + nq * nk
                + nq * nk / 2
                + nq * d
                + nq
                + 2 * group * nq;
        }
        FlashRead::Tiles(p) => p,
    };
    match path {
        Read::F32 => d * nb + st + ot + cols, // Q^T packed
        // Q^T, K_j and V_j widened
        Read::Widen => d * nb + 2 * bk * d + st + ot + cols,
        // Q^T as pairs (half), V_j as key pairs, P^T as pairs
        Read::Pairs => d * nb / 2 + bk.div_ceil(2) * d + st + bk.div_ceil(2) * nb + ot + cols,
    }
}

/// flash's operand path; a forward feeding the backward keeps P in f32 (widens instead).
fn flash_path(c: &Case, isa: Isa, exact: bool) -> FlashRead {
    let d = c.shape.head_dim;
    if isa == Isa::AmxBf16 && c.dtype == DType::Bf16 && !exact && d.is_multiple_of(32) {
        return FlashRead::Amx;
    }
    // flash's own tiles read Q^T and P^T transposed: on amx-bf16 they widen.
    FlashRead::Tiles(match read(c.dtype, isa, d) {
        Read::Pairs if exact || isa == Isa::AmxBf16 => Read::Widen,
        p => p,
    })
}

fn flash_chunks(c: &Case) -> (usize, usize) {
    let s = &c.shape;
    (
        clamp(c.q_chunk, FLASH_BR, s.seq_q),
        clamp(c.kv_chunk, FLASH_BC, s.seq_kv),
    )
}

fn flash_fwd_ws(c: &Case, isa: Isa, exact: bool) -> u64 {
    let s = &c.shape;
    let (bq, bk) = flash_chunks(c);
    let workers = c
        .threads
        .min(s.batch * s.heads * s.seq_q.div_ceil(bq))
        .max(1);
    // flash's AMX forward keeps the running max and sum of up to 8 query blocks of a head
    // (blocks of whole 32-row tiles without a sliding window; else one block).
    let group = match c.window {
        None if bq.is_multiple_of(32) => s.seq_q.div_ceil(bq).min(8),
        _ => 1,
    };
    ws(
        workers,
        flash_worker(s.head_dim, bq, bk, flash_path(c, isa, exact), group),
    )
}

fn flash_fwd(c: &Case, isa: Isa) -> u64 {
    flash_fwd_ws(c, isa, c.highest())
}

fn flash_train(c: &Case, isa: Isa) -> u64 {
    let s = &c.shape;
    let (bq, bk) = flash_chunks(c);
    let d = s.head_dim;
    let rows = 4 * (s.batch * s.heads * s.seq_q) as u64; // L kept; the backward's D as many
    let kv_items = s.batch * s.kv_heads * s.seq_kv.div_ceil(bk);
    let (qw, kw) = if widen(c) { (bq * d, bk * d) } else { (0, 0) };
    // Rows of K_j^T, V_j^T, P and dS: the keys in whole 64-byte lines of 16 floats, one
    // line more where the lines are a multiple of 8 (off the L1's set aliasing)
    let lines = bk.div_ceil(LANES);
    let ld = (lines + usize::from(lines.is_multiple_of(8))) * LANES;
    // P, then dS over it; a separate dP only above head dim 256 (the tiles' one block)
    let pds = if d <= 256 { bq * ld } else { 2 * bq * ld };
    // widened Q_i and K_j; K_j^T, V_j^T; P/dS (and dP); dK_j, dV_j; dQ_i
    let bwd_floats = qw + kw + 2 * d * ld + pds + 2 * bk * d + bq * d;
    let q_blocks = (s.batch * s.heads * s.seq_q.div_ceil(bq)) as u64;
    let bwd = rows // D
        + ws(c.threads.min(kv_items).max(1), bwd_floats)
        + LOCKED * q_blocks // dQ's locked blocks
        + 2 * SLICE * kv_items as u64; // dK's and dV's blocks
    rows + flash_fwd_ws(c, isa, true).max(bwd)
}

fn flash_varlen(c: &Case, isa: Isa) -> u64 {
    let s = &c.shape;
    let (bq, bk) = flash_chunks(c);
    let workers = c.threads.min(s.batch * s.heads).max(1); // a worker per head at most
    let seqs = c.batch_spec.as_ref().map_or(0, |b| b.len()) as u64;
    // The AMX path groups up to 8 query blocks of a sequence (as many as the longest has).
    let longest = c
        .batch_spec
        .as_ref()
        .map_or(0, |b| b.sequences().map(|(q, _)| q).max().unwrap_or(0));
    let group = if bq.is_multiple_of(32) {
        longest.div_ceil(bq).clamp(1, 8)
    } else {
        1
    };
    ws(workers, flash_worker(s.head_dim, bq, bk, flash_path(c, isa, c.highest()), group))
        + 2 * WORD * (seqs + 1) // cu_q and cu_kv offsets
        + WORD * (s.batch * s.heads) as u64 // one hand-out flag per head
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn chunked_prefill(c: &Case, isa: Isa) -> u64 {
    let s = &c.shape;
    let chunk = c.prefill_chunk.unwrap_or(PREFILL_CHUNK).max(1);
    let (q_block, bk) = flash_chunks(c);
    let bq = gcd(chunk, q_block).max(1); // steps are whole query blocks
    let blocks = s.batch * s.heads * s.seq_q.div_ceil(bq);
    let workers = c.threads.min(blocks).max(1);
    let path = flash_path(c, isa, c.highest());
    // On the AMX path an item is g of a step's chunk / bq blocks: the largest divisor of
    // them up to 8 that leaves 4 items a worker in a step (blocks of whole 32-row tiles).
    let per = chunk / bq;
    let fits = |g: usize| {
        per.is_multiple_of(g) && (workers == 1 || s.batch * s.heads * (per / g) >= 4 * workers)
    };
    let g = match path {
        FlashRead::Amx if bq.is_multiple_of(32) => {
            (1..=per.min(8)).rev().find(|&g| fits(g)).unwrap_or(1)
        }
        _ => 1,
    };
    let items = s.batch * s.heads * s.seq_q.div_ceil(bq * g); // a hand-out flag each
    ws(workers, flash_worker(s.head_dim, bq, bk, path, g)) + WORD * items as u64
}

// ---- Rabe–Staats --------------------------------------------------------------------

fn rs_chunks(c: &Case) -> (usize, usize) {
    let s = &c.shape;
    (
        clamp(c.q_chunk, RS_QC, s.seq_q),
        clamp(c.kv_chunk, RS_KC, s.seq_kv),
    )
}

/// The one chunk buffer, shared by the workers.
fn rs_chunk_buffer(c: &Case, isa: Isa) -> u64 {
    let s = &c.shape;
    let (qc, kc) = rs_chunks(c);
    let d = s.head_dim;
    let nkc = s.seq_kv.div_ceil(kc);
    let panels = kc.div_ceil(PANEL) * PANEL * d; // K_j^T in 64-key panels
    let (qw, kt, vw) = match read(c.dtype, isa, d) {
        Read::F32 => (0, panels, 0),
        // widened query chunk, K_j^T, V_j widened
        Read::Widen => (qc * d, panels, panels),
        // K_j^T as pairs (half), V_j as row pairs (or widened for the backward)
        Read::Pairs => (0, panels / 2, panels),
    };
    let weights = qc * kc; // attn_weights of one key chunk
    let values = nkc * qc * d; // exp_values of every key chunk
    let stats = 2 * nkc * qc; // max_score and exp_weights of every key chunk
    4 * (qw + kt + vw + weights + values + stats) as u64
}

fn rs_train(c: &Case, isa: Isa) -> u64 {
    let s = &c.shape;
    let (qc, kc) = rs_chunks(c);
    let d = s.head_dim;
    let nkc = s.seq_kv.div_ceil(kc);
    let kw = if widen(c) { kc * d } else { 0 };
    let floats = qc * d // the scaled query chunk
        + kw // widened K_j
        + 2 * d * kc.div_ceil(LANES) * LANES // K_j^T and V_j^T, keys padded to the widest vector
        + 2 * qc * kc // S (then P) and dP (then dS) of one key chunk
        + 2 * nkc * qc // recomputed chunk maxima and sums
        + 2 * qc // L and D of the query chunk
        + qc * d // dQ accumulator
        + 2 * kc * d; // dK_j and dV_j contributions
    let workers = c
        .threads
        .min(s.batch * s.heads * s.seq_q.div_ceil(qc))
        .max(1);
    let locks = LOCKED * (s.batch * s.kv_heads * s.seq_kv.div_ceil(kc)) as u64; // dK, dV blocks
    rs_chunk_buffer(c, isa).max(ws(workers, floats) + locks)
}

fn rs_seq(c: &Case) -> u64 {
    let s = &c.shape;
    let workers = c
        .threads
        .min(s.batch * s.heads * s.seq_q.div_ceil(SEQ_ROWS))
        .max(1);
    ws(workers, 4 * s.head_dim) // v*, and widened q, k, v rows
}

// ---- decode -------------------------------------------------------------------------

/// Groups (batch x KV heads): decode-naive's and decode-online's items.
fn groups(c: &Case) -> usize {
    c.shape.batch * c.shape.kv_heads
}

fn decode_naive(c: &Case) -> u64 {
    let s = &c.shape;
    let (d, rows) = (s.head_dim, s.group() * s.seq_q);
    let scores = 4 * (s.batch * s.heads * s.seq_q * s.seq_kv) as u64; // S over the cache
    let q = if widen(c) { rows * d } else { 0 }; // widened query rows
    let kv = if widen_kv(c) { 2 * DECODE_BK * d } else { 0 }; // one widened K and V block
    scores + ws(c.threads.min(groups(c)).max(1), q + kv)
}

fn decode_online(c: &Case) -> u64 {
    let s = &c.shape;
    let (d, rows) = (s.head_dim, s.group() * s.seq_q);
    let q = if widen(c) { rows * d } else { 0 }; // widened query rows
    let kv = if widen_kv(c) { 2 * d } else { 0 }; // one widened key and value
                                                  // m and l per row; one score per row
    ws(c.threads.min(groups(c)).max(1), q + 2 * rows + kv + rows)
}

/// `attend`'s scratch for `rows` rows and key blocks of `bk`: the copied (widened or
/// gathered) K and V block with the rows as bf16, the GEMM's K^T of up to 256 keys padded
/// to 16 lanes (rows that may take it), and the block's scores.
fn attend_scratch(rows: usize, bk: usize, d: usize, widen: bool, gathers: bool) -> usize {
    let copies = widen || gathers;
    let kt = if rows >= GEMM_MIN_ROWS {
        d * bk.min(KT_KEYS).div_ceil(16) * 16
    } else {
        0
    };
    (if copies {
        2 * bk * d + (rows * d).div_ceil(2)
    } else {
        0
    }) + kt
        + rows * bk
}

/// flash-decoding and paged-decode over a batch of equal lengths.
fn split_decode(c: &Case, paged: bool) -> u64 {
    let s = &c.shape;
    let d = s.head_dim;
    let splits = c.splits.expect("a split-KV case has its splits").max(1);
    let bk = c.kv_chunk.unwrap_or(DECODE_BK).max(1);
    let partials = s.batch * splits * s.heads * s.seq_q; // partial rows: (o, lse) each
                                                         // paged decode rows take all KV heads of a sequence in one item
    let whole = paged && s.group() * s.seq_q < GEMM_MIN_ROWS;
    let (items, rows) = if whole {
        (splits * s.batch, s.heads * s.seq_q)
    } else {
        (splits * s.batch * s.kv_heads, s.group() * s.seq_q)
    };
    let page = c.paging.map(|p| p.page_size).unwrap_or(1);
    let scratch = if whole {
        // one block shared by the KV heads, at least a page
        let merged = (bk / s.kv_heads.max(1)).max(page).max(1);
        attend_scratch(rows, merged, d, widen_kv(c), false)
    } else {
        attend_scratch(rows, bk, d, widen_kv(c), paged && rows >= GEMM_MIN_ROWS)
    };
    let q = if widen(c) { rows * d } else { 0 }; // the item's query rows, widened
    let floats = q + 2 * rows + scratch; // + m and l per row
    let table = if paged {
        WORD * (s.batch * s.seq_kv.div_ceil(page)) as u64 // block table, a word a page
    } else {
        0
    };
    4 * (partials * (d + 1)) as u64 + ws(c.threads.min(items).max(1), floats) + table
}

/// Query rows (all heads of a KV head's group) one item of a ragged batch holds at most
/// (`split_kv::ITEM_ROWS`): a longer sequence is cut into query tiles.
const ITEM_ROWS: usize = 128;
/// One schedule item of a ragged batch: eight words (sequence, part, KV head and count,
/// tile start and length, first row, rows) and a flag, padded to a word.
const ITEM: u64 = 9 * WORD;
/// One part of a sequence's keys: a `Range<usize>`, two words.
const RANGE: u64 = 2 * WORD;

/// flash-decoding and paged-decode over a ragged batch (`batch_spec`, packed; no window,
/// so each sequence attends all its keys): the whole cache cut into `splits` parts of
/// about equal length, a sequence getting as many as its keys hold, but one when it has
/// several query tiles; an item per (part, query tile, KV head) or, paged-decode's rows
/// under `GEMM_MIN_ROWS` per KV head, per (part, sequence), every KV head at once.
fn ragged_split_decode(c: &Case, paged: bool) -> u64 {
    let s = &c.shape;
    let (d, h, hk, g) = (s.head_dim, s.heads, s.kv_heads, s.group());
    let seqs: Vec<(usize, usize)> = c.batch_spec.as_ref().expect("ragged").sequences().collect();
    let splits = c.splits.expect("a split-KV case has its splits").max(1);
    let bk = c.kv_chunk.unwrap_or(DECODE_BK).max(1);
    let page = c.paging.map(|p| p.page_size).unwrap_or(1);
    let total: usize = seqs.iter().map(|&(_, kv)| kv).sum();
    let per = total.div_ceil(splits).max(1); // keys per part of the whole cache
    let (mut parts, mut items, mut partials, mut floats) = (0, 0, 0, 0);
    for &(q, kv) in &seqs {
        let tile = (ITEM_ROWS / g).max(1).min(q); // query tokens per tile
        let count = if tile < q { 1 } else { kv.div_ceil(per).max(1) }; // its parts
        let whole = paged && g * q < GEMM_MIN_ROWS; // every KV head in one item
        let per_item = if whole { hk } else { 1 }; // KV heads per item
        parts += count;
        items += count * q.div_ceil(tile) * (hk / per_item);
        partials += count * h * q; // (o, lse) per row and part
                                   // the full tile and the last (shorter) one
        for q_len in [tile, q - (q.div_ceil(tile) - 1) * tile] {
            let rows = per_item * g * q_len;
            // query rows are one run of f32 only for a whole sequence's one head, or a
            // batch of one sequence
            let run = q_len == q && (per_item * g <= 1 || seqs.len() == 1);
            let q_copy = if widen(c) || !run { rows * d } else { 0 };
            let scratch = if whole {
                // one block shared by the KV heads, at least a page
                let merged = (bk / hk.max(1)).max(page).max(1);
                attend_scratch(rows, merged, d, widen_kv(c), false)
            } else {
                attend_scratch(rows, bk, d, widen_kv(c), paged && rows >= GEMM_MIN_ROWS)
            };
            floats = floats.max(q_copy + 2 * rows + scratch); // + m and l per row
        }
    }
    let n = seqs.len() as u64;
    let tables = 2 * WORD * (n + 1) // the sequences' query and key offsets
        + parts as u64 * RANGE // every sequence's parts
        + (n + 1 + parts as u64) * WORD // each sequence's first part, each part's first row
        + items as u64 * ITEM; // the items
    let block_table = if paged {
        WORD * seqs
            .iter()
            .map(|&(_, kv)| kv.div_ceil(page) as u64)
            .sum::<u64>()
    } else {
        0
    };
    4 * (partials * (d + 1)) as u64 + ws(c.threads.min(items).max(1), floats) + tables + block_table
}

/// cascade-decode over a batch sharing `prefix_len` of its cached tokens (no window: every
/// key is attended): the prefix in parts of every request's rows of a KV head's group
/// (phase 1, query rows always gathered), each suffix in flash-decoding's parts (phase 2);
/// 2 items a thread per phase, no part under a key block.
fn cascade(c: &Case, isa: Isa) -> u64 {
    let s = &c.shape;
    let d = s.head_dim;
    let bk = c.kv_chunk.unwrap_or(DECODE_BK).max(1);
    let prefix = c.prefix_len.unwrap_or(0).min(s.seq_kv);
    let suffix = s.seq_kv - prefix;
    let parts = |keys: usize, units: usize| match keys {
        0 => 0,
        _ => (2 * c.threads)
            .div_ceil(units)
            .min(keys.div_ceil(DECODE_BK))
            .max(1),
    };
    let (p1, p2) = (
        parts(prefix, s.kv_heads),
        parts(suffix, s.batch * s.kv_heads),
    );
    let (rows1, rows2) = (s.batch * s.group() * s.seq_q, s.group() * s.seq_q);
    // the item's query rows where copied, m and l per row, attend's scratch
    let floats =
        |rows: usize, q: usize| q + 2 * rows + attend_scratch(rows, bk, d, widen(c), false);
    // Phase 1 on AMX tiles (bf16 K and V, head dims of whole 32s): rows and keys rounded up
    // to 32, the rows and the key block as bf16 A and B tiles (half a float each), the
    // values interleaved (bf16), S, P (bf16), the row max, sum and correction, the PV
    // staging; O in the partials.
    let tiles = isa == Isa::AmxBf16
        && c.dtype == DType::Bf16
        && c.kv_dtype.is_none()
        && d.is_multiple_of(32);
    let (nb, kb) = (rows1.div_ceil(32) * 32, bk.div_ceil(32) * 32);
    let first = match p1 {
        0 => 0,
        _ if tiles => nb * d / 2 + 2 * (kb * d / 2) + nb * kb + nb * kb / 2 + 3 * nb + nb * d,
        _ => floats(rows1, rows1 * d),
    };
    let q2 = if widen(c) { rows2 * d } else { 0 };
    let second = if p2 > 0 { floats(rows2, q2) } else { 0 };
    let items = p1 * s.kv_heads + p2 * s.batch * s.kv_heads;
    let partials = (p1 + p2) * s.batch * s.heads * s.seq_q; // (o, lse) each
    4 * (partials * (d + 1)) as u64 + ws(c.threads.min(items).max(1), first.max(second))
}

// ---- simulated ring ------------------------------------------------------------------

/// ring-decode, ring-prefill and stripe-prefill on `devices` simulated devices: the
/// devices' copies of the queries and outputs, the visiting KV shards, and one kernel
/// scratch per worker.
fn ring(c: &Case) -> u64 {
    let s = &c.shape;
    let decode = c.mode == Mode::Decode;
    let striped = c.variant == VariantId::StripePrefill;
    let p = c.devices.max(1);
    let (d, g, es) = (s.head_dim, s.group(), c.dtype.size_bytes() as u64);
    let n = s.seq_kv;
    // tokens of device i: contiguous shards differ by at most one, stripes are k mod p
    let shard = |i: usize| {
        if striped {
            (n + p - 1 - i) / p
        } else {
            n / p + usize::from(i < n % p)
        }
    };
    let tq: Vec<usize> = (0..p)
        .map(|i| if decode { s.seq_q } else { shard(i) })
        .collect();
    let bq = if decode {
        (g * s.seq_q).max(1) // a decode item holds all rows of a KV head
    } else {
        c.q_chunk.unwrap_or(FLASH_BR).max(1)
    };
    let bk = c
        .kv_chunk
        .unwrap_or(if decode { DECODE_BK } else { FLASH_BC })
        .max(1);
    let rows = tq.iter().map(|t| (g * t).min(bq)).max().unwrap_or(0);
    let items: usize = tq
        .iter()
        .map(|t| s.batch * s.kv_heads * (g * t).div_ceil(bq))
        .sum();
    let q_rows = (s.batch * s.heads * s.seq_q) as u64;
    let copies = if decode { p as u64 } else { 1 }; // decode broadcasts q to every device
    let q = copies * (q_rows * d as u64) * es; // the devices' queries
    let o = copies * (q_rows * d as u64 + 2 * q_rows) * 4; // acc, m and l of their rows
    let kv = 2 * (s.batch * s.kv_heads * n * d) as u64 * es; // K and V of all shards
    let visiting = if p > 1 { kv } else { 0 }; // the shards passed around the ring
    let own = if striped { kv } else { 0 }; // the stripes' permuted copy of their shards
    let q_widened = if widen(c) { rows * d } else { 0 };
    let floats = q_widened + attend_scratch(rows, bk, d, widen(c), false);
    q + o + visiting + own + ws(c.threads.min(items).max(1), floats)
}

/// tree-decode on `devices` simulated devices: each device's queries, numerator and row
/// statistics, the largest round of allreduce messages in flight, and one kernel scratch
/// per worker.
fn tree(c: &Case) -> u64 {
    let s = &c.shape;
    let p = c.devices.max(1);
    let (d, es) = (s.head_dim, c.dtype.size_bytes() as u64);
    let q_rows = (s.batch * s.heads * s.seq_q) as u64;
    // q (broadcast), o then the numerator, lse then the denominator, and m
    let per_device = q_rows * d as u64 * es + (q_rows * d as u64 + 2 * q_rows) * 4;
    // The numerator (b·h·seq_q·d floats) is the largest buffer reduced; the floats of a
    // round's messages in flight, in buffers of it:
    let m = q_rows * d as u64;
    let in_flight = match c.allreduce.unwrap_or(Allreduce::Tree) {
        // every chunk sent once a round (reduce-scatter, then all-gather): the whole buffer
        Allreduce::Ring => u64::from(p > 1) * m,
        // binomial: the first reduce round (and the last broadcast one) has floor(p/2)
        // senders, each of the whole buffer; later rounds halve
        Allreduce::Tree => (p / 2) as u64 * m,
        // nodes of g devices: a node's ring round sends its whole buffer (every node at
        // once); the nodes' binomial round sends floor(nodes/2) copies of each chunk, fewer
        Allreduce::TwoLevel { per_node } => {
            let g = per_node.min(p).max(1);
            let nodes = (p / g) as u64;
            if g > 1 {
                nodes * m
            } else {
                nodes / 2 * m
            }
        }
    };
    // An item: all rows of a KV head on one device. Key blocks no longer than a device's
    // shard (the largest of p even parts).
    let rows = s.group() * s.seq_q;
    let shard = s.seq_kv.div_ceil(p);
    let bk = c.kv_chunk.unwrap_or(DECODE_BK).min(shard).max(1);
    let q_widened = if widen(c) { rows * d } else { 0 };
    // + the item's running max and sum
    let floats = q_widened + 2 * rows + attend_scratch(rows, bk, d, widen(c), false);
    let items = p * s.batch * s.kv_heads;
    p as u64 * per_device + 4 * in_flight + ws(c.threads.min(items).max(1), floats)
}

// ---- layers -------------------------------------------------------------------------

/// The layer's own buffers (elements x bytes), BPT's per-head copies included.
fn layer_buffers(c: &Case, bpt: bool, train: bool) -> u64 {
    let s = &c.shape;
    let (b, n, d) = (s.batch, s.seq_q, s.head_dim);
    let h = s.heads * d; // hidden width
    let full = (b * n * h) as u64; // one full-sequence activation
    let q_block = if bpt {
        c.q_chunk.unwrap_or(BPT_BLOCK).clamp(1, n)
    } else {
        n
    };
    let r = if bpt { q_block } else { b * n } as u64; // rows of the largest block
    let (h, st) = (h as u64, c.dtype.size_bytes() as u64);
    let (cd, nd) = ((q_block * d) as u64, (n * d) as u64);
    let mut bytes = 2 * full * st // K and V of all tokens
        + r * h * 4 // LN1 output
        + 2 * r * 4 // LN1 statistics
        + r * h * st // Q of the block, by head
        + r * h * 4 // attention output
        + r * h * 4 // residual y
        + r * h * 4 // LN2 output
        + 2 * r * 4 // LN2 statistics
        + 4 * r * h * 4 // FFN pre-activation
        + cd * 4; // one head's projection
    if train {
        bytes += 4 * r * h * 4 // GELU output
            + 2 * full * 4 // dK and dV of all tokens
            + 4 * r * h * 4 // dZ
            + 5 * r * h * 4; // d LN2 output, dy, dO, dQ, d LN1 output
    }
    if bpt {
        bytes += cd * st + cd * 4 + 2 * nd * st; // Q and O of one head, its K and V prefix
        if train {
            bytes += 2 * cd * 4 + 2 * nd * 4; // dO, dQ of one head, its dK and dV prefix
        }
    }
    bytes
}

/// The layer's attention at its peak: naive (vanilla) or flash over the whole sequence, or
/// (BPT) the largest block's one-head call, training keeping every head's L of the block.
fn layer_attention(c: &Case, isa: Isa, bpt: bool, train: bool) -> u64 {
    let s = &c.shape;
    let call = |shape: Shape| Case {
        variant: if c.variant == VariantId::LayerVanilla {
            VariantId::Naive
        } else {
            VariantId::Flash
        },
        shape,
        q_chunk: None,
        ..c.clone()
    };
    let one = |a: &Case| match (a.variant, train) {
        (VariantId::Naive, false) => naive_fwd(a, isa),
        (VariantId::Naive, true) => naive_train(a, isa),
        (_, false) => flash_fwd(a, isa),
        (_, true) => flash_train(a, isa),
    };
    if !bpt {
        return one(&call(*s));
    }
    let cb = c.q_chunk.unwrap_or(BPT_BLOCK).clamp(1, s.seq_q);
    let mut peak = 0;
    for q0 in (0..s.seq_q).step_by(cb) {
        let rows = cb.min(s.seq_q - q0);
        let keys = if c.causal { q0 + rows } else { s.seq_kv };
        let a = call(Shape {
            batch: 1,
            heads: 1,
            kv_heads: 1,
            seq_q: rows,
            seq_kv: keys,
            head_dim: s.head_dim,
        });
        let kept = if train {
            // the other heads' L of the block and the list of every head's saved state
            (s.heads as u64 - 1) * 4 * rows as u64
                + s.heads as u64 * std::mem::size_of::<Saved>() as u64
        } else {
            0
        };
        peak = peak.max(one(&a) + kept);
    }
    peak
}

fn layer(c: &Case, isa: Isa) -> u64 {
    let bpt = c.variant == VariantId::LayerBpt;
    let train = c.mode == Mode::LayerTrain;
    layer_buffers(c, bpt, train) + layer_attention(c, isa, bpt, train)
}

/// mla-decode: q_lat by head, the partial o_lat and logsumexps of every split, the combined
/// o_lat and the outputs by head (floats); one scratch per worker (the threads, at most the
/// larger of the (split, batch) items and the heads), the larger of an attention item's
/// (q_lat rows, widened q_rope, m, l, a block's scores, the widened latent and RoPE block)
/// and a head's projection (widened W and that head's query rows).
fn mla_decode(c: &Case, isa: Isa) -> u64 {
    let s = &c.shape;
    let m = c.mla.expect("an MLA case");
    let (dc, dr, dh) = (m.latent_dim, m.rope_dim, s.head_dim);
    let (b, h, sq) = (s.batch, s.heads, s.seq_q);
    let splits = c.splits.expect("mla-decode splits");
    let bk = c.kv_chunk.expect("mla-decode key block");
    let rows = b * h * sq;
    let buffers = rows * dc + splits * rows * (dc + 1) + rows * dc + rows * dh;
    let w = usize::from(c.dtype != DType::F32);
    let r = h * sq;
    let amx = isa == Isa::AmxBf16
        && c.dtype == DType::Bf16
        && dc.is_multiple_of(32)
        && dr.is_multiple_of(32);
    let attend = if amx {
        // On AMX tiles: the rows' [q_lat | q_rope] as bf16 (half a float each); then, rows
        // and keys rounded up to 32, Q^T as pairs, a padded copy of a ragged key block, the
        // latent block interleaved (bf16 each), S^T, P^T's pairs and P (bf16), the columns'
        // max, sum and correction, the PV staging; O accumulates in the partials.
        let (nb, kb) = (r.div_ceil(32) * 32, bk.div_ceil(32) * 32);
        let dk = dc + dr;
        r * dk / 2
            + nb * dk / 2
            + kb * dk / 2
            + kb * dc / 2
            + kb * nb
            + 2 * (kb * nb / 2)
            + 3 * nb
            + nb * dc
    } else {
        r * dc + w * r * dr + 2 * r + r * bk + w * bk * (dc + dr)
    };
    let project = w * (dc * dh + sq * dh);
    let workers = c.threads.min((b * splits).max(h)).max(1);
    4 * (buffers + workers * attend.max(project)) as u64
}

// ---- the table ----------------------------------------------------------------------

/// The closed form of `c`'s workspace on kernel path `isa`; `None` for a (variant, mode)
/// the registry does not run.
fn formula(c: &Case, isa: Isa) -> Option<u64> {
    use VariantId::*;
    Some(match (c.variant, c.mode) {
        (Naive | NaiveUnsafe, Mode::Fwd) => naive_fwd(c, isa),
        (Naive, Mode::FwdBwd) => naive_train(c, isa),
        (RabeStaats, Mode::Fwd) => rs_chunk_buffer(c, isa),
        (RabeStaats, Mode::FwdBwd) => rs_train(c, isa),
        (RabeStaatsSeq, Mode::Fwd) => rs_seq(c),
        (Flash, Mode::Fwd) => flash_fwd(c, isa),
        (Flash, Mode::FwdBwd) => flash_train(c, isa),
        (FlashVarlen, Mode::Fwd) => flash_varlen(c, isa),
        (ChunkedPrefill, Mode::Fwd) => chunked_prefill(c, isa),
        (DecodeNaive, Mode::Decode) => decode_naive(c),
        (DecodeOnline, Mode::Decode) => decode_online(c),
        (FlashDecoding, Mode::Decode) if c.batch_spec.is_none() => split_decode(c, false),
        (PagedDecode, Mode::Decode) if c.batch_spec.is_none() => split_decode(c, true),
        (FlashDecoding, Mode::Decode) => ragged_split_decode(c, false),
        (PagedDecode, Mode::Decode) => ragged_split_decode(c, true),
        (CascadeDecode, Mode::Decode) => cascade(c, isa),
        (LayerVanilla | LayerMemEff | LayerBpt, Mode::LayerFwd | Mode::LayerTrain) => layer(c, isa),
        (RingDecode, Mode::Decode) | (RingPrefill | StripePrefill, Mode::Fwd) => ring(c),
        (TreeDecode, Mode::Decode) => tree(c),
        (MlaDecode, Mode::Decode) => mla_decode(c, isa),
        _ => return None,
    })
}

fn predicted(c: &Case, isa: Isa) -> u64 {
    let v = c.variant.get();
    match c.mode {
        Mode::FwdBwd => v.predict_train_workspace_bytes(c, isa),
        _ => v.predict_workspace_bytes(c, isa),
    }
}

/// (n, heads, kv heads, head dim): aligned and ragged lengths, head dims of whole vectors,
/// of half a vector and odd (no bf16 pairs), and one above the tiles' one block (256).
const SHAPES: [(usize, usize, usize, usize); 6] = [
    (1024, 2, 2, 64),
    (1000, 3, 3, 64),
    (300, 4, 2, 128),
    (77, 2, 1, 40),
    (4500, 1, 1, 33),
    (40, 1, 1, 264),
];
const THREADS: [usize; 3] = [1, 2, 5];
const DTYPES: [DType; 3] = [DType::F32, DType::Bf16, DType::F16];

/// Every case of `v` in `mode` the formulas are checked on: the shapes x threads x dtypes,
/// with the variant's default chunks and with explicit ragged ones, causal and not.
fn cases(v: VariantId, mode: Mode) -> Vec<Case> {
    let mut out = Vec::new();
    for (n, heads, kv_heads, d) in SHAPES {
        for threads in THREADS {
            for dtype in DTYPES {
                let mut shape = Shape::self_attention(heads, n, d);
                shape.kv_heads = kv_heads;
                if mode == Mode::Decode {
                    shape.seq_q = [1, 3, 20][n % 3];
                }
                let base = Case {
                    mode,
                    ..Case::cpu_fwd(v, shape, dtype, threads)
                };
                // The default chunks causal too (chunked-prefill runs only causal cases).
                let mut variants = vec![
                    base.clone(),
                    Case {
                        causal: true,
                        ..base.clone()
                    },
                ];
                for causal in [false, true] {
                    variants.push(Case {
                        causal,
                        q_chunk: base.q_chunk.map(|_| (n / 3).max(1)),
                        kv_chunk: base.kv_chunk.map(|_| (n / 2 + 7).min(shape.seq_kv)),
                        prefill_chunk: base.prefill_chunk.map(|_| (n / 4).max(1)),
                        splits: base.splits.map(|s| s + 2),
                        paging: base.paging.map(|_| Paging {
                            page_size: 32,
                            order: PageOrder::Shuffled,
                        }),
                        ..base.clone()
                    });
                }
                if v == VariantId::CascadeDecode {
                    // Batches of 4 sharing a third of the cache, and all of it.
                    let shared: Vec<Case> = variants
                        .iter()
                        .flat_map(|c| {
                            [n / 3, n].map(|p| Case {
                                shape: Shape {
                                    batch: 4,
                                    ..c.shape
                                },
                                prefix_len: Some(p),
                                ..c.clone()
                            })
                        })
                        .collect();
                    variants.extend(shared);
                }
                if v.get().multi_device() {
                    let spread: Vec<Case> = variants
                        .iter()
                        .flat_map(|c| {
                            [2, 3].map(|devices| Case {
                                devices,
                                ..c.clone()
                            })
                        })
                        .collect();
                    variants.extend(spread);
                }
                // The readers of an FP8 cache, which widen K and V whatever the dtype.
                let fp8: Vec<Case> = variants
                    .iter()
                    .map(|c| Case {
                        kv_dtype: Some(Fp8Format::Fp8e4m3),
                        ..c.clone()
                    })
                    .filter(|c| impossible(c).is_none())
                    .collect();
                variants.extend(fp8);
                // P kept in f32 (`precision = highest`): no bf16 P on the pair path.
                let highest: Vec<Case> = variants
                    .iter()
                    .map(|c| Case {
                        precision: Some(Precision::Highest),
                        ..c.clone()
                    })
                    .collect();
                variants.extend(highest);
                if v.get().reads_mla() {
                    // Latent and RoPE widths of whole 32s (bf16 runs on AMX tiles where
                    // there are some) and ragged ones.
                    variants = variants
                        .iter()
                        .flat_map(|c| {
                            [(64, 32), (24, 8)].map(|(latent_dim, rope_dim)| Case {
                                mla: Some(Mla {
                                    latent_dim,
                                    rope_dim,
                                }),
                                ..c.clone()
                            })
                        })
                        .collect();
                }
                if v.get().default_allreduce().is_some() {
                    let ring: Vec<Case> = variants
                        .iter()
                        .map(|c| Case {
                            allreduce: Some(Allreduce::Ring),
                            ..c.clone()
                        })
                        .collect();
                    variants.extend(ring);
                }
                out.extend(
                    variants
                        .into_iter()
                        .filter(|c| v.get().unsupported(c).is_none()),
                );
            }
        }
    }
    out
}

#[test]
fn every_workspace_prediction_equals_its_closed_form() {
    let mut checked = std::collections::BTreeSet::new();
    for v in VariantId::in_process() {
        for &mode in v.info().modes {
            for c in cases(v, mode) {
                for isa in Isa::ALL {
                    let Some(want) = formula(&c, isa) else {
                        panic!("{v} {mode}: no closed form");
                    };
                    let got = predicted(&c, isa);
                    assert_eq!(
                        got, want,
                        "{v} {mode} {} {isa} threads {} shape {:?} chunks {:?}/{:?} causal {} \
                         splits {:?}: prediction {got}, closed form {want}",
                        c.dtype, c.threads, c.shape, c.q_chunk, c.kv_chunk, c.causal, c.splits
                    );
                    checked.insert((v.name(), mode.to_string()));
                }
            }
        }
    }
    // Every variant and mode of the registry was checked.
    let want: std::collections::BTreeSet<_> = VariantId::in_process()
        .flat_map(|v| {
            v.info()
                .modes
                .iter()
                .map(move |m| (v.name(), m.to_string()))
        })
        .collect();
    assert_eq!(checked, want);
}

/// The ragged batches of flash-varlen (its only form) against its closed form.
#[test]
fn flash_varlen_ragged_batches_equal_the_closed_form() {
    for spec in ["q100+2xq33+q1kv100", "q1024+q7kv2000", "5xq64"] {
        let spec: BatchSpec = spec.parse().unwrap();
        for threads in THREADS {
            for dtype in DTYPES {
                let dense = Shape::self_attention(3, 100, 64);
                let c = Case {
                    shape: spec.packed(&dense),
                    batch_spec: Some(spec.clone()),
                    ..Case::cpu_fwd(VariantId::FlashVarlen, dense, dtype, threads)
                };
                for isa in Isa::ALL {
                    assert_eq!(predicted(&c, isa), flash_varlen(&c, isa), "{spec} {isa}");
                }
            }
        }
    }
}

/// tree-decode with every allreduce against its closed form: 1 to 8 devices (powers of
/// two and not) with the binomial tree, nodes of 1 to 4 devices (whole nodes only), and the
/// ring, over decode shapes with GQA and several query rows.
#[test]
fn tree_decode_allreduces_equal_the_closed_form() {
    let mut seen = std::collections::BTreeSet::new();
    for (n, heads, kv_heads, d) in SHAPES {
        for seq_q in [1, 3] {
            for threads in THREADS {
                for dtype in DTYPES {
                    for devices in 1..=8 {
                        let shape = Shape {
                            seq_q,
                            kv_heads,
                            ..Shape::self_attention(heads, n, d)
                        };
                        let base = Case {
                            mode: Mode::Decode,
                            devices,
                            ..Case::cpu_fwd(VariantId::TreeDecode, shape, dtype, threads)
                        };
                        for allreduce in [
                            None,
                            Some(Allreduce::Ring),
                            Some(Allreduce::Tree),
                            Some(Allreduce::TwoLevel { per_node: 1 }),
                            Some(Allreduce::TwoLevel { per_node: 2 }),
                            Some(Allreduce::TwoLevel { per_node: 3 }),
                            Some(Allreduce::TwoLevel { per_node: 4 }),
                        ] {
                            let c = Case {
                                allreduce,
                                ..base.clone()
                            };
                            if c.variant.get().unsupported(&c).is_some() {
                                continue;
                            }
                            seen.insert((devices, allreduce.map(|a| a.to_string())));
                            for isa in Isa::ALL {
                                assert_eq!(
                                    predicted(&c, isa),
                                    tree(&c),
                                    "{devices} devices {allreduce:?} {dtype} {threads} {shape:?}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
    // Not a silent skip: two-level ran on whole nodes, 6 devices included (3 nodes of 2,
    // 2 of 3), and the binomial tree on every count.
    for devices in 1..=8 {
        assert!(seen.contains(&(devices, Some("tree".into()))), "{devices}");
    }
    for (devices, g) in [(6, 2), (6, 3), (8, 4), (5, 1), (3, 4)] {
        assert!(
            seen.contains(&(devices, Some(format!("two-level:{g}")))),
            "{devices} {g}"
        );
    }
}

/// The closed forms of the allreduces' largest round, on one case worked by hand: b·h·seq_q
/// = 6 rows of d = 64 (a numerator of 384 floats) on 5 devices.
#[test]
fn the_largest_allreduce_round_worked_by_hand() {
    let shape = Shape {
        seq_q: 3,
        ..Shape::self_attention(2, 100, 64)
    };
    let at = |devices, allreduce| {
        let c = Case {
            mode: Mode::Decode,
            devices,
            allreduce: Some(allreduce),
            ..Case::cpu_fwd(VariantId::TreeDecode, shape, DType::F32, 1)
        };
        predicted(&c, Isa::Portable)
    };
    let ring = at(5, Allreduce::Ring) - 384 * 4;
    // binomial on 5: pairs (1→0), (3→2) in the first round: 2 x 384 floats
    assert_eq!(at(5, Allreduce::Tree), ring + 2 * 384 * 4);
    // 6 devices: nodes of 2 (three rings side by side, 3 x 384) and of 3 (2 x 384)
    let ring6 = at(6, Allreduce::Ring) - 384 * 4;
    assert_eq!(
        at(6, Allreduce::TwoLevel { per_node: 2 }),
        ring6 + 3 * 384 * 4
    );
    assert_eq!(
        at(6, Allreduce::TwoLevel { per_node: 3 }),
        ring6 + 2 * 384 * 4
    );
    // nodes of one device are the binomial tree over all 6: 3 pairs
    assert_eq!(
        at(6, Allreduce::TwoLevel { per_node: 1 }),
        ring6 + 3 * 384 * 4
    );
}

/// The ragged batches of flash-decoding and paged-decode against their closed form: decodes
/// and prefill chunks (one of several query tiles), single-token sequences, one sequence
/// alone, GQA groups of 1, 2 and 4 (paged-decode's items of whole sequences and of one KV
/// head), with the ragged default split count and explicit ones. (A spec cannot hold an
/// empty sequence: the parser rejects q0 and kv0.)
#[test]
fn ragged_split_decode_equals_the_closed_form() {
    let mut ran = std::collections::BTreeSet::new();
    for spec in [
        "q1kv1",
        "q1kv3000",
        "q3kv1000+2xq1kv333+q125kv500",
        "q1kv1+q1kv2000+3xq1kv5",
        "q300kv300+q1kv4000",
        "4xq20kv20+q1kv1",
        "q129kv1200+q1kv1000+4xq1kv50",
    ] {
        let spec: BatchSpec = spec.parse().unwrap();
        for (heads, kv_heads, d) in [(4, 4, 64), (4, 2, 40), (8, 2, 33), (2, 1, 128)] {
            for threads in THREADS {
                for dtype in DTYPES {
                    let dense = Shape {
                        kv_heads,
                        ..Shape::self_attention(heads, 100, d)
                    };
                    let shape = spec.packed(&dense);
                    // the expander's ragged default: 4 parts a thread, none under a block
                    let default = (4 * threads).min(shape.seq_kv.div_ceil(DECODE_BK)).max(1);
                    for v in [VariantId::FlashDecoding, VariantId::PagedDecode] {
                        for splits in [default, 1, 7] {
                            for kv_chunk in [None, Some(100)] {
                                let base = Case {
                                    mode: Mode::Decode,
                                    shape,
                                    batch_spec: Some(spec.clone()),
                                    splits: Some(splits),
                                    ..Case::cpu_fwd(v, dense, dtype, threads)
                                };
                                // pages no longer than the longest cache (q1kv1 included)
                                let longest = spec.sequences().map(|(_, kv)| kv).max();
                                let fit = |size: usize| Paging {
                                    page_size: size.min(longest.unwrap_or(1)),
                                    order: PageOrder::Shuffled,
                                };
                                let c = Case {
                                    kv_chunk: kv_chunk.or(base.kv_chunk),
                                    paging: base.paging.map(|p| fit(p.page_size)),
                                    ..base
                                };
                                let mut all = vec![
                                    c.clone(),
                                    Case {
                                        causal: true,
                                        ..c.clone()
                                    },
                                ];
                                if v == VariantId::PagedDecode {
                                    all.push(Case {
                                        paging: Some(fit(7)),
                                        ..c.clone()
                                    });
                                } else {
                                    all.push(Case {
                                        kv_dtype: Some(Fp8Format::Fp8e4m3),
                                        ..c.clone()
                                    });
                                }
                                for c in all {
                                    let why = impossible(&c).map(|i| format!("{i:?}"));
                                    let why = why.or_else(|| v.get().unsupported(&c));
                                    assert!(why.is_none(), "{v} {spec}: {why:?}");
                                    ran.insert(v.name());
                                    for isa in Isa::ALL {
                                        assert_eq!(
                                            predicted(&c, isa),
                                            ragged_split_decode(&c, v == VariantId::PagedDecode),
                                            "{v} {spec} {isa} {dtype} threads {threads} \
                                             splits {splits} {:?} {:?}",
                                            c.shape,
                                            c.kv_chunk
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert_eq!(ran.len(), 2);
}

/// The headline formulas of docs/reference/variants.md, checked on one aligned case each,
/// so the page and the closed forms above cannot drift apart.
#[test]
fn the_reference_pages_formulas_hold() {
    let (b, h, n, d) = (1usize, 2usize, 8192usize, 64usize);
    let case = |v| Case::cpu_fwd(v, Shape::self_attention(h, n, d), DType::F32, 1);
    // naive: 4·b·h·n_q·n_kv bytes, + one head's K^T and 64 rows of scores per worker.
    let naive = predicted(&case(VariantId::Naive), Isa::Avx512);
    assert_eq!(naive, (4 * b * h * n * n + 4 * (n * d + 64 * n)) as u64);
    // rabe-staats: q_c·k_c + (n/k_c)·q_c·(d+2) + k_c·d floats.
    let (qc, kc) = (1024, 4096);
    let rs = predicted(&case(VariantId::RabeStaats), Isa::Avx512);
    assert_eq!(rs, 4 * (qc * kc + (n / kc) * qc * (d + 2) + kc * d) as u64);
    // decode-naive: 4·b·h·n_q·n_kv bytes (f32: no widened copies).
    let mut dec = case(VariantId::DecodeNaive);
    dec.mode = Mode::Decode;
    dec.shape.seq_q = 1;
    assert_eq!(predicted(&dec, Isa::Avx512), (4 * b * h * n) as u64);
}

/// docs/methodology.md's table of what each variant allocates beyond its prediction states
/// the figures `tests/memory.rs` allows (tests/common/slack.rs), every variant once, and the
/// injector block beside it.
#[test]
fn the_methodology_states_the_memory_tests_slack() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/methodology.md"))
        .unwrap();
    let section = doc
        .split("\n## Memory overhead\n")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("a Memory overhead section");
    assert!(section.contains(&format!("injector block ({} bytes", slack::INJECTOR_BLOCK)));
    let mut stated = std::collections::BTreeMap::new();
    for line in section
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("| `"))
    {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let bytes: u64 = cells[2].parse().expect("bytes");
        for name in cells[1].split(',').map(|n| n.trim().trim_matches('`')) {
            assert!(
                stated.insert(name.to_string(), bytes).is_none(),
                "{name} twice"
            );
        }
    }
    let tested: std::collections::BTreeMap<String, u64> = slack::SLACK
        .iter()
        .flat_map(|&(vs, b)| vs.iter().map(move |v| (v.name().to_string(), b)))
        .collect();
    assert_eq!(stated, tested);
    // Every variant the memory test measures has its figure.
    for v in VariantId::in_process() {
        assert_eq!(Some(&slack::slack(v)), tested.get(v.name()), "{v}");
    }
}

// ---- bytes of the cache a decode reads ----------------------------------------------

/// Keys one sequence of `q` new tokens over `kv` cached keys attends: from the first row's
/// window start (its causal bound, bottom-right aligned, less the window) to the cache's
/// end, which the last row reaches; with a window, the sinks before that start too.
fn attended_keys(c: &Case, q: usize, kv: usize) -> usize {
    let first_bound = if c.causal {
        (kv + 1).saturating_sub(q)
    } else {
        kv
    };
    let start = c.window.map_or(0, |w| first_bound.saturating_sub(w));
    let sinks = if c.window.is_some() {
        c.sinks.unwrap_or(0)
    } else {
        0
    };
    kv - start + sinks.min(start)
}

/// The closed form of `kv_read_bytes`: K and V of every KV head for each attended key, at
/// the storage dtype (FP8: one byte a value and an f32 scale for K and V of every KV head
/// of the stored batch); cascade-decode's shared prefix once for the batch; mla-decode's
/// latent and RoPE values of every cached token. `None` for a variant that reads no cache.
fn kv_bytes(c: &Case) -> Option<u64> {
    use VariantId::*;
    let s = &c.shape;
    let seqs: Vec<(usize, usize)> = match &c.batch_spec {
        Some(spec) => spec.sequences().collect(),
        None => vec![(s.seq_q, s.seq_kv); s.batch],
    };
    let per_key = |keys: usize| match c.kv_dtype {
        Some(_) => 2 * s.kv_heads * keys * s.head_dim + 2 * 4 * s.kv_heads * s.batch,
        None => 2 * s.kv_heads * keys * s.head_dim * c.dtype.size_bytes(),
    } as u64;
    Some(match c.variant {
        DecodeNaive | DecodeOnline | FlashDecoding | PagedDecode | RingDecode | TreeDecode => {
            per_key(seqs.iter().map(|&(q, kv)| attended_keys(c, q, kv)).sum())
        }
        CascadeDecode => {
            // Every request has the same cache: the attended keys of the prefix once.
            let (q, kv) = (s.seq_q, s.seq_kv);
            let all = attended_keys(c, q, kv);
            let prefix = c.prefix_len.unwrap_or(0).min(kv);
            let shared = all.saturating_sub(kv - prefix);
            per_key(shared + s.batch * (all - shared))
        }
        MlaDecode => {
            let m = c.mla?;
            (s.batch * s.seq_kv * (m.latent_dim + m.rope_dim) * c.dtype.size_bytes()) as u64
        }
        _ => return None,
    })
}

/// Every in-process variant's `kv_read_bytes` against its closed form: causal and not,
/// windows of one key, some and past the cache, sinks, shared prefixes, FP8 caches, ragged
/// batches, several devices; every decode variant is checked, the others count nothing.
#[test]
fn every_kv_read_byte_count_equals_its_closed_form() {
    let mut checked = std::collections::BTreeSet::new();
    let spec: BatchSpec = "q1kv300+2xq1kv9+q3kv40".parse().unwrap();
    for v in VariantId::in_process() {
        for &mode in v.info().modes {
            for (q, kv) in [(1, 1), (1, 37), (3, 300), (20, 7)] {
                let shape = Shape {
                    batch: 3,
                    heads: 4,
                    kv_heads: 2,
                    seq_q: q,
                    seq_kv: kv,
                    head_dim: 16,
                };
                let base = Case {
                    mode,
                    ..Case::cpu_fwd(v, shape, DType::F32, 2)
                };
                let mut cases = vec![];
                for causal in [false, true] {
                    for window in [None, Some(1), Some(10), Some(5000)] {
                        for sinks in [None, Some(4)] {
                            for prefix_len in [None, Some(kv / 3), Some(kv)] {
                                for devices in [1, 2] {
                                    cases.push(Case {
                                        causal,
                                        window,
                                        sinks: window.and(sinks),
                                        prefix_len,
                                        devices,
                                        ..base.clone()
                                    });
                                }
                            }
                        }
                    }
                }
                let more: Vec<Case> = cases
                    .iter()
                    .flat_map(|c| {
                        let mut out = vec![];
                        for dtype in DTYPES {
                            out.push(Case { dtype, ..c.clone() });
                        }
                        out.push(Case {
                            kv_dtype: Some(Fp8Format::Fp8e5m2),
                            ..c.clone()
                        });
                        out.push(Case {
                            shape: spec.packed(&Shape {
                                batch: 1,
                                ..c.shape
                            }),
                            batch_spec: Some(spec.clone()),
                            ..c.clone()
                        });
                        out
                    })
                    .collect();
                for c in more {
                    let sinks_ok = c.sinks.is_none() || v.get().sinks();
                    if !sinks_ok || v.get().unsupported(&c).is_some() || impossible(&c).is_some() {
                        continue;
                    }
                    let got = v.get().kv_read_bytes(&c);
                    assert_eq!(
                        got,
                        kv_bytes(&c),
                        "{v} {mode} {} causal {} window {:?} sinks {:?} prefix {:?} fp8 {:?} \
                         devices {} batch {:?}",
                        c.dtype,
                        c.causal,
                        c.window,
                        c.sinks,
                        c.prefix_len,
                        c.kv_dtype,
                        c.devices,
                        c.batch_spec
                    );
                    if got.is_some() {
                        checked.insert(v.name());
                    }
                }
            }
        }
    }
    let readers: std::collections::BTreeSet<_> = VariantId::in_process()
        .filter(|v| v.info().modes.contains(&Mode::Decode))
        .map(|v| v.name())
        .collect();
    assert_eq!(checked, readers);
}

// ---- default split counts ------------------------------------------------------------

/// Work items the split-KV decodes want per thread (`decode::ITEMS_PER_THREAD`).
const ITEMS_PER_THREAD: usize = 2;
/// mla-decode's key block (`mla::MLA_BLOCK`).
const MLA_BK: usize = 256;

/// Parts to cut `keys` into for `units` independent items: enough items for
/// `ITEMS_PER_THREAD` a thread, no part shorter than `block` keys, at least one.
fn parts(keys: usize, units: usize, threads: usize, block: usize) -> usize {
    (ITEMS_PER_THREAD * threads)
        .div_ceil(units)
        .min(keys.div_ceil(block))
        .max(1)
}

/// The split count each variant gets when the case names none (what sizes the split-KV
/// workspaces and partial results above, so it is pinned here apart from them):
/// flash-decoding's parts per (sequence, KV head); paged-decode's the same, or per
/// sequence where its items are whole sequences (fewer than 16 query rows a KV head);
/// mla-decode's per sequence in 256-key blocks; a ragged batch's parts of the whole cache,
/// twice as many a thread. The other variants split nothing.
#[test]
fn default_split_counts_follow_their_rules() {
    use VariantId::*;
    for v in VariantId::in_process() {
        for (batch, kv_heads, group) in [(1, 1, 1), (1, 2, 4), (3, 8, 8), (2, 1, 16)] {
            for seq_q in [1, 3, 20] {
                for seq_kv in [1, 1000, 1025, 5000, 70_000] {
                    for threads in [1, 2, 5, 16] {
                        let shape = Shape {
                            batch,
                            heads: kv_heads * group,
                            kv_heads,
                            seq_q,
                            seq_kv,
                            head_dim: 64,
                        };
                        let want = match v {
                            FlashDecoding => {
                                Some(parts(seq_kv, batch * kv_heads, threads, DECODE_BK))
                            }
                            PagedDecode if group * seq_q < GEMM_MIN_ROWS => {
                                Some(parts(seq_kv, batch, threads, DECODE_BK))
                            }
                            PagedDecode => {
                                Some(parts(seq_kv, batch * kv_heads, threads, DECODE_BK))
                            }
                            MlaDecode => Some(parts(seq_kv, batch, threads, MLA_BK)),
                            _ => None,
                        };
                        let got = v.get().default_splits(&shape, threads);
                        assert_eq!(got, want, "{v} {shape:?} threads {threads}");
                        let packed = Shape {
                            batch: 1,
                            seq_kv: batch * seq_kv,
                            seq_q: batch * seq_q,
                            ..shape
                        };
                        let want = match v {
                            FlashDecoding | PagedDecode => Some(
                                (2 * ITEMS_PER_THREAD * threads)
                                    .min(packed.seq_kv.div_ceil(DECODE_BK))
                                    .max(1),
                            ),
                            MlaDecode => Some(parts(packed.seq_kv, 1, threads, MLA_BK)),
                            _ => None,
                        };
                        let got = v.get().default_splits_ragged(&packed, threads);
                        assert_eq!(got, want, "{v} ragged {packed:?} threads {threads}");
                    }
                }
            }
        }
    }
}
