//! External implementations end to end: C-ABI plugins built here with the `cc` crate (the
//! C example, and test plugins that fail on purpose) and the Rust `cdylib` example, and a
//! Python callable served by `attnbench-peer`, each measured by `attnbench sweep` beside
//! attnbench's own variants.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};

use attnbench::results::record::{Record, Status};
use common::{attnbench, compare_json, repo};

/// Builds `source` into a shared library `out` with the C compiler `cc` finds, with
/// `defines` (`NAME` or `NAME=VALUE`).
fn build_c(source: &Path, out: &Path, defines: &[&str]) {
    let target = env!("ATTNBENCH_TARGET");
    let compiler = cc::Build::new()
        .target(target)
        .host(target)
        .opt_level(2)
        .cargo_metadata(false)
        .get_compiler();
    let mut cmd = compiler.to_command();
    cmd.args(["-shared", "-fPIC", "-I"])
        .arg(repo().join("include"))
        .args(defines.iter().map(|d| format!("-D{d}")))
        .arg(source)
        .arg("-o")
        .arg(out)
        .arg("-lm");
    let status = cmd.status().expect("the C compiler runs");
    assert!(status.success(), "{cmd:?} failed");
}

/// The C example, built into `dir`.
fn c_naive(dir: &Path) -> PathBuf {
    let lib = dir.join("libc_naive.so");
    build_c(&repo().join("examples/plugins/c-naive/naive.c"), &lib, &[]);
    lib
}

/// The Rust example, built with this cargo into `dir`.
fn rust_naive(dir: &Path) -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target_dir = dir.join("rust-naive-target");
    let status = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--quiet",
            "--offline",
            "--manifest-path",
        ])
        .arg(repo().join("examples/plugins/rust-naive/Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        .status()
        .expect("cargo runs");
    assert!(
        status.success(),
        "building examples/plugins/rust-naive failed"
    );
    target_dir.join("release/librust_naive.so")
}

fn sweep(config: &Path, out: &Path, sets: &[&str]) -> std::process::Output {
    let mut cmd = attnbench();
    cmd.arg("sweep")
        .arg("--config")
        .arg(config)
        .arg("--out")
        .arg(out);
    for s in sets {
        cmd.args(["--set", s]);
    }
    cmd.output().unwrap()
}

/// The rows of the sweep in `dir`, read by attnbench's own `runs.csv` reader.
fn rows(dir: &Path) -> Vec<Record> {
    attnbench::results::runs::read(&dir.join("runs.csv")).unwrap()
}

/// One test of this file at a time. The example workflow's gate judges time (a head that
/// changes no code must pass at the 1.10 threshold); on a 2-core machine the other tests'
/// compiles and sweeps preempt its timed calls at random (a false `slower`, exit 3, in the
/// CI gate of 2026-11-27, where 9 runs without the gate's load passed), noise no gate
/// should be asked to see through.
fn alone() -> MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn c_and_rust_plugins_pass_the_oracle_on_ragged_shapes_with_exact_scratch_bytes() {
    let _alone = alone();
    let tmp = tempfile::tempdir().unwrap();
    let (c_lib, rust_lib) = (c_naive(tmp.path()), rust_naive(tmp.path()));
    let config = tmp.path().join("plugins.toml");
    fs::write(
        &config,
        format!(
            r#"
[run]
name = "plugins"
min_reps = 2
max_reps = 3
threads = 1
interleave = true
innermost = ["variant"]

[plugins]
c-naive = "{}"
rust-naive = {{ library = "{}", timeout_s = 60 }}

[axes]
variant = ["flash", "plugin:c-naive", "plugin:rust-naive"]
dtype = ["f32", "bf16", "f16"]
causal = [false, true]
batch = [2]
heads = [4]
kv_heads = [2]
head_dim = [24]

[[zip]]
seq_len = [17, 1, 40]
seq_kv = [40, 33, 24]
"#,
            c_lib.display(),
            rust_lib.display()
        ),
    )
    .unwrap();
    for (out, sets) in [
        (tmp.path().join("full"), vec![]),
        (tmp.path().join("window"), vec!["window=7"]),
    ] {
        let o = sweep(&config, &out, &sets);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let rows = rows(&out);
        assert_eq!(rows.len(), 3 * 3 * 2 * 3);
        let mut checked = 0;
        for r in &rows {
            let (variant, dtype) = (r.variant.as_str(), r.dtype.as_str());
            if variant == "flash" {
                continue;
            }
            let declared = match variant {
                "plugin:c-naive" => dtype != "f16",
                _ => dtype == "f32",
            };
            if !declared {
                assert_eq!(r.status, Status::Skipped, "{r:?}");
                assert!(r.reason.contains("takes"), "{r:?}");
                continue;
            }
            assert_eq!(r.status, Status::Ok, "{r:?}");
            let tol = match dtype {
                "f32" => 1e-5,
                _ => 1.6e-2,
            };
            let err = r.max_abs_err.unwrap();
            assert!(err <= tol, "{variant} {dtype}: {err}");
            // One score row of seq_kv floats through the allocator table, counted exactly.
            let seq_kv = r.seq_kv as u64;
            assert_eq!(r.mem_overhead_bytes, Some(4 * seq_kv), "{r:?}");
            assert_eq!(r.mem_predicted_bytes, Some(4 * seq_kv), "{r:?}");
            assert!(r.reason.contains("allocator table (exact)"), "{r:?}");
            checked += 1;
        }
        assert_eq!(
            checked,
            3 * 2 * 2 + 3 * 2,
            "c-naive f32+bf16, rust-naive f32"
        );
        // Every ok row has its samples, plugin rows included.
        let samples = fs::read_to_string(out.join("samples.csv")).unwrap();
        assert!(samples.lines().any(|l| l.starts_with("plugin:rust-naive|")));
    }
    // compare judges plugin rows like attnbench's own.
    let full = tmp.path().join("full");
    let (code, report) = compare_json(&full, &full, &[]);
    assert_eq!(code, 0, "{report}");
    assert!(report.to_string().contains("plugin:c-naive"), "{report}");
    // --pair meets flash (chunked) and the plugin (not) case by case: every case matched,
    // and the f16 cases, ok for flash and skipped by the plugin, are regressions.
    let (code, report) = compare_json(
        &full,
        &full,
        &["--pair", "flash=plugin:c-naive", "--no-time-gate"],
    );
    assert_eq!(code, 3, "{report}");
    assert_eq!(report["counts"]["matched"], 18, "{report}");
    assert_eq!(report["counts"]["status_regressions"], 6, "{report}");
}

#[test]
fn a_wrong_a_crashing_a_hanging_a_nan_and_a_greedy_plugin_each_cost_one_row() {
    let _alone = alone();
    let tmp = tempfile::tempdir().unwrap();
    let src = repo().join("tests/fixtures/plugins/misbehave.c");
    let mut table = String::new();
    for (name, define) in [
        ("wrong", "WRONG"),
        ("crash", "CRASH"),
        ("hang", "HANG"),
        ("nan", "NAN_OUT"),
        ("big", "BIG"),
        // Would crash if it were called: refused on its version first.
        ("abi2", "ABI=2"),
    ] {
        let lib = tmp.path().join(format!("lib{name}.so"));
        let mut defines = vec![define];
        if name == "abi2" {
            defines.push("CRASH");
        }
        build_c(&src, &lib, &defines);
        table += &format!(
            "{name} = {{ library = \"{}\", timeout_s = 3 }}\n",
            lib.display()
        );
    }
    let config = tmp.path().join("bad.toml");
    fs::write(
        &config,
        format!(
            "[run]\nname = \"bad\"\nmin_reps = 2\nmax_reps = 2\nthreads = 1\nmemory_budget = \"32MiB\"\n\n[plugins]\n{table}\n\
             [axes]\nvariant = [\"plugin:wrong\", \"plugin:crash\", \"plugin:hang\", \"plugin:nan\", \"plugin:big\", \"plugin:abi2\"]\n\
             seq_len = [16, 24, 32]\ncausal = [true]\n"
        ),
    )
    .unwrap();
    let out = tmp.path().join("out");
    let o = sweep(&config, &out, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows = rows(&out);
    assert_eq!(rows.len(), 18);
    for r in &rows {
        let (variant, seq) = (r.variant.as_str(), r.seq_q);
        let (status, reason) = (r.status.name(), r.reason.as_str());
        let want = match (variant, seq) {
            ("plugin:abi2", _) => ("error", "ABI version 2"),
            (_, 16 | 32) => ("ok", ""),
            ("plugin:wrong", _) => ("error", "wrong result: max_abs_err"),
            ("plugin:crash", _) => ("error", "SIGSEGV"),
            ("plugin:hang", _) => ("timeout", "no reply within 3 s"),
            ("plugin:nan", _) => ("error", "NaN or infinite"),
            ("plugin:big", _) => (
                "oom",
                "out of memory: plugin:big: misbehave: forward returned 1 (the allocator table refused 67108864 bytes)",
            ),
            other => panic!("{other:?}"),
        };
        assert_eq!(status, want.0, "{variant} {seq}: {reason}");
        assert!(reason.contains(want.1), "{variant} {seq}: {reason}");
        if variant == "plugin:abi2" {
            assert!(reason.contains("it was not called"), "{reason}");
        }
    }
}

#[test]
fn undefined_plugins_and_missing_libraries_are_config_errors() {
    let _alone = alone();
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("c.toml");
    let cases = [
        (
            "[axes]\nvariant = [\"plugin:nope\"]\nseq_len = [8]\n",
            "`plugin:nope` is not defined: add it to [plugins]",
        ),
        (
            "[plugins]\nmine = \"no/such/libmine.so\"\n[axes]\nvariant = [\"plugin:mine\"]\nseq_len = [8]\n",
            "plugins.mine",
        ),
        (
            "[axes]\nvariant = [\"external\"]\nseq_len = [8]\n",
            "not a variant by itself",
        ),
        (
            "[python]\np = { call = \"nocolon\" }\n[axes]\nvariant = [\"python:p\"]\nseq_len = [8]\n",
            "expected module:function",
        ),
    ];
    for (text, want) in cases {
        fs::write(&config, format!("[run]\nname = \"c\"\n{text}")).unwrap();
        let o = attnbench()
            .args(["sweep", "--dry-run", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{text}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "{text}: {err}");
    }
}

/// The Python worker needs only a Python 3 interpreter for its `lists` arrays.
fn python3() -> Option<&'static str> {
    Command::new("python3")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| "python3")
}

#[test]
fn a_python_callable_is_measured_beside_flash() {
    let _alone = alone();
    let Some(python) = python3() else {
        eprintln!("skipped: no python3 on this machine");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("py.toml");
    fs::write(
        &config,
        format!(
            r#"
[run]
name = "py"
min_reps = 2
max_reps = 2
threads = 1
interleave = true
innermost = ["variant"]

[python]
lists = {{ call = "listcall:attention", arrays = "lists", python = "{python}", path = ["{}"], timeout_s = 60 }}
boom = {{ call = "listcall:boom", arrays = "lists", path = ["{}"] }}

[axes]
variant = ["flash", "python:lists", "python:boom"]
dtype = ["f32", "bf16"]
causal = [true]
heads = [2]
kv_heads = [1]
head_dim = [8]

[[zip]]
seq_len = [5, 9]
seq_kv = [12, 9]
"#,
            repo().join("python/tests").display(),
            repo().join("python/tests").display()
        ),
    )
    .unwrap();
    let out = tmp.path().join("out");
    let o = sweep(&config, &out, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows = rows(&out);
    assert_eq!(rows.len(), 3 * 2 * 2);
    for r in &rows {
        let status = r.status;
        match (r.variant.as_str(), r.dtype.as_str()) {
            ("python:lists", "f32") => {
                assert_eq!(status, Status::Ok, "{r:?}");
                assert!(r.max_abs_err.unwrap() <= 1e-5);
                assert!(r.reason.contains("tracemalloc"), "{r:?}");
            }
            ("python:lists" | "python:boom", "bf16") => {
                assert_eq!(status, Status::Skipped, "{r:?}")
            }
            ("python:boom", _) => {
                assert_eq!(status, Status::Error, "{r:?}");
                assert!(r.reason.contains("Error"), "{r:?}");
            }
            _ => assert_eq!(status, Status::Ok, "{r:?}"),
        }
    }
}

#[test]
fn the_attnbench_peer_package_passes_its_own_tests() {
    let _alone = alone();
    let Some(python) = python3() else {
        eprintln!("skipped: no python3 on this machine");
        return;
    };
    let out = Command::new(python)
        .args([
            "-m",
            "unittest",
            "discover",
            "-s",
            "python/tests",
            "-t",
            "python",
        ])
        .current_dir(repo())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The `run:` blocks of a GitHub Actions workflow, by step name, in order (the workflow's
/// own layout: `- name: X` then `run: |` and an indented block).
fn workflow_steps(yaml: &str) -> Vec<(String, String)> {
    let mut steps = Vec::new();
    let mut lines = yaml.lines().peekable();
    let mut name = String::new();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if let Some(n) = t.strip_prefix("- name: ") {
            name = n.trim().to_string();
        } else if t == "run: |" {
            let indent = line.len() - t.len() + 2;
            let mut block = String::new();
            while let Some(l) = lines.peek() {
                if !l.trim().is_empty() && l.len() - l.trim_start().len() < indent {
                    break;
                }
                block += l.get(indent..).unwrap_or("");
                block.push('\n');
                lines.next();
            }
            steps.push((name.clone(), block));
        }
    }
    steps
}

#[test]
fn the_example_ci_workflow_gates_a_pull_request_on_its_kernel() {
    let _alone = alone();
    let tmp = tempfile::tempdir().unwrap();
    let user = tmp.path().join("user-repo");
    let runner_temp = tmp.path().join("runner");
    fs::create_dir_all(user.join("kernel")).unwrap();
    fs::create_dir_all(user.join("include")).unwrap();
    fs::create_dir_all(user.join("bench")).unwrap();
    fs::create_dir_all(&runner_temp).unwrap();
    fs::copy(
        repo().join("include/attnbench.h"),
        user.join("include/attnbench.h"),
    )
    .unwrap();
    fs::copy(
        repo().join("docs/examples/attention-gate.toml"),
        user.join("bench/attention.toml"),
    )
    .unwrap();
    let kernel = fs::read_to_string(repo().join("examples/plugins/c-naive/naive.c")).unwrap();
    let git = |args: &[&str]| {
        let o = Command::new("git")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "-c",
                "commit.gpgsign=false",
            ])
            .args(args)
            .current_dir(&user)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    git(&["init", "-q"]);
    let commit = |source: &str, msg: &str| {
        fs::write(user.join("kernel/attention.c"), source).unwrap();
        git(&["add", "-A"]);
        git(&["commit", "-q", "-m", msg]);
        git(&["rev-parse", "HEAD"])
    };
    let base = commit(&kernel, "base");
    let workflow = fs::read_to_string(repo().join("docs/examples/attnbench-gate.yml")).unwrap();
    let steps = workflow_steps(&workflow);
    let names: Vec<&str> = steps.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "Install attnbench",
            "Build the kernel at base and at head",
            "Measure base and head in one run",
            "Gate head against base"
        ]
    );
    let bin_dir = assert_cmd::cargo::cargo_bin("attnbench")
        .parent()
        .unwrap()
        .to_path_buf();
    let path = std::env::join_paths(
        std::iter::once(bin_dir).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap())),
    )
    .unwrap();
    // Runs the workflow's steps (not the install: this build is on PATH) and returns the
    // gate's exit code.
    let pull_request = |n: usize| -> i32 {
        let _ = fs::remove_dir_all(user.join("build"));
        let _ = fs::remove_dir_all(user.join("gate-results"));
        // A fresh runner's temporary directory per pull request.
        let runner_temp = runner_temp.join(n.to_string());
        fs::create_dir_all(&runner_temp).unwrap();
        let mut code = 0;
        for (name, script) in &steps[1..] {
            let o = Command::new("bash")
                .args(["-euo", "pipefail", "-c", script])
                .current_dir(&user)
                .env("PATH", &path)
                .env("BASE", &base)
                .env("RUNNER_TEMP", &runner_temp)
                .output()
                .unwrap();
            code = o.status.code().unwrap_or(-1);
            let last = name == "Gate head against base";
            assert!(
                code == 0 || last,
                "pull request {n}, step {name}: {}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        code
    };
    // A head that changes no code passes; a head that breaks the kernel fails the gate.
    commit(&format!("{kernel}\n/* a comment */\n"), "head: a comment");
    assert_eq!(pull_request(1), 0);
    commit(
        &kernel.replace("p[j] = s * c->scale;", "p[j] = s * c->scale * 1.5f;"),
        "head: a wrong scale",
    );
    assert_eq!(pull_request(2), 3);
}
