//! Cache blocking by the per-core L2 size: `naive` and Rabe–Staats hold a strip's f32 scores
//! against a whole row of keys (one key chunk) between QK^T, the softmax and PV, so a pass
//! computes only as many query rows as fit in L2 ([`pass_rows`]). The L2 size comes from
//! Linux sysfs (what the hypervisor exposes, in a VM), read once per process; elsewhere a
//! 1 MiB L2 is assumed. Cost: one directory scan; nothing per call.
//!
//! Why it matters: with 64 rows of 4096 keys (1 MiB of scores) a Zen 3 core (512 KiB L2)
//! spilled every pass to L3, which other tenants of a shared host also use: naive and
//! Rabe–Staats at n = 4096..8192 ran 5-25% slower than with the rows below (commit message
//! `examples/pass_rows.rs`), while the Zen 4 and Zen 5 (1 MiB L2) were not affected at
//! n = 4096. The rows change no result: each row's scores, softmax and products are computed
//! the same way whichever pass it falls in (tests in `naive` and `chunked`).

use std::cell::Cell;
use std::sync::OnceLock;

/// The L2 assumed where the size cannot be read.
pub const DEFAULT_L2_BYTES: usize = 1 << 20;

/// Fewest query rows per pass: below this the QK^T tiles reuse each K^T panel too little
/// (8 rows ran 12-16% slower than 16 at d = 128, n = 4096 on a Zen 3).
pub const MIN_PASS_ROWS: usize = 12;

/// Most query rows per pass: the strips and row blocks the kernels hand out are 64 rows.
pub const MAX_PASS_ROWS: usize = 64;

thread_local! {
    static ROWS_OVERRIDE: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The per-core L2 cache size in bytes: the level-2 data or unified cache of cpu0 in sysfs,
/// else [`DEFAULT_L2_BYTES`].
pub fn l2_bytes() -> usize {
    static L2: OnceLock<usize> = OnceLock::new();
    *L2.get_or_init(|| read_l2("/sys/devices/system/cpu/cpu0/cache").unwrap_or(DEFAULT_L2_BYTES))
}

/// Whether [`l2_bytes`] was read from the machine (false: the assumed default).
pub fn l2_known() -> bool {
    read_l2("/sys/devices/system/cpu/cpu0/cache").is_some()
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

/// Query rows per pass over `keys` keys: the most whose f32 scores take at most 3/4 of L2
/// (the rest holds the K^T panel and the block of V the tiles stream), a multiple of the
/// register tile's 6 rows, from [`MIN_PASS_ROWS`] to [`MAX_PASS_ROWS`]. On a 512 KiB L2:
/// 64 rows up to 1536 keys, 48 at 2048, 24 at 4096, 12 at 8192 and beyond; on 1 MiB: 64 up
/// to 3072 keys, 48 at 4096, 24 at 8192. Measured on a Zen 3 (512 KiB, d = 64 and 128),
/// these were within noise of the best of 8 to 64 rows at each n.
pub fn pass_rows(keys: usize) -> usize {
    ROWS_OVERRIDE
        .with(Cell::get)
        .unwrap_or_else(|| rows_for(l2_bytes(), keys))
}

fn rows_for(l2: usize, keys: usize) -> usize {
    let fit = (l2 / 4 * 3) / (4 * keys.max(1));
    if fit >= MAX_PASS_ROWS {
        return MAX_PASS_ROWS;
    }
    (fit / 6 * 6).max(MIN_PASS_ROWS)
}

/// The passes (first row, rows) over `rows` rows, `per` at a time.
pub fn passes(rows: usize, per: usize) -> impl Iterator<Item = (usize, usize)> {
    let per = per.max(1);
    (0..rows)
        .step_by(per)
        .map(move |r0| (r0, per.min(rows - r0)))
}

/// The size of the level-2 data or unified cache under `dir` (`index*/level`, `type` and
/// `size` as Linux writes them: "512K", "1024K", "2M").
fn read_l2(dir: &str) -> Option<usize> {
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).ok();
    std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
        let p = e.path();
        let level = read(p.join("level"))?;
        let kind = read(p.join("type"))?;
        if level.trim() != "2" || kind.trim() == "Instruction" {
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
        assert_eq!(read_l2(dir.to_str().unwrap()), Some(1 << 20));
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(read_l2("/nonexistent/attnbench"), None);
    }

    #[test]
    fn pass_rows_keep_the_scores_within_three_quarters_of_l2() {
        let l2 = 512 << 10;
        assert_eq!(rows_for(l2, 1024), 64);
        assert_eq!(rows_for(l2, 2048), 48);
        assert_eq!(rows_for(l2, 4096), 24);
        assert_eq!(rows_for(l2, 8192), 12);
        assert_eq!(rows_for(l2, 1 << 20), MIN_PASS_ROWS);
        assert_eq!(rows_for(1 << 20, 4096), 48);
        assert_eq!(rows_for(1 << 20, 8192), 24);
        assert_eq!(rows_for(l2, 0), 64);
        for keys in [100, 1500, 3000, 5000, 7000] {
            let r = rows_for(l2, keys);
            assert!((MIN_PASS_ROWS..=MAX_PASS_ROWS).contains(&r));
            assert!(r == MAX_PASS_ROWS || r.is_multiple_of(6));
            assert!(r == MIN_PASS_ROWS || r * keys * 4 <= l2 / 4 * 3);
        }
        assert_eq!(with_pass_rows(7, || pass_rows(300)), 7);
        assert_eq!(pass_rows(300), rows_for(l2_bytes(), 300));
    }

    #[test]
    fn passes_cover_the_rows_once() {
        let p: Vec<_> = passes(64, 24).collect();
        assert_eq!(p, [(0, 24), (24, 24), (48, 16)]);
        assert_eq!(passes(0, 24).count(), 0);
        assert_eq!(passes(5, 64).collect::<Vec<_>>(), [(0, 5)]);
    }
}
