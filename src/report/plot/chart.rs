//! A line chart (`Figure`): series of points with markers and dash patterns, dashed guide
//! slopes, horizontal reference lines (each also labelled inside the plot), drawn with
//! plotters on any backend. The legend lists every entry, never covering data: in a panel
//! to the right of the axes while it fits there, else in columns under the plot, the canvas
//! growing as tall as it needs. Title and caption sit above. A series may carry a spread
//! band (light fill in its colour); series with identical points are merged into one line
//! (`merge_identical`). `draw_axes` draws the plot alone, so `grid` can place many of them.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::axis::{AxisSpec, TickRange};
use super::style::{dash_segments, LIGHT_GUIDE};
pub use super::style::{Dash, Marker};
use super::{FONT, HEIGHT, WIDTH};

/// Legend panel width in pixels.
const LEGEND_W: u32 = 400;
/// Characters per legend line before wrapping.
const LEGEND_CHARS: usize = 38;
/// Title and caption band.
pub(super) const HEAD_H: u32 = 78;
/// The axes' band (and the side legend's height).
const BODY_H: u32 = HEIGHT - HEAD_H;
/// Left and right margin of a legend under the plot.
pub(super) const MARGIN: i32 = 24;
/// From a legend row's left edge to its text (the line sample and marker go before).
const SWATCH_W: i32 = 72;
/// Most columns of a legend under the plot.
const MAX_COLUMNS: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pt {
    pub x: f64,
    pub y: f64,
    /// Drawn as an outline: a derived value (e.g. an extrapolated time).
    pub hollow: bool,
}

#[derive(Clone, Debug)]
pub struct Line {
    pub label: String,
    pub color: RGBColor,
    pub marker: Marker,
    pub dash: Dash,
    /// Stroke width in pixels.
    pub width: u32,
    /// Join the points with a line (false: markers only).
    pub connect: bool,
    /// In data units, any order.
    pub points: Vec<Pt>,
    /// A spread band: (x, low, high) in data units at points' x values, filled lightly in
    /// the line's colour; a point without one breaks the band there.
    pub band: Vec<(f64, f64, f64)>,
}

/// A horizontal reference line (budget, roofline), dashed.
#[derive(Clone, Debug)]
pub struct HLine {
    pub label: String,
    pub y: f64,
    pub color: RGBColor,
}

/// A dashed power-law guide y = c * x^exponent through `anchor` (data units; log-log axes).
#[derive(Clone, Debug)]
pub struct Guide {
    pub label: String,
    pub color: RGBColor,
    pub exponent: f64,
    pub anchor: (f64, f64),
}

#[derive(Clone, Debug)]
pub struct Figure {
    pub title: String,
    pub caption: String,
    pub x: AxisSpec,
    pub y: AxisSpec,
    pub lines: Vec<Line>,
    pub hlines: Vec<HLine>,
    pub guides: Vec<Guide>,
    /// Lines of text under the legend (what hollow markers mean, ...).
    pub notes: Vec<String>,
    /// Start a linear y axis at 0.
    pub y_from_zero: bool,
    /// Bounds the axes must cover besides this figure's own data: the union of the extents
    /// of sibling facets, so that every panel of a split chart gets the same axes.
    pub shared: Option<Extent>,
}

/// The bounds of a figure's data in plot coordinates (after the axes' scales).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Extent {
    pub x: (f64, f64),
    pub y: (f64, f64),
}

impl Extent {
    /// The smallest extent covering both.
    pub fn union(self, other: Extent) -> Extent {
        Extent {
            x: (self.x.0.min(other.x.0), self.x.1.max(other.x.1)),
            y: (self.y.0.min(other.y.0), self.y.1.max(other.y.1)),
        }
    }
}

type DrawResult<T> = Result<T, String>;

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Splits `text` into lines of at most `width` characters at spaces.
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    wrap_while(text, |line| line.chars().count() <= width)
}

/// Words of `text` (split at spaces) gathered into lines while `fits` accepts the line; a
/// word that does not fit alone still gets a line of its own.
fn wrap_while(text: &str, fits: impl Fn(&str) -> bool) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in text.split(' ') {
        if let Some(l) = lines.last_mut() {
            if l.is_empty() {
                l.push_str(word);
                continue;
            }
            let longer = format!("{l} {word}");
            if fits(&longer) {
                *l = longer;
                continue;
            }
        }
        lines.push(word.to_string());
    }
    lines
}

impl Figure {
    /// Plot coordinates of every point, skipping what the scales cannot show.
    fn plotted(&self, line: &Line) -> Vec<(f64, f64, bool)> {
        let mut v: Vec<(f64, f64, bool)> = line
            .points
            .iter()
            .filter_map(|p| Some((self.x.to_plot(p.x)?, self.y.to_plot(p.y)?, p.hollow)))
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    }

    /// Plot coordinates of a line's band, sorted by x, skipping what the scales cannot show.
    fn band_plotted(&self, line: &Line) -> Vec<(f64, f64, f64)> {
        let mut v: Vec<(f64, f64, f64)> = line
            .band
            .iter()
            .filter_map(|&(x, lo, hi)| {
                Some((self.x.to_plot(x)?, self.y.to_plot(lo)?, self.y.to_plot(hi)?))
            })
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    }

    /// The bounds of the points, bands and horizontal lines (None: nothing to plot).
    pub fn extent(&self) -> Option<Extent> {
        let pts: Vec<(f64, f64)> = self
            .lines
            .iter()
            .flat_map(|l| self.plotted(l))
            .map(|(x, y, _)| (x, y))
            .chain(
                self.lines
                    .iter()
                    .flat_map(|l| self.band_plotted(l))
                    .flat_map(|(x, lo, hi)| [(x, lo), (x, hi)]),
            )
            .chain(
                self.hlines
                    .iter()
                    .filter_map(|h| self.y.to_plot(h.y))
                    .filter_map(|y| pts_x_any(self, y)),
            )
            .collect();
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for (x, y) in pts {
            (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
        }
        (x0 <= x1 && y0 <= y1).then_some(Extent {
            x: (x0, x1),
            y: (y0, y1),
        })
    }

    /// The axes' ranges and ticks: the data's extent, and the shared one when set.
    pub fn ranges(&self) -> (TickRange, TickRange) {
        let extent = match (self.extent(), self.shared) {
            (Some(a), Some(b)) => a.union(b),
            (a, b) => a.or(b).unwrap_or(Extent {
                x: (0.0, 1.0),
                y: (0.0, 1.0),
            }),
        };
        (
            TickRange::for_data(&self.x, extent.x.0, extent.x.1, false),
            TickRange::for_data(&self.y, extent.y.0, extent.y.1, self.y_from_zero),
        )
    }

    /// The canvas size: the usual one, taller when the legend goes under the plot.
    pub fn size(&self) -> (u32, u32) {
        (WIDTH, HEIGHT + self.legend().height)
    }

    pub fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<()> {
        let legend = self.legend();
        root.fill(&WHITE).map_err(err)?;
        let (head, body) = root.split_vertically(HEAD_H);
        draw_head(&head, &self.title, &self.caption)?;
        let (plot, legend_area) = if legend.below {
            body.split_vertically(BODY_H)
        } else {
            body.split_horizontally(WIDTH - LEGEND_W)
        };
        self.draw_axes(root, &plot, Frame::ALONE)?;
        draw_legend(&legend_area, &legend)
    }

    /// Draws the axes, reference lines, bands and series into `plot`; `root` is the whole
    /// canvas (pixel-placed strokes and labels go there, in its coordinates).
    pub fn draw_axes<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        plot: &DrawingArea<DB, Shift>,
        frame: Frame,
    ) -> DrawResult<()> {
        let (xr, yr) = self.ranges();
        let (label_font, desc_font, tag_font) = if frame.compact {
            (15, 17, 14)
        } else {
            (18, 20, TAG_FONT)
        };
        let mut chart = ChartBuilder::on(plot)
            .margin_left(12)
            .margin_right(if frame.compact { 14 } else { 24 })
            .margin_top(8)
            .margin_bottom(if frame.compact { 6 } else { 12 })
            .x_label_area_size(if frame.compact { 52 } else { 64 })
            .y_label_area_size(if frame.compact { 92 } else { 104 })
            .build_cartesian_2d(xr.clone(), yr.clone())
            .map_err(err)?;
        let (x, y) = (&self.x, &self.y);
        chart
            .configure_mesh()
            .x_desc(if frame.x_desc { x.label.as_str() } else { "" })
            .y_desc(if frame.y_desc { y.label.as_str() } else { "" })
            .x_label_formatter(&|v| x.label(*v))
            .y_label_formatter(&|v| y.label(*v))
            .label_style((FONT, label_font))
            .axis_desc_style((FONT, desc_font))
            .bold_line_style(RGBColor(205, 205, 205))
            .light_line_style(RGBColor(238, 238, 238))
            .draw()
            .map_err(err)?;

        // Reference lines first (under the data), their names written beside them.
        let (px, py) = chart.plotting_area().get_pixel_range();
        let mut tags: Vec<(String, RGBColor, (i32, i32), Pos)> = Vec::new();
        let tag_h = tag_font + 2;
        for g in &self.guides {
            if let Some(seg) = self.guide_segment(g, &xr, &yr) {
                chart
                    .draw_series(DashedLineSeries::new(seg, 10, 7, g.color.stroke_width(2)))
                    .map_err(err)?;
                // At the upper end: beside it where it leaves through the top, else above it.
                let (ex, ey) = chart.backend_coord(&seg[1]);
                let text = g.label.split(" (").next().unwrap_or(&g.label).to_string();
                let at = if ey - 6 - tag_h < py.start {
                    let room = px.end - ex - 12 >= text_width(&text, tag_font);
                    if room {
                        ((ex + 8, py.start + 4), Pos::new(HPos::Left, VPos::Top))
                    } else {
                        ((px.end - 6, py.start + 4), Pos::new(HPos::Right, VPos::Top))
                    }
                } else {
                    (
                        (ex.min(px.end) - 6, ey - 6),
                        Pos::new(HPos::Right, VPos::Bottom),
                    )
                };
                tags.push((text, g.color, at.0, at.1));
            }
        }
        let mut taken: Vec<(i32, i32)> = Vec::new();
        for h in &self.hlines {
            if let Some(yv) = y.to_plot(h.y) {
                chart
                    .draw_series(DashedLineSeries::new(
                        [(xr.lo, yv), (xr.hi, yv)],
                        12,
                        6,
                        h.color.stroke_width(2),
                    ))
                    .map_err(err)?;
                // Above the line, else below it; neither where another line's name is
                // (close peaks): the legend names it then.
                let (_, hy) = chart.backend_coord(&(xr.hi, yv));
                let free = |top: i32| {
                    top >= py.start
                        && top + tag_h <= py.end
                        && taken.iter().all(|&(t, b)| top + tag_h <= t || top >= b)
                };
                let spot = if free(hy - 4 - tag_h) {
                    Some(((px.end - 8, hy - 4), VPos::Bottom, hy - 4 - tag_h))
                } else if free(hy + 5) {
                    Some(((px.end - 8, hy + 5), VPos::Top, hy + 5))
                } else {
                    None
                };
                if let Some((at, v, top)) = spot {
                    taken.push((top, top + tag_h));
                    tags.push((h.label.clone(), h.color, at, Pos::new(HPos::Right, v)));
                }
            }
        }
        let pixel = |p: (f64, f64)| {
            let (a, b) = chart.backend_coord(&p);
            (a as f32, b as f32)
        };
        // Bands under every series' line, so no fill hides another series' markers.
        for l in &self.lines {
            for run in self.band_runs(l) {
                let fill = l.color.mix(0.16).filled();
                if let [(x, lo, hi)] = run[..] {
                    // A single point: a thin bar, so bars at one x stay apart.
                    let ((a, top), (_, bottom)) = (pixel((x, hi)), pixel((x, lo)));
                    let (a, top, bottom) =
                        (a.round() as i32, top.round() as i32, bottom.round() as i32);
                    let bar = l.color.mix(0.35).filled();
                    root.draw(&Rectangle::new([(a - 1, top), (a + 1, bottom)], bar))
                        .map_err(err)?;
                    continue;
                }
                let outline: Vec<(i32, i32)> = run
                    .iter()
                    .map(|&(x, _, hi)| pixel((x, hi)))
                    .chain(run.iter().rev().map(|&(x, lo, _)| pixel((x, lo))))
                    .map(|(a, b)| (a.round() as i32, b.round() as i32))
                    .collect();
                root.draw(&Polygon::new(outline, fill)).map_err(err)?;
            }
        }
        for l in &self.lines {
            let pts = self.plotted(l);
            if l.connect && pts.len() > 1 {
                let pixels: Vec<(f32, f32)> = pts.iter().map(|p| pixel((p.0, p.1))).collect();
                stroke(root, &pixels, l.dash, l.color, l.width)?;
            }
            for (px, py, hollow) in pts {
                marker(chart.plotting_area(), (px, py), l.marker, l.color, hollow)?;
            }
        }
        // Over the data, so a line crossing a label cannot hide it.
        for (text, color, at, pos) in tags {
            let style = (FONT, tag_font)
                .into_font()
                .color(&readable(color))
                .pos(pos);
            root.draw(&Text::new(text, at, style)).map_err(err)?;
        }
        Ok(())
    }

    /// A line's band in plot coordinates, cut into runs of neighbouring points that all
    /// have one: a point without a band (an extrapolated time) leaves a gap.
    fn band_runs(&self, line: &Line) -> Vec<Vec<(f64, f64, f64)>> {
        let band = self.band_plotted(line);
        let mut runs: Vec<Vec<(f64, f64, f64)>> = Vec::new();
        let mut current = Vec::new();
        for (x, _, _) in self.plotted(line) {
            match band.iter().find(|b| b.0 == x) {
                Some(&b) => current.push(b),
                None => {
                    if !current.is_empty() {
                        runs.push(std::mem::take(&mut current));
                    }
                }
            }
        }
        if !current.is_empty() {
            runs.push(current);
        }
        runs
    }

    /// The part of a guide inside the plot box, in plot coordinates (log-log).
    fn guide_segment(&self, g: &Guide, xr: &TickRange, yr: &TickRange) -> Option<[(f64, f64); 2]> {
        let (ax, ay) = (self.x.to_plot(g.anchor.0)?, self.y.to_plot(g.anchor.1)?);
        // Both axes log: slope in plot space is the exponent times the ratio of log bases.
        let k = g.exponent * base_ratio(&self.x, &self.y);
        let y_at = |x: f64| ay + k * (x - ax);
        let x_at = |y: f64| ax + (y - ay) / k;
        let (mut lo, mut hi) = (xr.lo, xr.hi);
        if k != 0.0 {
            let (a, b) = (x_at(yr.lo), x_at(yr.hi));
            lo = lo.max(a.min(b));
            hi = hi.min(a.max(b));
        }
        (hi > lo).then(|| [(lo, y_at(lo)), (hi, y_at(hi))])
    }

    /// Legend rows, every one: the labelled lines, then the reference lines and guides.
    /// Lines with an empty label (explained by a note instead) are left out.
    pub fn legend_entries(&self) -> Vec<Entry> {
        let lines = self
            .lines
            .iter()
            .filter(|l| !l.label.is_empty())
            .map(|l| Entry {
                color: l.color,
                dash: l.connect.then_some(l.dash),
                marker: Some(l.marker),
                label: l.label.clone(),
            });
        let hlines = self.hlines.iter().map(|h| Entry {
            color: h.color,
            dash: Some(Dash::Dashed),
            marker: None,
            label: h.label.clone(),
        });
        let guides = self.guides.iter().map(|g| Entry {
            color: g.color,
            dash: Some(Dash::Dashed),
            marker: None,
            label: g.label.clone(),
        });
        lines.chain(hlines).chain(guides).collect()
    }

    /// Where the legend goes: beside the plot in normal, then compact type if it fits there,
    /// else under the plot in as many columns as its longest label allows.
    pub fn legend(&self) -> Legend {
        let entries = self.legend_entries();
        let available = BODY_H as i32 - 16;
        for (font, line_h, chars, note_font, note_h) in [
            (17, 22, LEGEND_CHARS, 15, 19),
            (14, 17, LEGEND_CHARS + 6, 13, 16),
        ] {
            let mut rows = Vec::new();
            let mut yy = 16;
            for e in &entries {
                let lines = wrap(&e.label, chars);
                let h = lines.len() as i32 * line_h;
                rows.push(Row {
                    entry: e.clone(),
                    at: (0, yy),
                    lines,
                });
                yy += h + 6;
            }
            yy += 10;
            let notes = place_notes(&self.notes, chars + 6, (8, &mut yy), note_h, 6);
            if yy <= available {
                return Legend {
                    below: false,
                    height: 0,
                    width: LEGEND_W as i32,
                    font,
                    line_h,
                    note_font,
                    note_h,
                    rows,
                    notes,
                };
            }
        }
        legend_below(&entries, &self.notes, WIDTH as i32)
    }
}

/// The title and the caption in the band above a chart.
pub(super) fn draw_head<DB: DrawingBackend>(
    head: &DrawingArea<DB, Shift>,
    title: &str,
    caption: &str,
) -> DrawResult<()> {
    head.draw(&Text::new(
        title.to_string(),
        (24, 12),
        (FONT, 28).into_font().color(&BLACK),
    ))
    .map_err(err)?;
    head.draw(&Text::new(
        caption.to_string(),
        (24, 48),
        (FONT, 18).into_font().color(&RGBColor(90, 90, 90)),
    ))
    .map_err(err)
}

/// A legend of `entries` and `notes` laid out under a plot `canvas_w` pixels wide, in as
/// many columns (up to `MAX_COLUMNS`) as make it shortest, labels wrapped to their width.
pub(super) fn legend_below(entries: &[Entry], notes: &[String], canvas_w: i32) -> Legend {
    let (font, line_h, note_font, note_h) = (14, 18, 13, 17);
    let usable = canvas_w - 2 * MARGIN;
    let mut best: Option<(i32, i32, Vec<Row>)> = None;
    for columns in 1..=MAX_COLUMNS.min(entries.len().max(1)) {
        let width = usable / columns as i32;
        let per_column = entries.len().div_ceil(columns).max(1);
        let mut rows = Vec::new();
        let mut bottom = 12;
        for (c, chunk) in entries.chunks(per_column).enumerate() {
            let mut yy = 12;
            for e in chunk {
                let lines = wrap_px(&e.label, width - SWATCH_W - 12, font);
                let h = lines.len() as i32 * line_h;
                rows.push(Row {
                    entry: e.clone(),
                    at: (MARGIN + c as i32 * width, yy),
                    lines,
                });
                yy += h + 5;
            }
            bottom = bottom.max(yy);
        }
        if best.as_ref().is_none_or(|b| bottom < b.0) {
            best = Some((bottom, width, rows));
        }
    }
    let (bottom, width, rows) = best.unwrap_or((12, usable, Vec::new()));
    let mut yy = bottom + 8;
    let note_chars = (usable as f64 / (0.6 * note_font as f64)) as usize;
    let notes = place_notes(notes, note_chars, (MARGIN, &mut yy), note_h, 4);
    Legend {
        below: true,
        height: (yy + 12) as u32,
        width,
        font,
        line_h,
        note_font,
        note_h,
        rows,
        notes,
    }
}

/// Draws a laid-out legend into `area`.
pub(super) fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    legend: &Legend,
) -> DrawResult<()> {
    let text = (FONT, legend.font).into_font().color(&BLACK);
    let small = (FONT, legend.note_font)
        .into_font()
        .color(&RGBColor(70, 70, 70));
    for row in &legend.rows {
        let (x, y) = row.at;
        let mid = y + legend.line_h / 2 - 2;
        let e = &row.entry;
        if let Some(dash) = e.dash {
            let sample = [(x as f32 + 4.0, mid as f32), (x as f32 + 64.0, mid as f32)];
            stroke(area, &sample, dash, e.color, 2)?;
        }
        if let Some(m) = e.marker {
            marker(area, (x + 34, mid), m, e.color, false)?;
        }
        for (k, line) in row.lines.iter().enumerate() {
            area.draw(&Text::new(
                line.clone(),
                (x + SWATCH_W, y + k as i32 * legend.line_h),
                text.clone(),
            ))
            .map_err(err)?;
        }
    }
    for (line, at) in &legend.notes {
        area.draw(&Text::new(line.clone(), *at, small.clone()))
            .map_err(err)?;
    }
    Ok(())
}

/// How a figure's axes are drawn: alone on its canvas, or as a panel of a grid (smaller
/// type; the axis names only where the grid's edge needs them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    pub x_desc: bool,
    pub y_desc: bool,
    pub compact: bool,
}

impl Frame {
    pub const ALONE: Frame = Frame {
        x_desc: true,
        y_desc: true,
        compact: false,
    };
}

/// Merges lines whose points are identical (same x, y and hollowness, in any order; drawn
/// the same way) into the first of them, labelled with every label (`merged_label`): two
/// series drawn over each other would show one line and two legend rows, one of them
/// naming a line that cannot be seen. Lines without a label merge only among themselves.
pub fn merge_identical(lines: Vec<Line>) -> Vec<Line> {
    let sorted = |l: &Line| {
        let mut v: Vec<(u64, u64, bool)> = l
            .points
            .iter()
            .map(|p| (p.x.to_bits(), p.y.to_bits(), p.hollow))
            .collect();
        v.sort_unstable();
        v
    };
    let mut out: Vec<(Line, Vec<String>)> = Vec::new();
    // What makes two lines one: their sorted points (bit-exact), connection, labelledness
    // and width.
    type Same = (Vec<(u64, u64, bool)>, bool, bool, u32);
    let mut keys: Vec<Same> = Vec::new();
    for l in lines {
        let key = (sorted(&l), l.connect, l.label.is_empty(), l.width);
        match keys.iter().position(|k| *k == key && !key.0.is_empty()) {
            Some(i) => {
                if !out[i].1.contains(&l.label) {
                    out[i].1.push(l.label);
                }
            }
            None => {
                keys.push(key);
                let label = l.label.clone();
                out.push((l, vec![label]));
            }
        }
    }
    out.into_iter()
        .map(|(mut l, labels)| {
            l.label = merged_label(&labels);
            l
        })
        .collect()
}

/// One label for several: where they differ in one " · " part only, that part's values
/// joined by ", " in its place ("naive, naive-unsafe · f32"), else the labels joined.
pub fn merged_label(labels: &[String]) -> String {
    if labels.len() < 2 {
        return labels.first().cloned().unwrap_or_default();
    }
    let parts: Vec<Vec<&str>> = labels.iter().map(|l| l.split(" · ").collect()).collect();
    let n = parts[0].len();
    if parts.iter().all(|p| p.len() == n) {
        let differ: Vec<usize> = (0..n)
            .filter(|&i| parts.iter().any(|p| p[i] != parts[0][i]))
            .collect();
        if let [k] = differ[..] {
            let mut values: Vec<&str> = Vec::new();
            for p in &parts {
                if !values.contains(&p[k]) {
                    values.push(p[k]);
                }
            }
            let joined = values.join(", ");
            let mut out: Vec<&str> = parts[0].clone();
            out[k] = &joined;
            return out.join(" · ");
        }
    }
    labels.join(", ")
}

/// Font size of the names written beside reference lines and guides.
const TAG_FONT: i32 = 16;

/// One legend row.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub color: RGBColor,
    /// A line sample in this pattern (None: a marker alone).
    pub dash: Option<Dash>,
    pub marker: Option<Marker>,
    pub label: String,
}

/// A legend row placed: its top-left corner in the legend's area and its text lines.
#[derive(Clone, Debug)]
pub struct Row {
    pub entry: Entry,
    pub at: (i32, i32),
    pub lines: Vec<String>,
}

/// The legend laid out.
#[derive(Clone, Debug)]
pub struct Legend {
    /// Under the plot, across the canvas (else in a panel to its right).
    pub below: bool,
    /// Pixels the canvas grows by (0 beside the plot).
    pub height: u32,
    /// Width of a column.
    pub width: i32,
    pub font: i32,
    pub line_h: i32,
    pub note_font: i32,
    pub note_h: i32,
    pub rows: Vec<Row>,
    /// Note lines and their top-left corners.
    pub notes: Vec<(String, (i32, i32))>,
}

/// Width of `text` in pixels in the embedded font at `size` (estimated if it is not
/// registered).
pub(super) fn text_width(text: &str, size: i32) -> i32 {
    (FONT, size)
        .into_font()
        .box_size(text)
        .map(|(w, _)| w as i32)
        .unwrap_or_else(|_| (text.chars().count() as f64 * 0.6 * size as f64).ceil() as i32)
}

/// Splits `text` at spaces into lines at most `max` pixels wide at font `size` (a word wider
/// than that gets a line of its own).
/// The legend's notes wrapped to `chars` per line, placed one line every `line_h` px from
/// (x, *y) down with `gap` px after each note; *y ends below the last.
fn place_notes(
    notes: &[String],
    chars: usize,
    (x, y): (i32, &mut i32),
    line_h: i32,
    gap: i32,
) -> Vec<(String, (i32, i32))> {
    let mut placed = Vec::new();
    for note in notes {
        for line in wrap(note, chars) {
            placed.push((line, (x, *y)));
            *y += line_h;
        }
        *y += gap;
    }
    placed
}

fn wrap_px(text: &str, max: i32, size: i32) -> Vec<String> {
    wrap_while(text, |line| text_width(line, size) <= max)
}

/// A colour dark enough for text on white (light guides are drawn in a light grey).
fn readable(c: RGBColor) -> RGBColor {
    if c == LIGHT_GUIDE {
        RGBColor(110, 110, 110)
    } else {
        c
    }
}

/// A polyline in pixels (of `area`) stroked `width` px wide in `dash`'s pattern.
fn stroke<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    pixels: &[(f32, f32)],
    dash: Dash,
    color: RGBColor,
    width: u32,
) -> DrawResult<()> {
    for piece in dash_segments(pixels, dash.pattern()) {
        let pts: Vec<(i32, i32)> = piece
            .iter()
            .map(|&(x, y)| (x.round() as i32, y.round() as i32))
            .collect();
        area.draw(&PathElement::new(pts, color.stroke_width(width)))
            .map_err(err)?;
    }
    Ok(())
}

/// log(base_x) / log(base_y): converts a power-law exponent into a slope in plot space.
fn base_ratio(x: &AxisSpec, y: &AxisSpec) -> f64 {
    use super::axis::Scale;
    let ln_base = |s: Scale| match s {
        Scale::Log2 => std::f64::consts::LN_2,
        Scale::Log10 => std::f64::consts::LN_10,
        Scale::Linear => 1.0,
    };
    ln_base(x.scale) / ln_base(y.scale)
}

/// Any x (the left end) paired with `y`, so horizontal lines enter the y range.
fn pts_x_any(fig: &Figure, y: f64) -> Option<(f64, f64)> {
    let x = fig
        .lines
        .iter()
        .flat_map(|l| fig.plotted(l))
        .map(|p| p.0)
        .reduce(f64::min)?;
    Some((x, y))
}

/// One marker at `pos` (any coordinate system), filled, or as an outline (a white inner
/// shape over the filled one: plotters fills triangles whatever the style says).
pub fn marker<DB: DrawingBackend, CT: plotters::coord::CoordTranslate>(
    area: &DrawingArea<DB, CT>,
    pos: CT::From,
    kind: Marker,
    color: RGBColor,
    hollow: bool,
) -> DrawResult<()>
where
    CT::From: Clone,
{
    let shape = |size: i32, style: ShapeStyle| match kind {
        Marker::Circle => area.draw(&Circle::new(pos.clone(), size, style)),
        Marker::Triangle => area.draw(&TriangleMarker::new(pos.clone(), size + 2, style)),
        Marker::Square => area.draw(
            &(EmptyElement::at(pos.clone())
                + Rectangle::new([(-size, -size), (size, size)], style)),
        ),
        Marker::Diamond => {
            let d = size + 2;
            area.draw(
                &(EmptyElement::at(pos.clone())
                    + Polygon::new(vec![(0, -d), (d, 0), (0, d), (-d, 0)], style)),
            )
        }
        Marker::TriangleDown => {
            // TriangleMarker's shape upside down.
            let s = (size + 2) as f64;
            let (w, h) = ((s * 0.866).round() as i32, (s * 0.5).round() as i32);
            area.draw(
                &(EmptyElement::at(pos.clone())
                    + Polygon::new(vec![(0, s as i32), (-w, -h), (w, -h)], style)),
            )
        }
        Marker::Cross => area.draw(&Cross::new(pos.clone(), size + 2, color.stroke_width(3))),
    };
    shape(5, color.filled()).map_err(err)?;
    if hollow && kind != Marker::Cross {
        shape(3, WHITE.filled()).map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::axis::{Scale, Unit};
    use super::super::style::{GUIDE, PALETTE, RED};
    use super::*;

    #[test]
    fn identical_lines_merge_into_one_naming_every_label() {
        let line = |label: &str, ys: [f64; 2]| Line {
            label: label.into(),
            color: PALETTE[0],
            marker: Marker::Circle,
            dash: Dash::Solid,
            width: 2,
            connect: true,
            points: vec![
                Pt {
                    x: 256.0,
                    y: ys[0],
                    hollow: false,
                },
                Pt {
                    x: 512.0,
                    y: ys[1],
                    hollow: false,
                },
            ],
            band: Vec::new(),
        };
        let merged = merge_identical(vec![
            line("naive · f32", [1.0, 2.0]),
            line("flash · f32", [1.0, 3.0]),
            line("naive-unsafe · f32", [1.0, 2.0]),
        ]);
        let labels: Vec<&str> = merged.iter().map(|l| l.label.as_str()).collect();
        assert_eq!(labels, ["naive, naive-unsafe · f32", "flash · f32"]);
        // Labels that differ in more than one part are listed whole.
        assert_eq!(
            merged_label(&["a · x".into(), "b · y".into()]),
            "a · x, b · y"
        );
        assert_eq!(merged_label(&["a".into()]), "a");
    }

    #[test]
    fn wrap_breaks_at_spaces() {
        assert_eq!(wrap("a bb ccc dddd", 6), ["a bb", "ccc", "dddd"]);
        assert_eq!(wrap("short", 40), ["short"]);
    }

    /// A memory chart of `n` series (labels like results/quick's), a budget and two guides.
    fn figure(n: usize) -> Figure {
        let variants = [
            "naive",
            "naive-unsafe",
            "rabe-staats",
            "rabe-staats-seq",
            "flash",
        ];
        let lines = (0..n)
            .map(|i| Line {
                label: format!(
                    "{} · {} · kv_heads={} · {}",
                    variants[i / 8 % variants.len()],
                    if i % 8 < 4 { "f32" } else { "bf16" },
                    if i % 2 == 0 { 4 } else { 1 },
                    if i % 4 < 2 { "non-causal" } else { "causal" },
                ),
                color: PALETTE[i % PALETTE.len()],
                marker: Marker::Circle,
                dash: Dash::Solid,
                width: 2,
                connect: true,
                points: vec![Pt {
                    x: 256.0,
                    y: 1e6,
                    hollow: false,
                }],
                band: Vec::new(),
            })
            .collect();
        Figure {
            title: "t".into(),
            caption: "c".into(),
            x: AxisSpec::new("n", Scale::Log2, Unit::Tokens),
            y: AxisSpec::new("bytes", Scale::Log2, Unit::Bytes),
            lines,
            hlines: vec![HLine {
                label: "memory budget 8.00 GiB".into(),
                y: 8e9,
                color: RED,
            }],
            guides: vec![Guide {
                label: "∝ n² (standard attention)".into(),
                color: GUIDE,
                exponent: 2.0,
                anchor: (256.0, 1e3),
            }],
            notes: vec!["Measured by the counting allocator during one call.".into()],
            y_from_zero: false,
            shared: None,
        }
    }

    /// Every entry is laid out once, inside the canvas, no two overlapping.
    fn check_complete(fig: &Figure) -> Legend {
        let _ = super::super::register_font();
        let legend = fig.legend();
        let want: Vec<String> = fig
            .lines
            .iter()
            .map(|l| l.label.clone())
            .chain(fig.hlines.iter().map(|h| h.label.clone()))
            .chain(fig.guides.iter().map(|g| g.label.clone()))
            .collect();
        let got: Vec<String> = legend.rows.iter().map(|r| r.entry.label.clone()).collect();
        assert_eq!(got, want, "the legend lists every entry, in order");
        for r in &legend.rows {
            assert_eq!(r.lines.join(" "), r.entry.label, "text kept whole");
            for line in &r.lines {
                let right = SWATCH_W + text_width(line, legend.font);
                assert!(
                    right <= legend.width,
                    "{line:?} runs {right} > {}",
                    legend.width
                );
            }
        }
        let (w, h) = fig.size();
        let (area_w, area_h) = if legend.below {
            (w as i32, legend.height as i32)
        } else {
            (LEGEND_W as i32, BODY_H as i32)
        };
        let boxes: Vec<(i32, i32, i32, i32)> = legend
            .rows
            .iter()
            .map(|r| {
                let (x, y) = r.at;
                (
                    x,
                    y,
                    x + legend.width,
                    y + r.lines.len() as i32 * legend.line_h,
                )
            })
            .collect();
        for (i, a) in boxes.iter().enumerate() {
            assert!(
                a.0 >= 0 && a.1 >= 0 && a.2 <= area_w && a.3 <= area_h,
                "{a:?}"
            );
            for b in &boxes[i + 1..] {
                let apart = a.2 <= b.0 || b.2 <= a.0 || a.3 <= b.1 || b.3 <= a.1;
                assert!(apart, "{a:?} overlaps {b:?}");
            }
        }
        let last = legend.notes.last().map_or(0, |n| n.1 .1 + legend.note_h);
        assert!(last <= area_h, "notes fit: {last} > {area_h}");
        assert!(h >= HEIGHT);
        legend
    }

    #[test]
    fn few_entries_stay_beside_the_plot() {
        let fig = figure(5);
        let legend = check_complete(&fig);
        assert!(!legend.below);
        assert_eq!(fig.size(), (WIDTH, HEIGHT));
        assert_eq!(legend.font, 17, "normal type while it fits");
    }

    #[test]
    fn many_entries_go_under_the_plot_in_columns() {
        // results/quick: 5 variants x 8 settings, a budget and a guide.
        let fig = figure(40);
        let legend = check_complete(&fig);
        assert!(legend.below);
        let columns: std::collections::HashSet<i32> = legend.rows.iter().map(|r| r.at.0).collect();
        assert!(columns.len() >= 2, "{} columns", columns.len());
        assert!(fig.size().1 > HEIGHT);
        // Hundreds of series still all listed, the canvas taller still.
        let big = figure(211);
        check_complete(&big);
        assert!(big.size().1 > fig.size().1);
    }
}
