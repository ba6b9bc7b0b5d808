//! CPU kernels: register-blocked microkernels with run-time instruction-set dispatch
//! (`isa`, `simd`, `tiles`), per-worker workspaces and work scheduling, and the attention
//! algorithms built from them (naive, Rabe–Staats chunked and sequential, flash, and the
//! decode kernels with their split-KV combine, on `vecops`), with bf16 products on AMX tiles
//! where the CPU offers them (`amx`, `amx_gemm`, `flash_amx`, `mla_amx`, `decode_amx`); MLA's projections
//! use the `matrixmultiply` SGEMM wrapper (`gemm`).

pub mod amx;
pub mod amx_gemm;
pub mod block_grads;
pub mod blocks;
pub mod cache;
pub mod chunked;
pub mod chunked_bwd;
pub mod combine;
pub mod decode;
pub mod decode_amx;
#[cfg(target_arch = "x86_64")]
mod decode_avx512;
pub mod decode_path;
pub mod flash;
pub mod flash_amx;
pub mod flash_bwd;
pub mod fp8;
pub mod gemm;
pub mod hbm_io;
pub mod isa;
#[cfg(test)]
pub mod kernel_paths;
pub mod mla;
pub mod mla_amx;
pub mod naive;
pub mod naive_bwd;
pub mod products;
pub mod sched;
pub mod simd;
pub mod softmax;
pub mod softmax_passes;
pub mod spread;
pub mod tiles;
pub mod vecops;
pub mod workspace;
