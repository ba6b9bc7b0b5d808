//! `attnbench compare BASELINE CURRENT`: the CI regression gate. Loads both runs (CSV and
//! `meta.json` only), matches cases by `case_id`, judges each on time (bootstrap interval of
//! the ratio of medians), memory (exact overhead, small allowance) and error (growth beyond
//! a factor and the dtype's tolerance, or losing `ok`), renders Markdown or JSON, and returns
//! the exit code. Cost: O(cases · bootstrap · reps) time, O(rows + samples) memory.
//!
//! One job per file: `load` (files), `matching` (case pairs), `time`, `memory`, `accuracy`
//! (the three gates), `normalize` (machine calibration), `render` (output).

pub mod accuracy;
pub mod matching;
pub mod memory;
pub mod normalize;
pub mod render;
pub mod time;

use serde::Serialize;

use crate::error::Result;
use crate::problem::DType;
use crate::results::compared::Run;
use crate::results::record::{Record, Status};
use accuracy::{ErrResult, ErrVerdict, StatusChange};
use memory::{MemResult, MemVerdict};
use normalize::{Decision, Normalize};
use time::{Interval, TimeVerdict};

/// Exit code: at least one regression (or a baseline case missing from the current run).
pub const EXIT_REGRESSION: i32 = 3;
/// Exit code with `--fail-on-unclear`: no regression, but some time verdicts are unclear.
pub const EXIT_UNCLEAR: i32 = 4;

/// How far (relative) the median of a case's samples may lie from its row's
/// `time_median_s`: rounding only (an extrapolated row scales its median, the samples each).
const SAME_MEDIAN_REL: f64 = 1e-9;

/// Resamples below this give too coarse a 95% interval to be worth reporting.
pub const MIN_BOOTSTRAP: usize = 100;

/// Resamples above this add nothing to a 95% interval and would run for hours (a typo such
/// as 1e12 must be refused, not run).
pub const MAX_BOOTSTRAP: usize = 1_000_000;

/// What decides the verdicts (the command's flags, checked).
#[derive(Clone, Debug, Serialize)]
pub struct Options {
    pub time_threshold: f64,
    pub mem_threshold_bytes: u64,
    pub err_factor: f64,
    /// `None`: calibration when the machines differ, else none.
    pub normalize: Option<Normalize>,
    pub fail_on_unclear: bool,
    /// Whether a `slower` or `unclear` time verdict counts toward the exit code
    /// (`--no-time-gate` turns it off: time is shown, memory and error still gate).
    pub time_gate: bool,
    pub bootstrap: usize,
    pub seed: u64,
}

/// The time comparison of one case.
#[derive(Clone, Debug, Serialize)]
pub struct TimeResult {
    pub verdict: TimeVerdict,
    /// Ratio of medians current / baseline (normalized when the mode says so) and its
    /// interval; absent when there is nothing to resample.
    pub interval: Option<Interval>,
    pub baseline_median_s: Option<f64>,
    pub current_median_s: Option<f64>,
    pub baseline_reps: usize,
    pub current_reps: usize,
    /// The normalization factor applied to the raw ratio (gflops_current / gflops_baseline).
    pub factor: Option<f64>,
    /// Why the verdict is unclear without an interval.
    pub note: Option<String>,
}

/// Everything compared for one matched case.
#[derive(Clone, Debug, Serialize)]
pub struct CaseComparison {
    pub case_id: String,
    pub variant: String,
    pub dtype: String,
    pub threads: usize,
    pub baseline_status: Status,
    pub current_status: Status,
    pub status: StatusChange,
    pub time: Option<TimeResult>,
    pub memory: Option<MemResult>,
    pub error: Option<ErrResult>,
    /// What regressed: any of "status", "error", "memory", "slower". Empty: none.
    pub regressions: Vec<&'static str>,
    /// Figures the baseline's row has and the current's, ok too, lacks ("memory", "error"):
    /// a gate that can no longer judge them is a regression, as a vanished case is.
    pub unrecorded: Vec<&'static str>,
    /// The time verdict is unclear.
    pub unclear: bool,
}

impl CaseComparison {
    /// Ordering rank, worst first: regressions, unclear, improvements, unchanged.
    fn rank(&self) -> u8 {
        let improved = self.status == StatusChange::Fixed
            || self
                .time
                .as_ref()
                .is_some_and(|t| t.verdict == TimeVerdict::Faster)
            || self.memory.is_some_and(|m| m.verdict == MemVerdict::Lower)
            || self.error.is_some_and(|e| e.verdict == ErrVerdict::Better);
        if !self.regressions.is_empty() {
            0
        } else if self.unclear {
            1
        } else if improved {
            2
        } else {
            3
        }
    }

    /// How bad, within a rank: losing `ok` first, then the largest growth of any figure.
    fn badness(&self) -> f64 {
        if self.status == StatusChange::Lost {
            return f64::INFINITY;
        }
        let time = self
            .time
            .as_ref()
            .and_then(|t| t.interval)
            .map_or(0.0, |i| i.ratio);
        let mem = self.memory.map_or(0.0, |m| {
            m.current_bytes as f64 / (m.baseline_bytes.max(1)) as f64
        });
        let err = self
            .error
            .filter(|e| e.verdict == ErrVerdict::Worse)
            .map_or(0.0, |e| {
                if e.baseline > 0.0 {
                    e.current / e.baseline
                } else {
                    f64::MAX
                }
            });
        // `f64::max` skips a NaN ratio: it counts as no growth.
        time.max(mem).max(err)
    }
}

/// One side's identity, for the header of the output.
#[derive(Clone, Debug, Serialize)]
pub struct RunInfo {
    pub path: String,
    pub cases: usize,
    pub has_samples: bool,
    pub git_revision: Option<String>,
    pub git_dirty: Option<bool>,
    pub cpu_model: Option<String>,
    pub cpu_id: Option<String>,
    pub cpu_kernel_path: Option<String>,
    pub logical_cpus: Option<usize>,
}

impl RunInfo {
    fn of(run: &Run) -> RunInfo {
        let meta = run.meta.clone().unwrap_or_default();
        let cpu_kernel_path = meta.kernel_path().map(String::from);
        RunInfo {
            path: run.label.clone(),
            cases: run.records.len(),
            has_samples: run.samples.is_some(),
            git_revision: meta.git_revision,
            git_dirty: meta.git_dirty,
            cpu_model: meta.cpu_model,
            cpu_id: meta.cpu_id,
            cpu_kernel_path,
            logical_cpus: meta.logical_cpus,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Counts {
    pub matched: usize,
    /// Matched cases with at least one regression.
    pub regressed: usize,
    pub slower: usize,
    pub faster: usize,
    pub same_time: usize,
    pub unclear: usize,
    pub memory_regressions: usize,
    /// CPU cases whose memory differs between runs on different kernel paths (not judged).
    pub memory_incomparable: usize,
    pub error_regressions: usize,
    pub status_regressions: usize,
    /// Baseline cases missing from the current run (each a regression).
    pub missing: usize,
    /// Current cases without a baseline (reported only).
    pub new: usize,
    /// Matched cases measured (`ok`) on both sides: the ones whose time, memory and error
    /// were judged.
    pub measured_both: usize,
}

/// The whole comparison, worst case first.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    pub verdict: &'static str,
    pub exit_code: i32,
    pub baseline: RunInfo,
    pub current: RunInfo,
    pub normalize: Decision,
    pub options: Options,
    pub confidence: f64,
    pub mem_allowance_bytes: u64,
    pub counts: Counts,
    pub cases: Vec<CaseComparison>,
    pub only_in_baseline: Vec<String>,
    pub only_in_current: Vec<String>,
    /// What to do about unclear verdicts (empty when there are none).
    pub advice: Vec<String>,
}

/// Compares two loaded runs.
pub fn compare(baseline: &Run, current: &Run, opts: &Options) -> Result<Comparison> {
    let decision = normalize::decide(
        opts.normalize,
        (
            baseline.meta.as_ref(),
            &baseline.meta_path.display().to_string(),
        ),
        (
            current.meta.as_ref(),
            &current.meta_path.display().to_string(),
        ),
    )?;
    let m = matching::match_cases(&baseline.records, &current.records);
    let path = |r: &Run| {
        r.meta
            .as_ref()
            .and_then(|m| m.kernel_path().map(String::from))
    };
    let kernel_paths_differ = matches!(
        (path(baseline), path(current)),
        (Some(b), Some(c)) if b != c
    );
    let mut cases: Vec<CaseComparison> = m
        .pairs
        .iter()
        .map(|(b, c)| {
            compare_case(
                b,
                c,
                baseline,
                current,
                &decision,
                opts,
                kernel_paths_differ,
            )
        })
        .collect();
    cases.sort_by(|a, b| {
        a.rank()
            .cmp(&b.rank())
            .then(b.badness().total_cmp(&a.badness()))
            .then(a.case_id.cmp(&b.case_id))
    });

    let mut counts = Counts {
        matched: cases.len(),
        missing: m.only_in_baseline.len(),
        new: m.only_in_current.len(),
        ..Counts::default()
    };
    for c in &cases {
        counts.measured_both +=
            usize::from(c.baseline_status == Status::Ok && c.current_status == Status::Ok);
        counts.regressed += usize::from(!c.regressions.is_empty());
        // Every unclear time verdict, as `slower` counts every slower one; whether they
        // decide the verdict is `c.unclear` (not under --no-time-gate).
        counts.unclear += usize::from(
            c.time
                .as_ref()
                .is_some_and(|t| t.verdict == TimeVerdict::Unclear),
        );
        counts.memory_regressions += usize::from(c.regressions.contains(&"memory"));
        counts.memory_incomparable += usize::from(
            c.memory
                .is_some_and(|m| m.verdict == MemVerdict::Incomparable),
        );
        counts.error_regressions += usize::from(c.regressions.contains(&"error"));
        counts.status_regressions += usize::from(c.regressions.contains(&"status"));
        match c.time.as_ref().map(|t| t.verdict) {
            Some(TimeVerdict::Slower) => counts.slower += 1,
            Some(TimeVerdict::Faster) => counts.faster += 1,
            Some(TimeVerdict::Same) => counts.same_time += 1,
            _ => {}
        }
    }
    let (verdict, exit_code) = if counts.regressed > 0 || counts.missing > 0 {
        ("regression", EXIT_REGRESSION)
    } else if cases.iter().any(|c| c.unclear) {
        (
            "unclear",
            if opts.fail_on_unclear {
                EXIT_UNCLEAR
            } else {
                0
            },
        )
    } else {
        ("ok", 0)
    };
    let advice = advice(&cases, &decision, opts);
    Ok(Comparison {
        verdict,
        exit_code,
        baseline: RunInfo::of(baseline),
        current: RunInfo::of(current),
        normalize: decision,
        options: opts.clone(),
        confidence: time::CONFIDENCE,
        mem_allowance_bytes: memory::ALLOWANCE_BYTES,
        counts,
        cases,
        only_in_baseline: m.only_in_baseline,
        only_in_current: m.only_in_current,
        advice,
    })
}

/// One matched case; `kernel_paths_differ`: the runs used different CPU kernel paths, so a
/// CPU case's memory that differs is `Incomparable`, not judged.
fn compare_case(
    b: &Record,
    c: &Record,
    baseline: &Run,
    current: &Run,
    decision: &Decision,
    opts: &Options,
    kernel_paths_differ: bool,
) -> CaseComparison {
    let status = accuracy::status_change(b.status, c.status);
    let both_ok = b.status == Status::Ok && c.status == Status::Ok;
    let time = both_ok.then(|| time_of(b, c, baseline, current, decision, opts));
    let memory = match (b.mem_overhead_bytes, c.mem_overhead_bytes) {
        (Some(x), Some(y)) if both_ok => {
            let mut m = memory::gate(x, y, c.threads, opts.mem_threshold_bytes);
            if kernel_paths_differ && c.device == "cpu" && m.verdict != MemVerdict::Same {
                m.verdict = MemVerdict::Incomparable;
            }
            Some(m)
        }
        _ => None,
    };
    // An unknown dtype (a newer attnbench) gets no tolerance: only the growth factor gates it.
    let tolerance = c.dtype.parse::<DType>().map_or(0.0, DType::tolerance);
    let error = match (b.max_abs_err, c.max_abs_err) {
        (Some(x), Some(y)) if both_ok => Some(accuracy::gate(x, y, tolerance, opts.err_factor)),
        _ => None,
    };
    let mut regressions = Vec::new();
    if status == StatusChange::Lost {
        regressions.push("status");
    }
    let mut unrecorded = Vec::new();
    if both_ok && b.mem_overhead_bytes.is_some() && c.mem_overhead_bytes.is_none() {
        unrecorded.push("memory");
    }
    if both_ok && b.max_abs_err.is_some() && c.max_abs_err.is_none() {
        unrecorded.push("error");
    }
    regressions.extend(&unrecorded);
    if error.is_some_and(|e| e.verdict == ErrVerdict::Worse) {
        regressions.push("error");
    }
    if memory.is_some_and(|m| m.verdict == MemVerdict::Higher) {
        regressions.push("memory");
    }
    if opts.time_gate
        && time
            .as_ref()
            .is_some_and(|t| t.verdict == TimeVerdict::Slower)
    {
        regressions.push("slower");
    }
    let unclear = opts.time_gate
        && time
            .as_ref()
            .is_some_and(|t| t.verdict == TimeVerdict::Unclear);
    CaseComparison {
        case_id: b.case_id.clone(),
        variant: c.variant.clone(),
        dtype: c.dtype.clone(),
        threads: c.threads,
        baseline_status: b.status,
        current_status: c.status,
        status,
        time,
        memory,
        error,
        regressions,
        unrecorded,
        unclear,
    }
}

fn time_of(
    b: &Record,
    c: &Record,
    baseline: &Run,
    current: &Run,
    decision: &Decision,
    opts: &Options,
) -> TimeResult {
    let samples = |run: &Run, id: &str| -> Option<Vec<f64>> {
        run.samples
            .as_ref()?
            .get(id)
            .filter(|s| !s.is_empty())
            .cloned()
    };
    let mut result = TimeResult {
        verdict: TimeVerdict::Unclear,
        interval: None,
        baseline_median_s: b.time_median_s,
        current_median_s: c.time_median_s,
        baseline_reps: b.reps,
        current_reps: c.reps,
        factor: None,
        note: None,
    };
    let factor = match decision.mode {
        Normalize::None => Ok(1.0),
        Normalize::Calibration => match (&baseline.meta, &current.meta) {
            (Some(bm), Some(cm)) => normalize::factor(bm, cm, c.threads),
            _ => Err("no meta.json".to_string()),
        },
        Normalize::Probe => normalize::probe_factor(b.probe_gflops, c.probe_gflops),
    };
    let factor = match factor {
        Ok(k) => k,
        Err(why) => {
            result.note = Some(format!("cannot normalize: {why}"));
            return result;
        }
    };
    if decision.mode != Normalize::None {
        result.factor = Some(factor);
    }
    let (sb, sc) = match (samples(baseline, &b.case_id), samples(current, &c.case_id)) {
        (Some(sb), Some(sc)) => (sb, sc),
        (sb, _) => {
            let side = if sb.is_none() { baseline } else { current };
            result.note = Some(format!(
                "no timing samples for this case in {} (samples.csv; rerun that sweep with this \
                 attnbench)",
                side.label
            ));
            return result;
        }
    };
    // Samples that are not the row's (samples.csv of another run of the case, or of an
    // older attnbench that kept an extrapolated case's unscaled timings) would judge other
    // timings than the row shows: a run attnbench writes has one sample per rep, and the
    // row's median is theirs.
    for (s, r, run) in [(&sb, b, baseline), (&sc, c, current)] {
        let median = time::median(&mut s.clone());
        let why = if s.len() != r.reps {
            format!(
                "{} timings of this case, runs.csv says {} repetitions",
                s.len(),
                r.reps
            )
        } else if r
            .time_median_s
            .is_some_and(|m| (median - m).abs() > SAME_MEDIAN_REL * m.abs())
        {
            format!(
                "timings of median {median:.6e} s, runs.csv says {:.6e} s",
                r.time_median_s.unwrap_or(f64::NAN)
            )
        } else {
            continue;
        };
        result.note = Some(format!(
            "{}: samples.csv has {why}: they are not of the same run",
            run.label
        ));
        return result;
    }
    // The counts the verdict rests on.
    (result.baseline_reps, result.current_reps) = (sb.len(), sc.len());
    if sb.len().min(sc.len()) < time::MIN_REPS {
        let median = |s: &[f64]| time::median(&mut s.to_vec());
        result.note = Some(format!(
            "ratio {:.3} from {} and {} repetitions: too few to bound it (at least {} a side)",
            median(&sc) / median(&sb) * factor,
            sb.len(),
            sc.len(),
            time::MIN_REPS
        ));
        return result;
    }
    let seed = time::case_seed(opts.seed, &b.case_id);
    match time::bootstrap_ratio(&sb, &sc, opts.bootstrap, seed) {
        Some(iv) => {
            let iv = iv.scaled(factor);
            result.verdict = time::classify(&iv, opts.time_threshold);
            result.interval = Some(iv);
        }
        None => result.note = Some("a median time of zero: no ratio".into()),
    }
    result
}

fn advice(cases: &[CaseComparison], decision: &Decision, opts: &Options) -> Vec<String> {
    let unclear: Vec<&CaseComparison> = cases.iter().filter(|c| c.unclear).collect();
    if unclear.is_empty() {
        return Vec::new();
    }
    let mut out = vec![format!(
        "{} time verdict(s) are unclear: the {:.0}% interval of the ratio straddles the \
         ±{:.0}% threshold, so these runs cannot tell. To decide:",
        unclear.len(),
        time::CONFIDENCE * 100.0,
        opts.time_threshold * 100.0
    )];
    let no_samples = unclear.iter().any(|c| {
        // (Too few repetitions also leave no interval: the advice below covers those.)
        c.time.as_ref().is_some_and(|t| {
            t.interval.is_none() && t.baseline_reps.min(t.current_reps) >= time::MIN_REPS
        })
    });
    if no_samples {
        out.push(
            "rerun the side whose samples.csv is missing or not of its runs.csv (or that has \
             no calibration) with this attnbench version, which records every repetition"
                .into(),
        );
    }
    let few = unclear.iter().any(|c| {
        c.time
            .as_ref()
            .is_some_and(|t| t.baseline_reps.min(t.current_reps) < time::MIN_REPS)
    });
    if few {
        out.push(format!(
            "a side with fewer than {} timed calls cannot be judged: let both runs make at \
             least {0} (run.max_reps >= {0}, and a run.max_time_s that leaves room for them)",
            time::MIN_REPS
        ));
    }
    out.push(
        "take more repetitions in both runs: raise run.min_reps and run.min_time_s \
         (e.g. --set run.min_reps=30 --set run.min_time_s=0.5); the interval narrows as \
         1/sqrt(reps)"
            .into(),
    );
    out.push(
        "cut scheduling noise: pin the process (taskset -c 0 attnbench ...), use threads = 1, \
         and run on a quiet machine"
            .into(),
    );
    if decision.mode == Normalize::None {
        out.push(
            "if the runs come from different machines or different load, compare with \
             --normalize calibration"
                .into(),
        );
    }
    out.push(format!(
        "or accept a wider band with --time-threshold (now {})",
        opts.time_threshold
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A matched case with nothing to say: every figure the same, nothing regressed.
    pub(super) fn unchanged() -> CaseComparison {
        CaseComparison {
            case_id: "c".into(),
            variant: "flash".into(),
            dtype: "f32".into(),
            threads: 1,
            baseline_status: Status::Ok,
            current_status: Status::Ok,
            status: StatusChange::Same,
            time: None,
            memory: None,
            error: None,
            regressions: Vec::new(),
            unrecorded: Vec::new(),
            unclear: false,
        }
    }

    /// `unchanged()` with `f` applied.
    fn changed(f: &dyn Fn(&mut CaseComparison)) -> CaseComparison {
        let mut c = unchanged();
        f(&mut c);
        c
    }

    fn time(verdict: TimeVerdict, ratio: f64) -> Option<TimeResult> {
        Some(TimeResult {
            verdict,
            interval: Some(Interval {
                ratio,
                lo: ratio,
                hi: ratio,
            }),
            baseline_median_s: Some(1.0),
            current_median_s: Some(ratio),
            baseline_reps: 5,
            current_reps: 5,
            factor: None,
            note: None,
        })
    }

    fn memory(verdict: MemVerdict, baseline_bytes: u64, current_bytes: u64) -> Option<MemResult> {
        Some(MemResult {
            verdict,
            baseline_bytes,
            current_bytes,
            delta_bytes: current_bytes as i64 - baseline_bytes as i64,
            tolerated_bytes: 0,
        })
    }

    fn error(verdict: ErrVerdict, baseline: f64, current: f64) -> Option<ErrResult> {
        Some(ErrResult {
            verdict,
            baseline,
            current,
            tolerance: 1e-6,
        })
    }

    #[test]
    fn cases_rank_regressions_then_unclear_then_improvements_then_unchanged() {
        let with = |f: &dyn Fn(&mut CaseComparison)| changed(f).rank();
        assert_eq!(unchanged().rank(), 3);
        // Figures that stayed the same (or got worse within the gate) are not improvements.
        assert_eq!(with(&|c| c.time = time(TimeVerdict::Same, 1.0)), 3);
        assert_eq!(with(&|c| c.memory = memory(MemVerdict::Same, 8, 8)), 3);
        assert_eq!(with(&|c| c.error = error(ErrVerdict::Same, 1e-7, 1e-7)), 3);
        assert_eq!(with(&|c| c.status = StatusChange::Changed), 3);
        // Each improvement alone.
        assert_eq!(with(&|c| c.status = StatusChange::Fixed), 2);
        assert_eq!(with(&|c| c.time = time(TimeVerdict::Faster, 0.8)), 2);
        assert_eq!(with(&|c| c.memory = memory(MemVerdict::Lower, 8, 4)), 2);
        assert_eq!(
            with(&|c| c.error = error(ErrVerdict::Better, 1e-5, 1e-7)),
            2
        );
        // Unclear before improvements, regressions before everything.
        assert_eq!(with(&|c| c.unclear = true), 1);
        assert_eq!(
            with(&|c| {
                c.unclear = true;
                c.time = time(TimeVerdict::Faster, 0.8);
            }),
            1
        );
        assert_eq!(with(&|c| c.regressions = vec!["memory"]), 0);
        assert_eq!(
            with(&|c| {
                c.regressions = vec!["slower"];
                c.unclear = true;
                c.status = StatusChange::Fixed;
            }),
            0
        );
    }

    #[test]
    fn badness_is_the_largest_growth_and_losing_ok_is_worst() {
        let with = |f: &dyn Fn(&mut CaseComparison)| changed(f).badness();
        assert_eq!(unchanged().badness(), 0.0);
        assert_eq!(with(&|c| c.status = StatusChange::Lost), f64::INFINITY);
        assert_eq!(with(&|c| c.status = StatusChange::Fixed), 0.0);
        // Time: the interval's ratio of medians.
        assert_eq!(with(&|c| c.time = time(TimeVerdict::Slower, 1.3)), 1.3);
        // Memory: current over baseline bytes, a zero baseline counted as one byte.
        assert_eq!(
            with(&|c| c.memory = memory(MemVerdict::Higher, 200, 300)),
            1.5
        );
        assert_eq!(with(&|c| c.memory = memory(MemVerdict::Higher, 0, 5)), 5.0);
        // Error: only a worse error counts, as current over baseline; from zero, the most.
        assert_eq!(
            with(&|c| c.error = error(ErrVerdict::Worse, 1e-6, 4e-6)),
            4.0
        );
        assert_eq!(
            with(&|c| c.error = error(ErrVerdict::Same, 1e-7, 9e-7)),
            0.0
        );
        assert_eq!(
            with(&|c| c.error = error(ErrVerdict::Worse, 0.0, 1e-6)),
            f64::MAX
        );
        // The largest of the three.
        assert_eq!(
            with(&|c| {
                c.time = time(TimeVerdict::Slower, 1.3);
                c.memory = memory(MemVerdict::Higher, 200, 300);
                c.error = error(ErrVerdict::Worse, 1e-6, 2e-6);
            }),
            2.0
        );
        // A ratio that is not a number counts as no growth; the others still count.
        assert_eq!(
            with(&|c| c.time = time(TimeVerdict::Unclear, f64::NAN)),
            0.0
        );
        assert_eq!(
            with(&|c| {
                c.time = time(TimeVerdict::Unclear, f64::NAN);
                c.memory = memory(MemVerdict::Higher, 200, 300);
            }),
            1.5
        );
    }
}
