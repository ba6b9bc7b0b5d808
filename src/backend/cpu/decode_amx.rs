//! Decode's scores on AMX tiles (`amx`; Intel SDM Vol. 1 ch. 18): for the few query rows
//! of a GQA group against a run of bf16 keys, S^T = K Q^T with the keys read in place as
//! A tiles (16 keys x 32 dims) and Q^T packed once per call into B tiles of bf16 pairs (16
//! columns, the rows past the group zero), 32 keys at a time in two C tiles; each C tile is
//! stored and its first `rows` columns gathered, scaled, into the rows' scores. Products
//! exact and sums in f32 (`tdpbf16ps`), as the `vdpbf16ps` pairs of `vecops` (only the
//! order of the sums differs). Time O(keys * 16 * d) tile FLOPs whatever the rows (one
//! `tdpbf16ps` per 16 keys and 32 dims); scratch `qt_len(d)` floats.

use half::bf16;

/// Floats of the packed Q^T: `d / 2` rows of 16 bf16 pairs.
pub fn qt_len(d: usize) -> usize {
    d / 2 * 16
}

/// Whether `scores` takes this shape: a whole number of tiles along `d`, and at most 16
/// rows (one B tile's columns).
pub fn fits(rows: usize, d: usize) -> bool {
    rows <= 16 && d > 0 && d.is_multiple_of(32)
}

/// Q^T as bf16 pairs into `qt` (`qt_len(d)` floats, read as u32 pairs): row p holds the
/// pair (q_c[2p], q_c[2p + 1]) of each row c < rows, zero in the columns past them.
pub fn pack_qt(q: &[u16], rows: usize, d: usize, qt: &mut [f32]) {
    assert!(
        fits(rows, d) && q.len() >= rows * d && qt.len() >= qt_len(d),
        "decode_amx: pack_qt shapes"
    );
    let qt = &mut qt[..qt_len(d)];
    qt.fill(0.0);
    for c in 0..rows {
        for p in 0..d / 2 {
            let pair = q[c * d + 2 * p] as u32 | (q[c * d + 2 * p + 1] as u32) << 16;
            qt[p * 16 + c] = f32::from_bits(pair);
        }
    }
}

/// `s[r * stride + j] = scale * q_r . k_j` for the `rows` rows packed in `qt` (`pack_qt`)
/// and the `keys` keys of `k` (rows `d` long).
///
/// # Safety
/// AMX tiles configured on this thread (`amx::Tiles::configure`), AVX-512 F available;
/// `fits(rows, d)`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn scores(
    qt: &[f32],
    k: &[bf16],
    (rows, keys, d): (usize, usize, usize),
    scale: f32,
    s: &mut [f32],
    stride: usize,
) {
    use super::amx::{dot, load, store, zero, ROWS, ROW_BYTES};
    use std::arch::x86_64::*;

    assert!(
        fits(rows, d)
            && qt.len() >= qt_len(d)
            && k.len() >= keys * d
            && (rows == 0 || keys == 0 || s.len() >= (rows - 1) * stride + keys),
        "decode_amx: scores shapes"
    );
    if rows == 0 || keys == 0 {
        return;
    }
    #[repr(C, align(64))]
    struct Block([f32; 2 * ROWS * ROWS]);
    // Two C tiles' staging (32 keys x 16 columns), and a zero-padded copy of the keys of a
    // ragged last group, one 32-dim step at a time.
    let mut c = Block([0.0; 2 * ROWS * ROWS]);
    let mut pad = Block([0.0; 2 * ROWS * ROWS]);
    let (steps, a_stride) = (d / 32, 2 * d);
    let (qtp, kp) = (qt.as_ptr() as *const u8, k.as_ptr() as *const u8);
    let cv = _mm512_set1_ps(scale);
    // Column r of a staged C tile: the scores of row r for its 16 keys.
    let col = _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        _mm512_set1_epi32(ROWS as i32),
    );
    let mut j = 0;
    while j < keys {
        let n = (keys - j).min(2 * ROWS);
        zero::<0>();
        zero::<1>();
        for st in 0..steps {
            load::<4>(qtp.add(st * ROWS * ROW_BYTES), ROW_BYTES);
            let a = kp.add(j * a_stride + st * ROW_BYTES);
            if n == 2 * ROWS {
                load::<2>(a, a_stride);
                load::<3>(a.add(ROWS * a_stride), a_stride);
            } else {
                // The keys left, 64 bytes of this step each, the rest of 32 rows zero.
                let p = pad.0.as_mut_ptr() as *mut u8;
                std::ptr::write_bytes(p, 0, 2 * ROWS * ROW_BYTES);
                for i in 0..n {
                    std::ptr::copy_nonoverlapping(
                        a.add(i * a_stride),
                        p.add(i * ROW_BYTES),
                        ROW_BYTES,
                    );
                }
                load::<2>(p, ROW_BYTES);
                load::<3>(p.add(ROWS * ROW_BYTES), ROW_BYTES);
            }
            dot::<0, 2, 4>();
            dot::<1, 3, 4>();
        }
        let cp = c.0.as_mut_ptr() as *mut u8;
        store::<0>(cp, ROW_BYTES);
        store::<1>(cp.add(ROWS * ROW_BYTES), ROW_BYTES);
        for half in 0..n.div_ceil(ROWS) {
            let m = (n - half * ROWS).min(ROWS);
            let mask: __mmask16 = if m == ROWS { 0xffff } else { (1u16 << m) - 1 };
            let base = c.0.as_ptr().add(half * ROWS * ROWS);
            for r in 0..rows {
                let idx = _mm512_add_epi32(col, _mm512_set1_epi32(r as i32));
                let v = _mm512_mul_ps(cv, _mm512_i32gather_ps::<4>(idx, base));
                let out = s.as_mut_ptr().add(r * stride + j + half * ROWS);
                _mm512_mask_storeu_ps(out, mask, v);
            }
        }
        j += n;
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::backend::cpu::amx;

    /// bf16 bits of small integers over 8 (exact in bf16, their products and sums exact in
    /// f32): the tiles' scores must equal the plain dot products bit for bit.
    fn value(i: usize, salt: usize) -> u16 {
        let x = ((i * 7 + salt * 13) % 17) as f32 - 8.0;
        (x.to_bits() >> 16) as u16
    }

    #[test]
    fn tile_scores_equal_the_exact_dot_products_on_ragged_keys() {
        if !amx::usable() {
            println!("skipped: this CPU or OS gives no AMX tiles");
            return;
        }
        for &(rows, d) in &[(1, 32), (4, 128), (7, 64), (16, 96)] {
            for &keys in &[1, 15, 16, 17, 31, 32, 33, 70] {
                let q: Vec<u16> = (0..rows * d).map(|i| value(i, 1)).collect();
                let k: Vec<bf16> = (0..keys * d)
                    .map(|i| bf16::from_bits(value(i, 2)))
                    .collect();
                let mut qt = vec![0.0; qt_len(d)];
                pack_qt(&q, rows, d, &mut qt);
                let stride = keys + 3;
                let mut s = vec![f32::NAN; rows * stride];
                // SAFETY: AMX usable (checked), and with it AVX-512 F; fits(rows, d).
                unsafe {
                    let _t = amx::Tiles::configure();
                    scores(&qt, &k, (rows, keys, d), 0.5, &mut s, stride);
                }
                let f = |b: u16| f32::from_bits((b as u32) << 16);
                for r in 0..rows {
                    for j in 0..keys {
                        let dot: f32 = (0..d)
                            .map(|x| f(q[r * d + x]) * k[j * d + x].to_f32())
                            .sum();
                        assert_eq!(
                            s[r * stride + j],
                            0.5 * dot,
                            "rows {rows} d {d} keys {keys} ({r}, {j})"
                        );
                    }
                    // Nothing written past the row's keys.
                    assert!(s[r * stride + keys..(r + 1) * stride]
                        .iter()
                        .all(|x| x.is_nan()));
                }
            }
        }
    }
}
