//! FlashAttention-2's forward (Dao 2023, Algorithm 1 in the FA-2 loop order) for bf16
//! inputs on AMX tiles (`amx`): per query block Q_i and key block K_j, S = Q_i K_j^T and
//! O += P V_j as `tdpbf16ps` tile products (bf16 pairs, f32 sums), the online softmax
//! between them row by row on AVX-512 (m' = max(m, rowmax S), P = 2^(S log2e / sqrt(d) - m')
//! rounded to bf16, l = 2^(m - m') l + rowsum P, O = 2^(m - m') O + P V_j); O / l at the
//! end. Q_i is read in place as A tiles; K_j is transposed into bf16 pairs (the B tiles of
//! S) and V_j interleaved by pairs of rows (the B tiles of PV) once for up to `MAX_GROUP`
//! query blocks of a head that read it in turn (1/(g B_r) of the products' work). Blocks are
//! processed 2 x 2 tiles at a time (four C tiles, two A, two B: all eight tile registers).
//! Causal, sliding-window and sink masks as `flash` (the same key tiles,
//! `flash::key_tiles`). Time O(n_q n_kv d); per-worker scratch
//! O(B_r B_c + (B_r + B_c) d + g B_r) floats (`worker_lens`), O(1) in n.

#![allow(clippy::needless_range_loop)]

use super::flash::key_tiles;
use super::workspace::carve;
use crate::problem::{Inputs, Shape};

/// Query and key blocks are rounded up to a multiple of this (two 16-row tiles; 32 keys,
/// one A tile of P).
pub const GRAIN: usize = 32;

/// The most query blocks [`block`] runs against each packed key block.
pub const MAX_GROUP: usize = 8;

pub(crate) fn round(n: usize) -> usize {
    n.div_ceil(GRAIN) * GRAIN
}

/// Whether the AMX forward runs a head dimension: whole A tiles of Q (32 bf16) and whole
/// pairs of C tiles of O (32 columns).
pub fn fits(head_dim: usize) -> bool {
    head_dim > 0 && head_dim.is_multiple_of(GRAIN)
}

/// Per-worker scratch floats of `flash`'s AMX forward: a [`Block`]'s (`block_lens`: the Q
/// block, K_j as pairs, V_j interleaved, S, P, the row max, sum and correction, the PV
/// staging), with the running max and sum of `group` query blocks (the blocks that share
/// each packed key block, [`block`]); O accumulates in the output itself.
pub fn worker_lens(d: usize, bq: usize, bk: usize, group: usize) -> [usize; 9] {
    let mut lens = block_lens(bq, bk, d, d);
    lens[5] *= group.max(1);
    lens[6] *= group.max(1);
    lens
}

/// Scratch floats of a [`Block`] whose O lies elsewhere, in the order callers carve them:
/// the `rows` query rows of `dk` bf16 as A tiles, a key block of at most `bk` keys as pairs
/// (bf16), its values of `dv` interleaved (bf16), S, P (bf16), the row max, sum and
/// correction, and the PV staging; rows and keys rounded up to 32.
pub fn block_lens(rows: usize, bk: usize, dk: usize, dv: usize) -> [usize; 9] {
    let (nb, kb) = (round(rows), round(bk));
    [
        nb * dk / 2,
        kb * dk / 2,
        kb * dv / 2,
        nb * kb,
        nb * kb / 2,
        nb,
        nb,
        nb,
        nb * dv,
    ]
}

/// Query rows `row0..row0 + o.len() / d` of the head whose first query row and first key
/// sit at elements `q_off` and `kv_off` of bf16 `inputs` of shape `s`, in query blocks of
/// `bq` rows (the last may be short) that share each key block: K_j is transposed and V_j
/// interleaved once for all of them (the packing is per key per block pair, as much work
/// per element as the softmax: shared by g blocks it costs 1/g). A block reads only the
/// keys it sees (the shared tile cut at its own causal end), so its sums are the ones it
/// would make alone. Query rows are read in place as A tiles where they fill whole tiles.
/// With `lse`, each row's logsumexp (natural log; -inf for a row that sees no key).
/// Without a sliding window the blocks' key tiles start alike (at key 0); callers pass one
/// block with a window.
///
/// # Safety
/// `amx::usable()` must be true; the inputs must be bf16 and `fits(s.head_dim)`; `buf` at
/// least the sum of `worker_lens(d, bq, bk, g)` for the `g` blocks of the rows.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn block(
    inputs: &Inputs,
    causal: bool,
    (window, sinks): (Option<usize>, usize),
    s: &Shape,
    (q_off, kv_off): (usize, usize),
    row0: usize,
    (bq, bk): (usize, usize),
    buf: &mut [f32],
    o: &mut [f32],
    lse: Option<&mut [f32]>,
) {
    use super::amx::Tiles;
    use super::tiles::{as_u16, bf16_bits};

    let d = s.head_dim;
    let rows = o.len() / d;
    let nb = round(bq);
    let group = rows.div_ceil(bq);
    assert!(fits(d) && rows > 0 && bq > 0, "flash_amx: block shape");
    // Blocks before the last are read in place as whole A tiles.
    assert!(
        group == 1 || bq.is_multiple_of(GRAIN),
        "flash_amx: {group} blocks of {bq} rows"
    );
    let (q16, k16, v16) = match (
        bf16_bits(&inputs.q),
        bf16_bits(&inputs.k),
        bf16_bits(&inputs.v),
    ) {
        (Some(q), Some(k), Some(v)) => (q, k, v),
        _ => panic!("flash_amx: the inputs are not bf16"),
    };
    let [qb, kp, vp, st, pb, m, l, corr, pv] = carve(buf, worker_lens(d, bq, bk, group));
    let mut keys = Keys::new((d, d), bk, [kp, vp, st, pb, corr, pv]);
    // The blocks' rows: whole tiles in place, a short last block copied and padded.
    let last = rows - (group - 1) * bq;
    let qb = as_u16(qb);
    if last != round(last) {
        let q = &q16[q_off + (row0 + rows - last) * d..][..last * d];
        qb[..last * d].copy_from_slice(q);
        qb[last * d..round(last) * d].fill(0);
    }
    let qb = &*qb;
    let mut lse = lse;
    let blocks = o
        .chunks_mut(bq * d)
        .zip(m.chunks_mut(nb).zip(l.chunks_mut(nb)))
        .enumerate()
        .map(|(g, (o, (m, l)))| {
            let r = o.len() / d;
            let qb = if r == round(r) {
                &q16[q_off + (row0 + g * bq) * d..][..r * d]
            } else {
                &qb[..round(r) * d]
            };
            let mut t = Rows {
                row0: row0 + g * bq,
                rows: r,
                qb,
                o,
                m: &mut m[..r],
                l: &mut l[..r],
            };
            t.reset();
            t
        });
    let mut rest = blocks;
    let mut blocks: [Option<Rows>; MAX_GROUP] = std::array::from_fn(|_| rest.next());
    assert!(
        rest.next().is_none(),
        "flash_amx: more than {MAX_GROUP} blocks"
    );
    let c = s.scale() * std::f32::consts::LOG2_E;
    // Each row's keys: its window lo..hi (the causal bound, all keys without) and its
    // sinks 0..sk (`Shape::key_range`, `Shape::sink_range`).
    let seen = |r: usize| {
        let w = s.key_range(causal, window, r);
        let sk = s.sink_range(causal, window, sinks, r).end;
        (w.start as i32, w.end as i32, sk as i32)
    };
    let _tiles = Tiles::configure();
    for (k0, kn) in key_tiles(s, causal, (window, sinks), (row0, rows), bk) {
        let at = kv_off + k0 * d;
        keys.pack(kn, (&k16[at..][..kn * d], &v16[at..][..kn * d]));
        for t in blocks.iter_mut().flatten() {
            // This block's keys of the tile: up to its last row's causal end.
            let end = s.visible_keys(causal, t.row0 + t.rows - 1);
            if k0 < end {
                let r0 = t.row0;
                keys.step(t, (k0, kn.min(end - k0)), c, &|r| seen(r0 + r));
            }
        }
    }
    drop(_tiles);
    for t in blocks.iter_mut().flatten() {
        let n = t.rows;
        let lse_g = lse.as_mut().map(|x| &mut x[t.row0 - row0..][..n]);
        t.finish(lse_g);
    }
}

/// The online-softmax state of a run of query rows on tiles: `rows` query rows from `row0`
/// (A tiles of the key width in `qb`, padded to whole 32-row tiles with zeros), their O
/// (rows x value width), then the normalized output, and each row's running max (log2
/// units) and sum.
pub(crate) struct Rows<'a> {
    pub row0: usize,
    pub rows: usize,
    pub qb: &'a [u16],
    pub o: &'a mut [f32],
    pub m: &'a mut [f32],
    pub l: &'a mut [f32],
}

impl Rows<'_> {
    /// No key seen: O = 0, m = -inf, l = 0.
    pub fn reset(&mut self) {
        self.o.fill(0.0);
        self.m.fill(f32::NEG_INFINITY);
        self.l.fill(0.0);
    }

    /// O = O / l (rows that saw no key 0); with `lse`, each row's logsumexp (natural log;
    /// -inf for a row that saw nothing).
    pub fn finish(&mut self, lse: Option<&mut [f32]>) {
        let dv = self.o.len() / self.rows;
        for r in 0..self.rows {
            let inv = if self.l[r] > 0.0 {
                1.0 / self.l[r]
            } else {
                0.0
            };
            for y in &mut self.o[r * dv..(r + 1) * dv] {
                *y *= inv;
            }
        }
        if let Some(lse) = lse {
            for (r, x) in lse.iter_mut().enumerate() {
                *x = if self.l[r] > 0.0 {
                    self.m[r] * std::f32::consts::LN_2 + self.l[r].ln()
                } else {
                    f32::NEG_INFINITY
                };
            }
        }
    }
}

/// One key block's buffers, shared by the query rows that read it: keys of `dims.0` and
/// values of `dims.1`, blocks of at most `kb` keys (a multiple of 32).
pub(crate) struct Keys<'a> {
    /// (key width, value width).
    pub dims: (usize, usize),
    pub kb: usize,
    /// The key block as pairs (`pack_pairs`, stride kb) and its values interleaved by
    /// row pairs (`pack_rows`).
    pub kp: &'a mut [u16],
    pub vp: &'a mut [u16],
    /// S (nb x kb), P (nb x kb bf16), with nb the rows rounded to 32.
    pub st: &'a mut [f32],
    pub pb: &'a mut [u16],
    /// Each row's correction.
    pub corr: &'a mut [f32],
    /// The PV tile staging (nb x dims.1).
    pub pv: &'a mut [f32],
}

/// The online-softmax state of one query block on tiles, in the caller's scratch: its rows
/// and the key block they read.
pub(crate) struct Block<'a> {
    keys: Keys<'a>,
    rows: Rows<'a>,
}

impl<'a> Block<'a> {
    /// A block in `scratch` (at least the sum of `block_lens(rows, bk, dims.0, dims.1)`),
    /// O in `o` (rows x dims.1): `fill` writes the rows' queries (rows x dims.0 bf16) into
    /// the A tiles, whose padding rows are zeroed, and the state is reset.
    pub fn carve(
        scratch: &'a mut [f32],
        rows: usize,
        bk: usize,
        dims: (usize, usize),
        o: &'a mut [f32],
        fill: impl FnOnce(&mut [u16]),
    ) -> Block<'a> {
        use super::tiles::as_u16;
        let [qb, kp, vp, st, pb, m, l, corr, pv] =
            carve(scratch, block_lens(rows, bk, dims.0, dims.1));
        let qb = as_u16(qb);
        fill(&mut qb[..rows * dims.0]);
        qb[rows * dims.0..].fill(0);
        let mut rows = Rows {
            row0: 0,
            rows,
            qb,
            o: &mut o[..rows * dims.1],
            m,
            l,
        };
        rows.reset();
        let keys = Keys::new(dims, bk, [kp, vp, st, pb, corr, pv]);
        Block { keys, rows }
    }

    /// O = O / l; with `lse`, each row's logsumexp (`Rows::finish`).
    pub fn finish(&mut self, lse: Option<&mut [f32]>) {
        self.rows.finish(lse);
    }

    /// One key block: keys `k0..k0 + kn`, whose rows (`kn` x dims.0 and `kn` x dims.1
    /// bf16) are `k` and `v` (`Keys::pack`, `Keys::step`).
    ///
    /// # Safety
    /// As `Keys::step`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub unsafe fn key_block(
        &mut self,
        (k0, kn): (usize, usize),
        c: f32,
        seen: &impl Fn(usize) -> (i32, i32, i32),
        kv: (&[u16], &[u16]),
    ) {
        self.keys.pack(kn, kv);
        self.keys.step(&mut self.rows, (k0, kn), c, seen);
    }
}

impl<'a> Keys<'a> {
    /// The buffers of key blocks of at most `bk` keys in the caller's scratch, carved as
    /// `block_lens` orders them: K as pairs, V interleaved, S, P, the correction and the
    /// PV staging.
    pub fn new(
        dims: (usize, usize),
        bk: usize,
        [kp, vp, st, pb, corr, pv]: [&'a mut [f32]; 6],
    ) -> Keys<'a> {
        use super::tiles::as_u16;
        Keys {
            dims,
            kb: round(bk),
            kp: as_u16(kp),
            vp: as_u16(vp),
            st,
            pb: as_u16(pb),
            corr,
            pv,
        }
    }

    /// Keys `k` and values `v` (`kn` rows of dims.0 and dims.1 bf16) into `kp` and `vp`.
    ///
    /// # Safety
    /// AVX-512 available.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn pack(&mut self, kn: usize, (k, v): (&[u16], &[u16])) {
        let (dk, dv) = self.dims;
        assert!(kn <= self.kb && k.len() >= kn * dk && v.len() >= kn * dv);
        pack_pairs(k, kn, dk, self.kb, self.kp);
        pack_rows(v, kn, dv, self.vp);
    }

    /// Rows `t` against keys `k0..k0 + kn` of the packed block (`pack`ed with at least
    /// `kn` keys): S = Q K^T on tiles, the online softmax row by row (`c` = scale x log2 e;
    /// row r sees key k where `seen(r)` = (lo, hi, sk) has lo <= k < hi or k < sk),
    /// O = corr O + P V on tiles. Keys of the block past `kn` are never read.
    ///
    /// # Safety
    /// `amx::usable()`, tiles configured (`Tiles::configure`); the buffers as the fields
    /// say, for `t.rows` rows; both key and value widths multiples of 32.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub unsafe fn step(
        &mut self,
        t: &mut Rows,
        (k0, kn): (usize, usize),
        c: f32,
        seen: &impl Fn(usize) -> (i32, i32, i32),
    ) {
        use std::arch::x86_64::*;

        use super::amx;
        use super::simd::avx512::{exp2, exp2_bf16};

        let (rows, kb, (dk, dv)) = (t.rows, self.kb, self.dims);
        let nb = round(rows);
        let kw = round(kn);
        assert!(kn <= kb && t.qb.len() >= nb * dk && t.o.len() >= rows * dv);
        let (kp, vp) = (&*self.kp, &*self.vp);
        let (st, pb, corr, pv) = (&mut *self.st, &mut *self.pb, &mut *self.corr, &mut *self.pv);
        let (m, l) = (&mut *t.m, &mut *t.l);

        // S = Q_i K_j^T by 32 x 32 blocks: Q rows as A, the key pairs as B.
        let (qp, kpp, sp) = (
            t.qb.as_ptr() as *const u8,
            kp.as_ptr() as *const u8,
            st.as_mut_ptr() as *mut u8,
        );
        for qt in (0..nb / 16).step_by(2) {
            for kt in (0..kw / 16).step_by(2) {
                amx::product_32x32(
                    (qp.add(qt * 16 * dk * 2), 2 * dk),
                    (kpp.add(kt * 16 * 4), kb * 4),
                    dk / 32,
                    (sp.add((qt * 16 * kb + kt * 16) * 4), kb * 4),
                );
            }
        }

        // The online softmax, row by row; P as bf16 A tiles (keys past kn, and keys a row
        // does not see, 0).
        let iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
        let end = _mm512_set1_epi32((k0 + kn) as i32);
        let neg = _mm512_set1_ps(f32::NEG_INFINITY);
        let cv = _mm512_set1_ps(c);
        // Row r's keys: whether it sees the whole tile, and its window and sink bounds.
        let row_keys = |r: usize| {
            let (lo, hi, sk) = seen(r);
            let whole = lo as usize <= k0 && hi as usize >= k0 + kn;
            let v = _mm512_set1_epi32;
            (whole, v(lo), v(hi), v(sk))
        };
        // Which of the 16 keys from k0 + j the row sees: below its bound and the tile's end,
        // and in its window or a sink (a whole row: all but those past kn).
        let lane = |(whole, lo, hi, sk): (bool, __m512i, __m512i, __m512i), j: usize| {
            if whole {
                let n = kn.saturating_sub(j).min(16);
                return ((1u32 << n) - 1) as __mmask16;
            }
            let idx = _mm512_add_epi32(iota, _mm512_set1_epi32((k0 + j) as i32));
            let below = _mm512_cmplt_epi32_mask(idx, hi) & _mm512_cmplt_epi32_mask(idx, end);
            below & (_mm512_cmpge_epi32_mask(idx, lo) | _mm512_cmplt_epi32_mask(idx, sk))
        };
        // Keys 0..open of a row need no mask (a whole row's full vectors, in pairs).
        let open = |whole: bool| if whole { kn / 32 * 32 } else { 0 };
        // Every row's new max first (the old one waits in `corr` for the vector pass
        // below), so that no row's exponentials wait on its own max's reduction.
        for r in 0..rows {
            let keys = row_keys(r);
            let srow = st.as_ptr().add(r * kb);
            let mut mx = neg;
            // The raw scores' max (c > 0, so c max s = max c s, rounded alike).
            for j in (0..open(keys.0)).step_by(16) {
                mx = _mm512_max_ps(mx, _mm512_loadu_ps(srow.add(j)));
            }
            for j in (open(keys.0)..kw).step_by(16) {
                mx = _mm512_mask_max_ps(mx, lane(keys, j), mx, _mm512_loadu_ps(srow.add(j)));
            }
            corr[r] = m[r];
            m[r] = m[r].max(c * _mm512_reduce_max_ps(mx));
        }
        for r in 0..rows {
            let srow = st.as_ptr().add(r * kb);
            let prow = pb.as_mut_ptr().add(r * kb);
            if m[r] == f32::NEG_INFINITY {
                // Nothing seen yet: P = 0, and O (0) needs no correction.
                pv[r] = 0.0;
                std::ptr::write_bytes(prow, 0, kw);
                continue;
            }
            let keys = row_keys(r);
            let mv = _mm512_set1_ps(-m[r]);
            // p = 2^(c s - m') on the lanes of `seen`, stored as bf16; two sums so
            // consecutive adds do not wait on each other (open and kw are multiples of 32).
            let p_at = |j: usize, seen: __mmask16| {
                let x = _mm512_fmadd_ps(_mm512_loadu_ps(srow.add(j)), cv, mv);
                let p = _mm512_maskz_mov_ps(seen, exp2_bf16(x));
                let h: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(p));
                _mm256_storeu_si256(prow.add(j) as *mut __m256i, h);
                p
            };
            let mut sums = [_mm512_setzero_ps(); 2];
            for j in (0..open(keys.0)).step_by(32) {
                sums[0] = _mm512_add_ps(sums[0], p_at(j, !0));
                sums[1] = _mm512_add_ps(sums[1], p_at(j + 16, !0));
            }
            for j in (open(keys.0)..kw).step_by(32) {
                sums[0] = _mm512_add_ps(sums[0], p_at(j, lane(keys, j)));
                sums[1] = _mm512_add_ps(sums[1], p_at(j + 16, lane(keys, j + 16)));
            }
            // This block's row sum waits in the PV staging for the vector pass below.
            pv[r] = _mm512_reduce_add_ps(_mm512_add_ps(sums[0], sums[1]));
        }
        // A short block's padding rows of P (read by the PV tiles, never summed into O):
        // zero rather than another block's.
        for r in rows..nb {
            std::ptr::write_bytes(pb.as_mut_ptr().add(r * kb), 0, kw);
        }
        // corr = 2^(m - m') (1 where nothing is seen yet), l = corr l + rowsum P: 16 rows at
        // a time.
        for r in (0..rows).step_by(16) {
            let k: __mmask16 = ((1u32 << (rows - r).min(16)) - 1) as __mmask16;
            let mn = _mm512_maskz_loadu_ps(k, m.as_ptr().add(r));
            let mo = _mm512_maskz_loadu_ps(k, corr.as_ptr().add(r));
            let none = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(mn, neg);
            let cr = _mm512_mask_mov_ps(exp2(_mm512_sub_ps(mo, mn)), none, _mm512_set1_ps(1.0));
            let lr = _mm512_fmadd_ps(
                _mm512_maskz_loadu_ps(k, l.as_ptr().add(r)),
                cr,
                _mm512_maskz_loadu_ps(k, pv.as_ptr().add(r)),
            );
            _mm512_mask_storeu_ps(corr.as_mut_ptr().add(r), k, cr);
            _mm512_mask_storeu_ps(l.as_mut_ptr().add(r), k, lr);
        }

        // PV = P V_j by 32 x 32 blocks (rows, columns of the values): P rows as A, V's
        // pairs as B.
        let (pp, vpp, pvp) = (
            pb.as_ptr() as *const u8,
            vp.as_ptr() as *const u8,
            pv.as_mut_ptr() as *mut u8,
        );
        for qt in (0..nb / 16).step_by(2) {
            for dt in (0..dv / 16).step_by(2) {
                amx::product_32x32(
                    (pp.add(qt * 16 * kb * 2), kb * 2),
                    (vpp.add(dt * 16 * 4), 4 * dv),
                    kw / 32,
                    (pvp.add((qt * 16 * dv + dt * 16) * 4), 4 * dv),
                );
            }
        }
        // O = corr O + PV.
        for r in 0..rows {
            let cr = _mm512_set1_ps(corr[r]);
            let (orow, prow) = (t.o.as_mut_ptr().add(r * dv), pv.as_ptr().add(r * dv));
            for x in (0..dv).step_by(16) {
                let y = _mm512_fmadd_ps(
                    _mm512_loadu_ps(orow.add(x)),
                    cr,
                    _mm512_loadu_ps(prow.add(x)),
                );
                _mm512_storeu_ps(orow.add(x), y);
            }
        }
    }
}

/// V_j (`kn` rows of `d` bf16) as the B tiles of P V_j: rows interleaved by pairs
/// (`simd::bf16::interleave_rows`), the pairs past `kn` up to the next 32 keys zero.
///
/// # Safety
/// AVX-512 available; `v` holds kn x d, `vp` at least round(kn) x d.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn pack_rows(v: &[u16], kn: usize, d: usize, vp: &mut [u16]) {
    super::simd::bf16::interleave_rows(v.as_ptr(), kn, d, vp.as_mut_ptr());
    vp[kn.div_ceil(2) * 2 * d..round(kn) / 2 * 2 * d].fill(0);
}

/// K_j (`kn` rows of `d` bf16) as the B tiles of S = Q K_j^T: `kp[p * kb + j]` is the pair
/// (K[j][2p], K[j][2p + 1]) (32 bits), keys past `kn` zero. 16 x 16 blocks of pairs are
/// transposed in registers.
///
/// # Safety
/// AVX-512 available; `k` holds kn x d, `kp` at least d / 2 x kb pairs; d even, kn <= kb.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn pack_pairs(k: &[u16], kn: usize, d: usize, kb: usize, kp: &mut [u16]) {
    let (src, dst) = (k.as_ptr() as *const f32, kp.as_mut_ptr() as *mut f32);
    let (pairs, full) = (d / 2, kn / 16 * 16);
    let mut p0 = 0;
    while p0 + 16 <= pairs {
        for j0 in (0..full).step_by(16) {
            super::simd::avx512::transpose_block(
                src.add(j0 * pairs + p0),
                pairs,
                dst.add(p0 * kb + j0),
                kb,
            );
        }
        p0 += 16;
    }
    // Pairs past the last 16 (d not a multiple of 32 never comes here: `fits`) and keys
    // past the last whole 16, one by one; keys past kn zero.
    let (src, dst) = (src as *const u32, dst as *mut u32);
    for p in 0..pairs {
        let from = if p < p0 { full } else { 0 };
        for j in from..kn {
            *dst.add(p * kb + j) = *src.add(j * pairs + p);
        }
        for j in kn..round(kn) {
            *dst.add(p * kb + j) = 0;
        }
    }
}
