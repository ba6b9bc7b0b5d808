//! Decode's scores and value sums on AMX tiles (`amx`; Intel SDM Vol. 1 ch. 18): for the
//! few query rows of a GQA group against a run of bf16 keys, S^T = K Q^T with the keys read
//! in place as A tiles (16 keys x 32 dims) and Q^T packed once per call into B tiles of bf16 pairs (16
//! columns, the rows past the group zero), 32 keys at a time in two C tiles; each C tile is
//! stored and its first `rows` columns gathered, scaled, into the rows' scores. Products
//! exact and sums in f32 (`tdpbf16ps`), as the `vdpbf16ps` pairs of `vecops` (only the
//! order of the sums differs). The same keys' values are fetched into L2 a share before
//! each tile step (`spread`). Time O(keys * 16 * d) tile FLOPs whatever the rows (one
//! `tdpbf16ps` per 16 keys and 32 dims); scratch `qt_len(d)` floats.
//!
//! And the values' sums O += P V on tiles where P may be rounded to bf16 (`precision =
//! fast`, as the prefill's pair paths and FlashAttention do): P's rows as one A tile (16
//! rows x 32 keys), the values of a chunk of 32 keys interleaved by pairs of keys into B
//! tiles (`vpunpck{l,h}wd`, which leaves the columns in a fixed order that the store
//! undoes), the sums of 64 dims at a time in four C tiles across all the keys, then added
//! to the rows' output. Time O(keys * 16 * d) tile FLOPs; scratch `pv_len()` floats.

use super::spread::Spread;
use half::bf16;

/// Floats of the packed Q^T: `d / 2` rows of 16 bf16 pairs.
pub fn qt_len(d: usize) -> usize {
    d / 2 * 16
}

/// Whether `scores` and `accumulate` take this shape: a whole number of tiles along `d`,
/// and at most 16 rows (a B tile's columns, an A tile's rows).
pub fn fits(rows: usize, d: usize) -> bool {
    rows <= 16 && d > 0 && d.is_multiple_of(32)
}

/// Floats of `accumulate`'s scratch: P's A tile (16 rows of 32 bf16) and four B tiles
/// (16 pairs of keys x 16 dims each), and up to 15 floats to align them to 64 bytes.
pub fn pv_len() -> usize {
    (1 + 4) * 16 * 16 + 15
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
/// and the `keys` keys of `k` (rows `d` long); `fetch` (the same keys' values, or nothing)
/// is brought into L2 a share at a time between the tile steps, since a burst of its
/// prefetches ahead of the steps held the key loads back behind them.
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
    fetch: &[bf16],
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
    // `fetch`'s cache lines, an equal share before each step's key tiles.
    let mut fetch = Spread::new(fetch, &[0u8; 0], keys.div_ceil(2 * ROWS) * steps);
    let mut j = 0;
    while j < keys {
        let n = (keys - j).min(2 * ROWS);
        zero::<0>();
        zero::<1>();
        for st in 0..steps {
            load::<4>(qtp.add(st * ROWS * ROW_BYTES), ROW_BYTES);
            let a = kp.add(j * a_stride + st * ROW_BYTES);
            fetch.step();
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

/// `acc[r * d..][..d] += sum_j bf16(p[r * stride + j]) v_j` for rows r < `rows` and the
/// `keys` values of `v` (rows `d` long): P rounded to bf16 (round to nearest even), the
/// products exact and the sums in f32 (`tdpbf16ps`).
///
/// # Safety
/// AMX tiles configured on this thread, AVX-512 F, BW and BF16 available; `fits(rows, d)`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn accumulate(
    p: &[f32],
    stride: usize,
    (rows, keys, d): (usize, usize, usize),
    v: &[bf16],
    acc: &mut [f32],
    scratch: &mut [f32],
) {
    use super::amx::{dot, load, store, zero, ROWS, ROW_BYTES};
    use std::arch::x86_64::*;

    assert!(
        fits(rows, d)
            && v.len() >= keys * d
            && acc.len() >= rows * d
            && scratch.len() >= pv_len()
            && (rows == 0 || keys == 0 || p.len() >= (rows - 1) * stride + keys),
        "decode_amx: accumulate shapes"
    );
    if rows == 0 || keys == 0 {
        return;
    }
    // Two C tiles' staging: the unpack's low and high tiles of 32 dims.
    #[repr(C, align(64))]
    struct Stage([f32; 2 * ROWS * ROWS]);
    let mut c = Stage([0.0; 2 * ROWS * ROWS]);
    // P's A tile (rows past `rows` stay zero) and the four B tiles, 64-byte aligned.
    let skip = scratch.as_ptr().align_offset(64);
    assert!(skip < 16, "decode_amx: accumulate scratch alignment");
    let pa = scratch[skip..].as_mut_ptr() as *mut u8;
    let vb = pa.add(ROWS * ROW_BYTES);
    std::ptr::write_bytes(pa, 0, ROWS * ROW_BYTES);
    let vp = v.as_ptr() as *const u16;
    // Undoes the unpack's column order: tile 2h + 0 holds dims 8q + i (q < 4, i < 4) of its
    // 32 at column 4q + i, tile 2h + 1 dims 8q + 4 + i; out0 takes their 4-column groups
    // 0, 0, 1, 1 alternately, out1 groups 2, 2, 3, 3.
    let lo_idx = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
    let hi_idx = _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
    let mut g = 0;
    while g < d {
        // Dims g..g + 64 (or the last 32): two or four tiles of 16 columns.
        let tiles = ((d - g).min(64)) / 16;
        zero::<0>();
        zero::<1>();
        zero::<2>();
        zero::<3>();
        let mut j = 0;
        while j < keys {
            let n = (keys - j).min(2 * ROWS);
            let mask = |m: usize| -> __mmask16 {
                if m >= 16 {
                    0xffff
                } else {
                    ((1u32 << m) - 1) as __mmask16
                }
            };
            for r in 0..rows {
                let pr = p.as_ptr().add(r * stride + j);
                let lo = _mm512_maskz_loadu_ps(mask(n), pr);
                let hi = _mm512_maskz_loadu_ps(mask(n.saturating_sub(16)), pr.add(16));
                let ab: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                _mm512_store_si512(pa.add(r * ROW_BYTES) as *mut _, ab);
            }
            // Pair t of keys (j + 2t, j + 2t + 1): per 32 dims, unpacked into two B rows.
            for t in 0..ROWS {
                let (k0, k1) = (2 * t, 2 * t + 1);
                for h in 0..tiles / 2 {
                    let at = g + 32 * h;
                    let row = |k: usize| {
                        if k < n {
                            _mm512_loadu_si512(vp.add((j + k) * d + at) as *const _)
                        } else {
                            _mm512_setzero_si512()
                        }
                    };
                    let (a, b) = (row(k0), row(k1));
                    let t0 = vb.add((2 * h) * ROWS * ROW_BYTES + t * ROW_BYTES);
                    let t1 = vb.add((2 * h + 1) * ROWS * ROW_BYTES + t * ROW_BYTES);
                    _mm512_store_si512(t0 as *mut _, _mm512_unpacklo_epi16(a, b));
                    _mm512_store_si512(t1 as *mut _, _mm512_unpackhi_epi16(a, b));
                }
            }
            load::<4>(pa, ROW_BYTES);
            let tile = |i: usize| vb.add(i * ROWS * ROW_BYTES);
            load::<5>(tile(0), ROW_BYTES);
            dot::<0, 4, 5>();
            load::<5>(tile(1), ROW_BYTES);
            dot::<1, 4, 5>();
            if tiles == 4 {
                load::<5>(tile(2), ROW_BYTES);
                dot::<2, 4, 5>();
                load::<5>(tile(3), ROW_BYTES);
                dot::<3, 4, 5>();
            }
            j += n;
        }
        // The C tiles' rows, columns back in order, added to the output.
        for h in 0..tiles / 2 {
            let (lo, hi) = (c.0.as_mut_ptr(), c.0.as_mut_ptr().add(ROWS * ROWS));
            if h == 0 {
                store::<0>(lo as *mut u8, ROW_BYTES);
                store::<1>(hi as *mut u8, ROW_BYTES);
            } else {
                store::<2>(lo as *mut u8, ROW_BYTES);
                store::<3>(hi as *mut u8, ROW_BYTES);
            }
            for r in 0..rows {
                let a = _mm512_load_ps(lo.add(r * ROWS));
                let b = _mm512_load_ps(hi.add(r * ROWS));
                let out = acc.as_mut_ptr().add(r * d + g + 32 * h);
                let o0 = _mm512_permutex2var_ps(a, lo_idx, b);
                let o1 = _mm512_permutex2var_ps(a, hi_idx, b);
                _mm512_storeu_ps(out, _mm512_add_ps(_mm512_loadu_ps(out), o0));
                _mm512_storeu_ps(out.add(16), _mm512_add_ps(_mm512_loadu_ps(out.add(16)), o1));
            }
        }
        g += 64;
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::backend::cpu::amx;

    /// The tiles configured on this thread, or `None` (and a note) where the CPU or OS
    /// gives none.
    fn tiles() -> Option<amx::Tiles> {
        if !amx::usable() {
            println!("skipped: this CPU or OS gives no AMX tiles");
            return None;
        }
        // SAFETY: AMX usable (checked).
        Some(unsafe { amx::Tiles::configure() })
    }

    /// bf16 bits of small integers over 8 (exact in bf16, their products and sums exact in
    /// f32): the tiles' scores must equal the plain dot products bit for bit.
    fn value(i: usize, salt: usize) -> u16 {
        let x = ((i * 7 + salt * 13) % 17) as f32 - 8.0;
        (x.to_bits() >> 16) as u16
    }

    #[test]
    fn tile_value_sums_equal_the_exact_sums_of_bf16_p_on_ragged_keys() {
        let Some(_tiles) = tiles() else { return };
        for &(rows, d) in &[(1, 32), (4, 128), (5, 96), (16, 64)] {
            for &keys in &[1, 2, 15, 31, 32, 33, 64, 70] {
                // P of small multiples of 1/4 (exact in bf16), values small integers: every
                // product and sum exact, so the tiles must give the plain sums' bits.
                let stride = keys + 5;
                let p: Vec<f32> = (0..rows * stride)
                    .map(|i| ((i * 5) % 9) as f32 * 0.25)
                    .collect();
                let v: Vec<bf16> = (0..keys * d)
                    .map(|i| bf16::from_bits(value(i, 3)))
                    .collect();
                let acc0: Vec<f32> = (0..rows * d).map(|i| (i % 7) as f32).collect();
                let mut acc = acc0.clone();
                // Scratch at every alignment a caller may hand over.
                for shift in [0, 3] {
                    acc.copy_from_slice(&acc0);
                    let mut scratch = vec![f32::NAN; pv_len() + shift];
                    // SAFETY: tiles configured (`_tiles`), and with AMX AVX-512 F, BW and
                    // BF16.
                    unsafe {
                        accumulate(
                            &p,
                            stride,
                            (rows, keys, d),
                            &v,
                            &mut acc,
                            &mut scratch[shift..],
                        );
                    }
                    for r in 0..rows {
                        for x in 0..d {
                            let sum: f32 = (0..keys)
                                .map(|j| p[r * stride + j] * v[j * d + x].to_f32())
                                .sum();
                            let want = acc0[r * d + x] + sum;
                            assert_eq!(
                                acc[r * d + x],
                                want,
                                "rows {rows} d {d} keys {keys} ({r}, {x})"
                            );
                        }
                    }
                }
            }
        }
    }

    /// P rounded to bf16 as `cvtne2ps` rounds: to nearest even.
    #[test]
    fn tile_value_sums_round_p_to_bf16() {
        let Some(_tiles) = tiles() else { return };
        let d = 32;
        // A tie (to the even 1.0) and a value nearer the bf16 above: truncation or no rounding
        // would give other sums.
        let p = [1.0 + 2.0 / 512.0, 1.0 + 3.0 / 512.0];
        let v = vec![bf16::ONE; 2 * d];
        let mut acc = vec![0.0; d];
        let mut scratch = vec![0.0; pv_len()];
        // SAFETY: as above.
        unsafe { accumulate(&p, 2, (1, 2, d), &v, &mut acc, &mut scratch) };
        let want = bf16::from_f32(p[0]).to_f32() + bf16::from_f32(p[1]).to_f32();
        assert_eq!(acc[0], want);
        assert_eq!(want, 2.0 + 4.0 / 512.0);
        assert_ne!(acc[0], p[0] + p[1]);
    }

    #[test]
    fn tile_scores_equal_the_exact_dot_products_on_ragged_keys() {
        let Some(_tiles) = tiles() else { return };
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
                // Something to fetch on half the shapes: it must not change a score.
                let fetch = if keys % 2 == 0 { &k[..] } else { &[] };
                // SAFETY: tiles configured (`_tiles`), and with AMX AVX-512 F; fits(rows, d).
                unsafe { scores(&qt, &k, (rows, keys, d), 0.5, &mut s, stride, fetch) };
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
