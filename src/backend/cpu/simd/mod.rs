//! Register-blocked microkernels and vectorized softmax pieces, one copy per instruction-set
//! path. The algorithm bodies are written once (`kernels!`) against a small set of vector
//! primitives (`load`, `fma`, `exp2`, ...) that each path's module defines: `avx512`
//! (16 lanes), `avx2` (8 lanes, FMA) and `portable` (plain Rust on `[f32; 8]`); `bf16`
//! holds the `vdpbf16ps` tiles. Everything here works on raw pointers; `super::tiles` is the
//! safe, bounds-checked interface.
//!
//! The GEMM tile is "broadcast A, vector B": C[MR x NV*W] accumulates A[i][p] (a scalar,
//! broadcast, from any strides) times B[p][n..n+W] (contiguous along n). Every use in the
//! attention kernels is laid out so that B is either an input read in place (V) or a small
//! packed tile (Q^T, K^T panels, P^T), so nothing but those tiles is ever copied. The K loop
//! is cut into chunks of at most [`KC`] terms, each summed from zero in registers and then
//! added into C (by `tiles::gemm` and `tiles::gemm_bf16`, whose tiles run one chunk each):
//! every dot product is a sum of partial sums of <= 256 terms (docs/papers.md
//! 1.1 shows why the error bound at n = 16384 needs this).

#[cfg(target_arch = "x86_64")]
pub mod avx2;
#[cfg(target_arch = "x86_64")]
pub mod avx512;
#[cfg(target_arch = "x86_64")]
pub mod bf16;
pub mod portable;

/// Terms of one partial sum along the reduction dimension (the K loop a tile cuts).
pub const KC: usize = 256;

/// Elements of a row summed into one partial sum by the row softmax before it is added to
/// the row total (4 vector accumulators of W lanes each see `ROW_SEG / (4 W)` terms).
pub const ROW_SEG: usize = 4096;

/// log2(e): the kernels compute exp(x) as 2^(x log2 e), folding log2 e into the score scale.
pub const LOG2E: f32 = std::f32::consts::LOG2_E;

/// Coefficients of 2^f on [-1/2, 1/2] (Cephes `exp2f`, relative error about 2e-7).
pub const EXP2_POLY: [f32; 6] = [
    1.535_336_2e-4,
    1.339_887_4e-3,
    9.618_437e-3,
    5.550_332_5e-2,
    2.402_264_8e-1,
    6.931_472e-1,
];

/// What a tile does with its accumulators (one value per product; raw pointers because the
/// kernels are `unsafe` and take no borrows).
#[derive(Clone, Copy)]
pub enum Epi {
    /// C = acc.
    Store,
    /// C += acc.
    Add,
    /// C[i][j] = C[i][j] * s[j] + acc (the online-softmax correction of flash's O^T).
    ScaleAdd(*const f32),
    /// C = acc and m[j] = max(m[j], max_i acc[i][j]) (the running column max of S^T).
    StoreColMax(*mut f32),
    /// C[i][j] = s C[i][j] (acc[i][j] - d[i]), C's old value read first: the softmax
    /// backward's dS = s P (dP - D) written over P, with `d` the tile's rows' D.
    SoftmaxGrad(*const f32, f32),
}

/// Arguments of one tile: C[m x n] (op)= A[m x k] B[k x n], `m <= MR`, `n <= NV * W`.
/// A(i, p) is at `a + i*ars + p*acs` (for bf16 pair tiles: the pair p of row i starts there,
/// in u16 units); B(p, j) at `b + p*ldb + j` (bf16: pair-interleaved rows of 2n values).
#[derive(Clone, Copy)]
pub struct Tile<T> {
    pub k: usize,
    pub a: *const T,
    pub ars: usize,
    pub acs: usize,
    pub b: *const T,
    pub ldb: usize,
    pub c: *mut f32,
    pub ldc: usize,
    /// Valid columns of the last vector (1..=W); below W the vector is masked.
    pub n_last: usize,
    pub epi: Epi,
}

/// Arguments of flash's column softmax over S^T (`kn` key rows x `nb` query columns, row
/// stride `ld`): with `colmax` (raw-score column max of this block, overwritten), update the
/// running max `m2` (log2 units) and sum `l`, write `corr` = 2^(m2_old - m2_new), and turn S^T
/// into P^T = 2^(S^T c - m2_new) in place (f32) or into bf16 pairs at `pairs`.
#[derive(Clone, Copy)]
pub struct ColSoftmax {
    pub st: *mut f32,
    pub kn: usize,
    pub nb: usize,
    pub ld: usize,
    pub c: f32,
    pub colmax: *mut f32,
    pub m2: *mut f32,
    pub l: *mut f32,
    pub corr: *mut f32,
    /// bf16 output P^T pairs `[ceil(kn/2)][nb][2]` (only the `bf16` module writes it).
    pub pairs: *mut u16,
}

/// The tiles' epilogue and its masked row loads and stores, instantiated beside each set of
/// tiles with the same target features (the f32 tiles of each path, and the bf16 tiles), so
/// that LLVM inlines it into them: out of line, the 24 accumulators went through the stack
/// on every call (3 to 6% of a bf16 attention forward).
macro_rules! epilogue_fns {
    ($(#[$attr:meta])*) => {
        /// Loads vector `v` of a row of NV vectors (masked if it is the partial last one).
        $(#[$attr])*
        #[inline]
        unsafe fn ldv<const NV: usize, const PARTIAL: bool>(p: *const f32, v: usize, m: Mask) -> V {
            if PARTIAL && v + 1 == NV {
                load_m(p, m)
            } else {
                load(p)
            }
        }

        $(#[$attr])*
        #[inline]
        unsafe fn stv<const NV: usize, const PARTIAL: bool>(p: *mut f32, v: usize, x: V, m: Mask) {
            if PARTIAL && v + 1 == NV {
                store_m(p, x, m)
            } else {
                store(p, x)
            }
        }

        /// Applies `epi` to an MR x NV block of accumulators at `c`.
        /// The accumulators come by value: were this left out of line, a reference would make
        /// the tile's k-loop keep them in memory (measured: flash at 42 instead of 101
        /// GFLOP/s per core when LLVM stopped inlining it).
        ///
        /// # Safety
        /// `c` (and the epilogue's column vector) valid for the block, as in [`tile`].
        $(#[$attr])*
        #[inline]
        unsafe fn epilogue<const MR: usize, const NV: usize, const PARTIAL: bool>(
            acc: [[V; NV]; MR],
            c: *mut f32,
            ldc: usize,
            epi: Epi,
            lastm: Mask,
        ) {
            match epi {
                Epi::Store => {
                    for (i, row) in acc.iter().enumerate() {
                        for (v, x) in row.iter().enumerate() {
                            stv::<NV, PARTIAL>(c.add(i * ldc + v * W), v, *x, lastm);
                        }
                    }
                }
                Epi::Add => {
                    for (i, row) in acc.iter().enumerate() {
                        for (v, x) in row.iter().enumerate() {
                            let p = c.add(i * ldc + v * W);
                            let y = add(ldv::<NV, PARTIAL>(p, v, lastm), *x);
                            stv::<NV, PARTIAL>(p, v, y, lastm);
                        }
                    }
                }
                Epi::ScaleAdd(s) => {
                    let mut sv = [zero(); NV];
                    for (v, x) in sv.iter_mut().enumerate() {
                        *x = ldv::<NV, PARTIAL>(s.add(v * W), v, lastm);
                    }
                    for (i, row) in acc.iter().enumerate() {
                        for (v, x) in row.iter().enumerate() {
                            let p = c.add(i * ldc + v * W);
                            let y = fma(ldv::<NV, PARTIAL>(p, v, lastm), sv[v], *x);
                            stv::<NV, PARTIAL>(p, v, y, lastm);
                        }
                    }
                }
                Epi::StoreColMax(m) => {
                    let mut mv = [zero(); NV];
                    for (v, x) in mv.iter_mut().enumerate() {
                        *x = ldv::<NV, PARTIAL>(m.add(v * W), v, lastm);
                    }
                    for (i, row) in acc.iter().enumerate() {
                        for (v, x) in row.iter().enumerate() {
                            stv::<NV, PARTIAL>(c.add(i * ldc + v * W), v, *x, lastm);
                            mv[v] = max(mv[v], *x);
                        }
                    }
                    for (v, x) in mv.iter().enumerate() {
                        stv::<NV, PARTIAL>(m.add(v * W), v, *x, lastm);
                    }
                }
                Epi::SoftmaxGrad(d, s) => {
                    // (s P) (dP - D), in `softmax_grad_rows`'s order: the same bits.
                    let sv = splat(s);
                    for (i, row) in acc.iter().enumerate() {
                        let di = bcast(d.add(i));
                        for (v, x) in row.iter().enumerate() {
                            let p = c.add(i * ldc + v * W);
                            let y = mul(mul(sv, ldv::<NV, PARTIAL>(p, v, lastm)), sub(*x, di));
                            stv::<NV, PARTIAL>(p, v, y, lastm);
                        }
                    }
                }
            }
        }

    };
}
pub(crate) use epilogue_fns;

/// The shared bodies. Each path module defines the primitives `V`, `Mask`, `W`, `zero`,
/// `splat`, `bcast`, `load`, `store`, `mask_first`, `load_m`, `store_m`, `blend_m`,
/// `add`, `sub`, `mul`, `fma`, `max`, `hmax`, `hsum`, `exp2`, `mask_le`, `neg_inf_to_zero`, then
/// invokes `kernels!` with its `#[target_feature]` attribute (none for `portable`).
macro_rules! kernels {
    ($mr_max:literal, $nv_max:literal, $(#[$attr:meta])*) => {
        use $crate::backend::cpu::simd::{stream_head, ColSoftmax, Epi, Tile, KC, ROW_SEG};

        /// Register rows of a tile (MR) and vectors across (NV): MR x NV accumulators.
        pub const MR_MAX: usize = $mr_max;
        pub const NV_MAX: usize = $nv_max;
        /// Independent chains of [`fma_chains`].
        pub const FMA_CHAINS: usize = 12;

        /// One MR x NV tile of the f32 GEMM over one block of at most [`KC`] terms (the
        /// caller, `tiles::gemm`, cuts the reduction into blocks): one partial sum per
        /// product, summed from zero in registers, then the epilogue.
        ///
        /// # Safety
        /// All pointers of `t` are valid for the rows, columns and k it names (B and C
        /// columns beyond `n_last` of the last vector are never touched).
        $(#[$attr])*
        #[inline]
        pub unsafe fn tile<const MR: usize, const NV: usize, const PARTIAL: bool>(t: &Tile<f32>) {
            debug_assert!(t.k <= KC, "an f32 tile sums at most KC terms");
            let lastm = mask_first(if PARTIAL { t.n_last } else { W });
            let (acs, ldb) = (t.acs, t.ldb);
            let mut acc = [[zero(); NV]; MR];
            let (mut ap, mut bp) = (t.a, t.b);
            for _ in 0..t.k {
                let mut bv = [zero(); NV];
                for (v, x) in bv.iter_mut().enumerate() {
                    *x = ldv::<NV, PARTIAL>(bp.add(v * W), v, lastm);
                }
                for (i, row) in acc.iter_mut().enumerate() {
                    let av = bcast(ap.add(i * t.ars));
                    for (x, bx) in row.iter_mut().zip(bv) {
                        *x = fma(av, bx, *x);
                    }
                }
                ap = ap.add(acs);
                bp = bp.add(ldb);
            }
            epilogue::<MR, NV, PARTIAL>(acc, t.c, t.ldc, t.epi, lastm);
        }

        $crate::backend::cpu::simd::epilogue_fns!($(#[$attr])*);

        $(#[$attr])*
        unsafe fn tile_nv<const MR: usize>(nv: usize, partial: bool, t: &Tile<f32>) {
            match (nv, partial) {
                (1, false) => tile::<MR, 1, false>(t),
                (1, true) => tile::<MR, 1, true>(t),
                (2, false) if $nv_max >= 2 => tile::<MR, { 2 % ($nv_max + 1) }, false>(t),
                (2, true) if $nv_max >= 2 => tile::<MR, { 2 % ($nv_max + 1) }, true>(t),
                (3, false) if $nv_max >= 3 => tile::<MR, { 3 % ($nv_max + 1) }, false>(t),
                (3, true) if $nv_max >= 3 => tile::<MR, { 3 % ($nv_max + 1) }, true>(t),
                (4, false) if $nv_max >= 4 => tile::<MR, { 4 % ($nv_max + 1) }, false>(t),
                (4, true) if $nv_max >= 4 => tile::<MR, { 4 % ($nv_max + 1) }, true>(t),
                _ => unreachable!("tile width {nv} vectors"),
            }
        }

        /// A tile of `mr` (1..=MR_MAX) rows and `nv` (1..=NV_MAX) vectors.
        ///
        /// # Safety
        /// As [`tile`].
        $(#[$attr])*
        pub unsafe fn tile_any(mr: usize, nv: usize, partial: bool, t: &Tile<f32>) {
            match mr {
                1 => tile_nv::<1>(nv, partial, t),
                2 => tile_nv::<2>(nv, partial, t),
                3 => tile_nv::<3>(nv, partial, t),
                4 => tile_nv::<4>(nv, partial, t),
                5 if $mr_max >= 5 => tile_nv::<{ 5 % ($mr_max + 1) }>(nv, partial, t),
                6 if $mr_max >= 6 => tile_nv::<{ 6 % ($mr_max + 1) }>(nv, partial, t),
                _ => unreachable!("tile height {mr} rows"),
            }
        }

        /// Flash's column softmax of one S^T block (see [`ColSoftmax`]), P^T in place.
        ///
        /// # Safety
        /// `st` holds `kn` rows of `nb` floats at stride `ld`; `colmax`, `m2`, `l`, `corr`
        /// hold `nb` floats; `nb` is a multiple of W.
        $(#[$attr])*
        pub unsafe fn col_softmax(a: &ColSoftmax) {
            let c = splat(a.c);
            // Per column: the new running max, the correction of the old state, and the
            // max actually subtracted (0 while a column has seen only masked keys, so
            // -inf - -inf never makes a NaN); `colmax` keeps the latter for the row pass.
            for v in (0..a.nb).step_by(W) {
                let m_old = load(a.m2.add(v));
                let m_new = max(m_old, mul(load(a.colmax.add(v)), c));
                let m_safe = neg_inf_to_zero(m_new);
                store(a.corr.add(v), exp2(sub(m_old, m_safe)));
                store(a.m2.add(v), m_new);
                store(a.colmax.add(v), m_safe);
            }
            // Four column vectors at a time: their subtracted max and row sums stay in
            // registers while the key rows stream past (a partial sum of <= kn terms).
            let mut v0 = 0;
            while v0 < a.nb {
                let g = 4.min((a.nb - v0) / W);
                match g {
                    4 => col_group::<4>(a, v0),
                    3 => col_group::<3>(a, v0),
                    2 => col_group::<2>(a, v0),
                    _ => col_group::<1>(a, v0),
                }
                v0 += g * W;
            }
        }

        /// Columns `v0..v0 + G*W` of [`col_softmax`]'s row pass (G fixed, so the sums and
        /// maxima are registers).
        $(#[$attr])*
        #[inline]
        unsafe fn col_group<const G: usize>(a: &ColSoftmax, v0: usize) {
            let c = splat(a.c);
            let mut ms = [zero(); G];
            let mut sum = [zero(); G];
            for (u, m) in ms.iter_mut().enumerate() {
                // Negated, for one FMA per element: x c - m.
                *m = sub(zero(), load(a.colmax.add(v0 + u * W)));
            }
            for j in 0..a.kn {
                let row = a.st.add(j * a.ld + v0);
                for (u, (m, su)) in ms.iter().zip(sum.iter_mut()).enumerate() {
                    let p = exp2(fma(load(row.add(u * W)), c, *m));
                    store(row.add(u * W), p);
                    *su = add(*su, p);
                }
            }
            for (u, su) in sum.iter().enumerate() {
                let lp = a.l.add(v0 + u * W);
                store(lp, fma(load(lp), load(a.corr.add(v0 + u * W)), *su));
            }
        }

        /// Causal mask and column max of one S^T block: entry (j, r) becomes -inf where key
        /// `k0 + j` is not visible to query column r (`vis[r]` keys visible, as f32), and
        /// `colmax[r]` = max over the block's rows (overwritten).
        ///
        /// # Safety
        /// As [`col_softmax`]; `vis` holds `nb` floats. `vis == null` means no mask.
        $(#[$attr])*
        pub unsafe fn mask_colmax(
            st: *mut f32,
            kn: usize,
            nb: usize,
            ld: usize,
            vis: *const f32,
            k0: usize,
            colmax: *mut f32,
        ) {
            for v in (0..nb).step_by(W) {
                let mut m = splat(f32::NEG_INFINITY);
                let visv = if vis.is_null() { zero() } else { load(vis.add(v)) };
                for j in 0..kn {
                    let p = st.add(j * ld + v);
                    let mut x = load(p);
                    if !vis.is_null() {
                        x = mask_le(x, visv, splat((k0 + j) as f32));
                        store(p, x);
                    }
                    m = max(m, x);
                }
                store(colmax.add(v), m);
            }
        }

        /// Max of `n` floats (-inf when n = 0).
        ///
        /// # Safety
        /// `x` is valid for `n` floats.
        $(#[$attr])*
        pub unsafe fn row_max(x: *const f32, n: usize) -> f32 {
            let mut m = [splat(f32::NEG_INFINITY); 4];
            let mut i = 0;
            while i + 4 * W <= n {
                for (u, mu) in m.iter_mut().enumerate() {
                    *mu = max(*mu, load(x.add(i + u * W)));
                }
                i += 4 * W;
            }
            while i < n {
                let k = W.min(n - i);
                let mk = mask_first(k);
                // Masked-off lanes load 0: keep them out of the max.
                let v = blend_m(mk, load_m(x.add(i), mk), splat(f32::NEG_INFINITY));
                m[0] = max(m[0], v);
                i += k;
            }
            hmax(max(max(m[0], m[1]), max(m[2], m[3])))
        }

        /// x = 2^(x c - mc) for `n` floats; returns their sum, accumulated in partial sums of
        /// at most ROW_SEG / (4 W) terms per lane, segment totals added in f32.
        ///
        /// # Safety
        /// `x` is valid for `n` floats.
        $(#[$attr])*
        pub unsafe fn exp_sum(x: *mut f32, n: usize, c: f32, mc: f32) -> f32 {
            let (cv, mv) = (splat(c), splat(-mc));
            let mut total = 0.0f32;
            let mut s0 = 0;
            while s0 < n {
                let end = n.min(s0 + ROW_SEG);
                let mut s = [zero(); 4];
                let mut i = s0;
                while i + 4 * W <= end {
                    for (u, su) in s.iter_mut().enumerate() {
                        let p = x.add(i + u * W);
                        let e = exp2(fma(load(p), cv, mv));
                        store(p, e);
                        *su = add(*su, e);
                    }
                    i += 4 * W;
                }
                while i < end {
                    let k = W.min(end - i);
                    let m = mask_first(k);
                    let p = x.add(i);
                    let e = exp2(fma(load_m(p, m), cv, mv));
                    store_m(p, e, m);
                    // Masked-off lanes computed 2^(-mc) (maybe inf): keep them out of the sum.
                    s[0] = add(s[0], blend_m(m, e, zero()));
                    i += k;
                }
                total += hsum(add(add(s[0], s[1]), add(s[2], s[3])));
                s0 = end;
            }
            total
        }

        /// x *= f for `n` floats.
        ///
        /// # Safety
        /// `x` is valid for `n` floats.
        $(#[$attr])*
        pub unsafe fn scale(x: *mut f32, n: usize, f: f32) {
            let fv = splat(f);
            let mut i = 0;
            // Whole vectors by plain loads and stores (AVX2's masked store is microcoded,
            // several times slower), the tail masked.
            while i + W <= n {
                let p = x.add(i);
                store(p, mul(load(p), fv));
                i += W;
            }
            if i < n {
                let m = mask_first(n - i);
                let p = x.add(i);
                store_m(p, mul(load_m(p, m), fv), m);
            }
        }

        /// y += a x for `n` floats (one FMA each).
        ///
        /// # Safety
        /// `y` and `x` are valid for `n` floats.
        $(#[$attr])*
        pub unsafe fn axpy(y: *mut f32, x: *const f32, n: usize, a: f32) {
            let av = splat(a);
            let mut i = 0;
            while i + W <= n {
                let p = y.add(i);
                store(p, fma(av, load(x.add(i)), load(p)));
                i += W;
            }
            if i < n {
                let m = mask_first(n - i);
                let p = y.add(i);
                store_m(p, fma(av, load_m(x.add(i), m), load_m(p, m)), m);
            }
        }

        /// `dst[..n] = x[..n] * f` and `dst[n..n_dst] = 0`, by non-temporal stores from the
        /// first vector-aligned element of `dst` on (`dst` is a large buffer that nothing
        /// reads soon: its lines go to memory without being read first and without
        /// displacing the caches), and `x[..n] *= f` too when `keep`. Call [`store_fence`]
        /// before handing the result over to another thread.
        ///
        /// # Safety
        /// `x` is valid for `n` floats, `dst` for `n_dst >= n`; they do not overlap.
        $(#[$attr])*
        pub unsafe fn scale_stream(
            x: *mut f32,
            n: usize,
            f: f32,
            dst: *mut f32,
            n_dst: usize,
            keep: bool,
        ) {
            let fv = splat(f);
            let head = stream_head(dst, W).min(n_dst);
            let mut i = 0;
            while i < n_dst {
                let k = if i < head { (head - i).min(W) } else { W.min(n_dst - i) };
                if i >= head && k == W && i + W <= n {
                    // A whole vector of x to an aligned one of dst: plain loads and stores
                    // (AVX2's masked store is microcoded, several times slower).
                    let p = x.add(i);
                    let y = mul(load(p), fv);
                    stream(dst.add(i), y);
                    if keep {
                        store(p, y);
                    }
                    i += W;
                    continue;
                }
                // Lanes past x's end load 0 and store 0.
                let mx = mask_first(k.min(n.saturating_sub(i)));
                let p = x.add(i);
                let y = mul(load_m(p, mx), fv);
                if i >= head && k == W {
                    stream(dst.add(i), y);
                } else {
                    store_m(dst.add(i), y, mask_first(k));
                }
                if keep && i < n {
                    store_m(p, y, mx);
                }
                i += k;
            }
        }

        /// Orders the calling thread's non-temporal stores ([`scale_stream`]) before its
        /// later stores, such as the release of its finished work item.
        ///
        /// # Safety
        /// The path's features are available.
        $(#[$attr])*
        pub unsafe fn store_fence() {
            fence()
        }

        /// `iters` rounds of 12 independent FMA chains (enough to cover the latency): the
        /// path's f32 multiply-add issue rate, for the calibrated peak. Returns a sum the
        /// caller keeps, so nothing is optimized away.
        ///
        /// # Safety
        /// The path's features are available.
        $(#[$attr])*
        pub unsafe fn fma_chains(iters: usize) -> f32 {
            const CHAINS: usize = 12;
            let mut acc = [splat(0.5); CHAINS];
            let (m, c) = (splat(0.999_999), splat(1e-7));
            for _ in 0..iters {
                for a in acc.iter_mut() {
                    *a = fma(*a, m, c);
                }
            }
            let mut s = zero();
            for a in acc {
                s = add(s, a);
            }
            hsum(s)
        }

        /// `rows` x `cols` 32-bit values at `src` (row stride `lds`; f32, or bf16 pairs,
        /// moved as bits) transposed into panels of `pw` rows at `dst`, `panel` floats apart:
        /// row r, column c to `dst[(r / pw) * panel + c * pw + r % pw]`. Whole W x W blocks
        /// by `transpose_block` (each source row read once, each destination run of W
        /// written whole), the ragged rows and columns value by value.
        ///
        /// # Safety
        /// `src` is valid for `rows` rows of `lds >= cols` values (aligned to 2 bytes at
        /// least), `dst` for every position above.
        $(#[$attr])*
        pub unsafe fn pack_t(
            src: *const f32,
            lds: usize,
            rows: usize,
            cols: usize,
            pw: usize,
            dst: *mut f32,
            panel: usize,
        ) {
            let cw = cols / W * W;
            for p0 in (0..rows).step_by(pw) {
                let pr = pw.min(rows - p0);
                let (to, from) = (dst.add(p0 / pw * panel), src.add(p0 * lds));
                let rw = pr / W * W;
                for r in (0..rw).step_by(W) {
                    let rows_at = from.add(r * lds);
                    for c in (0..cw).step_by(W) {
                        transpose_block(rows_at.add(c), lds, to.add(c * pw + r), pw);
                    }
                    for c in cw..cols {
                        for i in 0..W {
                            *to.add(c * pw + r + i) = rows_at.add(i * lds + c).read_unaligned();
                        }
                    }
                }
                for r in rw..pr {
                    for c in 0..cols {
                        *to.add(c * pw + r) = from.add(r * lds + c).read_unaligned();
                    }
                }
            }
        }

        /// 2^x for `n` floats, in place (for tests of the polynomial).
        ///
        /// # Safety
        /// `x` is valid for `n` floats.
        $(#[$attr])*
        pub unsafe fn exp2_slice(x: *mut f32, n: usize) {
            let mut i = 0;
            while i < n {
                let k = W.min(n - i);
                let m = mask_first(k);
                let p = x.add(i);
                store_m(p, exp2(load_m(p, m)), m);
                i += k;
            }
        }

    };
}
pub(crate) use kernels;

/// Elements of `dst` before its first `lanes`-float vector that is aligned to its own size
/// (where non-temporal vector stores can start).
#[inline]
pub fn stream_head(dst: *const f32, lanes: usize) -> usize {
    let align = lanes * std::mem::size_of::<f32>();
    (align - dst as usize % align) % align / std::mem::size_of::<f32>()
}

/// 2^x by the kernels' method on one float (range reduction x = n + f, |f| <= 1/2, the
/// polynomial for 2 * 2^f, the exponent bits for 2^(n-1)): the portable path's lane
/// operation, and the reference the vector versions are tested against. Halving the
/// exponent and doubling the polynomial keeps both ends exact: every result is a normal
/// float or 0 (from x <= -125.5 down, where e^x is < 2e-38 and a softmax weight of exactly
/// 0 changes nothing), and only x >= 128 overflows to inf, as 2^x itself does.
#[inline]
pub fn exp2_scalar(x: f32) -> f32 {
    // Written so that a NaN input stays NaN.
    let x = if x < -126.0 { -126.0 } else { x };
    let x = if x > 128.0 { 128.0 } else { x };
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let t = x + MAGIC;
    let n = t - MAGIC;
    let f = x - n;
    let ni = (t.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let e = f32::from_bits((ni.wrapping_add(126) as u32) << 23);
    let mut p = 2.0 * EXP2_POLY[0];
    for c in &EXP2_POLY[1..] {
        p = p * f + 2.0 * c;
    }
    p = p * f + 2.0;
    p * e
}
