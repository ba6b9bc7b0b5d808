//! `io.csv`, the counted HBM traffic of the blog's FlashAttention IO claim (Transformers
//! Inference Optimization Toolset, "FlashAttention"; docs/papers.md), and the only code that
//! writes and reads it. One row per (loop order, L, d, M): the elements a forward of one head
//! reads from and writes to slow memory (`backend::cpu::hbm_io`). O(rows).

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::results::table_csv::{read_csv, write_csv};

pub const CSV: &str = "io.csv";

/// The loop orders: the paper's Algorithm 0, the blog's FlashAttention (FlashAttention-1's
/// order) with its block sizes, and the `flash` kernel's FlashAttention-2 schedule.
pub const STANDARD: &str = "standard";
pub const FLASH1: &str = "flash1";
pub const FLASH2: &str = "flash2-kernel";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IoRow {
    /// `standard`, `flash1` or `flash2-kernel`.
    pub order: String,
    /// L, queries and keys (self-attention, one head, no mask).
    pub seq_len: usize,
    /// d.
    pub head_dim: usize,
    /// M, fast memory in elements, where the order's blocks follow from it (flash1);
    /// empty where they do not (standard reads each operand once; the kernel's tiles are
    /// fixed).
    pub sram_elements: Option<usize>,
    /// The query and key block sizes the order ran with.
    pub b_q: usize,
    pub b_kv: usize,
    /// Elements read from and written to slow memory.
    pub reads: u64,
    pub writes: u64,
}

impl IoRow {
    pub fn total(&self) -> u64 {
        self.reads + self.writes
    }
}

/// Writes `rows` to `dir/io.csv`; returns its path.
pub fn write(dir: &Path, rows: &[IoRow]) -> Result<PathBuf> {
    write_csv(dir, CSV, rows)
}

/// The rows of `dir/io.csv` (an error naming the file when it is missing or bad).
pub fn read(dir: &Path) -> Result<Vec<IoRow>> {
    read_csv(dir, CSV)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_read_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read(dir.path()).unwrap_err().to_string().contains(CSV));
        let rows = vec![
            IoRow {
                order: STANDARD.into(),
                seq_len: 1024,
                head_dim: 64,
                sram_elements: None,
                b_q: 64,
                b_kv: 64,
                reads: 3 << 20,
                writes: 1 << 21,
            },
            IoRow {
                order: FLASH1.into(),
                seq_len: 1024,
                head_dim: 64,
                sram_elements: Some(16384),
                b_q: 64,
                b_kv: 64,
                reads: 7,
                writes: 5,
            },
        ];
        write(dir.path(), &rows).unwrap();
        assert_eq!(read(dir.path()).unwrap(), rows);
    }
}
