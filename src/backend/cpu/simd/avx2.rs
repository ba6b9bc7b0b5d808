//! AVX2 + FMA path: 8 f32 lanes, 16 registers. Tiles of up to 6 rows x 2 vectors
//! (12 accumulators; the 2 B vectors and the broadcast take 3 more of the 16 registers).

use std::arch::x86_64::*;

use super::EXP2_POLY;

pub type V = __m256;
/// Lane mask as a vector (all bits set in an active lane), as `vmaskmovps` wants it.
pub type Mask = __m256i;
pub const W: usize = 8;

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn zero() -> V {
    _mm256_setzero_ps()
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn splat(x: f32) -> V {
    _mm256_set1_ps(x)
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn bcast(p: *const f32) -> V {
    _mm256_broadcast_ss(&*p)
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn load(p: *const f32) -> V {
    _mm256_loadu_ps(p)
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn store(p: *mut f32, v: V) {
    _mm256_storeu_ps(p, v)
}

/// Non-temporal store (no read-for-ownership, caches bypassed); `p` is aligned to 32 bytes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn stream(p: *mut f32, v: V) {
    _mm256_stream_ps(p, v)
}

/// Orders this thread's non-temporal stores before its later stores.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn fence() {
    _mm_sfence()
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn mask_first(n: usize) -> Mask {
    let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_cmpgt_epi32(_mm256_set1_epi32(n.min(W) as i32), idx)
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn load_m(p: *const f32, m: Mask) -> V {
    _mm256_maskload_ps(p, m)
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn store_m(p: *mut f32, v: V, m: Mask) {
    _mm256_maskstore_ps(p, m, v)
}

/// `a` in the lanes of `m`, `b` elsewhere.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn blend_m(m: Mask, a: V, b: V) -> V {
    _mm256_blendv_ps(b, a, _mm256_castsi256_ps(m))
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn add(a: V, b: V) -> V {
    _mm256_add_ps(a, b)
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn sub(a: V, b: V) -> V {
    _mm256_sub_ps(a, b)
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn mul(a: V, b: V) -> V {
    _mm256_mul_ps(a, b)
}

/// a * b + c, one rounding.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma(a: V, b: V, c: V) -> V {
    _mm256_fmadd_ps(a, b, c)
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn max(a: V, b: V) -> V {
    _mm256_max_ps(a, b)
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn hmax(v: V) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_shuffle_ps::<0b01>(m, m));
    _mm_cvtss_f32(m)
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum(v: V) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
    _mm_cvtss_f32(s)
}

/// Lanes where `vis <= k` (key k not visible) become -inf.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn mask_le(x: V, vis: V, k: V) -> V {
    let m = _mm256_cmp_ps::<_CMP_LE_OQ>(vis, k);
    _mm256_blendv_ps(x, _mm256_set1_ps(f32::NEG_INFINITY), m)
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn neg_inf_to_zero(x: V) -> V {
    let m = _mm256_cmp_ps::<_CMP_EQ_OQ>(x, _mm256_set1_ps(f32::NEG_INFINITY));
    _mm256_blendv_ps(x, _mm256_setzero_ps(), m)
}

/// 2^x as [`super::exp2_scalar`]: 0 from -125.5 down, inf from 128, NaN stays NaN.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp2(x: V) -> V {
    // max(lo, x) / min(hi, x) return x when x is NaN (the second operand).
    let x = _mm256_max_ps(_mm256_set1_ps(-126.0), x);
    let x = _mm256_min_ps(_mm256_set1_ps(128.0), x);
    let magic = _mm256_set1_ps(12_582_912.0);
    let t = _mm256_add_ps(x, magic);
    let n = _mm256_sub_ps(t, magic);
    let f = _mm256_sub_ps(x, n);
    let ni = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(magic));
    let e = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
        ni,
        _mm256_set1_epi32(126),
    )));
    let mut p = _mm256_set1_ps(2.0 * EXP2_POLY[0]);
    for c in &EXP2_POLY[1..] {
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.0 * *c));
    }
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.0));
    _mm256_mul_ps(p, e)
}

/// The W x W block at `src` (rows `lds` floats apart) transposed to `dst` (rows `ldd`
/// apart): rows paired, then quads, within each 128-bit half, then the halves swapped.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn transpose_block(src: *const f32, lds: usize, dst: *mut f32, ldd: usize) {
    let r: [V; W] = std::array::from_fn(|i| load(src.add(i * lds)));
    let mut t = [_mm256_setzero_ps(); W];
    for i in 0..W / 2 {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // u[4g + c]: column c of rows 4g..4g + 4 in the low half, column c + 4 in the high.
    let mut u = [_mm256_setzero_ps(); W];
    for g in 0..2 {
        let (a, b) = (_mm256_castps_pd(t[4 * g]), _mm256_castps_pd(t[4 * g + 2]));
        let (e, f) = (
            _mm256_castps_pd(t[4 * g + 1]),
            _mm256_castps_pd(t[4 * g + 3]),
        );
        u[4 * g] = _mm256_castpd_ps(_mm256_unpacklo_pd(a, b));
        u[4 * g + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(a, b));
        u[4 * g + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(e, f));
        u[4 * g + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(e, f));
    }
    for c in 0..4 {
        store(
            dst.add(c * ldd),
            _mm256_permute2f128_ps::<0x20>(u[c], u[4 + c]),
        );
        store(
            dst.add((c + 4) * ldd),
            _mm256_permute2f128_ps::<0x31>(u[c], u[4 + c]),
        );
    }
}

super::kernels!(6, 2, #[target_feature(enable = "avx2,fma")]);
