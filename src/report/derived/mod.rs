//! The files derived from a run's rows beside `runs.csv`: `decode.md` (decode bandwidth
//! tables, and paged-decode against flash-decoding), `prefill.md` (chunked prefill against
//! one flash call), `bpt.md` (BPT's Tables 2-4 from the layer rows, and with
//! `model_layers` its budget sweep, `bpt_budget_sweep.csv` and `.svg`) and, for configs with
//! `[model]`, the Tree-vs-Ring reproduction (`tree_vs_ring.md`, its latency CSV and SVG)
//! from what the sweep measured for it (`results::tree_vs_ring`). Renderings only, so
//! `sweep` and `report` write the same bytes. O(rows) plus O(|p| |N|) plan pricings.

pub mod bpt_budget;
pub mod bpt_md;
pub mod decode_md;
pub mod generate_md;
pub mod io_md;
pub mod prefill_md;
pub mod softmax_md;
pub mod svg;
pub mod tree_vs_ring;

use std::path::{Path, PathBuf};

use crate::config::ModelConfig;
use crate::error::Result;
use crate::results::record::Record;
use crate::results::tree_vs_ring::Measured;

/// The names of every file [`write_renderings`] may write (a `--force` sweep removes them,
/// so none is left from the run it replaces).
pub const DERIVED_FILES: [&str; 10] = [
    decode_md::MARKDOWN,
    decode_md::PAGING_PLOT,
    prefill_md::MARKDOWN,
    prefill_md::PLOT,
    bpt_md::MARKDOWN,
    bpt_budget::CSV,
    bpt_budget::PLOT,
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
    /// `meta.json`'s read bandwidths, (threads, 10⁹ B/s) (`results::meta::read_bandwidths`):
    /// the read roofline of `decode.md`.
    pub read_bandwidth: &'a [(usize, f64)],
}

/// What two rows share when they ran the same problem on the same inputs: everything but
/// the variant and its own settings (chunks, splits, pages, prefill chunk). The derived
/// tables set a variant against another by it (paged-decode against flash-decoding,
/// chunked prefill against flash), and the report's summary each variant against its
/// reference.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Problem<'a> {
    run: &'a str,
    device: &'a str,
    dtype: &'a str,
    mode: &'a str,
    /// batch, heads, kv_heads, seq_q, seq_kv, head_dim.
    shape: [usize; 6],
    batch_spec: &'a str,
    causal: bool,
    window: Option<usize>,
    threads: usize,
    devices: usize,
    seed: u64,
    input_dist: &'a str,
    input_scale_bits: u64,
}

/// The problem `r` ran.
pub fn problem(r: &Record) -> Problem<'_> {
    Problem {
        run: &r.run,
        device: &r.device,
        dtype: &r.dtype,
        mode: &r.mode,
        shape: [r.batch, r.heads, r.kv_heads, r.seq_q, r.seq_kv, r.head_dim],
        batch_spec: &r.batch_spec,
        causal: r.causal,
        window: r.window,
        threads: r.threads,
        devices: r.devices,
        seed: r.seed,
        input_dist: &r.input_dist,
        input_scale_bits: r.input_scale.to_bits(),
    }
}

/// Whether two rows ran the same problem on the same inputs (`Problem`).
pub fn same_problem(a: &Record, b: &Record) -> bool {
    problem(a) == problem(b)
}

/// Writes the derived files into `dir`: `decode.md` when there are decode rows, `bpt.md`
/// when there are layer rows, the Tree-vs-Ring files when there are `[model]` and its
/// measurements. Returns the paths written.
pub fn write_renderings(dir: &Path, s: &Sources) -> Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    paths.extend(decode_md::write(dir, s.records, s.read_bandwidth)?);
    paths.extend(prefill_md::write(dir, s.records)?);
    paths.extend(bpt_md::write(dir, s.records, s.model_layers, s.budget)?);
    if let (Some(model), Some(measured)) = (s.model, s.measured) {
        paths.extend(tree_vs_ring::write(dir, model, measured, s.records)?);
    }
    Ok(paths)
}
