//! `run.interleave` end to end: an interleaved sweep writes the same rows as the sequential
//! one (same cases in the same order, the same errors, memory measured cold, the stopping
//! rule's repetitions and their samples), and `--resume` continues it.

use assert_cmd::Command;
use std::collections::HashMap;
use std::fs;
use std::path::Path;

const CONFIG: &str = r#"
[run]
name = "interleave"
warmup = 1
min_reps = 2
max_reps = 4
max_time_s = 0.2
calibrate = false
innermost = ["threads", "variant"]

[axes]
variant = ["naive", "rabe-staats", "flash"]
seq_len = [40, 72]
heads = [2]
kv_heads = [2, 3]
head_dim = [16]
causal = [false, true]
threads = [1, 2]
"#;

fn sweep(dir: &Path, interleave: bool, extra: &[&str]) {
    let cfg = dir.join("c.toml");
    fs::write(&cfg, CONFIG).unwrap();
    let out = dir.join(if interleave { "il" } else { "seq" });
    Command::cargo_bin("attnbench")
        .unwrap()
        .args(["sweep", "--no-report", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&out)
        .arg("--set")
        .arg(format!("run.interleave={interleave}"))
        .args(extra)
        .assert()
        .success();
}

fn rows(path: &Path) -> Vec<HashMap<String, String>> {
    let mut r = csv::Reader::from_path(path).unwrap();
    let header = r.headers().unwrap().clone();
    r.records()
        .map(|rec| {
            header
                .iter()
                .zip(rec.unwrap().iter())
                .map(|(h, v)| (h.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

#[test]
fn an_interleaved_sweep_writes_the_rows_of_the_sequential_one() {
    let tmp = tempfile::tempdir().unwrap();
    sweep(tmp.path(), false, &[]);
    sweep(tmp.path(), true, &[]);
    let seq = rows(&tmp.path().join("seq/runs.csv"));
    let il = rows(&tmp.path().join("il/runs.csv"));
    // 3 variants x 2 lengths x kv_heads {2, 3} x 2 masks x 2 thread counts; kv_heads = 3
    // is skipped (3 > 2 heads) and stays a row.
    assert_eq!(il.len(), 48);
    let ids = |rows: &[HashMap<String, String>]| -> Vec<String> {
        rows.iter().map(|r| r["case_id"].clone()).collect()
    };
    assert_eq!(ids(&il), ids(&seq));
    let samples = fs::read_to_string(tmp.path().join("il/samples.csv")).unwrap();
    for (a, b) in il.iter().zip(&seq) {
        let id = &a["case_id"];
        assert_eq!(a["status"], b["status"], "{id}");
        if a["status"] == "skipped" {
            continue;
        }
        assert_eq!(a["status"], "ok", "{id}: {}", a["reason"]);
        // Memory is probed cold and alone in both: never below the prediction (no warm
        // buffer of the timed calls is reused), and equal to the sequential figure up to
        // the thread pool's own queue blocks, which depend on the calls made before
        // (README, "Comparing runs", Memory; 3.7 KiB seen once under load).
        let mem = |r: &HashMap<String, String>, k: &str| r[k].parse::<i64>().unwrap();
        let got = mem(a, "mem_overhead_bytes");
        assert!(got >= mem(a, "mem_predicted_bytes"), "{id}: {got}");
        assert!(
            (got - mem(b, "mem_overhead_bytes")).abs() <= 8 * 1024,
            "{id}: {got} interleaved, {} sequential",
            b["mem_overhead_bytes"]
        );
        assert_eq!(a["max_abs_err"], b["max_abs_err"], "{id}");
        let reps: usize = a["reps"].parse().unwrap();
        assert!((2..=4).contains(&reps), "{id}: {reps} reps");
        let sampled = samples
            .lines()
            .filter(|l| l.starts_with(&format!("{id},")))
            .count();
        assert_eq!(sampled, reps, "{id}");
        assert!(a["probe_gflops"].parse::<f64>().unwrap() > 0.0, "{id}");
    }
}

#[test]
fn an_interleaved_sweep_resumes_where_it_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    // The first run measures the n = 40 half only; the resumed one adds the rest.
    sweep(tmp.path(), true, &["--set", "seq_len=40"]);
    let first = rows(&tmp.path().join("il/runs.csv"));
    assert_eq!(first.len(), 24);
    sweep(tmp.path(), true, &["--resume"]);
    let all = rows(&tmp.path().join("il/runs.csv"));
    assert_eq!(all.len(), 48);
    assert_eq!(all[..24], first[..]);
    assert!(all[24..].iter().all(|r| r["seq_q"] == "72"));
}
