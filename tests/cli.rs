//! The command line end to end: sweeps write the documented CSV, `--resume` and refusal to
//! overwrite, config and flag errors (exit code 2, message naming the key), NumPy interop.

use predicates::prelude::*;
use std::fs;
use std::path::{Path, PathBuf};

mod common;
use common::{attnbench, compare};

/// The CSV header as docs/reference/results-format.md documents it (the contract scripts
/// depend on).
const DOCUMENTED_HEADER: &str = "run,case_id,variant,device,dtype,mode,batch,heads,kv_heads,\
seq_q,seq_kv,head_dim,q_chunk,kv_chunk,causal,window,devices,threads,status,reason,reps,\
time_median_s,time_min_s,time_max_s,time_mad_s,mem_overhead_bytes,mem_predicted_bytes,\
peak_rss_bytes,io_bytes,max_abs_err,max_rel_err,err_rows,flops,gflops,comm_bytes,comm_steps,\
seed,input_dist,input_scale,stopped_by,time_bwd_median_s,grad_max_abs_err,grad_max_rel_err,\
grad_err_rows,grad_err_scope,d_out,extrapolated,timed_rows,diff_variant,max_abs_diff,splits,\
allreduce,kv_read_bytes,kv_gbytes_per_s,copy_gbytes_per_s,copy_bw_frac,comm_elements,\
comm_max_device_bytes,device_peak_elements,device_peak_bytes,device_pairs_max,\
critical_path_pairs,comm_time_s,comm_time_min_s,sim_comm_bytes,sim_comm_max_device_bytes,\
probe_gflops,page_size,page_order,prefill_chunk,prefill_steps,step_max_median_s,batch_spec,kernel_path,prefix_len,\
kv_dtype,max_abs_err_unquantized,latent_dim,rope_dim,sinks,precision";

const TINY: &str = r#"
[run]
name = "tiny"
warmup = 0
min_reps = 1
max_reps = 2
max_time_s = 0.05
calibrate = false

[axes]
variant = ["naive", "flash", "rabe-staats"]
seq_len = [16, 33]
heads = [2]
kv_heads = [2, 3]
head_dim = [8]
"#;

fn write_config(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("c.toml");
    fs::write(&p, text).unwrap();
    p
}

fn csv_lines(path: &Path) -> Vec<String> {
    fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn tiny_sweep_writes_documented_csv_one_row_per_case_and_resume_adds_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path(), TINY);
    let out = tmp.path().join("res");
    attnbench()
        .args(["sweep", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&out)
        .assert()
        .success()
        .stdout(predicate::str::contains("12 rows written"));
    let lines = csv_lines(&out.join("runs.csv"));
    assert_eq!(lines[0], DOCUMENTED_HEADER);
    // 3 variants x 2 lengths x kv_heads {2, 3}: the kv_heads = 3 half is skipped (3 > 2).
    assert_eq!(lines.len(), 1 + 12);
    let mut r = csv::Reader::from_path(out.join("runs.csv")).unwrap();
    let status_col = r
        .headers()
        .unwrap()
        .iter()
        .position(|h| h == "status")
        .unwrap();
    let statuses: Vec<String> = r
        .records()
        .map(|x| x.unwrap()[status_col].to_string())
        .collect();
    assert_eq!(statuses.iter().filter(|s| *s == "ok").count(), 6);
    assert_eq!(statuses.iter().filter(|s| *s == "skipped").count(), 6);
    // Every timed case carries the machine-speed probe measured with it; skipped ones none.
    let records: Vec<attnbench::results::record::Record> =
        csv::Reader::from_path(out.join("runs.csv"))
            .unwrap()
            .deserialize()
            .map(|x| x.unwrap())
            .collect();
    for r in &records {
        let timed = r.time_median_s.is_some();
        assert_eq!(r.probe_gflops.is_some(), timed, "{}", r.case_id);
        if let Some(p) = r.probe_gflops {
            assert!(p.is_finite() && p > 0.0, "{}: {p}", r.case_id);
        }
    }
    let meta: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(out.join("meta.json")).unwrap()).unwrap();
    assert_eq!(meta["config"]["run"]["name"], "tiny");
    assert!(meta["rustc"].as_str().unwrap().starts_with("rustc"));

    attnbench()
        .args(["sweep", "--resume", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&out)
        .assert()
        .success()
        .stderr(predicate::str::contains("12 of 12 cases already"));
    assert_eq!(csv_lines(&out.join("runs.csv")).len(), 13);
}

#[test]
fn results_format_documents_every_csv_column() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/reference/results-format.md");
    let doc = fs::read_to_string(&path).expect("docs/reference/results-format.md");
    for col in DOCUMENTED_HEADER.split(',') {
        assert!(
            doc.contains(&format!("| `{col}` |")),
            "{} lacks column `{col}`",
            path.display()
        );
    }
}

#[test]
fn existing_results_are_never_overwritten_silently() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path(), TINY);
    let out = tmp.path().join("res");
    fs::create_dir_all(&out).unwrap();
    fs::write(out.join("runs.csv"), "precious").unwrap();
    attnbench()
        .args(["sweep", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--resume").and(predicate::str::contains("--force")));
    assert_eq!(
        fs::read_to_string(out.join("runs.csv")).unwrap(),
        "precious"
    );
    attnbench()
        .args(["sweep", "--force", "--set", "variant=flash", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&out)
        .assert()
        .success();
    assert_eq!(csv_lines(&out.join("runs.csv")).len(), 1 + 4);
}

#[test]
fn dry_run_counts_cases_and_runs_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path(), TINY);
    let out = tmp.path().join("res");
    attnbench()
        .args([
            "sweep",
            "--dry-run",
            "--set",
            "seq_len=pow2:4:7",
            "--config",
        ])
        .arg(&cfg)
        .arg("--out")
        .arg(&out)
        .assert()
        .success()
        .stdout(predicate::str::contains("24 cases").and(predicate::str::contains("seq_len")));
    assert!(!out.exists());
}

#[test]
fn config_errors_exit_2_and_name_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    for (text, key) in [
        (
            TINY.replace("warmup = 0", "warmup = 0\nwarmpu = 1"),
            "warmpu",
        ),
        (TINY.replace("head_dim = [8]", "head_dim = []"), "head_dim"),
        (
            TINY.replace("head_dim = [8]", "head_dim = [\"big\"]"),
            "head_dim",
        ),
        (TINY.replace("\"naive\", ", "\"naiv\", "), "naiv"),
        (
            TINY.replace("max_time_s = 0.05", "max_time_s = -1.0"),
            "max_time_s",
        ),
    ] {
        let cfg = write_config(tmp.path(), &text);
        attnbench()
            .args(["sweep", "--dry-run", "--config"])
            .arg(&cfg)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(key).and(predicate::str::contains("c.toml")));
    }
    attnbench()
        .args(["sweep", "--dry-run", "--config"])
        .arg(tmp.path().join("missing.toml"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("missing.toml"));
    let cfg = write_config(tmp.path(), TINY);
    attnbench()
        .args(["sweep", "--dry-run", "--set", "sequence=5", "--config"])
        .arg(&cfg)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("sequence"));
}

#[test]
fn bad_flags_exit_2() {
    attnbench()
        .args(["run", "--variant", "nope", "--seq-len", "8"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("nope"));
    attnbench()
        .args(["run", "--variant", "flash", "--seq-len", "0"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--seq-len"));
    // A pool of 100000 spinning workers once took minutes to stop: refused before it starts.
    attnbench()
        .args([
            "run",
            "--variant",
            "flash",
            "--seq-len",
            "8",
            "--threads",
            "100000",
        ])
        .timeout(std::time::Duration::from_secs(20))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--threads: 100000 is more than"));
    attnbench()
        .args([
            "run",
            "--variant",
            "flash",
            "--seq-len",
            "8",
            "--memory-budget",
            "lots",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--memory-budget"));
    attnbench().args(["frobnicate"]).assert().code(2);
}

#[test]
fn a_run_whose_case_cannot_run_is_an_error_not_a_skipped_table() {
    for extra in [
        &["--seq-len", "16", "--heads", "4", "--kv-heads", "3"][..],
        &["--seq-len", "16", "--mode", "decode"][..],
        &["--seq-len", "4294967296"][..],
    ] {
        attnbench()
            .args(["run", "--variant", "flash", "-d", "8"])
            .args(extra)
            .assert()
            .code(2)
            .stdout(predicate::str::is_empty())
            .stderr(predicate::str::contains("cannot run"));
    }
}

/// A shared prefix longer than the context: `run` exits 2 naming the key; in a sweep, where
/// seq_kv varies per case, the case is a `skipped` row with the same reason (as is a prefix
/// on a case that is no decode); a prefix of 0 tokens is a config error naming the key.
#[test]
fn a_shared_prefix_longer_than_the_context_is_refused() {
    attnbench()
        .args(["run", "-v", "cascade-decode", "--mode", "decode", "-n", "1"])
        .args([
            "--seq-kv",
            "100",
            "--batch",
            "2",
            "-d",
            "8",
            "--prefix-len",
            "101",
        ])
        .assert()
        .code(2)
        .stdout(predicate::str::is_empty())
        .stderr(predicate::str::contains(
            "prefix_len (101) is longer than the context (seq_kv = 100)",
        ));
    attnbench()
        .args([
            "run",
            "-v",
            "flash",
            "-n",
            "8",
            "-d",
            "8",
            "--prefix-len",
            "4",
        ])
        .assert()
        .code(2)
        .stderr(
            predicate::str::contains("prefix_len (4)")
                .and(predicate::str::contains("mode decode only")),
        );
    let tmp = tempfile::tempdir().unwrap();
    let text = r#"
[run]
name = "prefix"
warmup = 0
min_reps = 1
max_reps = 1
max_time_s = 0.05
calibrate = false

[axes]
mode = "decode"
variant = ["cascade-decode", "flash-decoding"]
batch = 3
heads = 2
kv_heads = 1
head_dim = 8
seq_len = 1
seq_kv = [40, 64]
prefix_len = 50
"#;
    let cfg = write_config(tmp.path(), text);
    let out = tmp.path().join("res");
    common::sweep(&cfg, &out, &[]);
    let (records, col) = common::runs(&out);
    let rows: Vec<(String, String, String, String)> = records
        .iter()
        .map(|x| {
            [
                col("seq_kv"),
                col("status"),
                col("reason"),
                col("prefix_len"),
            ]
            .map(|i| x[i].to_string())
            .into()
        })
        .collect();
    assert_eq!(rows.len(), 4);
    for (seq_kv, status, reason, prefix) in rows {
        assert_eq!(prefix, "50");
        if seq_kv == "40" {
            assert_eq!(status, "skipped");
            assert!(reason.contains("prefix_len (50) is longer than the context (seq_kv = 40)"));
        } else {
            assert_eq!((status.as_str(), reason.as_str()), ("ok", ""));
        }
    }
    let cfg = write_config(
        tmp.path(),
        &text.replace("prefix_len = 50", "prefix_len = 0"),
    );
    attnbench()
        .args(["sweep", "--dry-run", "--config"])
        .arg(&cfg)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("prefix_len"));
}

#[test]
fn existing_save_paths_are_refused_before_anything_is_measured() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("o.npy");
    fs::write(&out, "mine").unwrap();
    let inputs = tmp.path().join("in");
    fs::create_dir_all(&inputs).unwrap();
    fs::write(inputs.join("k.npy"), "mine").unwrap();
    for (flag, path) in [("--save-output", &out), ("--save-inputs", &inputs)] {
        attnbench()
            .args(run_args(&[flag]))
            .arg(path)
            .assert()
            .code(2)
            .stdout(predicate::str::is_empty())
            .stderr(predicate::str::contains("already exists"));
    }
    assert_eq!(fs::read_to_string(&out).unwrap(), "mine");
    assert_eq!(fs::read_to_string(inputs.join("k.npy")).unwrap(), "mine");
}

#[test]
fn force_leaves_nothing_of_the_run_it_replaces_and_resume_keeps_to_one_run() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path(), TINY);
    let out = tmp.path().join("res");
    let sweep = |extra: &[&str]| {
        let mut c = attnbench();
        c.args(["sweep", "--config"])
            .arg(&cfg)
            .arg("--out")
            .arg(&out)
            .args(extra);
        c
    };
    sweep(&[]).assert().success();
    assert!(out.join("report").join("tables.md").is_file());
    fs::write(out.join("decode.md"), "stale").unwrap();
    fs::write(out.join("notes.txt"), "the user's").unwrap();
    sweep(&["--force", "--no-report", "--set", "variant=flash"])
        .assert()
        .success();
    assert!(!out.join("report").exists(), "a stale report was left");
    assert!(
        !out.join("decode.md").exists(),
        "a stale derived table was left"
    );
    assert_eq!(
        fs::read_to_string(out.join("notes.txt")).unwrap(),
        "the user's"
    );
    // Another run's config does not append to this run's CSV.
    let other = tmp.path().join("other.toml");
    fs::write(
        &other,
        TINY.replace(r#"name = "tiny""#, r#"name = "other""#),
    )
    .unwrap();
    let rows = csv_lines(&out.join("runs.csv")).len();
    attnbench()
        .args(["sweep", "--resume", "--config"])
        .arg(&other)
        .arg("--out")
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("`tiny`").and(predicate::str::contains("`other`")));
    assert_eq!(csv_lines(&out.join("runs.csv")).len(), rows);
    // A directory that holds no run keeps its own report/ under --force.
    let own = tmp.path().join("own");
    fs::create_dir_all(own.join("report")).unwrap();
    fs::write(own.join("report").join("mine.md"), "the user's").unwrap();
    attnbench()
        .args([
            "sweep",
            "--force",
            "--no-report",
            "--set",
            "variant=flash",
            "--config",
        ])
        .arg(&cfg)
        .arg("--out")
        .arg(&own)
        .assert()
        .success();
    assert!(own.join("report").join("mine.md").is_file());
    // An output path that is a file.
    let file = tmp.path().join("afile");
    fs::write(&file, "x").unwrap();
    attnbench()
        .args(["sweep", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&file)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("not a directory"));
}

#[test]
fn meta_names_the_revision_of_attnbench_wherever_it_runs() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let head = std::process::Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success());
    let Some(head) = head else {
        eprintln!("not a git checkout: nothing to compare");
        return;
    };
    let head = String::from_utf8(head.stdout).unwrap().trim().to_string();
    // Run from an unrelated git repository: its HEAD must not be recorded.
    let tmp = tempfile::tempdir().unwrap();
    let other = tmp.path().join("other");
    fs::create_dir_all(&other).unwrap();
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .current_dir(&other)
            .args(args)
            .output()
            .unwrap()
    };
    git(&["init", "-q"]);
    git(&[
        "-c",
        "user.name=x",
        "-c",
        "user.email=x@x",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "x",
    ]);
    let cfg = write_config(tmp.path(), TINY);
    attnbench()
        .current_dir(&other)
        .args(["sweep", "--no-report", "--set", "variant=flash", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(tmp.path().join("res"))
        .assert()
        .success();
    let meta: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(tmp.path().join("res/meta.json")).unwrap())
            .unwrap();
    assert_eq!(meta["git_revision"], head);
}

#[test]
fn list_shows_every_variant_and_the_devices() {
    let a = attnbench().arg("list").assert().success();
    let out = String::from_utf8(a.get_output().stdout.clone()).unwrap();
    for v in [
        "naive",
        "naive-unsafe",
        "rabe-staats",
        "rabe-staats-seq",
        "flash",
    ] {
        assert!(out.contains(v), "list lacks {v}");
    }
    assert!(out.contains("cpu") && out.contains("cuda"));
}

#[test]
fn unsafe_softmax_failure_is_reported_honestly() {
    let out = attnbench()
        .args([
            "run",
            "-v",
            "naive-unsafe",
            "-n",
            "32",
            "-d",
            "16",
            "--input-scale",
            "12",
        ])
        .args(["--warmup", "0", "--min-reps", "1", "--max-time-s", "0.1"])
        .assert()
        .success();
    let table = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert_eq!(table_value(&table, "status"), "error", "{table}");
    assert!(
        table_value(&table, "reason").contains("NaN or infinite"),
        "{table}"
    );
}

fn run_args(extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "run",
        "-v",
        "flash",
        "-n",
        "40",
        "--seq-kv",
        "56",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "-d",
        "24",
        "--causal",
        "--warmup",
        "0",
        "--min-reps",
        "1",
        "--max-time-s",
        "0.1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

#[test]
fn saved_inputs_reproduce_the_output_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    let p = |s: &str| tmp.path().join(s).to_string_lossy().into_owned();
    for dtype in ["f32", "bf16", "f16"] {
        attnbench()
            .args(run_args(&[
                "--dtype",
                dtype,
                "--seed",
                "9",
                "--save-inputs",
                &p(&format!("in-{dtype}")),
                "--save-output",
                &p(&format!("a-{dtype}.npy")),
            ]))
            .assert()
            .success();
        let run = attnbench()
            .args(run_args(&[
                "--inputs",
                &p(&format!("in-{dtype}")),
                "--save-output",
                &p(&format!("b-{dtype}.npy")),
                "--json",
            ]))
            .assert()
            .success();
        // The dtype comes from the files.
        let row: serde_json::Value = serde_json::from_slice(&run.get_output().stdout).unwrap();
        assert_eq!(row["dtype"], dtype);
        let a = fs::read(p(&format!("a-{dtype}.npy"))).unwrap();
        let b = fs::read(p(&format!("b-{dtype}.npy"))).unwrap();
        assert!(a.len() > 128 && a == b, "{dtype}: outputs differ");
    }
}

#[test]
fn malformed_or_misshaped_inputs_are_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("in");
    let d = dir.to_string_lossy().into_owned();
    attnbench()
        .args(run_args(&["--save-inputs", &d]))
        .assert()
        .success();
    // Flags that disagree with the files' shapes.
    attnbench()
        .args(
            run_args(&["--inputs", &d])
                .into_iter()
                .map(|a| if a == "40" { "41".into() } else { a }),
        )
        .assert()
        .code(2)
        .stderr(predicate::str::contains("q.npy").and(predicate::str::contains("41")));
    // A truncated file.
    let k = dir.join("k.npy");
    let bytes = fs::read(&k).unwrap();
    fs::write(&k, &bytes[..bytes.len() / 2]).unwrap();
    attnbench()
        .args(run_args(&["--inputs", &d]))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("k.npy"));
    // Not a .npy at all.
    fs::write(&k, b"hello").unwrap();
    attnbench()
        .args(run_args(&["--inputs", &d]))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("k.npy"));
}

/// 12 cases of at least 0.3 s each (rel_spread 0 never converges and max_reps is out of
/// reach, so the time cap stops every case; nothing stops one sooner): 3.6 s or more in all.
const SLOW: &str = r#"
[run]
name = "slow"
warmup = 0
min_reps = 3
max_reps = 100000000
max_time_s = 0.3
rel_spread = 0.0
calibrate = false

[axes]
variant = ["flash", "naive"]
seq_len = [64, 96, 128, 160, 192, 224]
head_dim = [16]
"#;

/// The cases of [`SLOW`].
const SLOW_CASES: usize = 12;

/// Waits until `csv` has `lines` lines (header included).
#[cfg(unix)]
fn wait_for_lines(csv: &Path, lines: usize) {
    use std::time::{Duration, Instant};
    let start = Instant::now();
    while csv_lines_if_any(csv) < lines {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the sweep never wrote {} rows",
            lines - 1
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A sweep of [`SLOW`] into `dir/res`, to spawn (stdout discarded), with its config and
/// output paths.
#[cfg(unix)]
fn slow_sweep(dir: &Path) -> (std::process::Command, PathBuf, PathBuf) {
    let cfg = write_config(dir, SLOW);
    let out = dir.join("res");
    let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin("attnbench"));
    cmd.args(["sweep", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&out)
        .stdout(std::process::Stdio::null());
    (cmd, cfg, out)
}

#[cfg(unix)]
fn send_signal(child: &std::process::Child, signal: libc::c_int) {
    // SAFETY: kill(2) on the child's pid; the child is not yet reaped, so the pid is its.
    let sent = unsafe { libc::kill(child.id() as libc::pid_t, signal) };
    assert_eq!(sent, 0, "kill: {}", std::io::Error::last_os_error());
}

/// Stops `child` (SIGSTOP) and waits until it has stopped: from then on nothing the sweep
/// does depends on how long the test takes. A signal sent while it is stopped stays pending
/// and is handled when [`resume`] continues it. Panics, naming the cause, if the sweep
/// exited first (it cannot have: the test stops it right after reading the CSV, with
/// seconds of cases still to run).
#[cfg(unix)]
fn stop(child: &std::process::Child) {
    send_signal(child, libc::SIGSTOP);
    let mut status = 0;
    // SAFETY: waitpid(2) on our own unreaped child; WUNTRACED reports the stop without
    // reaping it (`Child::wait` still collects the exit later).
    let got = unsafe { libc::waitpid(child.id() as libc::pid_t, &mut status, libc::WUNTRACED) };
    assert_eq!(
        got,
        child.id() as libc::pid_t,
        "waitpid: {}",
        std::io::Error::last_os_error()
    );
    assert!(
        libc::WIFSTOPPED(status),
        "the sweep exited (wait status {status:#x}) before the test could stop it"
    );
}

/// Continues a child [`stop`] stopped.
#[cfg(unix)]
fn resume(child: &std::process::Child) {
    send_signal(child, libc::SIGCONT);
}

#[cfg(unix)]
#[test]
fn ctrl_c_keeps_written_rows_and_resume_finishes_the_rest() {
    use std::process::Stdio;
    let tmp = tempfile::tempdir().unwrap();
    let (mut cmd, cfg, out) = slow_sweep(tmp.path());
    let bin = assert_cmd::cargo::cargo_bin("attnbench");
    let stderr_path = tmp.path().join("stderr.txt");
    let mut child = cmd
        .args(["--set", "head_dim=16"])
        .stderr(fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let csv = out.join("runs.csv");
    wait_for_lines(&csv, 3);
    // Stopped with at least 10 cases (3 s) to go, the sweep is interrupted mid-run however
    // long the refused sweep below takes on a loaded machine.
    stop(&child);
    let at_stop = csv_lines_if_any(&csv);
    assert!(at_stop < SLOW_CASES, "{at_stop} lines when stopped");
    // A second sweep into the directory meanwhile is refused, not interleaved.
    attnbench()
        .args(["sweep", "--resume", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("another attnbench sweep"));
    send_signal(&child, libc::SIGINT);
    resume(&child);
    let code = child.wait().unwrap().code();
    assert_eq!(code, Some(130), "interrupted sweep exit code");
    // The case under way when stopped, and at most one more, may still finish.
    let kept = csv_lines_if_any(&csv);
    assert!(
        (at_stop..=at_stop + 2).contains(&kept),
        "{kept} lines kept, {at_stop} at stop"
    );
    // Every kept line is a whole row.
    let n_cols = DOCUMENTED_HEADER.split(',').count();
    let mut r = csv::Reader::from_path(&csv).unwrap();
    for rec in r.records() {
        assert_eq!(rec.unwrap().len(), n_cols);
    }
    // The message says how to continue, with the --set of the interrupted command; that
    // command, run by a shell, finishes the sweep.
    let said = fs::read_to_string(&stderr_path).unwrap();
    let resume = said
        .split("continue with `")
        .nth(1)
        .and_then(|rest| rest.split('`').next())
        .unwrap_or_else(|| panic!("no resume command in: {said}"));
    // It names this binary by its path (`attnbench` need not be on PATH), relative to the
    // directory it ran in where the binary lies below it.
    let (program, rest) = resume.split_once(' ').unwrap();
    assert_eq!(
        fs::canonicalize(program).unwrap(),
        fs::canonicalize(&bin).unwrap(),
        "{resume}"
    );
    assert!(
        rest.starts_with("sweep --config")
            && resume.contains("--set ")
            && resume.contains("head_dim=16")
            && resume.ends_with("--resume"),
        "{resume}"
    );
    let script = resume.to_string();
    let status = std::process::Command::new("sh")
        .args(["-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "{script}");
    assert_eq!(csv_lines(&csv).len(), 1 + SLOW_CASES);
}

/// SIGTERM (what `timeout` and CI runners send) stops a sweep as Ctrl-C does; a SIGHUP that
/// was ignored when it started (`nohup`) stays ignored.
#[cfg(unix)]
#[test]
fn sigterm_stops_like_ctrl_c_and_a_nohup_sweep_survives_a_hangup() {
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    let tmp = tempfile::tempdir().unwrap();
    let (mut cmd, _, out) = slow_sweep(tmp.path());
    // 40 cases (12 s or more): the sweep is stopped and signalled long before its end.
    let lens: Vec<String> = (1..=20).map(|i| (16 * i).to_string()).collect();
    let cases = 2 * lens.len();
    cmd.args(["--no-report", "--set"])
        .arg(format!("seq_len={}", lens.join(",")))
        .stderr(Stdio::null());
    // SAFETY: between fork and exec only signal(2), which is async-signal-safe, as nohup does.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let csv = out.join("runs.csv");
    wait_for_lines(&csv, 2);
    send_signal(&child, libc::SIGHUP);
    // Two more rows after the hangup: it went on.
    let at_hangup = csv_lines_if_any(&csv);
    wait_for_lines(&csv, at_hangup + 2);
    stop(&child);
    let at_stop = csv_lines_if_any(&csv);
    assert!(at_stop + 2 < 1 + cases, "{at_stop} lines when stopped");
    assert!(child.try_wait().unwrap().is_none(), "exited after SIGHUP");
    send_signal(&child, libc::SIGTERM);
    resume(&child);
    assert_eq!(child.wait().unwrap().code(), Some(130));
    let kept = csv_lines_if_any(&csv);
    assert!(
        (at_stop..=at_stop + 2).contains(&kept),
        "{kept} lines kept, {at_stop} at stop"
    );
}

/// What a crash, a full disk or a hand edit leaves at the end of the files, and a damaged
/// meta.json, as a resume meets them.
#[test]
fn resume_mends_a_torn_last_row_and_refuses_an_unreadable_meta() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path(), TINY);
    let out = tmp.path().join("res");
    let sweep = |extra: &[&str]| {
        let mut cmd = attnbench();
        cmd.args(["sweep", "--no-report", "--config"])
            .arg(&cfg)
            .arg("--out")
            .arg(&out)
            // Every case timed: the last row and the last samples are of one case.
            .args(["--set", "kv_heads=2"])
            .args(extra);
        cmd
    };
    sweep(&[]).assert().success();
    let csv = out.join("runs.csv");
    let samples = out.join("samples.csv");
    let whole = fs::read_to_string(&csv).unwrap();
    let rows = csv_lines(&csv).len();
    let last_id = |p: &Path| -> String {
        let text = fs::read_to_string(p).unwrap();
        let last = text.lines().last().unwrap();
        last.split(',').nth(1).unwrap().to_string()
    };
    let torn_id = last_id(&csv);
    // A row cut short (as by a full disk), in both files: removed, and its case runs again.
    fs::write(&csv, &whole[..whole.len() - 20]).unwrap();
    let text = fs::read_to_string(&samples).unwrap();
    fs::write(&samples, &text[..text.len() - 4]).unwrap();
    sweep(&["--resume"]).assert().success().stderr(
        predicate::str::contains("runs.csv was unfinished")
            .and(predicate::str::contains("samples.csv was unfinished"))
            .and(predicate::str::contains("1 to run"))
            .and(predicate::str::contains("warning: --resume").not()),
    );
    assert_eq!(csv_lines(&csv).len(), rows);
    assert_eq!(last_id(&csv), torn_id);
    let n_cols = DOCUMENTED_HEADER.split(',').count();
    let mut r = csv::Reader::from_path(&csv).unwrap();
    assert!(r.records().all(|rec| rec.unwrap().len() == n_cols));
    // Every case's samples are its row's: compare with itself judges every timed case.
    compare(&out, &out)
        .assert()
        .success()
        .stdout(predicate::str::contains("not of the same run").not());
    // A last row that only lacks its newline may be one cut inside its last field, which
    // still parses: it goes too, and its case runs again.
    let text = fs::read_to_string(&csv).unwrap();
    fs::write(&csv, text.trim_end()).unwrap();
    sweep(&["--resume"]).assert().success().stderr(
        predicate::str::contains("runs.csv was unfinished")
            .and(predicate::str::contains("1 to run")),
    );
    assert_eq!(csv_lines(&csv).len(), rows);
    assert_eq!(last_id(&csv), torn_id);
    // A resume with another grid says which keys differ (the rows before it were made
    // under the first config); a resume with the same config said nothing.
    sweep(&["--resume", "--set", "seq_len=16,33,48"])
        .assert()
        .success()
        .stderr(predicate::str::contains(
            "warning: --resume with a config that differs from the run's first in axes.seq_len:",
        ));
    // An unreadable meta.json is not ignored (the resume would lose its run name and
    // calibration): refused, naming the file.
    fs::write(out.join("meta.json"), "{\"config\": ").unwrap();
    sweep(&["--resume"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("meta.json").and(predicate::str::contains("repair it")));
}

/// A run in which no case was timed (all over the memory budget) still writes a well-formed
/// samples.csv, and compare against it reports the lost cases as regressions.
#[test]
fn a_run_of_no_timed_case_compares_as_lost_cases() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path(), TINY);
    let (base, oom) = (tmp.path().join("base"), tmp.path().join("oom"));
    for (out, extra) in [
        (&base, vec![]),
        (&oom, vec!["--set", "run.memory_budget=1B"]),
    ] {
        attnbench()
            .args(["sweep", "--no-report", "--config"])
            .arg(&cfg)
            .arg("--out")
            .arg(out)
            .args(extra)
            .assert()
            .success();
    }
    assert_eq!(
        fs::read_to_string(oom.join("samples.csv")).unwrap(),
        "case_id,rep,time_s\n"
    );
    compare(&base, &oom)
        .assert()
        .code(3)
        .stdout(predicate::str::contains("status"));
}

fn csv_lines_if_any(path: &Path) -> usize {
    fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

#[test]
fn bpt_memory_model_prints_the_papers_layout_and_rejects_unknown_models() {
    attnbench()
        .args([
            "model",
            "bpt-memory",
            "--model",
            "gpt-3b",
            "--seq-len",
            "8192",
        ])
        .assert()
        .success()
        .stdout(
            predicate::str::contains("| 8192 | bpt |")
                .and(predicate::str::contains("Largest context"))
                .and(predicate::str::contains("65536")),
        );
    attnbench()
        .args(["model", "bpt-memory", "--model", "gpt-2"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("gpt-1b"));
    // Memory past 64-bit byte counts printed saturated ("16777216.00 TiB"): refused.
    attnbench()
        .args(["model", "bpt-memory", "--model", "gpt-70b"])
        .args(["--seq-len", "8192,1000000000000000000"])
        .assert()
        .code(2)
        .stderr(
            predicate::str::contains("--seq-len 1000000000000000000").and(
                predicate::str::contains("past what 64-bit byte counts hold"),
            ),
        );
}

const DECODE: &str = r#"
[run]
name = "dec"
warmup = 0
min_reps = 1
max_reps = 1
max_time_s = 0.05
calibrate = false

[axes]
variant = ["flash-decoding", "decode-online", "ring-decode", "tree-decode", "naive"]
mode = "decode"
heads = 4
kv_heads = 2
head_dim = 8
seq_kv = [37]
devices = [1, 3]
allreduce = ["ring", "two-level:2"]

[model]
tokens = [80000, 160000]
devices = [8, 16]
check = [[1, 2, 8, 30, 3]]
"#;

#[test]
fn decode_sweep_fills_the_decode_and_device_columns_and_writes_the_model_files() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path(), DECODE);
    let out = tmp.path().join("res");
    attnbench()
        .args(["sweep", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&out)
        .assert()
        .success()
        .stdout(predicate::str::contains("tree_vs_ring.md"))
        .stderr(predicate::str::contains(
            "4 combinations the variants do not have left out",
        ));
    let mut r = csv::Reader::from_path(out.join("runs.csv")).unwrap();
    let h = r.headers().unwrap().clone();
    let col = |name: &str| h.iter().position(|x| x == name).unwrap();
    let rows: Vec<csv::StringRecord> = r.records().map(|x| x.unwrap()).collect();
    let find = |variant: &str, devices: &str, allreduce: &str| {
        rows.iter()
            .find(|x| {
                &x[col("variant")] == variant
                    && &x[col("devices")] == devices
                    && &x[col("allreduce")] == allreduce
            })
            .unwrap_or_else(|| panic!("no row {variant} {devices} {allreduce}"))
    };
    // Single-device decode: KV bytes and bandwidth; no communication.
    let flash = find("flash-decoding", "1", "");
    assert_eq!(&flash[col("status")], "ok");
    assert_eq!(&flash[col("seq_q")], "1");
    assert_eq!(
        &flash[col("kv_read_bytes")],
        (2 * 2 * 37 * 8 * 4).to_string()
    );
    assert!(!flash[col("kv_gbytes_per_s")].is_empty());
    assert!(flash[col("comm_bytes")].is_empty());
    // Three devices: counted communication and per-device memory.
    let tree = find("tree-decode", "3", "ring");
    assert_eq!(&tree[col("status")], "ok", "{}", &tree[col("reason")]);
    assert!(tree[col("comm_bytes")].parse::<u64>().unwrap() > 0);
    assert!(!tree[col("device_peak_elements")].is_empty());
    let ring = find("ring-decode", "3", "");
    // Broadcast of q in 2 binomial rounds, then 2 rotations.
    assert_eq!(&ring[col("comm_steps")], "4");
    // Combinations a variant does not have (several devices for a one-device variant, a
    // mode it lacks) are not cases: no row. A legal case it declines is a skipped row.
    let any = |variant: &str, devices: &str| {
        rows.iter()
            .any(|x| &x[col("variant")] == variant && &x[col("devices")] == devices)
    };
    assert!(!any("flash-decoding", "3"));
    assert!(!any("decode-online", "3"));
    assert!(!any("naive", "1"), "naive has no mode decode");
    let ragged = find("tree-decode", "3", "two-level:2");
    assert_eq!(&ragged[col("status")], "skipped");
    assert!(ragged[col("reason")].contains("whole nodes"));
    for f in [
        "decode.md",
        "tree_vs_ring.md",
        "tree_vs_ring.svg",
        "tree_vs_ring_counts.csv",
        "tree_vs_ring_balance.csv",
        "tree_vs_ring_latency.csv",
    ] {
        assert!(out.join(f).exists(), "{f}");
    }
    // The roofline is the default compute term: nothing timed for it.
    assert!(!out.join("tree_vs_ring_compute.csv").exists());
    let md = fs::read_to_string(out.join("tree_vs_ring.md")).unwrap();
    assert!(md.contains("exact") && !md.contains("MISMATCH"), "{md}");
    assert!(md.contains("close to 8×"));
}

/// The files a sweep derives from its rows and `[model]` measurements are renderings:
/// `attnbench report DIR` writes them again, byte for byte, from runs.csv, meta.json and
/// the measured CSVs (here with the compute term timed on this machine).
#[test]
fn report_rewrites_the_derived_files_of_a_sweep_byte_for_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let text = DECODE.replace(
        "[model]",
        "[model]\ncompute = \"measured\"\nprobe_tokens = 256",
    );
    let cfg = write_config(tmp.path(), &text);
    let out = tmp.path().join("res");
    attnbench()
        .args(["sweep", "--no-report", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&out)
        .assert()
        .success();
    let compute = fs::read_to_string(out.join("tree_vs_ring_compute.csv")).unwrap();
    assert!(
        compute.starts_with("tokens,threads,seconds_per_token\n256,"),
        "{compute}"
    );
    let rendered = [
        "decode.md",
        "tree_vs_ring.md",
        "tree_vs_ring.svg",
        "tree_vs_ring_latency.csv",
    ];
    let before: Vec<Vec<u8>> = rendered
        .iter()
        .map(|f| fs::read(out.join(f)).unwrap())
        .collect();
    for f in rendered {
        fs::remove_file(out.join(f)).unwrap();
    }
    attnbench()
        .args(["report", "--format", "svg"])
        .arg(&out)
        .assert()
        .success()
        .stdout(predicate::str::contains("tree_vs_ring.md"));
    for (f, want) in rendered.iter().zip(&before) {
        let got = fs::read(out.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(&got == want, "{f} differs after report");
    }
    // Without its timed compute term the model cannot be rendered: a clear error, exit 2.
    fs::remove_file(out.join("tree_vs_ring_compute.csv")).unwrap();
    attnbench()
        .args(["report", "--format", "svg"])
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("tree_vs_ring_compute.csv"));
}

#[test]
fn model_and_decode_axis_errors_name_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    for (text, key) in [
        (
            DECODE.replace("tokens = [80000, 160000]", "tokens = [0]"),
            "model.tokens",
        ),
        (
            DECODE.replace("check = [[1, 2, 8, 30, 3]]", "check = [[1, 2, 8, 31, 3]]"),
            "model.check",
        ),
        (
            DECODE.replace("[model]", "[model]\ntopology = \"nvl72\""),
            "model.topology",
        ),
        (
            DECODE.replace("[model]", "[model]\nbeta_inter_gbs = 0"),
            "model.beta_inter_gbs",
        ),
        (
            DECODE.replace("[model]", "[model]\nalpha_intra = 1"),
            "alpha_intra",
        ),
        (DECODE.replace("\"two-level:2\"", "\"star\""), "allreduce"),
        (
            DECODE.replace("devices = [1, 3]", "devices = [0]"),
            "devices",
        ),
        (
            DECODE.replace("seq_kv = [37]", "seq_kv = [37]\nsplits = [0]"),
            "splits",
        ),
    ] {
        let cfg = write_config(tmp.path(), &text);
        attnbench()
            .args(["sweep", "--dry-run", "--config"])
            .arg(&cfg)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(key).and(predicate::str::contains("c.toml")));
    }
}

#[test]
fn output_into_a_reader_that_stops_early_ends_quietly() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    // cpu_perf's --json plan is far larger than a pipe's buffer, so the binary is still
    // printing when the reader goes away.
    let bin = assert_cmd::cargo::cargo_bin("attnbench");
    let mut child = std::process::Command::new(&bin)
        .args(["sweep", "--dry-run", "--json", "--config"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/cpu_perf.toml"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(!first.is_empty());
    // The reader (and the pipe) are dropped here.
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
}

#[test]
fn resume_records_its_command_and_a_config_that_differs_in_meta() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(
        tmp.path(),
        r#"
[run]
name = "resumed"
warmup = 0
min_reps = 1
max_reps = 1
calibrate = false

[axes]
variant = ["flash", "naive"]
seq_len = [32]
head_dim = [16]
"#,
    );
    let out = tmp.path().join("res");
    let sweep = |extra: &[&str]| {
        attnbench()
            .args(["sweep", "--no-report", "--config"])
            .arg(&cfg)
            .arg("--out")
            .arg(&out)
            .args(extra)
            .assert()
            .success();
    };
    let meta = || -> serde_json::Value {
        serde_json::from_str(&fs::read_to_string(out.join("meta.json")).unwrap()).unwrap()
    };
    sweep(&["--set", "variant=flash"]);
    assert!(meta().get("resumed").is_none());
    // The whole grid: one more row, the resume and its wider config recorded.
    sweep(&["--resume"]);
    let m = meta();
    assert_eq!(m["config"]["axes"]["variant"], serde_json::json!(["flash"]));
    let resumed = m["resumed"].as_array().unwrap();
    assert_eq!(resumed.len(), 1);
    assert!(resumed[0]["command_line"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a == "--resume"));
    assert_eq!(
        resumed[0]["config"]["axes"]["variant"],
        serde_json::json!(["flash", "naive"])
    );
    // Nothing left to run: no entry.
    sweep(&["--resume"]);
    assert_eq!(meta()["resumed"].as_array().unwrap().len(), 1);
    assert_eq!(csv_lines(&out.join("runs.csv")).len(), 1 + 2);
}

#[test]
fn min_reps_wins_over_a_tiny_max_time_s() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(
        tmp.path(),
        &TINY
            .replace("min_reps = 1", "min_reps = 5")
            .replace("max_reps = 2", "max_reps = 50")
            .replace("max_time_s = 0.05", "max_time_s = 0.000001"),
    );
    let out = tmp.path().join("out");
    attnbench()
        .args(["sweep", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&out)
        .assert()
        .success();
    let mut rdr = csv::Reader::from_path(out.join("runs.csv")).unwrap();
    let headers = rdr.headers().unwrap().clone();
    let col = |name: &str| headers.iter().position(|h| h == name).unwrap();
    let (status, reps, stopped) = (col("status"), col("reps"), col("stopped_by"));
    let mut ok = 0;
    for row in rdr.records() {
        let row = row.unwrap();
        if &row[status] == "ok" {
            ok += 1;
            assert_eq!(&row[reps], "5", "{row:?}");
            assert_eq!(&row[stopped], "time_cap", "{row:?}");
        }
    }
    assert!(ok > 0);
    let samples = fs::read_to_string(out.join("samples.csv")).unwrap();
    assert_eq!(samples.lines().count() - 1, 5 * ok);
}

const SERVING: &str = r#"
[run]
name = "serving"
warmup = 0
min_reps = 2
max_reps = 3
max_time_s = 0.05
calibrate = false
interleave = true
innermost = ["variant"]

[axes]
variant = ["flash-decoding", "paged-decode", "flash", "chunked-prefill"]
mode = ["decode", "fwd"]
heads = 4
kv_heads = 2
head_dim = 16
seq_len = 40
causal = true
page_size = [8, 64]
prefill_chunk = [16, 64]
"#;

/// The serving workloads end to end: paged-decode and chunked-prefill rows carry their
/// columns and ids, a page or chunk longer than the sequence is a skipped row that names
/// its key, `decode.md` compares each page size with flash-decoding and `prefill.md` each
/// chunk with flash, with their plots; and a bad page or chunk value is exit 2 naming it.
#[test]
fn serving_sweep_writes_paging_and_chunked_prefill_rows_and_reports() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path(), SERVING);
    let out = tmp.path().join("res");
    attnbench()
        .args(["sweep", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&out)
        .assert()
        .success();
    let rows = attnbench::results::runs::read(&out.join("runs.csv")).unwrap();
    let of = |v: &'static str| rows.iter().filter(move |r| r.variant == v);
    // A mode a variant lacks is left out of the grid: no row.
    assert!(of("paged-decode").all(|r| r.mode == "decode"));
    assert!(of("chunked-prefill").all(|r| r.mode == "fwd"));
    let paged: Vec<_> = of("paged-decode").collect();
    assert_eq!(paged.len(), 2);
    let ok = paged.iter().find(|r| r.page_size == Some(8)).unwrap();
    assert_eq!(ok.status.name(), "ok", "{}", ok.reason);
    assert!(ok.case_id.ends_with("|pg8shuffled") && ok.page_order == "shuffled");
    assert!(ok.kv_gbytes_per_s.is_some() && ok.max_abs_err.unwrap() < 1e-5);
    let long = paged.iter().find(|r| r.page_size == Some(64)).unwrap();
    assert_eq!(long.status.name(), "skipped");
    assert!(long.reason.contains("page_size 64"), "{}", long.reason);
    let chunked: Vec<_> = of("chunked-prefill").filter(|r| r.mode == "fwd").collect();
    let c16 = chunked
        .iter()
        .find(|r| r.prefill_chunk == Some(16))
        .unwrap();
    assert_eq!(c16.status.name(), "ok", "{}", c16.reason);
    assert_eq!(c16.prefill_steps, Some(3));
    assert!(c16.step_max_median_s.unwrap() <= c16.time_max_s.unwrap());
    let c64 = chunked
        .iter()
        .find(|r| r.prefill_chunk == Some(64))
        .unwrap();
    assert!(c64.reason.contains("prefill_chunk 64"), "{}", c64.reason);
    // flash-decoding and flash read neither axis: one row each, in the one mode each has.
    assert!(of("flash-decoding").all(|r| r.page_size.is_none() && r.prefill_chunk.is_none()));
    assert_eq!(of("flash-decoding").count(), 1);
    assert_eq!(of("flash").count(), 1);
    let decode = fs::read_to_string(out.join("decode.md")).unwrap();
    assert!(decode.contains("## Paging") && decode.contains("paged-decode (page 8, shuffled)"));
    let prefill = fs::read_to_string(out.join("prefill.md")).unwrap();
    assert!(prefill.contains("| 16 | 3 | ok |"), "{prefill}");
    for f in ["paging.svg", "prefill.svg"] {
        assert!(
            fs::read_to_string(out.join(f))
                .unwrap()
                .contains("<polyline"),
            "{f}"
        );
    }
    for (set, key) in [
        ("axes.page_size=0", "axes.page_size"),
        ("axes.page_order=random", "axes.page_order"),
        ("axes.prefill_chunk=0", "axes.prefill_chunk"),
        ("axes.batch_spec=q4+zz", "axes.batch_spec"),
        ("axes.batch_spec=2xq0", "axes.batch_spec"),
    ] {
        attnbench()
            .args(["sweep", "--dry-run", "--config"])
            .arg(&cfg)
            .args(["--set", set])
            .assert()
            .code(2)
            .stderr(predicate::str::contains(key));
    }
}

/// A sweep that runs CPU cases records decode's loop choice in meta.json: measured (a probe
/// per dtype, a crossover of at least 16 rows) by default, or pinned by
/// `run.decode_gemm_rows`, with no probe and the pinned rows for every dtype.
#[test]
fn sweep_records_the_decode_loop_measured_or_pinned() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(
        tmp.path(),
        r#"
[run]
name = "loop"
warmup = 0
min_reps = 1
max_reps = 1
calibrate = false

[axes]
variant = "flash-decoding"
mode = "decode"
seq_len = 4
seq_kv = 64
heads = 4
kv_heads = 1
head_dim = 16
"#,
    );
    let meta_of = |out: &Path| -> serde_json::Value {
        serde_json::from_str(&fs::read_to_string(out.join("meta.json")).unwrap()).unwrap()
    };
    let measured = tmp.path().join("measured");
    attnbench()
        .args(["sweep", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&measured)
        .assert()
        .success()
        .stderr(predicate::str::contains("decode loop: SGEMM from"));
    let path = &meta_of(&measured)["cpu_decode_path"];
    let dtypes = path["dtypes"].as_array().expect("a choice per dtype");
    assert_eq!(dtypes.len(), 3, "{path}");
    assert!(path.get("pinned").is_none(), "{path}");
    for c in dtypes {
        assert!(c["gemm_min_rows"].as_u64().unwrap() >= 16, "{c}");
        let probe = c["probe"].as_array().unwrap();
        assert_eq!(probe.len(), 4, "{c}");
        for p in probe {
            assert!(p["vecops_s"].as_f64().unwrap() > 0.0, "{p}");
            assert!(p["sgemm_s"].as_f64().unwrap() > 0.0, "{p}");
        }
    }

    let pinned = tmp.path().join("pinned");
    attnbench()
        .args(["sweep", "--set", "run.decode_gemm_rows=48", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&pinned)
        .assert()
        .success()
        .stderr(predicate::str::contains(
            "SGEMM from 48 (f32), 48 (bf16), 48 (f16) query rows per KV head; dot products below (pinned by run.decode_gemm_rows)",
        ));
    let path = &meta_of(&pinned)["cpu_decode_path"];
    assert_eq!(path["pinned"], true, "{path}");
    for c in path["dtypes"].as_array().unwrap() {
        assert_eq!(c["gemm_min_rows"], 48, "{c}");
        assert!(c["probe"].as_array().unwrap().is_empty(), "{c}");
    }
    assert_eq!(meta_of(&pinned)["config"]["run"]["decode_gemm_rows"], 48);
}

/// Inputs too large for the machine are an `oom` row with the tensor named, in `run` and in
/// a sweep (where an interleave group then runs case by case), never an abort.
#[test]
fn inputs_that_cannot_be_allocated_are_oom_rows_not_aborts() {
    attnbench()
        .args(["run", "--variant", "flash", "-n", "64", "-d", "10000000000"])
        .assert()
        .success()
        .stdout(
            predicate::str::contains("oom").and(predicate::str::contains(
                "input Q: 2560000000000 bytes could not be allocated",
            )),
        );
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(
        tmp.path(),
        "[run]\nname = \"big\"\ncalibrate = false\ninterleave = true\n[axes]\nvariant = [\"flash\", \"naive\"]\nseq_len = 64\nhead_dim = 10000000000\n",
    );
    let out = tmp.path().join("out");
    attnbench()
        .args(["sweep", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&out)
        .assert()
        .success();
    let records: Vec<attnbench::results::record::Record> =
        csv::Reader::from_path(out.join("runs.csv"))
            .unwrap()
            .deserialize()
            .map(|x| x.unwrap())
            .collect();
    assert_eq!(records.len(), 2);
    for r in &records {
        assert_eq!(r.status.name(), "oom", "{}", r.case_id);
        assert!(r.reason.contains("could not be allocated"), "{}", r.reason);
    }
}

/// Combinations a variant does not have are not cases: `--dry-run` lists them per variant
/// (and `--json` in its first object), and a grid of nothing else is exit 2 saying so.
#[test]
fn combinations_a_variant_does_not_have_are_left_out_and_listed() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(
        tmp.path(),
        "[run]\nname = \"lo\"\n[axes]\nvariant = [\"naive\", \"flash-decoding\"]\nmode = [\"fwd\", \"decode\"]\ndevices = [1, 2]\nseq_len = 16\nheads = 2\nhead_dim = 8\n",
    );
    let out = attnbench()
        .args(["sweep", "--dry-run", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    // naive: fwd on 1 device runs; decode (x2 devices) and fwd on 2 devices do not.
    // flash-decoding: decode on 1 device runs; fwd (x2) and decode on 2 devices do not.
    assert!(text.contains("run lo: 2 cases"), "{text}");
    assert!(text.contains("left out: 6 combinations"), "{text}");
    assert!(
        text.contains(
            "naive: 3 (one device only (devices = 2); no mode decode (it has: fwd, fwd+bwd))"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "flash-decoding: 3 (no mode fwd (it has: decode); one device only (devices = 2))"
        ),
        "{text}"
    );
    let json = attnbench()
        .args(["sweep", "--dry-run", "--json", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let first: serde_json::Value =
        serde_json::from_slice(json.stdout.split(|&b| b == b'\n').next().unwrap()).unwrap();
    let left_out = first["left_out"].as_array().unwrap();
    assert_eq!(left_out.len(), 2);
    assert_eq!(left_out[0]["variant"], "naive");
    assert_eq!(left_out[0]["count"], 3);
    // A grid of nothing else: exit 2 naming the file and what was left out.
    let none = write_config(
        tmp.path(),
        "[run]\nname = \"none\"\n[axes]\nvariant = \"naive\"\nmode = \"decode\"\nseq_len = 16\n",
    );
    attnbench()
        .args(["sweep", "--config"])
        .arg(&none)
        .arg("--out")
        .arg(tmp.path().join("none"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "only combinations its variants do not have",
        ))
        .stderr(predicate::str::contains("naive: 1 (no mode decode"));
    assert!(!tmp.path().join("none").exists());
}

/// The value on the line labelled `label` of `run`'s table (`  LABEL  VALUE`).
fn table_value(table: &str, label: &str) -> String {
    table
        .lines()
        .find_map(|l| {
            l.strip_prefix("  ")?
                .strip_prefix(label)?
                .strip_prefix("  ")
                .map(str::trim)
        })
        .unwrap_or_else(|| panic!("no line `{label}` in:\n{table}"))
        .to_string()
}

/// A JSON object's members in the order the text gives them (a `serde_json::Value` may
/// sort its keys).
struct Ordered(Vec<(String, serde_json::Value)>);

impl<'de> serde::Deserialize<'de> for Ordered {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Ordered;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Ordered, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry()? {
                    members.push(member);
                }
                Ok(Ordered(members))
            }
        }
        d.deserialize_map(Visitor)
    }
}

/// `run --json` prints one JSON object: the CSV header's columns as its keys, in order, each
/// typed (counts as integers, times as numbers, flags as booleans, empty fields null).
#[test]
fn run_json_is_every_csv_column_in_order_typed() {
    let out = attnbench()
        .args(run_args(&["--json", "--dtype", "bf16"]))
        .assert()
        .success();
    let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert_eq!(text.lines().count(), 1, "one object on one line:\n{text}");
    let Ordered(members) = serde_json::from_str(&text).unwrap();
    let keys: Vec<&str> = members.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, DOCUMENTED_HEADER.split(',').collect::<Vec<_>>());
    let row: std::collections::HashMap<&str, &serde_json::Value> =
        members.iter().map(|(k, v)| (k.as_str(), v)).collect();
    for k in [
        "batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim", "reps", "io_bytes",
    ] {
        assert!(row[k].is_u64(), "{k}: {}", row[k]);
    }
    assert_eq!(
        (
            row["heads"],
            row["kv_heads"],
            row["seq_q"],
            row["seq_kv"],
            row["head_dim"]
        ),
        (&4.into(), &2.into(), &40.into(), &56.into(), &24.into())
    );
    for k in [
        "time_median_s",
        "time_min_s",
        "time_max_s",
        "max_abs_err",
        "flops",
    ] {
        assert!(row[k].as_f64().is_some_and(|x| x > 0.0), "{k}: {}", row[k]);
    }
    assert!(row["input_scale"].is_number());
    assert!(row["time_min_s"].as_f64() <= row["time_median_s"].as_f64());
    assert_eq!(row["causal"], &serde_json::Value::Bool(true));
    assert_eq!(row["extrapolated"], &serde_json::Value::Bool(false));
    assert_eq!(row["status"], "ok");
    assert_eq!(row["dtype"], "bf16");
    // Empty CSV fields: null, not "" or 0.
    for k in [
        "reason",
        "window",
        "comm_bytes",
        "batch_spec",
        "d_out",
        "time_bwd_median_s",
    ] {
        assert!(row[k].is_null(), "{k}: {}", row[k]);
    }
    assert!(row["case_id"]
        .as_str()
        .unwrap()
        .starts_with("flash|fwd|cpu|bf16|b1h4kv2|"));
}

/// `run`'s default output is a table grouped by case, timing, memory and accuracy, with
/// units, that leaves out what the case does not have.
#[test]
fn run_prints_a_grouped_table_with_units() {
    let out = attnbench().args(run_args(&[])).assert().success();
    let table = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    let titles: Vec<&str> = table
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with(' '))
        .collect();
    assert_eq!(titles, ["case", "timing", "memory", "accuracy"], "{table}");
    assert_eq!(table_value(&table, "status"), "ok");
    assert_eq!(table_value(&table, "kernel"), "flash fwd on cpu, f32");
    assert_eq!(table_value(&table, "mask"), "causal");
    let has_unit = |v: &str, units: &[&str]| {
        let (number, unit) = v.split_once(' ').unwrap_or((v, ""));
        number.parse::<f64>().is_ok() && units.contains(&unit)
    };
    let median = table_value(&table, "median");
    assert!(
        has_unit(&median, &["ns", "µs", "ms", "s"]),
        "median `{median}`"
    );
    let io = table_value(&table, "inputs, output");
    assert!(has_unit(&io, &["B", "KiB", "MiB"]), "io `{io}`");
    let err = table_value(&table, "max abs error");
    assert!(err.ends_with(" (tolerance 1e-5)"), "error `{err}`");
    for absent in [
        "reason",
        "ragged batch",
        "splits",
        "backward",
        "communication",
    ] {
        assert!(
            !table.lines().any(|l| l.trim_start().starts_with(absent)),
            "`{absent}` shown for a case without it:\n{table}"
        );
    }
}
