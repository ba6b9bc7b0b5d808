//! The report's summary: each variant against a reference variant at the largest sequence
//! length both ran (in decode, the KV cache length): speed as the reference's time over the
//! variant's, memory as the variant's overhead over the reference's, each a geometric mean
//! over the problems at that length with its range. A variant that ran several settings of
//! one problem (chunks, splits, pages) counts with its fastest. Problems are matched by
//! `derived::Problem` (the case without the variant's own settings), the rule of the
//! derived tables. Shown first in tables.md, printed after `report` and `sweep`, and in
//! `sweep --json`. Cost: O(rows log rows).

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Serialize;

use super::derived::{problem, Problem};
use crate::results::record::{Record, Status};

/// The variant a summary compares with when neither `report --reference` nor `[report]
/// reference` names one, if it has timed rows: the papers' standard attention.
pub const DEFAULT_REFERENCE: &str = "naive";

/// A ratio over several problems: the geometric mean and the range.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Ratio {
    pub geomean: f64,
    pub min: f64,
    pub max: f64,
}

impl Ratio {
    /// None for no values or any value that is not positive and finite.
    fn of(values: &[f64]) -> Option<Ratio> {
        if values.is_empty() || values.iter().any(|v| !(v.is_finite() && *v > 0.0)) {
            return None;
        }
        let mean_log = values.iter().map(|v| v.ln()).sum::<f64>() / values.len() as f64;
        Some(Ratio {
            geomean: mean_log.exp(),
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(0.0, f64::max),
        })
    }
}

/// One variant against the reference.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Line {
    pub variant: String,
    /// The sequence length compared at (`seq_q`; in decode, `seq_kv`).
    pub at: usize,
    /// Whether `at` is a KV cache length (decode rows).
    pub cache_length: bool,
    /// How many problems both ran at that length.
    pub problems: usize,
    /// Reference time / variant time: above 1, the variant is faster.
    pub speed: Ratio,
    /// Variant overhead / reference overhead; None where either measured no overhead.
    pub memory: Option<Ratio>,
    /// Where the reference ran out of memory and the variant went further: (the
    /// reference's first `oom` length, the variant's longest run).
    pub reach: Option<(usize, usize)>,
}

/// How the reference was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Chosen {
    /// `report --reference`.
    Flag,
    /// `[report] reference` of the run's config.
    Config,
    /// `naive`, the default.
    Default,
    /// The first variant with timed rows (no `naive` among them).
    First,
}

/// The summary of a results directory's rows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub reference: String,
    pub chosen: Chosen,
    /// One per other variant with a problem in common with the reference, in row order.
    pub lines: Vec<Line>,
    /// Variants with timed rows but no problem in common with the reference.
    pub unmatched: Vec<String>,
}

/// A row's sequence length as the summary compares it: the cache length for decode rows.
fn length(r: &Record) -> usize {
    if r.mode == "decode" {
        r.seq_kv
    } else {
        r.seq_q
    }
}

fn timed(r: &Record) -> Option<f64> {
    r.time_median_s
        .filter(|t| r.status == Status::Ok && t.is_finite() && *t > 0.0)
}

/// The variants with timed rows, in row order.
fn timed_variants(records: &[Record]) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for r in records.iter().filter(|r| timed(r).is_some()) {
        if !out.contains(&r.variant.as_str()) {
            out.push(&r.variant);
        }
    }
    out
}

/// The reference: `flag`, else `config`, else `naive` if it has timed rows, else the first
/// variant with timed rows; None when nothing was timed. A named reference without timed
/// rows is an error naming where it came from.
pub fn choose(
    records: &[Record],
    flag: Option<&str>,
    config: Option<&str>,
) -> Result<Option<(String, Chosen)>, String> {
    let variants = timed_variants(records);
    for (name, chosen, place) in [
        (flag, Chosen::Flag, "--reference"),
        (config, Chosen::Config, "[report] reference"),
    ] {
        if let Some(name) = name {
            if variants.contains(&name) {
                return Ok(Some((name.to_string(), chosen)));
            }
            return Err(format!(
                "{place}: `{name}` has no timed rows here (variants with timed rows: {})",
                if variants.is_empty() {
                    "none".to_string()
                } else {
                    variants.join(", ")
                }
            ));
        }
    }
    if variants.contains(&DEFAULT_REFERENCE) {
        return Ok(Some((DEFAULT_REFERENCE.to_string(), Chosen::Default)));
    }
    Ok(variants.first().map(|v| (v.to_string(), Chosen::First)))
}

/// Per problem, the fastest timed row of `variant` (its best setting).
fn fastest<'r>(records: &'r [Record], variant: &str) -> BTreeMap<Problem<'r>, &'r Record> {
    let mut best: BTreeMap<Problem, &Record> = BTreeMap::new();
    for r in records.iter().filter(|r| r.variant == variant) {
        let Some(t) = timed(r) else { continue };
        let slot = best.entry(problem(r)).or_insert(r);
        if timed(slot).is_none_or(|b| t < b) {
            *slot = r;
        }
    }
    best
}

/// The summary of `records` against `reference`.
pub fn summarize(records: &[Record], reference: &str, chosen: Chosen) -> Summary {
    let base = fastest(records, reference);
    // The reference's first out-of-memory length, where it has one.
    let ref_oom = records
        .iter()
        .filter(|r| r.variant == reference && r.status == Status::Oom)
        .map(length)
        .min();
    let mut lines = Vec::new();
    let mut unmatched = Vec::new();
    for variant in timed_variants(records) {
        if variant == reference {
            continue;
        }
        let mine = fastest(records, variant);
        let common: Vec<(&Record, &Record)> = mine
            .iter()
            .filter_map(|(p, r)| base.get(p).map(|b| (*b, *r)))
            .collect();
        let Some(at) = common.iter().map(|(_, r)| length(r)).max() else {
            unmatched.push(variant.to_string());
            continue;
        };
        let at_n: Vec<&(&Record, &Record)> =
            common.iter().filter(|(_, r)| length(r) == at).collect();
        let speeds: Vec<f64> = at_n
            .iter()
            .filter_map(|(b, r)| Some(timed(b)? / timed(r)?))
            .collect();
        let memories: Vec<f64> = at_n
            .iter()
            .filter_map(|(b, r)| {
                let (b, r) = (b.mem_overhead_bytes?, r.mem_overhead_bytes?);
                (b > 0 && r > 0).then(|| r as f64 / b as f64)
            })
            .collect();
        let Some(speed) = Ratio::of(&speeds) else {
            unmatched.push(variant.to_string());
            continue;
        };
        let memory = (memories.len() == at_n.len())
            .then(|| Ratio::of(&memories))
            .flatten();
        let longest = mine.values().map(|r| length(r)).max().unwrap_or(at);
        let reach = ref_oom
            .filter(|&oom| longest >= oom)
            .map(|oom| (oom, longest));
        lines.push(Line {
            variant: variant.to_string(),
            at,
            cache_length: at_n.iter().all(|(_, r)| r.mode == "decode"),
            problems: at_n.len(),
            speed,
            memory,
            reach,
        });
    }
    Summary {
        reference: reference.to_string(),
        chosen,
        lines,
        unmatched,
    }
}

/// A ratio of times: "1.63x".
fn times(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}x")
    } else {
        format!("{x:.2}x")
    }
}

/// A memory ratio: "1/56" below one half, else "0.83x" / "2.10x".
fn memory_ratio(x: f64) -> String {
    if x < 0.5 {
        format!("1/{:.0}", 1.0 / x)
    } else {
        times(x)
    }
}

fn range(r: &Ratio, f: fn(f64) -> String) -> String {
    format!("{} to {}", f(r.min), f(r.max))
}

impl Line {
    /// "at n = 16384" or "at cache length 4096".
    fn place(&self) -> String {
        if self.cache_length {
            format!("cache length {}", self.at)
        } else {
            format!("n = {}", self.at)
        }
    }

    /// One sentence: "rabe-staats: 1.63x the speed of naive at n = 16384 (2 problems: 1.58x
    /// to 1.68x), 1/56 of its memory overhead; naive oom from n = 65536, rabe-staats ran to
    /// n = 1048576".
    pub fn sentence(&self, reference: &str) -> String {
        let mut s = format!(
            "{}: {} the speed of {reference} at {}",
            self.variant,
            times(self.speed.geomean),
            self.place()
        );
        if self.problems > 1 {
            let _ = write!(
                s,
                " ({} problems: {})",
                self.problems,
                range(&self.speed, times)
            );
        }
        if let Some(m) = &self.memory {
            let _ = write!(s, ", {} of its memory overhead", memory_ratio(m.geomean));
        }
        if let Some((oom, longest)) = self.reach {
            let _ = write!(
                s,
                "; {reference} oom from {} {oom}, {} ran to {longest}",
                if self.cache_length {
                    "cache length"
                } else {
                    "n ="
                },
                self.variant
            );
        }
        s
    }
}

impl Summary {
    /// Where the reference came from, in words.
    fn chosen_text(&self) -> &'static str {
        match self.chosen {
            Chosen::Flag => "named by --reference",
            Chosen::Config => "named by [report] reference",
            Chosen::Default => "the default; --reference or [report] reference name another",
            Chosen::First => "the first variant with timed rows, as naive has none; --reference or [report] reference name another",
        }
    }

    /// The terminal's lines: a heading and one sentence per variant.
    pub fn text(&self) -> String {
        let mut s = format!(
            "summary against {} ({}):\n",
            self.reference,
            self.chosen_text()
        );
        for l in &self.lines {
            let _ = writeln!(s, "  {}", l.sentence(&self.reference));
        }
        if !self.unmatched.is_empty() {
            let _ = writeln!(
                s,
                "  no problem in common with {}: {}",
                self.reference,
                self.unmatched.join(", ")
            );
        }
        s
    }

    /// The `## Summary` section of tables.md.
    pub fn markdown(&self) -> String {
        let mut md = String::from("## Summary\n\n");
        let _ = writeln!(
            md,
            "Each variant against **{}** ({}) at the largest sequence length both ran (decode: the KV cache length). Speed: {}'s median time over the variant's; memory: the variant's overhead over {}'s. Geometric means over the problems at that length, with their range; a variant that ran several settings of a problem counts with its fastest.\n",
            self.reference,
            self.chosen_text(),
            self.reference,
            self.reference
        );
        if self.lines.is_empty() {
            let _ = writeln!(
                md,
                "No other variant ran a problem {} ran.\n",
                self.reference
            );
        } else {
            let _ = writeln!(
                md,
                "| variant | at | problems | speed vs {r} | range | memory overhead vs {r} | range |\n|---|---|---|---|---|---|---|",
                r = self.reference
            );
            for l in &self.lines {
                let (m, mr) = l.memory.as_ref().map_or(("-".into(), "-".into()), |m| {
                    (memory_ratio(m.geomean), range(m, memory_ratio))
                });
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {m} | {mr} |",
                    l.variant,
                    l.place(),
                    l.problems,
                    times(l.speed.geomean),
                    range(&l.speed, times),
                );
            }
            md.push('\n');
            for l in &self.lines {
                let _ = writeln!(md, "- {}", l.sentence(&self.reference));
            }
            md.push('\n');
        }
        if !self.unmatched.is_empty() {
            let _ = writeln!(
                md,
                "No problem in common with {}: {}.\n",
                self.reference,
                self.unmatched.join(", ")
            );
        }
        md
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(variant: &str, n: usize, time: Option<f64>, mem: u64, status: Status) -> Record {
        let mut r = Record {
            run: "t".into(),
            variant: variant.into(),
            device: "cpu".into(),
            dtype: "f32".into(),
            mode: "fwd".into(),
            batch: 1,
            heads: 1,
            kv_heads: 1,
            seq_q: n,
            seq_kv: n,
            head_dim: 64,
            threads: 1,
            devices: 1,
            status,
            time_median_s: time,
            mem_overhead_bytes: Some(mem),
            input_dist: "normal".into(),
            input_scale: 1.0,
            ..Record::default()
        };
        r.case_id = format!("{variant}|{n}");
        r
    }

    fn ok(variant: &str, n: usize, t: f64, mem: u64) -> Record {
        row(variant, n, Some(t), mem, Status::Ok)
    }

    #[test]
    fn compares_at_the_largest_common_length_with_geometric_means() {
        let mut causal = ok("naive", 1024, 8.0, 4000);
        causal.causal = true;
        let mut flash_causal = ok("flash", 1024, 2.0, 40);
        flash_causal.causal = true;
        let rows = vec![
            ok("naive", 256, 1.0, 1000),
            ok("flash", 256, 1.0, 10),
            ok("naive", 1024, 4.0, 4000),
            ok("flash", 1024, 1.0, 100),
            causal,
            flash_causal,
            // flash alone at 4096: not a common length.
            ok("flash", 4096, 3.0, 100),
        ];
        let s = summarize(&rows, "naive", Chosen::Default);
        assert_eq!(s.lines.len(), 1);
        let l = &s.lines[0];
        assert_eq!((l.at, l.problems, l.cache_length), (1024, 2, false));
        // Speeds 4 and 4: geomean 4; memory 100/4000 and 40/4000.
        assert!((l.speed.geomean - 4.0).abs() < 1e-12);
        let m = l.memory.unwrap();
        assert!((m.geomean - (0.025f64 * 0.01).sqrt()).abs() < 1e-12);
        assert_eq!((m.min, m.max), (0.01, 0.025));
        assert_eq!(
            l.sentence("naive"),
            "flash: 4.00x the speed of naive at n = 1024 (2 problems: 4.00x to 4.00x), 1/63 of its memory overhead"
        );
        assert!(s.markdown().contains("| flash | n = 1024 | 2 | 4.00x |"));
    }

    #[test]
    fn the_fastest_setting_counts_and_reach_past_an_oom_is_noted() {
        let mut slow = ok("rabe-staats", 1024, 4.0, 10);
        slow.kv_chunk = Some(16);
        slow.case_id.push_str("|kc16");
        let mut fast = ok("rabe-staats", 1024, 2.0, 20);
        fast.kv_chunk = Some(64);
        let rows = vec![
            ok("naive", 1024, 3.0, 1000),
            row("naive", 4096, None, 0, Status::Oom),
            slow,
            fast,
            ok("rabe-staats", 8192, 9.0, 40),
        ];
        let s = summarize(&rows, "naive", Chosen::Default);
        let l = &s.lines[0];
        assert!((l.speed.geomean - 1.5).abs() < 1e-12, "{:?}", l.speed);
        assert!((l.memory.unwrap().geomean - 0.02).abs() < 1e-12);
        assert_eq!(l.reach, Some((4096, 8192)));
        assert!(l
            .sentence("naive")
            .ends_with("; naive oom from n = 4096, rabe-staats ran to 8192"));
    }

    #[test]
    fn decode_rows_compare_at_the_cache_length() {
        let mut a = ok("decode-naive", 1, 2.0, 100);
        a.mode = "decode".into();
        a.seq_kv = 4096;
        let mut b = ok("flash-decoding", 1, 1.0, 50);
        b.mode = "decode".into();
        b.seq_kv = 4096;
        let s = summarize(&[a, b], "decode-naive", Chosen::Flag);
        let l = &s.lines[0];
        assert_eq!((l.at, l.cache_length), (4096, true));
        assert!(l.sentence("decode-naive").contains("at cache length 4096"));
    }

    #[test]
    fn the_reference_is_the_flag_then_the_config_then_naive_then_the_first() {
        let rows = vec![ok("flash", 64, 1.0, 1), ok("naive", 64, 2.0, 2)];
        let pick = |f, c| choose(&rows, f, c).unwrap().unwrap();
        assert_eq!(
            pick(Some("flash"), Some("naive")),
            ("flash".into(), Chosen::Flag)
        );
        assert_eq!(pick(None, Some("flash")), ("flash".into(), Chosen::Config));
        assert_eq!(pick(None, None), ("naive".into(), Chosen::Default));
        let only = vec![ok("flash", 64, 1.0, 1)];
        assert_eq!(
            choose(&only, None, None).unwrap(),
            Some(("flash".into(), Chosen::First))
        );
        let e = choose(&rows, Some("ring-decode"), None).unwrap_err();
        assert!(
            e.contains("--reference") && e.contains("flash, naive"),
            "{e}"
        );
        assert_eq!(choose(&[], None, None).unwrap(), None);
    }

    #[test]
    fn a_variant_with_no_common_problem_is_listed_not_compared() {
        let mut other = ok("flash", 64, 1.0, 1);
        other.dtype = "bf16".into();
        let s = summarize(&[ok("naive", 64, 2.0, 2), other], "naive", Chosen::Default);
        assert!(s.lines.is_empty());
        assert_eq!(s.unmatched, ["flash"]);
        assert!(s.text().contains("no problem in common with naive: flash"));
    }
}
