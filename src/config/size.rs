//! `ByteSize`: a byte count written with units ("8GiB", "512MB", "1.5GiB") or as a plain
//! integer, shown back as the largest unit that divides it exactly so it round-trips.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// A number of bytes (e.g. the `memory_budget`). Decimal units are powers of 1000, binary
/// units (`KiB`, ...) powers of 1024; unit names are case-insensitive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

/// Largest first, so `Display` picks the shortest exact spelling.
const UNITS: [(&str, u64); 9] = [
    ("TiB", TIB),
    ("TB", 1_000_000_000_000),
    ("GiB", GIB),
    ("GB", 1_000_000_000),
    ("MiB", MIB),
    ("MB", 1_000_000),
    ("KiB", KIB),
    ("KB", 1_000),
    ("B", 1),
];

const EXPECTED: &str =
    "expected a byte count such as \"8GiB\", \"512MB\", \"1.5GiB\" or an integer number of bytes \
     (units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)";

impl ByteSize {
    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("bad byte size `{s}`: {EXPECTED}");
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
            .unwrap_or(t.len());
        let (number, unit) = (t[..split].replace('_', ""), t[split..].trim());
        if number.is_empty() {
            return Err(bad());
        }
        let mult = if unit.is_empty() {
            1
        } else {
            UNITS
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(unit))
                .map(|&(_, m)| m)
                .ok_or_else(bad)?
        };
        // Integers stay in integer arithmetic so large exact sizes do not round.
        if let Ok(n) = number.parse::<u64>() {
            return n.checked_mul(mult).map(ByteSize).ok_or_else(bad);
        }
        let x: f64 = number.parse().map_err(|_| bad())?;
        let bytes = (x * mult as f64).round();
        if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
            return Err(bad());
        }
        Ok(ByteSize(bytes as u64))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, mult) = UNITS
            .iter()
            .find(|&&(_, m)| self.0 != 0 && self.0.is_multiple_of(m))
            .copied()
            .unwrap_or(("B", 1));
        write!(f, "{}{name}", self.0 / mult)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(EXPECTED)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ByteSize, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("negative byte size {v}: {EXPECTED}")))
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> u64 {
        s.parse::<ByteSize>()
            .map(|b| b.0)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn parses_binary_and_decimal_units() {
        assert_eq!(parse("8GiB"), 8 << 30);
        assert_eq!(parse("512MB"), 512_000_000);
        assert_eq!(parse("4 KiB"), 4096);
        assert_eq!(parse("2kb"), 2000);
        assert_eq!(parse("1TiB"), 1 << 40);
        assert_eq!(parse("7B"), 7);
    }

    #[test]
    fn parses_fractions_and_plain_integers() {
        assert_eq!(parse("1.5GiB"), 3 << 29);
        assert_eq!(parse("0.5KB"), 500);
        assert_eq!(parse("123"), 123);
        assert_eq!(parse("1_000"), 1000);
    }

    #[test]
    fn rejects_bad_sizes() {
        for s in [
            "",
            "GiB",
            "8 GiBs",
            "-1GB",
            "1.2.3MB",
            "8XB",
            "99999999999TiB",
        ] {
            let e = s.parse::<ByteSize>().expect_err(s);
            assert!(e.contains("expected a byte count"), "{e}");
        }
    }

    #[test]
    fn display_round_trips() {
        for b in [
            0,
            1,
            999,
            1000,
            1024,
            1536 << 20,
            8 << 30,
            512_000_000,
            1_024_000,
            12345,
        ] {
            let shown = ByteSize(b).to_string();
            assert_eq!(parse(&shown), b, "{shown}");
        }
        assert_eq!(ByteSize(8 << 30).to_string(), "8GiB");
        assert_eq!(ByteSize(512_000_000).to_string(), "512MB");
        assert_eq!(ByteSize(1536 << 20).to_string(), "1536MiB");
        assert_eq!(ByteSize(12345).to_string(), "12345B");
    }

    #[test]
    fn serde_takes_string_or_integer_and_writes_string() {
        #[derive(Deserialize)]
        struct T {
            a: ByteSize,
            b: ByteSize,
        }
        let t: T = toml::from_str("a = \"2MiB\"\nb = 4096").unwrap();
        assert_eq!((t.a.0, t.b.0), (2 << 20, 4096));
        assert!(toml::from_str::<T>("a = -3\nb = 1").is_err());
        assert_eq!(
            serde_json::to_string(&ByteSize(8 << 30)).unwrap(),
            "\"8GiB\""
        );
    }
}
