//! Small multiples: one image holding a grid of line-chart panels (`chart::Figure`s on the
//! same axes, each titled by what its series share) and ONE legend under them, listing every
//! distinct entry of every panel once. A chart with too many series for one plot reads as a
//! page of small plots that can be compared at a glance instead of as one file per panel.

use plotters::coord::Shift;
use plotters::prelude::*;

use super::chart::{
    draw_head, draw_legend, legend_below, text_width, Entry, Figure, Frame, Legend, HEAD_H,
};
use super::FONT;

/// Most panels one image holds; a chart with more continues in further images.
pub const MAX_PANELS: usize = 16;
/// Most panels side by side: 4 × `PANEL_W` plus margins keeps an image under 2480 px wide.
pub const MAX_COLUMNS: usize = 4;
/// One panel's cell in pixels: its title band, axes and tick labels.
pub const PANEL_W: u32 = 600;
pub const PANEL_H: u32 = 450;
/// The band above a panel's axes that holds its title.
const TITLE_H: u32 = 30;
/// Left and right margin of the grid.
const SIDE: u32 = 16;

/// The panels of one image, in reading order (left to right, then down).
#[derive(Clone, Debug)]
pub struct Grid {
    pub title: String,
    pub caption: String,
    /// (panel title, figure): the figures' own titles, captions and legends are not drawn.
    pub panels: Vec<(String, Figure)>,
}

/// Columns for `n` panels: up to 3 in a row, then a near-square grid, at most `MAX_COLUMNS`.
pub fn columns(n: usize) -> usize {
    if n <= 3 {
        n.max(1)
    } else {
        let mut c = 1;
        while c * c < n {
            c += 1;
        }
        c.min(MAX_COLUMNS)
    }
}

impl Grid {
    /// (columns, rows) of panels.
    pub fn shape(&self) -> (usize, usize) {
        let c = columns(self.panels.len());
        (c, self.panels.len().div_ceil(c).max(1))
    }

    /// The canvas size: the panels' cells, the head above and the legend below.
    pub fn size(&self) -> (u32, u32) {
        let (c, r) = self.shape();
        let width = 2 * SIDE + c as u32 * PANEL_W;
        (width, HEAD_H + r as u32 * PANEL_H + self.legend().height)
    }

    /// Every distinct legend entry of the panels, in first-seen order: the series first,
    /// then the reference lines and guides.
    pub fn legend_entries(&self) -> Vec<Entry> {
        let mut series: Vec<Entry> = Vec::new();
        let mut refs: Vec<Entry> = Vec::new();
        for (_, f) in &self.panels {
            let labelled = f.lines.iter().filter(|l| !l.label.is_empty()).count();
            for (k, e) in f.legend_entries().into_iter().enumerate() {
                let list = if k < labelled { &mut series } else { &mut refs };
                if !list.contains(&e) {
                    list.push(e);
                }
            }
        }
        series.extend(refs);
        series
    }

    /// The panels' notes, each once, in first-seen order.
    pub fn notes(&self) -> Vec<String> {
        let mut notes: Vec<String> = Vec::new();
        for n in self.panels.iter().flat_map(|(_, f)| &f.notes) {
            if !notes.contains(n) {
                notes.push(n.clone());
            }
        }
        notes
    }

    /// The one legend, under the panels, across the canvas.
    pub fn legend(&self) -> Legend {
        let (c, _) = self.shape();
        let width = 2 * SIDE + c as u32 * PANEL_W;
        legend_below(&self.legend_entries(), &self.notes(), width as i32)
    }

    pub fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
        let legend = self.legend();
        root.fill(&WHITE).map_err(err)?;
        let (c, r) = self.shape();
        let (head, body) = root.split_vertically(HEAD_H);
        draw_head(&head, &self.title, &self.caption)?;
        let (cells, legend_area) = body.split_vertically(r as u32 * PANEL_H);
        let title_font = (FONT, 18).into_font().color(&BLACK);
        for (k, (title, fig)) in self.panels.iter().enumerate() {
            let (col, row) = (k % c, k / c);
            let x0 = (SIDE + col as u32 * PANEL_W) as i32;
            let y0 = (row as u32 * PANEL_H) as i32;
            let cell = cells.clone().shrink((x0, y0), (PANEL_W, PANEL_H));
            let (band, plot) = cell.split_vertically(TITLE_H);
            // Smaller type for a title too long for its cell.
            let room = PANEL_W as i32 - 112;
            let font = if text_width(title, 18) <= room {
                title_font.clone()
            } else {
                (FONT, 14).into_font().color(&BLACK)
            };
            band.draw(&Text::new(title.clone(), (104, 8), font))
                .map_err(err)?;
            // Axis names on the grid's outer edges only: the axes are the same everywhere.
            let below = k + c < self.panels.len();
            let frame = Frame {
                x_desc: !below,
                y_desc: col == 0,
                compact: true,
            };
            fig.draw_axes(root, &plot, frame)?;
        }
        draw_legend(&legend_area, &legend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_stay_within_the_width() {
        assert_eq!(
            (1..=16).map(columns).collect::<Vec<_>>(),
            [1, 2, 3, 2, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4]
        );
        let widest = 2 * SIDE + MAX_COLUMNS as u32 * PANEL_W;
        assert!(widest <= 2480, "{widest}");
    }
}
