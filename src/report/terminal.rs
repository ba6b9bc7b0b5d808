//! Plain-text tables for the terminal: one case as `field  value` lines (`attnbench run`),
//! and a compact summary of a sweep's records.

use crate::results::record::Record;
use crate::units;

/// One record as aligned `field  value` lines, every CSV column in CSV order.
pub fn record_table(record: &Record) -> String {
    let fields = record.fields();
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    fields
        .iter()
        .map(|(k, v)| format!("{k:<width$}  {}\n", if v.is_empty() { "-" } else { v }))
        .collect()
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
