//! The CPU kernel path: the measured default that `list` and `meta.json` record, and a
//! path forced per case (`--kernel-path`, `run.kernel_path`, the `kernel_path` axis) that
//! the kernels really take, with the path in the case id.

mod common;

use attnbench::backend::cpu::isa::Isa;
use common::attnbench;

/// `attnbench run --json` of a bf16 flash case, forced onto `path`: (case id, max error).
fn run_bf16(path: Isa) -> (String, f64) {
    let out = attnbench()
        .args([
            "run",
            "-v",
            "flash",
            "-n",
            "96",
            "--heads",
            "2",
            "-d",
            "64",
            "--dtype",
            "bf16",
            "--threads",
            "1",
            "--min-reps",
            "1",
            "--max-reps",
            "1",
            "--json",
            "--kernel-path",
            path.name(),
        ])
        .assert()
        .success();
    let v: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    (
        v["case_id"].as_str().unwrap().to_string(),
        v["max_abs_err"].as_f64().unwrap(),
    )
}

#[test]
fn a_forced_path_is_the_one_that_runs_and_is_in_the_case_id() {
    // The widening paths compute bf16 in f32 from the stored inputs: errors of f32
    // rounding. The pair path rounds P to bf16 before PV (2^-9 relative), hundreds of
    // times larger: the two errors tell which path ran.
    let (id, widened) = run_bf16(Isa::Portable);
    assert!(id.ends_with("|kpportable"), "{id}");
    assert!(widened < 1e-6, "portable path error {widened}");
    if Isa::Avx512Bf16.available() {
        let (id, pairs) = run_bf16(Isa::Avx512Bf16);
        assert!(id.ends_with("|kpavx512-bf16"), "{id}");
        assert!(pairs > 1e-5, "pair path error {pairs}: P was not rounded");
        let (_, avx512) = run_bf16(Isa::Avx512);
        assert!(avx512 < 1e-6, "avx512 path error {avx512}");
    }
}

#[test]
fn a_path_this_cpu_lacks_or_does_not_know_is_exit_2_with_the_list() {
    let missing = Isa::ALL.into_iter().find(|i| !i.available());
    let names = ["sse2".to_string()]
        .into_iter()
        .chain(missing.map(|i| i.name().to_string()));
    for name in names {
        for sub in [
            &["run", "-v", "flash", "-n", "8"][..],
            &["sweep", "--config", "configs/quick.toml", "--dry-run"][..],
        ] {
            let out = attnbench()
                .args(sub)
                .args(["--kernel-path", &name])
                .current_dir(common::repo())
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{sub:?} {name}: {err}");
            assert!(
                err.contains("--kernel-path") && err.contains("portable"),
                "{err}"
            );
        }
    }
}

#[test]
fn list_and_meta_record_the_measured_choice() {
    let out = attnbench().arg("list").assert().success();
    let text = String::from_utf8_lossy(&out.get_output().stdout);
    let default = Isa::detect().name();
    assert!(text.contains(&format!("{default} (default)")), "{text}");
    assert!(text.contains("cpu kernel path choice:"), "{text}");
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        "[run]\nname = \"kp\"\ncalibrate = false\nmax_reps = 1\nmin_reps = 1\n[axes]\nvariant = \"flash\"\nseq_len = 16\n",
    )
    .unwrap();
    let out_dir = dir.path().join("out");
    attnbench()
        .args(["sweep", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&out_dir)
        .args(["--no-report", "--kernel-path", "portable"])
        .assert()
        .success();
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("meta.json")).unwrap()).unwrap();
    assert_eq!(meta["cpu_kernel_path"], default);
    let choice = &meta["cpu_kernel_path_choice"];
    assert_eq!(choice["chosen"], default);
    assert!(choice["fma_gflops"].as_f64().unwrap() > 0.0, "{choice}");
    assert_eq!(meta["config"]["run"]["kernel_path"], "portable");
    let csv = std::fs::read_to_string(out_dir.join("runs.csv")).unwrap();
    assert!(csv.contains("|kpportable"), "{csv}");
}
