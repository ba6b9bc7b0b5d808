//! Plot axes: a scale (linear, log2, log10) applied to the data before plotting, the padded
//! range and tick positions in plot space, and tick labels with units ("2¹⁴", "16 MiB",
//! "10 ms", "1e-7"). Plotters draws exactly these ticks through `TickRange`.

use std::ops::Range;

use crate::units;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    Linear,
    Log2,
    Log10,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Sequence lengths: powers of two.
    Tokens,
    Bytes,
    Seconds,
    /// A plain number (errors, GFLOP/s).
    Number,
    /// Categories: tick i + 0.5 is the i-th label (heatmaps).
    Category,
}

#[derive(Clone, Debug)]
pub struct AxisSpec {
    pub label: String,
    pub scale: Scale,
    pub unit: Unit,
}

impl AxisSpec {
    pub fn new(label: impl Into<String>, scale: Scale, unit: Unit) -> AxisSpec {
        AxisSpec {
            label: label.into(),
            scale,
            unit,
        }
    }

    /// Data value -> plot coordinate (None for values a log scale cannot show).
    pub fn to_plot(&self, v: f64) -> Option<f64> {
        match self.scale {
            Scale::Linear => v.is_finite().then_some(v),
            Scale::Log2 => (v > 0.0 && v.is_finite()).then(|| v.log2()),
            Scale::Log10 => (v > 0.0 && v.is_finite()).then(|| v.log10()),
        }
    }

    /// The tick label of plot coordinate `t`.
    pub fn label(&self, t: f64) -> String {
        let e = t.round() as i32;
        match (self.scale, self.unit) {
            (Scale::Log2, Unit::Tokens) => format!("2{}", superscript(e)),
            (Scale::Log2, Unit::Bytes) => units::pow2_bytes(e),
            (Scale::Log10, Unit::Seconds) => units::decade_seconds(e),
            (Scale::Log10, _) => {
                if (0..=3).contains(&e) {
                    format!("{}", 10f64.powi(e))
                } else {
                    format!("1e{e}")
                }
            }
            (Scale::Log2, _) => format!("2{}", superscript(e)),
            (Scale::Linear, _) => trim_number(t),
        }
    }
}

fn superscript(e: i32) -> String {
    const DIGITS: [char; 10] = ['⁰', '¹', '²', '³', '⁴', '⁵', '⁶', '⁷', '⁸', '⁹'];
    let mut s = String::new();
    if e < 0 {
        s.push('⁻');
    }
    for c in e.unsigned_abs().to_string().chars() {
        s.push(DIGITS[c.to_digit(10).unwrap_or(0) as usize]);
    }
    s
}

fn trim_number(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.to_string()
    }
}

/// A range in plot space with the tick positions plotters should draw.
#[derive(Clone, Debug, PartialEq)]
pub struct TickRange {
    pub lo: f64,
    pub hi: f64,
    /// Labelled ticks with grid lines.
    pub major: Vec<f64>,
    /// Light grid lines between them.
    pub minor: Vec<f64>,
}

impl TickRange {
    /// Ticks for data in plot coordinates `[min, max]`.
    pub fn for_data(spec: &AxisSpec, min: f64, max: f64, from_zero: bool) -> TickRange {
        match spec.scale {
            Scale::Linear => linear(if from_zero { min.min(0.0) } else { min }, max),
            Scale::Log2 | Scale::Log10 => {
                let steps: &[i32] = match (spec.scale, spec.unit) {
                    (Scale::Log2, Unit::Bytes) => &[1, 2, 5, 10],
                    (Scale::Log2, _) => &[1, 2, 4, 5, 10],
                    _ => &[1, 2, 3, 5],
                };
                let max_ticks = if spec.scale == Scale::Log2 { 11 } else { 9 };
                logarithmic(spec.scale, min, max, steps, max_ticks)
            }
        }
    }

    /// Categories 0..n: tick i + 0.5 for category i.
    pub fn categories(n: usize) -> TickRange {
        TickRange {
            lo: 0.0,
            hi: n.max(1) as f64,
            major: (0..n).map(|i| i as f64 + 0.5).collect(),
            minor: Vec::new(),
        }
    }
}

fn logarithmic(scale: Scale, min: f64, max: f64, steps: &[i32], max_ticks: i32) -> TickRange {
    let (mut lo, mut hi) = (min.floor() as i32, max.ceil() as i32);
    if lo == hi {
        lo -= 1;
        hi += 1;
    }
    let step = steps
        .iter()
        .copied()
        .find(|s| (hi - lo) / s < max_ticks)
        .unwrap_or_else(|| ((hi - lo) / max_ticks).max(1) + 1);
    let lo = lo.div_euclid(step) * step;
    let hi = (hi + step - 1).div_euclid(step) * step;
    let major: Vec<f64> = (lo..=hi).step_by(step as usize).map(f64::from).collect();
    let minor: Vec<f64> = match (scale, step) {
        (Scale::Log10, 1) => (lo..hi)
            .flat_map(|e| (2..10).map(move |k| f64::from(e) + (k as f64).log10()))
            .collect(),
        _ => (lo..=hi).filter(|e| e % step != 0).map(f64::from).collect(),
    };
    // Half a step of padding (at most one decade/octave) keeps markers off the frame.
    let pad = 0.25 * f64::from(step.min(2));
    TickRange {
        lo: f64::from(lo).min(min - pad),
        hi: f64::from(hi).max(max + pad),
        major,
        minor,
    }
}

fn linear(min: f64, max: f64) -> TickRange {
    let (min, max) = if max > min {
        (min, max)
    } else {
        (min - 1.0, min + 1.0)
    };
    let raw = (max - min) / 6.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| (max - min) / s <= 7.0)
        .unwrap_or(10.0 * mag);
    let lo = (min / step).floor() * step;
    let hi = (max * 1.04 / step).ceil() * step;
    let n = ((hi - lo) / step).round() as usize;
    TickRange {
        lo,
        hi,
        major: (0..=n).map(|i| lo + i as f64 * step).collect(),
        minor: (0..n).map(|i| lo + (i as f64 + 0.5) * step).collect(),
    }
}

impl Ranged for TickRange {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let f = (v - self.lo) / (self.hi - self.lo);
        limit.0 + (f * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.minor.clone()
        } else {
            self.major.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.lo..self.hi
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_carry_units() {
        let tokens = AxisSpec::new("n", Scale::Log2, Unit::Tokens);
        assert_eq!(tokens.label(14.0), "2¹⁴");
        let b = AxisSpec::new("b", Scale::Log2, Unit::Bytes);
        assert_eq!(
            [10.0, 25.0, 33.0].map(|e| b.label(e)),
            ["1 KiB", "32 MiB", "8 GiB"]
        );
        let s = AxisSpec::new("s", Scale::Log10, Unit::Seconds);
        assert_eq!(
            [-4.0, -3.0, 0.0, 2.0].map(|e| s.label(e)),
            ["100 µs", "1 ms", "1 s", "100 s"]
        );
        let e = AxisSpec::new("e", Scale::Log10, Unit::Number);
        assert_eq!([-7.0, 0.0].map(|t| e.label(t)), ["1e-7", "1"]);
        let g = AxisSpec::new("g", Scale::Linear, Unit::Number);
        assert_eq!([25.0, 2.5].map(|t| g.label(t)), ["25", "2.5"]);
    }

    #[test]
    fn ticks_cover_the_data_with_few_labels() {
        let tokens = AxisSpec::new("n", Scale::Log2, Unit::Tokens);
        let t = TickRange::for_data(&tokens, 8.0, 20.0, false);
        assert!(t.lo < 8.0 && t.hi > 20.0);
        assert_eq!(t.major.len(), 7, "{t:?}");
        let b = AxisSpec::new("b", Scale::Log2, Unit::Bytes);
        let t = TickRange::for_data(&b, 18.0, 42.0, false);
        assert!(
            t.major.len() <= 10 && t.major.iter().all(|m| m % 5.0 == 0.0),
            "{t:?}"
        );
        let g = AxisSpec::new("g", Scale::Linear, Unit::Number);
        let t = TickRange::for_data(&g, 20.0, 103.0, true);
        assert_eq!(t.lo, 0.0);
        assert!(t.hi >= 103.0 && t.major.len() <= 8, "{t:?}");
    }
}
