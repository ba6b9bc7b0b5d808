//! FlashAttention-2 forward loop order (Dao 2023; Transformers Inference Optimization Toolset "FlashAttention"): per query block
//! Q_i, iterate key/value blocks keeping the running row max m, sum l and the unnormalized
//! output O; S = Q_i K_j^T, m' = max(m, rowmax S), P = exp(S - m'), l = e^(m-m') l + rowsum P,
//! O = e^(m-m') O + P V_j; one division O / l at the end. Causal: key blocks entirely above
//! the diagonal are skipped, the diagonal blocks are masked. Sliding window (`Shape::key_range`):
//! the key loop starts at the block's first row's window start (keys before it are outside
//! every row's window), and the blocks before its last row's window start are masked;
//! attention sinks (`Shape::sink_range`) are the key blocks before that start, read first
//! and unmasked, and the sink keys of the masked blocks are left visible. Time O(n_q*n_kv*d); extra memory
//! per worker O(B_r*B_c + B_r*d) floats (the exact list: `worker_lens`): O(1) in n.
//!
//! The tiles are computed transposed, with the query rows along the vector lanes:
//! S^T = K_j Q_i^T and O^T = V_j^T P^T. Then K_j and V_j are read in place as broadcast
//! operands (no per-block packing of K or V for f32 inputs), only Q_i^T is packed, once per
//! query block, and the softmax is vertical: the row max, the exp and the row sums are plain
//! element-wise vector operations over the key rows of S^T, with no horizontal reductions;
//! the correction e^(m-m') of O^T is folded into the PV tile's epilogue. bf16 inputs on
//! AVX512_BF16 use `vdpbf16ps` for both products (P rounded to bf16 for PV, V_j paired per
//! block); other low-precision paths widen K_j and V_j to f32 per block.

use super::flash_amx;
use super::isa::Isa;
use super::sched::{for_each_item, Blocks};
use super::simd::{KC, LOG2E};
pub use super::tiles::ReadPath;
use super::tiles::{
    as_u16, bf16_bits, col_softmax, col_softmax_bf16, gemm, gemm_bf16, interleave_rows,
    mask_colmax, pack_pairs_t, pack_t, pad_lanes, AOp, BOp, ColState, Out,
};
use super::vecops;
use super::workspace::{carve, Workspace};
use crate::problem::{DType, Inputs, Shape};

/// Query rows per block (B_r): the outer, parallel loop, and the vector lanes of every tile
/// (4 AVX-512 vectors). Small enough that a causal problem with one head still splits into
/// many items for the workers; large enough that packing Q^T once per block is negligible.
pub const DEFAULT_Q_CHUNK: usize = 64;
/// Keys per block (B_c): the inner loop. S^T (B_c x B_r f32 = 64 KiB) and the K_j and V_j
/// rows it reads (64 KiB each at d = 64) stay in L2 between the QK^T, softmax and PV passes;
/// one PV tile sums B_c <= 256 products per output (one partial sum, `simd::KC`).
pub const DEFAULT_KV_CHUNK: usize = 256;

pub fn items(shape: &Shape, bq: usize) -> usize {
    shape.batch * shape.heads * shape.seq_q.div_ceil(bq)
}

/// The most query blocks of a head the AMX path runs against each packed key block
/// (`flash_amx::block`; the scratch holds their running max and sum): one with a sliding
/// window (each block's key tiles start at its own window) or with blocks that are not
/// whole A tiles (each would need its own padded copy of Q), else up to
/// `flash_amx::MAX_GROUP`, as many as a head has.
pub fn amx_group_cap(shape: &Shape, bq: usize, window: Option<usize>) -> usize {
    match window {
        Some(_) => 1,
        None => amx_group_rows(shape.seq_q, bq),
    }
}

/// The most query blocks of `bq` rows the AMX path groups in a run of `rows` query rows
/// (a head's, or a ragged batch's longest sequence's): as many as there are, at most
/// `flash_amx::MAX_GROUP`; one where a block is not whole A tiles.
pub fn amx_group_rows(rows: usize, bq: usize) -> usize {
    if !bq.is_multiple_of(flash_amx::GRAIN) {
        return 1;
    }
    flash_amx::MAX_GROUP.min(rows.div_ceil(bq)).max(1)
}

/// The query blocks per item of `forward` on the AMX path with `workers` workers: the cap,
/// lowered until there are at least 4 items a worker (`largest_group`).
fn amx_group(shape: &Shape, bq: usize, window: Option<usize>, workers: usize) -> usize {
    let nqb = shape.seq_q.div_ceil(bq.max(1));
    let heads = shape.batch * shape.heads;
    let cap = amx_group_cap(shape, bq, window);
    largest_group(cap, workers, |_| true, |g| heads * nqb.div_ceil(g))
}

/// The largest group size of at most `cap` blocks, among those `allowed`, that leaves at
/// least 4 items a worker (`items(g)` of them), else 1: causal items differ in work, and
/// the last, cheapest ones even out the workers' finish.
fn largest_group(
    cap: usize,
    workers: usize,
    allowed: impl Fn(usize) -> bool,
    items: impl Fn(usize) -> usize,
) -> usize {
    (1..=cap)
        .rev()
        .find(|&g| allowed(g) && (workers <= 1 || items(g) >= 4 * workers))
        .unwrap_or(1)
}

/// The query blocks per item of `forward_steps` on the AMX path: a divisor of a step's
/// `chunk / bq` blocks (an item never spans two steps), at most `flash_amx::MAX_GROUP`,
/// the largest that leaves 4 items a worker in a whole step (`largest_group`); 1 off the
/// AMX path or where a block is not whole A tiles.
pub fn steps_group(
    shape: &Shape,
    (bq, chunk): (usize, usize),
    path: FlashPath,
    workers: usize,
) -> usize {
    if path != FlashPath::Amx || bq == 0 {
        return 1;
    }
    let per = chunk / bq;
    let heads = shape.batch * shape.heads;
    let cap = amx_group_rows(chunk, bq);
    largest_group(
        cap,
        workers,
        |g| per.is_multiple_of(g),
        |g| heads * (per / g),
    )
}

/// Per-worker scratch floats, in the order they are carved: Q^T, widened K_j, widened or
/// paired V_j, S^T, bf16 P^T pairs, O^T, and five column vectors (block max, running max,
/// running sum, correction, visible keys per query row). `group`: the AMX path's query
/// blocks per item (`amx_group_cap`; 1 where blocks run one at a time).
pub fn worker_lens(
    shape: &Shape,
    bq: usize,
    bk: usize,
    path: FlashPath,
    group: usize,
) -> [usize; 11] {
    let d = shape.head_dim;
    let path = match path {
        FlashPath::Amx => {
            let a = flash_amx::worker_lens(d, bq, bk, group);
            return std::array::from_fn(|i| a.get(i).copied().unwrap_or(0));
        }
        FlashPath::Tiles(p) => p,
    };
    let nb = pad_lanes(bq);
    let (qt, kw, vw, pp) = match path {
        ReadPath::F32 => (d * nb, 0, 0, 0),
        ReadPath::Widen => (d * nb, bk * d, bk * d, 0),
        // bf16 values are 2 to a float; pairs of keys round up.
        ReadPath::Bf16Dot => (d * nb / 2, 0, bk.div_ceil(2) * d, bk.div_ceil(2) * nb),
    };
    [qt, kw, vw, bk * nb, pp, d * nb, nb, nb, nb, nb, nb]
}

/// The operand path of a forward: [`ReadPath::of`], except that a forward whose output feeds
/// the backward (`exact`) keeps P in f32 (bf16 inputs widened instead of `vdpbf16ps`, which
/// would round P to bf16 for PV: fine for the forward's bf16 tolerance, too coarse for the
/// gradients' 1e-4).
pub fn path(dtype: DType, isa: Isa, head_dim: usize, exact: bool) -> FlashPath {
    // The AMX tiles round P to bf16 as the pairs do.
    if isa == Isa::AmxBf16 && dtype == DType::Bf16 && !exact && flash_amx::fits(head_dim) {
        return FlashPath::Amx;
    }
    // Off `flash_amx`, the amx-bf16 path widens: flash's pair tiles read Q^T and P^T
    // transposed, which AMX tiles cannot load, so they would run on `vdpbf16ps`.
    FlashPath::Tiles(match ReadPath::of(dtype, isa, head_dim) {
        ReadPath::Bf16Dot if exact || isa == Isa::AmxBf16 => ReadPath::Widen,
        p => p,
    })
}

/// How flash's forward reads its operands: on the shared tiles (`ReadPath`), or on AMX
/// tiles (`flash_amx`, bf16 on the amx-bf16 path).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlashPath {
    Tiles(ReadPath),
    Amx,
}

impl FlashPath {
    /// Whether P is rounded to bf16 for PV (bf16 pairs or AMX tiles).
    pub fn rounds_p(self) -> bool {
        matches!(self, FlashPath::Amx | FlashPath::Tiles(ReadPath::Bf16Dot))
    }
}

/// Forward into `out`; with `lse`, also the row logsumexp L = m + ln(l) of the scaled
/// scores (`[b, h, n_q]`, -inf for a row that sees no key), which the backward needs.
/// `sinks`: the first keys every row sees beside its `window` (0: none).
/// `path` must be one `path` returns for these inputs and `isa` (the workspace is sized
/// for it).
#[allow(clippy::too_many_arguments)]
pub fn forward(
    inputs: &Inputs,
    causal: bool,
    (window, sinks): (Option<usize>, usize),
    (bq, bk): (usize, usize),
    path: FlashPath,
    isa: Isa,
    ws: &Workspace,
    out: &mut [f32],
    lse: Option<&mut [f32]>,
) {
    let s = inputs.shape;
    let (d, nq) = (s.head_dim, s.seq_q);
    assert!(
        path == self::path(inputs.dtype(), isa, d, false)
            || path == FlashPath::Tiles(ReadPath::Widen),
        "flash path {path:?} does not fit these inputs on {isa}"
    );
    // An item: a query block, or on the AMX path a group of them sharing each packed key
    // block (`amx_group`).
    let per = match path {
        FlashPath::Amx => bq * amx_group(&s, bq, window, ws.workers()),
        FlashPath::Tiles(_) => bq,
    };
    let nqb = nq.div_ceil(per);
    let bh = s.batch * s.heads;
    let outs = Blocks::new(out, nq, d, per);
    let lses = lse.map(|l| Blocks::new(l, nq, 1, per));
    let lens = worker_lens(&s, bq, bk, path, 1);
    for_each_item(ws, bh * nqb, |buf, i| {
        // Head by head (its K and V stay in cache while both workers read them); causal:
        // within a head the blocks that see the most keys first, so the last items handed
        // out are the cheapest and the workers finish together.
        let (head, qi) = if causal {
            (i / nqb, nqb - 1 - i % nqb)
        } else {
            (i / nqb, i % nqb)
        };
        let o = outs.take(head, qi);
        let lse_i = lses.as_ref().map(|l| l.take(head, qi));
        let seq = Seq::head(&s, head);
        block(
            inputs,
            causal,
            (window, sinks),
            seq,
            qi * per,
            (bq, bk),
            isa,
            path,
            buf,
            lens,
            o,
            lse_i,
        );
    });
}

/// Chunked prefill (Transformers Inference Optimization Toolset, "Chunked prefill"): the
/// causal forward of a prompt in steps of `chunk` query rows, one step after another, each
/// a parallel forward of its rows against the keys written so far (each row's causal
/// bound, which never passes the step's last row). `chunk` must be a multiple of `bq`;
/// `after_step(c)` runs when step `c` is done. Output and FLOPs are the one-shot forward's.
#[allow(clippy::too_many_arguments)]
pub fn forward_steps(
    inputs: &Inputs,
    (bq, bk): (usize, usize),
    chunk: usize,
    path: FlashPath,
    isa: Isa,
    ws: &Workspace,
    out: &mut [f32],
    mut after_step: impl FnMut(usize),
) {
    let s = inputs.shape;
    let (d, nq) = (s.head_dim, s.seq_q);
    assert!(
        chunk > 0 && chunk.is_multiple_of(bq),
        "chunked prefill: step of {chunk} rows is not a multiple of the {bq}-row query block"
    );
    let (nqb, per) = (nq.div_ceil(bq), chunk / bq);
    // An item: a group of `g` of a step's blocks (one off the AMX path), whose key blocks
    // are packed once for all of them (`flash_amx::block`).
    let g = steps_group(&s, (bq, chunk), path, ws.workers());
    let bh = s.batch * s.heads;
    let outs = Blocks::new(out, nq, d, bq * g);
    let lens = worker_lens(&s, bq, bk, path, 1);
    for c in 0..nq.div_ceil(chunk) {
        let first = c * per;
        let groups = per.min(nqb - first).div_ceil(g);
        for_each_item(ws, bh * groups, |buf, i| {
            // The step's blocks that see the most keys first, as in `forward`.
            let (head, gi) = (i / groups, first / g + groups - 1 - i % groups);
            let o = outs.take(head, gi);
            let (seq, row0) = (Seq::head(&s, head), gi * g * bq);
            block(
                inputs,
                true,
                (None, 0),
                seq,
                row0,
                (bq, bk),
                isa,
                path,
                buf,
                lens,
                o,
                None,
            );
        });
        after_step(c);
    }
}

/// FlashAttention-2's forward over a ragged batch packed as `[1, heads, total, d]`: the
/// rows and keys of sequence i are `cu_q[i]..cu_q[i + 1]` and `cu_kv[i]..cu_kv[i + 1]` of
/// every head (`BatchSpec::offsets`, a varlen kernel's cumulative lengths), and each
/// sequence's query blocks attend to its own keys only (causal: bottom-right aligned per
/// sequence). Items are heads, each running its sequences' blocks, so the workers share
/// equal work whatever the lengths.
#[allow(clippy::too_many_arguments)]
pub fn forward_varlen(
    inputs: &Inputs,
    causal: bool,
    (bq, bk): (usize, usize),
    (cu_q, cu_kv): (&[usize], &[usize]),
    path: FlashPath,
    isa: Isa,
    ws: &Workspace,
    out: &mut [f32],
) {
    let s = inputs.shape;
    let d = s.head_dim;
    let lens = worker_lens(&s, bq, bk, path, 1);
    // On the AMX path a sequence's query blocks run in groups that share each packed key
    // block (`flash_amx::block`), as many as the longest sequence has, at most 8.
    let longest = cu_q.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    let per = match path {
        FlashPath::Amx => bq * amx_group_rows(longest, bq),
        FlashPath::Tiles(_) => bq,
    };
    let heads = Blocks::new(out, s.seq_q, d, s.seq_q.max(1));
    for_each_item(ws, s.batch * s.heads, |buf, head| {
        let o = heads.take(head, 0);
        let (b, h) = (head / s.heads, head % s.heads);
        for i in 0..cu_q.len().saturating_sub(1) {
            let seq = Seq {
                shape: Shape {
                    batch: 1,
                    seq_q: cu_q[i + 1] - cu_q[i],
                    seq_kv: cu_kv[i + 1] - cu_kv[i],
                    ..s
                },
                q_off: s.q_head_offset(b, h) + cu_q[i] * d,
                kv_off: s.kv_head_offset(b, h) + cu_kv[i] * d,
            };
            let rows = &mut o[cu_q[i] * d..cu_q[i + 1] * d];
            for (qi, ob) in rows.chunks_mut(per * d).enumerate() {
                block(
                    inputs,
                    causal,
                    (None, 0),
                    seq,
                    qi * per,
                    (bq, bk),
                    isa,
                    path,
                    buf,
                    lens,
                    ob,
                    None,
                );
            }
        }
    });
}

/// Where one head's rows and keys of one sequence sit: the sequence's shape (its lengths
/// decide what each row sees) and the element offsets of its first query row and first key.
#[derive(Clone, Copy)]
struct Seq {
    shape: Shape,
    q_off: usize,
    kv_off: usize,
}

impl Seq {
    /// Head `head` (= b * heads + h) of a batch of equal lengths.
    fn head(s: &Shape, head: usize) -> Seq {
        let (b, h) = (head / s.heads, head % s.heads);
        Seq {
            shape: *s,
            q_off: s.q_head_offset(b, h),
            kv_off: s.kv_head_offset(b, h),
        }
    }
}

/// The key tiles query rows `row0..row0 + rows` read, in the order `block` reads them:
/// (first key, keys) of each, at most `bk` keys. The sink tiles first (the keys before
/// every row's window that every row sees, `0..min(sinks, window start)`), then the
/// window's tiles from the first row's window start (a row's start never decreases, so
/// keys before it are skipped) to the last row's visible end (keys past it are masked for
/// the whole block). Without a window: `0..visible end`. One schedule for the kernel and
/// for the count of what it reads (`hbm_io::flash2`).
pub fn key_tiles(
    s: &Shape,
    causal: bool,
    (window, sinks): (Option<usize>, usize),
    (row0, rows): (usize, usize),
    bk: usize,
) -> impl Iterator<Item = (usize, usize)> {
    let kv_end = s.visible_keys(causal, row0 + rows - 1);
    let kv_start = match window {
        Some(_) => s.key_range(causal, window, row0).start,
        None => 0,
    };
    let sink_end = sinks.min(kv_start);
    let nkv = s.seq_kv;
    let sink_tiles = (0..sink_end).step_by(bk).map(move |k0| (k0, sink_end));
    let window_tiles = (kv_start..kv_end).step_by(bk).map(move |k0| (k0, kv_end));
    sink_tiles
        .chain(window_tiles)
        .map(move |(k0, end)| (k0, bk.min(end - k0).min(nkv - k0)))
}

/// One item: rows `row0..row0 + o.len()/d` of the head and sequence `seq`, one query
/// block, or on the AMX path a group of `bq`-row blocks sharing each packed key block.
#[allow(clippy::too_many_arguments)]
fn block(
    inputs: &Inputs,
    causal: bool,
    (window, sinks): (Option<usize>, usize),
    seq: Seq,
    row0: usize,
    (bq, bk): (usize, usize),
    isa: Isa,
    path: FlashPath,
    buf: &mut [f32],
    lens: [usize; 11],
    o: &mut [f32],
    lse: Option<&mut [f32]>,
) {
    let s = seq.shape;
    let d = s.head_dim;
    let (q_off, kv_off) = (seq.q_off, seq.kv_off);
    let rows = o.len() / d;
    let path = match path {
        FlashPath::Tiles(p) => p,
        FlashPath::Amx => {
            flash_amx_block(
                inputs,
                causal,
                (window, sinks),
                seq,
                row0,
                (bq, bk),
                buf,
                o,
                lse,
            );
            return;
        }
    };
    let nb = pad_lanes(rows);
    let c = s.scale() * LOG2E;
    let [qt, kw, vw, st, pp, ot, colmax, m2, l, corr, vis] = carve(buf, lens);
    let (m2, l, corr, vis) = (&mut m2[..nb], &mut l[..nb], &mut corr[..nb], &mut vis[..nb]);

    match path {
        ReadPath::Bf16Dot => {
            let q = bf16_bits(&inputs.q).unwrap_or_default();
            pack_pairs_t(isa, &q[q_off + row0 * d..], rows, d, nb, as_u16(qt));
        }
        _ => pack_t(isa, &inputs.q, q_off + row0 * d, rows, d, nb, qt),
    }
    let ot = &mut ot[..d * nb];
    ot.fill(0.0);
    m2.fill(f32::NEG_INFINITY);
    l.fill(0.0);
    for (r, x) in vis.iter_mut().enumerate() {
        // Padding columns behave as the last row (finite, never written out).
        *x = s.visible_keys(causal, row0 + r.min(rows - 1)) as f32;
    }
    // Keys from the first row's visible range on need the causal mask.
    let first_visible = s.visible_keys(causal, row0);
    // Sliding window: keys before the last row's window start need the mask.
    let lo = |r: usize| s.key_range(causal, window, row0 + r.min(rows - 1)).start;
    let lo_last = if window.is_some() { lo(rows - 1) } else { 0 };
    let (k16, v16) = (bf16_bits(&inputs.k), bf16_bits(&inputs.v));

    for (k0, kn) in key_tiles(&s, causal, (window, sinks), (row0, rows), bk) {
        let kv_at = kv_off + k0 * d;
        let st = &mut st[..kn * nb];
        let colmax = &mut colmax[..nb];
        colmax.fill(f32::NEG_INFINITY);
        let diag = causal && k0 + kn > first_visible;
        let edge = k0 < lo_last && k0 + kn > sinks;
        let fused = !diag && !edge && d <= KC;
        let qk_out = if fused {
            Out::StoreColMax(&mut *colmax)
        } else {
            Out::Store
        };

        // S^T = K_j Q^T (raw dot products; the scale goes into the exp).
        match path {
            ReadPath::Bf16Dot => {
                let k = &k16.unwrap_or_default()[kv_at..][..kn * d];
                let a = AOp {
                    data: k,
                    rows: kn,
                    k: d / 2,
                    rs: d,
                    cs: 2,
                };
                let b = BOp {
                    data: &*as_u16(qt),
                    k: d / 2,
                    n: nb,
                    ld: 2 * nb,
                };
                gemm_bf16(isa, a, b, st, nb, qk_out);
            }
            _ => {
                let k = vecops::widen(&inputs.k, kv_at, kn * d, kw);
                let a = AOp {
                    data: k,
                    rows: kn,
                    k: d,
                    rs: d,
                    cs: 1,
                };
                let b = BOp {
                    data: &qt[..d * nb],
                    k: d,
                    n: nb,
                    ld: nb,
                };
                gemm(isa, a, b, st, nb, qk_out);
            }
        }
        if !fused {
            if edge {
                // Keys before a row's window start, sinks aside: -inf, as the causal mask
                // writes.
                let first = sinks.saturating_sub(k0).min(kn);
                for r in 0..nb {
                    let n = lo(r).saturating_sub(k0).min(kn);
                    for x in st[r..].iter_mut().step_by(nb).take(n).skip(first) {
                        *x = f32::NEG_INFINITY;
                    }
                }
            }
            let mask = diag.then_some((&vis[..], k0));
            mask_colmax(isa, st, kn, nb, mask, colmax);
        }

        // P^T and the running statistics; then O^T = O^T * corr + V_j^T P^T.
        let mut state = ColState {
            colmax,
            m2: &mut *m2,
            l: &mut *l,
            corr: &mut *corr,
        };
        match path {
            ReadPath::Bf16Dot => {
                let pp = as_u16(pp);
                col_softmax_bf16(isa, st, kn, nb, c, &mut state, pp);
                let pairs = kn.div_ceil(2);
                let vp = as_u16(vw);
                let v = &v16.unwrap_or_default()[kv_at..][..kn * d];
                interleave_rows(isa, v, kn, d, vp);
                let a = AOp {
                    data: &*vp,
                    rows: d,
                    k: pairs,
                    rs: 2,
                    cs: 2 * d,
                };
                let b = BOp {
                    data: &*pp,
                    k: pairs,
                    n: nb,
                    ld: 2 * nb,
                };
                gemm_bf16(isa, a, b, ot, nb, Out::ScaleAdd(&*state.corr));
            }
            _ => {
                col_softmax(isa, st, kn, nb, c, &mut state);
                let v = vecops::widen(&inputs.v, kv_at, kn * d, vw);
                let a = AOp {
                    data: v,
                    rows: d,
                    k: kn,
                    rs: 1,
                    cs: d,
                };
                let b = BOp {
                    data: &*st,
                    k: kn,
                    n: nb,
                    ld: nb,
                };
                gemm(isa, a, b, ot, nb, Out::ScaleAdd(&*state.corr));
            }
        }
    }

    // O = (O^T)^T / l; rows that saw no key are 0.
    for r in 0..rows {
        let inv = if l[r] > 0.0 { 1.0 / l[r] } else { 0.0 };
        for (cc, y) in o[r * d..(r + 1) * d].iter_mut().enumerate() {
            *y = ot[cc * nb + r] * inv;
        }
    }
    if let Some(lse) = lse {
        for (r, x) in lse.iter_mut().enumerate() {
            *x = if l[r] > 0.0 {
                m2[r] * std::f32::consts::LN_2 + l[r].ln()
            } else {
                f32::NEG_INFINITY
            };
        }
    }
}

/// One item on AMX tiles (`flash_amx::block`: a group of `bq`-row blocks), as `block`
/// takes it.
#[allow(clippy::too_many_arguments)]
fn flash_amx_block(
    inputs: &Inputs,
    causal: bool,
    window_sinks: (Option<usize>, usize),
    seq: Seq,
    row0: usize,
    bq_bk: (usize, usize),
    buf: &mut [f32],
    o: &mut [f32],
    lse: Option<&mut [f32]>,
) {
    assert!(
        Isa::AmxBf16.available(),
        "flash: the AMX tiles are not usable here"
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the tiles are usable (asserted); `path` gives `Amx` only for bf16 inputs whose
    // head dim `fits`, and `buf` holds `worker_lens` for blocks of at least the block's rows.
    unsafe {
        flash_amx::block(
            inputs,
            causal,
            window_sinks,
            &seq.shape,
            (seq.q_off, seq.kv_off),
            row0,
            bq_bk,
            buf,
            o,
            lse,
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (inputs, causal, window_sinks, seq, row0, bq_bk, buf, o, lse);
}
