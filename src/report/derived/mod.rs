//! The files derived from a run's rows beside `runs.csv`: `decode.md` (decode bandwidth
//! tables, and paged-decode against flash-decoding), `prefill.md` (chunked prefill against
//! one flash call), `bpt.md` (BPT's Tables 2-4 from the layer rows) and, for configs with
//! `[model]`, the Tree-vs-Ring reproduction (`tree_vs_ring.md`, its latency CSV and SVG)
//! from what the sweep measured for it (`results::tree_vs_ring`). Renderings only, so
//! `sweep` and `report` write the same bytes. O(rows) plus O(|p| |N|) plan pricings.

pub mod bpt_md;
pub mod decode_md;
pub mod prefill_md;
pub mod svg;
pub mod tree_vs_ring;

use std::path::{Path, PathBuf};

use crate::config::ModelConfig;
use crate::error::Result;
use crate::results::record::Record;
use crate::results::tree_vs_ring::Measured;

/// The names of every file [`write_renderings`] may write (a `--force` sweep removes them,
/// so none is left from the run it replaces).
pub const DERIVED_FILES: [&str; 8] = [
    decode_md::MARKDOWN,
    decode_md::PAGING_PLOT,
    prefill_md::MARKDOWN,
    prefill_md::PLOT,
    bpt_md::MARKDOWN,
    tree_vs_ring::MARKDOWN,
    tree_vs_ring::LATENCY_CSV,
    tree_vs_ring::PLOT,
];

/// What the derived files are rendered from: the rows and what the config says of them.
pub struct Sources<'a> {
    pub records: &'a [Record],
    /// `run.model_layers`: the depth of the model a layer case belongs to.
    pub model_layers: Option<usize>,
    /// `run.memory_budget`.
    pub budget: Option<u64>,
    /// `[model]` and what the sweep measured for it; the Tree-vs-Ring files need both.
    pub model: Option<&'a ModelConfig>,
    pub measured: Option<&'a Measured>,
}

/// Whether two rows ran the same problem on the same inputs: everything but the variant and
/// its own settings (chunks, splits, pages, prefill chunk). The derived tables set a
/// variant against another with it (paged-decode against flash-decoding, chunked prefill
/// against flash).
pub fn same_problem(a: &Record, b: &Record) -> bool {
    (
        a.run.as_str(),
        a.device.as_str(),
        a.dtype.as_str(),
        a.mode.as_str(),
    ) == (
        b.run.as_str(),
        b.device.as_str(),
        b.dtype.as_str(),
        b.mode.as_str(),
    ) && (a.batch, a.heads, a.kv_heads, a.seq_q, a.seq_kv, a.head_dim)
        == (b.batch, b.heads, b.kv_heads, b.seq_q, b.seq_kv, b.head_dim)
        && (a.causal, a.window, a.threads, a.devices) == (b.causal, b.window, b.threads, b.devices)
        && (a.seed, a.input_dist.as_str(), a.input_scale.to_bits())
            == (b.seed, b.input_dist.as_str(), b.input_scale.to_bits())
}

/// Writes the derived files into `dir`: `decode.md` when there are decode rows, `bpt.md`
/// when there are layer rows, the Tree-vs-Ring files when there are `[model]` and its
/// measurements. Returns the paths written.
pub fn write_renderings(dir: &Path, s: &Sources) -> Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    paths.extend(decode_md::write(dir, s.records)?);
    paths.extend(prefill_md::write(dir, s.records)?);
    paths.extend(bpt_md::write(dir, s.records, s.model_layers, s.budget)?);
    if let (Some(model), Some(measured)) = (s.model, s.measured) {
        paths.extend(tree_vs_ring::write(dir, model, measured, s.records)?);
    }
    Ok(paths)
}
