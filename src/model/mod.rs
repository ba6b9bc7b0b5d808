//! Analytic models: BPT's Sec. 3.1 memory calculator (`bpt_memory`, `bpt_table`) and the
//! layer sweeps' Tables 2-4 (`bpt_tables`), the α–β link fitted to measured MPI runs
//! (`fit`), and of
//! attention across devices: the Tree Attention paper's closed forms
//! (`formulas`, eqs. (8)-(14)), the α–β two-level link model with its presets
//! (`topology`), predicted Ring vs Tree decode latency priced on the simulator's own
//! schedules (`cost`), the `[model]` config section (`config`), and the Markdown/CSV/SVG
//! tables a sweep writes beside its CSV (`tables`, `svg`) until the report layer takes
//! them over.

pub mod bpt_memory;
pub mod bpt_table;
pub mod bpt_tables;
pub mod cost;
pub mod decode_tables;
pub mod fit;
pub mod formulas;
pub mod markdown;
pub mod probe;
pub mod svg;
pub mod topology;
pub mod tree_vs_ring;

use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::error::Result;
use crate::results::record::Record;

/// The names of every file [`write_results`] may write beside the CSV (a `--force` sweep
/// removes them, so none is left from the run it replaces).
pub const DERIVED_FILES: [&str; 6] = [
    decode_tables::MARKDOWN,
    bpt_tables::MARKDOWN,
    tree_vs_ring::MARKDOWN,
    tree_vs_ring::COUNTS_CSV,
    tree_vs_ring::LATENCY_CSV,
    tree_vs_ring::PLOT,
];

/// The derived files of a finished sweep in `dir`, from its `runs.csv`: `decode.md` when it
/// has decode rows, the Tree-vs-Ring files when the config has `[model]`. Returns the
/// paths written.
pub fn write_results(dir: &Path, config: &Config, csv: &Path) -> Result<Vec<PathBuf>> {
    let records = read_records(csv)?;
    let mut paths = Vec::new();
    paths.extend(decode_tables::write(dir, &records)?);
    paths.extend(bpt_tables::write(
        dir,
        &records,
        config.run.model_layers,
        config.run.memory_budget.map(|b| b.0),
    )?);
    if let Some(model) = &config.model {
        paths.extend(tree_vs_ring::write(
            dir,
            model,
            config.run.threads,
            &records,
        )?);
    }
    Ok(paths)
}

/// Every row of a `runs.csv` (none if it does not exist).
pub fn read_records(csv: &Path) -> Result<Vec<Record>> {
    if !csv.exists() {
        return Ok(Vec::new());
    }
    crate::results::runs::read(csv)
}
