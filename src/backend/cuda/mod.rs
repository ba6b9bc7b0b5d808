//! The CUDA backend: NVIDIA GPUs through cudarc (driver, NVRTC and cuBLAS, all loaded at run
//! time, so a build with the `cuda` feature needs no CUDA toolkit and runs without a GPU).
//! `plan` (define sets, launch geometry, workspace formulas) and `accounting` (the
//! allocator's byte counts) are pure Rust and always built; the device, NVRTC and the
//! launchers need the feature. Kernels are `kernels/*.cu`, embedded and compiled by NVRTC
//! for the device's architecture on first use.

pub mod accounting;
pub mod plan;

#[cfg(feature = "cuda")]
pub mod device;
#[cfg(feature = "cuda")]
pub mod nvrtc;
#[cfg(feature = "cuda")]
pub mod ops;

/// Why CUDA cases cannot run in this process, if so: the feature is off, or the driver, a
/// device, NVRTC or cuBLAS is missing (the device is opened once, on first call).
pub fn unavailable_reason() -> Option<String> {
    #[cfg(feature = "cuda")]
    {
        device::unavailable_reason()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Some(
            "this attnbench was built without the `cuda` feature (GPU backend not available)"
                .into(),
        )
    }
}

/// The GPU's description for `meta.json`, when one is usable.
pub fn gpu_info() -> Option<plan::GpuInfo> {
    #[cfg(feature = "cuda")]
    {
        device::gpu().ok().map(|g| g.info.clone())
    }
    #[cfg(not(feature = "cuda"))]
    {
        None
    }
}
