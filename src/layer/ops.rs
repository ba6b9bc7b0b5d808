//! Row-wise building blocks of the GPT block: layer norm and GELU (forward and backward),
//! bias and column sums, and a row-parallel SGEMM over `backend::cpu::gemm`. Layer norm and
//! GELU cost O(rows * h); the GEMM 2*m*n*k FLOPs. Nothing here allocates except the GEMM's
//! packing buffers (one per worker).

use rayon::prelude::*;

use crate::backend::cpu::gemm::{sgemm, MatRef};

/// Layer-norm epsilon (GPT-2 / flax default).
pub const LN_EPS: f32 = 1e-5;

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_C: f32 = 0.044_715;

/// C (`m x n`, contiguous rows of stride `ldc`) = alpha A B + beta C, rows split across the
/// pool's workers.
pub fn gemm(alpha: f32, a: MatRef, b: MatRef, beta: f32, c: &mut [f32], ldc: usize) {
    let m = a.rows;
    if m == 0 || b.cols == 0 {
        return;
    }
    let workers = rayon::current_num_threads().max(1);
    // Pieces of whole multiples of 8 rows, at least 16 rows each.
    let per = m.div_ceil(workers).max(16).div_ceil(8) * 8;
    if per >= m {
        sgemm(alpha, a, b, beta, c, ldc);
        return;
    }
    let c = &mut c[..(m - 1) * ldc + b.cols];
    let pieces: Vec<(usize, &mut [f32])> = split_rows(c, ldc, per);
    pieces.into_par_iter().for_each(|(i0, ci)| {
        let rows = per.min(m - i0);
        let ai = MatRef {
            data: &a.data[i0 * a.rs..],
            rows,
            ..a
        };
        sgemm(alpha, ai, b, beta, ci, ldc);
    });
}

/// `c` cut into pieces of `per` rows (the last one shorter; the last row may be shorter
/// than `ldc`).
fn split_rows(c: &mut [f32], ldc: usize, per: usize) -> Vec<(usize, &mut [f32])> {
    let mut out = Vec::new();
    let mut rest = c;
    let mut i0 = 0;
    while !rest.is_empty() {
        let take = (per * ldc).min(rest.len());
        let (head, tail) = rest.split_at_mut(take);
        out.push((i0, head));
        rest = tail;
        i0 += per;
    }
    out
}

/// Row-wise layer norm of `x` (`rows x h`) into `out`, keeping (mean, 1/std) per row in
/// `stats` (`rows * 2`).
pub fn layer_norm(x: &[f32], gain: &[f32], bias: &[f32], out: &mut [f32], stats: &mut [f32]) {
    let h = gain.len();
    out.par_chunks_mut(h)
        .zip(stats.par_chunks_mut(2))
        .zip(x.par_chunks(h))
        .for_each(|((o, st), x)| {
            let mean = x.iter().sum::<f32>() / h as f32;
            let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / h as f32;
            let rstd = 1.0 / (var + LN_EPS).sqrt();
            st[0] = mean;
            st[1] = rstd;
            for ((o, x), (g, b)) in o.iter_mut().zip(x).zip(gain.iter().zip(bias)) {
                *o = (x - mean) * rstd * g + b;
            }
        });
}

/// Layer-norm backward: `dx += d(LN)/dx^T dout` for the rows of `x` with their `stats`.
/// The gain and bias gradients are accumulated by [`layer_norm_param_grads`].
pub fn layer_norm_backward(x: &[f32], stats: &[f32], gain: &[f32], dout: &[f32], dx: &mut [f32]) {
    let h = gain.len();
    dx.par_chunks_mut(h)
        .zip(x.par_chunks(h))
        .zip(dout.par_chunks(h).zip(stats.par_chunks(2)))
        .for_each(|((dx, x), (dy, st))| {
            let (mean, rstd) = (st[0], st[1]);
            let (mut sum_g, mut sum_gx) = (0.0f32, 0.0f32);
            for j in 0..h {
                let g = dy[j] * gain[j];
                let xhat = (x[j] - mean) * rstd;
                sum_g += g;
                sum_gx += g * xhat;
            }
            let (mg, mgx) = (sum_g / h as f32, sum_gx / h as f32);
            for j in 0..h {
                let xhat = (x[j] - mean) * rstd;
                dx[j] += rstd * (dy[j] * gain[j] - mg - xhat * mgx);
            }
        });
}

/// Accumulates the layer norm's gain and bias gradients: `d_gain += sum_rows dout * xhat`,
/// `d_bias += sum_rows dout` (columns split across workers, rows summed in order).
pub fn layer_norm_param_grads(
    x: &[f32],
    stats: &[f32],
    dout: &[f32],
    d_gain: &mut [f32],
    d_bias: &mut [f32],
) {
    let h = d_gain.len();
    let rows = x.len() / h;
    d_gain
        .par_iter_mut()
        .zip(d_bias.par_iter_mut())
        .enumerate()
        .for_each(|(j, (dg, db))| {
            let (mut sg, mut sb) = (0.0f32, 0.0f32);
            for r in 0..rows {
                let xhat = (x[r * h + j] - stats[2 * r]) * stats[2 * r + 1];
                sg += dout[r * h + j] * xhat;
                sb += dout[r * h + j];
            }
            *dg += sg;
            *db += sb;
        });
}

/// GELU, tanh form (GPT-2, `jax.nn.gelu(approximate=True)`).
pub fn gelu(z: f32) -> f32 {
    let t = (SQRT_2_OVER_PI * (z + GELU_C * z * z * z)).tanh();
    0.5 * z * (1.0 + t)
}

/// d gelu / dz.
pub fn gelu_grad(z: f32) -> f32 {
    let t = (SQRT_2_OVER_PI * (z + GELU_C * z * z * z)).tanh();
    0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_C * z * z)
}

/// `out = gelu(z)` element-wise.
pub fn gelu_into(z: &[f32], out: &mut [f32]) {
    out.par_chunks_mut(4096)
        .zip(z.par_chunks(4096))
        .for_each(|(o, z)| o.iter_mut().zip(z).for_each(|(o, z)| *o = gelu(*z)));
}

/// `z = gelu(z)` element-wise.
pub fn gelu_in_place(z: &mut [f32]) {
    z.par_chunks_mut(4096)
        .for_each(|z| z.iter_mut().for_each(|v| *v = gelu(*v)));
}

/// `dz = dg * gelu'(z)`, in place over `dg`.
pub fn gelu_backward_in_place(z: &[f32], dg: &mut [f32]) {
    dg.par_chunks_mut(4096)
        .zip(z.par_chunks(4096))
        .for_each(|(d, z)| d.iter_mut().zip(z).for_each(|(d, z)| *d *= gelu_grad(*z)));
}

/// Every row of `m` (rows of stride `ld`, first `bias.len()` columns) gets `bias` added.
pub fn add_bias(m: &mut [f32], ld: usize, bias: &[f32]) {
    m.par_chunks_mut(ld).for_each(|row| {
        row.iter_mut().zip(bias).for_each(|(x, b)| *x += b);
    });
}

/// Each row of `out` (`rows x h`) = `a` row + `bias`.
pub fn copy_plus_bias(a: &[f32], bias: &[f32], out: &mut [f32]) {
    let h = bias.len();
    out.par_chunks_mut(h)
        .zip(a.par_chunks(h))
        .for_each(|(o, a)| {
            for ((o, a), b) in o.iter_mut().zip(a).zip(bias) {
                *o = a + b;
            }
        });
}

/// `acc[j] += sum_r m[r * ld + j]` for the `acc.len()` columns of `rows` rows.
pub fn add_column_sums(m: &[f32], rows: usize, ld: usize, acc: &mut [f32]) {
    acc.par_iter_mut().enumerate().for_each(|(j, a)| {
        let mut s = 0.0f32;
        for r in 0..rows {
            s += m[r * ld + j];
        }
        *a += s;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_grad_matches_central_differences() {
        for z in [-4.0f32, -1.3, -0.2, 0.0, 0.7, 2.5] {
            let e = 1e-2f64;
            let f = |z: f64| {
                let t = (0.797_884_560_802_865_4 * (z + 0.044_715 * z * z * z)).tanh();
                0.5 * z * (1.0 + t)
            };
            let fd = (f(z as f64 + e) - f(z as f64 - e)) / (2.0 * e);
            assert!((gelu_grad(z) as f64 - fd).abs() < 1e-4, "z = {z}");
        }
    }

    #[test]
    fn row_parallel_gemm_equals_one_call() {
        let (m, k, n) = (203, 37, 29);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 11) as f32 * 0.25).collect();
        let mut want = vec![1.0f32; m * n];
        sgemm(
            1.5,
            MatRef::new(&a, m, k),
            MatRef::new(&b, k, n),
            0.5,
            &mut want,
            n,
        );
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let mut got = vec![1.0f32; m * n];
        pool.install(|| {
            gemm(
                1.5,
                MatRef::new(&a, m, k),
                MatRef::new(&b, k, n),
                0.5,
                &mut got,
                n,
            )
        });
        assert_eq!(got, want);
        // A transposed view (the weight-gradient GEMMs read activations transposed).
        let at: Vec<f32> = (0..k * m).map(|x| a[(x % m) * k + x / m]).collect();
        let mut got_t = vec![1.0f32; m * n];
        pool.install(|| {
            gemm(
                1.5,
                MatRef::new(&at, k, m).t(),
                MatRef::new(&b, k, n),
                0.5,
                &mut got_t,
                n,
            )
        });
        assert_eq!(got_t, want);
    }

    #[test]
    fn layer_norm_backward_matches_central_differences() {
        let h = 6;
        let x: Vec<f32> = vec![0.3, -1.2, 2.0, 0.5, -0.7, 1.1];
        let gain: Vec<f32> = vec![1.1, 0.9, 1.0, 1.2, 0.8, 1.05];
        let bias = vec![0.0f32; h];
        let dy: Vec<f32> = vec![0.5, -0.3, 0.8, -1.0, 0.2, 0.4];
        let mut out = vec![0.0; h];
        let mut st = vec![0.0; 2];
        layer_norm(&x, &gain, &bias, &mut out, &mut st);
        let mut dx = vec![0.0; h];
        layer_norm_backward(&x, &st, &gain, &dy, &mut dx);
        for i in 0..h {
            let loss = |xi: f32| {
                let mut xx = x.clone();
                xx[i] = xi;
                let mut o = vec![0.0; h];
                let mut s = vec![0.0; 2];
                layer_norm(&xx, &gain, &bias, &mut o, &mut s);
                o.iter().zip(&dy).map(|(a, b)| (a * b) as f64).sum::<f64>()
            };
            let e = 1e-2;
            let fd = (loss(x[i] + e) - loss(x[i] - e)) / (2.0 * e as f64);
            assert!(
                (dx[i] as f64 - fd).abs() < 2e-3,
                "x[{i}]: {} vs {fd}",
                dx[i]
            );
        }
    }
}
