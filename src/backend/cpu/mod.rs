//! CPU kernels: a blocked SGEMM wrapper, row softmax pieces, per-worker workspaces, and the
//! attention algorithms built from them (naive, Rabe–Staats chunked and sequential, flash).

pub mod blocks;
pub mod chunked;
pub mod chunked_bwd;
pub mod flash;
pub mod flash_bwd;
pub mod gemm;
pub mod naive;
pub mod naive_bwd;
pub mod softmax;
pub mod workspace;
