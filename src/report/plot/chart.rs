//! A line chart (`Figure`): series of points with markers, dashed guide slopes, horizontal
//! reference lines, drawn with plotters on any backend. The legend sits in its own panel to
//! the right of the axes, so it never covers data; title and caption sit above.

use plotters::coord::Shift;
use plotters::prelude::*;

use super::axis::{AxisSpec, TickRange};
use super::{FONT, WIDTH};

/// Legend panel width in pixels.
const LEGEND_W: u32 = 400;
/// Characters per legend line before wrapping.
const LEGEND_CHARS: usize = 40;

/// Series colours: Tableau 10 without its red (which marks budgets and oom), then darker
/// shades of the same hues, so up to 16 series stay apart.
pub const PALETTE: [RGBColor; 16] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(16, 60, 120),
    RGBColor(170, 80, 0),
    RGBColor(20, 100, 20),
    RGBColor(90, 50, 130),
    RGBColor(80, 45, 35),
    RGBColor(60, 60, 60),
    RGBColor(110, 110, 0),
];
pub const RED: RGBColor = RGBColor(214, 39, 40);
pub const GUIDE: RGBColor = RGBColor(60, 60, 60);
pub const LIGHT_GUIDE: RGBColor = RGBColor(160, 160, 160);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marker {
    Circle,
    Triangle,
    Square,
    Cross,
}

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
    pub dashed: bool,
    /// Join the points with a line (false: markers only).
    pub connect: bool,
    /// In data units, any order.
    pub points: Vec<Pt>,
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
}

type DrawResult<T> = Result<T, String>;

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Splits `text` into lines of at most `width` characters at spaces.
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in text.split(' ') {
        let last = lines.last_mut().map_or(0, |l| l.chars().count());
        if last > 0 && last + 1 + word.chars().count() > width {
            lines.push(String::new());
        }
        if let Some(l) = lines.last_mut() {
            if !l.is_empty() {
                l.push(' ');
            }
            l.push_str(word);
        }
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

    fn ranges(&self) -> (TickRange, TickRange) {
        let pts: Vec<(f64, f64)> = self
            .lines
            .iter()
            .flat_map(|l| self.plotted(l))
            .map(|(x, y, _)| (x, y))
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
        if x0 > x1 {
            (x0, x1) = (0.0, 1.0);
        }
        if y0 > y1 {
            (y0, y1) = (0.0, 1.0);
        }
        (
            TickRange::for_data(&self.x, x0, x1, false),
            TickRange::for_data(&self.y, y0, y1, self.y_from_zero),
        )
    }

    pub fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<()> {
        root.fill(&WHITE).map_err(err)?;
        let (head, body) = root.split_vertically(78);
        head.draw(&Text::new(
            self.title.clone(),
            (24, 12),
            (FONT, 28).into_font().color(&BLACK),
        ))
        .map_err(err)?;
        head.draw(&Text::new(
            self.caption.clone(),
            (24, 48),
            (FONT, 18).into_font().color(&RGBColor(90, 90, 90)),
        ))
        .map_err(err)?;
        let (plot, legend) = body.split_horizontally(WIDTH - LEGEND_W);
        let (xr, yr) = self.ranges();
        let mut chart = ChartBuilder::on(&plot)
            .margin_left(12)
            .margin_right(24)
            .margin_top(8)
            .margin_bottom(12)
            .x_label_area_size(64)
            .y_label_area_size(104)
            .build_cartesian_2d(xr.clone(), yr.clone())
            .map_err(err)?;
        let (x, y) = (&self.x, &self.y);
        chart
            .configure_mesh()
            .x_desc(x.label.clone())
            .y_desc(y.label.clone())
            .x_label_formatter(&|v| x.label(*v))
            .y_label_formatter(&|v| y.label(*v))
            .label_style((FONT, 18))
            .axis_desc_style((FONT, 20))
            .bold_line_style(RGBColor(205, 205, 205))
            .light_line_style(RGBColor(238, 238, 238))
            .draw()
            .map_err(err)?;

        for g in &self.guides {
            if let Some(seg) = self.guide_segment(g, &xr, &yr) {
                chart
                    .draw_series(DashedLineSeries::new(seg, 10, 7, g.color.stroke_width(2)))
                    .map_err(err)?;
            }
        }
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
            }
        }
        for l in &self.lines {
            let pts = self.plotted(l);
            let xy: Vec<(f64, f64)> = pts.iter().map(|p| (p.0, p.1)).collect();
            if l.connect && xy.len() > 1 {
                if l.dashed {
                    chart
                        .draw_series(DashedLineSeries::new(xy, 8, 5, l.color.stroke_width(2)))
                        .map_err(err)?;
                } else {
                    chart
                        .draw_series(LineSeries::new(xy, l.color.stroke_width(2)))
                        .map_err(err)?;
                }
            }
            for (px, py, hollow) in pts {
                marker(chart.plotting_area(), (px, py), l.marker, l.color, hollow)?;
            }
        }
        self.draw_legend(&legend)
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

    /// Legend rows: (colour, dashed line?, marker, label); lines with an empty label
    /// (explained by a note instead) are left out.
    fn legend_entries(&self) -> Vec<(RGBColor, Option<bool>, Option<Marker>, &str)> {
        let lines = self.lines.iter().filter(|l| !l.label.is_empty()).map(|l| {
            (
                l.color,
                l.connect.then_some(l.dashed),
                Some(l.marker),
                l.label.as_str(),
            )
        });
        let hlines = self
            .hlines
            .iter()
            .map(|h| (h.color, Some(true), None, h.label.as_str()));
        let guides = self
            .guides
            .iter()
            .map(|g| (g.color, Some(true), None, g.label.as_str()));
        lines.chain(hlines).chain(guides).collect()
    }

    fn draw_legend<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> DrawResult<()> {
        let entries = self.legend_entries();
        let available = area.dim_in_pixel().1 as i32 - 16;
        // Normal, then compact type; past that the last entries are summarized.
        let layouts = [
            (17, 22, LEGEND_CHARS, 15, 19),
            (14, 17, LEGEND_CHARS + 8, 13, 16),
        ];
        let height = |&(_, line_h, chars, _, note_h): &(i32, i32, usize, i32, i32)| {
            let e: i32 = entries
                .iter()
                .map(|e| wrap(e.3, chars).len() as i32 * line_h + 6)
                .sum();
            let n: i32 = self
                .notes
                .iter()
                .map(|t| wrap(t, chars + 6).len() as i32 * note_h + 6)
                .sum();
            16 + e + 10 + n
        };
        let layout = layouts
            .iter()
            .find(|l| height(l) <= available)
            .unwrap_or(&layouts[1]);
        let (size, line_h, chars, note_size, note_h) = *layout;
        let text = (FONT, size).into_font().color(&BLACK);
        let small = (FONT, note_size).into_font().color(&RGBColor(70, 70, 70));
        let notes_h: i32 = self
            .notes
            .iter()
            .map(|t| wrap(t, chars + 6).len() as i32 * note_h + 6)
            .sum();
        let mut yy = 16;
        for (i, (color, dashed, mark, label)) in entries.iter().enumerate() {
            let lines = wrap(label, chars);
            let need = lines.len() as i32 * line_h + 6;
            if yy + need + line_h + 10 + notes_h > available && i + 1 < entries.len() {
                area.draw(&Text::new(
                    format!("… and {} more", entries.len() - i),
                    (58, yy),
                    text.clone(),
                ))
                .map_err(err)?;
                yy += line_h + 6;
                break;
            }
            let mid = yy + line_h / 2 - 2;
            if let Some(dashed) = dashed {
                legend_line(area, mid, *color, *dashed)?;
            }
            if let Some(m) = mark {
                marker(area, (28, mid), *m, *color, false)?;
            }
            for line in lines {
                area.draw(&Text::new(line, (58, yy), text.clone()))
                    .map_err(err)?;
                yy += line_h;
            }
            yy += 6;
        }
        yy += 10;
        for note in &self.notes {
            for line in wrap(note, chars + 6) {
                area.draw(&Text::new(line, (8, yy), small.clone()))
                    .map_err(err)?;
                yy += note_h;
            }
            yy += 6;
        }
        Ok(())
    }
}

/// A legend's line sample at height `y`: solid, or three dashes.
fn legend_line<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    y: i32,
    color: RGBColor,
    dashed: bool,
) -> DrawResult<()> {
    let segments: &[(i32, i32)] = if dashed {
        &[(8, 18), (23, 33), (38, 48)]
    } else {
        &[(8, 48)]
    };
    for &(a, b) in segments {
        area.draw(&PathElement::new(
            vec![(a, y), (b, y)],
            color.stroke_width(2),
        ))
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
    use super::*;

    #[test]
    fn wrap_breaks_at_spaces() {
        assert_eq!(wrap("a bb ccc dddd", 6), ["a bb", "ccc", "dddd"]);
        assert_eq!(wrap("short", 40), ["short"]);
    }
}
