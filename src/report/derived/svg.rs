//! A small self-contained SVG line chart (log-scale axes, one polyline per series), so the
//! Ring-vs-Tree curves exist as a picture before the report layer draws its own. O(points).

/// One line of the chart.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub dashed: bool,
    /// Index into the palette.
    pub color: usize,
}

const PALETTE: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// A chart with log2 x and log10 y axes.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let (w, h, left, right, top, bottom) = (760.0, 480.0, 70.0, 210.0, 40.0, 50.0);
    let pts = series
        .iter()
        .flat_map(|s| s.points.iter())
        .filter(|p| p.0 > 0.0 && p.1 > 0.0);
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(x.log2());
        x1 = x1.max(x.log2());
        y0 = y0.min(y.log10());
        y1 = y1.max(y.log10());
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    let (y0, y1) = (y0.floor(), y1.ceil().max(y0.floor() + 1.0));
    let x1 = if x1 > x0 { x1 } else { x0 + 1.0 };
    let pw = w - left - right;
    let ph = h - top - bottom;
    let px = |x: f64| left + (x.log2() - x0) / (x1 - x0) * pw;
    let py = |y: f64| top + ph - (y.log10() - y0) / (y1 - y0) * ph;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" font-size=\"15\">{}</text>\n",
        left,
        escape(title)
    );
    s += &format!(
        "<rect x=\"{left}\" y=\"{top}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#444\"/>\n"
    );
    for e in (y0 as i64)..=(y1 as i64) {
        let y = py(10f64.powi(e as i32));
        s += &format!(
            "<line x1=\"{left}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">1e{e}</text>\n",
            left + pw,
            left - 6.0,
            y + 4.0
        );
    }
    let mut xs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    for x in xs {
        let xp = px(x);
        s += &format!(
            "<line x1=\"{xp:.1}\" x2=\"{xp:.1}\" y1=\"{top}\" y2=\"{}\" stroke=\"#eee\"/><text x=\"{xp:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
            top + ph,
            top + ph + 16.0,
            crate::model::markdown::tokens(x as usize)
        );
    }
    s += &format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n<text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">{}</text>\n",
        left + pw / 2.0,
        h - 10.0,
        escape(x_label),
        top + ph / 2.0,
        top + ph / 2.0,
        escape(y_label)
    );
    for (i, se) in series.iter().enumerate() {
        let color = PALETTE[se.color % PALETTE.len()];
        let dash = if se.dashed {
            " stroke-dasharray=\"6 4\""
        } else {
            ""
        };
        let path: Vec<String> = se
            .points
            .iter()
            .filter(|p| p.0 > 0.0 && p.1 > 0.0)
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        s += &format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"{dash} points=\"{}\"/>\n",
            path.join(" ")
        );
        let ly = top + 10.0 + i as f64 * 18.0;
        s += &format!(
            "<line x1=\"{}\" x2=\"{}\" y1=\"{ly}\" y2=\"{ly}\" stroke=\"{color}\" stroke-width=\"2\"{dash}/><text x=\"{}\" y=\"{}\">{}</text>\n",
            left + pw + 12.0,
            left + pw + 40.0,
            left + pw + 46.0,
            ly + 4.0,
            escape(&se.name)
        );
    }
    s + "</svg>\n"
}

fn escape(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_every_series() {
        let svg = line_chart(
            "t",
            "N",
            "rel",
            &[
                Series {
                    name: "ring".into(),
                    points: vec![(80e3, 1.0), (160e3, 2.0)],
                    dashed: false,
                    color: 0,
                },
                Series {
                    name: "tree".into(),
                    points: vec![(80e3, 0.1), (160e3, 0.1)],
                    dashed: true,
                    color: 1,
                },
            ],
        );
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    }
}
