//! Row pieces of softmax shared by every CPU variant: causal masking of a score row, the row
//! maximum, and exp(x - m) with its sum. O(row length) each, no allocation. A row whose keys
//! are all masked has maximum -inf; callers treat its output as 0 (FlashAttention's
//! convention), so no NaN is ever produced from a masked row.

/// Sets every score at column `>= visible` to -inf (keys a causal query may not see).
#[inline]
pub fn mask_from(row: &mut [f32], visible: usize) {
    if visible < row.len() {
        row[visible..].fill(f32::NEG_INFINITY);
    }
}

#[inline]
pub fn row_max(row: &[f32]) -> f32 {
    row.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// Terms per partial sum of `exp_sub_sum`: the row is summed in blocks like a GEMM's
/// K-blocked accumulation, since one sequential f32 sum over 16384 keys is too inexact for
/// the paper's error bound (docs/papers.md, Rabe & Staats: sequential sums give 4.2e-7 / 6.4e-6 against
/// the bounds 1.5e-7 / 6.5e-7; partial sums of at most 256 terms give 4.1e-8 / 4.8e-7).
pub const SUM_BLOCK: usize = 256;

/// Replaces each x by exp(x - m) and returns the sum (partial sums of `SUM_BLOCK` terms).
/// With `m = 0` this is the unsafe (no max subtraction) exponentiation that overflows to
/// inf once x >= 89.
#[inline]
pub fn exp_sub_sum(row: &mut [f32], m: f32) -> f32 {
    if m == f32::NEG_INFINITY {
        row.fill(0.0);
        return 0.0;
    }
    let mut sum = 0.0f32;
    for block in row.chunks_mut(SUM_BLOCK) {
        let mut partial = 0.0f32;
        for x in block.iter_mut() {
            *x = (*x - m).exp();
            partial += *x;
        }
        sum += partial;
    }
    sum
}

/// Multiplies a row by `f`.
#[inline]
pub fn scale_row(row: &mut [f32], f: f32) {
    for x in row.iter_mut() {
        *x *= f;
    }
}

/// The softmax backward on a tile, times `s`: each dP_ij becomes dS_ij = s P_ij (dP_ij -
/// D_i), with `d_rows[i]` = D_i = rowsum(dO_i * O_i). `dp` and `p` are `rows x cols`,
/// row-major, rows `ld` floats apart. (`s` carries the score scale 1/sqrt(d) into the dQ
/// and dK products, which the tiles take without a factor.)
#[inline]
pub fn softmax_grad_rows(
    dp: &mut [f32],
    p: &[f32],
    d_rows: &[f32],
    (cols, ld): (usize, usize),
    s: f32,
) {
    for ((dp_r, p_r), d_i) in dp.chunks_mut(ld).zip(p.chunks(ld)).zip(d_rows) {
        for (x, pj) in dp_r[..cols].iter_mut().zip(&p_r[..cols]) {
            *x = s * pj * (*x - d_i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_row_gives_zero_weights_not_nan() {
        let mut row = [1.0f32, 2.0, 3.0];
        mask_from(&mut row, 0);
        let m = row_max(&row);
        assert_eq!(m, f32::NEG_INFINITY);
        assert_eq!(exp_sub_sum(&mut row, m), 0.0);
        assert_eq!(row, [0.0; 3]);
    }

    #[test]
    fn exp_sub_sum_is_shift_invariant_softmax() {
        let mut a = [1.0f32, 2.0, 3.0];
        let mut b = [101.0f32, 102.0, 103.0];
        let sa = exp_sub_sum(&mut a, row_max(&[1.0, 2.0, 3.0]));
        let sb = exp_sub_sum(&mut b, 103.0);
        for (x, y) in a.iter().zip(&b) {
            assert!((x / sa - y / sb).abs() < 1e-7);
        }
    }
}
