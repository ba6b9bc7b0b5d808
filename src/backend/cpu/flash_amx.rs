//! FlashAttention-2's forward (Dao 2023, Algorithm 1 in the FA-2 loop order) for bf16
//! inputs on AMX tiles (`amx`): per query block Q_i and key block K_j, S = Q_i K_j^T and
//! O += P V_j as `tdpbf16ps` tile products (bf16 pairs, f32 sums), the online softmax
//! between them row by row on AVX-512 (m' = max(m, rowmax S), P = 2^(S log2e / sqrt(d) - m')
//! rounded to bf16, l = 2^(m - m') l + rowsum P, O = 2^(m - m') O + P V_j); O / l at the
//! end. Q_i is read in place as A tiles; K_j is transposed into bf16 pairs (the B tiles of
//! S) and V_j interleaved by pairs of rows (the B tiles of PV) once per block pair, 1/B_r of
//! the products' work. Blocks are processed 2 x 2 tiles at a time (four C tiles, two A, two
//! B: all eight tile registers). Causal, sliding-window and sink masks as `flash` (the same
//! key tiles, `flash::key_tiles`). Time O(n_q n_kv d); per-worker scratch
//! O(B_r B_c + (B_r + B_c) d) floats (`worker_lens`), O(1) in n.

#![allow(clippy::needless_range_loop)]

use super::flash::key_tiles;
use super::workspace::carve;
use crate::problem::{Inputs, Shape};

/// Query and key blocks are rounded up to a multiple of this (two 16-row tiles; 32 keys,
/// one A tile of P).
pub const GRAIN: usize = 32;

pub(crate) fn round(n: usize) -> usize {
    n.div_ceil(GRAIN) * GRAIN
}

/// Whether the AMX forward runs a head dimension: whole A tiles of Q (32 bf16) and whole
/// pairs of C tiles of O (32 columns).
pub fn fits(head_dim: usize) -> bool {
    head_dim > 0 && head_dim.is_multiple_of(GRAIN)
}

/// Per-worker scratch floats: a [`Block`]'s (`block_lens`: the Q block, K_j as pairs, V_j
/// interleaved, S, P, the row max, sum and correction, the PV staging); O accumulates in
/// the output block itself.
pub fn worker_lens(d: usize, bq: usize, bk: usize) -> [usize; 9] {
    block_lens(bq, bk, d, d)
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

/// One query block: rows `row0..row0 + o.len() / d` of the head whose first query row and
/// first key sit at elements `q_off` and `kv_off` of bf16 `inputs` of shape `s`. With
/// `lse`, each row's logsumexp (natural log; -inf for a row that sees no key).
///
/// # Safety
/// `amx::usable()` must be true; the inputs must be bf16 and `fits(s.head_dim)`; `buf` at
/// least the sum of `worker_lens(d, bq, bk)` for a `bq` of at least the block's rows.
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
    use super::tiles::bf16_bits;

    let d = s.head_dim;
    let rows = o.len() / d;
    let nb = round(bq);
    assert!(fits(d) && rows > 0 && rows <= nb, "flash_amx: block shape");
    let (q16, k16, v16) = match (
        bf16_bits(&inputs.q),
        bf16_bits(&inputs.k),
        bf16_bits(&inputs.v),
    ) {
        (Some(q), Some(k), Some(v)) => (q, k, v),
        _ => panic!("flash_amx: the inputs are not bf16"),
    };
    let q = &q16[q_off + row0 * d..][..rows * d];
    let mut t = Block::carve(buf, rows, bk, (d, d), o, |qb| qb.copy_from_slice(q));
    let c = s.scale() * std::f32::consts::LOG2_E;
    // Each row's keys: its window lo..hi (the causal bound, all keys without) and its
    // sinks 0..sk (`Shape::key_range`, `Shape::sink_range`).
    let seen = |r: usize| {
        let w = s.key_range(causal, window, row0 + r);
        let sk = s.sink_range(causal, window, sinks, row0 + r).end;
        (w.start as i32, w.end as i32, sk as i32)
    };
    let _tiles = Tiles::configure();
    for (k0, kn) in key_tiles(s, causal, (window, sinks), (row0, rows), bk) {
        let at = kv_off + k0 * d;
        let kv = (&k16[at..][..kn * d], &v16[at..][..kn * d]);
        t.key_block((k0, kn), c, &seen, kv);
    }
    drop(_tiles);
    t.finish(lse);
}

/// The online-softmax state of one query block on tiles, in the caller's scratch: `rows`
/// query rows (A tiles of `dims.0` bf16 in `qb`, padded to whole 32-row tiles with zeros),
/// keys of `dims.0` and values of `dims.1`, key blocks of at most `kb` (a multiple of 32).
pub(crate) struct Block<'a> {
    pub rows: usize,
    /// (key width, value width).
    pub dims: (usize, usize),
    pub kb: usize,
    pub qb: &'a [u16],
    /// The key block as pairs (`pack_pairs`, stride kb) and its values interleaved by
    /// row pairs (`pack_rows`).
    pub kp: &'a mut [u16],
    pub vp: &'a mut [u16],
    /// S (nb x kb), P (nb x kb bf16), with nb the rows rounded to 32.
    pub st: &'a mut [f32],
    pub pb: &'a mut [u16],
    /// O (rows x dims.1), then the normalized output.
    pub o: &'a mut [f32],
    /// Each row's running max (log2 units), sum and correction (nb each).
    pub m: &'a mut [f32],
    pub l: &'a mut [f32],
    pub corr: &'a mut [f32],
    /// The PV tile staging (nb x dims.1).
    pub pv: &'a mut [f32],
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
        let mut t = Block {
            rows,
            dims,
            kb: round(bk),
            qb,
            kp: as_u16(kp),
            vp: as_u16(vp),
            st,
            pb: as_u16(pb),
            o: &mut o[..rows * dims.1],
            m,
            l,
            corr,
            pv,
        };
        t.reset();
        t
    }

    fn nb(&self) -> usize {
        round(self.rows)
    }

    /// No key seen: O = 0, m = -inf, l = 0, P's padding zero.
    pub fn reset(&mut self) {
        self.pb.fill(0);
        self.o.fill(0.0);
        self.m.fill(f32::NEG_INFINITY);
        self.l.fill(0.0);
    }

    /// O = O / l (rows that saw no key 0); with `lse`, each row's logsumexp (natural log;
    /// -inf for a row that saw nothing).
    pub fn finish(&mut self, lse: Option<&mut [f32]>) {
        let dv = self.dims.1;
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

    /// One key block: keys `k0..k0 + kn`, whose rows (`kn` x dims.0 and `kn` x dims.1
    /// bf16) are `k` and `v`, packed into `kp` and `vp`; S = Q K^T on tiles, the online
    /// softmax row by row (`c` = scale x log2 e; row r sees key k where `seen(r)` =
    /// (lo, hi, sk) has lo <= k < hi or k < sk), O = corr O + P V on tiles.
    ///
    /// # Safety
    /// `amx::usable()`, tiles configured (`Tiles::configure`); the buffers as the fields
    /// say; `kn <= kb`, both key and value widths multiples of 32.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub unsafe fn key_block(
        &mut self,
        (k0, kn): (usize, usize),
        c: f32,
        seen: &impl Fn(usize) -> (i32, i32, i32),
        (k, v): (&[u16], &[u16]),
    ) {
        use std::arch::x86_64::*;

        use super::amx;
        use super::simd::avx512::{exp2, exp2_bf16};

        let (rows, nb, kb, (dk, dv)) = (self.rows, self.nb(), self.kb, self.dims);
        let kw = round(kn);
        assert!(kn <= kb && k.len() >= kn * dk && v.len() >= kn * dv);
        pack_pairs(k, kn, dk, kb, self.kp);
        pack_rows(v, kn, dv, self.vp);
        let (kp, vp) = (&*self.kp, &*self.vp);
        let (st, pb, m, l, corr, pv) = (
            &mut *self.st,
            &mut *self.pb,
            &mut *self.m,
            &mut *self.l,
            &mut *self.corr,
            &mut *self.pv,
        );

        // S = Q_i K_j^T by 32 x 32 blocks: Q rows as A, the key pairs as B.
        let (qp, kpp, sp) = (
            self.qb.as_ptr() as *const u8,
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
            let (orow, prow) = (self.o.as_mut_ptr().add(r * dv), pv.as_ptr().add(r * dv));
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
