//! The CUDA backend: NVIDIA GPUs through cudarc (driver, NVRTC, cuBLAS, all loaded at run
//! time). `plan` (launch geometry, define sets, workspace formulas) is pure Rust and always
//! built; the rest needs the `cuda` feature. Kernels are `kernels/*.cu`, embedded and
//! compiled by NVRTC for the device's architecture on first use.

pub mod plan;

#[cfg(feature = "cuda")]
pub mod nvrtc;

/// Why CUDA cases cannot run in this process, if so: the feature is off, or the driver,
/// a device or NVRTC is missing. Computed once.
#[cfg(not(feature = "cuda"))]
pub fn unavailable_reason() -> Option<String> {
    Some("this attnbench was built without the `cuda` feature (GPU backend not available)".into())
}
