//! C-ABI plugins (`include/attnbench.h`): `abi` mirrors the header's types and opens a
//! library with `libloading`, checking its ABI version before calling anything else;
//! `host` runs one prepared case of a plugin in the worker process (`attnbench worker
//! --plugin LIB`): inputs in the case's dtype, timed forward calls, the checked call with
//! its scratch counted through the allocator table; `device` (feature `cuda`) the same on
//! the GPU. The driver's side is `run::external`.

pub mod abi;
#[cfg(feature = "cuda")]
pub mod device;
pub mod host;
