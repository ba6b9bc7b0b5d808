//! The report's figures, built from the records: runtime, memory overhead (dashed n² and √n
//! guides, the memory budget, `oom` cases marked), max-abs error (with paired differences
//! and the paper's bounds), GFLOP/s against the calibrated SGEMM peak, and one heatmap per
//! chunk sweep. Series keep one style across every figure (`plot::style`): few series get a
//! colour each (marker: dtype, dashed: cuda); more are coloured by variant, the (marker,
//! dash pattern) pair telling apart the rest of what varies between them.

use std::path::Path;

use super::fmt::{bytes, sci, seconds};
use super::load::Results;
use super::plot::axis::{AxisSpec, Scale, Unit};
use super::plot::chart::{Figure, Guide, HLine, Line, Pt};
use super::plot::heatmap::{HeatCell, Heatmap, Panel};
use super::plot::style::{self, Dash, Key, Marker, Style, GUIDE, LIGHT_GUIDE, RED};
use super::plot::{save, Format, Plot};
use super::record::{Record, Status};
use super::select::TABLE2;
use super::series::{group, ChunkGrid, Series};
use super::tables::{PlotLink, DAGGER};
use crate::error::Result;

const N_AXIS: &str = "sequence length n (tokens, log scale)";

/// The style of each series, from its variant and the rest of its label.
fn styles(series: &[Series]) -> Vec<Style> {
    let keys: Vec<Key> = series
        .iter()
        .map(|s| {
            let rest = s
                .label
                .strip_prefix(s.variant.as_str())
                .map_or(s.label.as_str(), |r| r.trim_start_matches(" · "));
            Key {
                group: s.variant.as_str(),
                rest,
                dtype: s.dtype.as_str(),
                device: s.device.as_str(),
            }
        })
        .collect();
    style::assign(&keys)
}

/// A line per series from the rows `value` accepts.
fn lines(series: &[Series], value: impl Fn(&Record) -> Option<Pt>) -> Vec<Line> {
    series
        .iter()
        .zip(styles(series))
        .map(|(s, st)| Line {
            label: s.label.clone(),
            color: st.color,
            marker: st.marker,
            dash: st.dash,
            width: 2,
            connect: true,
            points: s.records.iter().filter_map(|r| value(r)).collect(),
        })
        .filter(|l| !l.points.is_empty())
        .collect()
}

fn ok(r: &Record) -> bool {
    r.status == Status::Ok
}

fn pt(r: &Record, y: Option<f64>) -> Option<Pt> {
    Some(Pt {
        x: r.seq_q as f64,
        y: y?,
        hollow: r.extrapolated,
    })
}

fn extrapolation_note(results: &Results) -> Option<String> {
    results.records.iter().any(|r| r.extrapolated).then(|| {
        format!(
            "Hollow markers ({DAGGER} in tables.md): time extrapolated, timed on the first query chunks and scaled by the row count."
        )
    })
}

fn runtime(results: &Results, series: &[Series], caption: &str) -> Figure {
    Figure {
        title: "Runtime vs sequence length".into(),
        caption: caption.into(),
        x: AxisSpec::new(N_AXIS, Scale::Log2, Unit::Tokens),
        y: AxisSpec::new(
            "median time per call (log scale)",
            Scale::Log10,
            Unit::Seconds,
        ),
        lines: lines(
            series,
            |r| if ok(r) { pt(r, r.time_median_s) } else { None },
        ),
        hlines: Vec::new(),
        guides: Vec::new(),
        notes: extrapolation_note(results).into_iter().collect(),
        y_from_zero: false,
    }
}

fn memory(results: &Results, series: &[Series], caption: &str) -> Figure {
    let budget = results.memory_budget();
    let mut lines = lines(series, |r| {
        if ok(r) {
            pt(r, r.mem_overhead_bytes.map(|b| b as f64))
        } else {
            None
        }
    });
    for l in &mut lines {
        for p in &mut l.points {
            p.hollow = false; // memory is always measured, never extrapolated
        }
    }
    // The guides start at the smallest overhead measured at the smallest n.
    let anchor = lines
        .iter()
        .flat_map(|l| l.points.iter())
        .map(|p| (p.x, p.y))
        .reduce(|a, b| if (b.0, b.1) < (a.0, a.1) { b } else { a });
    let ooms: Vec<Pt> = results
        .records
        .iter()
        .filter(|r| r.status == Status::Oom)
        .filter_map(|r| {
            let y = r.mem_predicted_bytes.or(budget).map(|b| b as f64)?;
            Some(Pt {
                x: r.seq_q as f64,
                y,
                hollow: false,
            })
        })
        .collect();
    if !ooms.is_empty() {
        lines.push(Line {
            label: "oom: the predicted overhead (not run)".into(),
            color: RED,
            marker: Marker::Cross,
            dash: Dash::Solid,
            width: 2,
            connect: false,
            points: ooms,
        });
    }
    // Whole-layer runs grow as n (BPT, memory-efficient) or n² (vanilla); attention runs
    // are compared with n² and Rabe–Staats' √n.
    let layers = results.records.iter().any(|r| r.mode.starts_with("layer-"));
    let (low, low_label) = if layers {
        (1.0, "∝ n (linear)")
    } else {
        (0.5, "∝ √n (Rabe–Staats, kv_chunk = √n)")
    };
    let guides = anchor.map_or_else(Vec::new, |a| {
        vec![
            Guide {
                label: "∝ n² (standard attention)".into(),
                color: GUIDE,
                exponent: 2.0,
                anchor: a,
            },
            Guide {
                label: low_label.into(),
                color: LIGHT_GUIDE,
                exponent: low,
                anchor: a,
            },
        ]
    });
    Figure {
        title: "Memory overhead vs sequence length".into(),
        caption: caption.into(),
        x: AxisSpec::new(N_AXIS, Scale::Log2, Unit::Tokens),
        y: AxisSpec::new(
            "peak bytes beyond inputs and outputs (log scale)",
            Scale::Log2,
            Unit::Bytes,
        ),
        lines,
        hlines: budget
            .map(|b| HLine {
                label: format!("memory budget {}", bytes(b as f64)),
                y: b as f64,
                color: RED,
            })
            .into_iter()
            .collect(),
        guides,
        notes: vec![
            "Measured by the counting allocator during one call (never extrapolated).".into(),
        ],
        y_from_zero: false,
    }
}

fn error(results: &Results, series: &[Series], caption: &str) -> Figure {
    let mut all = lines(series, |r| {
        if ok(r) {
            pt(r, r.max_abs_err.filter(|e| *e > 0.0))
        } else {
            None
        }
    });
    for l in &mut all {
        for p in &mut l.points {
            p.hollow = false;
        }
    }
    let diff_against = results
        .records
        .iter()
        .find(|r| r.max_abs_diff.is_some())
        .map_or(String::new(), |r| r.diff_variant.clone());
    let diffs: Vec<Line> = lines(series, |r| {
        if !ok(r) || r.max_abs_diff.is_none() {
            return None;
        }
        Some(Pt {
            x: r.seq_q as f64,
            y: r.max_abs_diff.filter(|d| *d > 0.0)?,
            hollow: false,
        })
    })
    .into_iter()
    .map(|mut l| {
        // Explained once in a note: colour and dash say which series it belongs to.
        l.label = String::new();
        l.marker = Marker::Cross;
        l.width = 1;
        l
    })
    .collect();
    let has_diffs = !diffs.is_empty();
    all.extend(diffs);
    let mut notes = vec!["Each series: max |out - exact| against the f64 oracle.".to_string()];
    if has_diffs {
        notes.push(format!(
            "×, thin line: max |out - out of {diff_against}| on the same inputs (the paper's measure), in the colour and dash of its series."
        ));
    }
    let paper_bounds = results.paper().is_some_and(|p| p.id == TABLE2.id) && has_diffs;
    let hlines = if paper_bounds {
        super::checks::ERROR_BOUNDS
            .iter()
            .enumerate()
            .map(|(i, (dist, b))| HLine {
                label: format!("paper bound, {dist} inputs, n = 2^14: {}", sci(*b)),
                y: *b,
                color: [RED, GUIDE][i % 2],
            })
            .collect()
    } else {
        Vec::new()
    };
    Figure {
        title: "Max abs error vs sequence length".into(),
        caption: caption.into(),
        x: AxisSpec::new(N_AXIS, Scale::Log2, Unit::Tokens),
        y: AxisSpec::new("max abs error (log scale)", Scale::Log10, Unit::Number),
        lines: all,
        hlines,
        guides: Vec::new(),
        notes,
        y_from_zero: false,
    }
}

fn gflops(results: &Results, series: &[Series], caption: &str) -> Figure {
    let lines = lines(series, |r| if ok(r) { pt(r, r.gflops) } else { None });
    let threads: Vec<usize> = results
        .records
        .iter()
        .filter(|r| ok(r) && r.gflops.is_some())
        .map(|r| r.threads)
        .collect();
    let hlines = results
        .calibration()
        .iter()
        .filter(|c| threads.contains(&c.threads) && c.sgemm_gflops > 0.0)
        .map(|c| HLine {
            label: format!(
                "calibrated SGEMM peak, {} thread{}: {:.1} GFLOP/s",
                c.threads,
                if c.threads == 1 { "" } else { "s" },
                c.sgemm_gflops
            ),
            y: c.sgemm_gflops,
            color: plotters::style::RGBColor(0, 0, 0),
        })
        .collect();
    let mut notes =
        vec!["FLOPs by the FlashAttention convention: 4·b·h·(unmasked pairs)·d.".into()];
    notes.extend(extrapolation_note(results));
    Figure {
        title: "Throughput vs sequence length".into(),
        caption: caption.into(),
        x: AxisSpec::new(N_AXIS, Scale::Log2, Unit::Tokens),
        y: AxisSpec::new("GFLOP/s", Scale::Linear, Unit::Number),
        lines,
        hlines,
        guides: Vec::new(),
        notes,
        y_from_zero: true,
    }
}

fn heatmap(g: &ChunkGrid) -> Heatmap {
    let panel = |title: &str, value: &dyn Fn(&Record) -> Option<(f64, String)>| Panel {
        title: title.into(),
        x_label: "kv_chunk (keys per chunk)".into(),
        y_label: "q_chunk (queries per chunk)".into(),
        x_ticks: g.kv_chunks.iter().map(ToString::to_string).collect(),
        y_ticks: g.q_chunks.iter().map(ToString::to_string).collect(),
        cells: g
            .q_chunks
            .iter()
            .map(|&q| {
                g.kv_chunks
                    .iter()
                    .map(|&kv| match g.cells.get(&(q, kv)) {
                        None => HeatCell::Text("not run".into()),
                        Some(r) if r.status != Status::Ok => HeatCell::Text(r.status.to_string()),
                        Some(r) => value(r)
                            .map_or(HeatCell::Text("–".into()), |(v, s)| HeatCell::Value(v, s)),
                    })
                    .collect()
            })
            .collect(),
    };
    Heatmap {
        title: format!("Chunk sizes: {}", g.title),
        caption: "Each cell one case; colour on a log scale, darker is smaller (better).".into(),
        panels: vec![
            panel("median time per call", &|r| {
                r.time_median_s.map(|t| {
                    let mark = if r.extrapolated { DAGGER } else { "" };
                    (t, format!("{}{mark}", seconds(t)))
                })
            }),
            panel("memory overhead", &|r| {
                r.mem_overhead_bytes.map(|b| (b as f64, bytes(b as f64)))
            }),
        ],
    }
}

/// Draws every figure that has data into `dir`; returns the links for tables.md.
pub fn write_all(
    results: &Results,
    grids: &[ChunkGrid],
    dir: &Path,
    formats: &[Format],
) -> Result<Vec<PlotLink>> {
    let grouping = group(
        results
            .records
            .iter()
            .filter(|r| matches!(r.status, Status::Ok | Status::Oom)),
    );
    let (series, caption) = (&grouping.series, grouping.caption.as_str());
    let mut plots: Vec<(&str, Plot)> = Vec::new();
    for (stem, fig) in [
        ("runtime", runtime(results, series, caption)),
        ("memory", memory(results, series, caption)),
        ("error", error(results, series, caption)),
        ("gflops", gflops(results, series, caption)),
    ] {
        if fig.lines.iter().any(|l| !l.points.is_empty()) {
            plots.push((stem, Plot::Chart(fig)));
        }
    }
    for g in grids {
        plots.push((g.stem.as_str(), Plot::Heatmap(heatmap(g))));
    }
    let mut links = Vec::new();
    for (stem, plot) in &plots {
        let files = save(plot, dir, stem, formats)?;
        let title = match plot {
            Plot::Chart(f) => f.title.clone(),
            Plot::Heatmap(h) => h.title.clone(),
        };
        if let Some(file) = files.first() {
            links.push(PlotLink {
                title,
                file: file.clone(),
            });
        }
    }
    Ok(links)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(label: &str) -> Series<'static> {
        let variant = label.split(" · ").next().unwrap_or(label);
        Series {
            label: label.into(),
            variant: variant.into(),
            dtype: if label.contains("bf16") {
                "bf16"
            } else {
                "f32"
            }
            .into(),
            device: "cpu".into(),
            records: Vec::new(),
        }
    }

    #[test]
    fn series_colour_by_variant_and_style_by_the_rest() {
        let mut all = Vec::new();
        for v in ["rabe-staats", "rabe-staats-seq", "flash"] {
            for d in ["f32", "bf16"] {
                for c in ["non-causal", "causal"] {
                    all.push(series(&format!("{v} · {d} · {c}")));
                }
            }
        }
        let st = styles(&all);
        for (i, a) in all.iter().enumerate() {
            for (j, b) in all.iter().enumerate() {
                let same_rest = a.label.split_once(" · ").map(|p| p.1)
                    == b.label.split_once(" · ").map(|p| p.1);
                assert_eq!(
                    st[i].color == st[j].color,
                    a.variant == b.variant,
                    "{i} {j}"
                );
                assert_eq!(
                    (st[i].marker, st[i].dash) == (st[j].marker, st[j].dash),
                    same_rest,
                    "{} / {}",
                    a.label,
                    b.label
                );
            }
        }
    }
}
