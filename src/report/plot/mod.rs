//! Plots with plotters, as PNG and SVG: line charts (`chart`), grids of them on shared axes
//! (`grid`) and chunk-sweep heatmaps (`heatmap`) on axes with unit-carrying ticks (`axis`). Text is rendered from DejaVu Sans
//! embedded in the binary (assets/fonts, Bitstream Vera licence), registered with plotters'
//! ab_glyph backend: no system font, no fontconfig.

pub mod axis;
pub mod chart;
pub mod grid;
pub mod heatmap;
pub mod style;

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;

use crate::error::{Error, Result};

/// The family name the embedded font is registered under.
pub const FONT: &str = "sans-serif";
/// Image size in pixels (PNG; the SVG has the same user units); a chart whose legend goes
/// under the plot is taller.
pub const WIDTH: u32 = 1400;
pub const HEIGHT: u32 = 820;

static DEJAVU_SANS: &[u8] = include_bytes!("../../../assets/fonts/DejaVuSans.ttf");

/// Output formats of `attnbench report --format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Png,
    Svg,
}

impl Format {
    pub fn ext(self) -> &'static str {
        match self {
            Format::Png => "png",
            Format::Svg => "svg",
        }
    }
}

/// A figure of either kind.
pub enum Plot {
    Chart(chart::Figure),
    Grid(grid::Grid),
    Heatmap(heatmap::Heatmap),
}

impl Plot {
    /// Canvas size in pixels.
    pub fn size(&self) -> (u32, u32) {
        match self {
            Plot::Chart(f) => f.size(),
            Plot::Grid(g) => g.size(),
            Plot::Heatmap(_) => (WIDTH, HEIGHT),
        }
    }

    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, plotters::coord::Shift>,
    ) -> Result<(), String> {
        match self {
            Plot::Chart(f) => f.draw(root),
            Plot::Grid(g) => g.draw(root),
            Plot::Heatmap(h) => h.draw(root),
        }
    }
}

pub(crate) fn register_font() -> Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, DEJAVU_SANS).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(Error::Runtime(
            "the embedded font (DejaVu Sans) could not be loaded".into(),
        ))
    }
}

/// Writes `plot` as `dir/stem.EXT` in every format; returns the file names written. Each
/// file is drawn beside its name and renamed into place once whole, so a full disk leaves
/// the previous file (or none), never a truncated one.
pub fn save(plot: &Plot, dir: &Path, stem: &str, formats: &[Format]) -> Result<Vec<String>> {
    register_font()?;
    let mut names = Vec::new();
    let size = plot.size();
    for &f in formats {
        let name = format!("{stem}.{}", f.ext());
        let path = dir.join(&name);
        // The extension last: the PNG backend picks its encoder by it.
        let tmp = dir.join(format!(".{stem}.{}.tmp.{}", std::process::id(), f.ext()));
        let fail = |e: String| Error::Runtime(format!("drawing {}: {e}", path.display()));
        let drawn = match f {
            Format::Png => {
                let root = BitMapBackend::new(&tmp, size).into_drawing_area();
                plot.draw(&root)
                    .and_then(|()| root.present().map_err(|e| e.to_string()))
            }
            Format::Svg => {
                let root = SVGBackend::new(&tmp, size).into_drawing_area();
                plot.draw(&root)
                    .and_then(|()| root.present().map_err(|e| e.to_string()))
            }
        };
        let placed = drawn.map_err(fail).and_then(|()| {
            std::fs::rename(&tmp, &path)
                .map_err(|e| Error::io(format!("cannot write {}", path.display()), e))
        });
        if let Err(e) = placed {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        names.push(name);
    }
    Ok(names)
}
