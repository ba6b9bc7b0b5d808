//! `generate.csv`, the end-to-end generation measurements of Tree Attention's Tables 1-2
//! (Shyam et al., Sec. 6.4 and App. C.3; docs/papers.md, Shyam et al.), and the only code
//! that writes and reads it. One row per (devices, prompt length, method): the simulated
//! time of prefill plus the decode steps and its parts, the bytes the devices sent, and
//! the generation's error against one device. O(rows).

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::results::table_csv::{read_csv, write_csv};

pub const CSV: &str = "generate.csv";

/// The `topology` of generations on real MPI ranks (one machine's processes), in place of
/// the α–β preset that prices simulated ones.
pub const MPI_LINKS: &str = "mpi";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GenerateRow {
    /// `ring` or `tree`: the attention of the decode steps (both prefill with ring).
    pub method: String,
    pub devices: usize,
    /// Prompt tokens N.
    pub tokens: usize,
    pub steps: usize,
    /// The α–β link preset that priced the messages, or `MPI_LINKS` on real ranks.
    pub topology: String,
    /// Generations timed (interleaved with the other method); the row is the median one.
    pub reps: usize,
    /// Seconds of the whole generation, prefill + decode: simulated, or rank 0's wall
    /// clock on MPI ranks.
    pub total_s: f64,
    pub prefill_s: f64,
    /// Of the prefill: attention on the busiest devices, its priced messages (inside the
    /// attention time, overlapped), and the rest of the model (sequence-parallel).
    pub prefill_attention_s: f64,
    pub prefill_comm_s: f64,
    pub prefill_other_s: f64,
    pub decode_s: f64,
    /// Of the decode steps: attention (busiest device plus the priced messages), the
    /// messages alone, and the rest of the model on the last device.
    pub decode_attention_s: f64,
    pub decode_comm_s: f64,
    pub decode_other_s: f64,
    /// Bytes all devices sent in the whole generation (counted by the simulator; on MPI
    /// ranks, those of the schedules that ran).
    pub comm_bytes: u64,
    /// max |logits - one device's| / max |one device's| over every step's logits.
    pub max_rel_err: f64,
    /// Whether every generated token equals one device's.
    pub tokens_match: bool,
}

/// Writes `rows` to `dir/generate.csv`; returns its path.
pub fn write(dir: &Path, rows: &[GenerateRow]) -> Result<PathBuf> {
    write_csv(dir, CSV, rows)
}

/// The rows of `dir/generate.csv` (an error naming the file when it is missing or bad).
pub fn read(dir: &Path) -> Result<Vec<GenerateRow>> {
    read_csv(dir, CSV)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_read_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read(dir.path()).unwrap_err().to_string().contains(CSV));
        let row = GenerateRow {
            method: "tree".into(),
            devices: 4,
            tokens: 2048,
            steps: 10,
            topology: "dgx-h100".into(),
            reps: 3,
            total_s: 0.125,
            prefill_s: 0.1,
            prefill_attention_s: 0.06,
            prefill_comm_s: 1.5e-5,
            prefill_other_s: 0.04,
            decode_s: 0.025,
            decode_attention_s: 0.005,
            decode_comm_s: 2.5e-4,
            decode_other_s: 0.02,
            comm_bytes: 123_456,
            max_rel_err: 3.2e-7,
            tokens_match: true,
        };
        write(dir.path(), std::slice::from_ref(&row)).unwrap();
        assert_eq!(read(dir.path()).unwrap(), vec![row]);
    }
}
