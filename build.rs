//! Records the compiler version and the source revision for `meta.json` (a benchmark figure
//! is only comparable with the toolchain and code that produced it), and the target triple
//! for the tests that build C plugins with the `cc` crate (`tests/plugins.rs`).
fn main() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=ATTNBENCH_RUSTC_VERSION={version}");
    let target = std::env::var("TARGET").unwrap_or_default();
    println!("cargo:rustc-env=ATTNBENCH_TARGET={target}");
    println!("cargo:rerun-if-changed=build.rs");
    git_revision();
}

/// The source revision this binary is built from, for `meta.json` and the worker's hello:
/// HEAD, and whether the build's inputs (src/, include/, Cargo.toml, Cargo.lock, build.rs)
/// differ from it. Read here, not when a sweep starts: a binary measures with the code it
/// was built from, whatever the checkout holds by then. Nothing outside a git checkout.
fn git_revision() {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_string())
    };
    let Some(rev) = git(&["rev-parse", "HEAD"]) else {
        return;
    };
    let inputs = ["src", "include", "Cargo.toml", "Cargo.lock", "build.rs"];
    let mut status = vec!["status", "--porcelain", "--untracked-files=no", "--"];
    status.extend(inputs);
    let dirty = git(&status).map(|s| !s.is_empty());
    println!("cargo:rustc-env=ATTNBENCH_GIT_REVISION={rev}");
    if let Some(d) = dirty {
        println!("cargo:rustc-env=ATTNBENCH_GIT_DIRTY={d}");
    }
    // Run again when HEAD moves (a commit, a checkout) or an input changes.
    let mut watched: Vec<String> = inputs.iter().map(|s| s.to_string()).collect();
    watched.extend(
        ["HEAD", "index", "packed-refs"]
            .iter()
            .filter_map(|p| git(&["rev-parse", "--git-path", p])),
    );
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.extend(git(&["rev-parse", "--git-path", &branch]));
    }
    for w in watched {
        println!("cargo:rerun-if-changed={w}");
    }
}
