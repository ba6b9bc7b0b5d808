//! Rabe & Staats, "Self-attention does not need O(n^2) memory" (Rabe & Staats).
//!
//! `forward_chunked` is Figure 1: per query chunk, every key chunk is summarized independently
//! (exp-values E·V_j, exp-weight sums, chunk max m_j of the scores scaled by 1/sqrt(d)), all
//! summaries are kept, then rescaled by the global max and divided. Time O(n_q*n_kv*d);
//! extra memory q_c*k_c (one score chunk) + (n_kv/k_c)*q_c*(d+2) (the summaries) plus k_c*d
//! (K_j^T panels; plus V_j for low-precision inputs), one query chunk's worth shared by all
//! workers (`chunked_lens`), i.e. O(sqrt n) with the paper's chunk choices. Built from the same tiles as `naive` (`tiles`): the
//! chunk's scores are the same QK^T panels, row softmax and PV, in partial sums of <= 256
//! terms, so the two differ only by the algorithm.
//!
//! `forward_sequential` is Sections 2-3: one query at a time, keys one at a time, keeping
//! only v* in R^d, s* and m* (the O(1)-memory loop). Time O(n_q*n_kv*d); extra memory O(d)
//! per worker. Its dot products run over d terms in order, as the algorithm is stated.
//!
//! Both take a sliding window (`Shape::key_range`): `forward_chunked` skips the key chunks
//! before a query chunk's first row's window start (outside every row's window) and masks
//! the keys before each row's start; `forward_sequential` loops over the row's keys only.

use std::ops::Range;

use rayon::prelude::*;

use super::cache;
use super::isa::Isa;
use super::products::{self, Operand};
use super::sched::{team, Blocks, Member, Phase, Windows};
use super::simd::LOG2E;
use super::tiles::{
    self, as_u16, as_u16_ref, bf16_bits, interleave_rows, pack_pairs_t, pack_t, softmax_row,
    softmax_row_bf16, ReadPath, PANEL,
};
use super::vecops;
use super::workspace::{carve, Workspace};
use crate::problem::{Inputs, Shape};

/// The paper's defaults (`query_chunk_size = 1024`, `key_chunk_size = 4096`), each clamped
/// to `min(chunk, n)` as in the paper's code.
pub const DEFAULT_Q_CHUNK: usize = 1024;
pub const DEFAULT_KV_CHUNK: usize = 4096;

/// Query rows of a chunk per work item against one key chunk (the loop inside
/// `summarize_chunk`, cut for the cache): in passes of `cache::pass_rows` rows over k_c keys, their
/// rows of the q_c x k_c slab are computed, exponentiated and multiplied by V_j while in
/// L2, as `naive` does with its row blocks.
pub const STRIP: usize = 64;

/// Query rows per work item of the sequential loop (its memory does not depend on it).
pub const SEQ_ROW_BLOCK: usize = 64;

/// Floats of the one chunk buffer of `forward_chunked`, in the order they are carved. One
/// query chunk is in flight at a time, shared by all workers, as in the paper's `lax.map`
/// over query chunks: the memory does not grow with the thread count.
pub fn chunked_lens(shape: &Shape, qc: usize, kc: usize, path: ReadPath) -> [usize; 6] {
    let d = shape.head_dim;
    let nkc = shape.seq_kv.div_ceil(kc);
    let panels = kc.div_ceil(PANEL) * PANEL * d;
    // V_j is widened to f32 on the bf16 pair path too when the output feeds the backward.
    let (qw, kt, vw) = match path {
        ReadPath::F32 => (0, panels, 0),
        ReadPath::Widen => (qc * d, panels, panels),
        ReadPath::Bf16Dot => (0, panels / 2, panels),
    };
    [
        qw,           // widened query chunk
        kt,           // K_j^T in 64-key panels (bf16 pairs take half)
        vw,           // V_j widened, or in bf16 row pairs, 64 keys a panel
        qc * kc,      // attn_weights of one key chunk, exponentiated in place
        nkc * qc * d, // exp_values of every key chunk
        nkc * qc * 2, // max_score and exp_weights of every key chunk
    ]
}

/// Floats of one 64-key panel of K_j^T on `path` (bf16 pairs take half).
fn panel_floats(d: usize, path: ReadPath) -> usize {
    match path {
        ReadPath::Bf16Dot => PANEL * d / 2,
        _ => PANEL * d,
    }
}

/// Figure 1 into `out`, with `buf` of `chunked_lens` floats in all (any contents: every
/// value is written before it is read); `exact` when the output feeds the backward (bf16 P
/// is then not rounded for PV).
///
/// Query chunks are cut into 64-row strips (`STRIP`), shared by all workers in one parallel
/// region (`sched::team`). With several key chunks, query chunks run one at a time (heads
/// in order): for each key chunk the query chunk sees, the workers pack the panels of
/// K_j^T (and V_j) not packed yet, then take the chunk's strips, the most expensive first;
/// with the last key chunk a strip also combines its rows' summaries into the output.
/// Consecutive query chunks visit the key chunks in alternating order, so a packed key
/// chunk is reused. With one key chunk (n_kv <= k_c) every strip is summarized and combined
/// in one item, so after K and V are packed (once per head) all strips of all the head's
/// query chunks form one phase, each worker computing in its own strip slot of the chunk
/// buffer: no barrier between query chunks, where a worker the machine holds back would
/// keep the others waiting.
#[allow(clippy::too_many_arguments)]
pub fn forward_chunked(
    inputs: &Inputs,
    causal: bool,
    window: Option<usize>,
    exact: bool,
    (qc, kc): (usize, usize),
    isa: Isa,
    buf: &mut [f32],
    out: &mut [f32],
) {
    let s = inputs.shape;
    let (d, nq, nkv) = (s.head_dim, s.seq_q, s.seq_kv);
    let nkc = nkv.div_ceil(kc);
    let path = ReadPath::of(inputs.dtype(), isa, d);
    // bf16 on AVX512_BF16: both products on pairs, by `vdpbf16ps` or on the amx-bf16 path
    // AMX tiles (P rounded to bf16 for PV, as
    // `flash` does) when V's rows are whole vectors, unless the output feeds the backward
    // (`exact`); else PV in f32 on a widened V_j.
    let bf16_pv = path.bf16_pv(d, exact);
    let [qw, kt, vw, sc, values, stats] = carve(buf, chunked_lens(&s, qc, kc, path));
    // Each worker computes in a strip slot of its own when there are enough of them. One
    // phase per head: one key chunk, strips aligned across query chunks, own slots, and a
    // bounded count of output blocks to hand out.
    // (A slot must hold a whole strip: the chunk's last, partial one cannot serve.)
    let workers = rayon::current_num_threads();
    let own_slots = own_slots(qc, workers);
    let scratch = if own_slots { Slot::Worker } else { Slot::Strip };
    let one_phase = phases(&s, (qc, kc), workers) == Phases::OnePerHead;
    let npanels = kc.div_ceil(PANEL);
    // V_j as bf16 pairs takes half a widened panel's floats.
    let v_panel = if bf16_pv { PANEL * d / 2 } else { PANEL * d };
    let c = Chunked {
        inputs,
        causal,
        window,
        isa,
        path,
        bf16_pv,
        scale: s.scale(),
        kc,
        nkc,
        pass_rows: cache::pass_rows(kc.min(nkv), path.kv_bytes(d, bf16_pv)),
        q16: bf16_bits(&inputs.q).unwrap_or_default(),
        k16: bf16_bits(&inputs.k).unwrap_or_default(),
        v16: bf16_bits(&inputs.v).unwrap_or_default(),
        kt: Blocks::new(kt, npanels, panel_floats(d, path), 1),
        vw: Blocks::new(vw, npanels, v_panel, 1),
        qw: Blocks::new(qw, qc, d, STRIP),
        sc: Blocks::new(sc, qc, kc, STRIP),
        // Per row, the exp-values, and the (max, weight sum), of every key chunk: a
        // strip's summaries are a block of each that its item owns.
        values: Blocks::new(values, qc, nkc * d, STRIP),
        stats: Blocks::new(stats, qc, nkc * 2, STRIP),
        outs: Windows::new(out, d, STRIP, if one_phase { nq } else { qc }),
    };
    team(|team| {
        // Which key chunk kt/vw hold (its offset in K) and how many of its keys; every
        // worker follows the same sequence, so all agree.
        let mut packed: Option<(usize, usize)> = None;
        for head in 0..s.batch * s.heads {
            if one_phase {
                // Keys the head's last query row sees: every row sees a prefix of them.
                let kn = s.visible_keys(causal, nq - 1).min(nkv);
                c.pack(team, &mut packed, head, 0, kn);
                let strips = nq.div_ceil(STRIP);
                team.for_each(strips, |ph, i| {
                    // Causal: the strips that see the most keys first, so the last ones
                    // handed out are the cheapest.
                    let g = if causal { strips - 1 - i } else { i };
                    let (qi, si) = (g * STRIP / qc, g * STRIP % qc / STRIP);
                    let row0 = qi * qc;
                    let rows = qc.min(nq - row0);
                    let visible = s.visible_keys(causal, row0 + rows - 1).min(nkv);
                    c.strip(
                        ph,
                        Job {
                            head,
                            row0,
                            rows,
                            si,
                            j: 0,
                            kn: kn.min(visible),
                            first: 0,
                            chunks: usize::from(visible > 0),
                            last: true,
                            sums: Slot::Worker,
                            scratch: Slot::Worker,
                            window: (head * nq, nq),
                        },
                    );
                });
                continue;
            }
            for (qi, row0) in (0..nq).step_by(qc).enumerate() {
                let rows = qc.min(nq - row0);
                // Key chunks from the last one any row of the query chunk sees are skipped
                // (their summaries would be empty).
                let last_visible = s.visible_keys(causal, row0 + rows - 1).min(nkv);
                let chunks = last_visible.div_ceil(kc);
                // Sliding window: so are the key chunks before the first row's window start
                // (a row's start never decreases).
                let first = match window {
                    Some(_) => s.key_range(causal, window, row0).start / kc,
                    None => 0,
                };
                let steps = (chunks - first).max(1);
                for step in 0..steps {
                    let j = if qi % 2 == 0 {
                        first + step
                    } else {
                        first + steps - 1 - step
                    };
                    let k0 = j * kc;
                    let kn = kc.min(nkv - k0).min(last_visible.saturating_sub(k0));
                    c.pack(team, &mut packed, head, j, kn);
                    let strips = rows.div_ceil(STRIP);
                    team.for_each(strips, |ph, i| {
                        let si = if causal { strips - 1 - i } else { i };
                        c.strip(
                            ph,
                            Job {
                                head,
                                row0,
                                rows,
                                si,
                                j,
                                kn,
                                first,
                                chunks,
                                last: step + 1 == steps,
                                sums: Slot::Strip,
                                scratch,
                                window: (head * nq + row0, rows),
                            },
                        );
                    });
                }
            }
        }
    });
}

/// Whether each of `workers` workers computes in a strip slot of its own (a query chunk of
/// `qc` rows holds a whole strip for each).
fn own_slots(qc: usize, workers: usize) -> bool {
    workers == 1 || workers * STRIP <= qc
}

/// How `forward_chunked` hands out its strips.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phases {
    /// One key chunk, query chunks of whole strips, a strip slot per worker: after K and V
    /// are packed, every strip of a head is one phase (summarized and combined in one item).
    OnePerHead,
    /// A phase per query chunk and key chunk it sees, summaries kept between them.
    PerChunk,
}

/// The phases `forward_chunked` takes on `shape` with chunks `(qc, kc)` and `workers`
/// workers (with the paper's defaults, n a multiple of 64 up to 4096 on at most
/// min(n, 1024) / 64 workers: [`Phases::OnePerHead`]).
pub fn phases(shape: &Shape, (qc, kc): (usize, usize), workers: usize) -> Phases {
    let one = shape.seq_kv.div_ceil(kc) == 1
        && qc.is_multiple_of(STRIP)
        && own_slots(qc, workers)
        && shape.seq_q.div_ceil(STRIP) <= MAX_PHASE_STRIPS;
    if one {
        Phases::OnePerHead
    } else {
        Phases::PerChunk
    }
}

/// Most strips of one head that one phase hands out (`forward_chunked`): the output's
/// per-block bookkeeping stays within 32 KiB.
const MAX_PHASE_STRIPS: usize = 4096;

/// The shared state of one `forward_chunked` call: the inputs, the operand tiles and the
/// chunk buffer's parts, each handed out per phase.
struct Chunked<'a> {
    inputs: &'a Inputs,
    causal: bool,
    window: Option<usize>,
    isa: Isa,
    path: ReadPath,
    bf16_pv: bool,
    scale: f32,
    kc: usize,
    nkc: usize,
    /// Query rows per pass over a key chunk (`cache::pass_rows`).
    pass_rows: usize,
    q16: &'a [u16],
    k16: &'a [u16],
    v16: &'a [u16],
    kt: Blocks<'a>,
    vw: Blocks<'a>,
    qw: Blocks<'a>,
    sc: Blocks<'a>,
    values: Blocks<'a>,
    stats: Blocks<'a>,
    outs: Windows<'a>,
}

/// Which strip slot of the chunk buffer an item computes in: its strip's own, or its
/// worker's (reused item after item, so it stays in cache). The scores and widened queries
/// live only during the item; the summaries stay in the strip's slot between the phases of
/// several key chunks.
#[derive(Clone, Copy)]
enum Slot {
    Strip,
    Worker,
}

/// One strip of a query chunk against key chunk `j` (its first `kn` keys visible to the
/// query chunk); `last`: the last key chunk of `chunks` the query chunk sees, after which
/// the strip's rows are combined into the output rows `window.0 + ...` (the phase's window
/// of `window.1` rows).
struct Job {
    head: usize,
    row0: usize,
    rows: usize,
    si: usize,
    j: usize,
    kn: usize,
    /// The key chunks `first..chunks` are the query chunk's (summarized, then combined).
    first: usize,
    chunks: usize,
    last: bool,
    /// Where the summaries are, and where the scores and widened queries.
    sums: Slot,
    scratch: Slot,
    window: (usize, usize),
}

/// The block of `blocks` an item of `phase` computes in (see [`Slot`]).
fn slot<'p>(blocks: &'p Blocks, phase: &'p Phase, slot: Slot, si: usize) -> &'p mut [f32] {
    match slot {
        Slot::Strip => blocks.take_in(phase, 0, si),
        Slot::Worker => blocks.take_own(phase),
    }
}

impl Chunked<'_> {
    /// Packs K_j^T (and V_j unless it is read in place) of head `head` up to key `kn`, as a
    /// phase of its own, unless those panels are packed already.
    fn pack(
        &self,
        team: &Member,
        packed: &mut Option<(usize, usize)>,
        head: usize,
        j: usize,
        kn: usize,
    ) {
        let s = &self.inputs.shape;
        let d = s.head_dim;
        let kv_at = s.kv_head_offset(head / s.heads, head % s.heads) + j * self.kc * d;
        let have = match *packed {
            Some((at, keys)) if at == kv_at => keys,
            _ => 0,
        };
        if have >= kn {
            return;
        }
        // A partly packed last panel is packed again, whole.
        let first = have / PANEL;
        let (path, isa) = (self.path, self.isa);
        team.for_each(kn.div_ceil(PANEL) - first, |ph, i| {
            let pi = first + i;
            let (j0, jn) = (pi * PANEL, PANEL.min(kn - pi * PANEL));
            let kp = self.kt.take_in(ph, 0, pi);
            match path {
                ReadPath::Bf16Dot => {
                    pack_pairs_t(isa, &self.k16[kv_at + j0 * d..], jn, d, PANEL, as_u16(kp))
                }
                _ => pack_t(isa, &self.inputs.k, kv_at + j0 * d, jn, d, PANEL, kp),
            }
            // f32 V is read in place.
            if self.bf16_pv {
                let v = &self.v16[kv_at + j0 * d..][..jn * d];
                interleave_rows(isa, v, jn, d, as_u16(self.vw.take_in(ph, 0, pi)));
            } else if path != ReadPath::F32 {
                let vp = &mut self.vw.take_in(ph, 0, pi)[..jn * d];
                vecops::widen_into(&self.inputs.v, kv_at + j0 * d, vp);
            }
        });
        *packed = Some((kv_at, kn));
    }

    /// One strip item: its summaries of key chunk `job.j` and, with the last key chunk, its
    /// output rows.
    fn strip(&self, ph: &Phase, job: Job) {
        let s = &self.inputs.shape;
        let (d, isa) = (s.head_dim, self.isa);
        let (b, h) = (job.head / s.heads, job.head % s.heads);
        let (q_off, kv_off) = (s.q_head_offset(b, h), s.kv_head_offset(b, h));
        let (k0, kn) = (job.j * self.kc, job.kn);
        let kv_at = kv_off + k0 * d;
        let r0 = job.si * STRIP;
        let sr = STRIP.min(job.rows - r0);
        let take = |blocks, which| slot(blocks, ph, which, job.si);
        let mut sums = Sums {
            values: take(&self.values, job.sums),
            stats: take(&self.stats, job.sums),
            chunks: self.nkc,
            d,
        };
        if kn > 0 {
            let at = q_off + (job.row0 + r0) * d;
            let q = match self.path {
                ReadPath::Bf16Dot => Operand::Pairs(&self.q16[at..][..sr * d]),
                // f32 queries are read in place, others widened.
                ReadPath::F32 => Operand::F32(vecops::widen(&self.inputs.q, at, sr * d, &mut [])),
                ReadPath::Widen => {
                    let w = take(&self.qw, job.scratch);
                    Operand::F32(vecops::widen(&self.inputs.q, at, sr * d, w))
                }
            };
            let k = self.kt.view_in(ph);
            let k = match self.path {
                ReadPath::Bf16Dot => Operand::Pairs(as_u16_ref(k)),
                _ => Operand::F32(k),
            };
            let v = match self.inputs.v.as_f32() {
                Some(v) => Operand::F32(&v[kv_at..][..kn * d]),
                None if self.bf16_pv => Operand::Pairs(as_u16_ref(self.vw.view_in(ph))),
                None => Operand::F32(&self.vw.view_in(ph)[..kn * d]),
            };
            // The strip's rows in passes whose scores stay in L2, each in the same first
            // rows of the scratch slot.
            let scratch = take(&self.sc, job.scratch);
            for (p0, pr) in cache::passes(sr, self.pass_rows) {
                let strip = Strip {
                    isa,
                    d,
                    kn,
                    scale: self.scale,
                    q: q.slice(p0 * d, pr * d),
                    k,
                    v,
                };
                let visible = |r: usize| {
                    s.visible_keys(self.causal, job.row0 + r0 + p0 + r)
                        .saturating_sub(k0)
                        .min(kn)
                };
                // Keys of the chunk before row r's window start.
                let before = |r: usize| match self.window {
                    Some(_) => s
                        .key_range(self.causal, self.window, job.row0 + r0 + p0 + r)
                        .start
                        .saturating_sub(k0)
                        .min(kn),
                    None => 0,
                };
                let mut pass = sums.rows_from(p0);
                let p = &mut scratch[..pr * kn];
                strip.summarize(visible, before, p, &mut pass, job.j);
            }
        }
        if job.last {
            let (w0, wrows) = job.window;
            let blk = (job.head * s.seq_q + job.row0 + r0 - w0) / STRIP;
            let o = self.outs.take_in(ph, w0, wrows, blk);
            for (r, o_r) in o.chunks_mut(d).enumerate() {
                sums.combine_row(isa, r, job.first..job.chunks, o_r);
            }
        }
    }
}

/// One strip of a query chunk against one key chunk of `kn` keys: Figure 1's
/// `summarize_chunk` for the strip's rows.
struct Strip<'a> {
    isa: Isa,
    d: usize,
    kn: usize,
    scale: f32,
    /// The strip's query rows, K_j^T in 64-key panels, and V_j as f32 rows or bf16 row
    /// pairs `[ceil(k_n/2)][d][2]`.
    q: Operand<'a>,
    k: Operand<'a>,
    v: Operand<'a>,
}

impl Strip<'_> {
    /// The strip's scores against the key chunk `j` in `p` (rows of `kn`, exponentiated
    /// in place), and its rows' summaries of chunk `j` in `sums`: the chunk max of the
    /// scaled scores, the exp sum and the d exp-values. `visible(r)` is how many keys of
    /// the chunk row r sees, the first `before(r)` of them masked (a sliding window's).
    fn summarize(
        &self,
        visible: impl Fn(usize) -> usize,
        before: impl Fn(usize) -> usize,
        p: &mut [f32],
        sums: &mut Sums,
        j: usize,
    ) {
        let (d, kn, isa) = (self.d, self.kn, self.isa);
        let sr = p.len() / kn;
        let (vs, ss) = (sums.chunks * d, sums.chunks * 2);
        let (values, stats) = (&mut *sums.values, &mut *sums.stats);
        // Causal: the strip's last row sees the most keys; the panels past them are not
        // computed, and the product with V stops there too.
        let seen = visible(sr - 1);
        if seen == 0 {
            for r in 0..sr {
                stats[r * ss + 2 * j] = f32::NEG_INFINITY;
                stats[r * ss + 2 * j + 1] = 0.0;
                values[r * vs + j * d..][..d].fill(0.0);
            }
            return;
        }
        products::scores(isa, self.q, self.k, sr, d, seen, p, kn);
        // Softmax of each row, max subtracted, not normalized; for the bf16 PV tile the
        // probabilities are written as bf16 over the row itself.
        let c = self.scale * LOG2E;
        let pairs_pv = matches!(self.v, Operand::Pairs(_));
        for (r, row) in p.chunks_mut(kn).enumerate() {
            let masked = before(r).min(seen);
            if masked > 0 {
                row[..masked].fill(f32::NEG_INFINITY);
            }
            let (m, w) = if pairs_pv {
                softmax_row_bf16(isa, &mut row[..seen], visible(r), c)
            } else {
                softmax_row(isa, &mut row[..seen], visible(r), c, true, false)
            };
            stats[r * ss + 2 * j] = m * self.scale;
            stats[r * ss + 2 * j + 1] = w;
        }
        let (p, ldp) = if pairs_pv {
            (Operand::Pairs(&*as_u16(p)), 2 * kn)
        } else {
            (Operand::F32(&*p), kn)
        };
        products::values(isa, p, ldp, self.v, sr, seen, d, &mut values[j * d..], vs);
    }
}

/// A strip's summaries of every key chunk: per row, the exp-values of each chunk
/// (`[rows][chunks][d]`) and its (max, exp sum) (`[rows][chunks][2]`).
struct Sums<'p> {
    values: &'p mut [f32],
    stats: &'p mut [f32],
    chunks: usize,
    d: usize,
}

impl Sums<'_> {
    /// The summaries of the rows from `r0` on (a pass of the strip).
    fn rows_from(&mut self, r0: usize) -> Sums<'_> {
        let (chunks, d) = (self.chunks, self.d);
        Sums {
            values: &mut self.values[r0 * chunks * d..],
            stats: &mut self.stats[r0 * chunks * 2..],
            chunks,
            d,
        }
    }

    /// Output row `r` of the strip from its summaries of the key chunks `chunks`:
    /// global_max, max_diffs = exp(chunk_max - global_max), then the weighted sums
    /// divided by the weighted exp sums (times the reciprocal, on `isa`'s vectors, as
    /// `naive` and `flash` normalize).
    fn combine_row(&self, isa: Isa, r: usize, chunks: Range<usize>, o_r: &mut [f32]) {
        let d = self.d;
        let values = &self.values[r * self.chunks * d..][chunks.start * d..chunks.end * d];
        let stats = &self.stats[r * self.chunks * 2..][chunks.start * 2..chunks.end * 2];
        let global = stats
            .chunks_exact(2)
            .map(|x| x[0])
            .fold(f32::NEG_INFINITY, f32::max);
        o_r.fill(0.0);
        if global == f32::NEG_INFINITY {
            return; // no visible key: output 0
        }
        let mut all_weights = 0.0f32;
        for (st, v) in stats.chunks_exact(2).zip(values.chunks_exact(d)) {
            if st[0] == f32::NEG_INFINITY {
                continue;
            }
            let diff = (st[0] - global).exp();
            all_weights += st[1] * diff;
            tiles::axpy(isa, o_r, v, diff);
        }
        tiles::scale(isa, o_r, 1.0 / all_weights);
    }
}

pub fn sequential_items(shape: &Shape) -> usize {
    shape.batch * shape.heads * shape.seq_q.div_ceil(SEQ_ROW_BLOCK)
}

/// Per-worker scratch floats of `forward_sequential`: v*, and widened q, k, v rows.
pub fn sequential_worker_floats(shape: &Shape) -> usize {
    4 * shape.head_dim
}

pub fn forward_sequential(
    inputs: &Inputs,
    causal: bool,
    window: Option<usize>,
    ws: &Workspace,
    out: &mut [f32],
) {
    let s = inputs.shape;
    let (d, nq) = (s.head_dim, s.seq_q);
    let scale = s.scale();
    out.par_chunks_mut(nq * d)
        .enumerate()
        .for_each(|(head, out_h)| {
            let (b, h) = (head / s.heads, head % s.heads);
            let (q_off, kv_off) = (s.q_head_offset(b, h), s.kv_head_offset(b, h));
            out_h
                .par_chunks_mut(SEQ_ROW_BLOCK * d)
                .enumerate()
                .for_each(|(blk, o)| {
                    let mut guard = ws.acquire();
                    let [v_star, qs, ks, vs] = carve(&mut guard, [d; 4]);
                    for (r, o_r) in o.chunks_mut(d).enumerate() {
                        let row = blk * SEQ_ROW_BLOCK + r;
                        let q = vecops::widen(&inputs.q, q_off + row * d, d, qs);
                        v_star.fill(0.0);
                        let (mut m_star, mut s_star) = (f32::NEG_INFINITY, 0.0f32);
                        for i in s.key_range(causal, window, row) {
                            let k = vecops::widen(&inputs.k, kv_off + i * d, d, ks);
                            let s_i = scale * q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>();
                            let m_i = m_star.max(s_i);
                            let (old, new) = ((m_star - m_i).exp(), (s_i - m_i).exp());
                            let v = vecops::widen(&inputs.v, kv_off + i * d, d, vs);
                            for (acc, x) in v_star.iter_mut().zip(v) {
                                *acc = *acc * old + x * new;
                            }
                            s_star = s_star * old + new;
                            m_star = m_i;
                        }
                        for (y, x) in o_r.iter_mut().zip(v_star.iter()) {
                            *y = if s_star > 0.0 { x / s_star } else { 0.0 };
                        }
                    }
                });
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::kernel_paths::{for_each_path, on_pool};

    /// The chunk buffer may hold anything (a warm timing loop hands it over from the
    /// previous call): the output is bit for bit that of a zero-filled buffer, on every
    /// path, mask and dtype, with several query and key chunks (partial ones included), and
    /// whatever the rows per pass.
    #[test]
    fn a_buffer_of_any_contents_gives_the_same_output() {
        // Several key chunks (a phase per query and key chunk), with and without a strip
        // slot for each of the three workers; query chunks that are no multiple of a strip;
        // and one key chunk with three slots (one phase per head), a partial last query
        // chunk, and more queries than keys (causal rows that see nothing).
        for (nq, nkv, d, qc, kc) in [
            (200, 150, 16, 64, 64),
            (300, 300, 16, 192, 128),
            (70, 100, 12, 32, 40),
            (9, 200, 32, 4, 128),
            (400, 150, 16, 192, 256),
            (130, 130, 32, 192, 256),
        ] {
            let shape = Shape {
                batch: 2,
                heads: 2,
                kv_heads: 1,
                seq_q: nq,
                seq_kv: nkv,
                head_dim: d,
            };
            for_each_path(shape, 5, |k| {
                let run = |fill: f32, threads: usize, rows: usize| {
                    let path = ReadPath::of(k.dtype, k.isa, d);
                    let mut buf = vec![fill; chunked_lens(&shape, qc, kc, path).iter().sum()];
                    let mut out = vec![fill; shape.out_len()];
                    on_pool(threads, || {
                        cache::with_pass_rows(rows, || {
                            forward_chunked(
                                k.inputs,
                                k.causal,
                                None,
                                k.exact,
                                (qc, kc),
                                k.isa,
                                &mut buf,
                                &mut out,
                            )
                        })
                    });
                    out
                };
                let what = k.name();
                let (o0, o1) = (run(0.0, 3, STRIP), run(f32::NAN, 3, STRIP));
                assert!(o1.iter().all(|x| x.is_finite()), "{what}");
                assert_eq!(o0, o1, "{what}");
                // Four workers for at most three strip slots compute in the strips' slots, a
                // phase per query chunk: the same sums in the same order.
                assert_eq!(run(f32::NAN, 4, STRIP), o0, "{what}: 4 threads");
                // The rows per pass (`cache::pass_rows`) only cut a strip's work for the
                // cache: any count gives the same bits.
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                for rows in [12, 5, 1] {
                    let o = run(f32::NAN, 3, rows);
                    assert!(bits(&o) == bits(&o0), "{what}: {rows} rows per pass");
                }
            });
        }
    }
}
