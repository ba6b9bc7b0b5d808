//! Compute backends. `cpu` is always built; a `cuda` backend (feature `cuda`, a later issue)
//! slots in beside it: variants call their backend's kernels, the runner picks by `Device`.

pub mod cpu;
pub mod cuda;
