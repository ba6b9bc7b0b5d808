//! Portable path: plain Rust on `[f32; 8]` "vectors" (the compiler may map them to whatever
//! SIMD the target has), the same tiles, loop order and exp as the intrinsic paths. It is
//! the fallback on CPUs without AVX2 and a readable reference for the others.

use super::exp2_scalar;

pub type V = [f32; W];
/// Number of active lanes (a prefix).
pub type Mask = usize;
pub const W: usize = 8;

#[inline(always)]
unsafe fn zero() -> V {
    [0.0; W]
}

#[inline(always)]
unsafe fn splat(x: f32) -> V {
    [x; W]
}

#[inline(always)]
unsafe fn bcast(p: *const f32) -> V {
    [*p; W]
}

#[inline(always)]
unsafe fn load(p: *const f32) -> V {
    (p as *const V).read_unaligned()
}

#[inline(always)]
unsafe fn store(p: *mut f32, v: V) {
    (p as *mut V).write_unaligned(v)
}

/// A plain store: portable Rust has no non-temporal store.
#[inline(always)]
unsafe fn stream(p: *mut f32, v: V) {
    store(p, v)
}

/// Nothing to order: [`stream`] is a plain store.
#[inline(always)]
unsafe fn fence() {}

#[inline(always)]
unsafe fn mask_first(n: usize) -> Mask {
    n.min(W)
}

#[inline(always)]
unsafe fn load_m(p: *const f32, m: Mask) -> V {
    let mut v = [0.0; W];
    for (i, x) in v.iter_mut().enumerate().take(m) {
        *x = *p.add(i);
    }
    v
}

#[inline(always)]
unsafe fn store_m(p: *mut f32, v: V, m: Mask) {
    for (i, x) in v.iter().enumerate().take(m) {
        *p.add(i) = *x;
    }
}

#[inline(always)]
unsafe fn blend_m(m: Mask, a: V, b: V) -> V {
    std::array::from_fn(|i| if i < m { a[i] } else { b[i] })
}

#[inline(always)]
unsafe fn add(a: V, b: V) -> V {
    std::array::from_fn(|i| a[i] + b[i])
}

#[inline(always)]
unsafe fn sub(a: V, b: V) -> V {
    std::array::from_fn(|i| a[i] - b[i])
}

#[inline(always)]
unsafe fn mul(a: V, b: V) -> V {
    std::array::from_fn(|i| a[i] * b[i])
}

/// a * b + c (two roundings: a fused multiply-add in software would be slow here).
#[inline(always)]
unsafe fn fma(a: V, b: V, c: V) -> V {
    std::array::from_fn(|i| a[i] * b[i] + c[i])
}

#[inline(always)]
unsafe fn max(a: V, b: V) -> V {
    std::array::from_fn(|i| a[i].max(b[i]))
}

#[inline(always)]
unsafe fn hmax(v: V) -> f32 {
    v.into_iter().fold(f32::NEG_INFINITY, f32::max)
}

#[inline(always)]
unsafe fn hsum(v: V) -> f32 {
    v.into_iter().sum()
}

/// Lanes where `vis <= k` (key k not visible) become -inf.
#[inline(always)]
unsafe fn mask_le(x: V, vis: V, k: V) -> V {
    std::array::from_fn(|i| {
        if vis[i] <= k[i] {
            f32::NEG_INFINITY
        } else {
            x[i]
        }
    })
}

#[inline(always)]
unsafe fn neg_inf_to_zero(x: V) -> V {
    std::array::from_fn(|i| if x[i] == f32::NEG_INFINITY { 0.0 } else { x[i] })
}

#[inline(always)]
unsafe fn exp2(x: V) -> V {
    std::array::from_fn(|i| exp2_scalar(x[i]))
}

/// The W x W block at `src` (rows `lds` floats apart) transposed to `dst` (rows `ldd`
/// apart), value by value.
#[inline(always)]
unsafe fn transpose_block(src: *const f32, lds: usize, dst: *mut f32, ldd: usize) {
    for i in 0..W {
        for j in 0..W {
            *dst.add(j * ldd + i) = src.add(i * lds + j).read_unaligned();
        }
    }
}

super::kernels!(4, 2,);
