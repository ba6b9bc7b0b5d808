//! The gradient products of one (query block, key block) pair, shared by the tiled
//! backward passes (FlashAttention-2's backward, Dao 2023 Alg. 2; Rabe & Staats Sec. 5.2,
//! pass 2; docs/papers.md): S = Q K^T, P = exp(S c - L) from the row logsumexp,
//! dV += P^T dO, dP = dO V^T, dS = s P * (dP - D), dQ += dS K, dK += dS^T Q, every product
//! on the forward's register tiles (`tiles::gemm`) with K^T and V^T packed once per key
//! block by the caller. The passes differ in which block they own and where the scale
//! 1/sqrt(d) goes (`s`, or a pre-scaled Q). Time 5 GEMMs of rows x kn x d plus
//! O(rows * kn); no allocation.

use super::isa::Isa;
use super::simd::KC;
use super::softmax::softmax_grad_rows;
use super::tiles::{self, gemm, AOp, BOp, Out};

/// S = Q K^T (`rows` x `kn`) into `p` (rows `ldp` floats apart), from Q (`rows` x `d`) and
/// K^T (`d` rows of at least `kn` floats at stride `ldt`).
#[allow(clippy::too_many_arguments)]
pub fn scores(
    isa: Isa,
    q: &[f32],
    kt: &[f32],
    ldt: usize,
    (rows, kn, d): Dims,
    p: &mut [f32],
    ldp: usize,
) {
    gemm(
        isa,
        AOp::rows(q, rows, d),
        BOp::new(kt, d, kn, ldt),
        p,
        ldp,
        Out::Store,
    );
}

/// Whether `products` can form dS over P in place (no dP scratch): the dP product's
/// reduction over the head dim `d` fits one block of the tiles.
pub fn ds_in_place(d: usize) -> bool {
    d <= KC
}

/// (rows, keys, head dim) of a block.
pub type Dims = (usize, usize, usize);

/// Turns the scores S of `p` (rows of `kn` at stride `ldp`, masked entries -inf) into
/// P = exp(S c - L) in place, with `lse` the rows' L (natural log, of the scores times
/// `c`); a row that sees no key (L = -inf) becomes 0. By the kernels' vector exp (2^x).
pub fn probs_from_lse(isa: Isa, p: &mut [f32], lse: &[f32], (kn, ldp): (usize, usize), c: f32) {
    let log2e = std::f32::consts::LOG2_E;
    for (row, &l) in p.chunks_mut(ldp).zip(lse) {
        let row = &mut row[..kn];
        if l == f32::NEG_INFINITY {
            row.fill(0.0);
        } else {
            tiles::exp_sum(isa, row, c * log2e, l * log2e);
        }
    }
}

/// The operands of one block: `rows` query rows against `kn` keys, all of width `d`; K^T
/// and V^T as `d` rows of at least `kn` floats at stride `ldt` (`tiles::pack_t`); P and dS
/// as `rows` rows of `kn` at stride `ldp`.
pub struct Block<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub kt: &'a [f32],
    pub vt: &'a [f32],
    pub ldt: usize,
    pub d_out: &'a [f32],
    /// D = rowsum(dO * O) of the rows.
    pub d_rows: &'a [f32],
    pub rows: usize,
    pub kn: usize,
    pub d: usize,
    pub ldp: usize,
}

/// Where a product goes: `c = product` (`add` false) or `c += product`.
pub struct Acc<'a> {
    pub c: &'a mut [f32],
    pub add: bool,
}

impl Acc<'_> {
    fn out(&self) -> Out<'static> {
        if self.add {
            Out::Add
        } else {
            Out::Store
        }
    }
}

/// From P in `p` (rows x kn at stride `ldp`): `dv` gets P^T dO, then dS = `s` P *
/// (dO V^T - D) is formed, `dq` gets dS K and `dk` gets dS^T Q. dS replaces P in `p`, by
/// the dP product's epilogue, when `dp` is `None` (head dims up to `KC`, whose dP the tiles
/// sum in one block); with `dp` (scratch of P's layout) dP is formed there and dS left in
/// it, P kept.
#[allow(clippy::too_many_arguments)]
pub fn products(
    isa: Isa,
    b: &Block,
    p: &mut [f32],
    dp: Option<&mut [f32]>,
    s: f32,
    dv: Acc,
    dk: Acc,
    dq: Acc,
) {
    let (rows, kn, d, ldp) = (b.rows, b.kn, b.d, b.ldp);
    let len = rows.saturating_sub(1) * ldp + kn;
    let p = &mut p[..len];
    // P^T and dS^T are read in place: the transposes of rows x kn matrices.
    let pt = AOp::transposed(&*p, kn, rows, ldp);
    gemm(isa, pt, BOp::new(b.d_out, rows, d, d), dv.c, d, dv.out());
    let vt = BOp::new(b.vt, d, kn, b.ldt);
    let dot = AOp::rows(b.d_out, rows, d);
    let ds: &[f32] = match dp {
        Some(dp) => {
            let dp = &mut dp[..len];
            gemm(isa, dot, vt, dp, ldp, Out::Store);
            softmax_grad_rows(dp, p, b.d_rows, (kn, ldp), s);
            dp
        }
        None => {
            gemm(isa, dot, vt, p, ldp, Out::SoftmaxGrad(b.d_rows, s));
            p
        }
    };
    let k = BOp::new(b.k, kn, d, d);
    let dsr = AOp {
        data: ds,
        rows,
        k: kn,
        rs: ldp,
        cs: 1,
    };
    gemm(isa, dsr, k, dq.c, d, dq.out());
    let dst = AOp::transposed(ds, kn, rows, ldp);
    gemm(isa, dst, BOp::new(b.q, rows, d, d), dk.c, d, dk.out());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The block's products against their definitions, written out element by element, on
    /// every kernel path of this CPU, at a ragged shape (rows and keys not multiples of a
    /// tile, K^T and V^T at a padded stride), with P's rows packed and at a padded stride
    /// (NaN in the padding, which nothing may read), dS formed in a dP scratch and over P
    /// in place (the same bits).
    #[test]
    fn products_match_their_definitions() {
        let (rows, kn, d, ldt) = (7, 19, 5, 32);
        let val = |i: usize, s: f32| (i as f32 * 0.37 + s).sin() * 0.5;
        let q: Vec<f32> = (0..rows * d).map(|i| val(i, 0.1)).collect();
        let k: Vec<f32> = (0..kn * d).map(|i| val(i, 0.2)).collect();
        let v: Vec<f32> = (0..kn * d).map(|i| val(i, 0.3)).collect();
        let go: Vec<f32> = (0..rows * d).map(|i| val(i, 0.4)).collect();
        let dd: Vec<f32> = (0..rows).map(|i| val(i, 0.5)).collect();
        let t = |m: &[f32]| {
            let mut t = vec![f32::NAN; d * ldt];
            for j in 0..kn {
                for c in 0..d {
                    t[c * ldt + j] = m[j * d + c];
                }
            }
            t
        };
        let (kt, vt) = (t(&k), t(&v));
        // Row 1 sees no key (L = -inf); row 3's last two keys are masked.
        let mut lse: Vec<f32> = (0..rows).map(|i| val(i, 0.7) + 2.0).collect();
        lse[1] = f32::NEG_INFINITY;
        let (c, s) = (0.8f32, 0.5f32);
        let close = |a: f32, b: f32| (a - b).abs() <= 2e-5 * (1.0 + b.abs());
        for isa in Isa::available_paths() {
            for ldp in [kn, kn + 5] {
                let b = Block {
                    q: &q,
                    k: &k,
                    kt: &kt,
                    vt: &vt,
                    ldt,
                    d_out: &go,
                    d_rows: &dd,
                    rows,
                    kn,
                    d,
                    ldp,
                };
                let at = |r: usize, j: usize| r * ldp + j;
                let mut p = vec![f32::NAN; rows * ldp];
                scores(isa, &q, &kt, ldt, (rows, kn, d), &mut p, ldp);
                for r in 0..rows {
                    for j in 0..kn {
                        let want: f32 = (0..d).map(|x| q[r * d + x] * k[j * d + x]).sum();
                        assert!(close(p[at(r, j)], want), "{isa} {ldp}: S at ({r}, {j})");
                    }
                }
                let sc = p.clone();
                p[at(3, kn - 2)..at(3, kn)].fill(f32::NEG_INFINITY);
                probs_from_lse(isa, &mut p, &lse, (kn, ldp), c);
                for r in 0..rows {
                    for j in 0..kn {
                        let want = if r == 1 || (r == 3 && j >= kn - 2) {
                            0.0
                        } else {
                            (c * sc[at(r, j)] - lse[r]).exp()
                        };
                        assert!(close(p[at(r, j)], want), "{isa} {ldp}: P at ({r}, {j})");
                    }
                }
                // dS in a scratch (P kept), then over P in place.
                let grads = |p: &mut [f32], dp: Option<&mut [f32]>| {
                    let (mut dv, mut dk, mut dq) =
                        (vec![1.0; kn * d], vec![1.0; kn * d], vec![1.0; rows * d]);
                    let acc = |c, add| Acc { c, add };
                    let (dv_a, dk_a, dq_a) =
                        (acc(&mut dv, true), acc(&mut dk, false), acc(&mut dq, true));
                    products(isa, &b, p, dp, s, dv_a, dk_a, dq_a);
                    (dv, dk, dq)
                };
                let mut ds = vec![f32::NAN; rows * ldp];
                let kept = p.clone();
                let (dv, dk, dq) = grads(&mut p, Some(&mut ds));
                assert_eq!(
                    p.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    kept.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{isa}: P kept"
                );
                let mut over = p.clone();
                let fused = grads(&mut over, None);
                for r in 0..rows {
                    for j in 0..kn {
                        let dp: f32 = (0..d).map(|x| go[r * d + x] * v[j * d + x]).sum();
                        let want = s * p[at(r, j)] * (dp - dd[r]);
                        let got = ds[at(r, j)];
                        assert!(close(got, want), "{isa} {ldp}: dS at ({r}, {j})");
                        assert_eq!(
                            over[at(r, j)].to_bits(),
                            got.to_bits(),
                            "{isa}: dS in place"
                        );
                    }
                }
                assert!(
                    fused == (dv.clone(), dk.clone(), dq.clone()),
                    "{isa} {ldp}: in place"
                );
                for j in 0..kn {
                    for x in 0..d {
                        let want_dv =
                            1.0 + (0..rows).map(|r| p[at(r, j)] * go[r * d + x]).sum::<f32>();
                        let want_dk: f32 = (0..rows).map(|r| ds[at(r, j)] * q[r * d + x]).sum();
                        assert!(
                            close(dv[j * d + x], want_dv),
                            "{isa} {ldp}: dV at ({j}, {x})"
                        );
                        assert!(
                            close(dk[j * d + x], want_dk),
                            "{isa} {ldp}: dK at ({j}, {x})"
                        );
                    }
                }
                for r in 0..rows {
                    for x in 0..d {
                        let want = 1.0 + (0..kn).map(|j| ds[at(r, j)] * k[j * d + x]).sum::<f32>();
                        assert!(close(dq[r * d + x], want), "{isa} {ldp}: dQ at ({r}, {x})");
                    }
                }
            }
        }
    }
}
