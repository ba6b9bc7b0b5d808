//! CPU kernels: a blocked SGEMM wrapper, row softmax pieces, per-worker workspaces, and the
//! attention algorithms built from them (naive, Rabe–Staats chunked and sequential, flash,
//! and the decode kernels with their split-KV combine).

pub mod blocks;
pub mod chunked;
pub mod chunked_bwd;
pub mod combine;
pub mod decode;
pub mod flash;
pub mod flash_bwd;
pub mod gemm;
pub mod naive;
pub mod naive_bwd;
pub mod softmax;
pub mod vecops;
pub mod workspace;
