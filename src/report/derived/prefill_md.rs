//! `prefill.md` beside a sweep's CSV when it has `chunked-prefill` rows: each chunk size's
//! total time against one causal `flash` call on the same prompt (same run, shape, dtype,
//! inputs and threads), its longest step (the most a decode batched with the prompt waits
//! per step), and the score block one step would hold materialized (chunk x keys so far,
//! at most chunk x n, instead of n x n for the whole prompt). O(rows^2) matching, over
//! the few rows of a sweep.

use std::path::{Path, PathBuf};

use super::same_problem;
use super::svg::{line_chart, Series};
use super::tree_vs_ring::write_file;
use crate::error::Result;
use crate::model::markdown::{seconds, table};
use crate::results::record::Record;

pub const MARKDOWN: &str = "prefill.md";
/// Total time and longest step against chunk size.
pub const PLOT: &str = "prefill.svg";

/// Writes `prefill.md` and `prefill.svg` if `records` hold chunked-prefill rows.
pub fn write(dir: &Path, records: &[Record]) -> Result<Vec<PathBuf>> {
    let rows: Vec<&Record> = records
        .iter()
        .filter(|r| r.prefill_chunk.is_some())
        .collect();
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let ok = |r: &Record| r.time_median_s.filter(|_| r.status.name() == "ok");
    let mut s = String::from("# Chunked prefill\n\n");
    s += "Written by `attnbench sweep` and `attnbench report` (module \
          `src/report/derived/prefill_md.rs`) from `runs.csv`. A prompt of n tokens is \
          prefilled in steps of `chunk` tokens, each attending to the KV cache written so far; \
          `total` is one whole prefill (every step), `vs flash` divides it by one causal \
          `flash` call on the same prompt, `longest step` is the median over the timed calls \
          of each call's longest step: what a decode batched with the prompt waits at most per \
          step. `score block` is the scores one step would hold materialized per head (chunk \
          x the keys so far, at its largest chunk x n), against n x n for the prompt at once.\n\n";
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let flash = records
                .iter()
                .find(|f| f.variant == "flash" && same_problem(f, r))
                .and_then(ok);
            let chunk = r.prefill_chunk.unwrap_or(0);
            vec![
                r.dtype.clone(),
                format!("{}/{}", r.heads, r.kv_heads),
                r.batch.to_string(),
                r.seq_q.to_string(),
                chunk.to_string(),
                r.prefill_steps.map_or("-".into(), |n| n.to_string()),
                r.status.to_string(),
                ok(r).map_or("-".into(), seconds),
                flash.map_or("-".into(), seconds),
                match (ok(r), flash) {
                    (Some(t), Some(f)) if f > 0.0 => format!("{:.2}", t / f),
                    _ => "-".into(),
                },
                r.step_max_median_s
                    .filter(|_| r.status.name() == "ok")
                    .map_or("-".into(), seconds),
                format!("{} x {}", chunk.min(r.seq_q), r.seq_kv),
                format!("{} x {}", r.seq_q, r.seq_kv),
            ]
        })
        .collect();
    s += &table(
        &[
            "dtype",
            "h/kv",
            "batch",
            "prompt",
            "chunk",
            "steps",
            "status",
            "total",
            "flash",
            "vs flash",
            "longest step",
            "score block",
            "at once",
        ],
        &body,
    );
    Ok(vec![
        write_file(dir, MARKDOWN, &s)?,
        write_file(dir, PLOT, &plot(&rows, records))?,
    ])
}

/// Seconds against chunk size: per (dtype, prompt, heads) the whole prefill and its longest
/// step, and one flash call on the same prompt as a dashed line across the chunk sizes.
fn plot(rows: &[&Record], records: &[Record]) -> String {
    let ok = |r: &Record| r.status.name() == "ok";
    let mut keys: Vec<&Record> = Vec::new();
    for r in rows {
        if !keys.iter().any(|k| same_problem(k, r)) {
            keys.push(r);
        }
    }
    let chunks = rows
        .iter()
        .filter_map(|r| r.prefill_chunk)
        .map(|c| c as f64);
    let (lo, hi) = chunks.fold((f64::MAX, f64::MIN), |(a, b), c| (a.min(c), b.max(c)));
    let mut series = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let name = format!("{} n={} h{}/{}", k.dtype, k.seq_q, k.heads, k.kv_heads);
        let line = |f: fn(&Record) -> Option<f64>| {
            let mut p: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| same_problem(k, r) && ok(r))
                .filter_map(|r| Some((r.prefill_chunk? as f64, f(r)?)))
                .collect();
            p.sort_by(|a, b| a.0.total_cmp(&b.0));
            p
        };
        series.push(Series {
            name: format!("{name} total"),
            points: line(|r| r.time_median_s),
            dashed: false,
            color: 2 * i,
        });
        series.push(Series {
            name: format!("{name} longest step"),
            points: line(|r| r.step_max_median_s),
            dashed: false,
            color: 2 * i + 1,
        });
        if let Some(t) = records
            .iter()
            .find(|f| f.variant == "flash" && same_problem(f, k) && ok(f))
            .and_then(|f| f.time_median_s)
        {
            series.push(Series {
                name: format!("{name} flash"),
                points: vec![(lo, t), (hi, t)],
                dashed: true,
                color: 2 * i,
            });
        }
    }
    line_chart(
        "chunked prefill: time against chunk size",
        "prefill_chunk (tokens)",
        "seconds",
        &series,
    )
}
