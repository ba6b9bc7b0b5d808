//! The report's figures, built from the records: runtime (each point's min–max band),
//! memory overhead (dashed n² and √n guides through the data, the memory budget, `oom` cases
//! marked), max-abs error (paired differences, each dtype's tolerance, the paper's bounds),
//! GFLOP/s against the calibrated FMA rooflines (SGEMM as a reference), and one heatmap per
//! chunk sweep. Decode rows run over the KV cache length (`series::x_len`). Series keep one
//! style across every figure (`plot::style`): few series get a colour each (marker: dtype,
//! dashed: cuda); more are coloured by variant, the (marker, dash pattern) pair telling
//! apart the rest of what varies between them; series with identical points are one line
//! (`chart::merge_identical`). A line chart with more than `MAX_SERIES` series becomes small
//! multiples (`plot::grid`): panels split by the identity columns but the variant
//! (`panels`), on the same axes, one legend, `grid::MAX_PANELS` panels per image.

use crate::report::run_config::RunConfig;
use std::path::Path;

use super::plot::axis::{AxisSpec, Scale, Unit};
use super::plot::chart::{merge_identical, Figure, Guide, HLine, Line, Pt};
use super::plot::grid::{Grid, MAX_PANELS};
use super::plot::heatmap::{HeatCell, Heatmap, Panel};
use super::plot::style::{self, Dash, Key, Marker, Style, GUIDE, LIGHT_GUIDE, RED};
use super::plot::{save, Format, Plot};
use super::select::TABLE2;
use super::series::{
    distinct, group, is_decode, join_label, not_applicable, unremarkable, x_len, ChunkGrid, Series,
    CHUNKS_PREFIX,
};
use super::tables_md::{PlotImage, PlotLink, DAGGER};
use crate::error::Result;
use crate::problem::DType;
use crate::results::load::Results;
use crate::results::record::{Record, Status};
use crate::units::{bytes, sci, seconds};

const N_AXIS: &str = "sequence length n (tokens, log scale)";
const KV_AXIS: &str = "KV cache length (tokens, log scale)";
const MIXED_AXIS: &str = "sequence length n; KV cache length for decode (tokens, log scale)";

/// The x axis of the line charts and what their titles say it is: the KV cache length when
/// every row is a decode row, n when none is, both named when they are mixed.
fn x_axis(results: &Results) -> (&'static str, &'static str) {
    let drawn = || {
        results
            .records
            .iter()
            .filter(|r| matches!(r.status, Status::Ok | Status::Oom))
    };
    match (drawn().any(is_decode), drawn().all(is_decode)) {
        (true, true) => ("KV cache length", KV_AXIS),
        (true, false) => ("sequence or KV cache length", MIXED_AXIS),
        _ => ("sequence length", N_AXIS),
    }
}

/// What the style of `s`, drawn under `label`, is chosen from: its variant and the rest of
/// the label.
fn style_key<'a>(s: &'a Series, label: &'a str) -> Key<'a> {
    Key {
        group: s.variant.as_str(),
        rest: label
            .strip_prefix(s.variant.as_str())
            .map_or(label, |r| r.trim_start_matches(" · ")),
        dtype: s.dtype.as_str(),
        device: s.device.as_str(),
    }
}

/// The style of each series, from its variant and the rest of its label.
fn styles(series: &[Series]) -> Vec<Style> {
    let keys: Vec<Key> = series.iter().map(|s| style_key(s, &s.label)).collect();
    style::assign(&keys)
}

/// Most series one plot shows. A chart with more becomes a grid of panels of at most this
/// many (`panels`): 8 lines can still be followed one by one (results/quick's 40 in one
/// plot were a tangle of 5 colours in 8 dash and marker styles), and each panel compares
/// the variants of one setting.
pub const MAX_SERIES: usize = 8;

/// The identity columns a chart is split by, in the order that breaks ties between columns
/// with equally few values: threads first (times and peaks at different thread counts are
/// not comparable, and each SGEMM peak then lands in its own panel), then dtype and the
/// mask, then the shape, then the rest. The variant is never among them: colours show it.
/// A key that only some cases have (`series::not_applicable`) splits a chart only where two
/// of its values apply.
pub const FACET_KEYS: [&str; 27] = [
    "threads",
    "dtype",
    "causal",
    "heads",
    "kv_heads",
    "head_dim",
    "batch",
    "mode",
    "device",
    "devices",
    "window",
    "input_dist",
    "input_scale",
    "seq_kv",
    "q_chunk",
    "kv_chunk",
    "splits",
    "allreduce",
    "d_out",
    "seed",
    "seq_q",
    "page_size",
    "page_order",
    "kernel_path",
    "prefix_len",
    "kv_dtype",
    "sinks",
];

/// One panel of a chart: the series that share `values`.
#[derive(Clone, Debug, PartialEq)]
pub struct Facet {
    /// (column, value as shown) every member shares, outermost split first; empty: the
    /// whole chart, not split.
    pub values: Vec<(&'static str, String)>,
    /// Indices into the series, in their order.
    pub members: Vec<usize>,
}

/// The value `series` has in identity column `col`.
fn key_value<'s>(series: &'s Series, col: &str) -> Option<&'s str> {
    series
        .key
        .iter()
        .find(|(c, _)| *c == col)
        .map(|(_, v)| v.as_str())
}

/// Splits `members` (indices into `series`) until each part has at most `max` series:
/// by the column of `FACET_KEYS` with the fewest distinct values among them (at least 2
/// that apply; ties go to the earlier column), one part per value that applies in
/// first-seen order, the series it does not apply to in every part, then again within each
/// part that is still too big, until it fits or no column is left. Up to `max` members: one
/// facet with no values.
pub fn facets(series: &[Series], members: Vec<usize>, max: usize) -> Vec<Facet> {
    let mut out = Vec::new();
    split(
        series,
        Facet {
            values: Vec::new(),
            members,
        },
        max,
        &mut out,
    );
    out
}

fn split(series: &[Series], facet: Facet, max: usize, out: &mut Vec<Facet>) {
    if facet.members.len() <= max {
        out.push(facet);
        return;
    }
    let mut best: Option<(&'static str, Vec<&str>)> = None;
    for col in FACET_KEYS {
        if facet.values.iter().any(|(c, _)| *c == col) {
            continue;
        }
        let mut seen: Vec<&str> = Vec::new();
        for &i in &facet.members {
            if let Some(v) = key_value(&series[i], col) {
                if !seen.contains(&v) {
                    seen.push(v);
                }
            }
        }
        let applicable = seen.iter().filter(|v| !not_applicable(col, v)).count();
        if applicable >= 2 && best.as_ref().is_none_or(|b| seen.len() < b.1.len()) {
            best = Some((col, seen));
        }
    }
    let Some((col, values)) = best else {
        out.push(facet);
        return;
    };
    // A series the column does not apply to (flash-decoding beside paged caches' page
    // orders) is no value of it: it goes into every part, the reference each is read against.
    let everywhere = |i: usize| key_value(&series[i], col).is_none_or(|v| not_applicable(col, v));
    for v in values.into_iter().filter(|v| !not_applicable(col, v)) {
        let mut values = facet.values.clone();
        values.push((col, v.to_string()));
        let members = facet
            .members
            .iter()
            .copied()
            .filter(|&i| key_value(&series[i], col) == Some(v) || everywhere(i))
            .collect();
        split(series, Facet { values, members }, max, out);
    }
}

/// The panels of a chart of more than `max` series: by the facet keys (`facets`), so that
/// the variants are compared within a panel; where the variants alone are more than `max`,
/// one panel per variant first (then split further by the keys). A panel still over `max`
/// (its series differ in nothing a panel can be split by) is cut into pieces in order.
pub fn panels(series: &[Series], members: Vec<usize>, max: usize) -> Vec<Facet> {
    let mut variants: Vec<&str> = Vec::new();
    for &i in &members {
        if !variants.contains(&series[i].variant.as_str()) {
            variants.push(&series[i].variant);
        }
    }
    let mut out = Vec::new();
    if variants.len() > max {
        for v in variants {
            let facet = Facet {
                values: vec![("variant", v.to_string())],
                members: members
                    .iter()
                    .copied()
                    .filter(|&i| series[i].variant == v)
                    .collect(),
            };
            split(series, facet, max, &mut out);
        }
    } else {
        out = facets(series, members, max);
    }
    out.into_iter()
        .flat_map(|f| {
            let pieces = f.members.len().div_ceil(max.max(1));
            if pieces <= 1 {
                return vec![f];
            }
            f.members
                .chunks(max.max(1))
                .enumerate()
                .map(|(k, m)| {
                    let mut values = f.values.clone();
                    values.push(("piece", format!("({} of {pieces})", k + 1)));
                    Facet {
                        values,
                        members: m.to_vec(),
                    }
                })
                .collect()
        })
        .collect()
}

/// A series as one chart draws it: its style and legend label.
struct Member<'s, 'a> {
    series: &'s Series<'a>,
    style: Style,
    label: String,
}

/// What one chart, or one facet of it, is drawn from.
struct Part<'s, 'a> {
    results: &'a Results,
    members: Vec<Member<'s, 'a>>,
    /// The rows its oom marks, reference lines and notes come from: every row for a whole
    /// chart, the members' for a facet.
    records: Vec<&'a Record>,
    caption: String,
}

/// A line per member from the rows `value` accepts, with the (low, high) band `band` gives
/// at each of those rows.
fn lines(
    members: &[Member],
    value: impl Fn(&Record) -> Option<Pt>,
    band: impl Fn(&Record) -> Option<(f64, f64)>,
) -> Vec<Line> {
    members
        .iter()
        .map(|m| {
            let drawn: Vec<(&Record, Pt)> = m
                .series
                .records
                .iter()
                .filter_map(|r| Some((*r, value(r)?)))
                .collect();
            Line {
                label: m.label.clone(),
                color: m.style.color,
                marker: m.style.marker,
                dash: m.style.dash,
                width: 2,
                connect: true,
                band: drawn
                    .iter()
                    .filter_map(|(r, p)| band(r).map(|(lo, hi)| (p.x, lo, hi)))
                    .collect(),
                points: drawn.into_iter().map(|(_, p)| p).collect(),
            }
        })
        .filter(|l| !l.points.is_empty())
        .collect()
}

fn no_band(_: &Record) -> Option<(f64, f64)> {
    None
}

/// The spread of a measured time: the fastest and the slowest timed call. An extrapolated
/// time has none (its calls timed only the first query chunks).
fn time_band(r: &Record) -> Option<(f64, f64)> {
    if !ok(r) || r.extrapolated {
        return None;
    }
    let (lo, hi) = (r.time_min_s?, r.time_max_s?);
    (lo > 0.0 && hi >= lo).then_some((lo, hi))
}

fn ok(r: &Record) -> bool {
    r.status == Status::Ok
}

fn pt(r: &Record, y: Option<f64>) -> Option<Pt> {
    Some(Pt {
        x: x_len(r) as f64,
        y: y?,
        hollow: r.extrapolated,
    })
}

fn time_y(r: &Record) -> Option<f64> {
    r.time_median_s.filter(|_| ok(r))
}

fn memory_y(r: &Record) -> Option<f64> {
    r.mem_overhead_bytes.filter(|_| ok(r)).map(|b| b as f64)
}

fn error_y(r: &Record) -> Option<f64> {
    r.max_abs_err.filter(|e| ok(r) && *e > 0.0)
}

fn diff_y(r: &Record) -> Option<f64> {
    r.max_abs_diff.filter(|d| ok(r) && *d > 0.0)
}

fn gflops_y(r: &Record) -> Option<f64> {
    r.gflops.filter(|_| ok(r))
}

/// The line charts, in the order they are drawn and listed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Chart {
    Runtime,
    Memory,
    Error,
    Gflops,
}

impl Chart {
    const ALL: [Chart; 4] = [Chart::Runtime, Chart::Memory, Chart::Error, Chart::Gflops];

    fn stem(self) -> &'static str {
        match self {
            Chart::Runtime => "runtime",
            Chart::Memory => "memory",
            Chart::Error => "error",
            Chart::Gflops => "gflops",
        }
    }

    /// Whether `series` draws anything on this chart (what its series count counts).
    fn has_data(self, series: &Series) -> bool {
        series.records.iter().any(|r| match self {
            Chart::Runtime => time_y(r).is_some(),
            Chart::Memory => memory_y(r).is_some() || r.status == Status::Oom,
            Chart::Error => error_y(r).is_some() || diff_y(r).is_some(),
            Chart::Gflops => gflops_y(r).is_some(),
        })
    }

    /// The figure of `p`, series with identical points drawn as one line.
    fn figure(self, p: &Part) -> Figure {
        let mut f = match self {
            Chart::Runtime => runtime(p),
            Chart::Memory => memory(p),
            Chart::Error => error(p),
            Chart::Gflops => gflops(p),
        };
        f.lines = merge_identical(std::mem::take(&mut f.lines));
        f
    }
}

/// Whether `name` is a plot file a report writes: a line chart `<stem>.<ext>`, a further
/// image of its panels `<stem>__part-N.<ext>` (or a facet `<stem>__<values>.<ext>` of an
/// earlier report's), or a chunk-sweep heatmap, in PNG or SVG.
pub fn is_plot_file(name: &str) -> bool {
    let Some((stem, ext)) = name.rsplit_once('.') else {
        return false;
    };
    let chart = stem.split_once("__").map_or(stem, |(c, _)| c);
    matches!(ext, "png" | "svg")
        && (Chart::ALL.iter().any(|c| c.stem() == chart) || stem.starts_with(CHUNKS_PREFIX))
}

fn extrapolation_note(records: &[&Record]) -> Option<String> {
    records.iter().any(|r| r.extrapolated).then(|| {
        format!(
            "Hollow markers ({DAGGER} in tables.md): time extrapolated, timed on the first query chunks and scaled by the row count."
        )
    })
}

fn runtime(p: &Part) -> Figure {
    let (x_name, x_label) = x_axis(p.results);
    let lines = lines(&p.members, |r| pt(r, time_y(r)), time_band);
    let mut notes: Vec<String> = Vec::new();
    if lines.iter().any(|l| !l.band.is_empty()) {
        notes.push("Shaded: the fastest to the slowest timed call of each point.".into());
    }
    notes.extend(extrapolation_note(&p.records));
    Figure {
        title: format!("Runtime vs {x_name}"),
        caption: p.caption.clone(),
        x: AxisSpec::new(x_label, Scale::Log2, Unit::Tokens),
        y: AxisSpec::new(
            "median time per call (log scale)",
            Scale::Log10,
            Unit::Seconds,
        ),
        lines,
        hlines: Vec::new(),
        guides: Vec::new(),
        notes,
        y_from_zero: false,
        shared: None,
    }
}

/// The first point of the series that grows fastest (highest log-log slope from its first
/// to its last point) and of the one that grows slowest, the anchors of the memory guides:
/// a guide through the data shows at once whether a series follows it. Series of one point
/// have no growth; where none has two, the highest and the lowest first point.
fn growth_anchors(lines: &[Line]) -> Option<((f64, f64), (f64, f64))> {
    let spans: Vec<((f64, f64), Option<f64>)> = lines
        .iter()
        .filter_map(|l| {
            let pts: Vec<(f64, f64)> = l
                .points
                .iter()
                .filter(|p| p.x > 0.0 && p.y > 0.0)
                .map(|p| (p.x, p.y))
                .collect();
            let first = *pts.iter().min_by(|a, b| a.0.total_cmp(&b.0))?;
            let last = *pts.iter().max_by(|a, b| a.0.total_cmp(&b.0))?;
            let slope =
                (last.0 > first.0).then(|| (last.1 / first.1).ln() / (last.0 / first.0).ln());
            Some((first, slope))
        })
        .collect();
    let sloped: Vec<((f64, f64), f64)> = spans.iter().filter_map(|&(a, s)| Some((a, s?))).collect();
    if let (Some(fast), Some(slow)) = (
        sloped.iter().max_by(|a, b| a.1.total_cmp(&b.1)),
        sloped.iter().min_by(|a, b| a.1.total_cmp(&b.1)),
    ) {
        return Some((fast.0, slow.0));
    }
    let high = spans
        .iter()
        .map(|s| s.0)
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    let low = spans
        .iter()
        .map(|s| s.0)
        .min_by(|a, b| a.1.total_cmp(&b.1))?;
    Some((high, low))
}

fn memory(p: &Part) -> Figure {
    let budget = p.results.memory_budget();
    let (x_name, x_label) = x_axis(p.results);
    let mut lines = lines(&p.members, |r| pt(r, memory_y(r)), no_band);
    for l in &mut lines {
        for p in &mut l.points {
            p.hollow = false; // memory is always measured, never extrapolated
        }
    }
    // n² through the fastest-growing series, the slow guide through the slowest.
    let anchors = growth_anchors(&lines);
    let ooms: Vec<Pt> = p
        .records
        .iter()
        .filter(|r| r.status == Status::Oom)
        .filter_map(|r| {
            let y = r.mem_predicted_bytes.or(budget).map(|b| b as f64)?;
            Some(Pt {
                x: x_len(r) as f64,
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
            band: Vec::new(),
        });
    }
    // Whole-layer runs grow as n (BPT, memory-efficient) or n² (vanilla); attention runs
    // are compared with n² and Rabe–Staats' √n.
    let layers = p.records.iter().any(|r| r.mode.starts_with("layer-"));
    let (low, low_label) = if layers {
        (1.0, "∝ n (linear)")
    } else {
        (0.5, "∝ √n (Rabe–Staats, kv_chunk = √n)")
    };
    let guides = anchors.map_or_else(Vec::new, |(fast, slow)| {
        vec![
            Guide {
                label: "∝ n² (standard attention)".into(),
                color: GUIDE,
                exponent: 2.0,
                anchor: fast,
            },
            Guide {
                label: low_label.into(),
                color: LIGHT_GUIDE,
                exponent: low,
                anchor: slow,
            },
        ]
    });
    Figure {
        title: format!("Memory overhead vs {x_name}"),
        caption: p.caption.clone(),
        x: AxisSpec::new(x_label, Scale::Log2, Unit::Tokens),
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
            "Guides: ∝ n² through the first point of the fastest-growing series, the other through the first point of the slowest.".into(),
        ],
        y_from_zero: false,
        shared: None,
    }
}

/// The colour of a dtype's tolerance line on the error chart.
fn tolerance_color(d: DType) -> plotters::style::RGBColor {
    match d {
        DType::F32 => GUIDE,
        DType::Bf16 => plotters::style::RGBColor(120, 60, 160),
        DType::F16 => plotters::style::RGBColor(0, 120, 120),
    }
}

fn error(p: &Part) -> Figure {
    let (x_name, x_label) = x_axis(p.results);
    let mut all = lines(&p.members, |r| pt(r, error_y(r)), no_band);
    for l in &mut all {
        for p in &mut l.points {
            p.hollow = false;
        }
    }
    let diff_against = p
        .results
        .records
        .iter()
        .find(|r| r.max_abs_diff.is_some())
        .map_or(String::new(), |r| r.diff_variant.clone());
    // One tolerance line per dtype drawn: where a series crosses its own, it failed.
    let dtypes: Vec<DType> = distinct(
        p.members
            .iter()
            .filter(|m| m.series.records.iter().any(|r| error_y(r).is_some()))
            .filter_map(|m| m.series.dtype.parse::<DType>().ok()),
    );
    let diffs: Vec<Line> = lines(
        &p.members,
        |r| {
            Some(Pt {
                x: x_len(r) as f64,
                y: diff_y(r)?,
                hollow: false,
            })
        },
        no_band,
    )
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
    let paper_bounds = p.results.paper().is_some_and(|t| t.id == TABLE2.id) && has_diffs;
    let mut hlines: Vec<HLine> = dtypes
        .iter()
        .map(|d| HLine {
            label: format!("{d} tolerance: {}", sci(d.tolerance())),
            y: d.tolerance(),
            color: tolerance_color(*d),
        })
        .collect();
    if paper_bounds {
        hlines.extend(
            super::checks::ERROR_BOUNDS
                .iter()
                .enumerate()
                .map(|(i, (dist, b))| HLine {
                    label: format!("paper bound, {dist} inputs, n = 2^14: {}", sci(*b)),
                    y: *b,
                    color: [RED, GUIDE][i % 2],
                }),
        );
    }
    Figure {
        title: format!("Max abs error vs {x_name}"),
        caption: p.caption.clone(),
        x: AxisSpec::new(x_label, Scale::Log2, Unit::Tokens),
        y: AxisSpec::new("max abs error (log scale)", Scale::Log10, Unit::Number),
        lines: all,
        hlines,
        guides: Vec::new(),
        notes,
        y_from_zero: false,
        shared: None,
    }
}

/// Roofline colours: the f32 FMA peak black, the bf16 peak purple, SGEMM a grey reference.
const FMA_COLOR: plotters::style::RGBColor = plotters::style::RGBColor(0, 0, 0);
const BF16_PEAK_COLOR: plotters::style::RGBColor = plotters::style::RGBColor(120, 60, 160);

fn gflops(p: &Part) -> Figure {
    let (x_name, x_label) = x_axis(p.results);
    let lines = lines(&p.members, |r| pt(r, gflops_y(r)), no_band);
    // The peaks of the thread counts this chart (or panel) shows; the bf16 peak only
    // where a bf16 series is drawn.
    let drawn: Vec<&Record> = p
        .records
        .iter()
        .copied()
        .filter(|r| gflops_y(r).is_some())
        .collect();
    let bf16 = drawn.iter().any(|r| r.dtype == "bf16");
    let plural = |t: usize| if t == 1 { "" } else { "s" };
    let mut hlines = Vec::new();
    for c in p.results.calibration() {
        if !drawn.iter().any(|r| r.threads == c.threads) {
            continue;
        }
        let t = c.threads;
        if c.fma_peak_gflops > 0.0 {
            hlines.push(HLine {
                label: format!(
                    "roofline: f32 FMA peak, {t} thread{}: {:.1} GFLOP/s",
                    plural(t),
                    c.fma_peak_gflops
                ),
                y: c.fma_peak_gflops,
                color: FMA_COLOR,
            });
        }
        if let Some(b) = c.bf16_peak_gflops.filter(|b| bf16 && *b > 0.0) {
            hlines.push(HLine {
                label: format!(
                    "roofline: bf16 peak, {t} thread{}: {b:.1} GFLOP/s",
                    plural(t)
                ),
                y: b,
                color: BF16_PEAK_COLOR,
            });
        }
        if c.sgemm_gflops > 0.0 {
            hlines.push(HLine {
                label: format!(
                    "SGEMM (matrixmultiply), reference, {t} thread{}: {:.1} GFLOP/s",
                    plural(t),
                    c.sgemm_gflops
                ),
                y: c.sgemm_gflops,
                color: LIGHT_GUIDE,
            });
        }
    }
    let mut notes =
        vec!["FLOPs by the FlashAttention convention: 4·b·h·(unmasked pairs)·d.".into()];
    if !hlines.is_empty() {
        notes.push(
            "Rooflines: the calibrated FMA peaks of meta.json (independent register FMA chains on every thread)."
                .into(),
        );
    }
    notes.extend(extrapolation_note(&p.records));
    // A log axis when a roofline is drawn: the peaks sit far above attention's rates, and on
    // a linear axis from 0 the data would be a flat line at the bottom.
    let roofline = p
        .results
        .calibration()
        .iter()
        .any(|c| c.fma_peak_gflops > 0.0);
    Figure {
        title: format!("Throughput vs {x_name}"),
        caption: p.caption.clone(),
        x: AxisSpec::new(x_label, Scale::Log2, Unit::Tokens),
        y: if roofline {
            AxisSpec::new("GFLOP/s (log scale)", Scale::Log10, Unit::Number)
        } else {
            AxisSpec::new("GFLOP/s", Scale::Linear, Unit::Number)
        },
        lines,
        hlines,
        guides: Vec::new(),
        notes,
        y_from_zero: !roofline,
        shared: None,
    }
}

/// One image of a chart: its file stem, alt text and plot.
pub struct ChartImage {
    pub stem: String,
    pub alt: String,
    pub plot: Plot,
}

/// A chart's images: the whole chart under `stem` while it has at most `max` series, else
/// small multiples (`panels`): grids of up to `MAX_PANELS` panels, `stem` then
/// `stem__part-2`, ..., every panel titled with its values and all of them sharing one extent
/// (the same x and y axes in every panel of every part). Empty: nothing to draw.
fn chart_plots(
    chart: Chart,
    results: &Results,
    series: &[Series],
    styles: &[Style],
    caption: &str,
    max: usize,
) -> Vec<ChartImage> {
    let with_data: Vec<usize> = (0..series.len())
        .filter(|&i| chart.has_data(&series[i]))
        .collect();
    if with_data.len() <= max {
        // One plot: every series, every row.
        let part = Part {
            results,
            members: series
                .iter()
                .zip(styles)
                .map(|(s, st)| Member {
                    series: s,
                    style: *st,
                    label: s.label.clone(),
                })
                .collect(),
            records: results.records.iter().collect(),
            caption: caption.to_string(),
        };
        let fig = chart.figure(&part);
        if fig.lines.iter().any(|l| !l.points.is_empty()) {
            let title = fig.title.clone();
            return vec![ChartImage {
                stem: chart.stem().to_string(),
                alt: title,
                plot: Plot::Chart(fig),
            }];
        }
        return Vec::new();
    }
    let parts = panels(series, with_data, max);
    let by_variant = parts
        .first()
        .is_some_and(|f| f.values.first().is_some_and(|v| v.0 == "variant"));
    // Labels without what the panel's title says; styles over every panel at once (colour
    // by variant, marker and dash by the rest of the label; by the rest alone where each
    // panel is one variant), so a series looks the same in every panel and one legend
    // serves them all.
    let labels: Vec<Vec<String>> = parts
        .iter()
        .map(|f| {
            f.members
                .iter()
                .map(|&i| {
                    join_label(
                        series[i]
                            .parts
                            .iter()
                            .filter(|(c, _)| !f.values.iter().any(|(fc, _)| fc == c)),
                    )
                })
                .collect()
        })
        .collect();
    // Styles are chosen over the distinct labels: a chart of few of them (a variant each,
    // or a handful of page sizes repeated in every panel) gets a colour per label; the
    // panel's title says the dtype, so it picks no marker.
    let keys: Vec<Key> = parts
        .iter()
        .zip(&labels)
        .flat_map(|(f, ls)| f.members.iter().zip(ls))
        .map(|(&i, label)| {
            let mut k = style_key(&series[i], label);
            if by_variant {
                (k.group, k.rest) = ("", label.as_str());
            }
            (k.dtype, k.device) = ("", "");
            k
        })
        .collect();
    let mut distinct: Vec<Key> = Vec::new();
    let slot: Vec<usize> = keys
        .iter()
        .map(|k| {
            let same = |d: &Key| (d.group, d.rest) == (k.group, k.rest);
            distinct.iter().position(same).unwrap_or_else(|| {
                distinct.push(*k);
                distinct.len() - 1
            })
        })
        .collect();
    let chosen = style::assign(&distinct);
    let mut panel_styles = slot.into_iter().map(|i| chosen[i]);
    let mut figs: Vec<(String, Figure)> = parts
        .iter()
        .zip(labels.iter())
        .map(|(f, ls)| {
            let members: Vec<Member> = f
                .members
                .iter()
                .zip(ls)
                .map(|(&i, label)| Member {
                    series: &series[i],
                    style: panel_styles.next().unwrap_or(styles[i]),
                    label: if label.is_empty() {
                        series[i].variant.clone()
                    } else {
                        label.clone()
                    },
                })
                .collect();
            let mine: std::collections::HashSet<*const Record> = members
                .iter()
                .flat_map(|m| m.series.records.iter().map(|r| *r as *const Record))
                .collect();
            // The title leaves out the defaults (`q_chunk default`, `n_kv=n`) unless they
            // are all it has: a sibling panel names the other value.
            let remarkable: Vec<&str> = f
                .values
                .iter()
                .filter(|(c, v)| !unremarkable(c, v))
                .map(|(_, v)| v.as_str())
                .collect();
            let values = if remarkable.is_empty() {
                f.values
                    .iter()
                    .map(|(_, v)| v.as_str())
                    .collect::<Vec<_>>()
                    .join(" · ")
            } else {
                remarkable.join(" · ")
            };
            let part = Part {
                results,
                members,
                records: results
                    .records
                    .iter()
                    .filter(|r| mine.contains(&(*r as *const Record)))
                    .collect(),
                caption: values.clone(),
            };
            (values, chart.figure(&part))
        })
        .filter(|(_, fig)| fig.lines.iter().any(|l| !l.points.is_empty()))
        .collect();
    let extent = figs
        .iter()
        .filter_map(|(_, f)| f.extent())
        .reduce(|a, b| a.union(b));
    for (_, f) in &mut figs {
        f.shared = extent;
    }
    let Some(title) = figs.first().map(|(_, f)| f.title.clone()) else {
        return Vec::new();
    };
    let count = figs.len();
    let images = count.div_ceil(MAX_PANELS);
    let by = split_columns(&parts);
    let mut out = Vec::new();
    let mut figs = figs.into_iter();
    for k in 0..images {
        // As even as whole panels allow: no last image of a lone panel.
        let take = count.div_ceil(images);
        let panels: Vec<(String, Figure)> = figs.by_ref().take(take).collect();
        let part = if images > 1 {
            format!(", part {} of {images}", k + 1)
        } else {
            String::new()
        };
        let shared = if caption.is_empty() {
            String::new()
        } else {
            format!("{caption}   ")
        };
        out.push(ChartImage {
            stem: if k == 0 {
                chart.stem().to_string()
            } else {
                format!("{}__part-{}", chart.stem(), k + 1)
            },
            alt: if images > 1 {
                format!("{title} (part {} of {images})", k + 1)
            } else {
                title.clone()
            },
            plot: Plot::Grid(Grid {
                title: title.clone(),
                caption: format!(
                    "{shared}({count} panels by {by}{part}; same axes in every panel)"
                ),
                panels,
            }),
        });
    }
    out
}

/// What a chart's panels are split by, outermost first: "dtype × causal".
fn split_columns(parts: &[Facet]) -> String {
    let mut cols: Vec<&str> = Vec::new();
    for (c, _) in parts.iter().flat_map(|f| &f.values) {
        if !cols.contains(c) {
            cols.push(c);
        }
    }
    cols.join(" × ")
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
    let styles = styles(series);
    let mut links = Vec::new();
    for chart in Chart::ALL {
        let plots = chart_plots(chart, results, series, &styles, caption, MAX_SERIES);
        let Some(first) = plots.first() else {
            continue;
        };
        let title = match &first.plot {
            Plot::Chart(f) => f.title.clone(),
            Plot::Grid(g) => g.title.clone(),
            Plot::Heatmap(h) => h.title.clone(),
        };
        let note = match &first.plot {
            Plot::Grid(_) => Some(format!(
                "More than {MAX_SERIES} series: small multiples, the variants compared within \
                 each panel, the same axes in every panel, one legend{}.",
                if plots.len() > 1 {
                    format!(" ({} images of up to {MAX_PANELS} panels)", plots.len())
                } else {
                    String::new()
                }
            )),
            _ => None,
        };
        let mut images = Vec::new();
        for img in plots {
            let files = save(&img.plot, dir, &img.stem, formats)?;
            if let Some(file) = files.into_iter().next() {
                images.push(PlotImage { alt: img.alt, file });
            }
        }
        if !images.is_empty() {
            links.push(PlotLink {
                title,
                note,
                images,
            });
        }
    }
    for g in grids {
        let h = heatmap(g);
        let title = h.title.clone();
        let files = save(&Plot::Heatmap(h), dir, &g.stem, formats)?;
        if let Some(file) = files.into_iter().next() {
            links.push(PlotLink {
                title: title.clone(),
                note: None,
                images: vec![PlotImage { alt: title, file }],
            });
        }
    }
    Ok(links)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::variant::DefaultCase;

    #[test]
    fn only_the_reports_own_plot_files_count_as_old_plots() {
        for name in [
            "runtime.png",
            "memory.svg",
            "gflops__threads-2__dtype-bf16.png",
            "runtime__part-2.svg",
            "chunks_rabe-staats_f32_n4096.svg",
        ] {
            assert!(is_plot_file(name), "{name}");
        }
        for name in [
            "tables.md",
            "runtime.csv",
            "runtime_notes.png",
            "my_memory.svg",
            "chunks",
            "errors.png",
        ] {
            assert!(!is_plot_file(name), "{name}");
        }
    }

    fn series(label: &str) -> Series<'static> {
        let variant = label.split(" · ").next().unwrap_or(label);
        Series {
            label: label.into(),
            parts: Vec::new(),
            key: Vec::new(),
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

    use crate::problem::VariantId;
    use crate::problem::{Case, DType, Shape};
    use std::collections::HashSet;

    /// A series with identity `pairs` besides its variant (no rows: `facets` reads keys).
    fn keyed(variant: &str, pairs: &[(&'static str, String)]) -> Series<'static> {
        let mut key = vec![("variant", variant.to_string())];
        key.extend(pairs.iter().cloned());
        Series {
            label: join_label(&key),
            parts: key.clone(),
            variant: variant.into(),
            dtype: "f32".into(),
            device: "cpu".into(),
            key,
            records: Vec::new(),
        }
    }

    /// variants x threads (1, 2, 4) x dtype x causal x heads: 5 x 24 = 120 series.
    fn big_sweep() -> Vec<Series<'static>> {
        let mut all = Vec::new();
        for v in [
            "naive",
            "naive-unsafe",
            "rabe-staats",
            "rabe-staats-seq",
            "flash",
        ] {
            for t in [1, 2, 4] {
                for d in ["f32", "bf16"] {
                    for c in ["non-causal", "causal"] {
                        for h in [1, 8] {
                            all.push(keyed(
                                v,
                                &[
                                    (
                                        "threads",
                                        format!("{t} thread{}", if t == 1 { "" } else { "s" }),
                                    ),
                                    ("dtype", d.into()),
                                    ("causal", c.into()),
                                    ("heads", format!("h={h}")),
                                ],
                            ));
                        }
                    }
                }
            }
        }
        all
    }

    fn values(f: &Facet) -> Vec<(&str, &str)> {
        f.values.iter().map(|(c, v)| (*c, v.as_str())).collect()
    }

    #[test]
    fn facets_split_by_the_key_with_fewest_values_ties_in_key_order() {
        let all = big_sweep();
        let parts = facets(&all, (0..all.len()).collect(), 40);
        // threads has 3 values; dtype, causal and heads 2 each: dtype wins the tie (it comes
        // first), then 60 > 40 splits again by causal (before heads), leaving 30 each.
        assert_eq!(parts.len(), 4);
        assert_eq!(
            parts.iter().map(values).collect::<Vec<_>>(),
            [
                vec![("dtype", "f32"), ("causal", "non-causal")],
                vec![("dtype", "f32"), ("causal", "causal")],
                vec![("dtype", "bf16"), ("causal", "non-causal")],
                vec![("dtype", "bf16"), ("causal", "causal")],
            ]
        );
        assert!(parts.iter().all(|f| f.members.len() == 30));
        // A lower limit goes on to heads (2 values) before threads (3).
        let small = facets(&all, (0..all.len()).collect(), 20);
        assert_eq!(small.len(), 8);
        assert!(small.iter().all(|f| f.values.last().unwrap().0 == "heads"));
        assert!(small.iter().all(|f| f.members.len() == 15));
        // Between equally few values, threads comes first.
        let two: Vec<Series> = all
            .iter()
            .filter(|s| key_value(s, "threads") != Some("4 threads"))
            .cloned()
            .collect();
        let parts = facets(&two, (0..two.len()).collect(), 40);
        assert_eq!(parts[0].values[0].0, "threads");
    }

    #[test]
    fn every_series_lands_in_exactly_one_facet_that_matches_it() {
        let all = big_sweep();
        for max in [1, 7, 20, 40, 119] {
            let parts = facets(&all, (0..all.len()).collect(), max);
            let mut seen: Vec<usize> = parts.iter().flat_map(|f| f.members.clone()).collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..all.len()).collect::<Vec<_>>(), "max {max}");
            for f in &parts {
                // Split as far as the keys allow: 5 variants are never split apart.
                assert!(
                    f.members.len() <= max.max(5),
                    "max {max}: {}",
                    f.members.len()
                );
                assert!(f.values.iter().all(|(c, _)| *c != "variant"));
                for &i in &f.members {
                    for (c, v) in &f.values {
                        assert_eq!(key_value(&all[i], c), Some(v.as_str()));
                    }
                }
            }
        }
    }

    #[test]
    fn a_chart_up_to_the_limit_or_with_nothing_left_to_split_by_is_one_facet() {
        let all = big_sweep();
        let forty: Vec<usize> = (0..40).collect();
        assert_eq!(
            facets(&all, forty.clone(), 40),
            vec![Facet {
                values: Vec::new(),
                members: forty
            }]
        );
        // Only the variant differs: colours show it, so it is never split.
        let variants: Vec<Series> = (0..50).map(|i| keyed(&format!("v{i}"), &[])).collect();
        let parts = facets(&variants, (0..50).collect(), 10);
        assert_eq!(parts.len(), 1);
        assert!(parts[0].values.is_empty());
    }

    /// 3 variants x threads (1, 2) x dtype x causal x heads x head_dim at two n: 96 series,
    /// each thread count on its own scale (times grow with the threads' index); calibrated
    /// f32 FMA and bf16 peaks for both thread counts.
    fn sweep_results() -> Results {
        let mut meta: crate::results::meta::Meta =
            serde_json::from_str(include_str!("../../tests/fixtures/report/meta.json")).unwrap();
        meta.calibration[0].fma_peak_gflops = 400.0;
        meta.calibration[0].bf16_peak_gflops = Some(900.0);
        let mut two = meta.calibration[0].clone();
        two.threads = 2;
        two.sgemm_gflops = 180.0;
        two.fma_peak_gflops = 800.0;
        two.bf16_peak_gflops = Some(1600.0);
        meta.calibration.push(two);
        let mut records = Vec::new();
        for (k, v) in ["naive", "rabe-staats", "flash"].iter().enumerate() {
            for threads in [1, 2] {
                for dtype in [DType::F32, DType::Bf16] {
                    for causal in [false, true] {
                        for heads in [1, 8] {
                            for d in [64, 128] {
                                for n in [256, 1024] {
                                    let id: VariantId = v.parse().unwrap();
                                    let shape = Shape::self_attention(heads, n, d);
                                    let case = Case {
                                        causal,
                                        ..Case::cpu_fwd(id, shape, dtype, threads)
                                    };
                                    let mut r = Record::for_case("t", &case, Status::Ok, "");
                                    let scale = if threads == 1 { 1.0 } else { 100.0 };
                                    r.time_median_s = Some(scale * 1e-3 * (n * (k + 1)) as f64);
                                    r.gflops = Some(scale * (10 + k + d / 64) as f64);
                                    r.mem_overhead_bytes = Some((n * n * (k + 1)) as u64);
                                    r.max_abs_err = Some(1e-7 * scale);
                                    records.push(r);
                                }
                            }
                        }
                    }
                }
            }
        }
        Results {
            dir: std::path::PathBuf::from("t"),
            records,
            meta: Some(meta),
        }
    }

    fn images(chart: Chart, results: &Results, max: usize) -> Vec<ChartImage> {
        let grouping = group(
            results
                .records
                .iter()
                .filter(|r| matches!(r.status, Status::Ok | Status::Oom)),
        );
        let st = styles(&grouping.series);
        chart_plots(
            chart,
            results,
            &grouping.series,
            &st,
            &grouping.caption,
            max,
        )
    }

    fn grid(p: &Plot) -> &Grid {
        match p {
            Plot::Grid(g) => g,
            _ => panic!("not a grid"),
        }
    }

    fn single(p: &Plot) -> &Figure {
        match p {
            Plot::Chart(f) => f,
            _ => panic!("not a single figure"),
        }
    }

    fn results_of(records: Vec<Record>) -> Results {
        let meta: crate::results::meta::Meta =
            serde_json::from_str(include_str!("../../tests/fixtures/report/meta.json")).unwrap();
        Results {
            dir: std::path::PathBuf::from("t"),
            records,
            meta: Some(meta),
        }
    }

    /// A measured row of `variant` in `dtype` at n (1 thread), changed by `edit`.
    fn row(variant: &str, dtype: DType, n: usize, edit: impl FnOnce(&mut Record)) -> Record {
        let id: VariantId = variant.parse().unwrap();
        let case = Case::cpu_fwd(id, Shape::self_attention(4, n, 64), dtype, 1);
        let mut r = Record::for_case("t", &case, Status::Ok, "");
        r.time_median_s = Some(1e-6 * n as f64);
        r.gflops = Some(10.0);
        r.mem_overhead_bytes = Some((n * n) as u64);
        r.max_abs_err = Some(1e-7);
        edit(&mut r);
        r
    }

    #[test]
    fn panels_hold_at_most_8_series_and_one_variant_each_past_8_variants() {
        let all = big_sweep();
        let parts = panels(&all, (0..all.len()).collect(), MAX_SERIES);
        // 120 series: dtype, causal and heads (2 values each) then threads (3) leave the 5
        // variants of one setting per panel: 24 panels.
        assert_eq!(parts.len(), 24);
        assert!(parts.iter().all(|f| f.members.len() == 5));
        assert!(parts.iter().all(|f| f.values.len() == 4));
        // Ten variants: too many to compare in one panel, so a panel per variant, its
        // settings split further until at most 8 remain.
        let mut many = Vec::new();
        for v in 0..10 {
            for d in ["f32", "bf16"] {
                for c in ["causal", "non-causal"] {
                    many.push(keyed(
                        &format!("v{v}"),
                        &[("dtype", d.into()), ("causal", c.into())],
                    ));
                }
            }
        }
        let parts = panels(&many, (0..many.len()).collect(), MAX_SERIES);
        assert_eq!(parts.len(), 10);
        for (k, f) in parts.iter().enumerate() {
            assert_eq!(f.values, vec![("variant", format!("v{k}"))]);
            assert_eq!(f.members.len(), 4);
            assert!(f
                .members
                .iter()
                .all(|&i| many[i].variant == format!("v{k}")));
        }
        // Series a panel cannot tell apart by any key are cut into pieces of at most 8.
        let same: Vec<Series> = (0..8).map(|i| keyed(&format!("v{i}"), &[])).collect();
        let parts = panels(&same, (0..8).collect(), 3);
        assert!(parts.iter().all(|f| f.members.len() <= 3), "{parts:?}");
        let mut seen: Vec<usize> = parts.iter().flat_map(|f| f.members.clone()).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn a_series_a_split_column_does_not_apply_to_is_in_every_panel() {
        let mut all: Vec<Series> = (0..6)
            .map(|p| {
                keyed(
                    "paged-decode",
                    &[
                        ("page_size", format!("page={}", 1 << p)),
                        ("page_order", "shuffled".into()),
                    ],
                )
            })
            .collect();
        all.extend((0..6).map(|p| {
            keyed(
                "paged-decode",
                &[
                    ("page_size", format!("page={}", 1 << p)),
                    ("page_order", "contiguous".into()),
                ],
            )
        }));
        all.push(keyed(
            "flash-decoding",
            &[
                ("page_size", "no pages".into()),
                ("page_order", "no pages".into()),
            ],
        ));
        let parts = panels(&all, (0..all.len()).collect(), MAX_SERIES);
        assert_eq!(
            parts.iter().map(values).collect::<Vec<_>>(),
            [
                vec![("page_order", "shuffled")],
                vec![("page_order", "contiguous")]
            ]
        );
        assert!(parts
            .iter()
            .all(|f| f.members.len() == 7 && f.members.contains(&12)));
    }

    #[test]
    fn a_chart_of_many_series_is_one_grid_of_panels_on_shared_axes_with_one_legend() {
        let results = sweep_results();
        for chart in Chart::ALL {
            let c = chart.stem();
            let imgs = images(chart, &results, MAX_SERIES);
            assert_eq!(imgs.len(), 1, "{c}");
            assert_eq!(imgs[0].stem, c);
            let g = grid(&imgs[0].plot);
            // 96 series: threads, dtype, causal and heads split (2 values each, in key
            // order), leaving 3 variants x 2 head_dims per panel.
            assert_eq!(g.panels.len(), 16, "{c}");
            assert_eq!(g.panels[0].0, "1 thread · f32 · non-causal · h=1");
            assert_eq!(g.panels[15].0, "2 threads · bf16 · causal · h=8");
            assert!(g.size().0 <= 2480, "{:?}", g.size());
            for (title, f) in &g.panels {
                let drawn = f.lines.iter().filter(|l| !l.label.is_empty()).count();
                assert!((1..=MAX_SERIES).contains(&drawn), "{c} {title}: {drawn}");
                // Labels leave out what the panel's title says.
                assert!(f.lines.iter().all(|l| !l.label.contains("thread")
                    && !l.label.contains("bf16")
                    && !l.label.contains("causal")
                    && !l.label.contains("h=")));
            }
            let ranges: Vec<(f64, f64, f64, f64)> = g
                .panels
                .iter()
                .map(|(_, f)| {
                    let (x, y) = f.ranges();
                    (x.lo, x.hi, y.lo, y.hi)
                })
                .collect();
            assert!(ranges.iter().all(|r| *r == ranges[0]), "{c}: {ranges:?}");
            if chart != Chart::Memory {
                // The panels' own data differ (1 vs 2 threads): sharing is what aligns them.
                let own: Vec<_> = g
                    .panels
                    .iter()
                    .map(|(_, f)| f.extent().unwrap().y)
                    .collect();
                assert_ne!(own[0], own[8], "{c}");
            }
            // One legend: every label once, each series' look the same in every panel.
            let entries = g.legend_entries();
            let labels: HashSet<&str> = entries.iter().map(|e| e.label.as_str()).collect();
            assert_eq!(labels.len(), entries.len(), "{c}: {entries:?}");
            for (_, f) in &g.panels {
                for l in f.lines.iter().filter(|l| !l.label.is_empty()) {
                    assert!(entries.iter().any(|e| e.label == l.label
                        && e.color == l.color
                        && e.marker == Some(l.marker)));
                }
            }
        }
        // Past 16 panels a chart goes on in parts, on the same axes.
        let imgs = images(Chart::Runtime, &results, 4);
        let stems: Vec<&str> = imgs.iter().map(|i| i.stem.as_str()).collect();
        assert_eq!(stems, ["runtime", "runtime__part-2"]);
        assert!(stems.iter().all(|s| is_plot_file(&format!("{s}.png"))));
        let all: Vec<&Figure> = imgs
            .iter()
            .flat_map(|i| grid(&i.plot).panels.iter().map(|p| &p.1))
            .collect();
        assert_eq!(all.len(), 32);
        assert!(imgs.iter().all(|i| grid(&i.plot).panels.len() == 16));
        let first = all[0].ranges();
        assert!(all.iter().all(|f| f.ranges() == first));
        // Up to the limit: the chart as one figure under its own name.
        let few = results_of(results.records[..8 * 2].to_vec());
        let imgs = images(Chart::Runtime, &few, MAX_SERIES);
        assert_eq!(imgs.len(), 1);
        assert_eq!(imgs[0].stem, "runtime");
        assert!(single(&imgs[0].plot).shared.is_none());
    }

    #[test]
    fn identical_series_are_one_line_with_one_legend_entry_naming_both() {
        let results = results_of(
            ["naive", "naive-unsafe", "flash"]
                .iter()
                .flat_map(|v| [256, 1024].map(|n| row(v, DType::F32, n, |_| {})))
                .map(|mut r| {
                    if r.variant == "flash" {
                        r.mem_overhead_bytes = Some(r.seq_q as u64 * 64);
                    }
                    r
                })
                .collect(),
        );
        let imgs = images(Chart::Memory, &results, MAX_SERIES);
        let f = single(&imgs[0].plot);
        let labels: Vec<String> = f.legend_entries().into_iter().map(|e| e.label).collect();
        assert!(
            labels.contains(&"naive, naive-unsafe".to_string()),
            "{labels:?}"
        );
        assert!(!labels.contains(&"naive".to_string()), "{labels:?}");
        assert!(labels.contains(&"flash".to_string()), "{labels:?}");
        assert_eq!(
            f.lines
                .iter()
                .filter(|l| l.label != "oom: the predicted overhead (not run)")
                .count(),
            2
        );
    }

    #[test]
    fn the_gflops_chart_draws_the_fma_roofline_and_the_bf16_peak_only_beside_bf16() {
        let results = sweep_results();
        let g = images(Chart::Gflops, &results, MAX_SERIES);
        let g = grid(&g[0].plot);
        let cal = results.calibration();
        for (title, f) in &g.panels {
            let threads = if title.starts_with("1 thread") { 1 } else { 2 };
            let c = cal.iter().find(|c| c.threads == threads).unwrap();
            let fma: Vec<&HLine> = f
                .hlines
                .iter()
                .filter(|h| h.label.contains("f32 FMA peak"))
                .collect();
            assert_eq!(fma.len(), 1, "{title}");
            assert_eq!(fma[0].y, c.fma_peak_gflops);
            let bf16: Vec<&HLine> = f
                .hlines
                .iter()
                .filter(|h| h.label.contains("bf16 peak"))
                .collect();
            if title.contains("bf16") {
                assert_eq!(bf16.len(), 1, "{title}");
                assert_eq!(Some(bf16[0].y), c.bf16_peak_gflops);
            } else {
                assert!(bf16.is_empty(), "{title}");
            }
            assert!(f
                .hlines
                .iter()
                .any(|h| h.label.starts_with("SGEMM (matrixmultiply), reference")
                    && h.y == c.sgemm_gflops));
            assert_eq!(f.y.scale, Scale::Log10);
        }
    }

    #[test]
    fn memory_guides_run_through_the_fastest_and_the_slowest_growing_series() {
        let line = |pts: &[(f64, f64)]| Line {
            label: "l".into(),
            color: GUIDE,
            marker: Marker::Circle,
            dash: Dash::Solid,
            width: 2,
            connect: true,
            points: pts
                .iter()
                .map(|&(x, y)| Pt {
                    x,
                    y,
                    hollow: false,
                })
                .collect(),
            band: Vec::new(),
        };
        let lines = [
            line(&[(256.0, 4e3), (1024.0, 8e3)]), // ∝ √n
            line(&[(1024.0, 1e6), (256.0, 1e5)]), // faster than n, listed out of order
            line(&[(512.0, 1e9)]),                // one point: no growth
            line(&[(256.0, 1e4), (1024.0, 4e4)]), // ∝ n
        ];
        assert_eq!(growth_anchors(&lines), Some(((256.0, 1e5), (256.0, 4e3))));
        assert_eq!(
            growth_anchors(&lines[2..3]),
            Some(((512.0, 1e9), (512.0, 1e9)))
        );
        // In every panel of a chart, both anchors are points of its series.
        let results = sweep_results();
        let imgs = images(Chart::Memory, &results, MAX_SERIES);
        for (title, f) in &grid(&imgs[0].plot).panels {
            assert_eq!(f.guides.len(), 2, "{title}");
            for g in &f.guides {
                assert!(
                    f.lines
                        .iter()
                        .flat_map(|l| &l.points)
                        .any(|p| (p.x, p.y) == g.anchor),
                    "{title}: {} at {:?}",
                    g.label,
                    g.anchor
                );
            }
        }
    }

    #[test]
    fn the_error_chart_draws_one_tolerance_line_per_dtype_drawn() {
        let rows = |dtypes: &[DType]| {
            results_of(
                dtypes
                    .iter()
                    .flat_map(|&d| [256, 1024].map(|n| row("flash", d, n, |_| {})))
                    .collect(),
            )
        };
        for dtypes in [vec![DType::F32], vec![DType::F32, DType::Bf16, DType::F16]] {
            let results = rows(&dtypes);
            let imgs = images(Chart::Error, &results, MAX_SERIES);
            let f = single(&imgs[0].plot);
            let tol: Vec<f64> = f
                .hlines
                .iter()
                .filter(|h| h.label.contains("tolerance"))
                .map(|h| h.y)
                .collect();
            let mut want: Vec<f64> = dtypes.iter().map(|d| d.tolerance()).collect();
            want.sort_by(f64::total_cmp);
            let mut got = tol.clone();
            got.sort_by(f64::total_cmp);
            assert_eq!(got, want, "{dtypes:?}");
        }
    }

    #[test]
    fn runtime_series_get_a_spread_band_that_extrapolated_points_lack() {
        let results = results_of(
            ["naive", "flash"]
                .iter()
                .flat_map(|v| [256, 1024, 4096].map(|n| row(v, DType::F32, n, |_| {})))
                .map(|mut r| {
                    let t = r.time_median_s.unwrap();
                    (r.time_min_s, r.time_max_s) = (Some(0.9 * t), Some(1.3 * t));
                    // flash's last time extrapolated.
                    r.extrapolated = r.variant == "flash" && r.seq_q == 4096;
                    r
                })
                .collect(),
        );
        let imgs = images(Chart::Runtime, &results, MAX_SERIES);
        let f = single(&imgs[0].plot);
        assert_eq!(f.lines.len(), 2);
        for l in &f.lines {
            assert!(!l.band.is_empty(), "{}", l.label);
            for p in &l.points {
                let band = l.band.iter().find(|b| b.0 == p.x);
                if p.hollow {
                    assert!(
                        band.is_none(),
                        "{}: extrapolated {} has a band",
                        l.label,
                        p.x
                    );
                } else {
                    let (_, lo, hi) = band.unwrap();
                    assert!(*lo < p.y && p.y < *hi);
                }
            }
        }
        let flash = f.lines.iter().find(|l| l.label == "flash").unwrap();
        assert_eq!(flash.band.len(), 2);
        assert!(flash.points.iter().any(|p| p.hollow));
    }

    #[test]
    fn decode_rows_are_drawn_against_the_kv_cache_length() {
        let decode = |q: usize, kv: usize| {
            row("flash-decoding", DType::F32, kv, |r| {
                r.mode = "decode".into();
                (r.seq_q, r.seq_kv) = (q, kv);
                r.time_median_s = Some(1e-7 * (q * kv) as f64);
            })
        };
        let results = results_of(
            [1, 4]
                .iter()
                .flat_map(|&q| [1024, 4096, 16384].map(|kv| decode(q, kv)))
                .collect(),
        );
        let imgs = images(Chart::Runtime, &results, MAX_SERIES);
        let f = single(&imgs[0].plot);
        assert_eq!(f.x.label, KV_AXIS);
        assert_eq!(f.title, "Runtime vs KV cache length");
        let labels: Vec<&str> = f.lines.iter().map(|l| l.label.as_str()).collect();
        assert_eq!(labels, ["flash-decoding · n_q=1", "flash-decoding · n_q=4"]);
        for l in &f.lines {
            let xs: Vec<f64> = l.points.iter().map(|p| p.x).collect();
            assert_eq!(xs, [1024.0, 4096.0, 16384.0]);
        }
    }
}
