//! A heatmap of a chunk-size sweep: panels side by side (runtime, memory overhead), rows
//! q_chunk, columns kv_chunk, each cell coloured on a log scale and labelled with its value
//! (or with its status when the case did not run).

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::axis::TickRange;
use super::FONT;

#[derive(Clone, Debug)]
pub enum HeatCell {
    /// A value (coloured) and its label.
    Value(f64, String),
    /// No value: the text says why (oom, not run).
    Text(String),
}

#[derive(Clone, Debug)]
pub struct Panel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_ticks: Vec<String>,
    pub y_ticks: Vec<String>,
    /// `cells[row][column]`, row = y tick.
    pub cells: Vec<Vec<HeatCell>>,
}

#[derive(Clone, Debug)]
pub struct Heatmap {
    pub title: String,
    pub caption: String,
    pub panels: Vec<Panel>,
}

/// A perceptually ordered ramp (viridis anchors), t in [0, 1].
fn ramp(t: f64) -> RGBColor {
    const A: [(u8, u8, u8); 5] = [
        (68, 1, 84),
        (59, 82, 139),
        (33, 145, 140),
        (94, 201, 98),
        (253, 231, 37),
    ];
    let t = t.clamp(0.0, 1.0) * (A.len() - 1) as f64;
    let i = (t.floor() as usize).min(A.len() - 2);
    let f = t - i as f64;
    let mix = |a: u8, b: u8| (a as f64 + (b as f64 - a as f64) * f).round() as u8;
    RGBColor(
        mix(A[i].0, A[i + 1].0),
        mix(A[i].1, A[i + 1].1),
        mix(A[i].2, A[i + 1].2),
    )
}

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

impl Heatmap {
    pub fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
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
        let areas = body.split_evenly((1, self.panels.len().max(1)));
        for (p, area) in self.panels.iter().zip(&areas) {
            panel(p, area)?;
        }
        Ok(())
    }
}

fn panel<DB: DrawingBackend>(p: &Panel, area: &DrawingArea<DB, Shift>) -> Result<(), String> {
    let (nx, ny) = (p.x_ticks.len(), p.y_ticks.len());
    let mut chart = ChartBuilder::on(area)
        .caption(p.title.clone(), (FONT, 22))
        .margin(16)
        .x_label_area_size(64)
        .y_label_area_size(90)
        .build_cartesian_2d(TickRange::categories(nx), TickRange::categories(ny))
        .map_err(err)?;
    let label = |ticks: &[String], v: f64| {
        ticks
            .get(v.floor().max(0.0) as usize)
            .cloned()
            .unwrap_or_default()
    };
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc(p.x_label.clone())
        .y_desc(p.y_label.clone())
        .x_label_formatter(&|v| label(&p.x_ticks, *v))
        .y_label_formatter(&|v| label(&p.y_ticks, *v))
        .label_style((FONT, 17))
        .axis_desc_style((FONT, 19))
        .draw()
        .map_err(err)?;
    let values: Vec<f64> = p
        .cells
        .iter()
        .flatten()
        .filter_map(|c| match c {
            HeatCell::Value(v, _) if *v > 0.0 => Some(v.ln()),
            _ => None,
        })
        .collect();
    let (lo, hi) = values
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(*v), b.max(*v)));
    for (j, row) in p.cells.iter().enumerate() {
        for (i, cell) in row.iter().enumerate() {
            let (x, y) = (i as f64, j as f64);
            let (fill, text, dark) = match cell {
                HeatCell::Value(v, s) => {
                    let t = if hi > lo && *v > 0.0 {
                        (v.ln() - lo) / (hi - lo)
                    } else {
                        0.5
                    };
                    (ramp(t), s.clone(), t < 0.6)
                }
                HeatCell::Text(s) => (RGBColor(225, 225, 225), s.clone(), false),
            };
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x, y), (x + 1.0, y + 1.0)],
                    fill.filled(),
                )))
                .map_err(err)?;
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x, y), (x + 1.0, y + 1.0)],
                    WHITE.stroke_width(2),
                )))
                .map_err(err)?;
            let color = if dark { WHITE } else { BLACK };
            chart
                .draw_series(std::iter::once(Text::new(
                    text,
                    (x + 0.5, y + 0.5),
                    (FONT, 17)
                        .into_font()
                        .color(&color)
                        .pos(Pos::new(HPos::Center, VPos::Center)),
                )))
                .map_err(err)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ramp_ends() {
        assert_eq!(ramp(0.0), RGBColor(68, 1, 84));
        assert_eq!(ramp(1.0), RGBColor(253, 231, 37));
        assert_eq!(ramp(2.0), ramp(1.0));
    }
}
