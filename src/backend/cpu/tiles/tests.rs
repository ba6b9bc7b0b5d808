//! Every tile, softmax piece and packing routine against plain f64 loops, on ragged sizes
//! (partial register tiles, partial vectors, k beyond one partial sum), on every kernel
//! path this CPU has; a path it lacks is skipped with a note.

use crate::backend::cpu::kernel_paths::values;
use half::bf16;

use super::*;
use crate::backend::cpu::simd::{exp2_scalar, KC};

/// The paths to test here (printing the ones skipped).
fn paths() -> Vec<Isa> {
    Isa::ALL
        .into_iter()
        .filter(|i| {
            let ok = i.available();
            if !ok {
                println!("note: kernel path {i} not available on this CPU, skipped");
            }
            ok
        })
        .collect()
}

fn reference(a: &AOp<f32>, b: &BOp<f32>, i: usize, j: usize) -> f64 {
    (0..a.k)
        .map(|p| a.data[i * a.rs + p * a.cs] as f64 * b.data[p * b.ld + j] as f64)
        .sum()
}

const SIZES: [(usize, usize, usize); 9] = [
    (1, 1, 1),
    (3, 5, 7),
    (6, 64, 64),
    (7, 64, 65),
    (13, 17, 33),
    (5, 300, 16),
    (12, 9, 100),
    (1, 600, 3),
    (19, 2, 129),
];

#[test]
fn f32_tiles_match_plain_products_with_every_epilogue() {
    for isa in paths() {
        for (m, k, n) in SIZES {
            // A read transposed (column stride > 1) half the time, B with a wider stride.
            let transposed = (m + k) % 2 == 0;
            let ad = values(m * k + 3, 1);
            let (rs, cs) = if transposed { (1, m) } else { (k, 1) };
            let a = AOp {
                data: &ad,
                rows: m,
                k,
                rs,
                cs,
            };
            let ldb = n + 3;
            let bd = values(k * ldb, 2);
            let b = BOp {
                data: &bd,
                k,
                n,
                ld: ldb,
            };
            let ldc = n + 1;
            let c0 = values(m * ldc, 3);
            let s = values(n, 4);
            let dr = values(m, 7);
            // The dS epilogue needs the whole sum in one block.
            let modes = if k <= KC { 5 } else { 4 };
            for mode in 0..modes {
                let mut c = c0.clone();
                let mut cm = vec![0.25f32; n];
                let out = match mode {
                    0 => Out::Store,
                    1 => Out::Add,
                    2 => Out::ScaleAdd(&s),
                    3 => Out::StoreColMax(&mut cm),
                    _ => Out::SoftmaxGrad(&dr, 0.75),
                };
                gemm(isa, a, b, &mut c, ldc, out);
                let mut colmax = vec![0.25f64; n];
                for i in 0..m {
                    for j in 0..n {
                        let p = reference(&a, &b, i, j);
                        let old = c0[i * ldc + j] as f64;
                        let want = match mode {
                            0 | 3 => p,
                            1 => old + p,
                            2 => old * s[j] as f64 + p,
                            _ => 0.75 * old * (p - dr[i] as f64),
                        };
                        colmax[j] = colmax[j].max(p);
                        let got = c[i * ldc + j] as f64;
                        assert!(
                            (got - want).abs() <= 1e-5 * (1.0 + k as f64).sqrt(),
                            "{isa} ({m},{k},{n}) mode {mode} at ({i},{j}): {got} vs {want}"
                        );
                    }
                    // The padding column of C is never written.
                    if n < ldc {
                        assert_eq!(c[i * ldc + n], c0[i * ldc + n], "{isa} wrote past n");
                    }
                }
                if mode == 3 {
                    for j in 0..n {
                        assert!((cm[j] as f64 - colmax[j]).abs() <= 1e-5 * (1.0 + k as f64));
                    }
                }
            }
        }
    }
}

#[test]
fn skewed_strides_are_whole_lines_off_multiples_of_eight() {
    assert_eq!(
        [1, 16, 32, 64, 80, 128, 129, 256, 512].map(skew_stride),
        [16, 16, 32, 64, 80, 144, 144, 272, 528]
    );
    for n in 1..2048 {
        let ld = skew_stride(n);
        assert!(ld >= n && ld < n + 2 * LANES_MAX, "{n}: {ld}");
        assert!(
            ld.is_multiple_of(LANES_MAX) && !(ld / LANES_MAX).is_multiple_of(8),
            "{n}: {ld}"
        );
    }
}

#[test]
#[should_panic(expected = "the dS epilogue needs the whole sum")]
fn the_ds_epilogue_refuses_a_split_reduction() {
    let (m, k, n) = (2, KC + 1, 3);
    let (ad, bd, dr) = (values(m * k, 1), values(k * n, 2), values(m, 3));
    let a = AOp::rows(&ad, m, k);
    let b = BOp::new(&bd, k, n, n);
    let mut c = vec![0.0; m * n];
    gemm(Isa::Portable, a, b, &mut c, n, Out::SoftmaxGrad(&dr, 1.0));
}

#[test]
fn long_reductions_are_summed_in_partial_sums() {
    // k = 3 * KC + 5: the tile adds four partial sums into C; the result is still the
    // product (the blocking changes the rounding order only).
    for isa in paths() {
        let (m, k, n) = (3, 3 * KC + 5, 20);
        let ad = values(m * k, 5);
        let bd = values(k * n, 6);
        let a = AOp {
            data: &ad,
            rows: m,
            k,
            rs: k,
            cs: 1,
        };
        let b = BOp {
            data: &bd,
            k,
            n,
            ld: n,
        };
        let mut c = vec![0.0f32; m * n];
        gemm(isa, a, b, &mut c, n, Out::Store);
        for i in 0..m {
            for j in 0..n {
                let want = reference(&a, &b, i, j);
                assert!((c[i * n + j] as f64 - want).abs() < 1e-4, "{isa} ({i},{j})");
                // Bit for bit: partial sums of KC terms in order (fused on the x86 paths,
                // multiply then add on the portable one), the first stored, the rest added.
                let mut total = 0.0f32;
                for (blk, p0) in (0..k).step_by(KC).enumerate() {
                    let mut acc = 0.0f32;
                    for p in p0..k.min(p0 + KC) {
                        let (x, y) = (ad[i * k + p], bd[p * n + j]);
                        acc = if isa == Isa::Portable {
                            x * y + acc
                        } else {
                            x.mul_add(y, acc)
                        };
                    }
                    total = if blk == 0 { acc } else { total + acc };
                }
                assert_eq!(c[i * n + j].to_bits(), total.to_bits(), "{isa} ({i},{j})");
            }
        }
    }
}

fn to_bf16_bits(x: &[f32]) -> Vec<u16> {
    x.iter().map(|v| bf16::from_f32(*v).to_bits()).collect()
}

fn bf(x: u16) -> f64 {
    bf16::from_bits(x).to_f64()
}

#[test]
fn bf16_pair_tiles_match_plain_products() {
    let isa = Isa::Avx512Bf16;
    if !isa.available() {
        println!("note: kernel path {isa} not available on this CPU, skipped");
        return;
    }
    for (m, k2, n) in [
        (1, 1, 1),
        (6, 32, 64),
        (7, 33, 65),
        (13, 3, 17),
        (2, 300, 31),
    ] {
        let k = 2 * k2;
        let a16 = to_bf16_bits(&values(m * k, 7));
        let b_rows = to_bf16_bits(&values(k * n, 8));
        // B pair-interleaved and padded: row p holds (b[2p][j], b[2p+1][j]) for j < pad(n).
        let ld = 2 * pad_lanes(n);
        let mut bp = vec![0u16; k2 * ld];
        for p in 0..k2 {
            for j in 0..n {
                bp[p * ld + 2 * j] = b_rows[2 * p * n + j];
                bp[p * ld + 2 * j + 1] = b_rows[(2 * p + 1) * n + j];
            }
        }
        let a = AOp {
            data: &a16,
            rows: m,
            k: k2,
            rs: k,
            cs: 2,
        };
        let b = BOp {
            data: &bp,
            k: k2,
            n,
            ld,
        };
        let ldc = n + 2;
        let c0 = values(m * ldc, 9);
        let s = values(n, 10);
        for mode in 0..4 {
            let mut c = c0.clone();
            let mut cm = vec![f32::NEG_INFINITY; n];
            let out = match mode {
                0 => Out::Store,
                1 => Out::Add,
                2 => Out::ScaleAdd(&s),
                _ => Out::StoreColMax(&mut cm),
            };
            gemm_bf16(isa, a, b, &mut c, ldc, out);
            for i in 0..m {
                for j in 0..n {
                    let p: f64 = (0..k)
                        .map(|t| bf(a16[i * k + t]) * bf(b_rows[t * n + j]))
                        .sum();
                    let old = c0[i * ldc + j] as f64;
                    let want = match mode {
                        0 | 3 => p,
                        1 => old + p,
                        _ => old * s[j] as f64 + p,
                    };
                    let got = c[i * ldc + j] as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * (1.0 + k as f64).sqrt(),
                        "({m},{k},{n}) mode {mode} at ({i},{j}): {got} vs {want}"
                    );
                    if mode == 3 {
                        assert!(cm[j] as f64 >= got - 1e-6);
                    }
                }
                assert_eq!(c[i * ldc + n], c0[i * ldc + n], "wrote past n");
            }
        }
    }
}

#[test]
fn exp2_is_accurate_and_handles_the_edges() {
    let mut xs: Vec<f32> = (-2000..=2000).map(|i| i as f32 * 0.0625).collect();
    xs.extend([
        f32::NEG_INFINITY,
        -127.0,
        -125.6,
        -125.4,
        127.9,
        128.0,
        200.0,
        0.5,
        -0.5,
    ]);
    for isa in paths() {
        let mut y = xs.clone();
        exp2(isa, &mut y);
        for (x, got) in xs.iter().zip(&y) {
            let s = exp2_scalar(*x);
            if *x <= -125.5 {
                assert_eq!(*got, 0.0, "{isa} 2^{x}");
            } else if *x >= 128.0 {
                assert_eq!(*got, f32::INFINITY, "{isa} 2^{x}");
            } else {
                let want = (*x as f64).exp2();
                let rel = ((*got as f64) - want).abs() / want;
                assert!(rel < 4e-7, "{isa} 2^{x}: {got} vs {want}");
                // The portable lane function and the vector ones agree closely.
                assert!(((*got - s) / s).abs() < 2e-7, "{isa} 2^{x}: {got} vs {s}");
            }
        }
        let mut nan = [f32::NAN];
        exp2(isa, &mut nan);
        assert!(nan[0].is_nan(), "{isa}: NaN must stay NaN");
    }
}

#[test]
fn row_softmax_pieces_match_plain_loops() {
    for isa in paths() {
        for n in [0usize, 1, 7, 8, 17, 64, 100, 5000, 9000] {
            let x = values(n, n as u32 + 11);
            let want_max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(row_max(isa, &x), want_max, "{isa} n={n}");
            let mut y = x.clone();
            let (c, m) = (0.7f32, 0.3f32);
            let sum = exp_sum(isa, &mut y, c, m * c);
            let mut want_sum = 0.0f64;
            for (a, b) in x.iter().zip(&y) {
                let e = ((*a as f64 - m as f64) * c as f64).exp2();
                want_sum += e;
                assert!((*b as f64 - e).abs() <= 1e-6 * e, "{isa} n={n}");
            }
            assert!(
                (sum as f64 - want_sum).abs() <= 1e-6 * want_sum.max(1.0),
                "{isa}"
            );
            let mut z = x.clone();
            scale(isa, &mut z, 3.0);
            assert!(z.iter().zip(&x).all(|(a, b)| *a == 3.0 * b));
        }
        // A fully masked row is zeros with max -inf; a partly masked one sums to 1.
        let mut row = values(40, 3);
        assert_eq!(
            softmax_row(isa, &mut row, 0, 1.0, true, true).0,
            f32::NEG_INFINITY
        );
        assert!(row.iter().all(|x| *x == 0.0));
        let mut row = values(40, 3);
        softmax_row(isa, &mut row, 25, 1.0, true, true);
        let total: f32 = row.iter().sum();
        assert!((total - 1.0).abs() < 1e-6 && row[25..].iter().all(|x| *x == 0.0));
    }
}

/// Scalar model of flash's column step, in f64.
struct ColModel {
    m2: Vec<f64>,
    l: Vec<f64>,
}

#[test]
fn column_softmax_and_mask_match_the_online_softmax() {
    for isa in paths() {
        for bf in [false, true] {
            if bf && !isa.bf16_dot() {
                continue;
            }
            let (nb, c) = (48, 0.9f32);
            let mut m2 = vec![f32::NEG_INFINITY; nb];
            let mut l = vec![0.0f32; nb];
            let mut corr = vec![0.0f32; nb];
            let mut model = ColModel {
                m2: vec![f64::NEG_INFINITY; nb],
                l: vec![0.0; nb],
            };
            // Column r sees keys < vis[r]; three blocks of 7 keys (odd: a bf16 pair is padded).
            let vis: Vec<f32> = (0..nb).map(|r| (r % 23) as f32).collect();
            for (blk, kn) in [7usize, 7, 7].into_iter().enumerate() {
                let k0 = blk * kn;
                let raw = values(kn * nb, blk as u32 + 20);
                let mut st: Vec<f32> = raw.iter().map(|x| x * 4.0).collect();
                let mut colmax = vec![f32::NEG_INFINITY; nb];
                mask_colmax(isa, &mut st, kn, nb, Some((&vis, k0)), &mut colmax);
                let mut pairs = vec![0u16; kn.div_ceil(2) * nb * 2];
                let mut state = ColState {
                    colmax: &mut colmax,
                    m2: &mut m2,
                    l: &mut l,
                    corr: &mut corr,
                };
                if bf {
                    col_softmax_bf16(isa, &mut st, kn, nb, c, &mut state, &mut pairs);
                } else {
                    col_softmax(isa, &mut st, kn, nb, c, &mut state);
                }
                for r in 0..nb {
                    let xs: Vec<f64> = (0..kn)
                        .map(|j| {
                            if (k0 + j) as f32 >= vis[r] {
                                f64::NEG_INFINITY
                            } else {
                                raw[j * nb + r] as f64 * 4.0
                            }
                        })
                        .collect();
                    let bm = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let m_new = model.m2[r].max(bm * c as f64);
                    let m_safe = if m_new == f64::NEG_INFINITY {
                        0.0
                    } else {
                        m_new
                    };
                    let cr = (model.m2[r] - m_safe).exp2();
                    let ps: Vec<f64> = xs.iter().map(|x| (x * c as f64 - m_safe).exp2()).collect();
                    model.l[r] = model.l[r] * cr + ps.iter().sum::<f64>();
                    model.m2[r] = m_new;
                    assert!(
                        (corr[r] as f64 - cr).abs() <= 1e-6 * cr.max(1.0),
                        "{isa} corr"
                    );
                    for (j, p) in ps.iter().enumerate() {
                        let got = if bf {
                            let t = (j / 2) * 2 * nb + 2 * r + j % 2;
                            bf16::from_bits(pairs[t]).to_f64()
                        } else {
                            st[j * nb + r] as f64
                        };
                        let tol = if bf { 4e-3 * p } else { 1e-6 * p.max(1e-30) };
                        assert!(
                            (got - p).abs() <= tol,
                            "{isa} bf16={bf} P[{j}][{r}]: {got} vs {p}"
                        );
                    }
                    if bf && kn % 2 == 1 {
                        let t = (kn / 2) * 2 * nb + 2 * r + 1;
                        assert_eq!(pairs[t], 0, "padding key of an odd block");
                    }
                    let lr = model.l[r];
                    assert!(
                        (l[r] as f64 - lr).abs() <= 1e-5 * lr.max(1.0),
                        "{isa} l[{r}]"
                    );
                    assert_eq!(
                        m2[r] as f64 == f64::NEG_INFINITY,
                        m_new == f64::NEG_INFINITY
                    );
                }
            }
        }
    }
}

#[test]
fn packing_transposes_into_zero_padded_panels() {
    let rows = 70;
    // From the start and from an offset, from f32 (whole W x W blocks of every path, and
    // the ragged rows and columns beside them) and 16-bit storage (widened exactly: bf16 by
    // a shift, f16 by `half`; with 70 columns, or 144-row panels, in several widening
    // blocks), into a buffer holding stale values.
    let cases = paths().into_iter().flat_map(|isa| {
        [(6, 64), (16, 64), (37, 64), (70, 64), (37, 144)]
            .into_iter()
            .flat_map(move |(cols, pw)| [0, 3].map(|skip| (isa, cols, pw, skip)))
    });
    for (isa, cols, pw, skip) in cases {
        let tall = values((rows + skip) * cols, 30 + skip as u32);
        for dtype in [DType::F32, DType::Bf16, DType::F16] {
            let t = &Tensor::from_f32(tall.clone(), dtype);
            let mut dst = vec![f32::NAN; 2 * cols * pw];
            pack_t(isa, t, skip * cols, rows, cols, pw, &mut dst);
            for r in 0..rows.div_ceil(pw) * pw {
                for c in 0..cols {
                    let got = dst[(r / pw) * cols * pw + c * pw + r % pw];
                    let want = if r < rows {
                        t.get_f64((r + skip) * cols + c) as f32
                    } else {
                        0.0
                    };
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{isa} {dtype:?} cols {cols} pw {pw} skip {skip} r {r} c {c}"
                    );
                }
            }
        }
    }
    // bf16 pairs (32-bit values, moved as bits: pairs that read as signaling NaNs or
    // subnormals as f32 too), whole and ragged blocks of pairs, from an odd pair offset.
    let pw = 64;
    for isa in paths() {
        for cols in [6, 32, 74] {
            let mut bits = to_bf16_bits(&values((rows + 2) * cols, 32));
            for (i, b) in [0x7f81, 0xff80, 0x0001, 0x7fbf].into_iter().enumerate() {
                bits[cols + 2 + 2 * i + 1] = b;
            }
            let mut pd = vec![u16::MAX; 2 * cols * pw];
            pack_pairs_t(isa, &bits[cols + 2..], rows, cols, pw, &mut pd);
            for r in 0..2 * pw {
                for c in 0..cols {
                    let got = pd[(r / pw) * cols * pw + (c / 2) * 2 * pw + 2 * (r % pw) + c % 2];
                    let want = if r < rows {
                        bits[cols + 2 + r * cols + c]
                    } else {
                        0
                    };
                    assert_eq!(got, want, "{isa} cols {cols} r {r} c {c}");
                }
            }
        }
    }
    let isa = Isa::Avx512Bf16;
    if isa.available() {
        for (kn, d) in [(1, 1), (5, 33), (8, 64), (3, 80), (2, 16)] {
            let src = to_bf16_bits(&values(kn * d, 31));
            let mut dst = vec![u16::MAX; kn.div_ceil(2) * d * 2 + 5];
            interleave_rows(isa, &src, kn, d, &mut dst);
            for p in 0..kn.div_ceil(2) {
                for c in 0..d {
                    for t in 0..2 {
                        let want = if 2 * p + t < kn {
                            src[(2 * p + t) * d + c]
                        } else {
                            0
                        };
                        assert_eq!(dst[p * 2 * d + 2 * c + t], want, "kn={kn} d={d}");
                    }
                }
            }
            assert!(dst[kn.div_ceil(2) * d * 2..].iter().all(|x| *x == u16::MAX));
        }
    } else {
        println!("note: kernel path {isa} not available on this CPU, skipped");
    }
}

#[test]
fn streamed_rows_are_scaled_then_zero_filled_at_any_alignment() {
    for isa in paths() {
        // Destinations starting at every float offset of a cache line, rows shorter than,
        // equal to and longer than a vector, with a zero tail of several lengths.
        for offset in 0..17 {
            for (n, tail) in [(0, 5), (1, 0), (7, 9), (16, 16), (33, 1), (100, 37)] {
                let x0 = values(n, (offset * 131 + n) as u32);
                let mut dst = vec![f32::NAN; offset + n + tail + 3];
                let mut x = x0.clone();
                scale_stream(isa, &mut x, 0.5, &mut dst[offset..offset + n + tail], true);
                store_fence(isa);
                for i in 0..n {
                    assert_eq!(
                        dst[offset + i],
                        x0[i] * 0.5,
                        "{isa} offset {offset} n {n} i {i}"
                    );
                    assert_eq!(x[i], x0[i] * 0.5, "{isa}: kept in place");
                }
                assert!(dst[offset + n..offset + n + tail].iter().all(|v| *v == 0.0));
                assert!(
                    dst[..offset].iter().all(|v| v.is_nan()),
                    "{isa}: nothing before"
                );
                assert!(
                    dst[offset + n + tail..].iter().all(|v| v.is_nan()),
                    "{isa}: nor after"
                );
                // Without `keep`, x is left as it was.
                let mut y = x0.clone();
                scale_stream(isa, &mut y, 2.0, &mut dst[offset..offset + n + tail], false);
                assert_eq!(y, x0);
                if !isa.bf16_dot() {
                    continue;
                }
                let mut pairs = vec![7u16; 2 * n.div_ceil(2) + 2];
                dst.fill(f32::NAN);
                scale_stream_pairs(
                    isa,
                    &x0,
                    0.25,
                    &mut dst[offset..offset + n + tail],
                    &mut pairs,
                );
                store_fence(isa);
                for i in 0..n {
                    let p = x0[i] * 0.25;
                    assert_eq!(dst[offset + i], p);
                    assert_eq!(
                        pairs[i],
                        bf16::from_f32(p).to_bits(),
                        "{isa}: rounded to nearest"
                    );
                }
                if n % 2 == 1 {
                    assert_eq!(pairs[n], 0, "an odd row ends in a zero");
                }
                assert_eq!(pairs[2 * n.div_ceil(2)], 7, "nothing past the pairs");
                assert!(dst[offset + n..offset + n + tail].iter().all(|v| *v == 0.0));
            }
        }
    }
}

#[test]
fn bf16_row_softmax_writes_rounded_probabilities_over_the_row() {
    for isa in paths().into_iter().filter(|i| i.bf16_dot()) {
        for (n, visible) in [
            (1, 1),
            (7, 5),
            (16, 16),
            (33, 20),
            (5000, 4999),
            (9000, 9000),
        ] {
            let x0: Vec<f32> = values(n, n as u32).iter().map(|v| v * 30.0).collect();
            let c = 0.7;
            let mut row = x0.clone();
            let (m, sum) = softmax_row_bf16(isa, &mut row, visible, c);
            let m_ref = x0[..visible]
                .iter()
                .copied()
                .fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(m, m_ref);
            let p: Vec<f64> = x0[..visible]
                .iter()
                .map(|x| 2f64.powf(*x as f64 * c as f64 - m_ref as f64 * c as f64))
                .collect();
            let sum_ref: f64 = p.iter().sum();
            assert!(
                (sum as f64 - sum_ref).abs() <= 1e-5 * sum_ref,
                "{isa} n {n}: {sum} vs {sum_ref}"
            );
            let half = as_u16(&mut row);
            for (i, want) in p.iter().enumerate() {
                let got = bf16::from_bits(half[i]).to_f64();
                // bf16 keeps 8 bits: half a step of relative error, plus the polynomial's.
                assert!(
                    (got - want).abs() <= want * (1.0 / 256.0 + 1e-5),
                    "{isa} n {n} i {i}: {got} vs {want}"
                );
            }
            assert!(
                half[visible..2 * n.div_ceil(2)].iter().all(|h| *h == 0),
                "{isa} n {n}: zeros"
            );
        }
        // A row that sees nothing: all zeros, max -inf, sum 0.
        let mut row = values(9, 1);
        assert_eq!(
            softmax_row_bf16(isa, &mut row, 0, 1.0),
            (f32::NEG_INFINITY, 0.0)
        );
        assert!(as_u16(&mut row)[..10].iter().all(|h| *h == 0));
    }
}

#[test]
fn row_tiles_cover_every_row_once_without_a_short_last_tile() {
    for mr_max in 1..=8 {
        for m in 1..=100 {
            let mut heights = Vec::new();
            let mut m0 = 0;
            while m0 < m {
                let mr = tile_rows(mr_max, m - m0);
                assert!(
                    (1..=mr_max).contains(&mr),
                    "mr_max {mr_max} m {m}: tile of {mr}"
                );
                heights.push(mr);
                m0 += mr;
            }
            assert_eq!(m0, m, "mr_max {mr_max} m {m}: {heights:?}");
            // Only the last two tiles may be short, and then neither is under half a tile.
            let full = heights.iter().take_while(|h| **h == mr_max).count();
            assert!(
                full + 2 >= heights.len(),
                "mr_max {mr_max} m {m}: {heights:?}"
            );
            if m > mr_max {
                assert!(
                    heights.iter().all(|h| 2 * h >= mr_max),
                    "mr_max {mr_max} m {m}: {heights:?}"
                );
            }
        }
    }
    // d = 128 rows of the AVX2 path's 6-row tiles: twenty 6-row tiles, then 4 + 4 (not 6 + 2).
    let mut heights = Vec::new();
    let mut m0 = 0;
    while m0 < 128 {
        heights.push(tile_rows(6, 128 - m0));
        m0 += heights[heights.len() - 1];
    }
    assert_eq!(heights[20..], [4, 4]);
}

/// Which read path a dtype takes on each kernel path, whatever this CPU runs (a decision,
/// not a kernel): bf16 pairs on avx512-bf16 and on amx-bf16 (AMX tiles in naive's and
/// Rabe–Staats' products) for even head dims, widened elsewhere; flash's own vector tiles
/// widen on amx-bf16 (they read Q^T and P^T transposed), and a forward feeding the
/// backward keeps P in f32.
#[test]
fn the_read_path_follows_the_kernel_path_and_the_head_dim() {
    use crate::backend::cpu::flash::{path, FlashPath};
    use crate::problem::DType;
    for isa in [Isa::AmxBf16, Isa::Avx512Bf16] {
        assert_eq!(
            ReadPath::of(DType::Bf16, isa, 40),
            ReadPath::Bf16Dot,
            "{isa}"
        );
        assert_eq!(ReadPath::of(DType::Bf16, isa, 41), ReadPath::Widen, "{isa}");
        assert_eq!(ReadPath::of(DType::F32, isa, 64), ReadPath::F32, "{isa}");
        assert_eq!(ReadPath::of(DType::F16, isa, 64), ReadPath::Widen, "{isa}");
    }
    for isa in [Isa::Avx512, Isa::Avx2, Isa::Portable] {
        assert_eq!(ReadPath::of(DType::Bf16, isa, 64), ReadPath::Widen, "{isa}");
    }
    assert_eq!(path(DType::Bf16, Isa::AmxBf16, 64, false), FlashPath::Amx);
    let widen = FlashPath::Tiles(ReadPath::Widen);
    assert_eq!(path(DType::Bf16, Isa::AmxBf16, 40, false), widen);
    assert_eq!(path(DType::Bf16, Isa::AmxBf16, 64, true), widen);
    let pairs = FlashPath::Tiles(ReadPath::Bf16Dot);
    assert_eq!(path(DType::Bf16, Isa::Avx512Bf16, 40, false), pairs);
    assert_eq!(path(DType::Bf16, Isa::Avx512Bf16, 40, true), widen);
}
