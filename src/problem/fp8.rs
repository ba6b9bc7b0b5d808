//! FP8 storage of a KV cache: the two 8-bit formats of Micikevicius et al. 2022 ("FP8
//! Formats for Deep Learning"), E4M3 (the "fn" variant: no infinities, largest finite 448)
//! and E5M2 (IEEE-like, largest finite 57344), as serving stores K and V to halve what
//! decoding reads (quantization is left out of the Transformers Inference Optimization
//! Toolset; FlashAttention-3 as it presents it uses FP8 with block scales).
//! Each group of values (one head of one sequence) is divided by its own scale, the group's
//! largest magnitude over the format's largest finite value, and rounded to the nearest
//! code (ties to even) by the `float8` crate; a stored value is `code x scale` rounded to
//! f32. Cost: two passes over the values to quantize (the maximum, then the codes); 1 byte
//! per value and one f32 per group.

use std::fmt;
use std::str::FromStr;

use float8::{F8E4M3, F8E5M2};
use half::{bf16, f16};
use serde::{Deserialize, Serialize};

use super::{try_collect, Tensor};
use crate::error::Result;

/// One of the two FP8 formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Fp8Format {
    /// 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, codes 0x7f and 0xff NaN.
    Fp8e4m3,
    /// 1 sign, 5 exponent (bias 15), 2 mantissa bits: the upper byte of an IEEE f16.
    Fp8e5m2,
}

/// Every code's value, per format, built at compile time from the crate's conversion.
const fn table(e4m3: bool) -> [f32; 256] {
    let mut t = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = if e4m3 {
            F8E4M3::from_bits(i as u8).to_f32()
        } else {
            F8E5M2::from_bits(i as u8).to_f32()
        };
        i += 1;
    }
    t
}

static E4M3_VALUES: [f32; 256] = table(true);
static E5M2_VALUES: [f32; 256] = table(false);

impl Fp8Format {
    pub const ALL: [Fp8Format; 2] = [Fp8Format::Fp8e4m3, Fp8Format::Fp8e5m2];

    pub fn name(self) -> &'static str {
        match self {
            Fp8Format::Fp8e4m3 => "fp8e4m3",
            Fp8Format::Fp8e5m2 => "fp8e5m2",
        }
    }

    /// The largest finite value: scales map each group's largest magnitude onto it.
    pub fn max_finite(self) -> f32 {
        match self {
            Fp8Format::Fp8e4m3 => 448.0,
            Fp8Format::Fp8e5m2 => 57344.0,
        }
    }

    /// Relative rounding error bound of a value in the normal range: half an ulp, 2^-4
    /// (3 mantissa bits) or 2^-3 (2 bits).
    pub fn unit_roundoff(self) -> f64 {
        match self {
            Fp8Format::Fp8e4m3 => 1.0 / 16.0,
            Fp8Format::Fp8e5m2 => 1.0 / 8.0,
        }
    }

    /// The code nearest `x` (ties to even); magnitudes past the largest finite value
    /// saturate to it.
    pub fn encode(self, x: f32) -> u8 {
        match self {
            Fp8Format::Fp8e4m3 => F8E4M3::from_f32(x).to_bits(),
            Fp8Format::Fp8e5m2 => F8E5M2::from_f32(x).to_bits(),
        }
    }

    /// The value of `code` (exact in f32).
    #[inline]
    pub fn decode(self, code: u8) -> f32 {
        self.values()[code as usize]
    }

    /// Every code's value, indexed by the code.
    #[inline]
    pub fn values(self) -> &'static [f32; 256] {
        match self {
            Fp8Format::Fp8e4m3 => &E4M3_VALUES,
            Fp8Format::Fp8e5m2 => &E5M2_VALUES,
        }
    }
}

impl fmt::Display for Fp8Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Fp8Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Fp8Format::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| format!("unknown FP8 format `{s}` (expected one of: fp8e4m3, fp8e5m2)"))
    }
}

/// Values stored as FP8 codes with one scale per group of `group` consecutive values
/// (value i is `decode(codes[i]) * scales[i / group]`).
#[derive(Clone, Debug, PartialEq)]
pub struct Fp8Tensor {
    pub format: Fp8Format,
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
    pub group: usize,
}

impl Fp8Tensor {
    /// `values` quantized in groups of `group` (the last group may be shorter). A group of
    /// zeros gets scale 1 (its codes are zero whatever the scale).
    pub fn quantize(values: &[f32], group: usize, format: Fp8Format) -> Fp8Tensor {
        let group = group.max(1);
        let mut codes = Vec::with_capacity(values.len());
        let mut scales = Vec::with_capacity(values.len().div_ceil(group));
        for chunk in values.chunks(group) {
            scales.push(push_group(chunk, format, &mut codes));
        }
        Fp8Tensor {
            format,
            codes,
            scales,
            group,
        }
    }

    pub fn len(&self) -> usize {
        self.codes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.codes.is_empty()
    }

    /// The scale of value `i`.
    #[inline]
    pub fn scale_of(&self, i: usize) -> f32 {
        self.scales[i / self.group]
    }

    /// Value `i` as stored: its code's value times its group's scale, rounded to f32 once,
    /// exactly as the kernels widen it (`backend::cpu::fp8::widen`), so the oracle on these
    /// values sees what the kernels read.
    #[inline]
    pub fn get_f64(&self, i: usize) -> f64 {
        (self.format.decode(self.codes[i]) * self.scale_of(i)) as f64
    }

    /// Bytes stored: one per code and four per scale.
    pub fn size_bytes(&self) -> usize {
        self.codes.len() + 4 * self.scales.len()
    }
}

impl Fp8Tensor {
    /// `t` quantized in groups of `group` values, its storage allocated fallibly
    /// (`OutOfMemory` naming `what`): one group's f32 values at a time, never the whole
    /// tensor widened.
    pub fn try_quantize(t: &Tensor, group: usize, format: Fp8Format, what: &str) -> Result<Self> {
        let (n, group) = (t.len(), group.max(1));
        let mut codes = try_collect(n, std::iter::empty(), what)?;
        let mut scales = try_collect(n.div_ceil(group), std::iter::empty(), what)?;
        let mut buf = vec![0.0f32; group.min(n)];
        for start in (0..n).step_by(group) {
            let len = group.min(n - start);
            let vals = &mut buf[..len];
            let r = start..start + len;
            match t {
                Tensor::F32(v) => vals.copy_from_slice(&v[r]),
                Tensor::Bf16(v) => vals
                    .iter_mut()
                    .zip(&v[r])
                    .for_each(|(o, x)| *o = bf16::to_f32(*x)),
                Tensor::F16(v) => vals
                    .iter_mut()
                    .zip(&v[r])
                    .for_each(|(o, x)| *o = f16::to_f32(*x)),
            }
            scales.push(push_group(vals, format, &mut codes));
        }
        Ok(Fp8Tensor {
            format,
            codes,
            scales,
            group,
        })
    }

    /// Every value as stored (`get_f64`'s values, in f32), allocated fallibly
    /// (`OutOfMemory` naming `what`).
    pub fn try_dequantized(&self, what: &str) -> Result<Vec<f32>> {
        let values = self.format.values();
        let it = self.codes.iter().enumerate();
        try_collect(
            self.len(),
            it.map(|(i, &c)| values[c as usize] * self.scale_of(i)),
            what,
        )
    }
}

/// One group quantized: its codes appended to `codes`, its scale returned (the group's
/// largest magnitude over the format's largest finite value; 1 for a group of zeros).
fn push_group(group: &[f32], format: Fp8Format, codes: &mut Vec<u8>) -> f32 {
    let amax = group.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let scale = if amax > 0.0 && amax.is_finite() {
        amax / format.max_finite()
    } else {
        1.0
    };
    let inv = 1.0 / scale;
    codes.extend(group.iter().map(|&x| format.encode(x * inv)));
    scale
}

/// The K and V of a case's cache in one FP8 format, one scale per (sequence, KV head),
/// built beside the logical cache in the storage dtype (which the other variants of an
/// interleave group and the second error column read).
#[derive(Clone, Debug, PartialEq)]
pub struct Fp8Kv {
    pub k: Fp8Tensor,
    pub v: Fp8Tensor,
}

impl Fp8Kv {
    /// `k` and `v` (`[batch, kv_heads, seq_kv, d]`) quantized per head of `seq_kv x d`.
    pub fn try_build(k: &Tensor, v: &Tensor, head_len: usize, format: Fp8Format) -> Result<Self> {
        Ok(Fp8Kv {
            k: Fp8Tensor::try_quantize(k, head_len, format, "FP8 cache K")?,
            v: Fp8Tensor::try_quantize(v, head_len, format, "FP8 cache V")?,
        })
    }

    pub fn format(&self) -> Fp8Format {
        self.k.format
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_decode_their_defining_codes() {
        let e4 = Fp8Format::Fp8e4m3;
        assert_eq!(e4.decode(0x00), 0.0);
        assert_eq!(e4.decode(0x38), 1.0); // 0 0111 000: 2^(7-7)
        assert_eq!(e4.decode(0x7e), 448.0); // 0 1111 110: 1.75 x 2^8
        assert_eq!(e4.decode(0x01), 2f32.powi(-9)); // smallest subnormal: 1/8 x 2^-6
        assert_eq!(e4.decode(0xb8), -1.0);
        assert!(e4.decode(0x7f).is_nan());
        let e5 = Fp8Format::Fp8e5m2;
        assert_eq!(e5.decode(0x3c), 1.0); // 0 01111 00
        assert_eq!(e5.decode(0x7b), 57344.0); // 0 11110 11: 1.75 x 2^15
        assert_eq!(e5.decode(0x01), 2f32.powi(-16)); // 1/4 x 2^-14
        assert!(e5.decode(0x7c).is_infinite());
        for f in Fp8Format::ALL {
            assert_eq!(f.decode(f.encode(f.max_finite())), f.max_finite());
            assert_eq!(f.decode(f.encode(1e30)), f.max_finite(), "{f} saturates");
            assert_eq!(f.name().parse::<Fp8Format>(), Ok(f));
        }
        assert!("fp8".parse::<Fp8Format>().is_err());
    }

    #[test]
    fn encoding_rounds_to_the_nearest_code() {
        // Every finite code decodes and re-encodes to itself, and a value between two
        // neighbouring codes goes to the nearer one.
        for f in Fp8Format::ALL {
            let mut finite: Vec<f32> = (0..=255u8)
                .map(|c| f.decode(c))
                .filter(|x| x.is_finite())
                .collect();
            for c in 0..=255u8 {
                let x = f.decode(c);
                if x.is_finite() && x != 0.0 {
                    assert_eq!(f.encode(x), c, "{f} code {c:#x}");
                }
            }
            finite.sort_by(f32::total_cmp);
            finite.dedup();
            for w in finite.windows(2) {
                let (a, b) = (w[0], w[1]);
                let near_a = a + (b - a) * 0.4;
                let near_b = a + (b - a) * 0.6;
                assert_eq!(
                    f.decode(f.encode(near_a)),
                    a,
                    "{f} {near_a} between {a} and {b}"
                );
                assert_eq!(
                    f.decode(f.encode(near_b)),
                    b,
                    "{f} {near_b} between {a} and {b}"
                );
            }
        }
    }

    #[test]
    fn quantized_groups_keep_their_relative_error_bound() {
        let values: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32 - 50.3).collect();
        for f in Fp8Format::ALL {
            let t = Fp8Tensor::quantize(&values, 300, f);
            assert_eq!(t.len(), 1000);
            assert_eq!(t.scales.len(), 4);
            assert_eq!(t.size_bytes(), 1000 + 16);
            for (i, &x) in values.iter().enumerate() {
                let g = &values[i / 300 * 300..(i / 300 * 300 + 300).min(1000)];
                let amax = g.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64;
                // Normal range: half an ulp relative; below it the subnormal spacing of the
                // scaled group, amax x 2^-9 / 448 (e4m3) or 2^-16 / 57344 (e5m2) at most.
                let sub = amax * f.decode(1) as f64 / f.max_finite() as f64;
                let err = (t.get_f64(i) - x as f64).abs();
                assert!(
                    err <= (x as f64).abs() * f.unit_roundoff() + sub,
                    "{f} value {i}: {x} stored as {}",
                    t.get_f64(i)
                );
            }
            // The largest magnitude of each group maps to the largest code.
            assert_eq!(t.codes[0] & 0x7f, f.encode(f.max_finite()));
        }
        // From a tensor, group by group, as from the slice.
        for f in Fp8Format::ALL {
            let t = Tensor::from_f32(values.clone(), crate::problem::DType::F32);
            let q = Fp8Tensor::try_quantize(&t, 300, f, "test").expect("fits");
            assert_eq!(q, Fp8Tensor::quantize(&values, 300, f));
            let back = q.try_dequantized("test").expect("fits");
            assert!((0..1000).all(|i| back[i] as f64 == q.get_f64(i)));
        }
        let zeros = Fp8Tensor::quantize(&[0.0; 8], 4, Fp8Format::Fp8e4m3);
        assert_eq!(zeros.scales, vec![1.0, 1.0]);
        assert!(zeros.codes.iter().all(|&c| c == 0));
    }
}
