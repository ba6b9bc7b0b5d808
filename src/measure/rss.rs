//! Peak resident set size of the process (Linux `VmHWM`), read from `/proc/self`; costs one
//! small file read. Elsewhere the functions report "not available" instead of failing.
//!
//! RSS counts pages actually touched (heap, stacks, code, the allocator's caches), so it is
//! a coarser, OS-level cross-check of the counting allocator's exact heap figures.

/// Resets the peak RSS (`VmHWM`) to the current RSS by writing `5` to
/// `/proc/self/clear_refs` (Linux >= 4.0). Returns false where that is not possible
/// (another OS, or a sandbox that forbids the write).
pub fn reset_peak_rss() -> bool {
    #[cfg(target_os = "linux")]
    {
        std::fs::write("/proc/self/clear_refs", b"5").is_ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// Peak resident set size in bytes since process start or the last [`reset_peak_rss`].
pub fn peak_rss_bytes() -> Option<u64> {
    status_field_bytes("VmHWM:")
}

/// Resident set size in bytes now.
pub fn current_rss_bytes() -> Option<u64> {
    status_field_bytes("VmRSS:")
}

#[cfg(target_os = "linux")]
fn status_field_bytes(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_kb_field(&status, key)
}

#[cfg(not(target_os = "linux"))]
fn status_field_bytes(_key: &str) -> Option<u64> {
    None
}

/// Finds a line `KEY   1234 kB` and returns it in bytes.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn parse_kb_field(status: &str, key: &str) -> Option<u64> {
    let rest = status.lines().find_map(|l| l.strip_prefix(key))?;
    let mut parts = rest.split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") | None => value.checked_mul(1024),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_lines() {
        let status = "Name:\tx\nVmPeak:\t  200 kB\nVmHWM:\t    1234 kB\nVmRSS:\t  1000 kB\n";
        assert_eq!(parse_kb_field(status, "VmHWM:"), Some(1234 * 1024));
        assert_eq!(parse_kb_field(status, "VmRSS:"), Some(1000 * 1024));
        assert_eq!(parse_kb_field(status, "VmSwap:"), None);
        assert_eq!(parse_kb_field("VmHWM: lots kB", "VmHWM:"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn peak_rss_is_at_least_current_and_grows_with_touched_pages() {
        // Both fields from one read of /proc/self/status: the kernel prints VmHWM as at least
        // the VmRSS of the same moment. Two reads are not comparable: between them other tests
        // in this process free pages (the high-water mark is not refreshed on every free) or
        // reset the peak.
        let status = std::fs::read_to_string("/proc/self/status").expect("status on Linux");
        let cur = parse_kb_field(&status, "VmRSS:").expect("VmRSS on Linux");
        let peak_then = parse_kb_field(&status, "VmHWM:").expect("VmHWM on Linux");
        assert!(cur > 0);
        assert!(
            peak_then >= cur,
            "peak {peak_then} < current {cur} of the same read"
        );
        let _ = reset_peak_rss();
        // Touch 32 MiB so the peak must include it; it stays resident until the read below,
        // so a reset by a concurrent test cannot take it out of the peak either.
        let block = std::hint::black_box(vec![1u8; 32 << 20]);
        let peak = peak_rss_bytes().expect("VmHWM on Linux");
        assert!(peak >= 32 << 20, "peak {peak}");
        drop(block);
    }
}
