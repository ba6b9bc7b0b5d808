//! The layer's attention operands (Q, K, V) in their storage dtype: fallible zeroed
//! allocation, f32 rows rounded in, ranges copied between buffers without reallocating.
//! O(elements) per call.

use half::{bf16, f16};

use crate::backend::cpu::workspace::try_zeroed;
use crate::error::{Error, Result};
use crate::problem::{DType, Tensor};

/// A zero-filled tensor of `len` elements of `dtype`, or `OutOfMemory`.
pub fn try_tensor(len: usize, dtype: DType, what: &str) -> Result<Tensor> {
    fn half<T: Clone + Default>(len: usize, what: &str) -> Result<Vec<T>> {
        let mut v = Vec::new();
        v.try_reserve_exact(len).map_err(|_| {
            Error::OutOfMemory(format!(
                "{what}: {} bytes could not be allocated",
                len * std::mem::size_of::<T>()
            ))
        })?;
        v.resize(len, T::default());
        Ok(v)
    }
    Ok(match dtype {
        DType::F32 => Tensor::F32(try_zeroed(len, what)?),
        DType::Bf16 => Tensor::Bf16(half::<bf16>(len, what)?),
        DType::F16 => Tensor::F16(half::<f16>(len, what)?),
    })
}

/// Takes the tensor out of `t`, leaving an empty one (no allocation).
pub fn take(t: &mut Tensor) -> Tensor {
    std::mem::replace(t, Tensor::F32(Vec::new()))
}

/// `t[offset..offset + src.len()] = src`, rounded to the tensor's dtype.
pub fn write(t: &mut Tensor, offset: usize, src: &[f32]) {
    use half::slice::HalfFloatSliceExt;
    let n = src.len();
    match t {
        Tensor::F32(v) => v[offset..offset + n].copy_from_slice(src),
        Tensor::Bf16(v) => v[offset..offset + n].convert_from_f32_slice(src),
        Tensor::F16(v) => v[offset..offset + n].convert_from_f32_slice(src),
    }
}

/// `dst` becomes a copy of `src[range]` (same dtype), within its capacity.
pub fn refill(dst: &mut Tensor, src: &Tensor, start: usize, len: usize) {
    match (dst, src) {
        (Tensor::F32(d), Tensor::F32(s)) => {
            d.clear();
            d.extend_from_slice(&s[start..start + len]);
        }
        (Tensor::Bf16(d), Tensor::Bf16(s)) => {
            d.clear();
            d.extend_from_slice(&s[start..start + len]);
        }
        (Tensor::F16(d), Tensor::F16(s)) => {
            d.clear();
            d.extend_from_slice(&s[start..start + len]);
        }
        _ => unreachable!("layer buffers share one storage dtype"),
    }
}
