//! The sliding window in prefill through the CLI: flash and naive run it forward and
//! backward, with FLOPs of the attended pairs only and gradients checked; a variant whose
//! backward has no window, or which takes none, cannot run the case (exit 2 with the
//! reason); a window of 0 is bad input naming the key, never a panic.

mod common;

use common::attnbench;
use predicates::prelude::*;
use std::fs;

/// (query, key) pairs of a causal self-attention of n tokens, each row seeing the last
/// `w` keys up to itself: sum over rows i of min(i + 1, w).
fn causal_window_pairs(n: u64, w: u64) -> u64 {
    (0..n).map(|i| (i + 1).min(w)).sum()
}

fn run_json(args: &[&str]) -> serde_json::Value {
    let out = attnbench()
        .args([
            "run",
            "--json",
            "--threads",
            "2",
            "-d",
            "16",
            "--heads",
            "2",
        ])
        .args(args)
        .assert()
        .success();
    serde_json::from_slice(&out.get_output().stdout).expect("run --json prints one object")
}

#[test]
fn flash_and_naive_run_a_window_forward_and_backward_with_the_pairs_flops() {
    let (n, w) = (100u64, 7u64);
    for variant in ["flash", "naive"] {
        for (mode, factor) in [("fwd", 1.0), ("fwd+bwd", 3.5)] {
            let row = run_json(&[
                "--variant",
                variant,
                "--mode",
                mode,
                "-n",
                "100",
                "--causal",
                "--window",
                "7",
            ]);
            assert_eq!(row["status"], "ok", "{variant} {mode}: {}", row["reason"]);
            assert_eq!(row["window"], 7);
            let want = factor * 4.0 * 2.0 * causal_window_pairs(n, w) as f64 * 16.0;
            assert_eq!(row["flops"].as_f64(), Some(want), "{variant} {mode}");
            let err = row["max_abs_err"].as_f64().expect("error checked");
            assert!(err <= 1e-5, "{variant} {mode}: error {err:e}");
            if mode == "fwd+bwd" {
                let g = row["grad_max_rel_err"].as_f64().expect("gradients checked");
                assert!(g <= 1e-4, "{variant}: gradient error {g:e}");
            }
        }
    }
}

#[test]
fn variants_without_a_window_cannot_run_one() {
    for (variant, mode, why) in [
        ("rabe-staats", "fwd+bwd", "no sliding-window backward"),
        ("chunked-prefill", "fwd", "no sliding-window support"),
        ("flash-varlen", "fwd", "no sliding-window support"),
    ] {
        attnbench()
            .args([
                "run",
                "--variant",
                variant,
                "--mode",
                mode,
                "-n",
                "64",
                "-d",
                "8",
            ])
            .args(["--causal", "--window", "5"])
            .assert()
            .code(2)
            .stderr(predicate::str::contains(why));
    }
}

#[test]
fn a_window_of_zero_is_bad_input_naming_the_key() {
    attnbench()
        .args(["run", "--variant", "flash", "-n", "64", "--window", "0"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--window"));
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("c.toml");
    fs::write(
        &cfg,
        "[run]\nname = \"w\"\n[axes]\nvariant = \"flash\"\nseq_len = 64\nwindow = 0\n",
    )
    .unwrap();
    attnbench()
        .args(["sweep", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(tmp.path().join("o"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("axes.window"));
}

/// Attention sinks through the CLI: flash (forward and backward) and the decode variants
/// that take them count the sinks' pairs in `flops` and read their keys once
/// (`kv_read_bytes`), checked against the oracle; the case id and row carry them.
#[test]
fn sinks_beside_a_window_count_their_pairs_and_bytes() {
    // Causal, n = 100, window 7, 3 sinks: row i sees min(i + 1, 7) window keys and
    // min(3, max(i + 1 - 7, 0)) sinks.
    let n = 100u64;
    let sink_pairs: u64 = (0..n).map(|i| (i + 1).saturating_sub(7).min(3)).sum();
    for mode in ["fwd", "fwd+bwd"] {
        let row = run_json(&[
            "--variant",
            "flash",
            "--mode",
            mode,
            "-n",
            "100",
            "--causal",
            "--window",
            "7",
            "--sinks",
            "3",
        ]);
        assert_eq!(row["status"], "ok", "{mode}: {}", row["reason"]);
        assert_eq!(row["sinks"], 3);
        assert!(row["case_id"].as_str().unwrap_or("").ends_with("|sk3"));
        let factor = if mode == "fwd" { 1.0 } else { 3.5 };
        let pairs = causal_window_pairs(n, 7) + sink_pairs;
        let want = factor * 4.0 * 2.0 * pairs as f64 * 16.0;
        assert_eq!(row["flops"].as_f64(), Some(want), "{mode}");
        assert!(row["max_abs_err"].as_f64().expect("checked") <= 1e-5);
    }
    // One new token over 500 cached keys, window 50, 4 sinks: 54 keys of K and V (f32,
    // d = 16) per KV head.
    for variant in ["flash-decoding", "decode-online"] {
        let row = run_json(&[
            "--variant",
            variant,
            "--mode",
            "decode",
            "-n",
            "1",
            "--seq-kv",
            "500",
            "--window",
            "50",
            "--sinks",
            "4",
        ]);
        assert_eq!(row["status"], "ok", "{variant}: {}", row["reason"]);
        assert_eq!(row["kv_read_bytes"], 2 * 2 * 54 * 16 * 4, "{variant}");
        assert!(row["max_abs_err"].as_f64().expect("checked") <= 1e-5);
    }
}

/// Bad sinks: without a window, more than the context, 0, or on a variant that takes none:
/// exit 2 naming the key or the variants that take them, never a panic; in a sweep, sinks
/// past a case's context are a skipped row with the reason.
#[test]
fn bad_sinks_are_refused_naming_the_key() {
    let base = ["run", "--variant", "flash", "-n", "64", "-d", "8"];
    for (extra, why) in [
        (
            &["--sinks", "2"][..],
            "sinks (2) are the first keys a sliding window",
        ),
        (
            &["--window", "8", "--sinks", "65"][..],
            "sinks (65) are more than the context's tokens (seq_kv = 64)",
        ),
        (
            &["--window", "8", "--sinks", "0"][..],
            "--sinks must be at least 1",
        ),
    ] {
        attnbench()
            .args(base)
            .args(extra)
            .assert()
            .code(2)
            .stdout(predicate::str::is_empty())
            .stderr(predicate::str::contains(why));
    }
    attnbench()
        .args(["run", "--variant", "naive", "-n", "64", "-d", "8"])
        .args(["--window", "8", "--sinks", "2"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "variant naive has no attention sinks: sinks apply to flash",
        ));
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("c.toml");
    fs::write(
        &cfg,
        "[run]\nname = \"s\"\nmin_reps = 1\nmax_reps = 1\nwarmup = 0\n[axes]\n\
         variant = \"flash\"\nhead_dim = 8\nseq_len = [16, 64]\nwindow = 4\nsinks = 32\n",
    )
    .unwrap();
    let out = tmp.path().join("o");
    common::sweep(&cfg, &out, &[]);
    let (rows, col) = common::runs(&out);
    let status: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (&r[col("status")], &r[col("reason")]))
        .collect();
    assert_eq!(status.len(), 2);
    assert_eq!(status[1].0, "ok");
    assert_eq!(status[0].0, "skipped");
    assert!(
        status[0].1.contains("sinks (32) are more than"),
        "{status:?}"
    );
    fs::write(
        &cfg,
        "[run]\nname = \"s\"\n[axes]\nvariant = \"flash\"\nseq_len = 64\nwindow = 4\nsinks = 0\n",
    )
    .unwrap();
    attnbench()
        .args(["sweep", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(tmp.path().join("o2"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("axes.sinks"));
}
