//! Blocked single-precision GEMM, C = alpha * A * B + beta * C, on strided row-major views,
//! via `matrixmultiply` (packed panels, SIMD microkernels with runtime dispatch). Its k-loop
//! is blocked, so every dot product is accumulated as partial sums of a few hundred terms:
//! this is what keeps the attention error at the level Rabe–Staats report (docs/papers.md, Rabe & Staats).
//! Cost: 2*m*n*k FLOPs, no heap allocation beyond matrixmultiply's packing buffers.

/// Upper bound of the packing buffers one `sgemm` call allocates (matrixmultiply packs at
/// most KC x MC of A and KC x NC of B, KC = 256, MC = 64, NC = 1024 for f32, rounded up to
/// its microkernel's 16-wide panels, plus alignment). Variants' memory predictions leave
/// this out; the measured overhead may exceed the prediction by this much per worker.
pub const PACK_BYTES_MAX: u64 = 4 * 256 * (64 + 16 + 1024 + 16) + 64;

/// A row-major matrix view: element (i, j) at `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub struct MatRef<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> MatRef<'a> {
    /// A contiguous row-major `rows x cols` matrix.
    pub fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        MatRef {
            data,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose, as a view (no copy).
    pub fn t(self) -> Self {
        MatRef {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
        }
    }

    fn check(&self) {
        if self.rows > 0 && self.cols > 0 {
            let last = (self.rows - 1) * self.rs + (self.cols - 1) * self.cs;
            assert!(last < self.data.len(), "matrix view out of bounds");
        }
    }
}

/// C (`m x n`, row stride `ldc`) = alpha * A * B + beta * C.
pub fn sgemm(alpha: f32, a: MatRef, b: MatRef, beta: f32, c: &mut [f32], ldc: usize) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "inner dimensions differ");
    a.check();
    b.check();
    if m == 0 || n == 0 {
        return;
    }
    assert!((m - 1) * ldc + n <= c.len(), "output view out of bounds");
    if k == 0 {
        for i in 0..m {
            for x in &mut c[i * ldc..i * ldc + n] {
                *x *= beta;
            }
        }
        return;
    }
    // SAFETY: all three views were bounds-checked above against their slices; C is borrowed
    // mutably and cannot alias A or B.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.data.as_ptr(),
            a.rs as isize,
            a.cs as isize,
            b.data.as_ptr(),
            b.rs as isize,
            b.cs as isize,
            beta,
            c.as_mut_ptr(),
            ldc as isize,
            1,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_plain_product_on_ragged_sizes() {
        for (m, k, n) in [(1, 1, 1), (3, 5, 7), (17, 33, 9), (64, 1, 3)] {
            let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.5).collect();
            let mut c = vec![1.0f32; m * n];
            // B given transposed in memory (n x k), read through a transposed view.
            let bt: Vec<f32> = (0..n * k).map(|x| b[(x % k) * n + x / k]).collect();
            sgemm(
                2.0,
                MatRef::new(&a, m, k),
                MatRef::new(&bt, n, k).t(),
                1.0,
                &mut c,
                n,
            );
            for i in 0..m {
                for j in 0..n {
                    let want: f32 =
                        1.0 + 2.0 * (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum::<f32>();
                    assert!(
                        (c[i * n + j] - want).abs() < 1e-4,
                        "({m},{k},{n}) at ({i},{j})"
                    );
                }
            }
        }
    }
}
