//! Cache blocking by the core's L2 and its share of L3: `naive` and Rabe–Staats hold a
//! strip's f32 scores against a whole row of keys (one key chunk) between QK^T, the softmax
//! and PV, so a pass computes only as many query rows as fit in L2 ([`pass_rows`]), as long
//! as the K^T panels and V that every pass reads again stay in this core's share of L3.
//! Sizes come from Linux sysfs (what the hypervisor exposes, in a VM), read once per
//! process; elsewhere a 1 MiB L2 and a 32 MiB L3 are assumed. Cost: one directory scan;
//! nothing per call.
//!
//! Why: with 64 rows of 4096 keys (1 MiB of scores) a Zen 3 core (512 KiB L2) spilled every
//! strip to the L3 that the host's other tenants share. On that VM, alternating row counts
//! call by call (`examples/pass_rows.rs`, f32, one thread), the rows below ran naive and
//! Rabe–Staats 1.06x to 1.42x faster than 64 rows at d = 64, n = 4096 and 8192, and 1.17x to
//! 1.21x at d = 128, n = 4096; but where K and V of the key row exceed an eighth of L3
//! (d = 128, n = 8192; d = 64, n = 16384: 8 MiB), re-reading them for each pass made 12 to
//! 24 rows 0.5x to 0.8x as fast as 64, so there the strips stay whole. On a Zen 5 (1 MiB
//! L2: 48 rows at 4096 keys, 24 at 8192 for d = 64) the rule ran at 0.99x to 1.00x of 64
//! rows (same tool and cases): neutral where a strip fits. K and V count as the kernels
//! hold them: bf16 pairs take half of f32, so bf16 at d = 128, n = 8192 (4 MiB) takes
//! passes of 24 rows where f32 stays whole; on the Zen 5, naive bf16 ran 1.024x to 1.059x
//! as fast as with whole strips non-causal (eight runs of 12 to 15 alternated rounds at
//! h = 1, one of 4 at h = 8; one run of 3 rounds gave 0.99x) and 1.00x to 1.02x causal, on
//! 1 and 2 threads (`examples/pass_rows.rs`). The rows change no
//! result: each row's scores, softmax and products are computed the same way whichever pass
//! it falls in (tests in `naive` and `chunked`).

use std::cell::Cell;
use std::sync::OnceLock;

/// The L2 assumed where the size cannot be read.
pub const DEFAULT_L2_BYTES: usize = 1 << 20;

/// The L3 assumed where the size cannot be read.
pub const DEFAULT_L3_BYTES: usize = 32 << 20;

/// The part of L3 one core can count on: the L3 of a CCX is shared by 8 cores (AMD Zen 2 to
/// 5), on a shared host by other tenants' cores too.
pub const L3_SHARE: usize = 8;

/// Fewest query rows per pass: below this the QK^T tiles reuse each K^T panel too little
/// (8 rows ran 12-16% slower than 16 at d = 128, n = 4096 on a Zen 3).
pub const MIN_PASS_ROWS: usize = 12;

/// Most query rows per pass: the strips and row blocks the kernels hand out are 64 rows.
pub const MAX_PASS_ROWS: usize = 64;

thread_local! {
    static ROWS_OVERRIDE: Cell<Option<usize>> = const { Cell::new(None) };
    static SIZES_OVERRIDE: Cell<Option<(usize, usize)>> = const { Cell::new(None) };
}

const SYSFS: &str = "/sys/devices/system/cpu/cpu0/cache";

/// The L2 and L3 sizes of cpu0 as sysfs gives them (None where it does not), read once.
fn read_sizes() -> (Option<usize>, Option<usize>) {
    static SIZES: OnceLock<(Option<usize>, Option<usize>)> = OnceLock::new();
    *SIZES.get_or_init(|| (read_level(SYSFS, 2), read_level(SYSFS, 3)))
}

/// The per-core L2 cache size in bytes: the level-2 data or unified cache of cpu0 in sysfs,
/// else [`DEFAULT_L2_BYTES`].
pub fn l2_bytes() -> usize {
    read_sizes().0.unwrap_or(DEFAULT_L2_BYTES)
}

/// The size of the L3 cpu0 shares (sysfs), else [`DEFAULT_L3_BYTES`].
pub fn l3_bytes() -> usize {
    read_sizes().1.unwrap_or(DEFAULT_L3_BYTES)
}

/// Whether [`l2_bytes`] and [`l3_bytes`] were read from the machine (false: one or both
/// are the assumed defaults).
pub fn sizes_known() -> bool {
    matches!(read_sizes(), (Some(_), Some(_)))
}

/// Runs `f` with [`pass_rows`] answering `rows` on this thread (the kernels ask on the
/// calling thread, before they hand work to the pool): for tests and tuning
/// (`examples/pass_rows.rs`).
pub fn with_pass_rows<R>(rows: usize, f: impl FnOnce() -> R) -> R {
    let old = ROWS_OVERRIDE.with(|c| c.replace(Some(rows.max(1))));
    let r = f();
    ROWS_OVERRIDE.with(|c| c.set(old));
    r
}

/// Runs `f` with [`pass_rows`] and [`pass_rule`] computing as on a core of `l2` bytes of L2
/// and `l3` of L3 (instead of this machine's), on this thread: each rule of the rows per
/// pass on small shapes, in tests and tuning.
pub fn with_cache_sizes<R>(l2: usize, l3: usize, f: impl FnOnce() -> R) -> R {
    let old = SIZES_OVERRIDE.with(|c| c.replace(Some((l2, l3))));
    let r = f();
    SIZES_OVERRIDE.with(|c| c.set(old));
    r
}

/// (L2, L3) as the rule sees them: [`with_cache_sizes`]'s, else this machine's.
fn sizes() -> (usize, usize) {
    SIZES_OVERRIDE
        .with(Cell::get)
        .unwrap_or_else(|| (l2_bytes(), l3_bytes()))
}

/// Which rule of [`pass_rows`] decides the rows per pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PassRule {
    /// K and V take more than [`L3_SHARE`]th of L3: whole strips ([`MAX_PASS_ROWS`]).
    KvOutgrowsL3,
    /// The scores of [`MAX_PASS_ROWS`] rows fit 3/4 of L2: whole strips.
    StripFitsL2,
    /// The most rows whose scores fit, a multiple of 6 between the bounds.
    RowsFitL2,
    /// Fewer than [`MIN_PASS_ROWS`] rows would fit: [`MIN_PASS_ROWS`].
    MinRows,
}

/// The rule [`pass_rows`] applies over `keys` keys of `kv_bytes` bytes each (a
/// [`with_pass_rows`] override aside).
pub fn pass_rule(keys: usize, kv_bytes: usize) -> PassRule {
    let (l2, l3) = sizes();
    rule_for(l2, l3, keys, kv_bytes).0
}

/// Query rows per pass over `keys` keys whose K and V, as the kernel holds them, take
/// `kv_bytes` bytes per key ([`kv_bytes`]): [`MAX_PASS_ROWS`] when the keys' K and V take
/// more than [`L3_SHARE`]th of L3 (every pass reads them again); else the most rows whose
/// f32 scores take at most 3/4 of L2 (the rest holds the K^T panel and the block of V the
/// tiles stream), a multiple of the register tile's 6 rows, from [`MIN_PASS_ROWS`] to
/// [`MAX_PASS_ROWS`]. With 512 KiB of L2 and 32 MiB of L3 (the Zen 3 VM), f32: 64 rows up
/// to 1536 keys, 48 at 2048, 24 at 4096, 12 at 8192 for d = 64; at d = 128 64 rows again
/// from 8192 keys (bf16 pairs: from 16384).
pub fn pass_rows(keys: usize, kv_bytes: usize) -> usize {
    ROWS_OVERRIDE.with(Cell::get).unwrap_or_else(|| {
        let (l2, l3) = sizes();
        rows_for(l2, l3, keys, kv_bytes)
    })
}

/// Bytes per key of K and V at head dim `d`, with `k_bytes` and `v_bytes` per value as the
/// kernel holds them (4 for f32, 2 for bf16 pairs).
pub fn kv_bytes(d: usize, k_bytes: usize, v_bytes: usize) -> usize {
    d * (k_bytes + v_bytes)
}

fn rows_for(l2: usize, l3: usize, keys: usize, kv_bytes: usize) -> usize {
    rule_for(l2, l3, keys, kv_bytes).1
}

/// The rule that decides, and the rows per pass.
fn rule_for(l2: usize, l3: usize, keys: usize, kv_bytes: usize) -> (PassRule, usize) {
    if keys * kv_bytes > l3 / L3_SHARE {
        return (PassRule::KvOutgrowsL3, MAX_PASS_ROWS);
    }
    let fit = (l2 / 4 * 3) / (4 * keys.max(1));
    if fit >= MAX_PASS_ROWS {
        return (PassRule::StripFitsL2, MAX_PASS_ROWS);
    }
    let rows = fit / 6 * 6;
    if rows < MIN_PASS_ROWS {
        (PassRule::MinRows, MIN_PASS_ROWS)
    } else {
        (PassRule::RowsFitL2, rows)
    }
}

/// The passes (first row, rows) over `rows` rows, `per` at a time.
pub fn passes(rows: usize, per: usize) -> impl Iterator<Item = (usize, usize)> {
    let per = per.max(1);
    (0..rows)
        .step_by(per)
        .map(move |r0| (r0, per.min(rows - r0)))
}

/// The size of the data or unified cache of `level` under `dir` (`index*/level`, `type`
/// and `size` as Linux writes them: "512K", "1024K", "2M").
fn read_level(dir: &str, level: u32) -> Option<usize> {
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).ok();
    let level_name = level.to_string();
    std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
        let p = e.path();
        let this = read(p.join("level"))?;
        let kind = read(p.join("type"))?;
        if this.trim() != level_name || kind.trim() == "Instruction" {
            return None;
        }
        parse_size(read(p.join("size"))?.trim())
    })
}

fn parse_size(s: &str) -> Option<usize> {
    let (num, mult) = match s.char_indices().last()? {
        (i, 'K') => (&s[..i], 1 << 10),
        (i, 'M') => (&s[..i], 1 << 20),
        (i, 'G') => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>()
        .ok()
        .map(|n| n * mult)
        .filter(|&b| b > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_sizes_parse() {
        assert_eq!(parse_size("512K"), Some(512 << 10));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("K"), None);
        assert_eq!(parse_size("0K"), None);
        assert_eq!(parse_size("x"), None);
    }

    #[test]
    fn the_l2_is_found_among_the_cache_levels() {
        let dir = std::env::temp_dir().join(format!("attnbench-cache-{}", std::process::id()));
        for (i, level, kind, size) in [
            (0, "1", "Data", "32K"),
            (1, "1", "Instruction", "32K"),
            (2, "2", "Unified", "1024K"),
            (3, "3", "Unified", "32768K"),
        ] {
            let d = dir.join(format!("index{i}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("level"), format!("{level}\n")).unwrap();
            std::fs::write(d.join("type"), format!("{kind}\n")).unwrap();
            std::fs::write(d.join("size"), format!("{size}\n")).unwrap();
        }
        let at = dir.to_str().unwrap();
        assert_eq!(read_level(at, 2), Some(1 << 20));
        assert_eq!(read_level(at, 3), Some(32 << 20));
        assert_eq!(read_level(at, 4), None);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(read_level("/nonexistent/attnbench", 2), None);
    }

    /// K and V in f32 at head dim `d`.
    fn f32(d: usize) -> usize {
        kv_bytes(d, 4, 4)
    }

    #[test]
    fn pass_rows_keep_the_scores_within_three_quarters_of_l2() {
        let (l2, l3) = (512 << 10, 32 << 20);
        assert_eq!(rows_for(l2, l3, 1024, f32(64)), 64);
        assert_eq!(rows_for(l2, l3, 2048, f32(64)), 48);
        assert_eq!(rows_for(l2, l3, 4096, f32(64)), 24);
        assert_eq!(rows_for(l2, l3, 8192, f32(64)), 12);
        assert_eq!(rows_for(l2, l3, 4096, f32(128)), 24);
        assert_eq!(rows_for(l2, l3, 0, f32(64)), 64);
        assert_eq!(rows_for(1 << 20, l3, 4096, f32(64)), 48);
        assert_eq!(rows_for(1 << 20, l3, 8192, f32(64)), 24);
        // A tiny L2 still gives the tiles their rows.
        assert_eq!(rows_for(16 << 10, l3, 300, f32(64)), MIN_PASS_ROWS);
        for keys in [100, 1500, 3000, 5000, 7000] {
            let r = rows_for(l2, l3, keys, f32(32));
            assert!((MIN_PASS_ROWS..=MAX_PASS_ROWS).contains(&r));
            assert!(r == MAX_PASS_ROWS || r.is_multiple_of(6));
            assert!(r == MIN_PASS_ROWS || r * keys * 4 <= l2 / 4 * 3);
        }
        assert_eq!(with_pass_rows(7, || pass_rows(300, f32(64))), 7);
        assert_eq!(
            pass_rows(300, f32(64)),
            rows_for(l2_bytes(), l3_bytes(), 300, f32(64))
        );
    }

    #[test]
    fn strips_stay_whole_when_k_and_v_outgrow_the_cores_share_of_l3() {
        let (l2, l3) = (512 << 10, 32 << 20);
        // K and V of 8192 keys at d = 128, or 16384 at d = 64: 8 MiB > 32 MiB / 8.
        assert_eq!(rows_for(l2, l3, 8192, f32(128)), MAX_PASS_ROWS);
        assert_eq!(rows_for(l2, l3, 16384, f32(64)), MAX_PASS_ROWS);
        // Exactly the share (4 MiB) still takes passes.
        assert_eq!(rows_for(l2, l3, 8192, f32(64)), 12);
        assert_eq!(rows_for(l2, 64 << 20, 8192, f32(128)), 12);
        // bf16 pairs take half: 8192 keys at d = 128 are the share, and take passes.
        assert_eq!(rows_for(l2, l3, 8192, kv_bytes(128, 2, 2)), 12);
        assert_eq!(rows_for(l2, l3, 16384, kv_bytes(128, 2, 2)), MAX_PASS_ROWS);
        // bf16 K^T pairs with a widened f32 V: 6 bytes per value, over the share.
        assert_eq!(rows_for(l2, l3, 8192, kv_bytes(128, 2, 4)), MAX_PASS_ROWS);
    }

    #[test]
    fn passes_cover_the_rows_once() {
        let p: Vec<_> = passes(64, 24).collect();
        assert_eq!(p, [(0, 24), (24, 24), (48, 16)]);
        assert_eq!(passes(0, 24).count(), 0);
        assert_eq!(passes(5, 64).collect::<Vec<_>>(), [(0, 5)]);
    }
}
