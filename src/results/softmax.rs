//! `softmax.csv`, the measurements of the blog's softmax claims (Transformers Inference
//! Optimization Toolset, "Online softmax"; docs/papers.md), and the only code that writes
//! and reads it. One row per (kind, algorithm, dtype, length): `vector` rows (naive, safe,
//! online on a 1-D vector: counted loads and stores, interleaved median time, GB/s),
//! `matrix` rows (unfused and fused L×L softmax: counted floats moved) and `overflow` rows
//! (one input at `x_max`: whether the output is finite, and its relative error against f64). O(rows).

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::results::table_csv::{read_csv, write_csv};

pub const CSV: &str = "softmax.csv";

pub const VECTOR: &str = "vector";
pub const MATRIX: &str = "matrix";
pub const OVERFLOW: &str = "overflow";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SoftmaxRow {
    /// `vector`, `matrix` or `overflow`.
    pub kind: String,
    /// naive, safe, online (vector, overflow); unfused, fused (matrix).
    pub algorithm: String,
    /// The inputs' type: f32, or bf16 (inputs rounded to bf16, computed in f32).
    pub dtype: String,
    /// n of a vector, L of an L×L matrix.
    pub length: usize,
    /// n, or L².
    pub elements: u64,
    /// Counted loads and stores of one call.
    pub loads: u64,
    pub stores: u64,
    /// Median seconds of the interleaved timed calls (vector rows).
    pub median_s: Option<f64>,
    pub calls: Option<usize>,
    /// (loads + stores) · 4 bytes / median_s / 1e9.
    pub gb_per_s: Option<f64>,
    /// Overflow rows: the largest input, whether every output is finite, and the largest
    /// |y - w| / w, w = softmax_f64(x), over the outputs (empty when not finite).
    pub x_max: Option<f64>,
    pub finite: Option<bool>,
    pub max_rel_err: Option<f64>,
}

impl SoftmaxRow {
    /// A row of counts only; the optional figures empty.
    pub fn counted(kind: &str, algorithm: &str, dtype: &str, length: usize, elements: u64) -> Self {
        SoftmaxRow {
            kind: kind.into(),
            algorithm: algorithm.into(),
            dtype: dtype.into(),
            length,
            elements,
            loads: 0,
            stores: 0,
            median_s: None,
            calls: None,
            gb_per_s: None,
            x_max: None,
            finite: None,
            max_rel_err: None,
        }
    }
}

/// Writes `rows` to `dir/softmax.csv`; returns its path.
pub fn write(dir: &Path, rows: &[SoftmaxRow]) -> Result<PathBuf> {
    write_csv(dir, CSV, rows)
}

/// The rows of `dir/softmax.csv` (an error naming the file when it is missing or bad).
pub fn read(dir: &Path) -> Result<Vec<SoftmaxRow>> {
    read_csv(dir, CSV)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_read_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read(dir.path()).unwrap_err().to_string().contains(CSV));
        let mut timed = SoftmaxRow::counted(VECTOR, "safe", "f32", 1 << 20, 1 << 20);
        timed.loads = 3 << 20;
        timed.stores = 1 << 20;
        timed.median_s = Some(1.234_567_890_123e-3);
        timed.calls = Some(41);
        timed.gb_per_s = Some(13.5);
        let mut over = SoftmaxRow::counted(OVERFLOW, "naive", "bf16", 4096, 4096);
        over.x_max = Some(89.0);
        over.finite = Some(false);
        let rows = vec![timed, over];
        write(dir.path(), &rows).unwrap();
        assert_eq!(read(dir.path()).unwrap(), rows);
    }
}
