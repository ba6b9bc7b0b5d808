//! `attnbench compare` end to end: the acceptance cases built from the committed CI baseline
//! (times x1.3, one page more memory, an error row), exit codes, unmatched cases, machine
//! normalization, malformed inputs, and `samples.csv` as the sweep writes it.

use attnbench::measure::stats::Summary;
use attnbench::results::record::{Record, Status};
use attnbench::variant::Registry;
use predicates::prelude::*;
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

mod common;
use common::{attnbench, compare, compare_json, copy_run, repo};

/// The committed CI baselines, one per machine (`results/baseline/ci/<machine key>/`).
fn baselines() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(repo().join("results/baseline/ci"))
        .expect("results/baseline/ci")
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("runs.csv").is_file())
        .collect();
    dirs.sort();
    assert!(!dirs.is_empty(), "no baseline under results/baseline/ci");
    dirs
}

/// The baseline `.ci/run` picks: this machine's, else one of the same kernel path, else
/// the first one.
fn baseline() -> PathBuf {
    let own = repo()
        .join("results/baseline/ci")
        .join(attnbench::results::meta::machine_key());
    if own.join("runs.csv").is_file() {
        return own;
    }
    let path = attnbench::backend::cpu::isa::Isa::detect().name();
    let all = baselines();
    all.iter()
        .find(|d| {
            d.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(&format!("-{path}")))
        })
        .cloned()
        .unwrap_or_else(|| all[0].clone())
}

fn read_records(dir: &Path) -> Vec<Record> {
    csv::Reader::from_path(dir.join("runs.csv"))
        .unwrap()
        .deserialize()
        .map(|r| r.unwrap())
        .collect()
}

fn write_records(dir: &Path, records: &[Record]) {
    let mut w = csv::Writer::from_path(dir.join("runs.csv")).unwrap();
    for r in records {
        w.serialize(r).unwrap();
    }
    w.flush().unwrap();
}

fn edit_records(dir: &Path, f: impl FnOnce(&mut Vec<Record>)) {
    let mut records = read_records(dir);
    f(&mut records);
    write_records(dir, &records);
}

/// Rewrites `samples.csv`, mapping each (case_id, time) to a new time, and the time columns
/// of each row from its new samples, as a sweep would have written them.
fn edit_samples(dir: &Path, f: impl Fn(&str, f64) -> f64) {
    let p = dir.join("samples.csv");
    let mut r = csv::Reader::from_path(&p).unwrap();
    let rows: Vec<(String, usize, f64)> = r.deserialize().map(|x| x.unwrap()).collect();
    let mut w = csv::Writer::from_path(&p).unwrap();
    w.write_record(["case_id", "rep", "time_s"]).unwrap();
    let mut by_case: std::collections::HashMap<String, Vec<f64>> = Default::default();
    for (id, rep, t) in rows {
        let t = f(&id, t);
        w.serialize((&id, rep, t)).unwrap();
        let times = by_case.entry(id).or_default();
        if rep == 0 {
            times.clear();
        }
        times.push(t);
    }
    w.flush().unwrap();
    edit_records(dir, |records| {
        for r in records.iter_mut() {
            if let Some(s) = by_case.get(&r.case_id).and_then(|t| Summary::of(t)) {
                r.time_median_s = Some(s.median);
                r.time_min_s = Some(s.min);
                r.time_max_s = Some(s.max);
                r.time_mad_s = Some(s.mad);
            }
        }
    });
}

fn edit_meta(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("meta.json");
    let mut v: serde_json::Value = serde_json::from_str(&fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

fn cases_with(v: &serde_json::Value, regression: &str) -> Vec<String> {
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| {
            c["regressions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r == regression)
        })
        .map(|c| c["case_id"].as_str().unwrap().to_string())
        .collect()
}

fn time_verdicts(v: &serde_json::Value) -> Vec<String> {
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["time"]["verdict"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn the_baseline_compared_with_itself_passes() {
    let (code, v) = compare_json(&baseline(), &baseline(), &[]);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["counts"]["regressed"], 0);
    assert_eq!(v["counts"]["missing"], 0);
    assert_eq!(v["counts"]["matched"], read_records(&baseline()).len());
    assert!(time_verdicts(&v)
        .iter()
        .all(|t| t == "same" || t == "unclear"));
    // The same machine on both sides: raw seconds.
    assert_eq!(v["normalize"]["mode"], "none");
}

/// The cases whose time the baseline alone pins down: compared with itself, their interval
/// lies within the 10% band. (A case whose samples are bimodal, from a loaded machine, has a
/// wide interval whatever the shift, and is honestly `unclear`.)
fn self_consistent_cases() -> BTreeSet<String> {
    let (_, v) = compare_json(&baseline(), &baseline(), &[]);
    let same: BTreeSet<String> = v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["time"]["verdict"] == "same")
        .map(|c| c["case_id"].as_str().unwrap().to_string())
        .collect();
    assert!(
        2 * same.len()
            >= read_records(&baseline())
                .iter()
                .filter(|r| r.status == Status::Ok)
                .count(),
        "results/baseline/ci is too noisy to gate time ({} of its cases agree with \
         themselves): regenerate it on a quiet machine with scripts/update-baseline.sh",
        same.len()
    );
    same
}

/// The compared cases that have a time interval (skipped cases, e.g. a variant without a
/// backward in the fwd+bwd half of the grid, have no time to judge).
fn timed_cases(v: &serde_json::Value) -> Vec<&serde_json::Value> {
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| !c["time"]["interval"].is_null())
        .collect()
}

fn verdict_of(v: &serde_json::Value, id: &str) -> String {
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["case_id"] == id)
        .and_then(|c| c["time"]["verdict"].as_str())
        .unwrap_or("none")
        .to_string()
}

#[test]
fn every_time_scaled_by_1_3_is_slower_with_exit_3() {
    let tmp = tempfile::tempdir().unwrap();
    let cur = tmp.path().join("cur");
    copy_run(&baseline(), &cur);
    edit_samples(&cur, |_, t| t * 1.3);
    let (code, v) = compare_json(&baseline(), &cur, &[]);
    assert_eq!(code, 3, "{v:#}");
    assert_eq!(v["verdict"], "regression");
    let pinned = self_consistent_cases();
    assert!(!timed_cases(&v).is_empty());
    for c in timed_cases(&v) {
        let id = c["case_id"].as_str().unwrap();
        let ratio = c["time"]["interval"]["ratio"].as_f64().unwrap();
        assert!((ratio - 1.3).abs() < 1e-9, "{id}: {ratio}");
        let verdict = verdict_of(&v, id);
        if pinned.contains(id) {
            assert_eq!(verdict, "slower", "{id}");
        } else {
            // Never "same" or "faster": at worst the noise leaves it undecided.
            assert!(
                verdict == "slower" || verdict == "unclear",
                "{id}: {verdict}"
            );
        }
    }
    // The Markdown names it, with the interval, and states the default bounds (1 + 0.1 and
    // its inverse).
    let bounds = "slower when the interval is above 1.100, faster when below 0.909";
    compare(baseline(), &cur).assert().code(3).stdout(
        predicate::str::contains("**slower**")
            .and(predicate::str::contains("1.300 ["))
            .and(predicate::str::contains(bounds)),
    );
}

/// `--no-time-gate` (what `.ci/run` uses): every time 1.3x slower still shows `slower`
/// verdicts but exits 0; a memory regression beside it still exits 3.
#[test]
fn no_time_gate_shows_time_but_only_memory_error_and_status_fail() {
    let tmp = tempfile::tempdir().unwrap();
    let cur = tmp.path().join("cur");
    copy_run(&baseline(), &cur);
    edit_samples(&cur, |_, t| t * 1.3);
    let (code, v) = compare_json(&baseline(), &cur, &["--no-time-gate"]);
    assert_eq!(code, 0, "{v:#}");
    assert!(v["counts"]["slower"].as_u64().unwrap() > 0, "{v:#}");
    assert_eq!(v["counts"]["regressed"], 0);
    compare(baseline(), &cur)
        .arg("--no-time-gate")
        .assert()
        .code(0)
        .stdout(predicate::str::contains("**time not gated**"));
    let id = add_memory(&cur, "f32", 4096);
    let (code, v) = compare_json(&baseline(), &cur, &["--no-time-gate"]);
    assert_eq!(code, 3, "{v:#}");
    assert_eq!(v["counts"]["regressed"], 1, "{id}: {v:#}");
}

/// Under `--no-time-gate` every judged case still gets its time verdict counted (`slower`,
/// `faster`, same or `unclear`, as the table shows them), and none decides the exit code.
#[test]
fn no_time_gate_counts_every_time_verdict_the_table_shows() {
    let tmp = tempfile::tempdir().unwrap();
    let cur = tmp.path().join("cur");
    copy_run(&baseline(), &cur);
    // Every other sample halved, the rest 1.6x: medians move and intervals widen, so some
    // verdicts are unclear.
    let flip = std::cell::Cell::new(false);
    edit_samples(&cur, |_, t| {
        flip.set(!flip.get());
        if flip.get() {
            t * 0.5
        } else {
            t * 1.6
        }
    });
    let (code, v) = compare_json(&baseline(), &cur, &["--no-time-gate"]);
    assert_eq!(code, 0, "{v:#}");
    let n = |k: &str| v["counts"][k].as_u64().unwrap();
    assert!(n("unclear") > 0, "{v:#}");
    let with_time = v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| !c["time"].is_null() && !c["time"]["verdict"].is_null())
        .count() as u64;
    assert_eq!(
        n("slower") + n("faster") + n("same_time") + n("unclear"),
        with_time,
        "{v:#}"
    );
}

/// Adds `bytes` to the memory overhead of the first ok `flash` case of `dtype` in the run
/// at `dir`; returns its case id.
fn add_memory(dir: &Path, dtype: &str, bytes: u64) -> String {
    edit_first(
        dir,
        |r| r.status == Status::Ok && r.variant == "flash" && r.dtype == dtype,
        |r| r.mem_overhead_bytes = r.mem_overhead_bytes.map(|m| m + bytes),
    )
}

/// Edits the first row `pick` accepts and returns its case id.
fn edit_first(
    dir: &Path,
    pick: impl Fn(&Record) -> bool,
    edit: impl FnOnce(&mut Record),
) -> String {
    let mut target = String::new();
    edit_records(dir, |rs| {
        let r = rs.iter_mut().find(|r| pick(r)).expect("a row to edit");
        edit(r);
        target = r.case_id.clone();
    });
    target
}

#[test]
fn one_page_more_memory_is_a_memory_regression_with_exit_3() {
    let tmp = tempfile::tempdir().unwrap();
    let cur = tmp.path().join("cur");
    copy_run(&baseline(), &cur);
    let target = add_memory(&cur, "f32", 4096);
    let (code, v) = compare_json(&baseline(), &cur, &[]);
    assert_eq!(code, 3, "{v:#}");
    assert_eq!(cases_with(&v, "memory"), std::slice::from_ref(&target));
    assert_eq!(v["counts"]["memory_regressions"], 1);
    // Worst first: the regression leads the table.
    assert_eq!(v["cases"][0]["case_id"], target.as_str());
    assert_eq!(v["cases"][0]["memory"]["delta_bytes"], 4096);
    compare(baseline(), &cur)
        .assert()
        .code(3)
        .stdout(predicate::str::contains("**memory** (+4.00 KiB"));
    // A threshold of one page lets it through.
    let (code, _) = compare_json(&baseline(), &cur, &["--mem-threshold", "4KiB"]);
    assert_ne!(code, 3);
}

#[test]
fn an_ok_row_that_lost_its_memory_or_error_figure_is_a_regression() {
    let tmp = tempfile::tempdir().unwrap();
    let cur = tmp.path().join("cur");
    copy_run(&baseline(), &cur);
    let target = edit_first(
        &cur,
        |r| r.status == Status::Ok && r.mem_overhead_bytes.is_some(),
        |r| {
            r.mem_overhead_bytes = None;
            r.max_abs_err = None;
        },
    );
    let (code, v) = compare_json(&baseline(), &cur, &[]);
    assert_eq!(code, 3, "{v:#}");
    assert_eq!(cases_with(&v, "memory"), std::slice::from_ref(&target));
    assert_eq!(cases_with(&v, "error"), std::slice::from_ref(&target));
    assert_eq!(
        v["cases"][0]["unrecorded"],
        serde_json::json!(["memory", "error"])
    );
    compare(baseline(), &cur)
        .assert()
        .code(3)
        .stdout(predicate::str::contains("**memory not recorded**"));
}

#[test]
fn memory_on_another_cpu_kernel_path_is_not_judged_but_said() {
    let tmp = tempfile::tempdir().unwrap();
    let cur = tmp.path().join("cur");
    copy_run(&baseline(), &cur);
    let target = add_memory(&cur, "bf16", 28 * 1024);
    // The same kernel path: a regression, and no note of memory left unjudged.
    let (code, _) = compare_json(&baseline(), &cur, &[]);
    assert_eq!(code, 3);
    compare(baseline(), &cur)
        .assert()
        .code(3)
        .stdout(predicate::str::contains("differs but is not judged").not());
    // Another path (bf16 tiles widened to f32 instead of paired): said, not judged.
    edit_meta(&cur, |m| {
        let own = m["cpu_kernel_path"]
            .as_str()
            .or_else(|| m["calibration"][0]["kernel_isa"].as_str())
            .unwrap()
            .to_string();
        m["cpu_kernel_path"] = if own == "portable" {
            "avx2"
        } else {
            "portable"
        }
        .into();
    });
    let (code, v) = compare_json(&baseline(), &cur, &[]);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["counts"]["memory_regressions"], 0);
    assert_eq!(v["counts"]["memory_incomparable"], 1);
    let case = v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["case_id"] == target.as_str())
        .unwrap();
    assert_eq!(case["memory"]["verdict"], "incomparable");
    // Another kernel path is another machine: times are normalized.
    assert_eq!(v["normalize"]["mode"], "calibration");
    compare(baseline(), &cur).assert().code(0).stdout(
        predicate::str::contains("memory not judged (other kernel path)")
            .and(predicate::str::contains("memory of 1 CPU case(s) differs")),
    );
}

#[test]
fn an_error_row_where_the_baseline_was_ok_is_flagged_with_exit_3() {
    let tmp = tempfile::tempdir().unwrap();
    let cur = tmp.path().join("cur");
    copy_run(&baseline(), &cur);
    let target = edit_first(
        &cur,
        |r| r.status == Status::Ok,
        |r| {
            r.status = Status::Error;
            r.reason = "12 of the checked output values are NaN or infinite".into();
            r.max_abs_err = Some(f64::INFINITY);
        },
    );
    let (code, v) = compare_json(&baseline(), &cur, &[]);
    assert_eq!(code, 3, "{v:#}");
    assert_eq!(cases_with(&v, "status"), [target]);
    assert_eq!(v["counts"]["status_regressions"], 1);
    compare(baseline(), &cur)
        .assert()
        .code(3)
        .stdout(predicate::str::contains("**ok → error**"));
}

#[test]
fn error_growth_beyond_2x_and_the_tolerance_is_flagged_but_rounding_noise_is_not() {
    let tmp = tempfile::tempdir().unwrap();
    let cur = tmp.path().join("cur");
    copy_run(&baseline(), &cur);
    let (mut worse, mut noise) = (String::new(), String::new());
    edit_records(&cur, |rs| {
        let mut ok = rs.iter_mut().filter(|r| r.status == Status::Ok);
        let a = ok.next().unwrap();
        // 10x and above even the loosest (bf16) tolerance.
        a.max_abs_err = a.max_abs_err.map(|e| (e * 10.0).max(0.1));
        worse = a.case_id.clone();
        let b = ok.find(|r| r.dtype == "f32").unwrap();
        // Tripled, but f32 rounding noise far below its 1e-5 tolerance.
        b.max_abs_err = b.max_abs_err.map(|e| e * 3.0);
        assert!(b.max_abs_err.unwrap() < 1e-5);
        noise = b.case_id.clone();
    });
    let (code, v) = compare_json(&baseline(), &cur, &[]);
    assert_eq!(code, 3, "{v:#}");
    assert_eq!(cases_with(&v, "error"), [worse]);
    assert!(!cases_with(&v, "error").contains(&noise));
}

#[test]
fn missing_cases_are_regressions_and_new_cases_are_listed() {
    let tmp = tempfile::tempdir().unwrap();
    let cur = tmp.path().join("cur");
    copy_run(&baseline(), &cur);
    let mut removed = String::new();
    edit_records(&cur, |rs| {
        removed = rs.remove(0).case_id;
    });
    let (code, v) = compare_json(&baseline(), &cur, &[]);
    assert_eq!(code, 3, "{v:#}");
    assert_eq!(v["only_in_baseline"], serde_json::json!([removed.clone()]));
    assert_eq!(v["counts"]["missing"], 1);
    compare(baseline(), &cur).assert().code(3).stdout(
        predicate::str::contains("Missing from current (1)")
            .and(predicate::str::contains(format!("- `{removed}`"))),
    );

    // The other way round: a case the baseline lacks is listed, not judged.
    let (code, v) = compare_json(&cur, &baseline(), &[]);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["only_in_current"], serde_json::json!([removed.clone()]));
    assert_eq!(v["counts"]["new"], 1);
    compare(&cur, baseline())
        .assert()
        .success()
        .stdout(predicate::str::contains("New in current (1)"));
}

/// A comparison whose matched cases never ran on both sides (every one skipped) says that
/// nothing was judged; one with measured cases, or with no matched case at all, does not.
#[test]
fn a_comparison_where_no_matched_case_ran_on_both_sides_says_so() {
    let note = "ran on both sides";
    compare(baseline(), baseline())
        .assert()
        .success()
        .stdout(predicate::str::contains(note).not());
    let tmp = tempfile::tempdir().unwrap();
    let (base, cur, none) = (
        tmp.path().join("base"),
        tmp.path().join("cur"),
        tmp.path().join("none"),
    );
    for dir in [&base, &cur] {
        copy_run(&baseline(), dir);
        edit_records(dir, |rs| {
            for r in rs.iter_mut() {
                r.status = Status::Skipped;
            }
        });
    }
    let n = read_records(&base).len();
    compare(&base, &cur)
        .assert()
        .success()
        .stdout(predicate::str::contains(format!(
            "none of the {n} matched cases ran on both sides"
        )));
    // No case in common (every id renamed): everything missing, nothing matched, no such
    // note.
    copy_run(&baseline(), &none);
    edit_records(&none, |rs| {
        for r in rs.iter_mut() {
            r.case_id.push_str("|renamed");
        }
    });
    compare(&base, &none)
        .assert()
        .code(3)
        .stdout(predicate::str::contains(note).not());
}

#[test]
fn runs_csv_files_are_accepted_as_arguments() {
    let (code, v) = compare_json(
        &baseline().join("runs.csv"),
        &baseline().join("runs.csv"),
        &[],
    );
    assert_eq!(code, 0);
    assert_eq!(v["baseline"]["has_samples"], true);
}

/// Writes `samples.csv` in `dir`: the repetitions `times` of one case.
fn write_samples(dir: &Path, case_id: &str, times: &[f64]) {
    let mut w = csv::Writer::from_path(dir.join("samples.csv")).unwrap();
    w.write_record(["case_id", "rep", "time_s"]).unwrap();
    for (i, t) in times.iter().enumerate() {
        w.serialize((case_id, i, t)).unwrap();
    }
    w.flush().unwrap();
}

/// The one-case run in `dir` with the timings `times`: its samples, and its row's `reps`
/// and times, as a sweep writes them.
fn set_timings(dir: &Path, times: &[f64]) {
    let mut record = read_records(dir).remove(0);
    let summary = Summary::of(times).unwrap();
    record.reps = times.len();
    record.time_median_s = Some(summary.median);
    record.time_min_s = Some(summary.min);
    record.time_max_s = Some(summary.max);
    record.time_mad_s = Some(summary.mad);
    write_records(dir, std::slice::from_ref(&record));
    write_samples(dir, &record.case_id, times);
}

/// One case from the baseline with hand-made samples: the baseline's, and the current's
/// at exactly 1.1 times them, on the 10% threshold.
fn synthetic_pair(tmp: &Path) -> (PathBuf, PathBuf) {
    let base_samples = [1.0e-3, 1.2e-3, 0.8e-3, 1.1e-3, 0.9e-3, 1.05e-3, 0.95e-3];
    let record = read_records(&baseline()).remove(0);
    let mut dirs = Vec::new();
    for (name, k) in [("base", 1.0), ("cur", 1.1)] {
        let d = tmp.join(name);
        fs::create_dir_all(&d).unwrap();
        write_records(&d, std::slice::from_ref(&record));
        let times: Vec<f64> = base_samples.iter().map(|t| t * k).collect();
        set_timings(&d, &times);
        dirs.push(d);
    }
    (dirs[0].clone(), dirs[1].clone())
}

#[test]
fn unclear_verdicts_exit_4_only_with_fail_on_unclear_and_say_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let (base, cur) = synthetic_pair(tmp.path());
    let (code, v) = compare_json(&base, &cur, &[]);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(time_verdicts(&v), ["unclear"]);
    assert_eq!(v["verdict"], "unclear");
    let (code, _) = compare_json(&base, &cur, &["--fail-on-unclear"]);
    assert_eq!(code, 4);
    compare(&base, &cur).assert().success().stdout(
        predicate::str::contains("Unclear verdicts")
            .and(predicate::str::contains("min_reps"))
            .and(predicate::str::contains("taskset"))
            .and(predicate::str::contains("--normalize calibration")),
    );
    // A wider threshold decides it.
    let (code, v) = compare_json(
        &base,
        &cur,
        &["--time-threshold", "0.5", "--fail-on-unclear"],
    );
    assert_eq!(code, 0);
    assert_eq!(time_verdicts(&v), ["same"]);
}

#[test]
fn without_samples_the_time_verdict_is_unclear_never_same() {
    let tmp = tempfile::tempdir().unwrap();
    let (base, cur) = synthetic_pair(tmp.path());
    fs::remove_file(cur.join("samples.csv")).unwrap();
    let (code, v) = compare_json(&base, &cur, &["--fail-on-unclear"]);
    assert_eq!(code, 4, "{v:#}");
    assert!(v["cases"][0]["time"]["note"]
        .as_str()
        .unwrap()
        .contains("samples.csv"));
}

#[test]
fn samples_of_another_run_are_not_judged() {
    let tmp = tempfile::tempdir().unwrap();
    let (base, cur) = synthetic_pair(tmp.path());
    // The current samples.csv holds 4 timings where its row says 7, as when a runs.csv is
    // paired with the samples of a rerun: 1.5x slower, but not of that row.
    let record = read_records(&cur).remove(0);
    write_samples(&cur, &record.case_id, &[1.5e-3; 4]);
    let (code, v) = compare_json(&base, &cur, &["--fail-on-unclear"]);
    assert_eq!(code, 4, "{v:#}");
    let note = v["cases"][0]["time"]["note"].as_str().unwrap();
    assert!(
        note.contains("4 timings") && note.contains("7 repetitions"),
        "{note}"
    );
    // As many timings as the row's reps, but not the ones its median came from (an older
    // extrapolated row's unscaled part timings): not judged either.
    let median = record.time_median_s.unwrap();
    write_samples(&cur, &record.case_id, &[median / 128.0; 7]);
    let (code, v) = compare_json(&base, &cur, &["--fail-on-unclear"]);
    assert_eq!(code, 4, "{v:#}");
    let note = v["cases"][0]["time"]["note"].as_str().unwrap();
    assert!(
        note.contains("median") && note.contains("not of the same run"),
        "{note}"
    );
    // A copy of runs.csv under another name is read alone: the samples.csv and meta.json
    // beside it are of the directory's runs.csv, whatever the copy holds.
    fs::copy(cur.join("runs.csv"), cur.join("runs_before.csv")).unwrap();
    set_timings(&cur, &[1.0e-3; 7]);
    let out = compare(cur.join("runs_before.csv"), &cur)
        .arg("--json")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["baseline"]["has_samples"], false, "{v:#}");
    assert_eq!(time_verdicts(&v), ["unclear"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("runs_before.csv is not named runs.csv"),
        "{stderr}"
    );
}

#[test]
fn one_timing_a_side_is_unclear_never_slower_or_same() {
    let tmp = tempfile::tempdir().unwrap();
    let (base, cur) = synthetic_pair(tmp.path());
    // One and two repetitions a side: 1.5x slower, and exactly equal.
    for (keep, k) in [(1, 1.5), (2, 1.5), (1, 1.0)] {
        for (dir, f) in [(&base, 1.0), (&cur, k)] {
            set_timings(dir, &vec![1e-3 * f; keep]);
        }
        let (code, v) = compare_json(&base, &cur, &[]);
        assert_eq!(code, 0, "{keep} reps, x{k}: {v:#}");
        assert_eq!(time_verdicts(&v), ["unclear"], "{keep} reps, x{k}");
        let note = v["cases"][0]["time"]["note"].as_str().unwrap().to_string();
        assert!(
            note.contains("too few") && note.contains(&format!("{k:.3}")),
            "{note}"
        );
    }
    // The advice says how to get enough calls.
    compare(&base, &cur)
        .assert()
        .success()
        .stdout(predicate::str::contains("run.max_reps >= 3"));
}

#[test]
fn a_baseline_without_rows_is_an_error_not_a_pass() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("empty");
    fs::create_dir_all(&empty).unwrap();
    let header = fs::read_to_string(baseline().join("runs.csv")).unwrap();
    fs::write(
        empty.join("runs.csv"),
        format!("{}\n", header.lines().next().unwrap()),
    )
    .unwrap();
    for (b, c, role) in [
        (&empty, &baseline(), "baseline"),
        (&baseline(), &empty, "current"),
    ] {
        compare(b, c)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(role).and(predicate::str::contains("no rows")));
    }
}

#[test]
fn another_machine_is_normalized_by_its_calibration() {
    let tmp = tempfile::tempdir().unwrap();
    let cur = tmp.path().join("cur");
    copy_run(&baseline(), &cur);
    // A machine twice as fast: SGEMM rate doubled, every time halved.
    edit_meta(&cur, |m| {
        m["cpu_model"] = "Twice As Fast CPU".into();
        for c in m["calibration"].as_array_mut().unwrap() {
            let g = c["sgemm_gflops"].as_f64().unwrap();
            c["sgemm_gflops"] = (g * 2.0).into();
        }
    });
    edit_samples(&cur, |_, t| t * 0.5);
    let (code, v) = compare_json(&baseline(), &cur, &[]);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["normalize"]["mode"], "calibration");
    assert!(v["normalize"]["why"]
        .as_str()
        .unwrap()
        .contains("Twice As Fast CPU"));
    assert_eq!(v["counts"]["faster"], 0);
    assert!(!timed_cases(&v).is_empty());
    for c in timed_cases(&v) {
        let ratio = c["time"]["interval"]["ratio"].as_f64().unwrap();
        assert!((ratio - 1.0).abs() < 1e-9, "{ratio}");
    }
    // Raw seconds: the fast machine looks faster wherever the baseline pins the time.
    let (_, v) = compare_json(&baseline(), &cur, &["--normalize", "none"]);
    for id in self_consistent_cases() {
        assert_eq!(verdict_of(&v, &id), "faster", "{id}");
    }

    // Different machines and no calibration to normalize with: say how to proceed.
    edit_meta(&cur, |m| m["calibration"] = serde_json::json!([]));
    compare(baseline(), &cur).assert().code(2).stderr(
        predicate::str::contains("meta.json").and(predicate::str::contains("--normalize none")),
    );
}

#[test]
fn a_slow_stretch_of_the_machine_is_divided_out_by_the_case_probe() {
    let tmp = tempfile::tempdir().unwrap();
    let (base, cur) = (tmp.path().join("base"), tmp.path().join("cur"));
    copy_run(&baseline(), &base);
    copy_run(&baseline(), &cur);
    // The same build measured while the machine ran at half speed: every time doubled, and
    // the probe measured with each case says so.
    edit_records(&base, |rs| {
        rs.iter_mut().for_each(|r| r.probe_gflops = Some(50.0))
    });
    edit_records(&cur, |rs| {
        rs.iter_mut().for_each(|r| r.probe_gflops = Some(25.0))
    });
    edit_samples(&cur, |_, t| t * 2.0);
    let (code, v) = compare_json(&base, &cur, &["--normalize", "probe"]);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["normalize"]["mode"], "probe");
    assert_eq!(v["counts"]["regressed"], 0);
    assert!(!timed_cases(&v).is_empty());
    for c in timed_cases(&v) {
        let ratio = c["time"]["interval"]["ratio"].as_f64().unwrap();
        assert!((ratio - 1.0).abs() < 1e-9, "{ratio}");
        assert_eq!(c["time"]["factor"], 0.5);
    }
    // Without the probe the doubled times are regressions.
    let (code, v) = compare_json(&base, &cur, &["--normalize", "none"]);
    assert_eq!(code, 3, "{v:#}");
    for id in self_consistent_cases() {
        assert_eq!(verdict_of(&v, &id), "slower", "{id}");
    }
    // A run without probes (older attnbench): no time verdict, and the note says what to do.
    edit_records(&base, |rs| {
        rs.iter_mut().for_each(|r| r.probe_gflops = None)
    });
    let (code, v) = compare_json(&base, &cur, &["--normalize", "probe", "--fail-on-unclear"]);
    assert_eq!(code, 4, "{v:#}");
    assert!(timed_cases(&v).is_empty());
    let note = v["cases"][0]["time"]["note"].as_str().unwrap();
    assert!(
        note.contains("probe_gflops") && note.contains("--normalize calibration"),
        "{note}"
    );
}

#[test]
fn bad_paths_and_flags_are_usage_errors() {
    let tmp = tempfile::tempdir().unwrap();
    compare(tmp.path().join("nope"), baseline())
        .assert()
        .code(2)
        .stderr(predicate::str::contains("baseline").and(predicate::str::contains("nope")));
    compare(baseline(), tmp.path())
        .assert()
        .code(2)
        .stderr(predicate::str::contains("current").and(predicate::str::contains("no runs.csv")));
    for (flag, value) in [
        ("--time-threshold", "0"),
        ("--time-threshold", "-0.1"),
        ("--err-threshold", "0.5"),
        ("--bootstrap", "10"),
        ("--mem-threshold", "4XB"),
        ("--normalize", "sometimes"),
    ] {
        compare(baseline(), baseline())
            .arg(format!("{flag}={value}"))
            .assert()
            .code(2)
            .stderr(predicate::str::contains(flag));
    }
}

#[test]
fn malformed_files_are_usage_errors_naming_the_file_and_row() {
    let tmp = tempfile::tempdir().unwrap();
    let header = fs::read_to_string(baseline().join("runs.csv"))
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_string();
    let good_rows: Vec<String> = fs::read_to_string(baseline().join("runs.csv"))
        .unwrap()
        .lines()
        .skip(1)
        .take(3)
        .map(str::to_string)
        .collect();
    let reps_col = header.split(',').position(|h| h == "reps").unwrap();
    let mut bad_row: Vec<String> = good_rows[1].split(',').map(str::to_string).collect();
    bad_row[reps_col] = "many".into();
    let cases: Vec<(&str, String, &str, Vec<&str>)> = vec![
        (
            "runs.csv",
            format!("{header}\n{}\n{}\n", good_rows[0], bad_row.join(",")),
            "",
            vec!["runs.csv", "row 3", "`reps`"],
        ),
        (
            "runs.csv",
            format!("{header}\n{}\n{}\n", good_rows[0], good_rows[0]),
            "",
            vec!["runs.csv", "row 3", "already appears in row 2"],
        ),
        (
            "runs.csv",
            format!("{header}\n{}\nshort,row\n", good_rows[0]),
            "",
            vec!["runs.csv", "row 3", "fields"],
        ),
        ("runs.csv", String::new(), "", vec!["runs.csv", "empty"]),
        (
            "runs.csv",
            "a,b,c\n1,2,3\n".into(),
            "",
            vec!["runs.csv", "case_id"],
        ),
        (
            "samples.csv",
            "case_id,rep,time_s\nx,0,0.1\nx,1,slow\n".into(),
            "runs.csv",
            vec!["samples.csv", "row 3", "time_s"],
        ),
        (
            "meta.json",
            "{ not json".into(),
            "runs.csv",
            vec!["meta.json"],
        ),
    ];
    for (i, (file, text, keep_runs, want)) in cases.into_iter().enumerate() {
        let d = tmp.path().join(format!("bad{i}"));
        fs::create_dir_all(&d).unwrap();
        if !keep_runs.is_empty() {
            fs::copy(baseline().join("runs.csv"), d.join("runs.csv")).unwrap();
        }
        fs::write(d.join(file), text).unwrap();
        let mut pred = predicate::str::contains("error: ").boxed();
        for w in want {
            pred = pred.and(predicate::str::contains(w)).boxed();
        }
        compare(baseline(), &d).assert().code(2).stderr(pred);
    }
}

#[test]
fn the_ci_config_runs_every_variant_and_the_baseline_holds_exactly_its_cases() {
    let config =
        attnbench::config::Config::load(&repo().join("configs/ci.toml"), &[]).expect("ci.toml");
    let cases = config.expand();
    let variants: BTreeSet<&str> = cases.iter().map(|c| c.variant.name()).collect();
    // The MPI variants need mpirun: the MPI smoke test (tests/mpi.rs) runs them.
    let all: BTreeSet<&str> = attnbench::problem::VariantId::in_process()
        .map(|v| v.name())
        .collect();
    assert_eq!(
        variants, all,
        "configs/ci.toml must run every in-process variant; after adding one, run scripts/update-baseline.sh"
    );
    // One thread: exact memory gates (README "Comparing runs").
    assert!(cases.iter().all(|c| c.threads == 1));
    let want: BTreeSet<String> = cases.iter().map(|c| c.id()).collect();
    // The baseline measured with the A/B gate's build is the one regenerated last: it holds
    // exactly the config's cases. Another machine's may lag behind a change of the cases
    // (only a session on that machine can measure them): it holds no case the config no
    // longer has, and its missing cases go unjudged there until it is regenerated.
    let rev = fs::read_to_string(repo().join("results/baseline/ci/ab-revision")).unwrap();
    let mut exact = 0;
    for dir in baselines() {
        let meta: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
        let current = meta["git_revision"] == rev.trim();
        exact += usize::from(current);
        check_baseline(&dir, &want, &all, current);
    }
    assert_eq!(
        exact, 1,
        "exactly one committed baseline is measured with results/baseline/ci/ab-revision"
    );
}

/// The A/B gate's baseline build (`results/baseline/ci/ab-revision`) is a full commit hash,
/// and a committed baseline was measured with that very build, clean: the build the time
/// gate runs is the one whose memory and error the baselines hold.
#[test]
fn the_ab_revision_is_the_build_of_a_committed_baseline() {
    let rev = fs::read_to_string(repo().join("results/baseline/ci/ab-revision")).unwrap();
    let rev = rev.trim();
    assert!(
        rev.len() == 40 && rev.chars().all(|c| c.is_ascii_hexdigit()),
        "ab-revision holds a full commit hash, not {rev:?}"
    );
    let measured_with_it = baselines().iter().any(|d| {
        let meta: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(d.join("meta.json")).unwrap()).unwrap();
        meta["git_revision"] == rev && meta["git_dirty"] == false
    });
    assert!(
        measured_with_it,
        "no committed baseline was measured with {rev} (scripts/update-baseline.sh writes both)"
    );
}

/// One committed baseline holds the CI config's cases (all of them when `exact`, else no
/// case the config lacks), each ok or declined by design, with its samples, its
/// calibration, and the machine key (CPU and kernel path) its directory is named after.
fn check_baseline(dir: &Path, want: &BTreeSet<String>, all: &BTreeSet<&str>, exact: bool) {
    let records = read_records(dir);
    let have: BTreeSet<String> = records.iter().map(|r| r.case_id.clone()).collect();
    let stale = || {
        format!(
            "{} is stale for configs/ci.toml: run scripts/update-baseline.sh on a machine of \
             that kernel path and commit the baseline on its own",
            dir.display()
        )
    };
    if exact {
        assert_eq!(&have, want, "{}", stale());
    } else {
        let gone: Vec<&String> = have.difference(want).collect();
        assert!(
            gone.is_empty(),
            "{}: it has cases no longer run: {gone:?}",
            stale()
        );
    }
    // A lagging baseline has no rows of the variants added after it.
    let measured: BTreeSet<&str> = records.iter().map(|r| r.variant.as_str()).collect();
    let all: &BTreeSet<&str> = &if exact {
        all.clone()
    } else {
        all.intersection(&measured).copied().collect()
    };
    // Every case runs or is a combination its variant declines by design (a mode it lacks,
    // a device count it does not use); and every variant, and every mode, has cases that run.
    for r in &records {
        let by_design = r.status == Status::Skipped && r.reason.starts_with("variant ");
        assert!(
            r.status == Status::Ok || by_design,
            "{}: {} {}",
            r.case_id,
            r.status,
            r.reason
        );
    }
    for v in all {
        assert!(
            records
                .iter()
                .any(|r| r.variant == *v && r.status == Status::Ok),
            "no ok case of {v} in {}",
            dir.display()
        );
    }
    for mode in ["fwd", "fwd+bwd", "decode"] {
        let runs = records
            .iter()
            .any(|r| r.mode == mode && r.status == Status::Ok);
        assert!(runs, "no ok {mode} case in {}", dir.display());
    }
    let samples = attnbench::results::samples::read_samples(&dir.join("samples.csv"))
        .expect("baseline samples");
    for r in records.iter().filter(|r| r.status == Status::Ok) {
        assert_eq!(samples[&r.case_id].len(), r.reps, "{}", r.case_id);
    }
    let meta: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
    assert!(!meta["calibration"].as_array().unwrap().is_empty());
    let path = meta["cpu_kernel_path"]
        .as_str()
        .or_else(|| meta["calibration"][0]["kernel_isa"].as_str())
        .expect("the baseline records its kernel path");
    let key = attnbench::results::meta::machine_key_of(meta["cpu_id"].as_str(), path);
    assert_eq!(
        Some(key.as_str()),
        dir.file_name().and_then(|n| n.to_str()),
        "{}: a baseline lives in the directory named after its machine key",
        dir.display()
    );
}

const TINY: &str = r#"
[run]
name = "tiny"
warmup = 0
min_reps = 3
max_reps = 4
max_time_s = 0.05
calibrate = false

[axes]
variant = ["naive", "flash"]
seq_len = [16, 33]
heads = [2]
kv_heads = [2, 4]
head_dim = [8]
threads = [1]
"#;

#[test]
fn the_sweep_writes_samples_for_every_ok_case_and_resume_and_force_keep_them_consistent() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("c.toml");
    fs::write(&cfg, TINY).unwrap();
    let out = tmp.path().join("res");
    let sweep = |extra: &[&str]| {
        attnbench()
            .args(["sweep", "--config"])
            .arg(&cfg)
            .arg("--out")
            .arg(&out)
            .args(extra)
            .assert()
            .success();
    };
    let check = || {
        let records = read_records(&out);
        let samples = attnbench::results::samples::read_samples(&out.join("samples.csv")).unwrap();
        let rows = fs::read_to_string(out.join("samples.csv"))
            .unwrap()
            .lines()
            .count()
            - 1;
        let ok: Vec<&Record> = records.iter().filter(|r| r.status == Status::Ok).collect();
        assert_eq!(ok.len(), 4);
        assert_eq!(rows, ok.iter().map(|r| r.reps).sum::<usize>());
        for r in &ok {
            let s = &samples[&r.case_id];
            assert_eq!(s.len(), r.reps);
            let mut sorted = s.clone();
            sorted.sort_by(f64::total_cmp);
            assert_eq!(sorted[0], r.time_min_s.unwrap());
        }
        // Skipped cases have no samples.
        assert_eq!(samples.len(), 4);
    };
    sweep(&[]);
    check();
    sweep(&["--resume"]);
    check();
    sweep(&["--force"]);
    check();
    let (code, v) = compare_json(&out, &out, &[]);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["counts"]["matched"], 8);
}
