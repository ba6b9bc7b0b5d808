//! The contract the peer scripts (scripts/peers/) rely on: their CSV headers are attnbench's,
//! `sweep --dry-run --json` lists every case with its case_id, flops and io_bytes, and the
//! samples they write (scripts/peers/results.py) let `compare` judge peer rows like its own.

use assert_cmd::Command;
use std::collections::HashMap;
use std::fs;
use std::path::Path;

mod common;
use common::{attnbench, compare_json, copy_run, repo};

/// The columns the dry-run's first line hands the peers: the record's and samples.csv's
/// headers, in order; the peers' writer keeps no copy of them.
#[test]
fn peers_take_attnbench_columns_from_the_dry_run() {
    let first: serde_json::Value = serde_json::from_slice(
        dry_run()
            .split(|b| *b == b'\n')
            .next()
            .expect("a first line"),
    )
    .expect("JSON");
    let list = |name: &str| -> Vec<String> {
        first["columns"][name]
            .as_array()
            .unwrap_or_else(|| panic!("columns of {name}"))
            .iter()
            .map(|v| v.as_str().expect("a name").to_string())
            .collect()
    };
    assert_eq!(list("runs.csv"), attnbench::results::record::header());
    assert_eq!(list("samples.csv"), attnbench::results::samples::HEADER);
    let writer =
        fs::read_to_string(repo().join("scripts/peers/results.py")).expect("results.py exists");
    assert!(
        !writer.contains("\"time_median_s\",") && !writer.contains("HEADER = ["),
        "scripts/peers/results.py keeps a copy of the columns"
    );
}

#[test]
fn dry_run_json_lists_the_config_then_every_case() {
    let out = Command::cargo_bin("attnbench")
        .expect("binary built")
        .args([
            "sweep",
            "--config",
            "configs/quick.toml",
            "--dry-run",
            "--json",
        ])
        .output()
        .expect("runs");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines[0]["config"]["run"]["name"], "quick");
    // configs/quick.toml: 5 variants x 2 dtypes x 2 kv_heads x 3 lengths x 2 causal.
    assert_eq!(lines.len(), 1 + 120);
    let first = &lines[1];
    let id = first["case_id"].as_str().expect("case_id");
    assert!(id.starts_with("naive|fwd|cpu|f32|"), "{id}");
    assert!(first["flops"].as_f64().expect("flops") > 0.0);
    assert!(first["io_bytes"].as_u64().expect("io_bytes") > 0);
    assert_eq!(first["case"]["shape"]["head_dim"], 64);
}

/// `attnbench sweep --dry-run --json` of configs/quick.toml: the cases a peer reads.
fn dry_run() -> Vec<u8> {
    let out = attnbench()
        .args(["sweep", "--config"])
        .arg(repo().join("configs/quick.toml"))
        .args(["--dry-run", "--json"])
        .output()
        .expect("runs");
    assert!(out.status.success(), "{out:?}");
    out.stdout
}

/// Python 3 (standard library only) with scripts/peers/ importable, leaving no bytecode in
/// the tree.
fn python() -> Command {
    let mut c = Command::new("python3");
    c.env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONPATH", repo().join("scripts/peers"));
    c
}

/// tests/fixtures/peer_results.py: writes a peer's rows and samples into `out` through
/// scripts/peers/results.py. Returns its output.
fn write_peer_run(out: &Path, extra: &[&str]) -> std::process::Output {
    python()
        .arg(repo().join("tests/fixtures/peer_results.py"))
        .arg(out)
        .args(extra)
        .write_stdin(dry_run())
        .output()
        .expect("python3 runs")
}

/// The case ids the fixture wrote, in order (timed flash, timed math, skipped JAX).
fn written_ids(out: &std::process::Output) -> Vec<String> {
    assert!(
        out.status.success(),
        "peer writer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// samples.csv as attnbench reads it: per case, its timings (the last run of a case).
fn read_samples(dir: &Path) -> HashMap<String, Vec<f64>> {
    attnbench::results::samples::read_samples(&dir.join("samples.csv")).expect("samples.csv reads")
}

/// Makes case `id` of the run in `dir` `k` times slower: its samples and its row's time
/// columns times `k` (GFLOP/s divided by `k`), every other field and row as written.
fn slow_down(dir: &Path, id: &str, k: f64) {
    let scale = |field: &str, by: f64| -> String {
        if field.is_empty() {
            String::new()
        } else {
            (field.parse::<f64>().expect("a number") * by).to_string()
        }
    };
    let p = dir.join("samples.csv");
    let mut r = csv::Reader::from_path(&p).unwrap();
    let header = r.headers().unwrap().clone();
    let rows: Vec<csv::StringRecord> = r.records().map(Result::unwrap).collect();
    let mut w = csv::Writer::from_path(&p).unwrap();
    w.write_record(&header).unwrap();
    let mut scaled = 0;
    for row in rows {
        if &row[0] == id {
            scaled += 1;
            w.write_record([&row[0], &row[1], &scale(&row[2], k)])
                .unwrap();
        } else {
            w.write_record(&row).unwrap();
        }
    }
    w.flush().unwrap();
    assert!(scaled > 0, "no samples of {id}");

    let p = dir.join("runs.csv");
    let mut r = csv::Reader::from_path(&p).unwrap();
    let header = r.headers().unwrap().clone();
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let times = [
        "time_median_s",
        "time_min_s",
        "time_max_s",
        "time_mad_s",
        "time_bwd_median_s",
    ]
    .map(col);
    let (id_col, gflops) = (col("case_id"), col("gflops"));
    let rows: Vec<csv::StringRecord> = r.records().map(Result::unwrap).collect();
    let mut w = csv::Writer::from_path(&p).unwrap();
    w.write_record(&header).unwrap();
    for row in rows {
        let mut fields: Vec<String> = row.iter().map(str::to_string).collect();
        if fields[id_col] == id {
            for &c in &times {
                fields[c] = scale(&fields[c], k);
            }
            fields[gflops] = scale(&fields[gflops], 1.0 / k);
        }
        w.write_record(&fields).unwrap();
    }
    w.flush().unwrap();
}

/// The comparison of case `id` in a `compare --json` report.
fn case<'a>(v: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["case_id"] == id)
        .unwrap_or_else(|| panic!("{id} not compared: {v:#}"))
}

fn verdict<'a>(v: &'a serde_json::Value, id: &str) -> &'a str {
    case(v, id)["time"]["verdict"].as_str().unwrap_or("none")
}

#[test]
fn a_peer_row_made_2x_slower_is_judged_slower_with_exit_3() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let ids = written_ids(&write_peer_run(&base, &[]));
    let [flash, math, jax] = <[String; 3]>::try_from(ids).unwrap();

    // The peer wrote attnbench's samples.csv: one header, a timed row's every repetition
    // (as many as its reps, of its median), none for the skipped row.
    let text = fs::read_to_string(base.join("samples.csv")).unwrap();
    assert!(text.starts_with("case_id,rep,time_s\n"), "{text}");
    assert_eq!(text.matches("case_id").count(), 1);
    let samples = read_samples(&base);
    assert_eq!(samples[&flash].len(), 30);
    assert_eq!(samples[&math].len(), 30);
    assert!(!samples.contains_key(&jax));

    // An unchanged copy: both timed peer cases are `same`, not `unclear`.
    let same = tmp.path().join("same");
    copy_run(&base, &same);
    let (code, v) = compare_json(&base, &same, &[]);
    assert_eq!(code, 0, "{v:#}");
    for id in [&flash, &math] {
        assert_eq!(verdict(&v, id), "same", "{id}: {:#}", case(&v, id));
        assert_eq!(case(&v, id)["time"]["baseline_reps"], 30);
        assert_eq!(case(&v, id)["time"]["current_reps"], 30);
    }
    assert_eq!(verdict(&v, &jax), "none");
    assert_eq!(v["counts"]["unclear"], 0, "{v:#}");

    // The flash row and its samples twice as slow: a regression; math is untouched.
    let slow = tmp.path().join("slow");
    copy_run(&base, &slow);
    slow_down(&slow, &flash, 2.0);
    let (code, v) = compare_json(&base, &slow, &[]);
    assert_eq!(code, 3, "{v:#}");
    assert_eq!(v["verdict"], "regression");
    let c = case(&v, &flash);
    assert_eq!(verdict(&v, &flash), "slower", "{c:#}");
    assert_eq!(c["regressions"], serde_json::json!(["slower"]));
    let ratio = c["time"]["interval"]["ratio"].as_f64().unwrap();
    assert!((ratio - 2.0).abs() < 1e-9, "{ratio}");
    assert!(c["time"]["interval"]["lo"].as_f64().unwrap() > 1.1, "{c:#}");
    assert_eq!(verdict(&v, &math), "same", "{:#}", case(&v, &math));
    assert!(case(&v, &math)["regressions"]
        .as_array()
        .unwrap()
        .is_empty());
}

#[test]
fn a_crash_between_samples_and_row_resumes_to_a_judged_case() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("crashed");
    // Killed inside the math row's write: its samples are on disk, its row is not.
    let out = write_peer_run(&dir, &["--crash-before-row", "torch-sdpa-math"]);
    assert_eq!(out.status.code(), Some(9), "{out:?}");
    let ids: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let flash = ids[0].clone();
    let math = flash.replacen("torch-sdpa-flash", "torch-sdpa-math", 1);
    let rows = attnbench::results::runs::read(&dir.join("runs.csv")).unwrap();
    assert_eq!(
        rows.iter().map(|r| r.case_id.as_str()).collect::<Vec<_>>(),
        [flash.as_str()]
    );
    let samples = read_samples(&dir);
    assert_eq!(samples[&flash].len(), 30);
    assert_eq!(samples[&math].len(), 15, "the samples come before the row");

    // --resume runs the case without a row again; its new samples replace the old ones.
    let resumed = written_ids(&write_peer_run(&dir, &["--resume"]));
    assert_eq!(resumed[0], math);
    let text = fs::read_to_string(dir.join("samples.csv")).unwrap();
    assert_eq!(text.matches("case_id").count(), 1, "appended, one header");
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with(&format!("{math},")))
            .count(),
        45
    );
    let text = fs::read_to_string(dir.join("runs.csv")).unwrap();
    assert_eq!(text.matches("case_id").count(), 1, "appended, one header");
    assert_eq!(read_samples(&dir)[&math].len(), 30);

    // The resumed run is judged like one that never crashed (the same seeded timings).
    let clean = tmp.path().join("clean");
    written_ids(&write_peer_run(&clean, &[]));
    let (code, v) = compare_json(&clean, &dir, &[]);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(verdict(&v, &flash), "same", "{:#}", case(&v, &flash));
    assert_eq!(verdict(&v, &math), "same", "{:#}", case(&v, &math));
    assert_eq!(case(&v, &math)["time"]["interval"]["ratio"], 1.0);
}

/// Opens the peers' writer on `dir` (as every peer does first).
fn open_writer(dir: &Path) -> std::process::Output {
    python()
        .args([
            "-c",
            "import json, sys, results; \
             results.ResultsOut(sys.argv[1], json.loads(sys.stdin.readline())[\"columns\"]).close()",
        ])
        .arg(dir)
        .write_stdin(dry_run())
        .output()
        .expect("python3 runs")
}

#[test]
fn the_writer_refuses_a_samples_or_runs_csv_of_another_header() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let foreign = "case,rep,seconds\nx,0,1.0\n";
    fs::write(dir.join("samples.csv"), foreign).unwrap();
    let out = open_writer(dir);
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    let path = dir.join("samples.csv").display().to_string();
    assert!(err.contains(&path) && err.contains("header"), "{err}");
    assert!(err.contains("case_id,rep,time_s"), "{err}");
    // Refused before anything is written: the file as it was, no runs.csv either.
    assert_eq!(
        fs::read_to_string(dir.join("samples.csv")).unwrap(),
        foreign
    );
    assert!(!dir.join("runs.csv").exists());

    // A runs.csv of another header is refused the same way, before samples.csv is made.
    fs::remove_file(dir.join("samples.csv")).unwrap();
    fs::write(dir.join("runs.csv"), "run,case_id\nq,x\n").unwrap();
    let out = open_writer(dir);
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    let path = dir.join("runs.csv").display().to_string();
    assert!(err.contains(&path) && err.contains("header"), "{err}");
    assert!(!dir.join("samples.csv").exists());

    // attnbench's own headers are accepted, and nothing is added to them.
    fs::write(
        dir.join("runs.csv"),
        attnbench::results::record::header().join(",") + "\n",
    )
    .unwrap();
    fs::write(dir.join("samples.csv"), "case_id,rep,time_s\n").unwrap();
    let out = open_writer(dir);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        fs::read_to_string(dir.join("samples.csv")).unwrap(),
        "case_id,rep,time_s\n"
    );
}
