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
