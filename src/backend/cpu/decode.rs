//! Attention of a block of query rows that share one key/value head (the G query heads of
//! a GQA group times the new tokens) against a run of keys, each row with its own visible
//! key range (causal, sliding window, shard positions). Three loop orders:
//! - `attend`: FlashAttention-2's online softmax over key blocks (Transformers Inference Optimization Toolset; docs/papers.md
//!   2.4), resumable from a running (acc, m, l) state, which is how split-KV flash-decoding,
//!   ring steps and tree shards all use it;
//! - `attend_sequential`: Rabe–Staats' one-key-at-a-time running max and sums (Rabe & Staats
//!   Sec. 3);
//! - `attend_materialized`: all scores of the rows, then softmax, then PV (the baseline).
//!
//! Every key and value is read once per call whatever the group size; time O(rows * keys *
//! d); scratch per call `scratch_len` floats (no allocation here).

use std::ops::Range;

use super::decode_amx;
use super::softmax::{exp_sub_sum, row_max, scale_row};
use super::spread::Spread;
use super::tiles::{self, pad_lanes, AOp, BOp, Out};
use super::vecops::{self, Dims, Elems};
use super::workspace::carve;
use crate::problem::{Fp8Kv, Isa, Tensor};

/// Keys per block of `attend` in decode (B_c): 1024 keys of d = 128 f32 are 1 MiB of K and V,
/// streamed; only the block's scores (rows x 1024) must stay in cache. Longer blocks
/// amortize the per-block softmax bookkeeping (measured: 64 to 1024 keys gain ~15%).
pub const KV_BLOCK: usize = 1024;

/// From this many query rows on, a block's scores and PV may go through the register-tile
/// GEMM (`tiles::gemm`; prefill shards, batched phase-1 rows); below it, the key-major dot
/// products of `vecops` (decode), which read each key once without packing it.
pub const GEMM_MIN_ROWS: usize = 16;

/// Keys whose K^T the GEMM path packs at a time: d x 256 floats (128 KiB at d = 128), which
/// stay in L2 while the rows pass over them.
pub const KT_KEYS: usize = 256;

/// Keys per chunk of decode's score loop where their values are fetched in one burst before
/// their scores (the portable loop, which has no per-key steps).
const PREFETCH_KEYS: usize = 4;

/// Keys per chunk of decode's score loop where the vector loops (AVX2, AVX-512, the
/// AVX512-BF16 pairs) spread the values' fetches over the keys (`vecops::fetches_per_key`:
/// one key's lines before each key's scores). Against bursts of 4 before each chunk: 0.86
/// to 0.93x the time in f32 on a Zen 3, 0.89x on the family 6 model 207 Xeon
/// (`docs/internals/decode-path.md`); 16 keys also let the AVX-512 scores reduce a whole
/// group by one tree.
const SPREAD_KEYS: usize = 16;

/// Keys per chunk of the vector score loop on the kernel path `isa`.
fn fetch_chunk(isa: Isa) -> usize {
    if vecops::fetches_per_key(isa) {
        SPREAD_KEYS
    } else {
        PREFETCH_KEYS
    }
}

/// Keys per chunk of the score loop on AMX tiles (two C tiles of 16 keys).
const TILE_KEYS: usize = 32;

/// Whether `attend_with`'s dot-product loop (not the GEMM: `gemm`) runs on AMX tiles for
/// these keys and rows, given bf16-valued query rows: scores as pairs on tiles, and the
/// value sums on tiles with P rounded to bf16. Only on the `amx-bf16` path (decode's
/// `Bf16Loop::Tiles`, or forced), for bf16 keys and values stored as such.
pub fn on_tiles(keys: &Keys, rows: usize, d: usize, bk: usize, gemm: bool) -> bool {
    !gemm
        && keys.isa == Isa::AmxBf16
        && matches!(
            (keys.k, keys.v, keys.fp8),
            (Tensor::Bf16(_), Tensor::Bf16(_), None)
        )
        && uses_tiles(rows, d, bk)
}

/// Whether the tiles take `rows` rows of width `d`: the process may use them, the shape
/// fits them, and the key and value copies' scratch (`bk` keys each, unused by bf16 read
/// in place) holds the packed Q^T and the value sums' tiles.
fn uses_tiles(rows: usize, d: usize, bk: usize) -> bool {
    cfg!(target_arch = "x86_64")
        && decode_amx::fits(rows, d)
        && bk * d >= decode_amx::qt_len(d).max(decode_amx::pv_len())
        && super::amx::usable()
}

/// Over a paged cache: how many pages ahead decode starts fetching a page, and how many
/// cache lines of its keys and of its values it requests (enough to start the hardware
/// prefetcher on the new stream).
const PAGES_AHEAD: usize = 2;
const PAGE_KICK_LINES: usize = 4;

/// Which keys a query may see. Positions are absolute token indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mask {
    /// Key position <= query position (bottom-right aligned for decode).
    pub causal: bool,
    /// Sliding window: only the last `window` positions up to the query's bound.
    pub window: Option<usize>,
    /// Length of the whole key sequence: the bound of non-causal rows.
    pub kv_len: usize,
    /// Attention sinks: positions `0..sinks` stay visible before the window's start
    /// (`Shape::sink_range`); 0 without.
    pub sinks: usize,
}

/// Positions of a run of tokens: index i sits at `start + i * stride` (contiguous shards
/// have stride 1; Striped Attention's shards have stride p).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Positions {
    pub start: i64,
    pub stride: i64,
}

impl Positions {
    pub const CONTIGUOUS: Positions = Positions {
        start: 0,
        stride: 1,
    };

    pub fn at(&self, i: usize) -> i64 {
        self.start + i as i64 * self.stride
    }
}

impl Mask {
    /// Absolute key positions `[lo, hi)` the query at position `qpos` sees (qpos may be
    /// negative for the leading rows of a causal case with seq_q > seq_kv).
    pub fn bounds(&self, qpos: i64) -> (i64, i64) {
        let n = self.kv_len as i64;
        let hi = if self.causal { (qpos + 1).min(n) } else { n };
        let lo = match self.window {
            Some(w) => hi - w as i64,
            None => 0,
        };
        (lo.max(0), hi.max(0))
    }

    /// Indices `[lo, hi)` of a run of `n` keys at `keys` positions that the query at
    /// position `qpos` sees in its window (its sinks: `sink_visible`).
    pub fn visible(&self, qpos: i64, keys: Positions, n: usize) -> Range<usize> {
        Self::indices(self.bounds(qpos), keys, n)
    }

    /// Indices of a run of `n` keys at `keys` positions that are sinks of the query at
    /// `qpos`: positions before both `sinks` and its window's start, so never in `visible`.
    pub fn sink_visible(&self, qpos: i64, keys: Positions, n: usize) -> Range<usize> {
        if !self.has_sinks() {
            return 0..0;
        }
        let (lo, _) = self.bounds(qpos);
        Self::indices((0, lo.min(self.sinks as i64)), keys, n)
    }

    /// Whether a query sees sinks besides its window: there are some, and a window.
    pub fn has_sinks(&self) -> bool {
        self.sinks > 0 && self.window.is_some()
    }

    /// Indices of the keys of a run at positions `[lo, hi)`.
    fn indices((lo, hi): (i64, i64), keys: Positions, n: usize) -> Range<usize> {
        let (start, stride) = (keys.start, keys.stride.max(1));
        let first_at_or_after = |pos: i64| -> usize {
            if pos <= start {
                0
            } else {
                ((pos - start + stride - 1) / stride).min(n as i64) as usize
            }
        };
        let a = first_at_or_after(lo);
        let b = first_at_or_after(hi);
        a..b.max(a)
    }
}

/// The running softmax state of a block of rows: unnormalized output `acc` (rows x d), row
/// maximum `m` and row sum `l` of exp(score - m).
pub struct RowState<'a> {
    pub acc: &'a mut [f32],
    pub m: &'a mut [f32],
    pub l: &'a mut [f32],
}

impl RowState<'_> {
    /// Nothing seen yet.
    pub fn reset(&mut self) {
        self.acc.fill(0.0);
        self.m.fill(f32::NEG_INFINITY);
        self.l.fill(0.0);
    }

    /// Continue from a normalized (o, lse) pair already in `acc` (o) and `lse`: with m = lse
    /// and l = 1, acc / l = o and m + ln l = lse, so further keys fold in exactly.
    pub fn resume(&mut self, lse: &[f32]) {
        let d = self.acc.len() / self.m.len().max(1);
        for (r, &x) in lse.iter().enumerate() {
            self.m[r] = x;
            if x == f32::NEG_INFINITY {
                self.l[r] = 0.0;
                self.acc[r * d..(r + 1) * d].fill(0.0);
            } else {
                self.l[r] = 1.0;
            }
        }
    }

    /// Normalize in place (acc becomes o = acc / l; 0 for a row that saw no key) and write
    /// each row's logsumexp m + ln l (-inf for such a row).
    pub fn finish(&mut self, lse: Option<&mut [f32]>) {
        let d = self.acc.len() / self.m.len().max(1);
        for (r, &l) in self.l.iter().enumerate() {
            scale_row(
                &mut self.acc[r * d..(r + 1) * d],
                if l > 0.0 { 1.0 / l } else { 0.0 },
            );
        }
        if let Some(lse) = lse {
            for (r, x) in lse.iter_mut().enumerate() {
                *x = if self.l[r] > 0.0 {
                    self.m[r] + self.l[r].ln()
                } else {
                    f32::NEG_INFINITY
                };
            }
        }
    }
}

/// A run of keys and values of one head: key i at element `base + i * d` of `k` and `v`,
/// or, in a paged cache, at `base + pages.at(i)`.
#[derive(Clone, Copy)]
pub struct Keys<'a> {
    pub k: &'a Tensor,
    pub v: &'a Tensor,
    pub base: usize,
    pub len: usize,
    pub pages: Option<Pages<'a>>,
    /// The kernel path the loops run on; on one whose `Isa::bf16_dot` holds, bf16 keys are
    /// multiplied as bf16 pairs (`vdpbf16ps`) by the dot-product loop, else widened to f32.
    pub isa: Isa,
    /// The same keys and values stored as FP8 (same element offsets), which are then read
    /// instead of `k` and `v`, widened block by block; contiguous runs only.
    pub fp8: Option<&'a Fp8Kv>,
}

/// Where the keys of a run sit in a pool of pages (`problem::paged`): key i is token
/// `first + i` of the sequence, in page `(first + i) / size` of the block table, whose
/// element offset (head 0) is `offsets[page]`.
#[derive(Clone, Copy)]
pub struct Pages<'a> {
    pub size: usize,
    pub offsets: &'a [usize],
    pub first: usize,
}

impl<'a> Keys<'a> {
    /// The first `len` keys and values of `k` and `v`, one contiguous run, on path `isa`.
    pub fn contiguous(k: &'a Tensor, v: &'a Tensor, len: usize, isa: Isa) -> Keys<'a> {
        Keys {
            k,
            v,
            base: 0,
            len,
            pages: None,
            isa,
            fp8: None,
        }
    }

    /// Whether the kernels widen keys and values into scratch (not f32 in place).
    pub fn widens(&self) -> bool {
        self.fp8.is_some() || self.k.dtype().size_bytes() != 4
    }

    /// `len` keys' elements (of keys `d` long) from element `offset` as the kernels read
    /// them: FP8 codes with their head's scale, in place where the loops widen them in
    /// registers (`vecops::fp8_in_registers`), else widened into `scratch`; otherwise
    /// `Elems::of` the storage tensor.
    #[inline]
    fn k_elems<'s>(&self, offset: usize, len: usize, d: usize, scratch: &'s mut [f32]) -> Elems<'s>
    where
        'a: 's,
    {
        match self.fp8 {
            Some(x) => fp8_elems(&x.k, offset, len, self.isa, d, scratch),
            None => Elems::of(self.k, offset, len, scratch),
        }
    }

    /// `k_elems` for the values.
    #[inline]
    fn v_elems<'s>(&self, offset: usize, len: usize, d: usize, scratch: &'s mut [f32]) -> Elems<'s>
    where
        'a: 's,
    {
        match self.fp8 {
            Some(x) => fp8_elems(&x.v, offset, len, self.isa, d, scratch),
            None => Elems::of(self.v, offset, len, scratch),
        }
    }

    /// The lines of `len` values from element `offset` (the FP8 codes where those are what
    /// is read), to be brought into L2 over `steps` steps.
    #[inline]
    fn v_spread(&self, offset: usize, len: usize, steps: usize) -> Spread {
        let none: &[u8] = &[];
        match (self.fp8, self.v) {
            (Some(x), _) => Spread::new(&x.v.codes[offset..offset + len], none, steps),
            (None, Tensor::F32(v)) => Spread::new(&v[offset..offset + len], none, steps),
            (None, Tensor::Bf16(v)) => Spread::new(&v[offset..offset + len], none, steps),
            (None, Tensor::F16(v)) => Spread::new(&v[offset..offset + len], none, steps),
        }
    }

    /// Calls `f(j, offset, n)` for each stretch of keys `k0..k0 + kn` that is contiguous in
    /// memory, in order: `n` keys starting with key `k0 + j` at element `offset`. One
    /// stretch for a contiguous run; a paged one breaks at every page.
    #[inline]
    fn for_each_run(&self, k0: usize, kn: usize, d: usize, mut f: impl FnMut(usize, usize, usize)) {
        let Some(p) = self.pages else {
            f(0, self.base + k0 * d, kn);
            return;
        };
        let mut j = 0;
        while j < kn {
            let t = p.first + k0 + j;
            let (page, slot) = (t / p.size, t % p.size);
            let n = (p.size - slot).min(kn - j);
            f(j, self.base + p.offsets[page] + slot * d, n);
            j += n;
        }
    }

    /// Over a paged cache, where the run that ends at key `next` was just started: the first
    /// lines of the page `PAGES_AHEAD` on (no further than key `end`), to start the hardware
    /// prefetcher on that page's stream before it is read. Nothing for a contiguous run.
    #[inline]
    fn kick_page_ahead(&self, next: usize, end: usize, d: usize) {
        let Some(p) = self.pages else {
            return;
        };
        let ahead = (next + (PAGES_AHEAD - 1) * p.size).min(end);
        if let Some(at) = self.offset_of(ahead, d) {
            let line = 64 / self.k.dtype().size_bytes();
            vecops::prefetch(self.k, at, PAGE_KICK_LINES * line, false);
            vecops::prefetch(self.v, at, PAGE_KICK_LINES * line, false);
        }
    }

    /// Element offset of key `i` of the run, if the run has it.
    fn offset_of(&self, i: usize, d: usize) -> Option<usize> {
        (i < self.len).then(|| match self.pages {
            None => self.base + i * d,
            Some(p) => {
                let t = p.first + i;
                self.base + p.offsets[t / p.size] + (t % p.size) * d
            }
        })
    }

    /// Whether the keys are not in one contiguous stretch (a block must then be gathered
    /// before the GEMM of many rows reads it).
    fn paged(&self) -> bool {
        self.pages.is_some()
    }
}

/// Scratch floats `attend` needs for `rows` rows of width `d` and key blocks of `bk`: the
/// block's keys and values when they must be widened or, for many rows over a paged cache,
/// gathered (and the rows as bf16 for the bf16 dot path), the packed K^T of the GEMM path
/// (`kt_len`), and the scores.
pub fn scratch_len(rows: usize, bk: usize, d: usize, widen_kv: bool, paged: bool) -> usize {
    let kv = if copies_kv(rows, widen_kv, paged) {
        2 * bk * d + (rows * d).div_ceil(2)
    } else {
        0
    };
    kv + kt_len(rows, bk, d) + rows * bk
}

/// Floats of the GEMM path's packed K^T: `KT_KEYS` keys (at most a block) padded to whole
/// vectors, for rows that may take the GEMM (`GEMM_MIN_ROWS`, whatever the measured choice,
/// so that memory never depends on it).
pub fn kt_len(rows: usize, bk: usize, d: usize) -> usize {
    if rows >= GEMM_MIN_ROWS {
        d * pad_lanes(bk.min(KT_KEYS))
    } else {
        0
    }
}

/// Whether `attend` copies each key block into scratch: to widen it, or to gather the
/// pages of a paged block for the GEMM (decode rows read the pages in place).
fn copies_kv(rows: usize, widen_kv: bool, paged: bool) -> bool {
    widen_kv || (paged && rows >= GEMM_MIN_ROWS)
}

/// The union of the rows' visible ranges (empty ranges ignored), and the number of
/// (row, key) pairs they hold.
pub fn span(rows: usize, range: &impl Fn(usize) -> Range<usize>) -> (Range<usize>, u64) {
    let (mut lo, mut hi, mut pairs) = (usize::MAX, 0, 0u64);
    for r in 0..rows {
        let x = range(r);
        if !x.is_empty() {
            lo = lo.min(x.start);
            hi = hi.max(x.end);
            pairs += x.len() as u64;
        }
    }
    if lo >= hi {
        (0..0, 0)
    } else {
        (lo..hi, pairs)
    }
}

/// Folds the keys of `keys` that each row may see (`range(r)`, indices into the run) into
/// the running `state`, key block by key block (FA2's inner loop). `q` holds the `rows`
/// rows (f32, `rows x d`); scores are scaled by `scale`. The loop (dot products or the
/// tiles' GEMM) is this machine's measured choice for the rows (`decode_path::gemm_rows`).
#[allow(clippy::too_many_arguments)]
pub fn attend(
    q: &[f32],
    rows: usize,
    range: &impl Fn(usize) -> Range<usize>,
    keys: Keys,
    d: usize,
    scale: f32,
    bk: usize,
    state: &mut RowState,
    scratch: &mut [f32],
) {
    let gemm_from = super::decode_path::gemm_rows(keys.k.dtype());
    attend_with(
        q, rows, range, keys, d, scale, bk, state, scratch, gemm_from,
    );
}

/// `attend` with the GEMM from `gemm_from` rows on (at least `GEMM_MIN_ROWS`, which sized
/// the scratch; `usize::MAX`: dot products always).
#[allow(clippy::too_many_arguments)]
pub fn attend_with(
    q: &[f32],
    rows: usize,
    range: &impl Fn(usize) -> Range<usize>,
    keys: Keys,
    d: usize,
    scale: f32,
    bk: usize,
    state: &mut RowState,
    scratch: &mut [f32],
    gemm_from: usize,
) {
    let gemm = rows >= gemm_from.max(GEMM_MIN_ROWS);
    let widen_kv = keys.widens();
    let copies = copies_kv(rows, widen_kv, keys.paged());
    let w = if copies { bk * d } else { 0 };
    let qw = if copies { (rows * d).div_ceil(2) } else { 0 };
    let [ks, vs, qs, kt, sc] = carve(scratch, [w, w, qw, kt_len(rows, bk, d), rows * bk]);
    let (span, _) = span(rows, range);
    // bf16 keys with bf16-valued queries (as in every bf16 case): the AVX512-BF16 dot
    // products, exact products and f32 sums like the path below.
    let q_bf16 = match keys.k {
        crate::problem::Tensor::Bf16(_)
            if !gemm && keys.isa.bf16_pairs() && keys.fp8.is_none() && vecops::has_bf16_dot() =>
        {
            vecops::to_bf16_bits(q, qs)
        }
        _ => None,
    };
    // On the amx-bf16 path, those pairs on tiles (`decode_amx`), and the value sums with
    // P rounded to bf16: Q^T packed into the key copy's scratch, the sums' tiles in the
    // value copy's, which bf16 read in place does not use.
    let (tiles, ks) = match q_bf16 {
        Some(qb) if on_tiles(&keys, rows, d, bk, gemm) => {
            let (qt, rest) = ks.split_at_mut(decode_amx::qt_len(d));
            decode_amx::pack_qt(qb, rows, d, qt);
            (Some(&*qt), rest)
        }
        _ => (None, ks),
    };
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `uses_tiles` checked that this process may use AMX.
    let _tiles = tiles.map(|_| unsafe { super::amx::Tiles::configure() });
    let chunk = if tiles.is_some() {
        TILE_KEYS
    } else {
        fetch_chunk(keys.isa)
    };
    let mut k0 = span.start;
    while k0 < span.end {
        let kn = bk.min(span.end - k0);
        let s = &mut sc[..rows * kn];
        if gemm {
            let k = gather(&keys, false, k0, kn, d, ks);
            gemm_scores(keys.isa, q, k, (rows, kn, d), kt, s);
            // The raw scores folded by the tiles' vector exp, the scale in the exponent
            // (`scale` > 0, so the raw max scaled is the scaled max).
            let (isa, log2e) = (keys.isa, std::f32::consts::LOG2_E);
            let max = |row: &[f32]| tiles::row_max(isa, row) * scale;
            let exp_sum =
                |row: &mut [f32], m: f32| tiles::exp_sum(isa, row, scale * log2e, m * log2e);
            fold_rows(s, kn, k0, range, state, d, max, exp_sum);
        } else {
            // Decode: memory-bound. In chunks of keys, start loading this chunk's values
            // into L2 while its scores are computed (the keys stream in sequentially, which
            // the hardware prefetcher handles; prefetching them too was slower).
            // A paged run is read page by page (paged-decode itself sends decode rows
            // through `attend_paged_heads`, which reads whole pages).
            keys.for_each_run(k0, kn, d, |j0, off, len| {
                keys.kick_page_ahead(k0 + j0 + len, k0 + kn, d);
                let mut j = 0;
                while j < len {
                    let n = chunk.min(len - j);
                    let (at, o) = (j0 + j, off + j * d);
                    // (The tiles fetch the values between their steps.)
                    let mut fetch = match tiles {
                        None => keys.v_spread(o, n * d, n),
                        Some(_) => Spread::none(),
                    };
                    let dims = Dims { rows, keys: n, d };
                    match (tiles, q_bf16, keys.k) {
                        #[cfg(target_arch = "x86_64")]
                        (Some(qt), _, Tensor::Bf16(kb)) => {
                            let kb = &kb[o..o + n * d];
                            let vb = match keys.v {
                                Tensor::Bf16(vb) => &vb[o..o + n * d],
                                _ => &[][..],
                            };
                            // SAFETY: tiles configured above (`_tiles`), which needs AVX-512
                            // F besides; `uses_tiles` checked `fits`.
                            unsafe {
                                decode_amx::scores(
                                    qt,
                                    kb,
                                    (rows, n, d),
                                    scale,
                                    &mut s[at..],
                                    kn,
                                    vb,
                                )
                            };
                        }
                        (_, Some(qb), Tensor::Bf16(kb)) => {
                            let kb = &kb[o..o + n * d];
                            vecops::scores_bf16(qb, kb, dims, scale, &mut s[at..], kn, &mut fetch);
                        }
                        _ => {
                            let w = if widen_kv { at * d } else { 0 };
                            let k = keys.k_elems(o, n * d, d, &mut ks[w..]);
                            let s = &mut s[at..];
                            vecops::scores_fetching(keys.isa, q, k, dims, scale, s, kn, &mut fetch);
                        }
                    }
                    j += n;
                }
            });
            fold_scores(s, kn, k0, range, state, d);
        }
        if gemm {
            let v = gather(&keys, true, k0, kn, d, vs);
            let (p, v) = (AOp::rows(s, rows, kn), BOp::new(v, kn, d, d));
            tiles::gemm(keys.isa, p, v, state.acc, d, Out::Add);
        } else {
            keys.for_each_run(k0, kn, d, |j, off, n| {
                #[cfg(target_arch = "x86_64")]
                if let (Some(_), Tensor::Bf16(vb)) = (tiles, keys.v) {
                    // SAFETY: tiles configured above (`_tiles`, with AVX-512 BW and BF16);
                    // `uses_tiles` checked `fits` and the scratch.
                    unsafe {
                        let (p, v) = (&s[j..], &vb[off..off + n * d]);
                        decode_amx::accumulate(p, kn, (rows, n, d), v, state.acc, vs)
                    };
                    return;
                }
                let v = keys.v_elems(off, n * d, d, &mut vs[if widen_kv { j * d } else { 0 }..]);
                vecops::accumulate(keys.isa, &s[j..], kn, v, d, state.acc);
            });
        }
        k0 += kn;
    }
}

/// Decode over a paged cache for every KV head of one sequence at once (PagedAttention's
/// per-sequence work with FA2's online softmax over key blocks): page by page, each head's
/// slice of the page is scored before the next page starts, so the pool is read in whole
/// pages (`heads` x page_size x d stretches) rather than one head's slice at a time, which
/// a shuffled pool scatters. `q`, `state` and the results hold `heads` blocks of `rows`
/// rows (head h's rows at h * rows); head h's key i is at `keys` offset of i plus
/// `h * head_stride`. `range(r)` is the visible range of row r of every head. Decode rows
/// only (fewer than `GEMM_MIN_ROWS` per head). Scratch: `scratch_len(heads * rows, ..)`.
#[allow(clippy::too_many_arguments)]
pub fn attend_paged_heads(
    q: &[f32],
    heads: usize,
    rows: usize,
    range: &impl Fn(usize) -> Range<usize>,
    keys: Keys,
    head_stride: usize,
    d: usize,
    scale: f32,
    bk: usize,
    state: &mut RowState,
    scratch: &mut [f32],
) {
    let total = heads * rows;
    let widen_kv = keys.widens();
    let w = if widen_kv { bk * d } else { 0 };
    let qw = if widen_kv { (total * d).div_ceil(2) } else { 0 };
    let [ks, vs, qs, sc] = carve(scratch, [w, w, qw, total * bk]);
    let (span, _) = span(rows, range);
    let q_bf16 = match keys.k {
        crate::problem::Tensor::Bf16(_) if keys.isa.bf16_pairs() && vecops::has_bf16_dot() => {
            vecops::to_bf16_bits(q, qs)
        }
        _ => None,
    };
    let chunk = fetch_chunk(keys.isa);
    let mut k0 = span.start;
    while k0 < span.end {
        let kn = bk.min(span.end - k0);
        let s = &mut sc[..total * kn];
        keys.for_each_run(k0, kn, d, |j0, off, len| {
            keys.kick_page_ahead(k0 + j0 + len, k0 + kn, d);
            for h in 0..heads {
                let (qh, sh) = (&q[h * rows * d..(h + 1) * rows * d], h * rows * kn);
                let mut j = 0;
                while j < len {
                    let n = chunk.min(len - j);
                    let (at, o) = (j0 + j, off + h * head_stride + j * d);
                    let mut fetch = keys.v_spread(o, n * d, n);
                    let dims = Dims { rows, keys: n, d };
                    let s = &mut s[sh + at..];
                    match (q_bf16, keys.k) {
                        (Some(qb), crate::problem::Tensor::Bf16(kb)) => {
                            let qb = &qb[h * rows * d..(h + 1) * rows * d];
                            let kb = &kb[o..o + n * d];
                            vecops::scores_bf16(qb, kb, dims, scale, s, kn, &mut fetch);
                        }
                        _ => {
                            let k = keys.k_elems(o, n * d, d, &mut ks[..]);
                            vecops::scores_fetching(
                                keys.isa, qh, k, dims, scale, s, kn, &mut fetch,
                            );
                        }
                    }
                    j += n;
                }
            }
        });
        fold_scores(s, kn, k0, &|r| range(r % rows.max(1)), state, d);
        keys.for_each_run(k0, kn, d, |j, off, n| {
            for h in 0..heads {
                let v = keys.v_elems(off + h * head_stride, n * d, d, &mut vs[..]);
                let acc = &mut state.acc[h * rows * d..(h + 1) * rows * d];
                vecops::accumulate(keys.isa, &s[h * rows * kn + j..], kn, v, d, acc);
            }
        });
        k0 += kn;
    }
}

/// S = Q K^T (`rows` x `kn`, row stride `kn`, not yet scaled) on the register tiles, K
/// (`kn` x `d`, row-major) transposed into `kt` `KT_KEYS` keys at a time.
fn gemm_scores(
    isa: Isa,
    q: &[f32],
    k: &[f32],
    (rows, kn, d): (usize, usize, usize),
    kt: &mut [f32],
    s: &mut [f32],
) {
    let s = &mut s[..rows * kn];
    let mut j0 = 0;
    while j0 < kn {
        let n = KT_KEYS.min(kn - j0);
        let pw = pad_lanes(n);
        tiles::pack_t_f32(isa, &k[j0 * d..(j0 + n) * d], n, d, pw, kt);
        let kt = BOp::new(&kt[..d * pw], d, n, pw);
        tiles::gemm(isa, AOp::rows(q, rows, d), kt, &mut s[j0..], kn, Out::Store);
        j0 += n;
    }
}

/// Keys (or the values, `values`) `k0..k0 + kn` of the run as one f32 block: in place when
/// they are f32 in one stretch, else widened and gathered into `scratch`.
fn gather<'a>(
    keys: &Keys<'a>,
    values: bool,
    k0: usize,
    kn: usize,
    d: usize,
    scratch: &'a mut [f32],
) -> &'a [f32] {
    if let Some(x) = keys.fp8 {
        let codes = if values { &x.v } else { &x.k };
        return widen_fp8(codes, keys.base + k0 * d, kn * d, scratch);
    }
    let t = if values { keys.v } else { keys.k };
    if !keys.paged() {
        return vecops::widen(t, keys.base + k0 * d, kn * d, scratch);
    }
    keys.for_each_run(k0, kn, d, |j, off, n| {
        vecops::widen_into(t, off, &mut scratch[j * d..(j + n) * d]);
    });
    &scratch[..kn * d]
}

/// `len` FP8 values of `t` from element `offset` (within one head, so one scale) as the
/// loops of path `isa` at head dimension `d` read them: the codes in place, or widened.
#[inline]
fn fp8_elems<'s>(
    t: &'s crate::problem::Fp8Tensor,
    offset: usize,
    len: usize,
    isa: Isa,
    d: usize,
    scratch: &'s mut [f32],
) -> Elems<'s> {
    if vecops::fp8_in_registers(isa, d) {
        Elems::Fp8(&t.codes[offset..offset + len], t.format, t.scale_of(offset))
    } else {
        Elems::F32(widen_fp8(t, offset, len, scratch))
    }
}

/// `len` FP8 values of `t` from element `offset` (within one head, so one scale), widened.
#[inline]
fn widen_fp8<'s>(
    t: &crate::problem::Fp8Tensor,
    offset: usize,
    len: usize,
    scratch: &'s mut [f32],
) -> &'s [f32] {
    let out = &mut scratch[..len];
    super::fp8::widen(
        &t.codes[offset..offset + len],
        t.format,
        t.scale_of(offset),
        out,
    );
    out
}

/// FA2's bookkeeping of one key block: each row of scores `s` (`kn` keys from index `k0`)
/// masked to its visible range, turned into exp(score - new max) in place, and folded into
/// the row's running max and sum, its accumulated output rescaled when the max moved.
#[inline]
pub fn fold_scores(
    s: &mut [f32],
    kn: usize,
    k0: usize,
    range: &impl Fn(usize) -> Range<usize>,
    state: &mut RowState,
    d: usize,
) {
    let exp_sum = |row: &mut [f32], m: f32| vecops::exp_sub_sum(row, m);
    fold_rows(s, kn, k0, range, state, d, vecops::row_max, exp_sum);
}

/// The fold of `fold_scores` with the row's score max (`max`) and the exponentiation of a
/// row against the new max, returning its sum (`exp_sum`), given.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn fold_rows(
    s: &mut [f32],
    kn: usize,
    k0: usize,
    range: &impl Fn(usize) -> Range<usize>,
    state: &mut RowState,
    d: usize,
    max: impl Fn(&[f32]) -> f32,
    exp_sum: impl Fn(&mut [f32], f32) -> f32,
) {
    for (r, row) in s.chunks_mut(kn).enumerate() {
        mask_row(row, &range(r), k0);
        let m_new = state.m[r].max(max(row));
        if m_new == f32::NEG_INFINITY {
            row.fill(0.0); // nothing visible yet for this row
            continue;
        }
        let correction = (state.m[r] - m_new).exp();
        state.l[r] = state.l[r] * correction + exp_sum(row, m_new);
        if correction != 1.0 {
            scale_row(&mut state.acc[r * d..(r + 1) * d], correction);
        }
        state.m[r] = m_new;
    }
}

/// -inf outside the row's visible range, for the block of keys starting at index `k0`.
fn mask_row(row: &mut [f32], range: &Range<usize>, k0: usize) {
    let n = row.len();
    let lo = range.start.saturating_sub(k0).min(n);
    let hi = range.end.saturating_sub(k0).min(n).max(lo);
    row[..lo].fill(f32::NEG_INFINITY);
    row[hi..].fill(f32::NEG_INFINITY);
}

/// Scratch floats of `attend_sequential`: one widened key and value, and one score per row.
pub fn sequential_scratch_len(rows: usize, d: usize, widen_kv: bool) -> usize {
    (if widen_kv { 2 * d } else { 0 }) + rows
}

/// Rabe–Staats Section 3: keys one at a time; per row s = q.k, m' = max(m, s),
/// v* <- v* e^(m - m') + v e^(s - m'), s* <- s* e^(m - m') + e^(s - m'). The key and value
/// are loaded once for all rows of the group.
#[allow(clippy::too_many_arguments)]
pub fn attend_sequential(
    q: &[f32],
    rows: usize,
    range: &impl Fn(usize) -> Range<usize>,
    keys: Keys,
    d: usize,
    scale: f32,
    state: &mut RowState,
    scratch: &mut [f32],
) {
    let widen_kv = keys.widens();
    let w = if widen_kv { d } else { 0 };
    let [ks, vs, sc] = carve(scratch, [w, w, rows]);
    let (span, _) = span(rows, range);
    // One loop with no per-key dispatch where the path has it (the same bits): a call per
    // key costs more than the key's work at small d.
    if keys.fp8.is_none() && keys.pages.is_none() {
        let parts = (&mut *state.m, &mut *state.l, &mut *state.acc);
        let kv = (keys.k, keys.v, keys.base);
        if vecops::sequential(keys.isa, q, kv, d, scale, span.clone(), range, parts, sc) {
            return;
        }
    }
    sequential_by_key(q, rows, range, keys, span, d, scale, state, [ks, vs, sc]);
}

/// `attend_sequential`'s loop one call per key: FP8 and paged runs, and paths without the
/// one-loop kernel.
#[allow(clippy::too_many_arguments)]
fn sequential_by_key(
    q: &[f32],
    rows: usize,
    range: &impl Fn(usize) -> Range<usize>,
    keys: Keys,
    span: Range<usize>,
    d: usize,
    scale: f32,
    state: &mut RowState,
    [ks, vs, sc]: [&mut [f32]; 3],
) {
    for j in span {
        let off = keys.base + j * d;
        let k = keys.k_elems(off, d, d, ks);
        let v = keys.v_elems(off, d, d, vs);
        vecops::scores(keys.isa, q, k, Dims { rows, keys: 1, d }, scale, sc, 1);
        for (r, s) in sc.iter_mut().enumerate() {
            if !range(r).contains(&j) {
                *s = 0.0;
                continue;
            }
            let m_new = state.m[r].max(*s);
            if m_new > state.m[r] {
                let c = (state.m[r] - m_new).exp();
                state.l[r] *= c;
                scale_row(&mut state.acc[r * d..(r + 1) * d], c);
                state.m[r] = m_new;
            }
            *s = (*s - m_new).exp();
            state.l[r] += *s;
        }
        vecops::accumulate(keys.isa, sc, 1, v, d, state.acc);
    }
}

/// Scratch floats of `attend_materialized` besides the score rows: one widened key block.
pub fn materialized_scratch_len(bk: usize, d: usize, widen_kv: bool) -> usize {
    if widen_kv {
        2 * bk * d
    } else {
        0
    }
}

/// Standard attention for the rows: all scores (`scores`: rows x `keys.len`, the
/// materialized matrix), then the safe softmax of each row, then `out` = P V (rows x d).
#[allow(clippy::too_many_arguments)]
pub fn attend_materialized(
    q: &[f32],
    rows: usize,
    range: &impl Fn(usize) -> Range<usize>,
    keys: Keys,
    d: usize,
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
    scratch: &mut [f32],
) {
    let n = keys.len;
    if n == 0 {
        out.fill(0.0);
        return;
    }
    let widen_kv = keys.widens();
    let w = if widen_kv { KV_BLOCK * d } else { 0 };
    let [ks, vs] = carve(scratch, [w, w]);
    let (span, _) = span(rows, range);
    for k0 in (span.start..span.end).step_by(KV_BLOCK) {
        let kn = KV_BLOCK.min(span.end - k0);
        let k = keys.k_elems(keys.base + k0 * d, kn * d, d, ks);
        vecops::scores(
            keys.isa,
            q,
            k,
            Dims { rows, keys: kn, d },
            scale,
            &mut scores[k0..],
            n,
        );
    }
    for (r, row) in scores.chunks_mut(n).enumerate().take(rows) {
        let range = range(r);
        row[..range.start.min(n)].fill(0.0);
        row[range.end.min(n)..].fill(0.0);
        let vis = &mut row[range.start.min(range.end)..range.end];
        let sum = exp_sub_sum(vis, row_max(vis));
        scale_row(vis, if sum > 0.0 { 1.0 / sum } else { 0.0 });
    }
    out.fill(0.0);
    for k0 in (span.start..span.end).step_by(KV_BLOCK) {
        let kn = KV_BLOCK.min(span.end - k0);
        let v = keys.v_elems(keys.base + k0 * d, kn * d, d, vs);
        vecops::accumulate(keys.isa, &scores[k0..], n, v, d, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `attend_sequential`'s one-loop kernel gives the key-by-key loop's bits (scores,
    /// running max and sum, output) on every path that has it, for every storage dtype,
    /// head dimensions held in registers (64, 128) or not (48), and rows that see
    /// different keys (so some skip keys the others fold).
    #[test]
    fn the_one_loop_sequential_kernel_gives_the_key_by_key_bits() {
        use crate::problem::DType;
        let vals = |seed: u32, len: usize| crate::backend::cpu::kernel_paths::values(len, seed);
        let n = 70;
        let mut checked = 0;
        for isa in Isa::available_paths() {
            for d in [48, 64, 128] {
                for dtype in DType::ALL {
                    let k = Tensor::from_f32(vals(3, n * d), dtype);
                    let v = Tensor::from_f32(vals(4, n * d), dtype);
                    for rows in [1, 2, 5] {
                        let q = vals(5, rows * d);
                        let range = |r: usize| 3 * r..n - r;
                        let run = |by_key: bool| {
                            let (mut acc, mut m, mut l) =
                                (vec![0.0; rows * d], vec![0.0; rows], vec![0.0; rows]);
                            let mut st = RowState {
                                acc: &mut acc,
                                m: &mut m,
                                l: &mut l,
                            };
                            st.reset();
                            let keys = Keys::contiguous(&k, &v, n, isa);
                            let mut scratch = vec![0.0; sequential_scratch_len(rows, d, true)];
                            if by_key {
                                let [ks, vs, sc] = carve(&mut scratch, [d, d, rows]);
                                let span = span(rows, &range).0;
                                let (scale, sc3) = (0.125, [ks, vs, sc]);
                                sequential_by_key(
                                    &q, rows, &range, keys, span, d, scale, &mut st, sc3,
                                );
                            } else {
                                attend_sequential(
                                    &q,
                                    rows,
                                    &range,
                                    keys,
                                    d,
                                    0.125,
                                    &mut st,
                                    &mut scratch,
                                );
                            }
                            let bits =
                                |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                            (bits(&acc), bits(&m), bits(&l))
                        };
                        assert_eq!(run(false), run(true), "{isa:?} d {d} {dtype:?} rows {rows}");
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 0);
    }

    /// Both loops of `attend` (forced) on every kernel path, over contiguous and
    /// reversed-page keys of every dtype, rows on both sides of the crossover, each row with
    /// its own visible range: every output within 1e-4 of the f64 oracle
    /// (`reference::exact_row`) on the same dtype-rounded values.
    #[test]
    fn both_loops_attend_like_the_f64_softmax() {
        use crate::problem::{DType, Inputs, Shape};
        use crate::reference::exact_row;
        let (n, page, bk): (usize, usize, usize) = (300, 16, 64);
        let vals = |seed: u32, len: usize| crate::backend::cpu::kernel_paths::values(len, seed);
        let widened = |t: &Tensor| {
            let mut out = Vec::new();
            t.for_each_f32(|x| out.push(x));
            out
        };
        // Head dimensions for the AVX2 loops (24), and the AVX-512 ones: any whole number of
        // vectors (48) and the query row held in registers (128).
        for d in [24, 48, 128] {
            // The pool: page p of the run at physical slot pages - 1 - p (reversed order).
            let pages = n.div_ceil(page);
            let offsets: Vec<usize> = (0..pages).map(|p| (pages - 1 - p) * page * d).collect();
            for dtype in DType::ALL {
                let (kf, vf) = (vals(1, n * d), vals(2, n * d));
                let (k, v) = (Tensor::from_f32(kf, dtype), Tensor::from_f32(vf, dtype));
                let (kr, vr) = (widened(&k), widened(&v));
                let mut pk = vec![0.0f32; pages * page * d];
                let mut pv = pk.clone();
                for i in 0..n {
                    let at = offsets[i / page] + (i % page) * d;
                    pk[at..at + d].copy_from_slice(&kr[i * d..(i + 1) * d]);
                    pv[at..at + d].copy_from_slice(&vr[i * d..(i + 1) * d]);
                }
                let (pk, pv) = (Tensor::from_f32(pk, dtype), Tensor::from_f32(pv, dtype));
                for rows in [15, 16, 40] {
                    let oracle = Inputs {
                        shape: Shape {
                            batch: 1,
                            heads: 1,
                            kv_heads: 1,
                            seq_q: rows,
                            seq_kv: n,
                            head_dim: d,
                        },
                        q: Tensor::from_f32(vals(3 + rows as u32, rows * d), dtype),
                        k: k.clone(),
                        v: v.clone(),
                        paged: Vec::new(),
                        fp8: Vec::new(),
                        mla: None,
                    };
                    let q = widened(&oracle.q);
                    let range = |r: usize| (r * 7) % 50..n - (r * 5) % 40;
                    let scale = 1.0 / (d as f32).sqrt();
                    // Every kernel path this CPU runs (bf16 pairs where it has them,
                    // widened bf16 on the others), over contiguous and paged keys.
                    let paths = Isa::ALL.into_iter().filter(|i| i.available());
                    for (paged, isa) in paths.flat_map(|i| [(false, i), (true, i)]) {
                        let keys = if paged {
                            Keys {
                                k: &pk,
                                v: &pv,
                                base: 0,
                                len: n,
                                pages: Some(Pages {
                                    size: page,
                                    offsets: &offsets,
                                    first: 0,
                                }),
                                isa,
                                fp8: None,
                            }
                        } else {
                            Keys::contiguous(&k, &v, n, isa)
                        };
                        for gemm_from in [GEMM_MIN_ROWS, usize::MAX] {
                            let widen = dtype != DType::F32;
                            let mut scratch = vec![0.0f32; scratch_len(rows, bk, d, widen, paged)];
                            let (mut acc, mut m, mut l) = (
                                vec![0.0f32; rows * d],
                                vec![0.0f32; rows],
                                vec![0.0f32; rows],
                            );
                            let mut state = RowState {
                                acc: &mut acc,
                                m: &mut m,
                                l: &mut l,
                            };
                            state.reset();
                            attend_with(
                                &q,
                                rows,
                                &range,
                                keys,
                                d,
                                scale,
                                bk,
                                &mut state,
                                &mut scratch,
                                gemm_from,
                            );
                            state.finish(None);
                            // The tile loop rounds P to bf16 (8 significant bits): each
                            // weight off by at most 2^-8 of itself, the output by at most
                            // 2^-8 of the largest value; every other loop keeps P in f32.
                            let gemm = rows >= gemm_from.max(GEMM_MIN_ROWS);
                            let tol = if on_tiles(&keys, rows, d, bk, gemm) {
                                1e-4 + vr.iter().fold(0.0f32, |m, x| m.max(x.abs())) as f64 / 256.0
                            } else {
                                1e-4
                            };
                            for r in 0..rows {
                                let exact = exact_row(&oracle, r * d, 0, range(r));
                                for (c, want) in exact.into_iter().enumerate() {
                                    let got = acc[r * d + c] as f64;
                                    assert!(
                                        (got - want).abs() <= tol,
                                        "{dtype:?} rows {rows} paged {paged} {isa:?} gemm_from {gemm_from}: row {r} col {c}: {got} vs {want}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn contiguous_visibility_matches_the_shapes_key_range() {
        use crate::problem::Shape;
        for (nq, nkv) in [(1, 10), (3, 10), (12, 5)] {
            for causal in [false, true] {
                for window in [None, Some(1), Some(4), Some(50)] {
                    let s = Shape {
                        batch: 1,
                        heads: 1,
                        kv_heads: 1,
                        seq_q: nq,
                        seq_kv: nkv,
                        head_dim: 1,
                    };
                    let mask = Mask {
                        causal,
                        window,
                        kv_len: nkv,
                        sinks: 0,
                    };
                    for row in 0..nq {
                        let qpos = nkv as i64 - nq as i64 + row as i64;
                        let got = mask.visible(qpos, Positions::CONTIGUOUS, nkv);
                        let want = s.key_range(causal, window, row);
                        assert_eq!(
                            (got.len(), if got.is_empty() { 0 } else { got.start }),
                            (want.len(), if want.is_empty() { 0 } else { want.start }),
                            "{nq} {nkv} {causal} {window:?} row {row}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn strided_visibility_counts_exactly_the_earlier_positions() {
        // p = 4 stripes of 10 keys: stripe j holds positions j, j+4, ...
        let mask = Mask {
            causal: true,
            window: None,
            kv_len: 40,
            sinks: 0,
        };
        for j in 0..4 {
            let keys = Positions {
                start: j,
                stride: 4,
            };
            for qpos in 0..40i64 {
                let want = (0..10).filter(|&b| keys.at(b) <= qpos).count();
                let r = mask.visible(qpos, keys, 10);
                assert_eq!((r.start, r.end), (0, want), "stripe {j} qpos {qpos}");
            }
        }
        let windowed = Mask {
            window: Some(6),
            ..mask
        };
        let keys = Positions {
            start: 1,
            stride: 4,
        };
        // Positions 16..=21 are visible: stripe 1 holds 17 and 21 there.
        let r = windowed.visible(21, keys, 10);
        let want: Vec<usize> = (0..10)
            .filter(|&b| keys.at(b) <= 21 && keys.at(b) > 15)
            .collect();
        assert_eq!(r.collect::<Vec<_>>(), want);
    }
}
