//! The Tree-vs-Ring measurements a sweep with `[model]` writes beside `runs.csv`, and the
//! only code that reads them back (Shyam et al. Sec. 6; docs/papers.md, Shyam et al.):
//! `tree_vs_ring_counts.csv` (simulated ring and tree decode counted against eqs. 8-14),
//! `tree_vs_ring_balance.csv` (causal work of striped vs ring prefill) and, when the
//! compute term is timed on this machine, `tree_vs_ring_compute.csv`. The report renders
//! `tree_vs_ring.md` and its figure from them. O(rows).

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::results::table_csv::{read_csv, write_csv};

pub const COUNTS_CSV: &str = "tree_vs_ring_counts.csv";
pub const BALANCE_CSV: &str = "tree_vs_ring_balance.csv";
pub const COMPUTE_CSV: &str = "tree_vs_ring_compute.csv";
/// Every file [`write`] may write (a `--force` sweep removes them).
pub const FILES: [&str; 3] = [COUNTS_CSV, BALANCE_CSV, COMPUTE_CSV];

/// Counted against closed form, for one check shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CountRow {
    pub batch: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub tokens: usize,
    pub devices: usize,
    pub t: usize,
    pub allreduce: String,
    /// Ring: elements of one rotation round, all devices (counted / eq. 10).
    pub ring_volume_per_iteration: u64,
    pub eq10: u64,
    pub ring_rounds: u64,
    /// Tree: elements of the three allreduces, all devices; per device (counted / eq. 14).
    pub tree_volume_total: u64,
    pub tree_volume_per_device: f64,
    pub eq14: f64,
    pub tree_rounds: u64,
    /// Broadcast of q, both methods (not in eqs. 10 and 14).
    pub q_broadcast: u64,
    /// max |out - single-device out| / max |single-device out| (flash-decoding, same inputs).
    pub ring_vs_single: f64,
    pub tree_vs_single: f64,
    /// Peak elements held by the fullest device (counted / eq. 8 or 9).
    pub ring_memory: u64,
    pub eq8: u64,
    pub tree_memory: u64,
    pub eq9: u64,
    pub matches: bool,
}

/// Counted causal work of ring vs striped prefill on p devices (Transformers Inference
/// Optimization Toolset "Stripe Attention"): total pairs, the busiest device's, and the
/// lockstep critical path.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BalanceRow {
    pub devices: usize,
    pub tokens: usize,
    pub total_pairs: u64,
    pub ring_busiest: u64,
    pub stripe_busiest: u64,
    pub ring_critical: u64,
    pub stripe_critical: u64,
    pub gain: f64,
}

/// The compute term timed on this machine: one device's flash-decoding over `tokens`
/// cached tokens, as seconds per cached token.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ComputeRow {
    pub tokens: usize,
    pub threads: usize,
    pub seconds_per_token: f64,
}

/// What a sweep measured for `[model]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    pub counts: Vec<CountRow>,
    pub balance: Vec<BalanceRow>,
    /// `None` when the config's compute term is a roofline.
    pub compute: Option<ComputeRow>,
}

/// Writes the measurements into `dir`; returns the paths written.
pub fn write(dir: &Path, m: &Measured) -> Result<Vec<PathBuf>> {
    let mut paths = vec![
        write_csv(dir, COUNTS_CSV, &m.counts)?,
        write_csv(dir, BALANCE_CSV, &m.balance)?,
    ];
    if let Some(c) = &m.compute {
        paths.push(write_csv(dir, COMPUTE_CSV, std::slice::from_ref(c))?);
    }
    Ok(paths)
}

/// The measurements in `dir`, or `None` when the sweep measured none (no counts file).
/// A counts file without its balance file is an error naming the missing file.
pub fn read(dir: &Path) -> Result<Option<Measured>> {
    if !dir.join(COUNTS_CSV).is_file() {
        return Ok(None);
    }
    let compute = if dir.join(COMPUTE_CSV).is_file() {
        read_csv::<ComputeRow>(dir, COMPUTE_CSV)?.into_iter().next()
    } else {
        None
    };
    Ok(Some(Measured {
        counts: read_csv(dir, COUNTS_CSV)?,
        balance: read_csv(dir, BALANCE_CSV)?,
        compute,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measurements_read_back_as_written_and_a_missing_balance_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        let m = Measured {
            counts: Vec::new(),
            balance: vec![BalanceRow {
                devices: 4,
                tokens: 1024,
                total_pairs: 524_800,
                ring_busiest: 229_376,
                stripe_busiest: 131_328,
                ring_critical: 229_376,
                stripe_critical: 131_328,
                gain: 229_376.0 / 131_328.0,
            }],
            compute: Some(ComputeRow {
                tokens: 512,
                threads: 2,
                seconds_per_token: 1.234_567_890_123e-9,
            }),
        };
        write(dir.path(), &m).unwrap();
        assert_eq!(read(dir.path()).unwrap(), Some(m));
        std::fs::remove_file(dir.path().join(BALANCE_CSV)).unwrap();
        let e = read(dir.path()).unwrap_err().to_string();
        assert!(e.contains(BALANCE_CSV), "{e}");
    }
}
