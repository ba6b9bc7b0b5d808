//! The gradient products of one (query block, key block) pair, shared by the tiled
//! backward passes (FlashAttention-2's backward, Dao 2023 Alg. 2; Rabe & Staats Sec. 5.2,
//! pass 2; docs/papers.md): P = exp(S - L) from the row logsumexp, dV += P^T dO,
//! dP = dO V^T, dS = P * (dP - D), dQ += dS K, dK += dS^T Q. The passes differ in which
//! block they own and where the scale 1/sqrt(d) goes, so every product takes its own alpha
//! and beta. Time 4 GEMMs of rows x kn x d plus O(rows * kn); no allocation.

use super::gemm::{sgemm, MatRef};
use super::softmax::softmax_grad_rows;

/// Turns the scores S of `p` (rows of `kn`, masked entries -inf) into P = exp(S - L) in
/// place, with `lse` the rows' L; a row that sees no key (L = -inf) becomes 0.
pub fn probs_from_lse(p: &mut [f32], lse: &[f32], kn: usize) {
    for (row, &l) in p.chunks_mut(kn).zip(lse) {
        for x in row.iter_mut() {
            *x = if l == f32::NEG_INFINITY {
                0.0
            } else {
                (*x - l).exp()
            };
        }
    }
}

/// The operands of one block: `rows` query rows against `kn` keys, all of width `d`.
pub struct Block<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub d_out: &'a [f32],
    /// D = rowsum(dO * O) of the rows.
    pub d_rows: &'a [f32],
    pub rows: usize,
    pub kn: usize,
    pub d: usize,
}

/// An output of the products: `c = alpha * product + beta * c`.
pub struct Acc<'a> {
    pub c: &'a mut [f32],
    pub alpha: f32,
    pub beta: f32,
}

/// From P in `p` (rows x kn): `dv` gets P^T dO, then dS = P * (dO V^T - D) is formed in
/// `ds` (rows x kn scratch), `dq` gets dS K and `dk` gets dS^T Q.
pub fn products(b: &Block, p: &[f32], ds: &mut [f32], dv: Acc, dk: Acc, dq: Acc) {
    let (rows, kn, d) = (b.rows, b.kn, b.d);
    sgemm(
        dv.alpha,
        MatRef::new(p, rows, kn).t(),
        MatRef::new(b.d_out, rows, d),
        dv.beta,
        dv.c,
        d,
    );
    sgemm(
        1.0,
        MatRef::new(b.d_out, rows, d),
        MatRef::new(b.v, kn, d).t(),
        0.0,
        ds,
        kn,
    );
    softmax_grad_rows(ds, p, b.d_rows, kn);
    sgemm(
        dq.alpha,
        MatRef::new(ds, rows, kn),
        MatRef::new(b.k, kn, d),
        dq.beta,
        dq.c,
        d,
    );
    sgemm(
        dk.alpha,
        MatRef::new(ds, rows, kn).t(),
        MatRef::new(b.q, rows, d),
        dk.beta,
        dk.c,
        d,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The products against their definitions, written out element by element.
    #[test]
    fn products_match_their_definitions() {
        let (rows, kn, d) = (3, 4, 2);
        let val = |i: usize, s: f32| (i as f32 * 0.37 + s).sin() * 0.5;
        let q: Vec<f32> = (0..rows * d).map(|i| val(i, 0.1)).collect();
        let k: Vec<f32> = (0..kn * d).map(|i| val(i, 0.2)).collect();
        let v: Vec<f32> = (0..kn * d).map(|i| val(i, 0.3)).collect();
        let go: Vec<f32> = (0..rows * d).map(|i| val(i, 0.4)).collect();
        let dd: Vec<f32> = (0..rows).map(|i| val(i, 0.5)).collect();
        let mut p: Vec<f32> = (0..rows * kn).map(|i| val(i, 0.6)).collect();
        // A row with L = -inf sees no key.
        let lse = [0.3f32, f32::NEG_INFINITY, -0.2];
        let s = p.clone();
        probs_from_lse(&mut p, &lse, kn);
        for r in 0..rows {
            for j in 0..kn {
                let want = if r == 1 {
                    0.0
                } else {
                    (s[r * kn + j] - lse[r]).exp()
                };
                assert_eq!(p[r * kn + j], want);
            }
        }
        let b = Block {
            q: &q,
            k: &k,
            v: &v,
            d_out: &go,
            d_rows: &dd,
            rows,
            kn,
            d,
        };
        let (mut ds, mut dv, mut dk, mut dq) = (
            vec![0.0; rows * kn],
            vec![1.0; kn * d],
            vec![1.0; kn * d],
            vec![0.0; rows * d],
        );
        products(
            &b,
            &p,
            &mut ds,
            Acc {
                c: &mut dv,
                alpha: 1.0,
                beta: 1.0,
            },
            Acc {
                c: &mut dk,
                alpha: 0.5,
                beta: 0.0,
            },
            Acc {
                c: &mut dq,
                alpha: 2.0,
                beta: 0.0,
            },
        );
        let close = |a: f32, b: f32| (a - b).abs() <= 1e-5 * (1.0 + b.abs());
        for r in 0..rows {
            for j in 0..kn {
                let dp: f32 = (0..d).map(|c| go[r * d + c] * v[j * d + c]).sum();
                assert!(close(ds[r * kn + j], p[r * kn + j] * (dp - dd[r])));
            }
        }
        for j in 0..kn {
            for c in 0..d {
                let want_dv = 1.0
                    + (0..rows)
                        .map(|r| p[r * kn + j] * go[r * d + c])
                        .sum::<f32>();
                let want_dk = 0.5
                    * (0..rows)
                        .map(|r| ds[r * kn + j] * q[r * d + c])
                        .sum::<f32>();
                assert!(close(dv[j * d + c], want_dv));
                assert!(close(dk[j * d + c], want_dk));
            }
        }
        for r in 0..rows {
            for c in 0..d {
                let want = 2.0 * (0..kn).map(|j| ds[r * kn + j] * k[j * d + c]).sum::<f32>();
                assert!(close(dq[r * d + c], want));
            }
        }
    }
}
