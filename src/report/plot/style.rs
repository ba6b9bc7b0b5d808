//! Series styles. A chart with few series (up to `FEW`) gives each its own colour, the
//! marker saying the dtype and a dashed line the cuda device. Past that, colours would run
//! out or repeat, so three channels split the work: colour for the group readers compare
//! (the variant), and a (marker, dash pattern) pair for the rest of the series' identity
//! (dtype, causal, heads, ...), the same pair for the same rest in every colour. A sweep of
//! 5 variants x 8 settings needs 5 colours and 8 styles, not 40 colours. Distinct series get
//! distinct (colour, marker, dash) while any are left (16 x 5 x 4 = 320 combinations).

use std::collections::HashSet;

use plotters::style::RGBColor;

/// Series colours: Tableau 10 without its red (which marks budgets and oom), then darker
/// shades of the same hues.
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Marker {
    Circle,
    Triangle,
    Square,
    Diamond,
    TriangleDown,
    /// Not a series marker: oom cases and paired differences.
    Cross,
}

/// The markers series are told apart by, in order of use.
pub const SERIES_MARKERS: [Marker; 5] = [
    Marker::Circle,
    Marker::Triangle,
    Marker::Square,
    Marker::Diamond,
    Marker::TriangleDown,
];

/// How a series' line is stroked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dash {
    Solid,
    Dashed,
    Dotted,
    DashDot,
}

/// The dash patterns series are told apart by, in order of use.
pub const DASHES: [Dash; 4] = [Dash::Solid, Dash::Dashed, Dash::Dotted, Dash::DashDot];

impl Dash {
    /// Alternating on and off lengths in pixels (empty: solid).
    pub fn pattern(self) -> &'static [f32] {
        match self {
            Dash::Solid => &[],
            Dash::Dashed => &[10.0, 6.0],
            Dash::Dotted => &[2.0, 4.0],
            Dash::DashDot => &[12.0, 4.0, 2.0, 4.0],
        }
    }
}

/// Most series that each get a colour of their own: the distinct hues of the palette.
pub const FEW: usize = 9;

/// What a series' style is chosen from.
#[derive(Clone, Copy, Debug)]
pub struct Key<'a> {
    /// The group a colour stands for (the variant).
    pub group: &'a str,
    /// The rest of the series' identity (its label without the variant).
    pub rest: &'a str,
    pub dtype: &'a str,
    pub device: &'a str,
}

/// The marker of a dtype on charts with few series.
pub fn dtype_marker(dtype: &str) -> Marker {
    match dtype {
        "bf16" => Marker::Triangle,
        "f16" => Marker::Square,
        _ => Marker::Circle,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Style {
    pub color: RGBColor,
    pub marker: Marker,
    pub dash: Dash,
}

/// Position in first-seen order of each item.
fn first_seen<'a>(items: impl Iterator<Item = &'a str>) -> Vec<usize> {
    let mut seen: Vec<&str> = Vec::new();
    items
        .map(|k| match seen.iter().position(|s| *s == k) {
            Some(i) => i,
            None => {
                seen.push(k);
                seen.len() - 1
            }
        })
        .collect()
}

/// One style per series. Up to `FEW` series: a colour each, marker by dtype, dashed on cuda.
/// Past that: colour by group, (marker, dash) by the rest, or with one group colour by the
/// rest. Equal keys get equal styles; distinct keys distinct styles (up to 320 of them: a
/// clash moves on to the next free style of the same colour, then the next colour).
pub fn assign(keys: &[Key]) -> Vec<Style> {
    if keys.len() <= FEW {
        let order = first_seen(keys.iter().map(|k| k.rest));
        let groups = first_seen(keys.iter().map(|k| k.group));
        let mut seen: Vec<(usize, usize)> = Vec::new();
        return keys
            .iter()
            .zip(groups.iter().zip(&order))
            .map(|(k, (&g, &r))| {
                let i = seen.iter().position(|&p| p == (g, r)).unwrap_or_else(|| {
                    seen.push((g, r));
                    seen.len() - 1
                });
                Style {
                    color: PALETTE[i],
                    marker: dtype_marker(k.dtype),
                    dash: if k.device == "cuda" {
                        Dash::Dashed
                    } else {
                        Dash::Solid
                    },
                }
            })
            .collect();
    }
    assign_grouped(keys)
}

/// One style per series as `assign` gives past `FEW` series, however few there are: colour
/// by group (by the rest when there is one group), (marker, dash) by the rest. The panels of
/// a split chart use it, so that a variant has one colour in every panel.
pub fn assign_grouped(keys: &[Key]) -> Vec<Style> {
    let groups = first_seen(keys.iter().map(|k| k.group));
    let rests = first_seen(keys.iter().map(|k| k.rest));
    let single_group = groups.iter().all(|&g| g == 0);
    let (nc, ns) = (PALETTE.len(), SERIES_MARKERS.len() * DASHES.len());
    let total = nc * ns;
    let mut taken: HashSet<usize> = HashSet::new();
    let mut chosen: Vec<(usize, usize)> = Vec::new(); // (group, rest) already placed
    let mut slots: Vec<usize> = Vec::new();
    for (&g, &r) in groups.iter().zip(&rests) {
        if let Some(j) = chosen.iter().position(|&k| k == (g, r)) {
            slots.push(slots[j]);
            continue;
        }
        let (c, s) = if single_group {
            (r % nc, r / nc)
        } else {
            (g, r)
        };
        let want = (c % nc) * ns + s % ns;
        let slot = (0..total)
            .map(|k| (want + k) % total)
            .find(|q| !taken.contains(q))
            .unwrap_or(want);
        taken.insert(slot);
        chosen.push((g, r));
        slots.push(slot);
    }
    slots
        .into_iter()
        .map(|q| {
            let s = q % ns;
            Style {
                color: PALETTE[q / ns],
                marker: SERIES_MARKERS[s / DASHES.len()],
                dash: DASHES[s % DASHES.len()],
            }
        })
        .collect()
}

/// The pieces of a polyline (pixel coordinates) that `pattern` (on, off, on, ... lengths)
/// leaves drawn; the pattern runs on across vertices. An empty pattern keeps the whole line.
pub fn dash_segments(points: &[(f32, f32)], pattern: &[f32]) -> Vec<Vec<(f32, f32)>> {
    if pattern.is_empty() || pattern.iter().any(|l| *l <= 0.0) {
        return if points.len() > 1 {
            vec![points.to_vec()]
        } else {
            Vec::new()
        };
    }
    let mut out = Vec::new();
    let Some(&first) = points.first() else {
        return out;
    };
    let (mut phase, mut left) = (0usize, pattern[0]);
    let mut current = vec![first];
    for w in points.windows(2) {
        let (mut a, b) = (w[0], w[1]);
        loop {
            let d = (b.0 - a.0).hypot(b.1 - a.1);
            let on = phase % 2 == 0;
            if d < left {
                left -= d;
                if on {
                    current.push(b);
                }
                break;
            }
            let t = if d > 0.0 { left / d } else { 0.0 };
            a = (a.0 + (b.0 - a.0) * t, a.1 + (b.1 - a.1) * t);
            if on {
                current.push(a);
                out.push(std::mem::take(&mut current));
            } else {
                current = vec![a];
            }
            phase = (phase + 1) % pattern.len();
            left = pattern[phase];
        }
    }
    if phase % 2 == 0 && current.len() > 1 {
        out.push(current);
    }
    out.retain(|s| s.len() > 1);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Variants x dtypes x kv_heads x causal, the shape of results/quick.
    fn sweep(variants: &[&str], rests: &[String]) -> Vec<(String, String)> {
        variants
            .iter()
            .flat_map(|v| rests.iter().map(move |r| (v.to_string(), r.clone())))
            .collect()
    }

    fn styles(keys: &[(String, String)]) -> Vec<Style> {
        let refs: Vec<Key> = keys
            .iter()
            .map(|(a, b)| Key {
                group: a,
                rest: b,
                dtype: if b.contains("bf16") { "bf16" } else { "f32" },
                device: "cpu",
            })
            .collect();
        assign(&refs)
    }

    fn distinct(styles: &[Style]) -> usize {
        styles
            .iter()
            .map(|s| (s.color, s.marker, s.dash))
            .collect::<HashSet<_>>()
            .len()
    }

    #[test]
    fn colour_by_variant_style_by_the_rest() {
        let variants = [
            "naive",
            "naive-unsafe",
            "rabe-staats",
            "rabe-staats-seq",
            "flash",
        ];
        let mut rests = Vec::new();
        for dtype in ["f32", "bf16"] {
            for causal in ["non-causal", "causal"] {
                for kv in ["kv_heads=4", "kv_heads=1"] {
                    rests.push(format!("{dtype} · {kv} · {causal}"));
                }
            }
        }
        let keys = sweep(&variants, &rests);
        let st = styles(&keys);
        assert_eq!(st.len(), 40);
        assert_eq!(distinct(&st), 40, "every series is told apart");
        let colours: HashSet<_> = st.iter().map(|s| s.color).collect();
        assert_eq!(colours.len(), 5, "one colour per variant");
        for (i, a) in keys.iter().enumerate() {
            for (j, b) in keys.iter().enumerate() {
                if a.0 == b.0 {
                    assert_eq!(st[i].color, st[j].color);
                }
                if a.1 == b.1 {
                    assert_eq!((st[i].marker, st[i].dash), (st[j].marker, st[j].dash));
                }
            }
        }
        // Nested sweeps read systematically: the outer column (dtype) is the marker.
        assert!(st[..4].iter().all(|s| s.marker == Marker::Circle));
        assert!(st[4..8].iter().all(|s| s.marker == Marker::Triangle));
        assert_eq!(st[0].dash, Dash::Solid);
        assert_eq!(st[1].dash, Dash::Dashed);
    }

    #[test]
    fn few_series_keep_a_colour_each() {
        let key = |group, rest, dtype, device| Key {
            group,
            rest,
            dtype,
            device,
        };
        let st = assign(&[
            key("naive", "normal", "f32", "cpu"),
            key("naive", "uniform", "bf16", "cpu"),
            key("rabe-staats", "normal", "f32", "cuda"),
        ]);
        assert_eq!(
            st.iter().map(|s| s.color).collect::<Vec<_>>(),
            PALETTE[..3].to_vec()
        );
        assert_eq!(
            st.iter().map(|s| (s.marker, s.dash)).collect::<Vec<_>>(),
            [
                (Marker::Circle, Dash::Solid),
                (Marker::Triangle, Dash::Solid),
                (Marker::Circle, Dash::Dashed),
            ]
        );
    }

    #[test]
    fn one_group_past_few_colours_by_the_rest() {
        let many: Vec<String> = (0..40).map(|i| format!("p={i}")).collect();
        let st = styles(&sweep(&["ring"], &many));
        assert_eq!(distinct(&st), 40);
        // A colour each while the palette lasts, then the styles change.
        assert_eq!(
            st[..16].iter().map(|s| s.color).collect::<Vec<_>>(),
            PALETTE.to_vec()
        );
        assert!(st[..16]
            .iter()
            .all(|s| (s.marker, s.dash) == (Marker::Circle, Dash::Solid)));
        assert_eq!(st[16].color, PALETTE[0]);
        assert_ne!(st[16], st[0]);
    }

    #[test]
    fn clashes_move_on_to_free_styles() {
        // 20 variants wrap the 16 colours; 30 settings wrap the 20 styles.
        let variants: Vec<String> = (0..20).map(|i| format!("v{i}")).collect();
        let variants: Vec<&str> = variants.iter().map(String::as_str).collect();
        let rests: Vec<String> = (0..3).map(|i| format!("r{i}")).collect();
        assert_eq!(distinct(&styles(&sweep(&variants, &rests))), 60);
        let rests: Vec<String> = (0..30).map(|i| format!("r{i}")).collect();
        assert_eq!(distinct(&styles(&sweep(&variants[..3], &rests))), 90);
        // The same key twice is one series: the same style.
        let keys = vec![("a".to_string(), "x".to_string()); 2];
        let st = styles(&keys);
        assert_eq!(st[0], st[1]);
    }

    #[test]
    fn dashes_run_across_vertices() {
        let round = |segs: Vec<Vec<(f32, f32)>>| -> Vec<Vec<(f32, f32)>> {
            segs.into_iter()
                .map(|s| s.into_iter().map(|(x, y)| (x.round(), y.round())).collect())
                .collect()
        };
        let line = [(0.0, 0.0), (20.0, 0.0)];
        assert_eq!(
            round(dash_segments(&line, &[5.0, 3.0])),
            vec![
                vec![(0.0, 0.0), (5.0, 0.0)],
                vec![(8.0, 0.0), (13.0, 0.0)],
                vec![(16.0, 0.0), (20.0, 0.0)],
            ]
        );
        // A corner inside a dash keeps the dash whole, through the vertex.
        let corner = [(0.0, 0.0), (3.0, 0.0), (3.0, 10.0)];
        assert_eq!(
            round(dash_segments(&corner, &[5.0, 3.0]))[0],
            vec![(0.0, 0.0), (3.0, 0.0), (3.0, 2.0)]
        );
        assert_eq!(dash_segments(&line, &[]), vec![line.to_vec()]);
        let patterns: HashSet<_> = DASHES
            .iter()
            .map(|d| format!("{:?}", d.pattern()))
            .collect();
        assert_eq!(patterns.len(), DASHES.len());
    }
}
