//! Records the compiler version for `meta.json` (a benchmark figure is only comparable with
//! the toolchain that produced it).
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
    // The AVX-512 intrinsics (decode's bf16 dot products) are stable from Rust 1.89; older
    // compilers within the MSRV build without that path.
    println!("cargo:rustc-check-cfg=cfg(attnbench_avx512)");
    let minor = version
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.split('.').nth(1))
        .and_then(|m| m.parse::<u32>().ok());
    if minor.is_some_and(|m| m >= 89) {
        println!("cargo:rustc-cfg=attnbench_avx512");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
