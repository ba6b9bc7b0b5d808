//! Intel AMX (Advanced Matrix Extensions, Intel SDM Vol. 1 ch. 18): eight tile registers of
//! up to 16 rows x 64 bytes and `tdpbf16ps`, C (16 x 16 f32) += A (16 x 32 bf16) B (16 rows
//! of 16 bf16 pairs), 16 384 FLOPs per instruction. Whether this process may use them
//! (CPUID, then Linux's per-process permission for the tile data, `ARCH_REQ_XCOMP_PERM`),
//! the one tile shape every kernel uses (all eight tiles 16 x 64 bytes), and the tile
//! instructions as `asm!` (Rust's AMX intrinsics are unstable). The compiler never
//! allocates tile registers, so tile contents live from one `asm!` statement to the next.

use std::sync::OnceLock;

/// Whether this CPU has AMX-TILE and AMX-BF16 and the OS let this process use the tiles
/// (asked once per process).
pub fn usable() -> bool {
    static USABLE: OnceLock<bool> = OnceLock::new();
    *USABLE.get_or_init(detect)
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn detect() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    // CPUID leaf 7 (when leaf 0 says it exists), EDX: bit 22 AMX-BF16, bit 24 AMX-TILE.
    let has = __cpuid(0).eax >= 7 && {
        let edx = __cpuid_count(7, 0).edx;
        edx & (1 << 22) != 0 && edx & (1 << 24) != 0
    };
    // The tiles need AVX-512 besides (the softmax between the products).
    if !has || !std::arch::is_x86_feature_detected!("avx512bf16") {
        return false;
    }
    // Linux hands out the 8 KiB tile state per process on request (arch/x86 xstate.c):
    // ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA; without it the first tile load faults.
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these arguments only changes this process's xstate permission.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn detect() -> bool {
    false
}

/// Rows of every tile, and bytes per row (16 f32, 32 bf16 or 16 bf16 pairs).
pub const ROWS: usize = 16;
pub const ROW_BYTES: usize = 64;

/// The tile configuration `ldtilecfg` reads: palette 1, all eight tiles 16 rows x 64 bytes.
#[cfg(target_arch = "x86_64")]
#[repr(C, align(64))]
struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

/// Tiles configured for the calling thread for as long as the guard lives; released on drop
/// (the thread's tile state is then small again on every context switch).
#[cfg(target_arch = "x86_64")]
pub struct Tiles(());

#[cfg(target_arch = "x86_64")]
impl Tiles {
    /// # Safety
    /// [`usable`] must be true.
    pub unsafe fn configure() -> Tiles {
        let mut cfg = Config {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for t in 0..8 {
            cfg.colsb[t] = ROW_BYTES as u16;
            cfg.rows[t] = ROWS as u8;
        }
        // SAFETY: AMX is usable (the caller's contract); cfg is a valid 64-byte config.
        unsafe {
            std::arch::asm!("ldtilecfg [{cfg}]", cfg = in(reg) &cfg, options(nostack, readonly));
        }
        Tiles(())
    }
}

#[cfg(target_arch = "x86_64")]
impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: a `Tiles` exists only after `configure`, so AMX is usable.
        unsafe { std::arch::asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// Tile `T` = 0.
///
/// # Safety
/// Tiles configured on this thread ([`Tiles::configure`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn zero<const T: u8>() {
    // SAFETY: the caller's contract.
    unsafe { std::arch::asm!("tilezero tmm{t}", t = const T, options(nostack, nomem)) };
}

/// Tile `T` = the 16 rows of 64 bytes at `p`, `stride` bytes apart.
///
/// # Safety
/// Tiles configured; the 16 rows readable.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn load<const T: u8>(p: *const u8, stride: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        std::arch::asm!(
            "tileloadd tmm{t}, [{p} + {s}*1]",
            t = const T,
            p = in(reg) p,
            s = in(reg) stride,
            options(nostack, readonly)
        )
    };
}

/// The 16 rows of tile `T` to `p`, `stride` bytes apart.
///
/// # Safety
/// Tiles configured; the 16 rows writable.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn store<const T: u8>(p: *mut u8, stride: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        std::arch::asm!(
            "tilestored [{p} + {s}*1], tmm{t}",
            t = const T,
            p = in(reg) p,
            s = in(reg) stride,
            options(nostack)
        )
    };
}

/// Tile `C` += tile `A` x tile `B` as bf16 pairs (`tdpbf16ps`): C[m][n] += sum over pairs p
/// of A[m][2p] B[p][2n] + A[m][2p + 1] B[p][2n + 1], products exact, sums in f32.
///
/// # Safety
/// Tiles configured.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn dot<const C: u8, const A: u8, const B: u8>() {
    // SAFETY: the caller's contract.
    unsafe {
        std::arch::asm!(
            "tdpbf16ps tmm{c}, tmm{a}, tmm{b}",
            c = const C,
            a = const A,
            b = const B,
            options(nostack, nomem)
        )
    };
}

/// C = A B for one 32 x 32 f32 block as 2 x 2 tiles (C in tiles 0 to 3, A in 4 and 5, B in
/// 6 and 7: all eight), over `steps` steps of 32 bf16 of the shared dimension. A: 32 rows
/// of bf16 at `a`, `a_stride` bytes apart, step s at `a + 64 s`. B: rows of 16 bf16 pairs
/// at `b`, `b_stride` bytes apart, two tiles side by side (32 columns), step s at
/// `b + 16 s b_stride`. C: 32 rows of 32 f32 at `c`, `c_stride` bytes apart, overwritten.
///
/// # Safety
/// Tiles configured; every row named readable (A, B) or writable (C).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn product_32x32(
    (a, a_stride): (*const u8, usize),
    (b, b_stride): (*const u8, usize),
    steps: usize,
    (c, c_stride): (*mut u8, usize),
) {
    // SAFETY: the caller's contract.
    unsafe { product_32x32_parts(&[((a, a_stride), b, steps)], b_stride, (c, c_stride)) }
}

/// [`product_32x32`] with the shared dimension in parts, each its own A (rows, stride) and
/// B start and steps, all summed into C: the keys of MLA, whose latent and RoPE parts lie
/// in two tensors.
///
/// # Safety
/// As [`product_32x32`], for every part.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::type_complexity)]
pub unsafe fn product_32x32_parts(
    parts: &[((*const u8, usize), *const u8, usize)],
    b_stride: usize,
    c: (*mut u8, usize),
) {
    // SAFETY: the caller's contract.
    unsafe { product_32x32_between(parts, b_stride, c, &mut || {}) }
}

/// [`product_32x32_parts`] calling `between` after each step's four products (a kernel's
/// prefetches, spread over its tile work: `spread::Spread`).
///
/// # Safety
/// As [`product_32x32`], for every part.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::type_complexity)]
pub unsafe fn product_32x32_between(
    parts: &[((*const u8, usize), *const u8, usize)],
    b_stride: usize,
    (c, c_stride): (*mut u8, usize),
    between: &mut impl FnMut(),
) {
    // SAFETY: the caller's contract.
    unsafe {
        zero::<0>();
        zero::<1>();
        zero::<2>();
        zero::<3>();
        for &((a, a_stride), b, steps) in parts {
            for s in 0..steps {
                let (a, b) = (a.add(s * ROW_BYTES), b.add(s * ROWS * b_stride));
                load::<4>(a, a_stride);
                load::<5>(a.add(ROWS * a_stride), a_stride);
                load::<6>(b, b_stride);
                load::<7>(b.add(ROW_BYTES), b_stride);
                dot::<0, 4, 6>();
                dot::<1, 4, 7>();
                dot::<2, 5, 6>();
                dot::<3, 5, 7>();
                between();
            }
        }
        store::<0>(c, c_stride);
        store::<1>(c.add(ROW_BYTES), c_stride);
        store::<2>(c.add(ROWS * c_stride), c_stride);
        store::<3>(c.add(ROWS * c_stride + ROW_BYTES), c_stride);
    }
}

/// FLOPs of `iters` rounds of four independent `tdpbf16ps` (the AMX peak loop) after running
/// them on the calling thread, and a value of the result that keeps it from being
/// optimized away.
///
/// # Safety
/// [`usable`] must be true.
#[cfg(target_arch = "x86_64")]
pub unsafe fn peak_loop(iters: usize) -> (f64, f32) {
    let ab = [0u8; ROWS * ROW_BYTES];
    let mut c = [0f32; ROWS * ROW_BYTES / 4];
    // SAFETY: AMX usable (the caller's contract); every tile is 16 rows of 64 bytes in `ab`
    // and `c`.
    unsafe {
        let _t = Tiles::configure();
        zero::<0>();
        zero::<1>();
        zero::<2>();
        zero::<3>();
        load::<4>(ab.as_ptr(), ROW_BYTES);
        load::<5>(ab.as_ptr(), ROW_BYTES);
        load::<6>(ab.as_ptr(), ROW_BYTES);
        load::<7>(ab.as_ptr(), ROW_BYTES);
        for _ in 0..iters {
            dot::<0, 4, 6>();
            dot::<1, 4, 7>();
            dot::<2, 5, 6>();
            dot::<3, 5, 7>();
        }
        store::<0>(c.as_mut_ptr() as *mut u8, ROW_BYTES);
    }
    ((iters * 4 * ROWS * ROWS * 32 * 2) as f64, c[0])
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// One tile product against the plain sum: A (16 x 32) and B (16 pairs x 16) of small
    /// integers, exact in bf16 and f32, give C exactly.
    #[test]
    fn a_tile_product_is_the_pairwise_sum() {
        if !usable() {
            eprintln!("skipped: this CPU or OS offers no AMX-BF16");
            return;
        }
        let bf = |x: f32| half::bf16::from_f32(x).to_bits();
        let a: Vec<u16> = (0..16 * 32).map(|i| bf((i % 7) as f32 - 3.0)).collect();
        let b: Vec<u16> = (0..16 * 32).map(|i| bf((i % 5) as f32 - 2.0)).collect();
        let mut c = vec![1.0f32; 16 * 16];
        // SAFETY: AMX usable (checked); every tile is 16 rows of 64 bytes in these buffers.
        unsafe {
            let _t = Tiles::configure();
            load::<0>(c.as_ptr() as *const u8, 64);
            load::<1>(a.as_ptr() as *const u8, 64);
            load::<2>(b.as_ptr() as *const u8, 64);
            dot::<0, 1, 2>();
            store::<0>(c.as_mut_ptr() as *mut u8, 64);
        }
        let v = |x: u16| half::bf16::from_bits(x).to_f32();
        for m in 0..16 {
            for n in 0..16 {
                let want: f32 = 1.0
                    + (0..32)
                        .map(|k| v(a[m * 32 + k]) * v(b[(k / 2) * 32 + 2 * n + k % 2]))
                        .sum::<f32>();
                assert_eq!(c[m * 16 + n], want, "C[{m}][{n}]");
            }
        }
    }
}
