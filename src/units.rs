//! Number formatting for every table, label and message: bytes in binary units, seconds
//! with a unit, errors in scientific notation. Most keep about three significant digits so
//! columns stay readable; the `_2dp`/`_3dp` forms are the fixed-decimal ones of the run
//! summaries and messages. Each is O(1).

/// Bytes with binary units to 3 significant digits: "160 KiB", "2.50 MiB", "1.00 GiB".
pub fn bytes(b: f64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        return format!("{b:.0} B");
    }
    format!("{} {}", sig3(v), UNITS[u])
}

/// Seconds with a unit to 3 significant digits: "150 µs", "1.80 ms", "95.2 s".
pub fn seconds(s: f64) -> String {
    if s <= 0.0 || !s.is_finite() {
        return format!("{s} s");
    }
    let (v, unit) = if s < 1e-6 {
        (s * 1e9, "ns")
    } else if s < 1e-3 {
        (s * 1e6, "µs")
    } else if s < 1.0 {
        (s * 1e3, "ms")
    } else {
        (s, "s")
    };
    format!("{} {unit}", sig3(v))
}

/// A value in [1, 1000) to 3 significant digits (more integer digits are kept).
fn sig3(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Scientific notation with 2 significant digits: "1.5e-7", "5.0e0" (Rust writes the
/// exponent without padding, so nothing is stripped: stripping "e0" once printed "5.0e").
pub fn sci(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    format!("{x:.1e}")
}

/// A relative difference as a signed percentage: "+2%", "-8%".
pub fn percent(f: f64) -> String {
    format!("{:+.0}%", f * 100.0)
}

/// `n` as a power of two when it is one ("2^14"), else the number.
pub fn pow2(n: usize) -> String {
    if n.is_power_of_two() {
        format!("2^{}", n.trailing_zeros())
    } else {
        n.to_string()
    }
}

/// Bytes as a short human string with binary units ("1.50 GiB").
pub fn bytes_2dp(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// Seconds with a unit that keeps 3 significant digits readable.
pub fn seconds_3dp(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.3} ms", s * 1e3)
    } else {
        format!("{:.1} us", s * 1e6)
    }
}

/// 2^e bytes as "256 KiB", "32 MiB", "1 GiB".
pub fn pow2_bytes(e: i32) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if e < 0 {
        return format!("2^{e} B");
    }
    let u = ((e / 10) as usize).min(UNITS.len() - 1);
    format!("{} {}", 1u64 << (e - 10 * u as i32), UNITS[u])
}

/// 10^e seconds as "1 µs", "100 ms", "10 s".
pub fn decade_seconds(e: i32) -> String {
    let (unit, base) = match e {
        -9..=-7 => ("ns", -9),
        -6..=-4 => ("µs", -6),
        -3..=-1 => ("ms", -3),
        0..=3 => ("s", 0),
        _ => return format!("1e{e} s"),
    };
    format!("{} {unit}", 10u64.pow((e - base) as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_digits() {
        assert_eq!(bytes(163840.0), "160 KiB");
        assert_eq!(bytes(2.5 * 1048576.0), "2.50 MiB");
        assert_eq!(bytes(17.94 * 1048576.0), "17.9 MiB");
        assert_eq!(bytes(1073741824.0), "1.00 GiB");
        assert_eq!(bytes(512.0), "512 B");
        assert_eq!(seconds(0.15e-3), "150 µs");
        assert_eq!(seconds(0.0018), "1.80 ms");
        assert_eq!(seconds(95.2), "95.2 s");
        assert_eq!(seconds(1234.0), "1234 s");
        assert_eq!(sci(1.5e-7), "1.5e-7");
        assert_eq!(sci(6.54e-7), "6.5e-7");
        assert_eq!(sci(2.0e12), "2.0e12");
        assert_eq!(sci(5.0), "5.0e0");
        assert_eq!(sci(-3.25), "-3.2e0");
        assert_eq!(sci(1.0e-10), "1.0e-10");
        assert_eq!(percent(0.02), "+2%");
        assert_eq!(percent(-0.081), "-8%");
        assert_eq!((pow2(16384), pow2(1000)), ("2^14".into(), "1000".into()));
    }
}
