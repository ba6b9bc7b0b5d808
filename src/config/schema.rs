//! The config file's serde shape: tables and their known keys (`deny_unknown_fields`, so
//! toml reports an unknown key with its line and the known ones). Leaves stay raw
//! `toml::Value`s; `run.rs` and `axes.rs` check them and name the key in their errors.

use serde::Deserialize;
use toml::Value;

use super::axis::Axis;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub run: Option<RawRun>,
    pub axes: Option<RawAxes>,
    #[serde(default)]
    pub zip: Vec<RawAxes>,
    pub report: Option<RawReport>,
    pub model: Option<RawModel>,
    /// `[plugins]`: NAME = library (`externals.rs`).
    pub plugins: Option<toml::Table>,
    /// `[python]`: NAME = { call, arrays, python, path, timeout_s }.
    pub python: Option<toml::Table>,
}

/// `[model]` (see `model.rs` for meanings and defaults).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawModel {
    pub topology: Option<Value>,
    pub devices_per_node: Option<Value>,
    pub alpha_intra_us: Option<Value>,
    pub alpha_inter_us: Option<Value>,
    pub beta_intra_gbs: Option<Value>,
    pub beta_inter_gbs: Option<Value>,
    pub compute: Option<Value>,
    pub probe_tokens: Option<Value>,
    pub devices: Option<Value>,
    pub tokens: Option<Value>,
    pub batch: Option<Value>,
    pub heads: Option<Value>,
    pub head_dim: Option<Value>,
    pub dtype: Option<Value>,
    pub allreduce: Option<Value>,
    pub overlap: Option<Value>,
    pub check: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRun {
    pub name: Option<Value>,
    pub seed: Option<Value>,
    pub warmup: Option<Value>,
    pub warmup_s: Option<Value>,
    pub min_reps: Option<Value>,
    pub max_reps: Option<Value>,
    pub min_time_s: Option<Value>,
    pub max_time_s: Option<Value>,
    pub rel_spread: Option<Value>,
    pub memory_budget: Option<Value>,
    pub error_rows: Option<Value>,
    pub threads: Option<Value>,
    pub calibrate: Option<Value>,
    pub extrapolate_above_s: Option<Value>,
    pub extrapolate_q_chunks: Option<Value>,
    pub diff_against: Option<Value>,
    pub model_layers: Option<Value>,
    pub cold: Option<Value>,
    pub tf32: Option<Value>,
    pub innermost: Option<Value>,
    pub interleave: Option<Value>,
    pub decode_gemm_rows: Option<Value>,
    pub kernel_path: Option<Value>,
}

/// `[report]`: what reports join with the measured rows.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReport {
    pub paper_table: Option<Value>,
    pub reference: Option<Value>,
}

/// The keys of `[report]`, for `--set report.KEY=...`.
pub(super) const REPORT_KEYS: [&str; 2] = ["paper_table", "reference"];

/// The keys of `[run]`, for `--set run.KEY=...` (kept equal to `RawRun`'s fields by a test).
pub(super) const RUN_KEYS: [&str; 23] = [
    "name",
    "seed",
    "warmup",
    "warmup_s",
    "min_reps",
    "max_reps",
    "min_time_s",
    "max_time_s",
    "rel_spread",
    "memory_budget",
    "error_rows",
    "threads",
    "calibrate",
    "extrapolate_above_s",
    "extrapolate_q_chunks",
    "diff_against",
    "model_layers",
    "cold",
    "tf32",
    "innermost",
    "interleave",
    "decode_gemm_rows",
    "kernel_path",
];

/// `[axes]` and each `[[zip]]` group: every key is optional here; required axes and
/// defaults are decided in `axes.rs`, after `--set`s and across zip groups.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAxes {
    pub variant: Option<Value>,
    pub mode: Option<Value>,
    pub device: Option<Value>,
    pub dtype: Option<Value>,
    pub kv_dtype: Option<Value>,
    pub batch: Option<Value>,
    pub heads: Option<Value>,
    pub kv_heads: Option<Value>,
    pub seq_len: Option<Value>,
    pub seq_kv: Option<Value>,
    pub head_dim: Option<Value>,
    pub q_chunk: Option<Value>,
    pub kv_chunk: Option<Value>,
    pub causal: Option<Value>,
    pub window: Option<Value>,
    pub input_dist: Option<Value>,
    pub input_scale: Option<Value>,
    pub d_out: Option<Value>,
    pub threads: Option<Value>,
    pub kernel_path: Option<Value>,
    pub devices: Option<Value>,
    pub precision: Option<Value>,
    pub allreduce: Option<Value>,
    pub splits: Option<Value>,
    pub page_size: Option<Value>,
    pub page_order: Option<Value>,
    pub prefill_chunk: Option<Value>,
    pub batch_spec: Option<Value>,
    pub prefix_len: Option<Value>,
    pub latent_dim: Option<Value>,
    pub rope_dim: Option<Value>,
    pub sinks: Option<Value>,
}

impl RawAxes {
    /// The keys present, in file-schema order.
    pub fn into_entries(self) -> Vec<(Axis, Value)> {
        [
            (Axis::Variant, self.variant),
            (Axis::Mode, self.mode),
            (Axis::Device, self.device),
            (Axis::DType, self.dtype),
            (Axis::KvDtype, self.kv_dtype),
            (Axis::Batch, self.batch),
            (Axis::Heads, self.heads),
            (Axis::KvHeads, self.kv_heads),
            (Axis::SeqLen, self.seq_len),
            (Axis::SeqKv, self.seq_kv),
            (Axis::HeadDim, self.head_dim),
            (Axis::QChunk, self.q_chunk),
            (Axis::KvChunk, self.kv_chunk),
            (Axis::Causal, self.causal),
            (Axis::Window, self.window),
            (Axis::Sinks, self.sinks),
            (Axis::InputDist, self.input_dist),
            (Axis::InputScale, self.input_scale),
            (Axis::DOut, self.d_out),
            (Axis::Threads, self.threads),
            (Axis::KernelPath, self.kernel_path),
            (Axis::Devices, self.devices),
            (Axis::Allreduce, self.allreduce),
            (Axis::Splits, self.splits),
            (Axis::PageSize, self.page_size),
            (Axis::PageOrder, self.page_order),
            (Axis::PrefillChunk, self.prefill_chunk),
            (Axis::BatchSpec, self.batch_spec),
            (Axis::PrefixLen, self.prefix_len),
            (Axis::LatentDim, self.latent_dim),
            (Axis::RopeDim, self.rope_dim),
            (Axis::Precision, self.precision),
        ]
        .into_iter()
        .filter_map(|(a, v)| v.map(|v| (a, v)))
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table_of(keys: &[&str]) -> String {
        keys.iter().map(|k| format!("{k} = 1\n")).collect()
    }

    #[test]
    fn key_lists_match_the_schema() {
        let run: RawRun = toml::from_str(&table_of(&RUN_KEYS)).unwrap();
        assert!(run.name.is_some() && run.calibrate.is_some() && run.diff_against.is_some());
        let report: RawReport = toml::from_str(&table_of(&REPORT_KEYS)).unwrap();
        assert!(report.paper_table.is_some());
        let model: RawModel = toml::from_str(&table_of(&super::super::model::MODEL_KEYS)).unwrap();
        assert!(model.topology.is_some() && model.check.is_some());
        let axes: RawAxes = toml::from_str(&table_of(&Axis::names())).unwrap();
        let mut got: Vec<Axis> = axes.into_entries().into_iter().map(|(a, _)| a).collect();
        got.sort();
        assert_eq!(got, Axis::ALL);
        assert!(toml::from_str::<RawAxes>("sequence = 1").is_err());
    }
}
