//! FP8 codes (E4M3, E5M2; Micikevicius et al. 2022) widened to f32 and multiplied by their
//! group's scale, as a decode kernel loads an FP8 KV cache. On x86_64 with AVX2 and F16C
//! (checked at run time) each code becomes an IEEE f16 bit pattern by integer shifts and
//! the f16 is widened by `vcvtph2ps`: E5M2 is the upper byte of an f16; an E4M3 code
//! shifted into f16's fields (sign to bit 15, exponent and mantissa to bits 7-13) is its
//! value times 2^-8, normal and subnormal alike (the exponent biases differ by 8), so the
//! scale absorbs 2^8. Elsewhere a 256-entry table. One streaming pass, no allocation.
//! E4M3's NaN codes (0x7f, 0xff) come out finite on the shift path (480 x scale); the
//! quantizer (`problem::fp8`) never writes them.

use crate::problem::Fp8Format;

/// `dst[i] = value(src[i]) * scale` for every code of `src` (`dst` at least as long).
pub fn widen(src: &[u8], format: Fp8Format, scale: f32, dst: &mut [f32]) {
    let dst = &mut dst[..src.len()];
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c") {
        // SAFETY: AVX2 and F16C were detected on this CPU just above.
        unsafe { widen_avx2(src, format, scale, dst) };
        return;
    }
    widen_table(src, format, scale, dst);
}

/// The portable path: each code looked up in the format's table.
pub fn widen_table(src: &[u8], format: Fp8Format, scale: f32, dst: &mut [f32]) {
    let values = format.values();
    for (d, &c) in dst.iter_mut().zip(src) {
        *d = values[c as usize] * scale;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn widen_avx2(src: &[u8], format: Fp8Format, scale: f32, dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = src.len() / 16 * 16;
    let e4m3 = format == Fp8Format::Fp8e4m3;
    let s = _mm256_set1_ps(if e4m3 { scale * 256.0 } else { scale });
    let sign = _mm256_set1_epi16(0x80);
    let rest = _mm256_set1_epi16(0x7f);
    let mut i = 0;
    while i < n {
        // SAFETY: i + 16 <= src.len() == dst.len(); unaligned loads and stores.
        let c = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
        let w = _mm256_cvtepu8_epi16(c);
        let h = if e4m3 {
            _mm256_or_si256(
                _mm256_slli_epi16(_mm256_and_si256(w, sign), 8),
                _mm256_slli_epi16(_mm256_and_si256(w, rest), 7),
            )
        } else {
            _mm256_slli_epi16(w, 8)
        };
        let lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
        let hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
        _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_mul_ps(lo, s));
        _mm256_storeu_ps(dst.as_mut_ptr().add(i + 8), _mm256_mul_ps(hi, s));
        i += 16;
    }
    widen_table(&src[n..], format, scale, &mut dst[n..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_widens_to_its_value_times_the_scale() {
        // All 256 codes at every offset of a 16-code vector and in the tail, with scales that
        // leave the products exact and one that rounds.
        let codes: Vec<u8> = (0..=255u8).chain(0..=40u8).collect();
        for f in Fp8Format::ALL {
            for scale in [1.0f32, 0.0078125, 3.0, 1.0 / 448.0] {
                let mut got = vec![0.0f32; codes.len()];
                widen(&codes, f, scale, &mut got);
                let mut table = vec![0.0f32; codes.len()];
                widen_table(&codes, f, scale, &mut table);
                for (i, &c) in codes.iter().enumerate() {
                    let want = f.decode(c) * scale;
                    if want.is_nan() {
                        // E4M3's NaN codes are never written; E5M2's stay NaN.
                        assert!(f == Fp8Format::Fp8e4m3 || got[i].is_nan());
                        continue;
                    }
                    assert_eq!(table[i], want, "{f} table code {c:#x} scale {scale}");
                    assert_eq!(got[i], want, "{f} code {c:#x} scale {scale}");
                }
            }
        }
    }
}
