//! CPU kernels: a blocked SGEMM wrapper, row softmax pieces, per-worker workspaces, and the
//! attention algorithms built from them (naive, Rabe–Staats chunked and sequential, flash).

pub mod chunked;
pub mod flash;
pub mod gemm;
pub mod naive;
pub mod softmax;
pub mod workspace;
