//! AVX512_BF16 tiles: `vdpbf16ps` multiplies pairs of bf16 values exactly and adds both
//! products to f32 lanes, 32 multiply-adds per instruction (twice the f32 FMA's 16). The
//! reduction dimension therefore comes in pairs: A is read as 32-bit (bf16, bf16) pairs and
//! broadcast, B is pair-interleaved, `[k/2][n][2]`. Accumulation is f32 throughout, in
//! partial sums of at most `KC` terms, exactly as the f32 tiles.

use std::arch::x86_64::*;

use super::avx512::{
    add, bcast, exp2, exp2_nonpos_bf16, fma, load, load_m, max, mul, splat, store, store_m, sub,
    zero, Mask, NV_MAX, V, W,
};
use super::{ColSoftmax, Epi, Tile, KC, ROW_SEG};

/// Register rows of a bf16 tile: 6 x 4 vectors, as the f32 tile.
pub const MR_MAX: usize = 6;
pub use super::avx512::NV_MAX as BF16_NV_MAX;

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn as_bh(x: __m512i) -> __m512bh {
    // SAFETY: both are 512-bit plain-data vectors; every bit pattern is valid for either.
    std::mem::transmute::<__m512i, __m512bh>(x)
}

super::epilogue_fns!(#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]);

/// One MR x NV tile over one block of at most `KC / 2` pairs (the caller,
/// `tiles::gemm_bf16`, cuts the reduction into blocks): one f32 partial sum per product,
/// then the epilogue. `t.k` counts pairs, A pairs at `a + i*ars + p*acs` (u16 units), B rows
/// of 2 * NV * W u16 at stride `ldb`, always read as whole vectors (B is padded).
///
/// # Safety
/// All pointers valid for what they name; B valid for whole vectors.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
#[inline]
pub unsafe fn tile<const MR: usize, const NV: usize, const PARTIAL: bool>(t: &Tile<u16>) {
    debug_assert!(2 * t.k <= KC, "a bf16 tile sums at most KC terms");
    let lastm: Mask = if PARTIAL && t.n_last < W {
        ((1u32 << t.n_last) - 1) as Mask
    } else {
        0xFFFF
    };
    let (ars, acs, ldb) = (t.ars, t.acs, t.ldb);
    let mut acc = [[_mm512_setzero_ps(); NV]; MR];
    let (mut ap, mut bp) = (t.a, t.b);
    for _ in 0..t.k {
        let mut bv = [as_bh(_mm512_setzero_si512()); NV];
        for (v, x) in bv.iter_mut().enumerate() {
            *x = as_bh(_mm512_loadu_si512(bp.add(v * 2 * W) as *const __m512i));
        }
        for (i, row) in acc.iter_mut().enumerate() {
            let pair = (ap.add(i * ars) as *const i32).read_unaligned();
            let av = as_bh(_mm512_set1_epi32(pair));
            for (x, bx) in row.iter_mut().zip(bv) {
                *x = _mm512_dpbf16_ps(*x, av, bx);
            }
        }
        ap = ap.add(acs);
        bp = bp.add(ldb);
    }
    epilogue::<MR, NV, PARTIAL>(acc, t.c, t.ldc, t.epi, lastm);
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn tile_nv<const MR: usize>(nv: usize, partial: bool, t: &Tile<u16>) {
    match (nv, partial) {
        (1, false) => tile::<MR, 1, false>(t),
        (1, true) => tile::<MR, 1, true>(t),
        (2, false) => tile::<MR, 2, false>(t),
        (2, true) => tile::<MR, 2, true>(t),
        (3, false) => tile::<MR, 3, false>(t),
        (3, true) => tile::<MR, 3, true>(t),
        (4, false) => tile::<MR, 4, false>(t),
        (4, true) => tile::<MR, 4, true>(t),
        _ => unreachable!("tile width {nv} vectors"),
    }
}

/// A tile of `mr` (1..=6) rows and `nv` (1..=4) vectors.
///
/// # Safety
/// As [`tile`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn tile_any(mr: usize, nv: usize, partial: bool, t: &Tile<u16>) {
    debug_assert!(nv <= NV_MAX);
    match mr {
        1 => tile_nv::<1>(nv, partial, t),
        2 => tile_nv::<2>(nv, partial, t),
        3 => tile_nv::<3>(nv, partial, t),
        4 => tile_nv::<4>(nv, partial, t),
        5 => tile_nv::<5>(nv, partial, t),
        6 => tile_nv::<6>(nv, partial, t),
        _ => unreachable!("tile height {mr} rows"),
    }
}

/// Flash's column softmax (as `avx512::col_softmax`), writing P^T as bf16 pairs
/// `[ceil(kn/2)][nb][2]` at `a.pairs` (a missing last key of an odd block is a zero).
/// The row sums add the f32 values before rounding.
///
/// # Safety
/// As `avx512::col_softmax`; `pairs` valid for `ceil(kn/2) * nb * 2` u16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn col_softmax(a: &ColSoftmax) {
    let c = _mm512_set1_ps(a.c);
    let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
    for v in (0..a.nb).step_by(W) {
        let m_old = _mm512_loadu_ps(a.m2.add(v));
        let m_new = _mm512_max_ps(m_old, _mm512_mul_ps(_mm512_loadu_ps(a.colmax.add(v)), c));
        let is_inf = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(m_new, neg_inf);
        let m_safe = _mm512_mask_mov_ps(m_new, is_inf, _mm512_setzero_ps());
        _mm512_storeu_ps(a.corr.add(v), exp2(_mm512_sub_ps(m_old, m_safe)));
        _mm512_storeu_ps(a.m2.add(v), m_new);
        _mm512_storeu_ps(a.colmax.add(v), m_safe);
    }
    let mut v0 = 0;
    while v0 < a.nb {
        let g = 4.min((a.nb - v0) / W);
        match g {
            4 => col_group::<4>(a, v0),
            3 => col_group::<3>(a, v0),
            2 => col_group::<2>(a, v0),
            _ => col_group::<1>(a, v0),
        }
        v0 += g * W;
    }
}

/// Columns `v0..v0 + G*W` of [`col_softmax`]'s row pass, two key rows at a time (G fixed,
/// so the sums and maxima are registers).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
#[inline]
unsafe fn col_group<const G: usize>(a: &ColSoftmax, v0: usize) {
    let c = _mm512_set1_ps(a.c);
    // (p0[r], p1[r]) pairs from the two halves [p0 | p1] of a converted vector.
    let interleave = _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4,
        19, 3, 18, 2, 17, 1, 16, 0,
    );
    let mut ms = [_mm512_setzero_ps(); G];
    let mut sum = [_mm512_setzero_ps(); G];
    for (u, m) in ms.iter_mut().enumerate() {
        *m = _mm512_sub_ps(
            _mm512_setzero_ps(),
            _mm512_loadu_ps(a.colmax.add(v0 + u * W)),
        );
    }
    let mut j = 0;
    while j < a.kn {
        let r0 = a.st.add(j * a.ld + v0);
        let has1 = j + 1 < a.kn;
        let out = a.pairs.add((j / 2) * 2 * a.nb + 2 * v0);
        for (u, (m, su)) in ms.iter().zip(sum.iter_mut()).enumerate() {
            // x c - m <= 0: m is the max of these scores (or 0 over masked ones).
            let p0: V = exp2_nonpos_bf16(_mm512_fmadd_ps(_mm512_loadu_ps(r0.add(u * W)), c, *m));
            let p1: V = if has1 {
                exp2_nonpos_bf16(_mm512_fmadd_ps(
                    _mm512_loadu_ps(r0.add(a.ld + u * W)),
                    c,
                    *m,
                ))
            } else {
                _mm512_setzero_ps()
            };
            *su = _mm512_add_ps(*su, _mm512_add_ps(p0, p1));
            let packed: __m512i =
                std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(p1, p0));
            let pairs = _mm512_permutexvar_epi16(interleave, packed);
            _mm512_storeu_si512(out.add(u * 2 * W) as *mut __m512i, pairs);
        }
        j += 2;
    }
    for (u, su) in sum.iter().enumerate() {
        let lp = a.l.add(v0 + u * W);
        let lc = _mm512_loadu_ps(a.corr.add(v0 + u * W));
        _mm512_storeu_ps(lp, _mm512_fmadd_ps(_mm512_loadu_ps(lp), lc, *su));
    }
}

/// Pairs consecutive rows of a `[kn][d]` bf16 matrix: `dst[p][c] = (src[2p][c], src[2p+1][c])`,
/// `[ceil(kn/2)][d][2]`, a missing last row as zeros: V in the layout its PV tile
/// broadcasts from (A pairs along the keys).
///
/// # Safety
/// `src` valid for `kn * d` u16, `dst` for `ceil(kn/2) * d * 2`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn interleave_rows(src: *const u16, kn: usize, d: usize, dst: *mut u16) {
    let lo = _mm512_set_epi16(
        47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5, 36, 4,
        35, 3, 34, 2, 33, 1, 32, 0,
    );
    let hi = _mm512_set_epi16(
        63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24, 55, 23, 54, 22, 53, 21, 52,
        20, 51, 19, 50, 18, 49, 17, 48, 16,
    );
    let mut p = 0;
    while 2 * p < kn {
        let r0 = src.add(2 * p * d);
        let has1 = 2 * p + 1 < kn;
        let out = dst.add(p * 2 * d);
        let mut c = 0;
        while c < d {
            let k = (d - c).min(32);
            let m: __mmask32 = if k == 32 { u32::MAX } else { (1u32 << k) - 1 };
            let x0 = _mm512_maskz_loadu_epi16(m, r0.add(c) as *const i16);
            let x1 = if has1 {
                _mm512_maskz_loadu_epi16(m, r0.add(d + c) as *const i16)
            } else {
                _mm512_setzero_si512()
            };
            let y0 = _mm512_permutex2var_epi16(x0, lo, x1);
            let y1 = _mm512_permutex2var_epi16(x0, hi, x1);
            // 2k output values: the first min(2k, 32) from y0, the rest from y1.
            let n0 = (2 * k).min(32);
            let m0: __mmask32 = if n0 == 32 { u32::MAX } else { (1u32 << n0) - 1 };
            _mm512_mask_storeu_epi16(out.add(2 * c) as *mut i16, m0, y0);
            if 2 * k > 32 {
                let n1 = 2 * k - 32;
                let m1: __mmask32 = if n1 == 32 { u32::MAX } else { (1u32 << n1) - 1 };
                _mm512_mask_storeu_epi16(out.add(2 * c + 32) as *mut i16, m1, y1);
            }
            c += k;
        }
        p += 1;
    }
}

/// `dst[..n] = x[..n] * f` and `dst[n..n_dst] = 0` by non-temporal stores from the first
/// aligned vector of `dst` on (as `avx512::scale_stream`), and `x[..n] * f` rounded to bf16
/// (nearest even) into `pairs[..n]`: a normalized probability row written to the
/// materialized P and, rounded, to the A operand of the bf16 PV tile. Call
/// `avx512::store_fence` before handing `dst` over to another thread.
///
/// # Safety
/// `x` valid for `n` floats, `dst` for `n_dst >= n`, `pairs` for `n` u16; none overlap.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn scale_stream_pairs(
    x: *const f32,
    n: usize,
    f: f32,
    dst: *mut f32,
    n_dst: usize,
    pairs: *mut u16,
) {
    let fv = _mm512_set1_ps(f);
    let head = super::stream_head(dst, W).min(n_dst);
    let lanes = |k: usize| -> __mmask16 {
        if k >= W {
            u16::MAX
        } else {
            (1u16 << k) - 1
        }
    };
    let mut i = 0;
    while i < n_dst {
        let k = if i < head {
            (head - i).min(W)
        } else {
            W.min(n_dst - i)
        };
        let mx = lanes(k.min(n.saturating_sub(i)));
        let y = _mm512_mul_ps(_mm512_maskz_loadu_ps(mx, x.add(i)), fv);
        if i >= head && k == W {
            _mm512_stream_ps(dst.add(i), y);
        } else {
            _mm512_mask_storeu_ps(dst.add(i), lanes(k), y);
        }
        if i < n {
            let h: __m256i = std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(y));
            _mm256_mask_storeu_epi16(pairs.add(i) as *mut i16, mx, h);
        }
        i += k;
    }
}

/// x = 2^(x c - mc) rounded to bf16, in place: the u16 view of `x` then begins with the n
/// bf16 values (each 16-value step stores 32 bytes below the 64 it has just loaded). Returns the sum of the f32 values before rounding, in partial sums of at
/// most `ROW_SEG / (4 W)` terms per lane as `avx512::exp_sum`. `mc` is the row max times c,
/// so every exponent is <= 0 and the cheaper polynomial serves (its error is far below
/// bf16's step, as in flash's bf16 column softmax).
///
/// # Safety
/// `x` valid for `n` floats.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn exp_sum_round(x: *mut f32, n: usize, c: f32, mc: f32) -> f32 {
    let (cv, mv) = (_mm512_set1_ps(c), _mm512_set1_ps(-mc));
    let out = x as *mut u16;
    let mut total = 0.0f32;
    let mut s0 = 0;
    while s0 < n {
        let end = n.min(s0 + ROW_SEG);
        let mut s = [_mm512_setzero_ps(); 4];
        let mut i = s0;
        while i < end {
            let k = (end - i).min(W);
            let m: __mmask16 = if k == W { u16::MAX } else { (1u16 << k) - 1 };
            let e = exp2_nonpos_bf16(_mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x.add(i)), cv, mv));
            // Masked-off lanes computed 2^(-mc) (maybe inf): keep them out of the sum.
            let e = _mm512_maskz_mov_ps(m, e);
            let lane = (i / W) % 4;
            s[lane] = _mm512_add_ps(s[lane], e);
            let h: __m256i = std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(e));
            _mm256_mask_storeu_epi16(out.add(i) as *mut i16, m, h);
            i += k;
        }
        total += _mm512_reduce_add_ps(_mm512_add_ps(
            _mm512_add_ps(s[0], s[1]),
            _mm512_add_ps(s[2], s[3]),
        ));
        s0 = end;
    }
    total
}

/// `iters` rounds of 12 independent `vdpbf16ps` chains: the bf16 pair multiply-add issue
/// rate (32 multiply-adds per instruction), for the calibrated peak.
///
/// # Safety
/// AVX512_BF16 is available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn dot_chains(iters: usize) -> f32 {
    let mut acc = [_mm512_set1_ps(0.5); 12];
    let x = as_bh(_mm512_set1_epi32(0x3380_3380)); // pairs of bf16 6e-8: sums stay small
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = _mm512_dpbf16_ps(*a, x, x);
        }
    }
    let mut s = _mm512_setzero_ps();
    for a in acc {
        s = _mm512_add_ps(s, a);
    }
    _mm512_reduce_add_ps(s)
}
