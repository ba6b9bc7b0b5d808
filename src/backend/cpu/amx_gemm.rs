//! C = A B for bf16 pair operands of any shape on AMX tiles (`amx`; Intel SDM Vol. 1
//! ch. 18): the two products of `naive` and Rabe–Staats (`products`) on the amx-bf16 path.
//! A is `tiles::AOp` with its pairs contiguous (`cs` = 2: a row of pairs is an A tile row),
//! B is `tiles::BOp` in rows of interleaved pairs (a B tile row as it stands). C is computed
//! in blocks of 2 x 2 tiles (32 x 32, all eight tile registers) over steps of 16 pairs; a
//! tile that reaches past A's rows, past the shared dimension or past an operand's slice
//! is read from a zero-padded copy on the stack, and a C tile past C's rows or columns is
//! stored there and copied out. Cost: 2 m n k_pairs * 2 FLOPs; no heap memory.

use super::amx::{ROWS, ROW_BYTES};
use super::tiles::{AOp, BOp};

/// u16 values in one tile row (16 pairs).
const ROW_U16: usize = ROW_BYTES / 2;

/// A zero-padded tile (16 rows of 64 bytes) on the stack, 64-byte aligned.
#[repr(C, align(64))]
struct Pad([u16; ROWS * ROW_U16]);

/// A's tile of rows `r0..r0 + 16` and pairs `p0..p0 + 16`, in place when all of it exists,
/// else copied with the rows and pairs past A's zero.
fn a_tile(a: &AOp<u16>, r0: usize, p0: usize, pad: &mut Pad) -> (*const u8, usize) {
    let (rows, pairs) = ((a.rows - r0).min(ROWS), (a.k - p0).min(ROW_U16 / 2));
    let whole = rows == ROWS && pairs == ROW_U16 / 2;
    tile(
        a.data,
        r0 * a.rs + 2 * p0,
        a.rs,
        (rows, 2 * pairs),
        whole,
        pad,
    )
}

/// B's tile of pairs `p0..p0 + 16` and columns `j0..j0 + 16`, in place when it has 16
/// pairs (columns past `n` only feed C columns that are not kept), else copied with the
/// pairs past the shared dimension and the columns past `n` zero.
fn b_tile(b: &BOp<u16>, p0: usize, j0: usize, pad: &mut Pad) -> (*const u8, usize) {
    let (pairs, cols) = ((b.k - p0).min(ROWS), (b.n - j0).min(ROW_U16 / 2));
    tile(
        b.data,
        p0 * b.ld + 2 * j0,
        b.ld,
        (pairs, 2 * cols),
        pairs == ROWS,
        pad,
    )
}

/// Where a tile's 16 rows of 64 bytes are read: the rows `stride` u16 apart from `at` of
/// `data`, in place when `whole` and all 16 lie in `data`; else `rows` rows of `len` u16
/// copied into `pad`, the rest of it zero.
fn tile(
    data: &[u16],
    at: usize,
    stride: usize,
    (rows, len): (usize, usize),
    whole: bool,
    pad: &mut Pad,
) -> (*const u8, usize) {
    if whole && at + (ROWS - 1) * stride + ROW_U16 <= data.len() {
        return (data[at..].as_ptr().cast(), 2 * stride);
    }
    pad.0.fill(0);
    for r in 0..rows {
        pad.0[r * ROW_U16..][..len].copy_from_slice(&data[at + r * stride..][..len]);
    }
    (pad.0.as_ptr().cast(), ROW_BYTES)
}

/// A C tile's rows and columns that are kept (of 16 x 16).
#[derive(Clone, Copy)]
struct CTile {
    r0: usize,
    j0: usize,
    rows: usize,
    cols: usize,
}

/// Stores tile `T` to C: in place when all 16 x 16 are kept and lie in `c`, else through
/// `stage`.
///
/// # Safety
/// Tiles configured.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn store_c<const T: u8>(t: CTile, c: &mut [f32], ldc: usize, stage: &mut Pad) {
    use super::amx::store;
    let at = t.r0 * ldc + t.j0;
    // SAFETY: tiles configured (the caller's contract); the 16 rows of 64 bytes written lie
    // in `c` (checked) or in `stage` (16 x 64 bytes).
    unsafe {
        if t.rows == ROWS && t.cols == ROWS && at + (ROWS - 1) * ldc + ROWS <= c.len() {
            store::<T>(c[at..].as_mut_ptr().cast(), 4 * ldc);
            return;
        }
        store::<T>(stage.0.as_mut_ptr().cast(), ROW_BYTES);
    }
    let staged: &[f32] = stage_floats(&stage.0);
    for r in 0..t.rows {
        c[at + r * ldc..][..t.cols].copy_from_slice(&staged[r * ROWS..][..t.cols]);
    }
}

/// The staging tile's bytes as its 256 floats.
fn stage_floats(x: &[u16; ROWS * ROW_U16]) -> &[f32] {
    // SAFETY: 512 u16 are 256 f32 of the same bytes, 64-byte aligned (`Pad`), every bit
    // pattern a valid f32.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<f32>(), ROWS * ROWS) }
}

/// C (`a.rows` x `b.n`, row stride `ldc`) = A B, A's pairs contiguous (`a.cs` = 2), the
/// sums in f32 as `tdpbf16ps` makes them.
///
/// # Safety
/// AMX tiles configured on this thread (`amx::Tiles::configure`).
#[cfg(target_arch = "x86_64")]
pub unsafe fn gemm(a: AOp<u16>, b: BOp<u16>, c: &mut [f32], ldc: usize) {
    use super::amx::{dot, load, zero};
    let (m, k, n) = (a.rows, a.k, b.n);
    assert!(
        a.cs == 2 && b.k == k,
        "amx gemm: A's pairs contiguous, inner dims equal"
    );
    if m == 0 || n == 0 {
        return;
    }
    assert!(ldc >= n && (m - 1) * ldc + n <= c.len(), "amx gemm: C view");
    let mut pads = [Pad([0; ROWS * ROW_U16]), Pad([0; ROWS * ROW_U16])];
    let mut bpads = [Pad([0; ROWS * ROW_U16]), Pad([0; ROWS * ROW_U16])];
    let half = ROW_U16 / 2;
    for r0 in (0..m).step_by(2 * ROWS) {
        let two_rows = r0 + ROWS < m;
        for j0 in (0..n).step_by(2 * half) {
            let two_cols = j0 + half < n;
            // SAFETY: tiles configured (the caller's contract); every tile is read from 16
            // rows of 64 bytes in A's or B's slice or in a pad (`a_tile`, `b_tile`).
            unsafe {
                zero::<0>();
                zero::<1>();
                zero::<2>();
                zero::<3>();
                for p0 in (0..k).step_by(half) {
                    let [pa0, pa1] = &mut pads;
                    let [pb0, pb1] = &mut bpads;
                    let (ap, astr) = a_tile(&a, r0, p0, pa0);
                    load::<4>(ap, astr);
                    let (bp, bstr) = b_tile(&b, p0, j0, pb0);
                    load::<6>(bp, bstr);
                    dot::<0, 4, 6>();
                    if two_cols {
                        let (bp, bstr) = b_tile(&b, p0, j0 + half, pb1);
                        load::<7>(bp, bstr);
                        dot::<1, 4, 7>();
                    }
                    if two_rows {
                        let (ap, astr) = a_tile(&a, r0 + ROWS, p0, pa1);
                        load::<5>(ap, astr);
                        dot::<2, 5, 6>();
                        if two_cols {
                            dot::<3, 5, 7>();
                        }
                    }
                }
                let tile = |dr: usize, dj: usize| CTile {
                    r0: r0 + dr,
                    j0: j0 + dj,
                    rows: (m - r0 - dr).min(ROWS),
                    cols: (n - j0 - dj).min(half),
                };
                let stage = &mut pads[0];
                store_c::<0>(tile(0, 0), c, ldc, stage);
                if two_cols {
                    store_c::<1>(tile(0, half), c, ldc, stage);
                }
                if two_rows {
                    store_c::<2>(tile(ROWS, 0), c, ldc, stage);
                    if two_cols {
                        store_c::<3>(tile(ROWS, half), c, ldc, stage);
                    }
                }
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::backend::cpu::amx::Tiles;
    use crate::problem::Isa;
    use half::bf16;

    /// Every shape's edges (rows, pairs and columns that are not whole tiles, strides with
    /// gaps, operands that end at their last value): C equals the f64 sum of the exact
    /// products within f32 rounding of the sums, and C's entries outside the product and
    /// the gaps between its rows are untouched.
    #[test]
    fn any_shape_and_stride_matches_the_exact_products() {
        if !Isa::AmxBf16.available() {
            eprintln!("skipped: this CPU or OS does not offer the AMX tiles");
            return;
        }
        let val = |i: usize, s: usize| bf16::from_f32(((i * s) % 23) as f32 * 0.125 - 1.3);
        for (m, k, n) in [
            (1, 1, 1),
            (16, 16, 16),
            (32, 16, 32),
            (17, 5, 3),
            (40, 33, 47),
            (33, 64, 64),
            (5, 40, 100),
        ] {
            for gap in [0, 3] {
                let (rs, ld, ldc) = (2 * k + 2 * gap, 2 * n + 2 * gap, n + gap);
                // A and B end at their last value: no padding after them to read.
                let a: Vec<u16> = (0..(m - 1) * rs + 2 * k)
                    .map(|i| val(i, 7).to_bits())
                    .collect();
                let b: Vec<u16> = (0..(k - 1) * ld + 2 * n)
                    .map(|i| val(i, 11).to_bits())
                    .collect();
                let sentinel = -7.5f32;
                let mut c = vec![sentinel; (m - 1) * ldc + n + 5];
                let ao = AOp {
                    data: &a,
                    rows: m,
                    k,
                    rs,
                    cs: 2,
                };
                let bo = BOp { data: &b, k, n, ld };
                // SAFETY: the tiles are usable (checked above) and configured here.
                unsafe {
                    let _t = Tiles::configure();
                    gemm(ao, bo, &mut c, ldc);
                }
                let f = |x: u16| bf16::from_bits(x).to_f64();
                for i in 0..m {
                    for j in 0..n {
                        let want: f64 = (0..2 * k)
                            .map(|t| f(a[i * rs + t]) * f(b[(t / 2) * ld + 2 * j + t % 2]))
                            .sum();
                        let got = c[i * ldc + j] as f64;
                        let tol = 1e-5 * (2 * k) as f64 * 4.0;
                        assert!(
                            (got - want).abs() <= tol,
                            "m {m} k {k} n {n} gap {gap}: C[{i}][{j}] {got} vs {want}"
                        );
                    }
                    if i + 1 < m {
                        let gaps = &c[i * ldc + n..(i + 1) * ldc];
                        assert!(gaps.iter().all(|x| *x == sentinel), "row gap written");
                    }
                }
                let tail = &c[(m - 1) * ldc + n..];
                assert!(tail.iter().all(|x| *x == sentinel), "written past C");
            }
        }
    }
}
