//! One measured case as one tidy CSV row. The column order is the CSV header: keep it
//! stable and add new columns at the end (docs/reference/results-format.md documents every column and its unit).

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::problem::Case;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Measured.
    #[default]
    Ok,
    /// Did not fit the memory budget: predicted (not run) or refused at allocation.
    Oom,
    /// Not applicable (unsupported combination, device not available); reason says why.
    Skipped,
    /// Exceeded a time limit.
    Timeout,
    /// Ran but failed (e.g. non-finite output), or a runtime failure.
    Error,
}

impl Status {
    /// Every status, in the order reports list them.
    pub const ALL: [Status; 5] = [
        Status::Ok,
        Status::Oom,
        Status::Skipped,
        Status::Timeout,
        Status::Error,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Oom => "oom",
            Status::Skipped => "skipped",
            Status::Timeout => "timeout",
            Status::Error => "error",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub run: String,
    pub case_id: String,
    pub variant: String,
    pub device: String,
    pub dtype: String,
    pub mode: String,
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub seq_q: usize,
    pub seq_kv: usize,
    pub head_dim: usize,
    pub q_chunk: Option<usize>,
    pub kv_chunk: Option<usize>,
    pub causal: bool,
    pub window: Option<usize>,
    pub devices: usize,
    pub threads: usize,
    pub status: Status,
    pub reason: String,
    pub reps: usize,
    pub time_median_s: Option<f64>,
    pub time_min_s: Option<f64>,
    pub time_max_s: Option<f64>,
    pub time_mad_s: Option<f64>,
    pub mem_overhead_bytes: Option<u64>,
    pub mem_predicted_bytes: Option<u64>,
    pub peak_rss_bytes: Option<u64>,
    pub io_bytes: u64,
    pub max_abs_err: Option<f64>,
    pub max_rel_err: Option<f64>,
    pub err_rows: Option<usize>,
    pub flops: f64,
    pub gflops: Option<f64>,
    pub comm_bytes: Option<u64>,
    pub comm_steps: Option<u64>,
    pub seed: u64,
    // Added after the design's minimum set (append only).
    pub input_dist: String,
    pub input_scale: f64,
    /// Why the timed repetitions stopped: converged, max_reps, time_cap, interrupted.
    pub stopped_by: String,
    /// fwd+bwd: median time of the backward alone (within the same repetitions).
    #[serde(default)]
    pub time_bwd_median_s: Option<f64>,
    /// fwd+bwd: max abs error of the gradients against the f64 oracle.
    #[serde(default)]
    pub grad_max_abs_err: Option<f64>,
    /// fwd+bwd: `grad_max_abs_err` / the largest |exact gradient| entry (normwise).
    #[serde(default)]
    pub grad_max_rel_err: Option<f64>,
    /// fwd+bwd: query rows of dQ checked.
    #[serde(default)]
    pub grad_err_rows: Option<usize>,
    /// fwd+bwd: gradients checked, `dq,dk,dv` (all, exact) or `dq` (sampled rows).
    #[serde(default)]
    pub grad_err_scope: String,
    /// fwd+bwd: upstream gradient, `random` or `ones`.
    #[serde(default)]
    pub d_out: String,
    // Added for reports and Rabe–Staats Table 2 (append only; `default` so that CSV files
    // written before these columns existed still read).
    /// The time columns were measured on the first `timed_rows` query rows and scaled by
    /// `seq_q / timed_rows` (`[run] extrapolate_above_s`); never set silently.
    #[serde(default)]
    pub extrapolated: bool,
    /// Query rows per (batch, head) the timed calls computed (= `seq_q` unless extrapolated).
    #[serde(default)]
    pub timed_rows: Option<usize>,
    /// The variant `max_abs_diff` compares with (`[run] diff_against`); empty when none.
    #[serde(default)]
    pub diff_variant: String,
    /// max |out - out of `diff_variant`| over every output value computed, both on the same
    /// inputs; empty when not requested or when `diff_variant` did not fit the budget.
    #[serde(default)]
    pub max_abs_diff: Option<f64>,
    /// flash-decoding: split-KV parts.
    #[serde(default)]
    pub splits: Option<usize>,
    /// Multi-device variants with collectives: the allreduce algorithm.
    #[serde(default)]
    pub allreduce: String,
    /// Decode: bytes of the cached K and V the queries attend, each read once.
    #[serde(default)]
    pub kv_read_bytes: Option<u64>,
    /// Decode: `kv_read_bytes` / `time_median_s` / 1e9.
    #[serde(default)]
    pub kv_gbytes_per_s: Option<f64>,
    /// Decode: the calibrated copy bandwidth at the case's thread count (meta.json).
    #[serde(default)]
    pub copy_gbytes_per_s: Option<f64>,
    /// Decode: `kv_gbytes_per_s` / `copy_gbytes_per_s`.
    #[serde(default)]
    pub copy_bw_frac: Option<f64>,
    /// Multi-device: elements sent by all devices in all collectives.
    #[serde(default)]
    pub comm_elements: Option<u64>,
    /// Multi-device: bytes sent by the device that sent the most.
    #[serde(default)]
    pub comm_max_device_bytes: Option<u64>,
    /// Multi-device: the largest per-device peak of tensors held, elements (eqs. (8)-(9)).
    #[serde(default)]
    pub device_peak_elements: Option<u64>,
    /// Multi-device: the largest per-device peak of tensors held, bytes.
    #[serde(default)]
    pub device_peak_bytes: Option<u64>,
    /// Multi-device: query-key pairs attended by the busiest device.
    #[serde(default)]
    pub device_pairs_max: Option<u64>,
    /// Multi-device: sum over steps of the busiest device's pairs in that step.
    #[serde(default)]
    pub critical_path_pairs: Option<u64>,
    /// MPI: median seconds per call spent communicating, on the slowest rank.
    #[serde(default)]
    pub comm_time_s: Option<f64>,
    /// MPI: the same on the fastest rank (less waiting for slower peers).
    #[serde(default)]
    pub comm_time_min_s: Option<f64>,
    /// MPI: bytes the simulation sends for the same case and p (all devices).
    #[serde(default)]
    pub sim_comm_bytes: Option<u64>,
    /// MPI: bytes the simulation's busiest device sends.
    #[serde(default)]
    pub sim_comm_max_device_bytes: Option<u64>,
    /// CPU cases: the machine-speed probe (`measure::probe`) run on every thread of the
    /// case's pool just before and after its timed repetitions, mean GFLOP/s per thread.
    #[serde(default)]
    pub probe_gflops: Option<f64>,
    /// Paged KV cache (`paged-decode`): tokens per page; empty for a contiguous cache.
    #[serde(default)]
    pub page_size: Option<usize>,
    /// Paged KV cache: `shuffled` or `contiguous` physical page order; empty otherwise.
    #[serde(default)]
    pub page_order: String,
    /// Chunked prefill (`chunked-prefill`): prompt tokens per step; empty otherwise.
    #[serde(default)]
    pub prefill_chunk: Option<usize>,
    /// Chunked prefill: steps per call, ⌈seq_q / prefill_chunk⌉.
    #[serde(default)]
    pub prefill_steps: Option<usize>,
    /// Chunked prefill: median over the timed calls of each call's longest step, seconds
    /// (what a decode batched with the prompt waits at most per step).
    #[serde(default)]
    pub step_max_median_s: Option<f64>,
    /// Ragged batch (`flash-varlen`): the sequences, `[COUNTx]qLEN[kvLEN]` joined by `+`;
    /// `seq_q` and `seq_kv` are then their packed totals. Empty otherwise.
    #[serde(default)]
    pub batch_spec: String,
    /// The CPU kernel path the case forced (`kernel_path`: `avx512-bf16`, `avx512`, `avx2`,
    /// `portable`); empty: the run's default path (`meta.json`'s `cpu_kernel_path`).
    #[serde(default)]
    pub kernel_path: String,
    /// Decode: cached tokens the batch's requests share (`prefix_len`); empty where each
    /// request's cache is its own.
    #[serde(default)]
    pub prefix_len: Option<usize>,
    /// K and V stored as FP8 (`kv_dtype`: `fp8e4m3`, `fp8e5m2`); empty: as `dtype`.
    #[serde(default)]
    pub kv_dtype: String,
    /// An FP8 cache: max abs error of the output against the f64 oracle on the unquantized
    /// K and V (`max_abs_err` is against the cache as stored); empty otherwise.
    #[serde(default)]
    pub max_abs_err_unquantized: Option<f64>,
    /// Multi-head latent attention (`mla-decode`): the latent dimension d_c of its cache;
    /// empty otherwise.
    #[serde(default)]
    pub latent_dim: Option<usize>,
    /// Multi-head latent attention: the decoupled RoPE key dimension d_r; empty otherwise.
    #[serde(default)]
    pub rope_dim: Option<usize>,
    /// Attention sinks: the first keys every query sees beside its sliding window
    /// (`sinks`); empty without.
    #[serde(default)]
    pub sinks: Option<usize>,
    /// P's precision for PV (`precision`: `fast`, `highest`); empty: `fast`, the default.
    #[serde(default)]
    pub precision: String,
}

impl Record {
    /// A row with the case's identity filled and nothing measured yet.
    /// The row of `case` before measuring: what the case alone determines. The runner adds
    /// what its variant determines (`crate::run::record_for`: bytes of K and V read).
    pub fn for_case(run: &str, case: &Case, status: Status, reason: impl Into<String>) -> Record {
        let s = &case.shape;
        Record {
            run: run.to_string(),
            case_id: case.id(),
            variant: case.variant_name().to_string(),
            device: case.device.name().to_string(),
            dtype: case.dtype.name().to_string(),
            mode: case.mode.name().to_string(),
            batch: s.batch,
            heads: s.heads,
            kv_heads: s.kv_heads,
            seq_q: s.seq_q,
            seq_kv: s.seq_kv,
            head_dim: s.head_dim,
            q_chunk: case.q_chunk,
            kv_chunk: case.kv_chunk,
            causal: case.causal,
            window: case.window,
            devices: case.devices,
            threads: case.threads,
            status,
            reason: reason.into(),
            reps: 0,
            time_median_s: None,
            time_min_s: None,
            time_max_s: None,
            time_mad_s: None,
            mem_overhead_bytes: None,
            mem_predicted_bytes: None,
            peak_rss_bytes: None,
            io_bytes: case.io_bytes(),
            max_abs_err: None,
            max_rel_err: None,
            err_rows: None,
            flops: case.flops(),
            gflops: None,
            comm_bytes: None,
            comm_steps: None,
            seed: case.seed,
            input_dist: case.input_dist.name().to_string(),
            input_scale: case.input_scale,
            stopped_by: String::new(),
            time_bwd_median_s: None,
            grad_max_abs_err: None,
            grad_max_rel_err: None,
            grad_err_rows: None,
            grad_err_scope: String::new(),
            d_out: match case.mode {
                crate::problem::Mode::FwdBwd => case.d_out.name().to_string(),
                _ => String::new(),
            },
            extrapolated: false,
            timed_rows: None,
            diff_variant: String::new(),
            max_abs_diff: None,
            splits: case.splits,
            allreduce: case.allreduce.map_or(String::new(), |a| a.to_string()),
            kv_read_bytes: None,
            kv_gbytes_per_s: None,
            copy_gbytes_per_s: None,
            copy_bw_frac: None,
            comm_elements: None,
            comm_max_device_bytes: None,
            device_peak_elements: None,
            device_peak_bytes: None,
            device_pairs_max: None,
            critical_path_pairs: None,
            comm_time_s: None,
            comm_time_min_s: None,
            sim_comm_bytes: None,
            sim_comm_max_device_bytes: None,
            probe_gflops: None,
            page_size: case.paging.map(|p| p.page_size),
            page_order: case.paging.map_or(String::new(), |p| p.order.to_string()),
            prefill_chunk: case.prefill_chunk,
            prefill_steps: case
                .prefill_chunk
                .map(|c| case.shape.seq_q.div_ceil(c.max(1))),
            step_max_median_s: None,
            batch_spec: case
                .batch_spec
                .as_ref()
                .map_or(String::new(), |b| b.to_string()),
            kernel_path: case
                .kernel_path
                .map_or(String::new(), |p| p.name().to_string()),
            prefix_len: case.prefix_len,
            kv_dtype: case.kv_dtype.map_or(String::new(), |f| f.to_string()),
            max_abs_err_unquantized: None,
            latent_dim: case.mla.map(|m| m.latent_dim),
            rope_dim: case.mla.map(|m| m.rope_dim),
            sinks: case.sinks,
            precision: case.precision.map_or(String::new(), |p| p.to_string()),
        }
    }

    /// Fills the achieved KV bandwidth against the calibrated copy bandwidth (`copy`, 10⁹
    /// B/s at the case's thread count), for rows that read a KV cache and were timed.
    pub fn set_bandwidth(&mut self, copy: Option<f64>) {
        if let (Some(bytes), Some(t)) = (self.kv_read_bytes, self.time_median_s) {
            if t > 0.0 {
                let gbs = bytes as f64 / t / 1e9;
                self.kv_gbytes_per_s = Some(gbs);
                if let Some(c) = copy.filter(|c| *c > 0.0) {
                    self.copy_gbytes_per_s = Some(c);
                    self.copy_bw_frac = Some(gbs / c);
                }
            }
        }
    }

    /// Fills the simulated cluster's counters.
    pub fn set_sim(&mut self, stats: &crate::sim::stats::SimStats) {
        // Traffic the MPI library moved itself is not ours to count: empty, not 0.
        let counted = |x: u64| (!stats.uncounted).then_some(x);
        self.comm_bytes = counted(stats.bytes());
        self.comm_steps = counted(stats.steps());
        self.comm_elements = counted(stats.elements());
        self.comm_max_device_bytes = counted(stats.max_device_bytes());
        self.device_peak_elements = Some(stats.peak_elements());
        self.device_peak_bytes = Some(stats.peak_bytes());
        self.device_pairs_max = Some(stats.pairs_max());
        self.critical_path_pairs = Some(stats.pairs_critical());
        self.comm_time_s = stats.comm_time_s;
        self.comm_time_min_s = stats.comm_time_min_s;
        self.sim_comm_bytes = stats.sim_bytes;
        self.sim_comm_max_device_bytes = stats.sim_max_device_bytes;
    }

    /// Every column name with this record's value as text, in CSV order (the CSV row's
    /// fields, empty where the row's cell is empty).
    pub fn fields(&self) -> Vec<(String, String)> {
        let mut w = ::csv::WriterBuilder::new().from_writer(Vec::new());
        // Serializing a plain struct to memory cannot fail.
        let _ = w.serialize(self);
        let bytes = w.into_inner().unwrap_or_default();
        let mut r = ::csv::ReaderBuilder::new().from_reader(bytes.as_slice());
        let header: Vec<String> = r
            .headers()
            .map(|h| h.iter().map(str::to_string).collect())
            .unwrap_or_default();
        let values: Vec<String> = r
            .records()
            .next()
            .and_then(|x| x.ok())
            .map(|x| x.iter().map(str::to_string).collect())
            .unwrap_or_default();
        header.into_iter().zip(values).collect()
    }
}

/// The CSV header, in order.
pub fn header() -> Vec<String> {
    Record::default()
        .fields()
        .into_iter()
        .map(|(k, _)| k)
        .collect()
}

/// One record as a JSON object for scripts (`attnbench run --json`): every CSV column, keyed
/// by its header name and in header order, typed: counts and measurements as numbers,
/// `causal` and `extrapolated` as booleans, text as strings, and `null` where the CSV cell
/// is empty (a non-finite number, written `NaN` or `inf` in the CSV, is `null` as well:
/// JSON has no such numbers).
#[derive(Clone, Debug, PartialEq)]
pub struct RecordJson(Vec<(String, serde_json::Value)>);

impl RecordJson {
    pub fn of(record: &Record) -> RecordJson {
        use serde_json::Value;
        // Record's serde form is already typed; the header fixes the order (a JSON object
        // read into a map may lose it).
        let mut typed = match serde_json::to_value(record) {
            Ok(Value::Object(map)) => map,
            // A struct of plain fields always serializes to an object.
            _ => Default::default(),
        };
        let columns = header()
            .into_iter()
            .map(|name| {
                let value = match typed.remove(&name) {
                    Some(Value::String(s)) if s.is_empty() => Value::Null,
                    Some(v) => v,
                    None => Value::Null,
                };
                (name, value)
            })
            .collect();
        RecordJson(columns)
    }

    /// The columns, in CSV order.
    pub fn columns(&self) -> &[(String, serde_json::Value)] {
        &self.0
    }
}

impl Serialize for RecordJson {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// The JSON form has the CSV's columns in its order, `null` exactly where the CSV cell is
    /// empty, and each value equal to the cell it stands for.
    #[test]
    fn json_form_is_the_csv_row_typed() {
        let record = Record {
            run: "r".into(),
            case_id: "id".into(),
            batch: 2,
            causal: true,
            time_median_s: Some(9.151499999999999e-6),
            mem_overhead_bytes: Some(53536),
            max_abs_err: Some(f64::NAN),
            input_scale: 1.0,
            status: Status::Oom,
            reason: "too big".into(),
            ..Record::default()
        };
        let json = RecordJson::of(&record);
        let names: Vec<&str> = json.columns().iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, header());
        let text = serde_json::to_string(&json).unwrap();
        assert!(
            text.starts_with(r#"{"run":"r","case_id":"id","variant":null,"#),
            "{text}"
        );
        for ((name, cell), (key, value)) in record.fields().iter().zip(json.columns()) {
            assert_eq!(name, key);
            match value {
                Value::Null => assert!(
                    cell.is_empty() || cell == "NaN",
                    "{name}: null for the cell `{cell}`"
                ),
                Value::Bool(b) => assert_eq!(cell, &b.to_string(), "{name}"),
                Value::Number(n) => {
                    let x: f64 = cell.parse().unwrap_or_else(|_| panic!("{name}: `{cell}`"));
                    assert_eq!(n.as_f64(), Some(x), "{name}");
                }
                Value::String(s) => assert_eq!(cell, s, "{name}"),
                other => panic!("{name}: {other}"),
            }
        }
        let get = |k: &str| &json.columns().iter().find(|(n, _)| n == k).unwrap().1;
        assert_eq!(get("batch"), &Value::from(2u64));
        assert!(get("batch").is_u64() && get("mem_overhead_bytes").is_u64());
        assert_eq!(get("time_median_s").as_f64(), Some(9.151499999999999e-6));
        assert_eq!(get("causal"), &Value::Bool(true));
        assert_eq!(get("status"), &Value::from("oom"));
        assert!(get("max_abs_err").is_null() && get("window").is_null());
        assert!(get("input_scale").is_f64());
    }
}
