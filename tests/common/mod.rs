//! Helpers the integration tests share: the binary under test, the checkout, copying a
//! results directory, and `compare --json`. Each test binary compiles this module and uses
//! a part of it, so unused items are allowed.
#![allow(dead_code)]

use assert_cmd::Command;
use std::fs;
use std::path::{Path, PathBuf};

/// The `attnbench` binary of this build.
pub fn attnbench() -> Command {
    Command::cargo_bin("attnbench").expect("binary built")
}

/// `attnbench compare BASELINE CURRENT`, further flags to add.
pub fn compare(
    baseline: impl AsRef<std::ffi::OsStr>,
    current: impl AsRef<std::ffi::OsStr>,
) -> Command {
    let mut cmd = attnbench();
    cmd.arg("compare").arg(baseline).arg(current);
    cmd
}

/// The root of the checkout (configs/, results/, scripts/).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Copies the files of a run (`runs.csv`, `samples.csv`, `meta.json`, those present) from
/// `from` into `to`, creating it.
pub fn copy_run(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for f in ["runs.csv", "samples.csv", "meta.json"] {
        if from.join(f).exists() {
            fs::copy(from.join(f), to.join(f)).unwrap();
        }
    }
}

/// `attnbench sweep --config CFG --out OUT EXTRA...`, which must succeed.
pub fn sweep(cfg: &Path, out: &Path, extra: &[&str]) {
    attnbench()
        .args(["sweep", "--config"])
        .arg(cfg)
        .arg("--out")
        .arg(out)
        .args(extra)
        .assert()
        .success();
}

/// The rows of `DIR/runs.csv` and a lookup of a column's index by name (a panic naming a
/// column the header lacks).
pub fn runs(dir: &Path) -> (Vec<csv::StringRecord>, impl Fn(&str) -> usize) {
    let mut r = csv::Reader::from_path(dir.join("runs.csv")).unwrap();
    let head = r.headers().unwrap().clone();
    let rows = r.records().map(Result::unwrap).collect();
    let col = move |name: &str| {
        head.iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("no column {name}"))
    };
    (rows, col)
}

/// Runs `compare BASE CUR --json EXTRA...`: the exit code and the parsed report (a panic
/// with both streams when stdout is not JSON).
pub fn compare_json(base: &Path, cur: &Path, extra: &[&str]) -> (i32, serde_json::Value) {
    let out = compare(base, cur)
        .arg("--json")
        .args(extra)
        .output()
        .unwrap();
    let code = out.status.code().unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "exit {code}: not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (code, v)
}
