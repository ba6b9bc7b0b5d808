//! Output of `compare`: a Markdown summary for people (worst case first, with the figures
//! and the interval, then unmatched cases and what to do about unclear verdicts) and JSON
//! for machines. O(cases) time and output.

use std::fmt::Write;

use super::accuracy::{ErrVerdict, StatusChange};
use super::memory::MemVerdict;
use super::normalize::Normalize;
use super::time::TimeVerdict;
use super::{CaseComparison, Comparison, RunInfo};
use crate::error::{Error, Result};
use crate::units;

/// The comparison as pretty-printed JSON.
pub fn json(c: &Comparison) -> Result<String> {
    serde_json::to_string_pretty(c)
        .map_err(|e| Error::Runtime(format!("serializing the comparison: {e}")))
}

/// The comparison as Markdown.
pub fn markdown(c: &Comparison) -> String {
    let mut s = String::new();
    let o = &c.options;
    let up = 1.0 + o.time_threshold;
    let _ = writeln!(s, "# attnbench compare\n");
    let _ = writeln!(s, "- baseline: {}", run_line(&c.baseline));
    let _ = writeln!(s, "- current: {}", run_line(&c.current));
    let _ = writeln!(
        s,
        "- time: ratio of median times current/baseline with its {:.0}% bootstrap interval \
         ({} resamples, seed {}); slower when the interval is above {:.3}, faster when below \
         {:.3}; normalization: {} ({}){}",
        c.confidence * 100.0,
        o.bootstrap,
        o.seed,
        up,
        1.0 / up,
        match c.normalize.mode {
            Normalize::None => "none, raw seconds",
            Normalize::Calibration => "times divided by each run's SGEMM seconds per GFLOP",
            Normalize::Probe => {
                "times divided by each case's machine-speed probe seconds per GFLOP (probe_gflops)"
            }
        },
        c.normalize.why,
        if o.time_gate {
            ""
        } else {
            "; **time not gated** (--no-time-gate): shown only, no time verdict fails"
        }
    );
    let _ = writeln!(
        s,
        "- memory: a regression when the overhead grows by more than {} + {} allowance \
         (+ one GEMM packing buffer per extra thread)",
        units::bytes_2dp(o.mem_threshold_bytes),
        units::bytes_2dp(c.mem_allowance_bytes)
    );
    if c.counts.memory_incomparable > 0 {
        let _ = writeln!(
            s,
            "- memory of {} CPU case(s) differs but is not judged: the runs used different CPU \
             kernel paths ({} → {}), whose workspaces differ by design; gate memory against a \
             baseline measured on the same path (scripts/update-baseline.sh)",
            c.counts.memory_incomparable,
            c.baseline.cpu_kernel_path.as_deref().unwrap_or("?"),
            c.current.cpu_kernel_path.as_deref().unwrap_or("?")
        );
    }
    let _ = writeln!(
        s,
        "- error: a regression when max_abs_err grows more than {}x and above the dtype's \
         tolerance, or a case that was ok is not\n",
        o.err_factor
    );
    let n = &c.counts;
    let _ = writeln!(
        s,
        "**Verdict: {}** (exit {}): {} matched; {} regressed ({} slower, {} memory, {} error, \
         {} status); {} unclear; {} faster, {} same time; {} missing from current, {} new.\n",
        c.verdict.to_uppercase(),
        c.exit_code,
        n.matched,
        n.regressed,
        n.slower,
        n.memory_regressions,
        n.error_regressions,
        n.status_regressions,
        n.unclear,
        n.faster,
        n.same_time,
        n.missing,
        n.new
    );
    if n.matched > 0 && n.measured_both == 0 {
        let _ = writeln!(
            s,
            "Note: none of the {} matched cases ran on both sides (skipped, oom or error), so \
             no time, memory or error was judged.\n",
            n.matched
        );
    }
    if !c.cases.is_empty() {
        let _ = writeln!(
            s,
            "| case | verdict | time ratio [{:.0}% CI] | median baseline → current | memory Δ | max_abs_err baseline → current | status |",
            c.confidence * 100.0
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|");
        for case in &c.cases {
            let _ = writeln!(s, "{}", row(case));
        }
        s.push('\n');
    }
    if !c.only_in_baseline.is_empty() {
        let _ = writeln!(
            s,
            "## Missing from current ({}): each is a regression\n",
            c.only_in_baseline.len()
        );
        for id in &c.only_in_baseline {
            let _ = writeln!(s, "- `{id}`");
        }
        s.push('\n');
    }
    if !c.only_in_current.is_empty() {
        let _ = writeln!(
            s,
            "## New in current ({}): no baseline, not judged\n",
            c.only_in_current.len()
        );
        for id in &c.only_in_current {
            let _ = writeln!(s, "- `{id}`");
        }
        s.push('\n');
    }
    if let Some((head, rest)) = c.advice.split_first() {
        let _ = writeln!(s, "## Unclear verdicts\n\n{head}\n");
        for a in rest {
            let _ = writeln!(s, "- {a}");
        }
        s.push('\n');
    }
    s
}

fn run_line(r: &RunInfo) -> String {
    let mut s = format!("`{}`: {} cases", r.path, r.cases);
    if let Some(rev) = &r.git_revision {
        let short: String = rev.chars().take(10).collect();
        let dirty = if r.git_dirty == Some(true) {
            " (dirty)"
        } else {
            ""
        };
        let _ = write!(s, ", git {short}{dirty}");
    }
    if let Some(cpu) = &r.cpu_model {
        let _ = write!(s, ", {cpu}");
    }
    if let Some(id) = &r.cpu_id {
        let _ = write!(s, " [{id}]");
    }
    if let Some(path) = &r.cpu_kernel_path {
        let _ = write!(s, ", kernels {path}");
    }
    if let Some(n) = r.logical_cpus {
        let _ = write!(s, " ({n} logical CPUs)");
    }
    if !r.has_samples {
        s += ", no samples.csv";
    }
    s
}

fn row(c: &CaseComparison) -> String {
    let mut verdicts: Vec<String> = Vec::new();
    if c.status == StatusChange::Lost {
        verdicts.push(format!("**{} → {}**", c.baseline_status, c.current_status));
    }
    if let Some(e) = c.error.filter(|e| e.verdict == ErrVerdict::Worse) {
        verdicts.push(format!("**error** (tolerance {:.1e})", e.tolerance));
    }
    if let Some(m) = c.memory.filter(|m| m.verdict == MemVerdict::Higher) {
        verdicts.push(format!(
            "**memory** (+{} > {})",
            units::bytes_2dp(m.delta_bytes.unsigned_abs()),
            units::bytes_2dp(m.tolerated_bytes)
        ));
    }
    for figure in &c.unrecorded {
        verdicts.push(format!("**{figure} not recorded**"));
    }
    match c.time.as_ref().map(|t| t.verdict) {
        Some(TimeVerdict::Slower) => verdicts.push("**slower**".into()),
        Some(v) => verdicts.push(v.name().into()),
        None => {}
    }
    if c.status == StatusChange::Fixed {
        verdicts.push(format!("fixed ({} → ok)", c.baseline_status));
    }
    if c.memory.is_some_and(|m| m.verdict == MemVerdict::Lower) {
        verdicts.push("less memory".into());
    }
    if c.memory
        .is_some_and(|m| m.verdict == MemVerdict::Incomparable)
    {
        verdicts.push("memory not judged (other kernel path)".into());
    }
    if c.error.is_some_and(|e| e.verdict == ErrVerdict::Better) {
        verdicts.push("more accurate".into());
    }
    if verdicts.is_empty() {
        verdicts.push("not compared".into());
    }

    let (ratio, medians) = match &c.time {
        Some(t) => {
            let ratio = match (t.interval, &t.note) {
                (Some(iv), _) => {
                    let k = t.factor.map_or(String::new(), |k| format!(" (×{k:.3})"));
                    format!("{:.3} [{:.3}, {:.3}]{k}", iv.ratio, iv.lo, iv.hi)
                }
                (None, Some(note)) => note.clone(),
                (None, None) => "-".into(),
            };
            let medians = format!(
                "{} → {} ({} → {} reps)",
                t.baseline_median_s.map_or("-".into(), units::seconds_3dp),
                t.current_median_s.map_or("-".into(), units::seconds_3dp),
                t.baseline_reps,
                t.current_reps
            );
            (ratio, medians)
        }
        None => ("-".into(), "-".into()),
    };
    let memory = c.memory.map_or("-".into(), |m| {
        let sign = if m.delta_bytes < 0 { "-" } else { "+" };
        format!(
            "{sign}{} ({})",
            units::bytes_2dp(m.delta_bytes.unsigned_abs()),
            units::bytes_2dp(m.current_bytes)
        )
    });
    let error = c.error.map_or("-".into(), |e| {
        format!("{:.2e} → {:.2e}", e.baseline, e.current)
    });
    let status = if c.baseline_status == c.current_status {
        c.current_status.to_string()
    } else {
        format!("{} → {}", c.baseline_status, c.current_status)
    };
    // GitHub Markdown splits table cells at `|`, even inside code spans, unless escaped.
    format!(
        "| `{}` | {} | {} | {} | {} | {} | {} |",
        c.case_id.replace('|', "\\|"),
        verdicts.join(", "),
        ratio,
        medians,
        memory,
        error,
        status
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A side's header line names its path, cases, revision (10 characters, marked dirty
    /// only when it was), CPU, kernel path and logical CPUs, and says when samples.csv is
    /// missing; fields the run lacks are left out.
    #[test]
    fn run_line_names_the_side_its_build_and_its_machine() {
        let r = RunInfo {
            path: "results/a".into(),
            cases: 12,
            has_samples: true,
            git_revision: Some("0123456789abcdef".into()),
            git_dirty: Some(false),
            cpu_model: Some("Xeon".into()),
            cpu_id: Some("intel-6-167".into()),
            cpu_kernel_path: Some("amx-bf16".into()),
            logical_cpus: Some(2),
        };
        let full = "`results/a`: 12 cases, git 0123456789, Xeon [intel-6-167], kernels amx-bf16 \
                    (2 logical CPUs)";
        assert_eq!(run_line(&r), full);
        let dirty = RunInfo {
            git_dirty: Some(true),
            has_samples: false,
            ..r.clone()
        };
        assert_eq!(
            run_line(&dirty),
            "`results/a`: 12 cases, git 0123456789 (dirty), Xeon [intel-6-167], kernels \
             amx-bf16 (2 logical CPUs), no samples.csv"
        );
        let bare = RunInfo {
            git_revision: None,
            git_dirty: None,
            cpu_model: None,
            cpu_id: None,
            cpu_kernel_path: None,
            logical_cpus: None,
            ..r
        };
        assert_eq!(run_line(&bare), "`results/a`: 12 cases");
    }

    /// A report row: every verdict in its order (regressions first), the time cell with its
    /// interval, factor or note, the medians and reps, the memory delta's sign and the
    /// current bytes, both errors, and the status or its change; `|` in the id escaped.
    #[test]
    fn a_row_states_each_verdict_and_each_figure() {
        use super::super::accuracy::ErrResult;
        use super::super::memory::MemResult;
        use super::super::time::Interval;
        use super::super::TimeResult;
        use crate::results::record::Status;

        let base = super::super::tests::unchanged();
        let time = |verdict, iv: Option<(f64, f64, f64)>, medians: (f64, f64), reps| {
            Some(TimeResult {
                verdict,
                interval: iv.map(|(ratio, lo, hi)| Interval { ratio, lo, hi }),
                baseline_median_s: Some(medians.0),
                current_median_s: Some(medians.1),
                baseline_reps: reps,
                current_reps: reps,
                factor: None,
                note: None,
            })
        };
        let memory = |verdict, baseline: u64, current: u64| {
            Some(MemResult {
                verdict,
                baseline_bytes: baseline,
                current_bytes: current,
                delta_bytes: current as i64 - baseline as i64,
                tolerated_bytes: 2048,
            })
        };
        let error = |verdict, baseline, current| {
            Some(ErrResult {
                verdict,
                baseline,
                current,
                tolerance: 1.6e-2,
            })
        };
        assert_eq!(row(&base), "| `c` | not compared | - | - | - | - | ok |");

        let lost = CaseComparison {
            current_status: Status::Error,
            status: StatusChange::Lost,
            time: time(TimeVerdict::Slower, Some((1.5, 1.4, 1.6)), (1.0, 1.5), 5),
            memory: memory(MemVerdict::Higher, 1000, 5096),
            error: error(ErrVerdict::Worse, 1e-3, 0.5),
            ..base.clone()
        };
        assert_eq!(
            row(&lost),
            "| `c` | **ok → error**, **error** (tolerance 1.6e-2), **memory** (+4.00 KiB > \
             2.00 KiB), **slower** | 1.500 [1.400, 1.600] | 1.000 s → 1.500 s (5 → 5 reps) | \
             +4.00 KiB (4.98 KiB) | 1.00e-3 → 5.00e-1 | ok → error |"
        );

        let mut fixed = CaseComparison {
            baseline_status: Status::Skipped,
            status: StatusChange::Fixed,
            time: time(
                TimeVerdict::Faster,
                Some((0.5, 0.45, 0.55)),
                (2e-3, 1e-3),
                7,
            ),
            memory: memory(MemVerdict::Lower, 5096, 1000),
            error: error(ErrVerdict::Better, 0.5, 1e-3),
            ..base.clone()
        };
        if let Some(t) = fixed.time.as_mut() {
            t.factor = Some(1.25);
        }
        assert_eq!(
            row(&fixed),
            "| `c` | faster, fixed (skipped → ok), less memory, more accurate | 0.500 [0.450, \
             0.550] (×1.250) | 2.000 ms → 1.000 ms (7 → 7 reps) | -4.00 KiB (1000 B) | \
             5.00e-1 → 1.00e-3 | skipped → ok |"
        );

        let mut unclear = CaseComparison {
            time: time(TimeVerdict::Unclear, None, (1e-6, 2e-6), 2),
            memory: memory(MemVerdict::Incomparable, 1000, 9192),
            error: error(ErrVerdict::Same, 1e-7, 1e-7),
            ..base.clone()
        };
        if let Some(t) = unclear.time.as_mut() {
            t.note = Some("2 reps: too few".into());
        }
        assert_eq!(
            row(&unclear),
            "| `c` | unclear, memory not judged (other kernel path) | 2 reps: too few | 1.0 us \
             → 2.0 us (2 → 2 reps) | +8.00 KiB (8.98 KiB) | 1.00e-7 → 1.00e-7 | ok |"
        );

        let unrecorded = CaseComparison {
            case_id: "x|y".into(),
            memory: memory(MemVerdict::Same, 1000, 1000),
            unrecorded: vec!["error"],
            ..base
        };
        assert_eq!(
            row(&unrecorded),
            "| `x\\|y` | **error not recorded** | - | - | +0 B (1000 B) | - | ok |"
        );
    }
}
