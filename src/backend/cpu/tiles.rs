//! The safe interface of the microkernels (`simd`): GEMM-shaped tiles on slices, checked once
//! per call, then cut into register tiles for the chosen [`Isa`] (f32 and bf16 pair
//! products alike: the reduction in blocks of `KC` terms outermost, then column panels,
//! then row tiles, so a B block stays in L1 and A is read once per block); the softmax
//! pieces; and the packing of the small operand tiles (Q^T, K^T panels, bf16 pairs). Every
//! attention kernel (naive, Rabe–Staats, flash) is built from these, so their timings
//! compare the algorithms, not their implementations. No allocation anywhere: buffers come
//! from the callers' workspaces. Cost: the products' 2*m*n*k FLOPs; packing O(size of the
//! tile).

use half::slice::HalfFloatSliceExt;

use super::cache;
use super::isa::Isa;
#[cfg(target_arch = "x86_64")]
use super::simd::{avx2, avx512, bf16};
use super::simd::{portable, ColSoftmax, Epi, Tile, KC};
use super::vecops;
use crate::problem::{DType, Tensor};

/// Keys per packed K^T panel of naive and Rabe–Staats (the N loop of their QK^T tiles): a
/// d x 64 f32 panel (16 KiB at d = 64) stays in L1 while every query row of the block
/// passes over it.
pub const PANEL: usize = 64;

/// Query columns are padded to a multiple of this in flash's transposed tiles (the widest
/// vector, so every path shares one layout and one memory formula).
pub const LANES_MAX: usize = 16;

/// Rounds `n` up to a multiple of [`LANES_MAX`].
pub fn pad_lanes(n: usize) -> usize {
    n.div_ceil(LANES_MAX) * LANES_MAX
}

/// A row stride for `n` floats: whole 64-byte lines, one more when the lines are a multiple
/// of 8. Rows 8k lines apart fall into at most 8 of the L1's 64 sets (at 256 keys, 1 KiB:
/// 4 sets), so a tile's 64-row operand strip cannot stay in an 8-way L1 while the other
/// operands pass (measured on a Zen 3: docs/internals/cpu-kernels.md, *Backward passes*).
pub fn skew_stride(n: usize) -> usize {
    let lines = n.div_ceil(LANES_MAX);
    (lines + usize::from(lines.is_multiple_of(8))) * LANES_MAX
}

/// How a kernel reads its operands on a given path (chosen per call from the dtype, the
/// instruction-set path and the head dim).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadPath {
    /// f32 inputs, read in place.
    F32,
    /// bf16/f16 inputs widened to f32 tile by tile.
    Widen,
    /// bf16 inputs multiplied as bf16 pairs: `vdpbf16ps`, or on the amx-bf16 path AMX
    /// tiles (`products`); needs an even head dim.
    Bf16Dot,
}

impl ReadPath {
    pub fn of(dtype: DType, isa: Isa, head_dim: usize) -> ReadPath {
        match dtype {
            DType::F32 => ReadPath::F32,
            DType::Bf16 if isa.bf16_pairs() && head_dim.is_multiple_of(2) => ReadPath::Bf16Dot,
            _ => ReadPath::Widen,
        }
    }

    /// Bytes per value of a packed K^T panel on this path (f32, or bf16 pairs).
    pub fn packed_bytes(self) -> usize {
        match self {
            ReadPath::Bf16Dot => 2,
            ReadPath::F32 | ReadPath::Widen => 4,
        }
    }

    /// Whether naive's and Rabe–Staats' PV runs on bf16 pairs (`vdpbf16ps`, P rounded to
    /// bf16): bf16 inputs on AVX512_BF16 with V rows of whole vectors, unless the output
    /// feeds the backward (`exact`).
    pub fn bf16_pv(self, head_dim: usize, exact: bool) -> bool {
        self == ReadPath::Bf16Dot && !exact && head_dim.is_multiple_of(LANES_MAX)
    }

    /// Bytes per key of K (packed K^T panels) and V as naive and Rabe–Staats hold them on
    /// this path at head dim `d`, V in bf16 pairs when `bf16_pv`, else f32
    /// (`cache::pass_rows`).
    pub fn kv_bytes(self, d: usize, bf16_pv: bool) -> usize {
        cache::kv_bytes(d, self.packed_bytes(), if bf16_pv { 2 } else { 4 })
    }
}

/// Broadcast operand A (m x k): element (i, p) at `data[i*rs + p*cs]`. For bf16 pair tiles
/// `k` counts pairs and pair (i, p) is `data[i*rs + p*cs ..][..2]`.
#[derive(Clone, Copy)]
pub struct AOp<'a, T> {
    pub data: &'a [T],
    pub rows: usize,
    pub k: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a, T> AOp<'a, T> {
    /// A row-major `rows` x `k` matrix.
    pub fn rows(data: &'a [T], rows: usize, k: usize) -> Self {
        AOp {
            data,
            rows,
            k,
            rs: k,
            cs: 1,
        }
    }

    /// The transpose of the first `rows` columns of a row-major `k` x `stride` matrix: the
    /// operand (i, p) is `data[p * stride + i]`.
    pub fn transposed(data: &'a [T], rows: usize, k: usize, stride: usize) -> Self {
        AOp {
            data,
            rows,
            k,
            rs: 1,
            cs: stride,
        }
    }
}

/// Vector operand B (k x n), row-major with row stride `ld`. For bf16 pair tiles row p holds
/// the pairs of n columns interleaved (2n values, read as whole vectors: padded).
#[derive(Clone, Copy)]
pub struct BOp<'a, T> {
    pub data: &'a [T],
    pub k: usize,
    pub n: usize,
    pub ld: usize,
}

impl<'a, T> BOp<'a, T> {
    /// `k` rows of `n` columns, `ld` apart.
    pub fn new(data: &'a [T], k: usize, n: usize, ld: usize) -> Self {
        BOp { data, k, n, ld }
    }
}

/// What the product does to C (m x n, row stride ldc).
pub enum Out<'a> {
    /// C = A B.
    Store,
    /// C += A B.
    Add,
    /// C[i][j] = C[i][j] * s[j] + (A B)[i][j].
    ScaleAdd(&'a [f32]),
    /// C = A B, and m[j] = max(m[j], max_i C[i][j]).
    StoreColMax(&'a mut [f32]),
    /// C[i][j] = s C[i][j] ((A B)[i][j] - d[i]), C read before it is written: the softmax
    /// backward's dS = s P (dP - D) over P in place, d the rows' D. The reduction must fit
    /// one block (k <= `KC`), since the epilogue needs the whole sum.
    SoftmaxGrad(&'a [f32], f32),
}

fn check_isa(isa: Isa) {
    assert!(
        isa.available(),
        "kernel path {isa} is not available on this CPU"
    );
}

/// (rows, vectors, lanes) of one register tile on `isa`.
fn tile_shape(isa: Isa) -> (usize, usize, usize) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        i if i.avx512() => (avx512::MR_MAX, avx512::NV_MAX, avx512::W),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => (avx2::MR_MAX, avx2::NV_MAX, avx2::W),
        _ => (portable::MR_MAX, portable::NV_MAX, portable::W),
    }
}

/// Visits the register tiles of an m x n product: (row0, rows, col0, vectors, partial,
/// valid lanes of the last vector). Column panels outside, so a B panel stays in L1 while
/// the rows pass over it.
fn for_tiles(
    (mr_max, nv_max, w): (usize, usize, usize),
    m: usize,
    n: usize,
    mut f: impl FnMut(usize, usize, usize, usize, bool, usize),
) {
    let mut n0 = 0;
    while n0 < n {
        let cols = (nv_max * w).min(n - n0);
        let nv = cols.div_ceil(w);
        let n_last = cols - (nv - 1) * w;
        let mut m0 = 0;
        while m0 < m {
            let mr = tile_rows(mr_max, m - m0);
            f(m0, mr, n0, nv, n_last < w, n_last);
            m0 += mr;
        }
        n0 += cols;
    }
}

/// Rows of the next register tile with `left` rows to go: full tiles, except that a short
/// remainder (at most half a tile) is not left on its own. The last `mr_max + r` rows are
/// then split into two tiles of about equal height (8 rows at `mr_max` = 6 as 4 + 4, not
/// 6 + 2): a 2-row tile has too few independent accumulators to hide the FMA latency. Every
/// element of C is still one tile's sum over k in order, so the split changes no bit.
fn tile_rows(mr_max: usize, left: usize) -> usize {
    if left > mr_max && 2 * (left - mr_max) <= mr_max {
        left.div_ceil(2)
    } else {
        mr_max.min(left)
    }
}

fn check_c(c: &[f32], rows: usize, n: usize, ldc: usize) {
    assert!(ldc >= n, "C row stride {ldc} below its width {n}");
    assert!((rows - 1) * ldc + n <= c.len(), "C view out of bounds");
}

/// The epilogue of the tile at row `m0` and column `n0`, with its column- or row-vector
/// pointer.
fn epi_at(out: &mut Out, m0: usize, n0: usize) -> Epi {
    match out {
        Out::Store => Epi::Store,
        Out::Add => Epi::Add,
        // In bounds: both were checked to hold n >= n0 + tile width floats.
        Out::ScaleAdd(s) => Epi::ScaleAdd(s[n0..].as_ptr()),
        Out::StoreColMax(m) => Epi::StoreColMax(m[n0..].as_mut_ptr()),
        Out::SoftmaxGrad(d, s) => Epi::SoftmaxGrad(d[m0..].as_ptr(), *s),
    }
}

fn check_out(out: &Out, (m, n, k): (usize, usize, usize)) {
    match out {
        Out::ScaleAdd(s) => assert!(s.len() >= n, "column scale shorter than C's width"),
        Out::StoreColMax(cm) => assert!(cm.len() >= n, "column max shorter than C's width"),
        Out::SoftmaxGrad(d, _) => {
            assert!(d.len() >= m, "row D shorter than C's height");
            assert!(
                k <= KC,
                "the dS epilogue needs the whole sum: {k} terms > {KC}"
            );
        }
        Out::Store | Out::Add => {}
    }
}

/// The column max of C taken after the product when the reduction spans several partial
/// sums (the tiles fuse it only into a single one): C is stored first.
fn col_max_after(c: &[f32], m: usize, n: usize, ldc: usize, colmax: &mut [f32]) {
    for i in 0..m {
        for (cm, x) in colmax.iter_mut().zip(&c[i * ldc..][..n]) {
            *cm = cm.max(*x);
        }
    }
}

/// C (m x n) (op)= A (m x k) B (k x n), f32, on `isa` (its f32 tiles for both AVX-512 paths).
pub fn gemm(isa: Isa, a: AOp<f32>, b: BOp<f32>, c: &mut [f32], ldc: usize, out: Out) {
    if let Out::StoreColMax(cm) = out {
        if a.k > KC {
            gemm(isa, a, b, c, ldc, Out::Store);
            return col_max_after(c, a.rows, b.n, ldc, cm);
        }
        return gemm_fused(isa, a, b, c, ldc, Out::StoreColMax(cm));
    }
    gemm_fused(isa, a, b, c, ldc, out)
}

fn gemm_fused(isa: Isa, a: AOp<f32>, b: BOp<f32>, c: &mut [f32], ldc: usize, out: Out) {
    check_isa(isa);
    let (m, k, n) = (a.rows, a.k, b.n);
    assert_eq!(b.k, k, "inner dimensions differ");
    if m == 0 || n == 0 {
        return;
    }
    if k > 0 {
        assert!(
            (m - 1) * a.rs + (k - 1) * a.cs < a.data.len(),
            "A view out of bounds"
        );
        assert!((k - 1) * b.ld + n <= b.data.len(), "B view out of bounds");
    }
    check_c(c, m, n, ldc);
    check_out(&out, (m, n, k));
    // SAFETY: A, B, C and the epilogue's column vector were checked above for the product.
    unsafe {
        for_block_tiles(
            tile_shape(isa),
            a,
            b,
            1,
            c,
            ldc,
            out,
            KC,
            |mr, nv, partial, t| {
                // SAFETY: `t` lies inside the views (`for_block_tiles`); `isa` is available
                // (checked).
                match isa {
                    #[cfg(target_arch = "x86_64")]
                    i if i.avx512() => avx512::tile_any(mr, nv, partial, t),
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx2 => avx2::tile_any(mr, nv, partial, t),
                    _ => portable::tile_any(mr, nv, partial, t),
                }
            },
        )
    }
}

/// Runs `tile` on every register tile (rows, vectors, partial, the tile) of C (m x n)
/// (op)= A B, the reduction cut into blocks of `block` steps outside the tile loop (see
/// [`k_blocks`]): each tile's first block with `out`'s epilogue, the rest adding into C.
/// `b_step` is B's values per column of C (1, or 2 for bf16 pairs).
///
/// # Safety
/// A, B (rows of `b_step * n` values, whole vectors where the tiles read them so), C (row
/// stride `ldc`) and `out`'s column vector are valid for the product's m, k and n.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn for_block_tiles<T>(
    shape: (usize, usize, usize),
    a: AOp<T>,
    b: BOp<T>,
    b_step: usize,
    c: &mut [f32],
    ldc: usize,
    mut out: Out,
    block: usize,
    mut tile: impl FnMut(usize, usize, bool, &Tile<T>),
) {
    let (ap, bp, cp) = (a.data.as_ptr(), b.data.as_ptr(), c.as_mut_ptr());
    for (p0, kb) in k_blocks(a.k, block) {
        for_tiles(shape, a.rows, b.n, |m0, mr, n0, nv, partial, n_last| {
            let t = Tile {
                k: kb,
                // m0 < m, n0 < n and p0 < k (or p0 = k = 0): inside the views.
                a: ap.add(m0 * a.rs + p0 * a.cs),
                ars: a.rs,
                acs: a.cs,
                b: bp.add(p0 * b.ld + b_step * n0),
                ldb: b.ld,
                c: cp.add(m0 * ldc + n0),
                ldc,
                n_last,
                epi: if p0 == 0 {
                    epi_at(&mut out, m0, n0)
                } else {
                    Epi::Add
                },
            };
            tile(mr, nv, partial, &t);
        });
    }
}

/// The blocks (first term, terms) of a reduction over `k` terms, each at most `block`
/// (KC terms, or KC / 2 bf16 pairs); one empty block when `k` is 0 (C is still written).
/// Every tile of C runs one block before the next, the first with the product's epilogue
/// and the rest adding into C: the same partial sums, added in the same order, as a tile
/// that cuts its own K loop, but the block of B (KC rows of a column panel) stays in L1
/// while all rows of A pass over it, and a long A (a row block of P against V) is read once
/// per block from L2 instead of once per column panel from wherever the whole of it fits.
fn k_blocks(k: usize, block: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..k.max(1))
        .step_by(block)
        .map(move |p0| (p0, block.min(k - p0)))
}

/// C (m x n) (op)= A B with bf16 pairs (`vdpbf16ps`), f32 accumulation; only on
/// [`Isa::Avx512Bf16`]. `a.k == b.k` counts pairs; B rows hold `2 * pad_lanes(n)` values.
pub fn gemm_bf16(isa: Isa, a: AOp<u16>, b: BOp<u16>, c: &mut [f32], ldc: usize, out: Out) {
    if let Out::StoreColMax(cm) = out {
        if 2 * a.k > KC {
            gemm_bf16(isa, a, b, c, ldc, Out::Store);
            return col_max_after(c, a.rows, b.n, ldc, cm);
        }
        return gemm_bf16_fused(isa, a, b, c, ldc, Out::StoreColMax(cm));
    }
    gemm_bf16_fused(isa, a, b, c, ldc, out)
}

fn gemm_bf16_fused(isa: Isa, a: AOp<u16>, b: BOp<u16>, c: &mut [f32], ldc: usize, out: Out) {
    check_isa(isa);
    assert!(isa.bf16_dot(), "bf16 pair tiles need the avx512-bf16 path");
    let (m, k, n) = (a.rows, a.k, b.n);
    assert_eq!(b.k, k, "inner dimensions differ");
    if m == 0 || n == 0 {
        return;
    }
    if k > 0 {
        assert!(
            (m - 1) * a.rs + (k - 1) * a.cs + 1 < a.data.len(),
            "A view out of bounds"
        );
        assert!(
            (k - 1) * b.ld + 2 * pad_lanes(n) <= b.data.len(),
            "B view out of bounds"
        );
    }
    check_c(c, m, n, ldc);
    check_out(&out, (m, n, 2 * k));
    #[cfg(target_arch = "x86_64")]
    {
        let shape = (bf16::MR_MAX, bf16::BF16_NV_MAX, avx512::W);
        // SAFETY: A, B (padded rows of pairs) and C were checked above; B is read as whole
        // vectors, inside its padded rows; `isa` has AVX512_BF16 (checked).
        unsafe {
            for_block_tiles(shape, a, b, 2, c, ldc, out, KC / 2, |mr, nv, partial, t| {
                bf16::tile_any(mr, nv, partial, t)
            })
        }
    }
}

/// Arguments of the column softmax of flash's S^T block (see `simd::ColSoftmax`).
pub struct ColState<'a> {
    pub colmax: &'a mut [f32],
    pub m2: &'a mut [f32],
    pub l: &'a mut [f32],
    pub corr: &'a mut [f32],
}

fn col_args(st: &mut [f32], kn: usize, nb: usize, c: f32, s: &mut ColState) -> ColSoftmax {
    assert!(
        nb.is_multiple_of(LANES_MAX),
        "query columns not padded to {LANES_MAX}"
    );
    assert!(
        kn == 0 || (kn - 1) * nb + nb <= st.len(),
        "S^T block out of bounds"
    );
    for v in [&s.colmax, &s.m2, &s.l, &s.corr] {
        assert!(v.len() >= nb, "column state shorter than the block");
    }
    ColSoftmax {
        st: st.as_mut_ptr(),
        kn,
        nb,
        ld: nb,
        c,
        colmax: s.colmax.as_mut_ptr(),
        m2: s.m2.as_mut_ptr(),
        l: s.l.as_mut_ptr(),
        corr: s.corr.as_mut_ptr(),
        pairs: std::ptr::null_mut(),
    }
}

/// Online-softmax step of flash on S^T (`kn` x `nb`, raw scores, scale `c` in log2 units):
/// new running max, correction, P^T = 2^(S^T c - m) in place, running sums.
pub fn col_softmax(isa: Isa, st: &mut [f32], kn: usize, nb: usize, c: f32, s: &mut ColState) {
    check_isa(isa);
    let a = col_args(st, kn, nb, c, s);
    // SAFETY: every pointer of `a` was checked to hold the block (`col_args`); isa available.
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            i if i.avx512() => avx512::col_softmax(&a),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => avx2::col_softmax(&a),
            _ => portable::col_softmax(&a),
        }
    }
}

/// [`col_softmax`] writing P^T as bf16 pairs `[ceil(kn/2)][nb][2]` into `pairs`
/// ([`Isa::Avx512Bf16`] only).
pub fn col_softmax_bf16(
    isa: Isa,
    st: &mut [f32],
    kn: usize,
    nb: usize,
    c: f32,
    s: &mut ColState,
    pairs: &mut [u16],
) {
    check_isa(isa);
    assert!(isa.bf16_dot(), "bf16 pairs need the avx512-bf16 path");
    let mut a = col_args(st, kn, nb, c, s);
    assert!(
        pairs.len() >= kn.div_ceil(2) * nb * 2,
        "P pairs buffer too small"
    );
    a.pairs = pairs.as_mut_ptr();
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as `col_softmax`, and `pairs` holds the whole output (checked).
    unsafe {
        bf16::col_softmax(&a)
    }
}

/// Causal mask (key `k0 + j` hidden from column r when `j + k0 >= vis[r]`) and column max
/// (`colmax[r] = max(colmax[r], max_j S^T[j][r])`) of a `kn` x `nb` S^T block.
pub fn mask_colmax(
    isa: Isa,
    st: &mut [f32],
    kn: usize,
    nb: usize,
    mask: Option<(&[f32], usize)>,
    colmax: &mut [f32],
) {
    check_isa(isa);
    assert!(nb.is_multiple_of(LANES_MAX) && colmax.len() >= nb && kn * nb <= st.len());
    let (vis, k0) = match mask {
        Some((vis, k0)) => {
            assert!(vis.len() >= nb);
            (vis.as_ptr(), k0)
        }
        None => (std::ptr::null(), 0),
    };
    let (sp, mp) = (st.as_mut_ptr(), colmax.as_mut_ptr());
    // SAFETY: the block, `vis` and `colmax` were checked to hold kn x nb and nb floats.
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            i if i.avx512() => avx512::mask_colmax(sp, kn, nb, nb, vis, k0, mp),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => avx2::mask_colmax(sp, kn, nb, nb, vis, k0, mp),
            _ => portable::mask_colmax(sp, kn, nb, nb, vis, k0, mp),
        }
    }
}

macro_rules! row_op {
    ($isa:expr, $f:ident ( $($arg:expr),* )) => {{
        check_isa($isa);
        // SAFETY: the caller passes a slice's pointer and its length; isa available.
        unsafe {
            match $isa {
                #[cfg(target_arch = "x86_64")]
                i if i.avx512() => avx512::$f($($arg),*),
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => avx2::$f($($arg),*),
                _ => portable::$f($($arg),*),
            }
        }
    }};
}

/// Max of a row (-inf if empty).
pub fn row_max(isa: Isa, x: &[f32]) -> f32 {
    row_op!(isa, row_max(x.as_ptr(), x.len()))
}

/// x = 2^(x c - mc) in place; returns the sum (partial sums of at most a few hundred terms).
pub fn exp_sum(isa: Isa, x: &mut [f32], c: f32, mc: f32) -> f32 {
    row_op!(isa, exp_sum(x.as_mut_ptr(), x.len(), c, mc))
}

/// x *= f.
pub fn scale(isa: Isa, x: &mut [f32], f: f32) {
    row_op!(isa, scale(x.as_mut_ptr(), x.len(), f))
}

/// y += a x (as long as the shorter of the two).
pub fn axpy(isa: Isa, y: &mut [f32], x: &[f32], a: f32) {
    let n = y.len().min(x.len());
    row_op!(isa, axpy(y.as_mut_ptr(), x.as_ptr(), n, a))
}

/// `dst[..x.len()] = x * f` and the rest of `dst` zero, written by non-temporal stores
/// where `dst` is vector-aligned (a large buffer nothing reads soon, such as naive's
/// materialized P), and `x *= f` too when `keep`. Call [`store_fence`] before the result is
/// handed to another thread.
pub fn scale_stream(isa: Isa, x: &mut [f32], f: f32, dst: &mut [f32], keep: bool) {
    assert!(dst.len() >= x.len(), "stream destination too short");
    let (n, n_dst) = (x.len(), dst.len());
    row_op!(
        isa,
        scale_stream(x.as_mut_ptr(), n, f, dst.as_mut_ptr(), n_dst, keep)
    )
}

/// [`scale_stream`] (`dst` gets `x * f`, then zeros) with the values `x * f` also rounded
/// to bf16 into `pairs`, then one zero when `x.len()` is odd (so whole pairs can be read):
/// a normalized probability row to naive's P and to the A operand of its bf16 PV tile
/// ([`Isa::Avx512Bf16`] only).
pub fn scale_stream_pairs(isa: Isa, x: &[f32], f: f32, dst: &mut [f32], pairs: &mut [u16]) {
    check_isa(isa);
    assert!(
        isa.bf16_pairs(),
        "bf16 pairs need the avx512-bf16 or amx-bf16 path"
    );
    let (n, n_dst) = (x.len(), dst.len());
    assert!(n_dst >= n, "stream destination too short");
    assert!(pairs.len() >= 2 * n.div_ceil(2), "bf16 row too short");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `x` holds n values, `dst` n_dst >= n, `pairs` n (checked); distinct borrows;
    // isa available (checked).
    unsafe {
        bf16::scale_stream_pairs(
            x.as_ptr(),
            n,
            f,
            dst.as_mut_ptr(),
            n_dst,
            pairs.as_mut_ptr(),
        )
    }
    if n % 2 == 1 {
        pairs[n] = 0;
    }
}

/// Orders the calling thread's non-temporal stores before its later stores: call it once a
/// work item's streamed rows are complete, before the item is handed over.
pub fn store_fence(isa: Isa) {
    row_op!(isa, store_fence())
}

/// 2^x in place, by the kernels' vector exp.
pub fn exp2(isa: Isa, x: &mut [f32]) {
    row_op!(isa, exp2_slice(x.as_mut_ptr(), x.len()))
}

/// Softmax of one score row of which the first `visible` entries count (the rest become 0):
/// with `safe`, the row max is subtracted. `c` = scale * log2(e). Returns (max, sum) in raw
/// score units (max -inf and sum 0 for a row with nothing visible, which is all zeros);
/// with `normalize` the row is divided by its sum.
pub fn softmax_row(
    isa: Isa,
    row: &mut [f32],
    visible: usize,
    c: f32,
    safe: bool,
    normalize: bool,
) -> (f32, f32) {
    let visible = visible.min(row.len());
    let (head, tail) = row.split_at_mut(visible);
    tail.fill(0.0);
    let m = if safe {
        row_max(isa, head)
    } else if visible > 0 {
        0.0
    } else {
        f32::NEG_INFINITY
    };
    if m == f32::NEG_INFINITY {
        head.fill(0.0);
        return (m, 0.0);
    }
    let sum = exp_sum(isa, head, c, m * c);
    if normalize {
        scale(isa, head, if sum > 0.0 { 1.0 / sum } else { 0.0 });
    }
    (m, sum)
}

/// [`softmax_row`] with the max subtracted and no normalization, the probabilities written
/// as bf16 over the row itself: afterwards the row's u16 view begins with its `row.len()`
/// values (zero from `visible` on), then one zero when that count is odd, as the A operand
/// of a bf16 PV tile. Returns (max, sum) as `softmax_row`, the sum of the f32 values before
/// rounding ([`Isa::Avx512Bf16`] only).
pub fn softmax_row_bf16(isa: Isa, row: &mut [f32], visible: usize, c: f32) -> (f32, f32) {
    check_isa(isa);
    assert!(
        isa.bf16_pairs(),
        "bf16 pairs need the avx512-bf16 or amx-bf16 path"
    );
    let n = row.len();
    let visible = visible.min(n);
    let m = row_max(isa, &row[..visible]);
    let (sum, written) = if m == f32::NEG_INFINITY {
        (0.0, 0)
    } else {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `row` holds `visible` f32s, whose bf16 values are written over its first
        // `visible` u16 (as `exp_sum_round` allows); isa available (checked).
        let sum = unsafe { bf16::exp_sum_round(row.as_mut_ptr(), visible, c, m * c) };
        #[cfg(not(target_arch = "x86_64"))]
        let sum = 0.0;
        (sum, visible)
    };
    // The u16 view holds 2n values, at least the 2 ceil(n/2) of whole pairs.
    as_u16(row)[written..2 * n.div_ceil(2)].fill(0);
    (m, sum)
}

/// `rows` x `cols` elements of `src` (row-major from `offset`, row stride `cols`) transposed
/// into panels of `pw` rows: `dst[(r / pw) * cols * pw + c * pw + r % pw]`, widened to f32,
/// zero-padded to whole panels. Q^T of a flash block (one panel), K^T of naive/Rabe–Staats.
/// By `isa`'s W x W block transposes: f32 read in place, 16-bit storage widened first,
/// [`WIDEN_BLOCK`] rows x columns at a time, into a buffer on the stack.
#[allow(clippy::too_many_arguments)]
pub fn pack_t(
    isa: Isa,
    src: &Tensor,
    offset: usize,
    rows: usize,
    cols: usize,
    pw: usize,
    dst: &mut [f32],
) {
    if let Tensor::F32(v) = src {
        return pack_t_f32(isa, &v[offset..offset + rows * cols], rows, cols, pw, dst);
    }
    let dst = padded_panels(dst, rows, cols, pw);
    const B: usize = WIDEN_BLOCK;
    let mut buf = [0.0f32; B * B];
    for p0 in (0..rows).step_by(pw) {
        let pr = pw.min(rows - p0);
        for r0 in (0..pr).step_by(B) {
            for c0 in (0..cols).step_by(B) {
                let (g, cw) = (B.min(pr - r0), B.min(cols - c0));
                for (r, row) in buf.chunks_exact_mut(cw).take(g).enumerate() {
                    vecops::widen_into(src, offset + (p0 + r0 + r) * cols + c0, row);
                }
                // The block's place in panel p0 / pw: its columns from c0, its rows from r0.
                let at = &mut dst[p0 * cols + c0 * pw + r0..];
                assert!((cw - 1) * pw + g <= at.len());
                let (s, d) = (buf.as_ptr(), at.as_mut_ptr());
                row_op!(isa, pack_t(s, cw, g, cw, pw, d, cw * pw))
            }
        }
    }
}

/// [`pack_t`] of a row-major f32 `rows` x `cols` slice (read in place).
pub fn pack_t_f32(isa: Isa, src: &[f32], rows: usize, cols: usize, pw: usize, dst: &mut [f32]) {
    let dst = padded_panels(dst, rows, cols, pw);
    let src = &src[..rows * cols];
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
    row_op!(isa, pack_t(s, cols, rows, cols, pw, d, cols * pw))
}

/// The first `rows.div_ceil(pw)` panels of `cols * pw` values of `dst`, the rows of the last
/// one past `rows` zeroed: the padding that the tiles read as whole vectors.
fn padded_panels<T: Copy + Default>(
    dst: &mut [T],
    rows: usize,
    cols: usize,
    pw: usize,
) -> &mut [T] {
    let panels = rows.div_ceil(pw);
    let dst = &mut dst[..panels * cols * pw];
    if !rows.is_multiple_of(pw) {
        dst[(panels - 1) * cols * pw..].fill(T::default());
    }
    dst
}

/// Rows and columns of the blocks in which [`pack_t`] widens 16-bit storage (16 KiB of f32,
/// in L1 while it is transposed).
pub const WIDEN_BLOCK: usize = 64;

/// bf16 `rows` x `cols` (cols even) transposed into pair panels of `pw` rows:
/// `dst[(r / pw) * cols * pw + (c / 2) * 2 * pw + 2 * (r % pw) + c % 2]`, zero-padded to whole
/// panels: the B operand of a bf16 pair tile (Q^T pairs of flash, K^T pairs of naive/R–S).
/// A pair is one 32-bit value, so this is [`pack_t`]'s transpose of a `rows` x `cols / 2`
/// matrix of them, by `isa`'s W x W blocks.
pub fn pack_pairs_t(isa: Isa, src: &[u16], rows: usize, cols: usize, pw: usize, dst: &mut [u16]) {
    assert!(cols.is_multiple_of(2), "bf16 pairs need an even width");
    let dst = padded_panels(dst, rows, cols, pw);
    let src = &src[..rows * cols];
    let (s, d) = (src.as_ptr() as *const f32, dst.as_mut_ptr() as *mut f32);
    assert!(
        (d as usize).is_multiple_of(4),
        "pair panels start on a 4-byte boundary"
    );
    let pairs = cols / 2;
    row_op!(isa, pack_t(s, pairs, rows, pairs, pw, d, pairs * pw))
}

/// Consecutive rows of a bf16 `kn` x `d` matrix paired: `[ceil(kn/2)][d][2]` (V for the
/// bf16 PV tile), a missing last row as zeros ([`Isa::Avx512Bf16`] only).
pub fn interleave_rows(isa: Isa, src: &[u16], kn: usize, d: usize, dst: &mut [u16]) {
    check_isa(isa);
    assert!(
        isa.bf16_pairs(),
        "bf16 pairs need the avx512-bf16 or amx-bf16 path"
    );
    assert!(src.len() >= kn * d && dst.len() >= kn.div_ceil(2) * d * 2);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `src` holds kn x d and `dst` the paired output (checked); isa available.
    unsafe {
        bf16::interleave_rows(src.as_ptr(), kn, d, dst.as_mut_ptr())
    }
}

/// FLOPs of `iters` rounds of the path's peak loop (f32 FMA chains; `bf16`: `vdpbf16ps`
/// chains, only on [`Isa::Avx512Bf16`]) after running it; the value keeps it from being
/// optimized away.
pub fn peak_loop(isa: Isa, bf16: bool, iters: usize) -> (f64, f32) {
    check_isa(isa);
    let (_, _, w) = tile_shape(isa);
    if bf16 {
        assert!(isa.bf16_dot(), "bf16 pairs need the avx512-bf16 path");
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: the path (with AVX512_BF16) is available (checked).
            let v = unsafe { bf16::dot_chains(iters) };
            return ((iters * 12 * 16 * 2 * 2) as f64, v);
        }
    }
    // SAFETY: the path is available (checked).
    let v = unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            i if i.avx512() => avx512::fma_chains(iters),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => avx2::fma_chains(iters),
            _ => portable::fma_chains(iters),
        }
    };
    ((iters * portable::FMA_CHAINS * w * 2) as f64, v)
}

/// The bf16 storage of a tensor as raw bits, if it is bf16.
pub fn bf16_bits(t: &Tensor) -> Option<&[u16]> {
    match t {
        Tensor::Bf16(v) => Some(v.reinterpret_cast()),
        _ => None,
    }
}

/// [`as_u16`] of a shared slice (packed bf16 operands read by every item of a phase).
pub fn as_u16_ref(x: &[f32]) -> &[u16] {
    // SAFETY: as `as_u16`, for a shared borrow.
    unsafe { std::slice::from_raw_parts(x.as_ptr() as *const u16, x.len() * 2) }
}

/// A scratch f32 slice viewed as twice as many u16 (for bf16 tiles carved from a workspace).
pub fn as_u16(x: &mut [f32]) -> &mut [u16] {
    let len = x.len() * 2;
    // SAFETY: u16 has a smaller alignment than f32 and no invalid bit patterns; the view
    // covers exactly the same bytes and borrows `x` mutably for its lifetime.
    unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr() as *mut u16, len) }
}

#[cfg(test)]
mod tests;
