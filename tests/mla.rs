//! Multi-head latent attention from the command line: bad MLA keys are exit 2 naming the
//! key (config and `run` flags), never a panic; a sweep times mla-decode and flash-decoding
//! of the same shape in one interleave group, each on its own inputs, writes the MLA
//! columns and ids, and `decode.md` gains its MLA section.

use predicates::prelude::*;
use std::fs;

mod common;
use common::attnbench;

const MLA: &str = r#"
[run]
name = "mla"
warmup = 0
min_reps = 2
max_reps = 2
max_time_s = 0.5
calibrate = false
interleave = true
innermost = ["variant"]

[axes]
variant = ["mla-decode", "flash-decoding"]
mode = "decode"
batch = 2
heads = 4
head_dim = 16
seq_kv = 300
latent_dim = 32
rope_dim = 8
"#;

#[test]
fn bad_mla_keys_exit_2_and_name_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("c.toml");
    for (text, key, why) in [
        (
            MLA.replace("latent_dim = 32", "latent_dim = 0"),
            "axes.latent_dim",
            "",
        ),
        (
            MLA.replace("rope_dim = 8", "rope_dim = 0"),
            "axes.rope_dim",
            "",
        ),
        (
            MLA.replace("\"mla-decode\", ", ""),
            "axes.latent_dim",
            "no variant of the grid reads an MLA cache",
        ),
        (
            MLA.replace("latent_dim = 32\nrope_dim = 8\n", ""),
            "axes.latent_dim",
            "required by mla-decode",
        ),
        (
            MLA.replace("rope_dim = 8\n", ""),
            "axes.latent_dim",
            "needs rope_dim",
        ),
    ] {
        fs::write(&cfg, &text).unwrap();
        attnbench()
            .args(["sweep", "--dry-run", "--config"])
            .arg(&cfg)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(key).and(predicate::str::contains(why)));
    }
    let run = |extra: &[&str]| {
        let mut c = attnbench();
        c.args([
            "run",
            "--mode",
            "decode",
            "--seq-len",
            "1",
            "--seq-kv",
            "64",
            "--heads",
            "2",
            "--head-dim",
            "8",
            "--threads",
            "1",
            "--max-time-s",
            "0.1",
        ])
        .args(extra);
        c
    };
    for (extra, says) in [
        (
            &[
                "--variant",
                "flash-decoding",
                "--latent-dim",
                "32",
                "--rope-dim",
                "8",
            ][..],
            "mla-decode only",
        ),
        (&["--variant", "mla-decode"][..], "required by mla-decode"),
        (
            &[
                "--variant",
                "mla-decode",
                "--latent-dim",
                "0",
                "--rope-dim",
                "8",
            ][..],
            "--latent-dim must be at least 1",
        ),
        (
            &[
                "--variant",
                "mla-decode",
                "--latent-dim",
                "32",
                "--rope-dim",
                "0",
            ][..],
            "--rope-dim must be at least 1",
        ),
        (
            &["--variant", "mla-decode", "--latent-dim", "32"][..],
            "--latent-dim needs --rope-dim",
        ),
    ] {
        run(extra)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(says));
    }
    run(&[
        "--variant",
        "mla-decode",
        "--latent-dim",
        "32",
        "--rope-dim",
        "8",
    ])
    .assert()
    .success()
    .stdout(predicate::str::contains(
        "latent 32 + RoPE 8 = 40 values a token",
    ));
}

#[test]
fn a_sweep_runs_mla_beside_flash_decoding_and_reports_bytes_per_token() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("c.toml");
    fs::write(&cfg, MLA).unwrap();
    let out = tmp.path().join("res");
    common::sweep(&cfg, &out, &[]);
    let (rows, col) = common::runs(&out);
    assert_eq!(rows.len(), 2);
    for row in &rows {
        assert_eq!(&row[col("status")], "ok", "{}", &row[col("reason")]);
        let err: f64 = row[col("max_abs_err")].parse().unwrap();
        assert!(err <= 1e-5, "{}: {err}", &row[col("variant")]);
    }
    let mla = rows
        .iter()
        .find(|r| &r[col("variant")] == "mla-decode")
        .unwrap();
    assert!(mla[col("case_id")].ends_with("|mla32r8"));
    assert_eq!(&mla[col("latent_dim")], "32");
    assert_eq!(&mla[col("rope_dim")], "8");
    // b n (d_c + d_r) f32 values.
    assert_eq!(&mla[col("kv_read_bytes")], &(2 * 300 * 40 * 4).to_string());
    let fd = rows
        .iter()
        .find(|r| &r[col("variant")] == "flash-decoding")
        .unwrap();
    assert_eq!(&fd[col("latent_dim")], "");
    assert!(!fd[col("case_id")].contains("mla"));
    let md = fs::read_to_string(out.join("decode.md")).unwrap();
    let section = md
        .split("## MLA: mla-decode against MHA and GQA caches")
        .nth(1)
        .expect("an MLA section");
    // 160 bytes a token against MHA's 2 x 4 x 16 x 4 = 512: 3.2x.
    assert!(section.contains("| 32 + 8 |"), "{section}");
    assert!(section.contains("| 160 | 3.2x |"), "{section}");
}
