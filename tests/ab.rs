//! `attnbench ab` and `attnbench worker` end to end: the worker protocol over real pipes, the
//! paired verdicts (a baseline made faster by a known factor makes the current build
//! `slower`, exit 3; the same build against itself passes), and what happens when the
//! baseline refuses a case or dies.

use assert_cmd::Command;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

fn bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin("attnbench")
}

fn proxy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/scaled_worker.py")
}

const SMALL: &str = r#"
[run]
name = "ab-test"
warmup = 1
max_reps = 200
memory_budget = "1GiB"
error_rows = 16
threads = 1
calibrate = false

[axes]
variant = ["naive", "flash", "rabe-staats"]
seq_len = [16, 40]
heads = [2]
head_dim = [16]
causal = [false, true]
"#;

/// Runs `ab` on SMALL with the proxy as baseline (configured by `env`) and more `args`, and
/// returns the exit code and the rows of ab_cases.csv and ab_groups.csv. CI's machine is
/// shared: the tests that expect no verdict from timing noise ask for a 2x change
/// (`--time-threshold 1`), which noise shared by a round cannot fake.
fn ab(
    dir: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (i32, Vec<csv::StringRecord>, Vec<csv::StringRecord>) {
    // One A/B run at a time: four at once on a 2-core machine leave each worker's blocks
    // preempted at random, which is noise no design should be asked to see through.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let config = dir.join("small.toml");
    fs::write(&config, SMALL).unwrap();
    let out = dir.join("ab");
    let mut cmd = Command::new(bin());
    cmd.arg("ab");
    // 2 ms blocks keep the runs short; a test that reads a ratio asks for longer ones.
    if !args.contains(&"--block-s") {
        cmd.args(["--block-s", "0.002"]);
    }
    cmd.arg("--baseline")
        .arg(proxy())
        .arg("--config")
        .arg(&config)
        .arg("--out")
        .arg(&out)
        .args(args)
        .env("ATTNBENCH_BIN", bin());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().unwrap();
    let code = o.status.code().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(code == 0 || code == 3, "exit {code}\n{stdout}\n{stderr}");
    assert!(stdout.contains("**Verdict: "), "{stdout}");
    assert_eq!(
        fs::read_to_string(out.join("ab.md")).unwrap(),
        stdout,
        "ab.md is what was printed"
    );
    let rows = |f: &str| -> Vec<csv::StringRecord> {
        csv::Reader::from_path(out.join(f))
            .unwrap()
            .records()
            .map(|r| r.unwrap())
            .collect()
    };
    (code, rows("ab_cases.csv"), rows("ab_groups.csv"))
}

/// (kernel, verdict, ratio) of each kernel row.
fn kernels(groups: &[csv::StringRecord]) -> Vec<(String, String, f64)> {
    groups
        .iter()
        .map(|g| (g[0].to_string(), g[1].to_string(), g[3].parse().unwrap()))
        .collect()
}

#[test]
fn the_same_build_on_both_sides_passes_and_every_case_is_judged() {
    let dir = tempfile::tempdir().unwrap();
    let (code, cases, groups) = ab(dir.path(), &["--rounds", "5", "--time-threshold", "1"], &[]);
    assert_eq!(code, 0);
    // 3 variants x 2 lengths x 2 masks, all run by both sides.
    assert_eq!(cases.len(), 12);
    assert!(
        cases.iter().all(|c| &c[2] == "ok" && &c[3] == "5"),
        "{cases:?}"
    );
    // Both sides computed the same thing: the same memory and the same error.
    for c in &cases {
        assert_eq!(c[7], c[8], "memory of {}", &c[0]);
        assert_eq!(c[9], c[10], "error of {}", &c[0]);
    }
    let k = kernels(&groups);
    assert_eq!(k.len(), 3, "{k:?}");
    assert!(k.iter().all(|(_, v, _)| v != "slower"), "{k:?}");
}

#[test]
fn a_baseline_faster_by_a_known_factor_makes_every_kernel_slower() {
    let dir = tempfile::tempdir().unwrap();
    // Baseline samples x 0.5: the current build looks 2x slower, whatever the machine does.
    // 15 rounds: each round is a fresh pair of processes, and a process alone can run a case
    // up to 1.2x off (README, "Timing two builds in one run"); the ratio's check needs the
    // median of more of them than the verdict does. Blocks of 10 ms: at 2 ms a busy 2-core
    // host preempting one block in a few moved the ratio to 2.46 and 3.06 (2 of 3 runs of
    // this file on 2026-11-27), noise that longer blocks average out.
    let (code, _, groups) = ab(
        dir.path(),
        &["--rounds", "15", "--block-s", "0.01"],
        &[("SCALED_WORKER_SCALE", "0.5")],
    );
    assert_eq!(code, 3);
    for (kernel, verdict, ratio) in kernels(&groups) {
        assert_eq!(verdict, "slower", "{kernel}");
        assert!((ratio - 2.0).abs() < 0.4, "{kernel}: {ratio}");
    }
}

#[test]
fn cases_the_baseline_refuses_are_not_judged_and_a_lost_worker_is_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let (code, cases, groups) = ab(
        dir.path(),
        &["--rounds", "5", "--time-threshold", "1"],
        &[
            ("SCALED_WORKER_REFUSE", "flash"),
            ("SCALED_WORKER_DIE_ON", "rabe-staats"),
        ],
    );
    assert_eq!(code, 0);
    for c in &cases {
        match &c[0] {
            id if id.starts_with("flash|") => {
                assert!(c[2].starts_with("baseline: unknown variant"), "{:?}", c)
            }
            id if id.starts_with("rabe-staats|") => {
                assert!(c[2].starts_with("baseline: the baseline worker"), "{:?}", c)
            }
            _ => assert_eq!(&c[2], "ok", "{c:?}"),
        }
    }
    // Only naive is left to judge; the restarted worker served it.
    let k = kernels(&groups);
    assert_eq!(k.len(), 1, "{k:?}");
    assert!(k[0].0.starts_with("naive "));
}

#[test]
fn bad_arguments_exit_2_naming_the_flag() {
    let ab = |extra: &[&str]| {
        let mut cmd = Command::new(bin());
        cmd.args(["ab", "--config", "configs/ci.toml", "--baseline"])
            .args(extra);
        cmd
    };
    for (flag, value) in [
        ("--rounds", "1"),
        ("--worker-timeout-s", "inf"),
        ("--worker-timeout-s", "0"),
    ] {
        ab(&["/nonexistent", flag, value])
            .assert()
            .code(2)
            .stderr(predicates::str::contains(flag));
    }
    let o = ab(&["/nonexistent/attnbench"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/attnbench"));
}

#[test]
fn a_worker_answers_hello_and_exits_when_stdin_closes() {
    let o = Command::new(bin())
        .arg("worker")
        .write_stdin("{\"op\":\"hello\",\"protocol\":1}\n")
        .output()
        .unwrap();
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["protocol"], 1);
    assert_eq!(
        v["cpu_kernel_path"],
        attnbench::backend::cpu::isa::Isa::detect().name()
    );
}
