//! Plain-text tables for the terminal: one case as grouped lines with units (`attnbench
//! run`), and a compact summary of a sweep's records.

use crate::problem::DType;
use crate::results::record::Record;
use crate::units;

/// One line of [`record_table`]: its label, the CSV columns it shows (each column is on
/// exactly one line or in [`NOT_SHOWN`]), and its text, `None` when those columns are empty.
pub struct Line {
    pub label: &'static str,
    pub columns: &'static [&'static str],
    pub render: fn(&Record) -> Option<String>,
}

/// A titled group of lines; a group whose lines are all empty is left out.
pub struct Group {
    pub title: &'static str,
    pub lines: &'static [Line],
}

/// CSV columns the table leaves out on purpose, with why (`run --json` has every column).
pub const NOT_SHOWN: &[(&str, &str)] = &[(
    "run",
    "the run name, always `run` for `attnbench run` (a sweep's config names it)",
)];

/// The table's groups and lines, in print order.
pub const GROUPS: &[Group] = &[
    Group {
        title: "case",
        lines: &[
            Line {
                label: "status",
                columns: &["status"],
                render: |r| Some(r.status.name().to_string()),
            },
            Line {
                label: "reason",
                columns: &["reason"],
                render: |r| text(&r.reason),
            },
            Line {
                label: "kernel",
                columns: &["variant", "mode", "device", "dtype"],
                render: |r| {
                    Some(format!(
                        "{} {} on {}, {}",
                        r.variant, r.mode, r.device, r.dtype
                    ))
                },
            },
            Line {
                label: "shape",
                columns: &["batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim"],
                render: |r| {
                    Some(format!(
                        "batch {}, heads {} (kv {}), seq_q {}, seq_kv {}, head_dim {}",
                        r.batch, r.heads, r.kv_heads, r.seq_q, r.seq_kv, r.head_dim
                    ))
                },
            },
            Line {
                label: "ragged batch",
                columns: &["batch_spec"],
                render: |r| text(&r.batch_spec),
            },
            Line {
                label: "shared prefix",
                columns: &["prefix_len"],
                render: |r| {
                    r.prefix_len
                        .map(|n| format!("{n} cached tokens shared by the batch"))
                },
            },
            Line {
                label: "kernel path",
                columns: &["kernel_path"],
                render: |r| text(&r.kernel_path),
            },
            Line {
                label: "precision",
                columns: &["precision"],
                render: |r| {
                    text(&r.precision).map(|p| match p.as_str() {
                        "highest" => "highest (P kept in f32 for PV)".to_string(),
                        _ => p,
                    })
                },
            },
            Line {
                label: "KV cache",
                columns: &["kv_dtype"],
                render: |r| text(&r.kv_dtype).map(|f| format!("{f}, one scale per KV head")),
            },
            Line {
                label: "chunks",
                columns: &["q_chunk", "kv_chunk"],
                render: |r| {
                    parts([
                        r.q_chunk.map(|c| format!("q {c}")),
                        r.kv_chunk.map(|c| format!("kv {c}")),
                    ])
                },
            },
            Line {
                label: "mask",
                columns: &["causal", "window", "sinks"],
                render: |r| {
                    let mask = if r.causal { "causal" } else { "none" };
                    let sinks = r.sinks.map_or(String::new(), |n| format!(" and {n} sinks"));
                    Some(match r.window {
                        Some(w) => format!("{mask}, sliding window of {w} keys{sinks}"),
                        None => mask.to_string(),
                    })
                },
            },
            Line {
                label: "devices",
                columns: &["devices", "allreduce"],
                render: |r| {
                    Some(match text(&r.allreduce) {
                        Some(a) => format!("{} (allreduce {a})", r.devices),
                        None => r.devices.to_string(),
                    })
                },
            },
            Line {
                label: "splits",
                columns: &["splits"],
                render: |r| r.splits.map(|n| format!("{n} split-KV parts")),
            },
            Line {
                label: "paged cache",
                columns: &["page_size", "page_order"],
                render: |r| {
                    parts([
                        r.page_size.map(|p| format!("{p} tokens a page")),
                        text(&r.page_order).map(|o| format!("{o} pages")),
                    ])
                },
            },
            Line {
                label: "prefill",
                columns: &["prefill_chunk", "prefill_steps"],
                render: |r| {
                    parts([
                        r.prefill_chunk.map(|c| format!("{c} tokens a step")),
                        r.prefill_steps.map(|n| format!("{n} steps a call")),
                    ])
                },
            },
            Line {
                label: "MLA cache",
                columns: &["latent_dim", "rope_dim"],
                render: |r| match (r.latent_dim, r.rope_dim) {
                    (Some(c), Some(k)) => Some(format!(
                        "latent {c} + RoPE {k} = {} values a token, all heads",
                        c + k
                    )),
                    _ => None,
                },
            },
            Line {
                label: "threads",
                columns: &["threads"],
                render: |r| Some(r.threads.to_string()),
            },
            Line {
                label: "inputs",
                columns: &["input_dist", "input_scale", "seed"],
                render: |r| {
                    Some(format!(
                        "{} x{}, seed {}",
                        r.input_dist, r.input_scale, r.seed
                    ))
                },
            },
            Line {
                label: "upstream grad",
                columns: &["d_out"],
                render: |r| text(&r.d_out),
            },
            Line {
                label: "case id",
                columns: &["case_id"],
                render: |r| text(&r.case_id),
            },
        ],
    },
    Group {
        title: "timing",
        lines: &[
            Line {
                label: "median",
                columns: &["time_median_s"],
                render: |r| r.time_median_s.map(units::seconds),
            },
            Line {
                label: "range",
                columns: &["time_min_s", "time_max_s"],
                render: |r| {
                    parts([
                        r.time_min_s.map(|t| format!("min {}", units::seconds(t))),
                        r.time_max_s.map(|t| format!("max {}", units::seconds(t))),
                    ])
                },
            },
            Line {
                label: "MAD",
                columns: &["time_mad_s"],
                render: |r| r.time_mad_s.map(units::seconds),
            },
            Line {
                label: "calls",
                columns: &["reps", "stopped_by"],
                render: |r| {
                    Some(match text(&r.stopped_by) {
                        Some(why) => format!("{} timed, stopped: {why}", r.reps),
                        None => format!("{} timed", r.reps),
                    })
                },
            },
            Line {
                label: "timed rows",
                columns: &["timed_rows", "extrapolated"],
                render: |r| match (r.timed_rows, r.extrapolated) {
                    (Some(n), true) => Some(format!(
                        "{n} per head, times extrapolated to all {}",
                        r.seq_q
                    )),
                    (None, true) => Some("times extrapolated".into()),
                    (Some(n), false) => Some(format!("{n} per head")),
                    (None, false) => None,
                },
            },
            Line {
                label: "backward",
                columns: &["time_bwd_median_s"],
                render: |r| {
                    r.time_bwd_median_s
                        .map(|t| format!("median {}", units::seconds(t)))
                },
            },
            Line {
                label: "longest step",
                columns: &["step_max_median_s"],
                render: |r| {
                    r.step_max_median_s
                        .map(|t| format!("median {}", units::seconds(t)))
                },
            },
            Line {
                label: "throughput",
                columns: &["gflops", "flops"],
                render: |r| {
                    let work = format!("{} FLOP a call", units::sci(r.flops));
                    Some(match r.gflops {
                        Some(g) => format!("{g:.1} GFLOP/s ({work})"),
                        None => work,
                    })
                },
            },
            Line {
                label: "probe",
                columns: &["probe_gflops"],
                render: |r| r.probe_gflops.map(|g| format!("{g:.1} GFLOP/s a thread")),
            },
            Line {
                label: "KV read",
                columns: &[
                    "kv_read_bytes",
                    "kv_gbytes_per_s",
                    "copy_bw_frac",
                    "copy_gbytes_per_s",
                ],
                render: |r| {
                    parts([
                        r.kv_read_bytes.map(|b| units::bytes(b as f64)),
                        r.kv_gbytes_per_s.map(|g| format!("at {g:.1} GB/s")),
                        r.copy_bw_frac
                            .map(|f| format!("{:.0}% of copy bandwidth", f * 100.0)),
                        r.copy_gbytes_per_s.map(|g| format!("copy {g:.1} GB/s")),
                    ])
                },
            },
        ],
    },
    Group {
        title: "memory",
        lines: &[
            Line {
                label: "overhead",
                columns: &["mem_overhead_bytes", "mem_predicted_bytes"],
                render: |r| {
                    let predicted = r.mem_predicted_bytes.map(|b| units::bytes(b as f64));
                    match (r.mem_overhead_bytes, predicted) {
                        (Some(m), Some(p)) => {
                            Some(format!("{} (predicted {p})", units::bytes(m as f64)))
                        }
                        (Some(m), None) => Some(units::bytes(m as f64)),
                        (None, Some(p)) => Some(format!("predicted {p}")),
                        (None, None) => None,
                    }
                },
            },
            Line {
                label: "inputs, output",
                columns: &["io_bytes"],
                render: |r| Some(units::bytes(r.io_bytes as f64)),
            },
            Line {
                label: "peak RSS",
                columns: &["peak_rss_bytes"],
                render: |r| r.peak_rss_bytes.map(|b| units::bytes(b as f64)),
            },
        ],
    },
    Group {
        title: "accuracy",
        lines: &[
            Line {
                label: "max abs error",
                columns: &["max_abs_err"],
                render: |r| r.max_abs_err.map(|e| against_tolerance(e, &r.dtype)),
            },
            Line {
                label: "max rel error",
                columns: &["max_rel_err"],
                render: |r| r.max_rel_err.map(units::sci),
            },
            Line {
                label: "vs unquantized",
                columns: &["max_abs_err_unquantized"],
                render: |r| {
                    r.max_abs_err_unquantized
                        .map(|e| format!("{} (against K, V before FP8)", units::sci(e)))
                },
            },
            Line {
                label: "rows checked",
                columns: &["err_rows"],
                render: |r| r.err_rows.map(|n| n.to_string()),
            },
            Line {
                label: "grad abs error",
                columns: &["grad_max_abs_err"],
                render: |r| r.grad_max_abs_err.map(units::sci),
            },
            Line {
                label: "grad rel error",
                columns: &["grad_max_rel_err"],
                render: |r| r.grad_max_rel_err.map(units::sci),
            },
            Line {
                label: "grad checked",
                columns: &["grad_err_rows", "grad_err_scope"],
                render: |r| {
                    parts([
                        r.grad_err_rows.map(|n| format!("{n} rows")),
                        text(&r.grad_err_scope).map(|s| format!("of {s}")),
                    ])
                },
            },
            Line {
                label: "diff",
                columns: &["max_abs_diff", "diff_variant"],
                render: |r| {
                    parts([
                        r.max_abs_diff.map(|d| format!("max abs {}", units::sci(d))),
                        text(&r.diff_variant).map(|v| format!("against {v}")),
                    ])
                },
            },
        ],
    },
    Group {
        title: "communication",
        lines: &[
            Line {
                label: "sent",
                columns: &["comm_bytes", "comm_elements", "comm_steps"],
                render: |r| {
                    parts([
                        r.comm_bytes.map(|b| units::bytes(b as f64)),
                        r.comm_elements.map(|e| format!("{e} elements")),
                        r.comm_steps.map(|s| format!("in {s} steps")),
                    ])
                },
            },
            Line {
                label: "busiest sender",
                columns: &["comm_max_device_bytes"],
                render: |r| r.comm_max_device_bytes.map(|b| units::bytes(b as f64)),
            },
            Line {
                label: "device peak",
                columns: &["device_peak_bytes", "device_peak_elements"],
                render: |r| {
                    parts([
                        r.device_peak_bytes.map(|b| units::bytes(b as f64)),
                        r.device_peak_elements.map(|e| format!("{e} elements")),
                    ])
                },
            },
            Line {
                label: "pairs",
                columns: &["device_pairs_max", "critical_path_pairs"],
                render: |r| {
                    parts([
                        r.device_pairs_max.map(|p| format!("busiest device {p}")),
                        r.critical_path_pairs.map(|p| format!("critical path {p}")),
                    ])
                },
            },
            Line {
                label: "comm time",
                columns: &["comm_time_s", "comm_time_min_s"],
                render: |r| {
                    parts([
                        r.comm_time_s
                            .map(|t| format!("slowest rank {}", units::seconds(t))),
                        r.comm_time_min_s
                            .map(|t| format!("fastest rank {}", units::seconds(t))),
                    ])
                },
            },
            Line {
                label: "simulated",
                columns: &["sim_comm_bytes", "sim_comm_max_device_bytes"],
                render: |r| {
                    parts([
                        r.sim_comm_bytes
                            .map(|b| format!("{} sent", units::bytes(b as f64))),
                        r.sim_comm_max_device_bytes
                            .map(|b| format!("busiest sender {}", units::bytes(b as f64))),
                    ])
                },
            },
        ],
    },
];

/// Non-empty text, else `None` (an empty CSV cell).
fn text(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

/// The present parts joined by ", "; `None` when none is.
fn parts<const N: usize>(parts: [Option<String>; N]) -> Option<String> {
    let present: Vec<String> = parts.into_iter().flatten().collect();
    (!present.is_empty()).then(|| present.join(", "))
}

/// An output error beside the storage dtype's tolerance (`attnbench list`), the bound the
/// tests hold every numerically safe variant to: "2.1e-7 (tolerance 1e-5)".
fn against_tolerance(err: f64, dtype: &str) -> String {
    match dtype.parse::<DType>() {
        Ok(d) => {
            let tol = d.tolerance();
            let above = if err.is_finite() && err <= tol {
                ""
            } else {
                "above "
            };
            format!("{} ({above}tolerance {tol:e})", units::sci(err))
        }
        Err(_) => units::sci(err),
    }
}

/// One record as grouped, labelled lines with units; lines whose columns are empty are left
/// out. Every CSV column but [`NOT_SHOWN`]'s is on one line (`run --json` prints them all).
pub fn record_table(record: &Record) -> String {
    let groups: Vec<(&str, Vec<(&str, String)>)> = GROUPS
        .iter()
        .map(|g| {
            let lines = g
                .lines
                .iter()
                .filter_map(|l| (l.render)(record).map(|v| (l.label, v)))
                .collect();
            (g.title, lines)
        })
        .filter(|(_, lines): &(_, Vec<_>)| !lines.is_empty())
        .collect();
    let width = groups
        .iter()
        .flat_map(|(_, lines)| lines.iter().map(|(label, _)| label.len()))
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (i, (title, lines)) in groups.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(title);
        out.push('\n');
        for (label, value) in lines {
            out.push_str(&format!("  {label:<width$}  {value}\n"));
        }
    }
    out
}

/// A compact table of records: variant, shape, status, time, GFLOP/s, overhead, error.
pub fn summary_table(records: &[Record]) -> String {
    let mut rows = vec![[
        "variant",
        "dtype",
        "causal",
        "b",
        "h/kv",
        "seq_q",
        "seq_kv",
        "d",
        "thr",
        "status",
        "median",
        "GFLOP/s",
        "overhead",
        "max_abs_err",
    ]
    .map(str::to_string)];
    for r in records {
        rows.push([
            r.variant.clone(),
            r.dtype.clone(),
            r.causal.to_string(),
            r.batch.to_string(),
            format!("{}/{}", r.heads, r.kv_heads),
            r.seq_q.to_string(),
            r.seq_kv.to_string(),
            r.head_dim.to_string(),
            r.threads.to_string(),
            r.status.to_string(),
            r.time_median_s.map_or("-".into(), |t| {
                let mark = if r.extrapolated { " (extrap.)" } else { "" };
                format!("{}{mark}", units::seconds_3dp(t))
            }),
            r.gflops.map_or("-".into(), |g| format!("{g:.1}")),
            r.mem_overhead_bytes.map_or("-".into(), units::bytes_2dp),
            r.max_abs_err.map_or("-".into(), |e| format!("{e:.2e}")),
        ]);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:>w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::record::header;
    use serde_json::{Map, Value};

    fn to_map(r: &Record) -> Map<String, Value> {
        match serde_json::to_value(r).unwrap() {
            Value::Object(m) => m,
            other => panic!("{other}"),
        }
    }

    fn from_map(m: Map<String, Value>) -> Record {
        serde_json::from_value(Value::Object(m)).unwrap()
    }

    /// A record with every column non-empty and non-zero: empty text `<column>-value`,
    /// empty numbers 3, zeros 2.
    fn full() -> Record {
        let mut m = to_map(&Record::default());
        for (k, v) in m.iter_mut() {
            *v = match v.take() {
                Value::Null => Value::from(3),
                Value::String(s) if s.is_empty() => Value::from(format!("{k}-value")),
                Value::Number(n) if n.as_f64() == Some(0.0) => Value::from(2),
                other => other,
            };
        }
        m.insert("status".into(), Value::from("ok"));
        m.insert("dtype".into(), Value::from("f32"));
        from_map(m)
    }

    /// `r` with `column` changed to another value of its type.
    fn perturbed(r: &Record, column: &str) -> Record {
        let mut m = to_map(r);
        let v = m
            .get_mut(column)
            .unwrap_or_else(|| panic!("no column {column}"));
        *v = match v.take() {
            Value::String(s) if column == "status" => {
                Value::from(if s == "ok" { "error" } else { "ok" })
            }
            Value::String(s) => Value::from(format!("{s}Z")),
            Value::Bool(b) => Value::Bool(!b),
            Value::Number(n) if n.is_u64() => Value::from(n.as_u64().unwrap() * 7 + 1),
            Value::Number(n) => Value::from(n.as_f64().unwrap() * 7.0 + 1.0),
            other => panic!("{column}: {other}"),
        };
        from_map(m)
    }

    fn lines() -> impl Iterator<Item = &'static Line> {
        GROUPS.iter().flat_map(|g| g.lines.iter())
    }

    /// Every CSV column is declared on exactly one line or in NOT_SHOWN, and nothing else is.
    #[test]
    fn every_csv_column_is_on_exactly_one_line_or_listed_as_not_shown() {
        let header = header();
        let declared: Vec<&str> = lines()
            .flat_map(|l| l.columns.iter().copied())
            .chain(NOT_SHOWN.iter().map(|(c, _)| *c))
            .collect();
        for col in &header {
            let n = declared.iter().filter(|c| *c == col).count();
            assert_eq!(n, 1, "column `{col}` is declared {n} times");
        }
        for col in &declared {
            assert!(
                header.iter().any(|h| h == col),
                "`{col}` is not a CSV column"
            );
        }
    }

    /// The declarations are true: changing a column changes the text of the line that
    /// declares it, and changing a column listed as not shown changes nothing.
    #[test]
    fn each_line_shows_the_columns_it_declares() {
        let base = full();
        for line in lines() {
            let before = (line.render)(&base);
            assert!(before.is_some(), "{}: empty for a full record", line.label);
            for col in line.columns {
                let after = (line.render)(&perturbed(&base, col));
                assert_ne!(before, after, "line `{}` does not show `{col}`", line.label);
            }
        }
        let table = record_table(&base);
        for (col, _) in NOT_SHOWN {
            assert_eq!(
                table,
                record_table(&perturbed(&base, col)),
                "`{col}` is shown"
            );
        }
    }

    /// The table prints every non-empty line once under its group, and leaves out the lines
    /// (and groups) whose columns are empty.
    #[test]
    fn table_prints_non_empty_lines_with_units_and_leaves_out_empty_ones() {
        let base = full();
        let table = record_table(&base);
        for g in GROUPS {
            assert!(
                table.lines().any(|l| l == g.title),
                "no group {}:\n{table}",
                g.title
            );
        }
        for line in lines() {
            let value = (line.render)(&base).unwrap();
            let printed = table
                .lines()
                .filter(|l| l.starts_with(&format!("  {} ", line.label)) && l.ends_with(&value))
                .count();
            assert_eq!(printed, 1, "`{}  {value}` in:\n{table}", line.label);
        }

        let r = Record {
            dtype: "bf16".into(),
            status: crate::results::record::Status::Ok,
            time_median_s: Some(9.151499999999999e-6),
            mem_overhead_bytes: Some(53536),
            mem_predicted_bytes: Some(53376),
            max_abs_err: Some(2.1e-7),
            ..Record::default()
        };
        let table = record_table(&r);
        let value = |label: &str| {
            table
                .lines()
                .find_map(|l| l.strip_prefix(&format!("  {label} ")))
                .map(str::trim)
                .unwrap_or_else(|| panic!("no {label} in:\n{table}"))
                .to_string()
        };
        assert_eq!(value("median"), "9.15 µs");
        assert_eq!(value("overhead"), "52.3 KiB (predicted 52.1 KiB)");
        assert_eq!(value("max abs error"), "2.1e-7 (tolerance 1.6e-2)");
        assert!(
            !table.contains("communication") && !table.contains("reason"),
            "{table}"
        );
        assert!(
            !table.contains("e-6") && !table.contains("53536"),
            "raw numbers:\n{table}"
        );
        let above = Record {
            max_abs_err: Some(0.5),
            ..r.clone()
        };
        assert!(record_table(&above).contains("5.0e-1 (above tolerance 1.6e-2)"));
    }
}
