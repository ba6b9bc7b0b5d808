//! The MPI smoke test (issue 10), built only with `--features mpi`: `configs/mpi_smoke.toml`
//! on 2 and 4 ranks over shared memory (`mpirun --oversubscribe`), then the rows are checked
//! against the f64 oracle, against the simulation's counts for the same case, and against
//! the Tree Attention paper's closed forms (eqs. (9), (10), (14)); a rank that hangs or dies
//! must fail the run quickly with a message. Needs Open MPI's `mpirun` on PATH.
#![cfg(feature = "mpi")]

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use attnbench::model::formulas::{mem_tree, numel_kv, v_tree_total, Dims};
use attnbench::results::record::{Record, Status};

mod common;
use common::repo;

fn mpirun(p: usize, out: &Path, extra: &[&str]) -> Output {
    let mut cmd = Command::new("mpirun");
    cmd.args([
        "--oversubscribe",
        "--allow-run-as-root",
        "-np",
        &p.to_string(),
    ])
    .arg(env!("CARGO_BIN_EXE_attnbench"))
    .args(["sweep", "--config"])
    .arg(repo().join("configs/mpi_smoke.toml"))
    .args(["--set", &format!("devices={p}"), "--out"])
    .arg(out)
    .args(["--force", "--no-report"])
    .args(extra)
    .current_dir(repo());
    cmd.output()
        .expect("mpirun runs (install Open MPI: apt-get install openmpi-bin libopenmpi-dev)")
}

fn records(dir: &Path) -> Vec<Record> {
    let mut r = csv::Reader::from_path(dir.join("runs.csv")).expect("runs.csv");
    r.deserialize().map(|x| x.expect("a row")).collect()
}

fn check_run(p: usize) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join(format!("p{p}"));
    let o = mpirun(p, &out, &["--mpi-timeout", "60"]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "p {p}: {stdout}\n{stderr}");
    // Only rank 0 prints its summary and writes files.
    assert_eq!(
        stdout.matches("rows written to").count(),
        1,
        "p {p}: {stdout}"
    );
    let mut files: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            ".attnbench.lock",
            "decode.md",
            "meta.json",
            "runs.csv",
            "samples.csv"
        ],
        "p {p}"
    );

    let rows = records(&out);
    let ok: Vec<&Record> = rows.iter().filter(|r| r.status == Status::Ok).collect();
    // Every variant runs every case of its own mode; the other mode's combinations are
    // left out of the sweep (no rows).
    for r in &rows {
        assert_eq!(r.status, Status::Ok, "p {p} {}: {}", r.case_id, r.reason);
    }
    assert!(!ok.is_empty(), "p {p}");
    for r in &ok {
        assert_eq!(r.devices, p);
        // The bound for f32: 1e-6 relative to the f64 oracle; bf16 keeps its dtype's.
        let tol = if r.dtype == "f32" { 1e-6 } else { 1e-2 };
        let e = r.max_rel_err.unwrap();
        assert!(e <= tol, "p {p} {}: max_rel_err {e:e}", r.case_id);
        assert!(r.comm_time_s.unwrap() >= r.comm_time_min_s.unwrap());
        assert!(r.time_median_s.unwrap() > 0.0);
        let (b, n_h, kvh, d_h, n) = (
            r.batch as u64,
            r.heads as u64,
            r.kv_heads as u64,
            r.head_dim as u64,
            r.seq_kv as u64,
        );
        let es: u64 = if r.dtype == "f32" { 4 } else { 2 };
        let pp = p as u64;
        // The smoke config decodes seq_q = seq_len new tokens at once: the paper's
        // one-query equations then hold per new token (b·seq_q rows in place of b).
        let sq = r.seq_q as u64;
        let q_bcast = (pp - 1) * b * sq * n_h * d_h * es;
        if r.variant == "tree-decode-mpi" {
            // The library's collectives: not counted, so not 0 either.
            assert_eq!((r.comm_bytes, r.sim_comm_bytes), (None, None));
            continue;
        }
        // Counted bytes equal the simulation's for the same case and p ...
        assert_eq!(r.comm_bytes, r.sim_comm_bytes, "p {p} {}", r.case_id);
        assert_eq!(
            r.comm_max_device_bytes, r.sim_comm_max_device_bytes,
            "p {p} {}",
            r.case_id
        );
        // ... and the paper's equations.
        let all_kv = Dims {
            b,
            t: n,
            n_h: kvh,
            d_h,
            p: pp,
        };
        let bytes = r.comm_bytes.unwrap();
        match r.variant.as_str() {
            // Eq. (10): each of the p - 1 rotation rounds moves every shard once, 2·b·N·d.
            "ring-decode-mpi" => assert_eq!(bytes, (pp - 1) * numel_kv(&all_kv) * es + q_bcast),
            "ring-prefill-mpi" => assert_eq!(bytes, (pp - 1) * numel_kv(&all_kv) * es),
            "tree-decode-mpi-explicit" => {
                let x = Dims {
                    b,
                    t: n.div_ceil(pp),
                    n_h,
                    d_h,
                    p: pp,
                };
                let rows = Dims { b: b * sq, ..x };
                // Eq. (14) summed over the ranks, f32 on the wire, plus the q broadcast.
                assert_eq!(bytes, v_tree_total(&rows) * 4 + q_bcast, "{}", r.case_id);
                // Eq. (9): the fullest rank holds kv shard + q + n + d + m (the last three
                // once per new token).
                if kvh == n_h {
                    let extra = (sq - 1) * (2 * b * n_h * d_h + 2 * b * n_h);
                    assert_eq!(
                        r.device_peak_elements,
                        Some(mem_tree(&x) + extra),
                        "{}",
                        r.case_id
                    );
                }
            }
            v => panic!("unexpected variant {v}"),
        }
    }
}

#[test]
fn two_ranks_match_the_oracle_the_simulation_and_the_equations() {
    check_run(2);
}

#[test]
fn four_ranks_match_the_oracle_the_simulation_and_the_equations() {
    check_run(4);
}

/// A rank that stops answering: the others give up at the deadline and abort all ranks,
/// naming the operation, instead of hanging.
#[test]
fn a_hung_rank_fails_the_run_with_a_message() {
    let tmp = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let o = mpirun(
        2,
        &tmp.path().join("x"),
        &["--mpi-timeout", "2", "--mpi-test-fault", "stall:1"],
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        stderr.contains("did not complete within 2 s") && stderr.contains("aborting all ranks"),
        "{stderr}"
    );
    assert!(start.elapsed() < Duration::from_secs(60));
}

/// A rank that dies: mpirun ends the job with a non-zero status.
#[test]
fn a_dead_rank_fails_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let o = mpirun(
        2,
        &tmp.path().join("x"),
        &["--mpi-timeout", "10", "--mpi-test-fault", "die:0"],
    );
    assert!(!o.status.success());
    assert!(start.elapsed() < Duration::from_secs(60));
}

/// A signal that reaches one rank only (here rank 1, not the root) stops every rank before
/// the same case: without agreement the root would wait in the next case's collectives
/// until --mpi-timeout. The root says the run was interrupted and keeps whole rows.
#[test]
fn a_signal_to_one_rank_stops_every_rank_at_the_same_case() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("sig");
    let log = tmp.path().join("log.txt");
    let mut child = Command::new("mpirun")
        .args(["--oversubscribe", "--allow-run-as-root", "-np", "2"])
        .arg(env!("CARGO_BIN_EXE_attnbench"))
        .args(["sweep", "--config"])
        .arg(repo().join("configs/mpi_smoke.toml"))
        .args(["--set", "devices=2", "--set", "run.min_reps=300"])
        .args(["--set", "run.max_reps=300", "--mpi-timeout", "60", "--out"])
        .arg(&out)
        .args(["--force", "--no-report"])
        .stdout(std::fs::File::create(tmp.path().join("stdout.txt")).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("mpirun runs");
    let csv = out.join("runs.csv");
    let start = Instant::now();
    while std::fs::read_to_string(&csv).map_or(0, |t| t.lines().count()) < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no rows written"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Rank 1 of this job: its command line names our --out, its environment its rank.
    let rank1 = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| {
            let read = |f: &str| std::fs::read(format!("/proc/{pid}/{f}")).unwrap_or_default();
            let has = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).any(|w| w == needle);
            has(&read("cmdline"), out.to_str().unwrap().as_bytes())
                && has(&read("environ"), b"OMPI_COMM_WORLD_RANK=1\0")
        })
        .expect("rank 1's process");
    // SAFETY: kill(2) on a process of this test's job.
    assert_eq!(unsafe { libc::kill(rank1, libc::SIGINT) }, 0);
    let stopped = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if stopped.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("the ranks did not stop together within 30 s (a rank waits in a collective)");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(!status.success(), "{said}");
    assert!(
        said.contains("interrupted:") && said.contains("rerun it with --force"),
        "{said}"
    );
    let rows = records(&out);
    assert!(rows.len() >= 2, "{} rows", rows.len());
}

/// Tree Attention's Tables 1-2 on MPI ranks, end to end: `reproduce tree-attention
/// --quick` (not under mpirun) starts one `mpirun` per p of 2 and 4, whose ranks generate
/// ring against tree; every generation equals one device's, the schedules that ran send
/// exactly what the simulated generation's counted, and the claims include the ranks'.
#[test]
fn the_generations_on_ranks_equal_one_device_and_send_what_the_simulation_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("papers");
    let o = Command::new(env!("CARGO_BIN_EXE_attnbench"))
        .args(["reproduce", "tree-attention", "--quick", "--out"])
        .arg(&out)
        .current_dir(repo())
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{stdout}\n{stderr}");
    let read = |dir: &str| -> Vec<csv::StringRecord> {
        let mut r =
            csv::Reader::from_path(out.join("tree-attention").join(dir).join("generate.csv"))
                .unwrap_or_else(|e| panic!("{dir}: {e}"));
        r.records().map(|x| x.unwrap()).collect()
    };
    let header = csv::Reader::from_path(out.join("tree-attention/generate_ranks/generate.csv"))
        .unwrap()
        .headers()
        .unwrap()
        .clone();
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let ranks = read("generate_ranks");
    let simulated = read("generate");
    // p = 2 and 4, N = 1024 and 2048, ring and tree.
    assert_eq!(ranks.len(), 8, "{ranks:?}");
    for r in &ranks {
        assert_eq!(&r[col("topology")], "mpi");
        assert_eq!(&r[col("tokens_match")], "true", "{r:?}");
        let err: f64 = r[col("max_rel_err")].parse().unwrap();
        assert!(err <= 1e-6, "{r:?}");
        let key = |x: &csv::StringRecord| {
            (
                x[col("method")].to_string(),
                x[col("devices")].to_string(),
                x[col("tokens")].to_string(),
            )
        };
        let sim = simulated
            .iter()
            .find(|s| key(s) == key(r))
            .unwrap_or_else(|| panic!("no simulated row for {:?}", key(r)));
        assert_eq!(r[col("comm_bytes")], sim[col("comm_bytes")], "{:?}", key(r));
        let parts: f64 = ["prefill_s", "decode_s"]
            .iter()
            .map(|c| r[col(c)].parse::<f64>().unwrap())
            .sum();
        let total: f64 = r[col("total_s")].parse().unwrap();
        assert!(
            total > 0.0 && (parts - total).abs() <= 1e-9 * total,
            "{r:?}"
        );
    }
    for p in [2, 4] {
        let dir = out.join(format!("tree-attention/generate_ranks/p{p}"));
        assert!(dir.join("meta.json").is_file() && dir.join("generate.csv").is_file());
    }
    let claims = std::fs::read_to_string(out.join("tree-attention/claims.md")).unwrap();
    let section = claims
        .split("\n## ")
        .find(|s| s.starts_with("Tables 1-2 on MPI ranks"))
        .unwrap_or_else(|| panic!("{claims}"));
    assert!(
        section.contains("| **PASS** |") && section.contains("(MPI ranks)"),
        "{section}"
    );
}
