//! Vector primitives of the decode kernels: a block of scaled dot products (one key against
//! a few query rows), the matching value accumulation (acc_r += p_r * v), and bf16/f16 ->
//! f32 widening. Each is one streaming pass, O(rows * keys * d), no allocation. On x86_64
//! with AVX2+FMA (checked at run time) the same loops are compiled for those units: decode
//! reads every key once and must keep up with memory, which SSE2 alone does not on 2 cores.

use half::{bf16, f16};

use crate::problem::Tensor;

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

/// `scores[r * stride + j] = scale * q_r . k_j` for every query row r of `q` and every key j
/// of `k` (row-major, `d` long each).
pub fn scores(q: &[f32], k: &[f32], dims: Dims, scale: f32, scores: &mut [f32], stride: usize) {
    #[cfg(target_arch = "x86_64")]
    if fast() {
        // SAFETY: AVX2 and FMA were detected on this CPU just above.
        unsafe { scores_avx2(q, k, dims, scale, scores, stride) };
        return;
    }
    scores_body(q, k, dims, scale, scores, stride);
}

/// `acc_r += sum_j p[r * stride + j] * v_j` for every row r of `acc` (each `d` long) and
/// every value row j of `v`. Zero weights (masked keys) are skipped.
pub fn accumulate(p: &[f32], stride: usize, v: &[f32], d: usize, acc: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if fast() {
        // SAFETY: AVX2 and FMA were detected on this CPU just above.
        unsafe { accumulate_avx2(p, stride, v, d, acc) };
        return;
    }
    accumulate_body(p, stride, v, d, acc);
}

/// `len` elements of `t` from `offset`, as f32: borrowed for f32 storage, widened into
/// `scratch[..len]` otherwise (bf16 by a shift of its bits, which vectorizes).
pub fn widen<'a>(t: &'a Tensor, offset: usize, len: usize, scratch: &'a mut [f32]) -> &'a [f32] {
    match t {
        Tensor::F32(v) => &v[offset..offset + len],
        Tensor::Bf16(v) => {
            widen_bf16(&v[offset..offset + len], &mut scratch[..len]);
            &scratch[..len]
        }
        Tensor::F16(v) => {
            widen_f16(&v[offset..offset + len], &mut scratch[..len]);
            &scratch[..len]
        }
    }
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

fn widen_f16(src: &[f16], dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    src.convert_to_f32_slice(dst);
}

#[cfg(target_arch = "x86_64")]
fn fast() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn scores_avx2(q: &[f32], k: &[f32], dims: Dims, scale: f32, s: &mut [f32], stride: usize) {
    scores_body(q, k, dims, scale, s, stride)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn accumulate_avx2(p: &[f32], stride: usize, v: &[f32], d: usize, acc: &mut [f32]) {
    accumulate_body(p, stride, v, d, acc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn widen_bf16_avx2(src: &[bf16], dst: &mut [f32]) {
    widen_bf16_body(src, dst)
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
        *d = f32::from_bits((s.to_bits() as u32) << 16);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_and_accumulate_match_plain_loops_on_ragged_sizes() {
        for d in [1, 3, 16, 17, 64, 130] {
            let (rows, keys) = (3, 5);
            let q: Vec<f32> = (0..rows * d).map(|i| (i % 7) as f32 * 0.3 - 1.0).collect();
            let k: Vec<f32> = (0..keys * d).map(|i| (i % 5) as f32 * 0.2 - 0.4).collect();
            let mut s = vec![0.0f32; rows * (keys + 2)];
            scores(&q, &k, Dims { rows, keys, d }, 0.5, &mut s, keys + 2);
            for r in 0..rows {
                for j in 0..keys {
                    let want: f32 = 0.5 * (0..d).map(|x| q[r * d + x] * k[j * d + x]).sum::<f32>();
                    assert!((s[r * (keys + 2) + j] - want).abs() < 1e-4, "d {d}");
                }
            }
            let mut acc = vec![1.0f32; rows * d];
            accumulate(&s, keys + 2, &k, d, &mut acc);
            for r in 0..rows {
                for x in 0..d {
                    let want: f32 = 1.0
                        + (0..keys)
                            .map(|j| s[r * (keys + 2) + j] * k[j * d + x])
                            .sum::<f32>();
                    assert!((acc[r * d + x] - want).abs() < 1e-3, "d {d}");
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
        }
    }
}
