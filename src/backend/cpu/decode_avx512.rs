//! AVX-512 versions of decode's two streaming loops (`vecops::scores` and
//! `vecops::accumulate`), for head dimensions that are a multiple of 16 (callers fall back
//! to the AVX2 loops otherwise). Scores: one query row held in registers against 16 keys at
//! a time, the 16 per-key vector sums reduced to one vector of 16 scores by a transposing
//! add tree (45 shuffles and adds for 16 dot products, against 16 horizontal sums of 8 each).
//! Accumulation: 4 rows x 64 columns of the output in 16 registers across a chunk of keys,
//! each P weight broadcast once per row. Keys and values are f32, bf16 or FP8 codes, the
//! last two widened in registers (an FP8 code becomes an f16 by integer shifts and then an
//! f32 by `vcvtph2ps`, as `fp8::widen` does, its scale applied to the scores and to each
//! chunk's sum). Same O(rows * keys * d) work as the AVX2 loops, half the instructions.

#![allow(clippy::needless_range_loop)] // rows and keys index register arrays in step

use std::arch::x86_64::*;

use half::{bf16, f16};

use super::spread::Spread;
use super::vecops::Dims;

/// Keys per chunk of the value accumulation, summed from zero in registers and then added
/// to the output (blocked summation, as the AVX2 loop: the error grows with keys / chunk).
const KEY_CHUNK: usize = 16;

/// A stored element the loops read 16 at a time as f32.
pub trait Elem16: Copy {
    /// Whether loading widens (bf16), so that a block read by several rows is widened once.
    const WIDENS: bool;
    /// Whether the loaded values need a scale (FP8 codes): the value accumulation then
    /// multiplies each chunk's sum by it; otherwise adds it as it is.
    const SCALED: bool = false;
    /// # Safety
    /// `p..p + 16` must be readable; AVX-512 F must be available.
    unsafe fn load16(p: *const Self) -> __m512;
}

impl Elem16 for f32 {
    const WIDENS: bool = false;
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
}

impl Elem16 for bf16 {
    const WIDENS: bool = true;
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const bf16) -> __m512 {
        let h = _mm256_loadu_si256(p as *const __m256i);
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
    }
}

impl Elem16 for f16 {
    const WIDENS: bool = true;
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const f16) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }
}

/// An FP8 E4M3 code (Micikevicius et al. 2022) as the loops read it: its value times 2^-8
/// (the f16 with the code's sign, exponent and mantissa bits in place), which the caller's
/// scale makes up (`E4M3_UNIT`). Codes 0x7f and 0xff (NaN) read as 480 x 2^-8; the quantizer
/// never writes them.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct E4m3(pub u8);

/// An FP8 E5M2 code as the loops read it: its value (the upper byte of an IEEE f16).
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct E5m2(pub u8);

/// What an `E4m3` load must be multiplied by to give the code's value.
pub const E4M3_UNIT: f32 = 256.0;

impl Elem16 for E4m3 {
    const WIDENS: bool = true;
    const SCALED: bool = true;
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const E4m3) -> __m512 {
        // Sign-extended to 16 bits and shifted left 7, the code's sign lands in bit 15, its
        // exponent and mantissa in bits 7 to 13 (f16's exponent bias is 8 more than
        // E4M3's); bit 14 holds the sign again and is cleared.
        let c = _mm_loadu_si128(p as *const __m128i);
        let h = _mm256_slli_epi16::<7>(_mm256_cvtepi8_epi16(c));
        _mm512_cvtph_ps(_mm256_and_si256(h, _mm256_set1_epi16(0xbf80u16 as i16)))
    }
}

impl Elem16 for E5m2 {
    const WIDENS: bool = true;
    const SCALED: bool = true;
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const E5m2) -> __m512 {
        let c = _mm_loadu_si128(p as *const __m128i);
        _mm512_cvtph_ps(_mm256_slli_epi16::<8>(_mm256_cvtepu8_epi16(c)))
    }
}

/// FP8 codes as `E4m3` elements.
pub fn as_e4m3(codes: &[u8]) -> &[E4m3] {
    // SAFETY: `E4m3` is a transparent wrapper of u8 (same size, alignment and validity).
    unsafe { std::slice::from_raw_parts(codes.as_ptr() as *const E4m3, codes.len()) }
}

/// FP8 codes as `E5m2` elements.
pub fn as_e5m2(codes: &[u8]) -> &[E5m2] {
    // SAFETY: `E5m2` is a transparent wrapper of u8 (same size, alignment and validity).
    unsafe { std::slice::from_raw_parts(codes.as_ptr() as *const E5m2, codes.len()) }
}

/// Lane j of the result is the sum of the 16 lanes of `v[j]`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn reduce16(v: &[__m512; 16]) -> __m512 {
    // Pairs of vectors: 32-bit interleave and add; each 128-bit quarter then holds
    // [a0+a2, b0+b2, a1+a3, b1+b3] of its quarter of a and b.
    let mut l1 = [_mm512_setzero_ps(); 8];
    for i in 0..8 {
        let (a, b) = (v[2 * i], v[2 * i + 1]);
        l1[i] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    }
    // Pairs again, 64-bit interleave: each quarter holds one partial sum of vectors
    // 4i..4i + 3, in order.
    let mut l2 = [_mm512_setzero_ps(); 4];
    for i in 0..4 {
        let (a, b) = (_mm512_castps_pd(l1[2 * i]), _mm512_castps_pd(l1[2 * i + 1]));
        l2[i] = _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)),
        );
    }
    // Quarters across vectors: [a.q0 + a.q1, a.q2 + a.q3, b.q0 + b.q1, b.q2 + b.q3].
    let halve = |a: __m512, b: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
        )
    };
    let (x, y) = (halve(l2[0], l2[1]), halve(l2[2], l2[3]));
    halve(x, y)
}

/// `s[r * stride + j] = scale * q_r . k_j` for every query row r and key j (the contract
/// of `vecops::scores`).
///
/// # Safety
/// AVX-512 F must be available; `dims.d` must be a multiple of 16.
#[target_feature(enable = "avx512f")]
pub unsafe fn scores<T: Elem16>(
    q: &[f32],
    k: &[T],
    dims: Dims,
    scale: f32,
    s: &mut [f32],
    stride: usize,
    fetch: &mut Spread,
) {
    let Dims { rows, keys, d } = dims;
    assert!(d.is_multiple_of(16), "scores: d must be a multiple of 16");
    assert!(
        q.len() >= rows * d && k.len() >= keys * d,
        "scores: inputs too short"
    );
    assert!(
        rows == 0 || keys == 0 || s.len() >= (rows - 1) * stride + keys,
        "scores: output too short"
    );
    let sc = _mm512_set1_ps(scale);
    // SAFETY (every pointer below): row r < rows, key j < keys and lane x < d stay inside
    // q, k and s by the asserts above; partial groups of keys write only `n` lanes.
    let (qp, kp, sp) = (q.as_ptr(), k.as_ptr(), s.as_mut_ptr());
    // Keys that must be widened are widened once per group of 16 into `wide` (L1), not once
    // per query row.
    // (Uninitialized: `scores` runs per 16 keys, and only the `n * d` written are read.)
    let mut wide = std::mem::MaybeUninit::<[f32; WIDE_KEYS]>::uninit();
    let wp = wide.as_mut_ptr() as *mut f32;
    let mut j0 = 0;
    while j0 < keys {
        let n = 16.min(keys - j0);
        let kj = kp.add(j0 * d);
        if T::WIDENS && rows > 1 && n * d <= WIDE_KEYS {
            for x in (0..n * d).step_by(16) {
                _mm512_storeu_ps(wp.add(x), T::load16(kj.add(x)));
            }
            key_rows(
                qp,
                wp as *const f32,
                n,
                d,
                rows,
                sc,
                sp.add(j0),
                stride,
                fetch,
            );
        } else {
            key_rows(qp, kj, n, d, rows, sc, sp.add(j0), stride, fetch);
        }
        j0 += n;
    }
    // (Rows of none take no steps.)
    fetch.all();
}

/// Widened keys `scores` stages per group of 16 (16 keys of d = 256, 16 KiB).
const WIDE_KEYS: usize = 16 * 256;

/// The scores of `rows` query rows (at `q`) against `n` <= 16 keys (at `k`), scaled by
/// `sc`, into `s` (row r at `r * stride`).
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn key_rows<T: Elem16>(
    q: *const f32,
    k: *const T,
    n: usize,
    d: usize,
    rows: usize,
    sc: __m512,
    s: *mut f32,
    stride: usize,
    fetch: &mut Spread,
) {
    for r in 0..rows {
        let qr = q.add(r * d);
        // The first row's pass over the keys takes a key's share of the fetches per key.
        let f = if r == 0 { Some(&mut *fetch) } else { None };
        let sums = match d {
            64 => key_sums::<T, 4>(qr, k, n, f),
            128 => key_sums::<T, 8>(qr, k, n, f),
            _ => key_sums_any(qr, k, n, d, f),
        };
        if n < TREE_MIN_KEYS {
            // A few keys (Rabe–Staats' one at a time): each reduced alone, in the tree's
            // order, so its score has the same bits however the keys were grouped.
            for j in 0..n {
                *s.add(r * stride + j) = _mm512_cvtss_f32(sc) * reduce1(sums[j]);
            }
            continue;
        }
        let out = _mm512_mul_ps(sc, reduce16(&sums));
        let mask = if n == 16 { !0 } else { (1u16 << n) - 1 };
        _mm512_mask_storeu_ps(s.add(r * stride), mask, out);
    }
}

/// Keys from which `key_rows` reduces a group with the 16-key tree (45 shuffles and adds
/// whatever the count): below it, one key at a time costs less (decode-online, one key per
/// call, ran 1.25x slower on the tree than on the AVX2 loop).
const TREE_MIN_KEYS: usize = 8;

/// The sum of the 16 lanes of `v`, added in `reduce16`'s order (lanes i and i + 2 of each
/// quarter, then the pair, then quarters 0 + 1 and 2 + 3, then the halves), so the two agree
/// bit for bit.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn reduce1(v: __m512) -> f32 {
    let t = _mm512_add_ps(v, _mm512_permute_ps::<0b01_00_11_10>(v));
    let t = _mm512_add_ps(t, _mm512_permute_ps::<0b10_11_00_01>(t));
    let t = _mm512_add_ps(t, _mm512_shuffle_f32x4::<0b10_11_00_01>(t, t));
    let t = _mm512_add_ps(t, _mm512_shuffle_f32x4::<0b01_00_11_10>(t, t));
    _mm512_cvtss_f32(t)
}

/// Per key j < n of the `n` keys at `k` (`16 V` long each): the vector whose lanes sum to
/// q . k_j, with the query row held in `V` registers across the keys.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn key_sums<T: Elem16, const V: usize>(
    q: *const f32,
    k: *const T,
    n: usize,
    mut fetch: Option<&mut Spread>,
) -> [__m512; 16] {
    let qv = load_row::<V>(q);
    let mut sums = [_mm512_setzero_ps(); 16];
    for j in 0..n {
        if let Some(f) = fetch.as_deref_mut() {
            f.step();
        }
        sums[j] = key_sum(&qv, k.add(j * 16 * V));
    }
    sums
}

/// The `V` vectors of the query row at `q`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_row<const V: usize>(q: *const f32) -> [__m512; V] {
    let mut qv = [_mm512_setzero_ps(); V];
    for x in 0..V {
        qv[x] = _mm512_loadu_ps(q.add(16 * x));
    }
    qv
}

/// The vector whose lanes sum to q . k for the query row `qv` (V >= 2 vectors) and the key
/// at `k`: two chains, so consecutive FMAs do not wait on each other.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn key_sum<T: Elem16, const V: usize>(qv: &[__m512; V], k: *const T) -> __m512 {
    let mut a = _mm512_mul_ps(qv[0], T::load16(k));
    let mut b = _mm512_mul_ps(qv[1], T::load16(k.add(16)));
    for x in (2..V).step_by(2) {
        a = _mm512_fmadd_ps(qv[x], T::load16(k.add(16 * x)), a);
        b = _mm512_fmadd_ps(qv[x + 1], T::load16(k.add(16 * x + 16)), b);
    }
    _mm512_add_ps(a, b)
}

/// `key_sums` for any multiple of 16 as `d`, the query row read from L1 per key.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn key_sums_any<T: Elem16>(
    q: *const f32,
    k: *const T,
    n: usize,
    d: usize,
    mut fetch: Option<&mut Spread>,
) -> [__m512; 16] {
    let mut sums = [_mm512_setzero_ps(); 16];
    for j in 0..n {
        if let Some(f) = fetch.as_deref_mut() {
            f.step();
        }
        sums[j] = key_sum_any(q, k.add(j * d), d);
    }
    sums
}

/// `key_sum` for any multiple of 16 as `d`: one chain.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn key_sum_any<T: Elem16>(q: *const f32, k: *const T, d: usize) -> __m512 {
    let mut a = _mm512_setzero_ps();
    let mut x = 0;
    while x < d {
        a = _mm512_fmadd_ps(_mm512_loadu_ps(q.add(x)), T::load16(k.add(x)), a);
        x += 16;
    }
    a
}

/// The score of query row `q` against the key at `k` (`d` long), scaled: the bits
/// `key_rows` gives that key alone.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn key_score<T: Elem16>(q: *const f32, k: *const T, d: usize, scale: f32) -> f32 {
    let sum = match d {
        64 => key_sum(&load_row::<4>(q), k),
        128 => key_sum(&load_row::<8>(q), k),
        _ => key_sum_any(q, k, d),
    };
    scale * reduce1(sum)
}

/// Rabe–Staats Section 3 (the contract of `decode::attend_sequential`) over the keys `span`
/// of one contiguous run (`k` and `v` from its key 0, `d` each) for the query rows `q`
/// (`m.len()` of them): per key and row whose `range` holds it, the score, the running max
/// `m` and sum `l` of exp(score - m), and acc = acc e^(m - m') + e^(s - m') v; one loop with
/// no per-key dispatch, the same bits as `scores` and `accumulate` key by key.
///
/// # Safety
/// AVX-512 F must be available; `d` must be a multiple of 16.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
pub unsafe fn sequential<T: Elem16>(
    q: &[f32],
    k: &[T],
    v: &[T],
    d: usize,
    scale: f32,
    span: std::ops::Range<usize>,
    range: &impl Fn(usize) -> std::ops::Range<usize>,
    (m, l, acc): (&mut [f32], &mut [f32], &mut [f32]),
    p: &mut [f32],
) {
    let rows = m.len();
    assert!(
        d.is_multiple_of(16),
        "sequential: d must be a multiple of 16"
    );
    assert!(
        q.len() >= rows * d && acc.len() >= rows * d && l.len() >= rows && p.len() >= rows,
        "sequential: rows too short"
    );
    assert!(
        k.len() >= span.end * d && v.len() >= span.end * d,
        "sequential: keys too short"
    );
    // SAFETY (every pointer below): row r < rows and key j < span.end stay inside q, acc,
    // k and v by the asserts above.
    for j in span {
        let (kj, vj) = (k.as_ptr().add(j * d), v.as_ptr().add(j * d));
        for r in 0..rows {
            if !range(r).contains(&j) {
                p[r] = 0.0;
                continue;
            }
            let s = key_score(q.as_ptr().add(r * d), kj, d, scale);
            let m_new = m[r].max(s);
            let ar = acc.as_mut_ptr().add(r * d);
            if m_new > m[r] {
                let c = (m[r] - m_new).exp();
                l[r] *= c;
                let cv = _mm512_set1_ps(c);
                for x in (0..d).step_by(16) {
                    _mm512_storeu_ps(ar.add(x), _mm512_mul_ps(_mm512_loadu_ps(ar.add(x)), cv));
                }
                m[r] = m_new;
            }
            p[r] = (s - m_new).exp();
            l[r] += p[r];
        }
        // acc_r += p_r v as `pv_strip` adds one key: the product rounded (an FMA from zero),
        // then added.
        for r in 0..rows {
            let (w, ar) = (_mm512_set1_ps(p[r]), acc.as_mut_ptr().add(r * d));
            for x in (0..d).step_by(16) {
                let pv = _mm512_fmadd_ps(w, T::load16(vj.add(x)), _mm512_setzero_ps());
                _mm512_storeu_ps(ar.add(x), _mm512_add_ps(_mm512_loadu_ps(ar.add(x)), pv));
            }
        }
    }
}

/// `R` rows x `C` vectors of 16 columns (from column `c`) of acc += `vs` x P V over `keys`
/// keys.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn pv_strip<T: Elem16, const R: usize, const C: usize>(
    p: *const f32,
    stride: usize,
    v: *const T,
    keys: usize,
    d: usize,
    vs: __m512,
    acc: *mut f32,
    c: usize,
) {
    let mut a = [[_mm512_setzero_ps(); C]; R];
    for j in 0..keys {
        let vj = v.add(j * d + c);
        let mut vv = [_mm512_setzero_ps(); C];
        for x in 0..C {
            vv[x] = T::load16(vj.add(16 * x));
        }
        for r in 0..R {
            let w = _mm512_set1_ps(*p.add(r * stride + j));
            for x in 0..C {
                a[r][x] = _mm512_fmadd_ps(w, vv[x], a[r][x]);
            }
        }
    }
    for r in 0..R {
        for x in 0..C {
            let at = acc.add(r * d + c + 16 * x);
            let sum = if T::SCALED {
                _mm512_fmadd_ps(a[r][x], vs, _mm512_loadu_ps(at))
            } else {
                _mm512_add_ps(_mm512_loadu_ps(at), a[r][x])
            };
            _mm512_storeu_ps(at, sum);
        }
    }
}

/// `R` rows of acc += `vs` x P V over all keys, by chunks of keys and strips of columns.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn pv_rows<T: Elem16, const R: usize>(
    p: *const f32,
    stride: usize,
    v: *const T,
    keys: usize,
    d: usize,
    vs: __m512,
    acc: *mut f32,
) {
    let mut j0 = 0;
    while j0 < keys {
        let kn = KEY_CHUNK.min(keys - j0);
        let (pj, vj) = (p.add(j0), v.add(j0 * d));
        let mut c = 0;
        while c + 64 <= d {
            pv_strip::<T, R, 4>(pj, stride, vj, kn, d, vs, acc, c);
            c += 64;
        }
        while c < d {
            pv_strip::<T, R, 1>(pj, stride, vj, kn, d, vs, acc, c);
            c += 16;
        }
        j0 += kn;
    }
}

/// `acc_r += v_scale * sum_j p[r * stride + j] * v_j` (the contract of
/// `vecops::accumulate`, with the values' scale); `v_scale` is read only for FP8 codes
/// (`Elem16::SCALED`), f32 and bf16 values are added as they are.
///
/// # Safety
/// AVX-512 F must be available; `d` must be a multiple of 16.
#[target_feature(enable = "avx512f")]
pub unsafe fn accumulate<T: Elem16>(
    p: &[f32],
    stride: usize,
    v: &[T],
    v_scale: f32,
    d: usize,
    acc: &mut [f32],
) {
    if d == 0 {
        return;
    }
    assert!(
        d.is_multiple_of(16),
        "accumulate: d must be a multiple of 16"
    );
    let rows = acc.len() / d;
    let keys = v.len() / d;
    assert!(
        rows == 0 || keys == 0 || p.len() >= (rows - 1) * stride + keys,
        "accumulate: weights too short"
    );
    // SAFETY: rows * d <= acc.len(), keys * d <= v.len(), and the weights of row r and key
    // j are inside p by the assert.
    let vs = _mm512_set1_ps(v_scale);
    let mut r = 0;
    while r < rows {
        let (pr, ar) = (p.as_ptr().add(r * stride), acc.as_mut_ptr().add(r * d));
        if r + 4 <= rows {
            pv_rows::<T, 4>(pr, stride, v.as_ptr(), keys, d, vs, ar);
            r += 4;
        } else {
            pv_rows::<T, 1>(pr, stride, v.as_ptr(), keys, d, vs, ar);
            r += 1;
        }
    }
}

/// The sum of `x` with one 64-byte load per cache line and four independent accumulators:
/// the read loop whose rate is decode's roofline (`vecops::read_sum`).
///
/// # Safety
/// AVX-512 F must be available.
#[target_feature(enable = "avx512f")]
pub unsafe fn sum(x: &[f32]) -> f32 {
    let mut a = [_mm512_setzero_ps(); 4];
    let mut blocks = x.chunks_exact(64);
    for b in &mut blocks {
        // SAFETY: each block is 64 floats, four vectors of 16.
        for (i, acc) in a.iter_mut().enumerate() {
            *acc = _mm512_add_ps(*acc, _mm512_loadu_ps(b.as_ptr().add(16 * i)));
        }
    }
    let total = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
    _mm512_reduce_add_ps(total) + blocks.remainder().iter().sum::<f32>()
}
