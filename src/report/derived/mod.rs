//! The files a sweep derives from its rows beside `runs.csv`: `decode.md` (decode
//! bandwidth tables), `bpt.md` (BPT's Tables 2-4 from the layer rows) and, for configs with
//! `[model]`, the Tree-vs-Ring reproduction (`tree_vs_ring.md`, its CSVs and SVG, which
//! simulate the counted communication and time this machine's compute rate). O(rows) plus
//! the simulations `tree_vs_ring` names.

pub mod bpt_md;
pub mod compute_rate;
pub mod decode_md;
pub mod svg;
pub mod tree_vs_ring;

use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::error::Result;
use crate::results::record::Record;

/// The names of every file [`write_results`] may write beside the CSV (a `--force` sweep
/// removes them, so none is left from the run it replaces).
pub const DERIVED_FILES: [&str; 6] = [
    decode_md::MARKDOWN,
    bpt_md::MARKDOWN,
    tree_vs_ring::MARKDOWN,
    tree_vs_ring::COUNTS_CSV,
    tree_vs_ring::LATENCY_CSV,
    tree_vs_ring::PLOT,
];

/// The derived files of a finished sweep in `dir`, from its `runs.csv`: the renderings of
/// [`write_renderings`], and the Tree-vs-Ring files when the config has `[model]`. Returns
/// the paths written.
pub fn write_results(dir: &Path, config: &Config, csv: &Path) -> Result<Vec<PathBuf>> {
    let records = crate::results::runs::read_if_present(csv)?;
    let mut paths = write_renderings(
        dir,
        &records,
        config.run.model_layers,
        config.run.memory_budget.map(|b| b.0),
    )?;
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

/// The derived files that are renderings of the rows alone, so `attnbench report`
/// regenerates them too: `decode.md` when there are decode rows, `bpt.md` when there are
/// layer rows (`model_layers` and `budget`: the config's `run.model_layers` and
/// `run.memory_budget`). Returns the paths written.
pub fn write_renderings(
    dir: &Path,
    records: &[Record],
    model_layers: Option<usize>,
    budget: Option<u64>,
) -> Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    paths.extend(decode_md::write(dir, records)?);
    paths.extend(bpt_md::write(dir, records, model_layers, budget)?);
    Ok(paths)
}
