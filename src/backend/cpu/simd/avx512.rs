//! AVX-512 (F, BW, VL) path: 16 f32 lanes, 32 registers. Tiles of up to 6 rows x 4 vectors
//! (24 accumulators; the 4 B vectors and the broadcast take 5 more of the 32 registers).

use std::arch::x86_64::*;

use super::EXP2_POLY;

pub type V = __m512;
pub type Mask = __mmask16;
pub const W: usize = 16;

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn zero() -> V {
    _mm512_setzero_ps()
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn splat(x: f32) -> V {
    _mm512_set1_ps(x)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn bcast(p: *const f32) -> V {
    _mm512_set1_ps(*p)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn load(p: *const f32) -> V {
    _mm512_loadu_ps(p)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn store(p: *mut f32, v: V) {
    _mm512_storeu_ps(p, v)
}

/// Non-temporal store: the line goes to memory without being read first (no
/// read-for-ownership) and without displacing the caches. `p` is aligned to 64 bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn stream(p: *mut f32, v: V) {
    _mm512_stream_ps(p, v)
}

/// Orders this thread's non-temporal stores before its later stores (the release of a
/// finished work item).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn fence() {
    _mm_sfence()
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn mask_first(n: usize) -> Mask {
    if n >= W {
        0xFFFF
    } else {
        ((1u32 << n) - 1) as Mask
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn load_m(p: *const f32, m: Mask) -> V {
    _mm512_maskz_loadu_ps(m, p)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn store_m(p: *mut f32, v: V, m: Mask) {
    _mm512_mask_storeu_ps(p, m, v)
}

/// `a` in the lanes of `m`, `b` elsewhere.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn blend_m(m: Mask, a: V, b: V) -> V {
    _mm512_mask_blend_ps(m, b, a)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn add(a: V, b: V) -> V {
    _mm512_add_ps(a, b)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn sub(a: V, b: V) -> V {
    _mm512_sub_ps(a, b)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn mul(a: V, b: V) -> V {
    _mm512_mul_ps(a, b)
}

/// a * b + c, one rounding.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn fma(a: V, b: V, c: V) -> V {
    _mm512_fmadd_ps(a, b, c)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn max(a: V, b: V) -> V {
    _mm512_max_ps(a, b)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn hmax(v: V) -> f32 {
    _mm512_reduce_max_ps(v)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn hsum(v: V) -> f32 {
    _mm512_reduce_add_ps(v)
}

/// Lanes where `vis <= k` (key k not visible) become -inf.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn mask_le(x: V, vis: V, k: V) -> V {
    let m = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(vis, k);
    _mm512_mask_mov_ps(x, m, _mm512_set1_ps(f32::NEG_INFINITY))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn neg_inf_to_zero(x: V) -> V {
    let m = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(x, _mm512_set1_ps(f32::NEG_INFINITY));
    _mm512_mask_mov_ps(x, m, _mm512_setzero_ps())
}

/// 2^x as [`super::exp2_scalar`]: 0 from -125.5 down, inf from 128, NaN stays NaN. The
/// same reduction x = n + f (`vrndscaleps`, round to nearest even, as the scalar's magic
/// number) and the same polynomial, undoubled: exact doubling commutes with every FMA, so
/// `vscalefps` (p 2^n) gives the AVX2 path's doubled polynomial times 2^(n-1) bit for bit
/// (checked on 21.5 million points from -140 to 140), in 2 operations instead of 5. For
/// n = -126 p 2^n would be subnormal; it is 0, as in the scalar.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn exp2(x: V) -> V {
    // max(lo, x) / min(hi, x) return x when x is NaN (the second operand).
    let x = _mm512_max_ps(_mm512_set1_ps(-126.0), x);
    let x = _mm512_min_ps(_mm512_set1_ps(128.0), x);
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
    let f = _mm512_sub_ps(x, n);
    let mut p = _mm512_set1_ps(EXP2_POLY[0]);
    for c in &EXP2_POLY[1..] {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(*c));
    }
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0));
    // Not n <= -126: true for NaN, which scalef keeps.
    let normal = _mm512_cmp_ps_mask::<_CMP_NLE_UQ>(n, _mm512_set1_ps(-126.0));
    _mm512_maskz_scalef_ps(normal, p, n)
}

/// Least-squares fit of 2^f on [-1/2, 1/2], relative error weighted (2.7e-6): the
/// polynomial of the exps whose results are rounded to bf16 next.
const P4: [f32; 5] = [
    0.009_560_518,
    0.055_917_04,
    0.240_249_81,
    0.693_121_97,
    0.999_999_17,
];

/// 2^x with [`P4`] (as [`exp2_nonpos_bf16`], any x up to 128): n = round(x) by
/// `vrndscaleps`, p(x - n) 2^n by `vscalefps`, 7 operations against that one's 12; 0 for x
/// far below -126 (`vscalefps` flushes). For the AMX forward's probabilities.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn exp2_bf16(x: V) -> V {
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
    let f = _mm512_sub_ps(x, n);
    let mut p = _mm512_set1_ps(P4[0]);
    for c in &P4[1..] {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(*c));
    }
    _mm512_scalef_ps(p, n)
}

/// 2^x for x <= 0 with a degree-4 polynomial (relative error 2.7e-6): for probabilities
/// that are rounded to bf16 (relative step 2^-8) right after, where the full polynomial's
/// last two terms change nothing. 0 from -125.5 down, like [`exp2`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn exp2_nonpos_bf16(x: V) -> V {
    let x = _mm512_max_ps(_mm512_set1_ps(-126.0), x);
    let magic = _mm512_set1_ps(12_582_912.0);
    let t = _mm512_add_ps(x, magic);
    let f = _mm512_sub_ps(x, _mm512_sub_ps(t, magic));
    let ni = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_castps_si512(magic));
    let e = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
        ni,
        _mm512_set1_epi32(126),
    )));
    let mut p = _mm512_set1_ps(2.0 * P4[0]);
    for c in &P4[1..] {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.0 * *c));
    }
    _mm512_mul_ps(p, e)
}

/// The W x W block at `src` (rows `lds` floats apart) transposed to `dst` (rows `ldd`
/// apart): four rounds of shuffles, 64 in all for 256 values. Round 1 pairs rows, round 2
/// quads of rows, within each 128-bit group; rounds 3 and 4 move the 128-bit groups.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn transpose_block(src: *const f32, lds: usize, dst: *mut f32, ldd: usize) {
    let r: [V; W] = std::array::from_fn(|i| load(src.add(i * lds)));
    // t[2i], t[2i + 1]: rows 2i and 2i + 1 interleaved (low and high pairs of each group).
    let mut t = [_mm512_setzero_ps(); W];
    for i in 0..W / 2 {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // u[4g + c]: column c + 4j of rows 4g..4g + 4 in group j.
    let mut u = [_mm512_setzero_ps(); W];
    for g in 0..4 {
        let (a, b) = (_mm512_castps_pd(t[4 * g]), _mm512_castps_pd(t[4 * g + 2]));
        let (e, f) = (
            _mm512_castps_pd(t[4 * g + 1]),
            _mm512_castps_pd(t[4 * g + 3]),
        );
        u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(e, f));
        u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(e, f));
    }
    for c in 0..4 {
        // Groups (0, 2) and (1, 3) of two quads of rows: columns c, c + 8 and c + 4, c + 12.
        let lo0 = _mm512_shuffle_f32x4::<0x88>(u[c], u[4 + c]);
        let hi0 = _mm512_shuffle_f32x4::<0xdd>(u[c], u[4 + c]);
        let lo1 = _mm512_shuffle_f32x4::<0x88>(u[8 + c], u[12 + c]);
        let hi1 = _mm512_shuffle_f32x4::<0xdd>(u[8 + c], u[12 + c]);
        store(dst.add(c * ldd), _mm512_shuffle_f32x4::<0x88>(lo0, lo1));
        store(
            dst.add((c + 8) * ldd),
            _mm512_shuffle_f32x4::<0xdd>(lo0, lo1),
        );
        store(
            dst.add((c + 4) * ldd),
            _mm512_shuffle_f32x4::<0x88>(hi0, hi1),
        );
        store(
            dst.add((c + 12) * ldd),
            _mm512_shuffle_f32x4::<0xdd>(hi0, hi1),
        );
    }
}

super::kernels!(6, 4, #[target_feature(enable = "avx512f,avx512bw,avx512vl")]);

#[cfg(test)]
mod tests {
    use super::*;

    /// Both bf16-precision exps within their polynomial's relative error (2.7e-6, plus f32
    /// rounding) of 2^x in f64 from -125 to 0 (and `exp2_bf16` on to 8, where the AMX
    /// forward may reach), 0 far below; far under bf16's step 2^-8.
    #[test]
    fn bf16_exps_are_within_their_polynomial_error() {
        if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")) {
            println!("no AVX-512 here: nothing to check");
            return;
        }
        let at = |f: unsafe fn(V) -> V, x: f32| -> f32 {
            // SAFETY: AVX-512 F and BW were detected above.
            unsafe { _mm512_cvtss_f32(f(_mm512_set1_ps(x))) }
        };
        let mut worst = [0.0f64; 2];
        for i in 0..=133_000 {
            let x = -125.0 + i as f32 * 1e-3;
            let want = 2f64.powf(f64::from(x));
            for (k, f) in [exp2_bf16 as unsafe fn(V) -> V, exp2_nonpos_bf16]
                .into_iter()
                .enumerate()
            {
                if k == 1 && x > 0.0 {
                    continue;
                }
                let rel = (f64::from(at(f, x)) - want).abs() / want;
                worst[k] = worst[k].max(rel);
            }
        }
        assert!(
            worst.iter().all(|&w| w < 3.0e-6),
            "relative errors {worst:?}"
        );
        assert_eq!(at(exp2_bf16, -200.0), 0.0);
        assert_eq!(at(exp2_nonpos_bf16, -200.0), 0.0);
    }
}
