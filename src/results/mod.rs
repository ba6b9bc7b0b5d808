//! The results directory and its files, and the only code that reads or writes them:
//! `runs.csv` (one `Record` per case; `runs`), `samples.csv` (every timed repetition;
//! `samples`), `meta.json` (what produced the numbers; `meta`), the Tree-vs-Ring
//! measurements of a `[model]` sweep (`tree_vs_ring`), written durably
//! (`durable`) and read back for reports (`load`) and comparisons (`compared`). Formats:
//! docs/reference/results-format.md.

pub mod compared;
pub mod durable;
pub mod generate;
pub mod hbm_io;
pub mod load;
pub mod meta;
pub mod record;
pub mod runs;
pub mod samples;
pub mod softmax;
pub mod table_csv;
pub mod tree_vs_ring;

/// One row per case.
pub const CSV_NAME: &str = "runs.csv";
/// What produced the numbers.
pub const META_NAME: &str = "meta.json";
/// The seconds of every timed repetition.
pub const SAMPLES_NAME: &str = "samples.csv";
