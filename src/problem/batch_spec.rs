//! A ragged batch as serving runs it (Transformers Inference Optimization Toolset, "KV
//! Cache", "Chunked prefill"): sequences of different lengths in one call, each with its own
//! number of new query tokens and of keys attended. Written compactly in a config:
//!
//! ```text
//! spec   := group ("+" group)*
//! group  := [count "x"] "q" length ["kv" length]
//! length := digits ["k"]            (k = 1024)
//! ```
//!
//! `q` is the sequence's query tokens, `kv` the keys they attend (the cache and the new
//! tokens; the default is `q`, a prefill), bottom-right aligned when causal. For example
//! `2xq2k+32xq1kv1k` is 2 prefills of 2048 tokens and 32 decodes of one token over 1024
//! keys. Parsing is O(length of the spec); the canonical form (`Display`) writes lengths
//! in tokens, so a spec reads the same in ids and rows whatever the config wrote.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// Sequences of one length pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Group {
    pub count: usize,
    pub q: usize,
    pub kv: usize,
}

/// The sequences of a ragged batch, in order, grouped as the spec wrote them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BatchSpec {
    pub groups: Vec<Group>,
}

impl BatchSpec {
    /// `count` sequences of `q` queries over `kv` keys each: a batch of equal lengths
    /// written as a ragged one.
    pub fn uniform(count: usize, q: usize, kv: usize) -> BatchSpec {
        BatchSpec {
            groups: vec![Group { count, q, kv }],
        }
    }

    /// The packed shape of these sequences: batch 1, the totals as lengths.
    pub fn packed(&self, like: &super::Shape) -> super::Shape {
        super::Shape {
            batch: 1,
            seq_q: self.total_q(),
            seq_kv: self.total_kv(),
            ..*like
        }
    }

    /// (query tokens, keys) of every sequence, in order.
    pub fn sequences(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.groups
            .iter()
            .flat_map(|g| std::iter::repeat_n((g.q, g.kv), g.count))
    }

    pub fn len(&self) -> usize {
        self.groups.iter().map(|g| g.count).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Query tokens of all sequences (the packed length of Q and O).
    pub fn total_q(&self) -> usize {
        self.groups.iter().map(|g| g.count * g.q).sum()
    }

    /// Keys of all sequences (the packed length of K and V).
    pub fn total_kv(&self) -> usize {
        self.groups.iter().map(|g| g.count * g.kv).sum()
    }

    /// Cumulative offsets `[0, q_0, q_0 + q_1, ...]` of the sequences' query rows (and, with
    /// `keys`, of their keys) in the packed layout: `len() + 1` entries, as a varlen GPU
    /// kernel takes them (`cu_seqlens`).
    pub fn offsets(&self, keys: bool) -> Vec<usize> {
        let mut v = Vec::with_capacity(self.len() + 1);
        v.push(0);
        let mut at = 0;
        for (q, kv) in self.sequences() {
            at += if keys { kv } else { q };
            v.push(at);
        }
        v
    }
}

fn length(part: &str, text: &str, what: &str) -> Result<usize, String> {
    let (digits, mult) = match text.strip_suffix('k') {
        Some(d) => (d, 1024),
        None => (text, 1),
    };
    let n: usize = digits
        .parse()
        .ok()
        .filter(|_| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| {
            format!("`{part}`: {what} length `{text}` is not a number of tokens (digits, optionally followed by k = 1024)")
        })?;
    let n = n
        .checked_mul(mult)
        .ok_or_else(|| format!("`{part}`: {what} length `{text}` is too large"))?;
    if n == 0 {
        return Err(format!("`{part}`: a sequence of {what} length 0"));
    }
    Ok(n)
}

fn group(part: &str) -> Result<Group, String> {
    let form = "expected [COUNTx]qLEN[kvLEN], e.g. 32xq1kv1k";
    let (count, rest) = match part.split_once('x') {
        Some((c, rest)) => {
            let n: usize = c
                .parse()
                .map_err(|_| format!("`{part}`: count `{c}` is not a whole number ({form})"))?;
            if n == 0 {
                return Err(format!("`{part}`: a group of 0 sequences"));
            }
            (n, rest)
        }
        None => (1, part),
    };
    let rest = rest
        .strip_prefix('q')
        .ok_or_else(|| format!("`{part}`: no query length ({form})"))?;
    let (q, kv) = match rest.split_once("kv") {
        Some((q, kv)) => (length(part, q, "query")?, length(part, kv, "key")?),
        None => {
            let q = length(part, rest, "query")?;
            (q, q)
        }
    };
    if q > kv {
        return Err(format!(
            "`{part}`: {q} query tokens attend only {kv} keys (a sequence's keys include its new tokens: kv >= q)"
        ));
    }
    Ok(Group { count, q, kv })
}

impl FromStr for BatchSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.is_empty() {
            return Err("an empty batch_spec (expected groups such as 2xq2k+32xq1kv1k)".into());
        }
        let groups = s
            .split('+')
            .map(|p| group(p.trim()))
            .collect::<Result<Vec<_>, _>>()?;
        check_totals(&groups)?;
        Ok(BatchSpec { groups })
    }
}

/// Most sequences in one spec: the kernels keep per-sequence offsets (`offsets`), so a
/// count such as 1e18 would wrap the totals or fail to allocate instead of being refused.
pub const MAX_SEQUENCES: usize = 1 << 24;

/// The totals (`len`, `total_q`, `total_kv`) must fit a usize, and the sequences
/// `MAX_SEQUENCES`: checked once here, so the unchecked sums above never wrap.
fn check_totals(groups: &[Group]) -> Result<(), String> {
    let sum = |f: fn(&Group) -> Option<usize>| {
        groups
            .iter()
            .try_fold(0usize, |a, g| f(g).and_then(|x| a.checked_add(x)))
    };
    let seqs = sum(|g| Some(g.count));
    if seqs.is_none_or(|n| n > MAX_SEQUENCES) {
        return Err(format!("more than {MAX_SEQUENCES} sequences in one batch"));
    }
    if sum(|g| g.count.checked_mul(g.q)).is_none() || sum(|g| g.count.checked_mul(g.kv)).is_none() {
        return Err("the total query or key tokens overflow a 64-bit count".into());
    }
    Ok(())
}

impl fmt::Display for BatchSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, g) in self.groups.iter().enumerate() {
            if i > 0 {
                f.write_str("+")?;
            }
            if g.count != 1 {
                write!(f, "{}x", g.count)?;
            }
            write!(f, "q{}", g.q)?;
            if g.kv != g.q {
                write!(f, "kv{}", g.kv)?;
            }
        }
        Ok(())
    }
}

impl Serialize for BatchSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for BatchSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_to_their_sequences_and_print_canonically() {
        let s: BatchSpec = "2xq2k+32xq1kv1k".parse().unwrap();
        assert_eq!(s.len(), 34);
        assert_eq!(s.total_q(), 2 * 2048 + 32);
        assert_eq!(s.total_kv(), 2 * 2048 + 32 * 1024);
        assert_eq!(s.to_string(), "2xq2048+32xq1kv1024");
        assert_eq!(s.to_string().parse::<BatchSpec>().unwrap(), s);
        let seqs: Vec<_> = s.sequences().collect();
        assert_eq!(seqs[1], (2048, 2048));
        assert_eq!(seqs[2], (1, 1024));
        assert_eq!(s.offsets(false)[..4], [0, 2048, 4096, 4097]);
        assert_eq!(*s.offsets(true).last().unwrap(), s.total_kv());
        assert_eq!("q5".parse::<BatchSpec>().unwrap().to_string(), "q5");
    }

    #[test]
    fn bad_specs_name_the_offending_part() {
        for (spec, want) in [
            ("", "empty"),
            ("2xq2k+", "``"),
            ("0xq5", "`0xq5`: a group of 0 sequences"),
            ("2xq0", "`2xq0`: a sequence of query length 0"),
            ("q4kv0", "`q4kv0`: a sequence of key length 0"),
            ("q8kv4", "`q8kv4`: 8 query tokens attend only 4 keys"),
            ("3q5", "`3q5`: no query length"),
            ("axq5", "`axq5`: count `a`"),
            ("q2m", "`q2m`: query length `2m`"),
            ("q-1", "`q-1`: query length `-1`"),
            ("q99999999999999999k", "too large"),
            ("16777217xq1", "more than 16777216 sequences"),
            ("9223372036854775807xq1+9223372036854775807xq1", "more than"),
            ("3xq9223372036854775807", "overflow"),
        ] {
            let e = spec.parse::<BatchSpec>().unwrap_err();
            assert!(e.contains(want), "{spec}: {e}");
        }
    }
}
