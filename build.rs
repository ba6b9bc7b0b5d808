//! Records the compiler version for `meta.json` (a benchmark figure is only comparable with
//! the toolchain that produced it), and the target triple for the tests that build C
//! plugins with the `cc` crate (`tests/plugins.rs`).
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
}
