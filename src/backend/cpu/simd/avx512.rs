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
unsafe fn splat(x: f32) -> V {
    _mm512_set1_ps(x)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn bcast(p: *const f32) -> V {
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
unsafe fn sub(a: V, b: V) -> V {
    _mm512_sub_ps(a, b)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn mul(a: V, b: V) -> V {
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

/// 2^x as [`super::exp2_scalar`]: 0 from -125.5 down, inf from 128, NaN stays NaN.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn exp2(x: V) -> V {
    // max(lo, x) / min(hi, x) return x when x is NaN (the second operand).
    let x = _mm512_max_ps(_mm512_set1_ps(-126.0), x);
    let x = _mm512_min_ps(_mm512_set1_ps(128.0), x);
    let magic = _mm512_set1_ps(12_582_912.0);
    let t = _mm512_add_ps(x, magic);
    let n = _mm512_sub_ps(t, magic);
    let f = _mm512_sub_ps(x, n);
    let ni = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_castps_si512(magic));
    let e = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
        ni,
        _mm512_set1_epi32(126),
    )));
    let mut p = _mm512_set1_ps(2.0 * EXP2_POLY[0]);
    for c in &EXP2_POLY[1..] {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.0 * *c));
    }
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.0));
    _mm512_mul_ps(p, e)
}

/// 2^x for x <= 0 with a degree-4 polynomial (relative error 2.7e-6): for probabilities
/// that are rounded to bf16 (relative step 2^-8) right after, where the full polynomial's
/// last two terms change nothing. 0 from -125.5 down, like [`exp2`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn exp2_nonpos_bf16(x: V) -> V {
    // Least-squares fit of 2^f on [-1/2, 1/2], relative error weighted, doubled (see exp2).
    const P4: [f32; 5] = [
        0.009_560_518,
        0.055_917_04,
        0.240_249_81,
        0.693_121_97,
        0.999_999_17,
    ];
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

super::kernels!(6, 4, #[target_feature(enable = "avx512f,avx512bw,avx512vl")]);
