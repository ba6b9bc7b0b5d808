//! Vector primitives of the decode kernels: a block of scaled dot products (one key against
//! a few query rows), the matching value accumulation (acc_r += p_r * v), and the bf16/f16
//! -> f32 widening every CPU kernel loads low-precision tiles with. Each is one streaming
//! pass, O(rows * keys * d), no allocation. The kernel path (`Isa`) picks the loops: the
//! AVX-512 ones (`decode_avx512`) on the avx512 paths, hand-blocked AVX2+FMA intrinsics on
//! avx2 (and for head dimensions that are not whole 16-lane vectors), plain loops on
//! portable: decode reads every key once and must keep up with memory, which the
//! compiler's own vectorization of these loops (2-wide here) does not on 2 cores.

use half::{bf16, f16};

#[cfg(target_arch = "x86_64")]
use super::decode_avx512;
use super::spread::Spread;
use crate::problem::{Fp8Format, Isa, Tensor};

/// Lanes of the independent accumulators: enough for the compiler to keep two 8-wide
/// FMA chains in flight per dot product.
const LANES: usize = 16;

/// Shape of a block of scores: `rows` query rows against `keys` keys, each `d` long.
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub rows: usize,
    pub keys: usize,
    pub d: usize,
}

/// Keys or values as the kernels read them: f32 and bf16 in place (bf16 is widened in
/// registers), f16 widened into scratch first; FP8 codes with their scale in place on the
/// AVX-512 loops (`fp8_in_registers`), which widen them in registers.
#[derive(Clone, Copy, Debug)]
pub enum Elems<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
    /// Codes, their format and the scale every code's value is multiplied by.
    Fp8(&'a [u8], Fp8Format, f32),
}

impl<'a> Elems<'a> {
    /// `len` elements of `t` from `offset`.
    pub fn of(t: &'a Tensor, offset: usize, len: usize, scratch: &'a mut [f32]) -> Elems<'a> {
        match t {
            Tensor::F32(v) => Elems::F32(&v[offset..offset + len]),
            Tensor::Bf16(v) => Elems::Bf16(&v[offset..offset + len]),
            Tensor::F16(v) => {
                widen_f16(&v[offset..offset + len], &mut scratch[..len]);
                Elems::F32(&scratch[..len])
            }
        }
    }
}

/// `scores[r * stride + j] = scale * q_r . k_j` for every query row r of `q` and every key j
/// of `k` (row-major, `d` long each), on the kernel path `isa`.
pub fn scores(
    isa: Isa,
    q: &[f32],
    k: Elems,
    dims: Dims,
    scale: f32,
    scores: &mut [f32],
    stride: usize,
) {
    scores_fetching(isa, q, k, dims, scale, scores, stride, &mut Spread::none());
}

/// Whether `scores_fetching` (and `scores_bf16`) spread their fetches over the keys on the
/// kernel path `isa` (every vector loop); the portable loop takes them all before the
/// first key.
pub fn fetches_per_key(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    return isa != Isa::Portable && fast();
    #[cfg(not(target_arch = "x86_64"))]
    return {
        let _ = isa;
        false
    };
}

/// `scores`, bringing the lines of `fetch` into L2 meanwhile: an equal share before each
/// key where `fetches_per_key` (on the AVX-512 loops, during the first query row's pass),
/// all before the first key elsewhere and for FP8 codes.
#[allow(clippy::too_many_arguments)]
pub fn scores_fetching(
    isa: Isa,
    q: &[f32],
    k: Elems,
    dims: Dims,
    scale: f32,
    scores: &mut [f32],
    stride: usize,
    fetch: &mut Spread,
) {
    #[cfg(target_arch = "x86_64")]
    if wide(isa, dims.d) {
        // SAFETY: AVX-512 F was detected (`wide`), and d is a multiple of 16.
        unsafe {
            match k {
                Elems::F32(k) => decode_avx512::scores(q, k, dims, scale, scores, stride, fetch),
                Elems::Bf16(k) => decode_avx512::scores(q, k, dims, scale, scores, stride, fetch),
                Elems::Fp8(c, f, s8) => {
                    fetch.all();
                    fp8_scores(q, c, f, s8, dims, scale, scores, stride)
                }
            }
        };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if fetches_per_key(isa) {
        // SAFETY: AVX2 and FMA were detected on this CPU (`fast`).
        unsafe {
            match k {
                Elems::F32(k) => avx2::scores(q, k, dims, scale, scores, stride, fetch),
                Elems::Bf16(k) => avx2::scores(q, k, dims, scale, scores, stride, fetch),
                Elems::Fp8(c, f, s8) => {
                    let k = fp8_vec(c, f, s8);
                    avx2::scores(q, &k, dims, scale, scores, stride, fetch)
                }
            }
        };
        return;
    }
    fetch.all();
    match k {
        Elems::F32(k) => scores_body(q, k, dims, scale, scores, stride),
        Elems::Bf16(k) => {
            let k: Vec<f32> = k.iter().map(|x| x.to_f32()).collect();
            scores_body(q, &k, dims, scale, scores, stride)
        }
        Elems::Fp8(c, f, s8) => scores_body(q, &fp8_vec(c, f, s8), dims, scale, scores, stride),
    }
}

/// `scores` of FP8 keys on the AVX-512 loops, out of line so that the f32 and bf16
/// dispatch stays as small as it was (decode-online calls it once per key).
///
/// # Safety
/// AVX-512 F must be available and `dims.d` a multiple of 16 (`wide`).
#[cfg(target_arch = "x86_64")]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
unsafe fn fp8_scores(
    q: &[f32],
    codes: &[u8],
    format: Fp8Format,
    s8: f32,
    dims: Dims,
    scale: f32,
    scores: &mut [f32],
    stride: usize,
) {
    match format {
        Fp8Format::Fp8e4m3 => {
            let c = decode_avx512::as_e4m3(codes);
            let unit = s8 * decode_avx512::E4M3_UNIT;
            decode_avx512::scores(
                q,
                c,
                dims,
                scale * unit,
                scores,
                stride,
                &mut Spread::none(),
            )
        }
        Fp8Format::Fp8e5m2 => {
            let c = decode_avx512::as_e5m2(codes);
            decode_avx512::scores(q, c, dims, scale * s8, scores, stride, &mut Spread::none())
        }
    }
}

/// `accumulate` of FP8 values on the AVX-512 loops, out of line as `fp8_scores`.
///
/// # Safety
/// AVX-512 F must be available and `d` a multiple of 16 (`wide`).
#[cfg(target_arch = "x86_64")]
#[inline(never)]
unsafe fn fp8_accumulate(
    p: &[f32],
    stride: usize,
    codes: &[u8],
    format: Fp8Format,
    s8: f32,
    d: usize,
    acc: &mut [f32],
) {
    match format {
        Fp8Format::Fp8e4m3 => {
            let c = decode_avx512::as_e4m3(codes);
            let unit = s8 * decode_avx512::E4M3_UNIT;
            decode_avx512::accumulate(p, stride, c, unit, d, acc)
        }
        Fp8Format::Fp8e5m2 => {
            decode_avx512::accumulate(p, stride, decode_avx512::as_e5m2(codes), s8, d, acc)
        }
    }
}

/// FP8 codes widened with their scale, for the loops that do not read them in place
/// (callers widen into scratch before reaching those, `fp8_in_registers`).
fn fp8_vec(codes: &[u8], format: Fp8Format, scale: f32) -> Vec<f32> {
    let mut w = vec![0.0f32; codes.len()];
    super::fp8::widen(codes, format, scale, &mut w);
    w
}

/// Whether `scores_bf16` runs here (AVX512-BF16, e.g. Zen 4, Sapphire Rapids).
pub fn has_bf16_dot() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `scores` for bf16 queries (`q`, rows of `d` bf16 bit patterns) against bf16 keys, with
/// `vdpbf16ps`: products of bf16 are exact in f32 and accumulate in f32, so this is the
/// arithmetic of the f32 path with a quarter of the instructions. Callers check
/// `has_bf16_dot` (otherwise the portable path runs).
pub fn scores_bf16(
    q: &[u16],
    k: &[bf16],
    dims: Dims,
    scale: f32,
    s: &mut [f32],
    stride: usize,
    fetch: &mut Spread,
) {
    #[cfg(target_arch = "x86_64")]
    if has_bf16_dot() {
        // SAFETY: the required AVX-512 features were detected just above.
        unsafe { avx512::scores(q, k, dims, scale, s, stride, fetch) };
        return;
    }
    fetch.all();
    let qf: Vec<f32> = q.iter().map(|&b| bf16_to_f32(bf16::from_bits(b))).collect();
    let kf: Vec<f32> = k.iter().map(|x| x.to_f32()).collect();
    scores_body(&qf, &kf, dims, scale, s, stride);
}

/// The bf16 bit patterns of `src`'s values into `dst` (f32 scratch viewed as u16 pairs), or
/// `None` if some value is not exactly a bf16 (then the bf16 dot path must not be used).
pub fn to_bf16_bits<'a>(src: &[f32], dst: &'a mut [f32]) -> Option<&'a [u16]> {
    let n = src.len();
    assert!(2 * dst.len() >= n, "to_bf16_bits: scratch too short");
    // SAFETY: `dst` is at least n / 2 f32s, so n u16s fit; u16 needs less alignment than f32
    // and every bit pattern is a valid u16.
    let bits: &mut [u16] =
        unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr() as *mut u16, n) };
    let mut exact = true;
    for (b, x) in bits.iter_mut().zip(src) {
        let v = x.to_bits();
        exact &= v & 0xffff == 0;
        *b = (v >> 16) as u16;
    }
    exact.then_some(&*bits)
}

/// Rabe–Staats' one key at a time (`decode::attend_sequential`) over the keys `span` of
/// the contiguous run of `k` and `v` from element `base`, in one AVX-512 loop, where the
/// path `isa` has it for `d` and the storage is not FP8 (`fp8`); `false` (nothing done)
/// otherwise, and the caller runs its key-by-key loop.
#[allow(clippy::too_many_arguments)]
pub fn sequential(
    isa: Isa,
    q: &[f32],
    (k, v, base): (&Tensor, &Tensor, usize),
    d: usize,
    scale: f32,
    span: std::ops::Range<usize>,
    range: &impl Fn(usize) -> std::ops::Range<usize>,
    state: (&mut [f32], &mut [f32], &mut [f32]),
    p: &mut [f32],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if wide(isa, d) {
        let n = span.end * d;
        // The same call for each storage type, the run sliced to the keys it reads.
        macro_rules! on {
            ($k:expr, $v:expr) => {
                decode_avx512::sequential(
                    q,
                    &$k[base..base + n],
                    &$v[base..base + n],
                    d,
                    scale,
                    span,
                    range,
                    state,
                    p,
                )
            };
        }
        // SAFETY: AVX-512 F was detected (`wide`), and d is a multiple of 16.
        unsafe {
            match (k, v) {
                (Tensor::F32(k), Tensor::F32(v)) => on!(k, v),
                (Tensor::Bf16(k), Tensor::Bf16(v)) => on!(k, v),
                (Tensor::F16(k), Tensor::F16(v)) => on!(k, v),
                _ => return false,
            }
        }
        return true;
    }
    let _ = (isa, q, k, v, base, d, scale, span, range, state, p);
    false
}

/// `acc_r += sum_j p[r * stride + j] * v_j` for every row r of `acc` (each `d` long) and
/// every value row j of `v`, on the kernel path `isa`.
pub fn accumulate(isa: Isa, p: &[f32], stride: usize, v: Elems, d: usize, acc: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if wide(isa, d) {
        // SAFETY: AVX-512 F was detected (`wide`), and d is a multiple of 16.
        unsafe {
            match v {
                Elems::F32(v) => decode_avx512::accumulate(p, stride, v, 1.0, d, acc),
                Elems::Bf16(v) => decode_avx512::accumulate(p, stride, v, 1.0, d, acc),
                Elems::Fp8(c, f, s8) => fp8_accumulate(p, stride, c, f, s8, d, acc),
            }
        };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable && fast() {
        // SAFETY: AVX2 and FMA were detected on this CPU just above.
        unsafe {
            match v {
                Elems::F32(v) => avx2::accumulate(p, stride, v, d, acc),
                Elems::Bf16(v) => avx2::accumulate(p, stride, v, d, acc),
                Elems::Fp8(c, f, s8) => avx2::accumulate(p, stride, &fp8_vec(c, f, s8), d, acc),
            }
        };
        return;
    }
    match v {
        Elems::F32(v) => accumulate_body(p, stride, v, d, acc),
        Elems::Bf16(v) => {
            let v: Vec<f32> = v.iter().map(|x| x.to_f32()).collect();
            accumulate_body(p, stride, &v, d, acc)
        }
        Elems::Fp8(c, f, s8) => accumulate_body(p, stride, &fp8_vec(c, f, s8), d, acc),
    }
}

/// One bf16 value widened to f32, exactly: its bits are the f32's upper half (a shift,
/// without `half`'s per-value NaN check; a signalling NaN stays a NaN but is not quieted).
#[inline(always)]
pub fn bf16_to_f32(x: bf16) -> f32 {
    f32::from_bits((x.to_bits() as u32) << 16)
}

/// `len` elements of `t` from `offset`, as f32: borrowed for f32 storage, widened into
/// `scratch[..len]` otherwise (see [`widen_into`]). How every CPU kernel loads tiles of
/// low-precision inputs.
pub fn widen<'a>(t: &'a Tensor, offset: usize, len: usize, scratch: &'a mut [f32]) -> &'a [f32] {
    match t {
        Tensor::F32(v) => &v[offset..offset + len],
        _ => {
            widen_into(t, offset, &mut scratch[..len]);
            &scratch[..len]
        }
    }
}

/// `dst.len()` elements of `t` from `offset`, as f32, into `dst`: copied for f32, bf16 by a
/// shift of its bits (8 at a time with AVX2; a signalling NaN stays a NaN but is not
/// quieted, unlike `half`'s per-element conversion, whose NaN check took 10% of a bf16
/// flash forward on AVX2), f16 by `half` (F16C where the CPU has it).
pub fn widen_into(t: &Tensor, offset: usize, dst: &mut [f32]) {
    let n = dst.len();
    match t {
        Tensor::F32(v) => dst.copy_from_slice(&v[offset..offset + n]),
        Tensor::Bf16(v) => widen_bf16(&v[offset..offset + n], dst),
        Tensor::F16(v) => widen_f16(&v[offset..offset + n], dst),
    }
}

/// The largest element (-inf for an empty row).
pub fn row_max(row: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if fast() {
        // SAFETY: AVX2 and FMA were detected on this CPU just above.
        return unsafe { avx2::row_max(row) };
    }
    row.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// Replaces each x by exp(x - m) and returns their sum; -inf (masked) becomes exactly 0, and
/// m = -inf zeroes the row. The AVX2 path evaluates exp with Cephes' degree-6 polynomial
/// after range reduction (about 1 ulp), 8 lanes at a time.
pub fn exp_sub_sum(row: &mut [f32], m: f32) -> f32 {
    if m == f32::NEG_INFINITY {
        row.fill(0.0);
        return 0.0;
    }
    #[cfg(target_arch = "x86_64")]
    if fast() {
        // SAFETY: AVX2 and FMA were detected on this CPU just above.
        return unsafe { avx2::exp_sub_sum(row, m) };
    }
    super::softmax::exp_sub_sum(row, m)
}

/// Asks the cache to start loading elements `offset..offset + len` of `t` into L1
/// (`near`) or L2 (no effect where prefetch instructions are unavailable). Decode issues it
/// for the keys and values it will reach next, so memory keeps streaming while the
/// current ones are computed on.
pub fn prefetch(t: &Tensor, offset: usize, len: usize, near: bool) {
    let (ptr, size, n) = match t {
        Tensor::F32(v) => (v.as_ptr() as *const i8, 4, v.len()),
        Tensor::Bf16(v) => (v.as_ptr() as *const i8, 2, v.len()),
        Tensor::F16(v) => (v.as_ptr() as *const i8, 2, v.len()),
    };
    prefetch_raw(ptr, size, n, offset, len, near);
}

/// Elements `offset..offset + len` (clamped to `n`) of `size` bytes each from `ptr`.
#[inline]
fn prefetch_raw(ptr: *const i8, size: usize, n: usize, offset: usize, len: usize, near: bool) {
    #[cfg(target_arch = "x86_64")]
    {
        let end = (offset + len).min(n) * size;
        let mut at = offset.min(n) * size;
        while at < end {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
            // SAFETY: `at` is inside the allocation of `n` elements at `ptr`; prefetch never
            // faults anyway.
            unsafe {
                if near {
                    _mm_prefetch::<_MM_HINT_T0>(ptr.add(at))
                } else {
                    _mm_prefetch::<_MM_HINT_T1>(ptr.add(at))
                }
            };
            at += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ptr, size, n, offset, len, near);
}

fn widen_bf16(src: &[bf16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if fast() {
        // SAFETY: AVX2 and FMA were detected on this CPU just above.
        unsafe { widen_bf16_avx2(src, dst) };
        return;
    }
    widen_bf16_body(src, dst);
}

/// f16 to f32 by F16C (`vcvtph2ps`, 8 at a time, inlined into the loop) where the CPU has
/// it, else `half`'s conversion: `half` dispatches per call and converts 8 values per
/// non-inlined call, a quarter of flash `fwd+bwd`'s time on f16 at the CI's small shapes.
fn widen_f16(src: &[f16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if fast() && std::arch::is_x86_feature_detected!("f16c") {
        // SAFETY: AVX2, FMA and F16C were detected on this CPU just above.
        unsafe { avx2::widen_f16(src, dst) };
        return;
    }
    use half::slice::HalfFloatSliceExt;
    src.convert_to_f32_slice(dst);
}

/// The sum of `x` read at the widest loads of the kernel path `isa`: the loop whose rate
/// the calibration records as the read bandwidth (decode only reads its cache, so that is
/// its roofline). Narrow loads cost instructions per cache line and so keep fewer lines in
/// flight: a 4-lane loop reads about 0.6 of what 16 lanes do on one core of a Xeon.
pub fn read_sum(isa: Isa, x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() && isa.available() {
        // SAFETY: AVX-512 F was detected just above.
        return unsafe { decode_avx512::sum(x) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable && fast() {
        // SAFETY: AVX2 and FMA were detected on this CPU just above.
        return unsafe { avx2::sum(x) };
    }
    let mut lanes = [0.0f32; 16];
    let mut blocks = x.chunks_exact(16);
    for b in &mut blocks {
        for (l, v) in lanes.iter_mut().zip(b) {
            *l += v;
        }
    }
    lanes.iter().sum::<f32>() + blocks.remainder().iter().sum::<f32>()
}

/// Whether the AVX-512 loops (`decode_avx512`) run: an AVX-512 path this CPU has, and a
/// head dimension of whole 16-lane vectors (others take the AVX2 loops).
#[cfg(target_arch = "x86_64")]
fn wide(isa: Isa, d: usize) -> bool {
    isa.avx512() && isa.available() && d.is_multiple_of(16)
}

/// Whether `scores` and `accumulate` read FP8 codes in place (`Elems::Fp8`) on the kernel
/// path `isa` at head dimension `d`; elsewhere callers widen them into scratch first.
pub fn fp8_in_registers(isa: Isa, d: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    return wide(isa, d);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, d);
        false
    }
}

#[cfg(target_arch = "x86_64")]
fn fast() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn widen_bf16_avx2(src: &[bf16], dst: &mut [f32]) {
    avx2::widen_bf16(src, dst)
}

/// AVX-512 BF16: dot products of bf16 rows, 32 pairs per instruction. Built only by
/// compilers with stable AVX-512 intrinsics (1.89+; `build.rs` sets the cfg), so the MSRV
/// holds without it.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)] // rows index the accumulator array
#[allow(clippy::incompatible_msrv)] // gated on the compiler version by build.rs
mod avx512 {
    use super::{bf16, Dims, Spread};
    use std::arch::x86_64::*;

    /// 32 bf16 (as 16-bit patterns) from `p`, the first `n` of them (rest zero).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn load32(p: *const u16, n: usize) -> __m512bh {
        let v = if n >= 32 {
            _mm512_loadu_si512(p as *const _)
        } else {
            _mm512_maskz_loadu_epi16(((1u64 << n) - 1) as __mmask32, p as *const i16)
        };
        std::mem::transmute::<__m512i, __m512bh>(v)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn dots<const R: usize>(q: *const u16, kj: *const u16, d: usize) -> [f32; R] {
        let mut acc = [_mm512_setzero_ps(); R];
        let mut x = 0;
        while x < d {
            let n = (d - x).min(32);
            let kv = load32(kj.add(x), n);
            for r in 0..R {
                acc[r] = _mm512_dpbf16_ps(acc[r], load32(q.add(r * d + x), n), kv);
            }
            x += 32;
        }
        let mut out = [0.0f32; R];
        for r in 0..R {
            out[r] = _mm512_reduce_add_ps(acc[r]);
        }
        out
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub unsafe fn scores(
        q: &[u16],
        k: &[bf16],
        dims: Dims,
        scale: f32,
        s: &mut [f32],
        stride: usize,
        fetch: &mut Spread,
    ) {
        let Dims { rows, keys, d } = dims;
        assert!(
            q.len() >= rows * d && k.len() >= keys * d,
            "scores: inputs too short"
        );
        assert!(
            rows == 0 || keys == 0 || s.len() >= (rows - 1) * stride + keys,
            "scores: output too short"
        );
        // SAFETY: rows r < rows and keys j < keys stay inside q, k and s by the asserts;
        // bf16 is a 16-bit pattern in memory.
        let kp = k.as_ptr() as *const u16;
        for j in 0..keys {
            fetch.step();
            let kj = kp.add(j * d);
            let mut r = 0;
            while r + 4 <= rows {
                let v = dots::<4>(q.as_ptr().add(r * d), kj, d);
                for (i, x) in v.iter().enumerate() {
                    *s.get_unchecked_mut((r + i) * stride + j) = scale * x;
                }
                r += 4;
            }
            while r < rows {
                let [x] = dots::<1>(q.as_ptr().add(r * d), kj, d);
                *s.get_unchecked_mut(r * stride + j) = scale * x;
                r += 1;
            }
        }
    }
}

/// AVX2 + FMA versions, register-blocked: four query rows share every key load in the
/// scores, and four rows x 16 columns of the accumulator stay in registers across a chunk
/// of keys in the value accumulation. Keys and values are f32 or bf16 (widened in
/// registers: a bf16 is the top half of an f32).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)] // rows index several register arrays in step
mod avx2 {
    use super::{bf16, Dims, Spread};
    use std::arch::x86_64::*;

    /// A stored element the kernels read 8 at a time as f32.
    pub trait Elem: Copy {
        /// # Safety
        /// `p..p + 8` must be readable; AVX2 must be available.
        unsafe fn load8(p: *const Self) -> __m256;
        fn f32(self) -> f32;
    }

    impl Elem for f32 {
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn load8(p: *const f32) -> __m256 {
            _mm256_loadu_ps(p)
        }
        fn f32(self) -> f32 {
            self
        }
    }

    impl Elem for bf16 {
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn load8(p: *const bf16) -> __m256 {
            let h = _mm_loadu_si128(p as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
        }
        fn f32(self) -> f32 {
            self.to_f32()
        }
    }

    /// Sum of the 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(v: __m256) -> f32 {
        let x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
        let x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
        _mm_cvtss_f32(x)
    }

    /// Dot products of `R` query rows (at `q`, `d` apart) with one key, two accumulators
    /// per row for independent FMA chains; the tail of d beyond a multiple of 8 is scalar.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dots<T: Elem, const R: usize>(q: *const f32, kj: *const T, d: usize) -> [f32; R] {
        let mut a = [_mm256_setzero_ps(); R];
        let mut b = [_mm256_setzero_ps(); R];
        let d16 = d / 16 * 16;
        let mut x = 0;
        while x < d16 {
            let k0 = T::load8(kj.add(x));
            let k1 = T::load8(kj.add(x + 8));
            for r in 0..R {
                let qr = q.add(r * d + x);
                a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(qr), k0, a[r]);
                b[r] = _mm256_fmadd_ps(_mm256_loadu_ps(qr.add(8)), k1, b[r]);
            }
            x += 16;
        }
        if x + 8 <= d {
            let k0 = T::load8(kj.add(x));
            for r in 0..R {
                a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(r * d + x)), k0, a[r]);
            }
            x += 8;
        }
        let mut out = [0.0f32; R];
        for r in 0..R {
            let mut t = hsum(_mm256_add_ps(a[r], b[r]));
            for y in x..d {
                t += *q.add(r * d + y) * (*kj.add(y)).f32();
            }
            out[r] = t;
        }
        out
    }

    /// `super::scores_fetching`: one share of `fetch` before each key.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn scores<T: Elem>(
        q: &[f32],
        k: &[T],
        dims: Dims,
        scale: f32,
        s: &mut [f32],
        stride: usize,
        fetch: &mut Spread,
    ) {
        let Dims { rows, keys, d } = dims;
        assert!(
            q.len() >= rows * d && k.len() >= keys * d,
            "scores: inputs too short"
        );
        assert!(
            rows == 0 || keys == 0 || s.len() >= (rows - 1) * stride + keys,
            "scores: output too short"
        );
        // SAFETY (every pointer below): row r < rows and key j < keys stay inside q, k
        // and s by the asserts above.
        for j in 0..keys {
            let kj = k.as_ptr().add(j * d);
            fetch.step();
            let mut r = 0;
            while r + 4 <= rows {
                let v = dots::<T, 4>(q.as_ptr().add(r * d), kj, d);
                for (i, x) in v.iter().enumerate() {
                    *s.get_unchecked_mut((r + i) * stride + j) = scale * x;
                }
                r += 4;
            }
            while r < rows {
                let [x] = dots::<T, 1>(q.as_ptr().add(r * d), kj, d);
                *s.get_unchecked_mut(r * stride + j) = scale * x;
                r += 1;
            }
        }
    }

    /// `R` rows x 16 columns (from column `c`) of acc += P V over all `keys` keys.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn pv_strip<T: Elem, const R: usize>(
        p: *const f32,
        stride: usize,
        v: *const T,
        keys: usize,
        d: usize,
        acc: *mut f32,
        c: usize,
    ) {
        // The chunk's sum starts from zero and is added to acc at the end: blocked
        // summation, so the error grows with keys / chunk, not with keys.
        let mut a = [_mm256_setzero_ps(); R];
        let mut b = [_mm256_setzero_ps(); R];
        for j in 0..keys {
            let v0 = T::load8(v.add(j * d + c));
            let v1 = T::load8(v.add(j * d + c + 8));
            for r in 0..R {
                let w = _mm256_broadcast_ss(&*p.add(r * stride + j));
                a[r] = _mm256_fmadd_ps(w, v0, a[r]);
                b[r] = _mm256_fmadd_ps(w, v1, b[r]);
            }
        }
        for r in 0..R {
            let (pa, pb) = (acc.add(r * d + c), acc.add(r * d + c + 8));
            _mm256_storeu_ps(pa, _mm256_add_ps(_mm256_loadu_ps(pa), a[r]));
            _mm256_storeu_ps(pb, _mm256_add_ps(_mm256_loadu_ps(pb), b[r]));
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn accumulate<T: Elem>(
        p: &[f32],
        stride: usize,
        v: &[T],
        d: usize,
        acc: &mut [f32],
    ) {
        if d == 0 {
            return;
        }
        let rows = acc.len() / d;
        let keys = v.len() / d;
        assert!(
            rows == 0 || keys == 0 || p.len() >= (rows - 1) * stride + keys,
            "accumulate: weights too short"
        );
        let d16 = d / 16 * 16;
        // SAFETY: rows * d <= acc.len(), keys * d <= v.len(), and the weights of row r and
        // key j are inside p by the assert; strips end at d16 <= d.
        let mut r = 0;
        while r < rows {
            let n = if r + 4 <= rows { 4 } else { 1 };
            let (pr, ar) = (p.as_ptr().add(r * stride), acc.as_mut_ptr().add(r * d));
            // Keys in chunks, so every strip of a chunk's rows is touched close together and
            // the chunk streams in from memory line after line.
            let mut j0 = 0;
            while j0 < keys {
                let kn = KEY_CHUNK.min(keys - j0);
                let (pj, vj) = (pr.add(j0), v.as_ptr().add(j0 * d));
                let mut c = 0;
                while c < d16 {
                    if n == 4 {
                        pv_strip::<T, 4>(pj, stride, vj, kn, d, ar, c);
                    } else {
                        pv_strip::<T, 1>(pj, stride, vj, kn, d, ar, c);
                    }
                    c += 16;
                }
                j0 += kn;
            }
            for i in 0..n {
                for j in 0..keys {
                    let w = *pr.add(i * stride + j);
                    for x in d16..d {
                        *ar.add(i * d + x) += w * (*v.as_ptr().add(j * d + x)).f32();
                    }
                }
            }
            r += n;
        }
    }

    /// Keys per chunk of the value accumulation: 16 rows of V (8 KiB at d = 128) per pass
    /// over the column strips.
    const KEY_CHUNK: usize = 16;

    /// `read_sum` on 8-lane loads, four accumulators.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn sum(x: &[f32]) -> f32 {
        let mut a = [_mm256_setzero_ps(); 4];
        let mut blocks = x.chunks_exact(32);
        for b in &mut blocks {
            // SAFETY: each block is 32 floats, four vectors of 8.
            for (i, acc) in a.iter_mut().enumerate() {
                *acc = _mm256_add_ps(*acc, _mm256_loadu_ps(b.as_ptr().add(8 * i)));
            }
        }
        let total = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
        hsum(total) + blocks.remainder().iter().sum::<f32>()
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn row_max(row: &[f32]) -> f32 {
        let n8 = row.len() / 8 * 8;
        let mut acc = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut i = 0;
        // SAFETY: i + 8 <= n8 <= row.len().
        while i < n8 {
            acc = _mm256_max_ps(acc, _mm256_loadu_ps(row.as_ptr().add(i)));
            i += 8;
        }
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        lanes
            .iter()
            .chain(&row[n8..])
            .copied()
            .fold(f32::NEG_INFINITY, f32::max)
    }

    /// exp of 8 lanes (Cephes expf): x = n ln2 + r, |r| <= ln2/2, e^r by a degree-6
    /// polynomial, 2^n through the exponent bits; below -87.3 (and -inf) the result is 0.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp8(x: __m256) -> __m256 {
        let lo = _mm256_set1_ps(-87.336_54);
        let dead = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
        let x = _mm256_max_ps(x, lo);
        let x = _mm256_min_ps(x, _mm256_set1_ps(88.376_26));
        let n = _mm256_round_ps(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
        let mut y = _mm256_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            1.666_666_5e-1,
            0.5,
        ] {
            y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
        }
        let y = _mm256_fmadd_ps(
            y,
            _mm256_mul_ps(r, r),
            _mm256_add_ps(r, _mm256_set1_ps(1.0)),
        );
        let pow2 = _mm256_slli_epi32(
            _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
            23,
        );
        let e = _mm256_mul_ps(y, _mm256_castsi256_ps(pow2));
        _mm256_andnot_ps(dead, e)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp_sub_sum(row: &mut [f32], m: f32) -> f32 {
        let n8 = row.len() / 8 * 8;
        let mv = _mm256_set1_ps(m);
        let mut sum = _mm256_setzero_ps();
        let mut i = 0;
        // SAFETY: i + 8 <= n8 <= row.len().
        while i < n8 {
            let p = row.as_mut_ptr().add(i);
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p), mv));
            _mm256_storeu_ps(p, e);
            sum = _mm256_add_ps(sum, e);
            i += 8;
        }
        let mut total = hsum(sum);
        for x in &mut row[n8..] {
            *x = (*x - m).exp();
            total += *x;
        }
        total
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn widen_bf16(src: &[bf16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let n8 = n / 8 * 8;
        let mut i = 0;
        // SAFETY: i + 8 <= n8 <= both lengths; bf16 is a u16 in memory.
        while i < n8 {
            let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
            let w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_castsi256_ps(w));
            i += 8;
        }
        for j in n8..n {
            dst[j] = src[j].to_f32();
        }
    }

    /// [`super::widen_f16`]'s F16C loop.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn widen_f16(src: &[half::f16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let n8 = n / 8 * 8;
        let mut i = 0;
        // SAFETY: i + 8 <= n8 <= both lengths; f16 is a u16 in memory.
        while i < n8 {
            let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            i += 8;
        }
        for j in n8..n {
            dst[j] = src[j].to_f32();
        }
    }
}

#[inline(always)]
fn scores_body(q: &[f32], k: &[f32], dims: Dims, scale: f32, s: &mut [f32], stride: usize) {
    let d = dims.d;
    // Key-major: each key is loaded once and stays in L1 while every query row uses it.
    for j in 0..dims.keys {
        let kj = &k[j * d..(j + 1) * d];
        for r in 0..dims.rows {
            s[r * stride + j] = scale * dot(&q[r * d..(r + 1) * d], kj);
        }
    }
}

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0.0f32;
    for (x, y) in ar.iter().zip(br) {
        tail += x * y;
    }
    // Pairwise lane sum: 8 + 4 + 2 + 1 additions.
    let mut w = LANES / 2;
    while w > 0 {
        for i in 0..w {
            acc[i] += acc[i + w];
        }
        w /= 2;
    }
    acc[0] + tail
}

#[inline(always)]
fn accumulate_body(p: &[f32], stride: usize, v: &[f32], d: usize, acc: &mut [f32]) {
    if d == 0 {
        return;
    }
    for (j, vj) in v.chunks_exact(d).enumerate() {
        for (r, ar) in acc.chunks_exact_mut(d).enumerate() {
            let w = p[r * stride + j];
            if w != 0.0 {
                for (a, x) in ar.iter_mut().zip(vj) {
                    *a += w * x;
                }
            }
        }
    }
}

#[inline(always)]
fn widen_bf16_body(src: &[bf16], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = bf16_to_f32(*s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every f16 bit pattern widens to `f16::to_f32`'s value (NaNs to a NaN), at an offset
    /// and a length that leave a ragged tail past the 8-wide loop.
    #[test]
    fn f16_widens_exactly_on_every_bit_pattern() {
        let src: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let mut dst = vec![0.0f32; src.len() - 3];
        widen_f16(&src[3..], &mut dst);
        for (x, y) in src[3..].iter().zip(&dst) {
            let want = x.to_f32();
            assert!(
                want.to_bits() == y.to_bits() || (want.is_nan() && y.is_nan()),
                "{:#06x}: {want} against {y}",
                x.to_bits()
            );
        }
    }

    /// Every path this CPU runs, f32 and bf16 keys, head dimensions of the AVX2 loops and
    /// of the AVX-512 ones (a query row in 4 or 8 registers, or any whole number of
    /// vectors), whole and partial groups of 16 keys, row blocks of 4 and single rows.
    #[test]
    fn scores_and_accumulate_match_plain_loops_on_ragged_sizes() {
        for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
            for d in [1, 3, 8, 16, 17, 48, 64, 128, 130] {
                for (keys, bf) in [(5, false), (21, false), (37, true)] {
                    let rows = 6;
                    let q: Vec<f32> = (0..rows * d).map(|i| (i % 7) as f32 * 0.3 - 1.0).collect();
                    let kb: Vec<bf16> = (0..keys * d)
                        .map(|i| bf16::from_f32((i % 5) as f32 * 0.2 - 0.4))
                        .collect();
                    let k: Vec<f32> = if bf {
                        kb.iter().map(|x| x.to_f32()).collect()
                    } else {
                        (0..keys * d).map(|i| (i % 5) as f32 * 0.2 - 0.4).collect()
                    };
                    let elems = if bf { Elems::Bf16(&kb) } else { Elems::F32(&k) };
                    let stride = keys + 2;
                    let mut s = vec![0.0f32; rows * stride];
                    scores(isa, &q, elems, Dims { rows, keys, d }, 0.5, &mut s, stride);
                    for r in 0..rows {
                        for j in 0..keys {
                            let want: f32 =
                                0.5 * (0..d).map(|x| q[r * d + x] * k[j * d + x]).sum::<f32>();
                            let got = s[r * stride + j];
                            assert!((got - want).abs() < 1e-4, "{isa:?} d {d} keys {keys}");
                        }
                        // Nothing written past the keys.
                        assert_eq!(&s[r * stride + keys..r * stride + stride], &[0.0, 0.0]);
                    }
                    let mut acc = vec![1.0f32; rows * d];
                    accumulate(isa, &s, stride, elems, d, &mut acc);
                    for r in 0..rows {
                        for x in 0..d {
                            let want: f32 = 1.0
                                + (0..keys)
                                    .map(|j| s[r * stride + j] * k[j * d + x])
                                    .sum::<f32>();
                            let got = acc[r * d + x];
                            assert!((got - want).abs() < 1e-3, "{isa:?} d {d} keys {keys}");
                        }
                    }
                }
            }
        }
    }

    /// FP8 codes read in place (widened in registers on the AVX-512 loops, the scale applied
    /// to scores and chunk sums) give what the same loops give on the codes widened with
    /// their scale first (`fp8::widen`), for every code of both formats, on every path.
    #[test]
    fn fp8_codes_read_in_place_match_the_widened_values() {
        use crate::problem::Fp8Format;
        for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
            for f in Fp8Format::ALL {
                for (d, keys, rows, scale) in [
                    (128, 37, 6, 1.0 / 448.0),
                    (64, 21, 1, 3.0),
                    (48, 16, 4, 0.01),
                    (24, 5, 3, 1.0),
                ] {
                    // Every finite code, cycled (the quantizer writes no NaN or infinity).
                    let codes: Vec<u8> = (0..keys * d)
                        .map(|i| ((i * 7) % 256) as u8)
                        .map(|c| if f.decode(c).is_finite() { c } else { 0x3c })
                        .collect();
                    let mut wide = vec![0.0f32; codes.len()];
                    super::super::fp8::widen(&codes, f, scale, &mut wide);
                    let q: Vec<f32> = (0..rows * d).map(|i| (i % 9) as f32 * 0.05 - 0.2).collect();
                    let dims = Dims { rows, keys, d };
                    let (mut got, mut want) =
                        (vec![0.0f32; rows * keys], vec![0.0f32; rows * keys]);
                    scores(
                        isa,
                        &q,
                        Elems::Fp8(&codes, f, scale),
                        dims,
                        0.7,
                        &mut got,
                        keys,
                    );
                    scores(isa, &q, Elems::F32(&wide), dims, 0.7, &mut want, keys);
                    let magnitude = |i: usize, x: &[f32]| {
                        (0..d)
                            .map(|y| (q[(i / keys) * d + y] * x[(i % keys) * d + y]).abs())
                            .sum::<f32>()
                    };
                    for i in 0..rows * keys {
                        let tol = 1e-6 * (0.7 * magnitude(i, &wide)).max(1e-30);
                        let (g, w) = (got[i], want[i]);
                        assert!(
                            (g - w).abs() <= tol,
                            "{isa:?} {f} d {d} score {i}: {g} vs {w}"
                        );
                    }
                    let p: Vec<f32> = (0..rows * keys).map(|i| (i % 5) as f32 * 0.1).collect();
                    let (mut got, mut want) = (vec![0.5f32; rows * d], vec![0.5f32; rows * d]);
                    accumulate(isa, &p, keys, Elems::Fp8(&codes, f, scale), d, &mut got);
                    accumulate(isa, &p, keys, Elems::F32(&wide), d, &mut want);
                    for r in 0..rows {
                        for x in 0..d {
                            let m: f32 = 0.5
                                + (0..keys)
                                    .map(|j| (p[r * keys + j] * wide[j * d + x]).abs())
                                    .sum::<f32>();
                            let (g, w) = (got[r * d + x], want[r * d + x]);
                            assert!(
                                (g - w).abs() <= 1e-6 * m,
                                "{isa:?} {f} d {d} acc {r},{x}: {g} vs {w}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Fetching changes no score, and every line handed over is fetched by the end, on every
    /// path and on the bf16 pairs (spread over the keys on the vector loops, at once on the
    /// portable one).
    #[test]
    fn scores_fetching_scores_the_same_and_fetches_every_line() {
        // d = 40 runs the AVX2 loop on every vector path, d = 128 the AVX-512 one where the
        // path has it; 19 keys leave a partial group of 16.
        let (rows, keys) = (6, 19);
        for d in [40, 128] {
            let q: Vec<f32> = (0..rows * d).map(|i| (i % 11) as f32 * 0.1 - 0.5).collect();
            let k: Vec<f32> = (0..keys * d)
                .map(|i| (i % 13) as f32 * 0.07 - 0.4)
                .collect();
            let kb: Vec<bf16> = k.iter().map(|&x| bf16::from_f32(x)).collect();
            let v = vec![0.0f32; keys * d];
            let lines = (keys * d * 4).div_ceil(64);
            let bits = |s: &[f32]| s.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let dims = Dims { rows, keys, d };
            for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
                for kf in [Elems::F32(&k), Elems::Bf16(&kb)] {
                    let mut plain = vec![0.0f32; rows * keys];
                    let mut fetched = vec![0.0f32; rows * keys];
                    scores(isa, &q, kf, dims, 0.3, &mut plain, keys);
                    let mut fetch = Spread::new(&v, &[0u8; 0], keys);
                    assert_eq!(fetch.left(), lines);
                    scores_fetching(isa, &q, kf, dims, 0.3, &mut fetched, keys, &mut fetch);
                    assert_eq!(fetch.left(), 0, "{isa:?} d {d}");
                    assert_eq!(bits(&plain), bits(&fetched), "{isa:?} d {d}");
                }
            }
            // The bf16 pairs (`vdpbf16ps`) as well, where the CPU has them.
            let mut qs = vec![0.0f32; rows * d];
            let qr: Vec<f32> = q.iter().map(|&x| bf16::from_f32(x).to_f32()).collect();
            let qb = to_bf16_bits(&qr, &mut qs).expect("rounded to bf16");
            let (mut plain, mut fetched) = (vec![0.0f32; rows * keys], vec![0.0f32; rows * keys]);
            scores_bf16(qb, &kb, dims, 0.3, &mut plain, keys, &mut Spread::none());
            let mut fetch = Spread::new(&v, &[0u8; 0], keys);
            scores_bf16(qb, &kb, dims, 0.3, &mut fetched, keys, &mut fetch);
            assert_eq!(fetch.left(), 0, "pairs d {d}");
            assert_eq!(bits(&plain), bits(&fetched), "pairs d {d}");
        }
    }

    /// A key's score has the same bits whether it is scored alone or in a group of 16 (the
    /// AVX-512 body reduces few keys one by one and groups by a tree, in the same order):
    /// ring and tree attention group a sequence's keys differently from one device.
    #[test]
    fn a_score_does_not_depend_on_how_the_keys_are_grouped() {
        let (rows, keys, d) = (5, 21, 128);
        let q: Vec<f32> = (0..rows * d)
            .map(|i| ((i * 37) % 101) as f32 * 0.013 - 0.6)
            .collect();
        let k: Vec<f32> = (0..keys * d)
            .map(|i| ((i * 53) % 97) as f32 * 0.017 - 0.8)
            .collect();
        for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
            let mut whole = vec![0.0f32; rows * keys];
            let dims = Dims { rows, keys, d };
            scores(isa, &q, Elems::F32(&k), dims, 0.3, &mut whole, keys);
            for j in 0..keys {
                let mut one = vec![0.0f32; rows];
                let kj = Elems::F32(&k[j * d..(j + 1) * d]);
                scores(isa, &q, kj, Dims { rows, keys: 1, d }, 0.3, &mut one, 1);
                for r in 0..rows {
                    let (a, b) = (whole[r * keys + j], one[r]);
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{isa:?} row {r} key {j}: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_read_loop_sums_every_element_on_every_path() {
        // Whole vectors, blocks of 64 and a ragged tail: 0 + 1 + ... + (n - 1).
        for n in [0, 15, 37, 64, 200] {
            let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
            for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
                assert_eq!(
                    read_sum(isa, &x),
                    (n * (n.max(1) - 1) / 2) as f32,
                    "{isa:?} {n}"
                );
            }
        }
    }

    #[test]
    fn vector_exp_is_accurate_and_masks_to_zero() {
        let mut row: Vec<f32> = (0..203).map(|i| -(i as f32) * 0.45).collect();
        row[7] = f32::NEG_INFINITY;
        row[100] = -200.0;
        let m = 0.25f32;
        // The argument x - m is rounded to f32 first, as in the kernel.
        let want: Vec<f64> = row.iter().map(|&x| ((x - m) as f64).exp()).collect();
        assert_eq!(row_max(&row), 0.0);
        let sum = exp_sub_sum(&mut row, m);
        for (i, (g, w)) in row.iter().zip(&want).enumerate() {
            assert!(
                ((*g as f64) - w).abs() <= 2.5e-7 * w.max(1e-30),
                "{i}: {g} vs {w}"
            );
        }
        assert_eq!((row[7], row[100]), (0.0, 0.0));
        let total: f64 = want.iter().sum();
        assert!((sum as f64 - total).abs() < 1e-6 * total);
        let mut dead = vec![1.0f32; 5];
        assert_eq!(exp_sub_sum(&mut dead, f32::NEG_INFINITY), 0.0);
        assert_eq!(dead, vec![0.0; 5]);
    }

    #[test]
    fn bf16_dot_path_equals_the_f32_path_on_bf16_values() {
        // Rows in 4s and alone, ragged keys and d; each key's score has the same bits
        // scored alone (ring and tree attention group a sequence's keys differently).
        let shapes = [(6, 5), (4, 16), (5, 37), (1, 40), (9, 21), (3, 3)];
        assert!(to_bf16_bits(&[0.1f32], &mut [0.0]).is_none());
        for d in [1, 7, 32, 33, 128, 130] {
            for (rows, keys) in shapes {
                let qf: Vec<f32> = (0..rows * d)
                    .map(|i| bf16::from_f32((i % 11) as f32 * 0.37 - 1.5).to_f32())
                    .collect();
                let kb: Vec<bf16> = (0..keys * d)
                    .map(|i| bf16::from_f32((i % 7) as f32 * 0.21 - 0.6))
                    .collect();
                let kf: Vec<f32> = kb.iter().map(|x| x.to_f32()).collect();
                let mut scratch = vec![0.0f32; rows * d];
                let qb = to_bf16_bits(&qf, &mut scratch).unwrap().to_vec();
                let dims = Dims { rows, keys, d };
                let (mut a, mut b) = (vec![0.0f32; rows * keys], vec![0.0f32; rows * keys]);
                scores_bf16(&qb, &kb, dims, 0.5, &mut a, keys, &mut Spread::none());
                scores(Isa::Avx2, &qf, Elems::F32(&kf), dims, 0.5, &mut b, keys);
                let what = format!("d {d} rows {rows} keys {keys}");
                for (x, y) in a.iter().zip(&b) {
                    assert!(
                        (x - y).abs() <= 1e-5 * y.abs().max(1.0),
                        "{what}: {x} vs {y}"
                    );
                }
                for j in 0..keys {
                    let one = Dims { rows, keys: 1, d };
                    let mut alone = vec![0.0f32; rows];
                    scores_bf16(
                        &qb,
                        &kb[j * d..],
                        one,
                        0.5,
                        &mut alone,
                        1,
                        &mut Spread::none(),
                    );
                    for r in 0..rows {
                        let x = a[r * keys + j];
                        assert_eq!(alone[r].to_bits(), x.to_bits(), "{what}: {r}, {j} alone");
                    }
                }
            }
        }
    }

    #[test]
    fn widening_is_exact_for_every_storage_dtype() {
        let values: Vec<f32> = (0..37).map(|i| i as f32 * 0.37 - 5.0).collect();
        for dtype in crate::problem::DType::ALL {
            let t = Tensor::from_f32(values.clone(), dtype);
            let mut scratch = vec![0.0f32; 37];
            let got = widen(&t, 2, 30, &mut scratch).to_vec();
            for (i, g) in got.iter().enumerate() {
                assert_eq!(*g as f64, t.get_f64(2 + i));
            }
            // Infinities, signed zeros and NaN survive, in whole vectors and the tail.
            let mut edge = vec![1.5f32; 19];
            for (i, x) in [f32::INFINITY, -0.0, f32::NAN, f32::NEG_INFINITY]
                .into_iter()
                .enumerate()
            {
                edge[3 + i] = x;
                edge[15 + i] = x;
            }
            let t = Tensor::from_f32(edge.clone(), dtype);
            let mut got = vec![0.0f32; 19];
            widen_into(&t, 0, &mut got);
            for (g, want) in got.iter().zip(&edge) {
                if want.is_nan() {
                    assert!(g.is_nan(), "{dtype:?}: NaN widened to {g}");
                } else {
                    assert_eq!(g.to_bits(), want.to_bits(), "{dtype:?}");
                }
            }
        }
    }
}
