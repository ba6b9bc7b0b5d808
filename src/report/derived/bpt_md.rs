//! `bpt.md` beside a sweep's CSV when it has transformer-layer rows: BPT's Tables 2-4 in
//! their layouts (largest context under the budget, peak activation memory against
//! context, tokens per second and speed-up over vanilla), the Sec. 3.1 prediction beside the
//! measured memory, the paper's figures as trend data, and the acceptance checks.
//! Per (variant, context) the best cell over the block-size grid is shown, as the paper
//! reports the best over its grid. O(rows).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::bpt_budget::{self, Sweep};
use super::tree_vs_ring::write_file;
use crate::error::Result;
use crate::model::bpt_memory::{
    layer_activation, paper_max_context, paper_total, rule_share, Design, GptShape, RULE_MODEL,
};
use crate::model::markdown::table;
use crate::report::checks::{Check, Verdict};
use crate::report::series::distinct;
use crate::results::record::Record;

pub const MARKDOWN: &str = "bpt.md";

const VARIANTS: [(&str, Design); 3] = [
    ("layer-vanilla", Design::Vanilla),
    ("layer-memeff", Design::MemEff),
    ("layer-bpt", Design::Bpt),
];

/// The paper's Table 3, 3B model on one A100 (GB), and Table 4 speed-ups over vanilla.
const PAPER_TABLE3_3B: [(usize, &str, &str, &str); 5] = [
    (8192, "64", "44", "43"),
    (16384, "oom", "47", "45"),
    (32768, "oom", "55", "52"),
    (65536, "oom", "75", "70"),
    (131072, "oom", "oom", "79"),
];
const PAPER_TABLE4: [(usize, &str, &str, &str); 6] = [
    (2048, "1x", "1.14x", "1.04x"),
    (4096, "1x", "1.1x", "1.15x"),
    (8192, "1x", "1.13x", "1.17x"),
    (16384, "1x", "1.11x", "1.2x"),
    (32768, "oom", "1x", "1.1x"),
    (65536, "oom", "oom", "1x"),
];

fn mib(b: f64) -> String {
    format!("{:.1} MiB", b / (1u64 << 20) as f64)
}

/// The best (lowest-memory, fastest) ok rows of one variant, mode and shape per context.
struct Cells<'a> {
    /// context -> (lowest activation bytes, its row)
    memory: BTreeMap<usize, (u64, &'a Record)>,
    /// context -> highest tokens/s
    speed: BTreeMap<usize, f64>,
    /// contexts with an oom row and no ok row
    oom: Vec<usize>,
}

fn cells<'a>(rows: &[&'a Record], variant: &str) -> Cells<'a> {
    let mut c = Cells {
        memory: BTreeMap::new(),
        speed: BTreeMap::new(),
        oom: Vec::new(),
    };
    for r in rows.iter().filter(|r| r.variant == variant) {
        let s = r.seq_q;
        match r.status.name() {
            "ok" => {
                if let Some(m) = r.mem_overhead_bytes {
                    let e = c.memory.entry(s).or_insert((m, r));
                    if m < e.0 {
                        *e = (m, r);
                    }
                }
                if let Some(t) = r.time_median_s.filter(|t| *t > 0.0) {
                    let tps = (r.batch * s) as f64 / t;
                    let e = c.speed.entry(s).or_insert(tps);
                    *e = e.max(tps);
                }
            }
            "oom" => c.oom.push(s),
            _ => {}
        }
    }
    c.oom.retain(|s| !c.memory.contains_key(s));
    c
}

/// Writes `bpt.md` if `records` hold layer rows; `model_layers` and `budget` as the
/// config has them.
pub fn write(
    dir: &Path,
    records: &[Record],
    model_layers: Option<usize>,
    budget: Option<u64>,
) -> Result<Option<PathBuf>> {
    match render(records, model_layers, budget) {
        Some(r) => {
            for (name, text) in &r.files {
                write_file(dir, name, text)?;
            }
            write_file(dir, MARKDOWN, &r.text).map(Some)
        }
        None => Ok(None),
    }
}

/// What `render` makes: `bpt.md`'s text, its checks, and the files beside it (the budget
/// sweep's CSV and SVG).
struct Rendered {
    text: String,
    checks: Vec<Check>,
    files: Vec<(&'static str, String)>,
}

/// The checks of `bpt.md` (the paper's claims this run can judge), and its figures beside
/// the paper's Table 4 speed-ups as a trend; empty without layer rows.
pub fn checks(records: &[Record], model_layers: Option<usize>, budget: Option<u64>) -> Vec<Check> {
    render(records, model_layers, budget).map_or_else(Vec::new, |r| r.checks)
}

/// `bpt.md`'s text, its checks and the files beside it, or None without layer rows.
fn render(
    records: &[Record],
    model_layers: Option<usize>,
    budget: Option<u64>,
) -> Option<Rendered> {
    let rows: Vec<&Record> = records
        .iter()
        .filter(|r| r.mode == "layer-train" || r.mode == "layer-fwd")
        .collect();
    if rows.is_empty() {
        return None;
    }
    let mut s =
        String::from("# Blockwise Parallel Transformer: one GPT layer in three designs\n\n");
    s += "Written by `attnbench sweep` and `attnbench report` (module \
          `src/report/derived/bpt_md.rs`) from `runs.csv`. \
          Memory is the counting allocator's peak during one call minus what was live before \
          it (x, out, parameters, and for training dout, dx and the parameter gradient): the \
          layer's activation memory, f32. Per context the best cell over the config's block \
          grid is shown (the paper reports the best over its grid). `Sec. 3.1` is the \
          paper's per-layer formula for the same b, s, h, a and block c, at 4 bytes per \
          value (the paper's fp32 GPU runs); our implementation keeps more than the formula \
          counts (K, V and their gradients for every token in BPT, full-sequence Q, LN and \
          FFN activations in memory-efficient), so compare the growth, not the bytes. The \
          paper's figures are from A100s and TPUs with 1B-70B models: trend comparisons only.\n\n";
    let modes: Vec<&str> = ["layer-train", "layer-fwd"]
        .into_iter()
        .filter(|m| rows.iter().any(|r| r.mode == *m))
        .collect();
    let mut checks: Vec<Check> = Vec::new();
    let mut files = Vec::new();
    for mode in modes {
        let mode_rows: Vec<&Record> = rows.iter().copied().filter(|r| r.mode == mode).collect();
        let first = mode_rows[0];
        let (b, a, d) = (first.batch, first.heads, first.head_dim);
        let h = a * d;
        s += &format!(
            "## `{mode}`, batch {b}, hidden {h} ({a} heads of {d}), {} threads\n\n",
            first.threads
        );
        let per: Vec<(&str, Design, Cells)> = VARIANTS
            .iter()
            .map(|(v, dsg)| (*v, *dsg, cells(&mode_rows, v)))
            .collect();
        let contexts = distinct(mode_rows.iter().map(|r| r.seq_q));
        // Table 2: the largest context that ran.
        s += "### Largest context that fits (Table 2's layout)\n\n";
        let sweep = model_layers.and_then(|l| Some((l, Sweep::new(&mode_rows, l)?)));
        let under_rule = matches!((&sweep, budget), (Some((_, w)), Some(b)) if w.rule == b);
        if let Some(b) = budget {
            s += &match (model_layers, &sweep) {
                (Some(l), Some((_, w))) => format!(
                    "Memory budget {} for a {l}-layer model: 16 bytes per parameter per layer \
                     (weights, gradients, two Adam moments) and the other layers' checkpointed \
                     inputs count against it. {}\n\n",
                    mib(b as f64),
                    if under_rule {
                        format!(
                            "It is the budget rule's: the model's training state is {:.2} of it, \
                             the share of an 80 GB A100 the paper's 3B model takes (2.7e9 x 16 B \
                             = 43.2 GB, Table 3's floor at 8K).",
                            rule_share()
                        )
                    } else {
                        format!(
                            "The budget rule (training state {:.2} of the budget, the paper's 3B \
                             share of an A100) would give {}.",
                            rule_share(),
                            mib(w.rule as f64)
                        )
                    }
                ),
                _ => format!("Memory budget {}.\n\n", mib(b as f64)),
            };
        }
        let max_ctx: Vec<Option<usize>> = per
            .iter()
            .map(|(_, _, c)| c.memory.keys().max().copied())
            .collect();
        // A design's largest context is bounded by the budget only if a longer one was `oom`;
        // otherwise it is the config's longest context, a lower bound (shown with >=).
        let bounded: Vec<bool> = per
            .iter()
            .zip(&max_ctx)
            .map(|((_, _, c), m)| m.is_some_and(|m| c.oom.iter().any(|o| *o > m)))
            .collect();
        let show = |i: usize| match max_ctx[i] {
            Some(m) if bounded[i] => m.to_string(),
            Some(m) => format!(">= {m}"),
            None => "none".to_string(),
        };
        let mut ours = vec![vec![
            if under_rule {
                "this CPU, rule (3B share), measured".into()
            } else {
                "this CPU".into()
            },
            show(0),
            show(1),
            show(2),
            match (max_ctx[1], max_ctx[2]) {
                (Some(m), Some(p)) if bounded[1] => format!(
                    "{}{:.1}x",
                    if bounded[2] { "" } else { ">= " },
                    p as f64 / m as f64
                ),
                _ => "-".into(),
            },
        ]];
        if let (true, Some((_, w))) = (under_rule, &sweep) {
            let p = w.at_one_b();
            let cell = |c: Option<usize>| match c {
                Some(c) if c == w.longest => format!(">= {c}"),
                Some(c) => c.to_string(),
                None => "none".into(),
            };
            ours.push(vec![
                "this CPU, 1B share, predicted".into(),
                cell(p.largest[0]),
                cell(p.largest[1]),
                cell(p.largest[2]),
                p.ratio().map_or("-".into(), |r| format!("{r:.1}x")),
            ]);
        }
        s += &table(
            &[
                "",
                "vanilla",
                "memory-efficient",
                "BPT",
                "BPT / memory-efficient",
            ],
            &[
                ours,
                vec![
                    vec![
                        "paper, 1B on 1 A100".into(),
                        "16K".into(),
                        "65K".into(),
                        "131K".into(),
                        "2.0x".into(),
                    ],
                    vec![
                        "paper, 3B on 1 A100".into(),
                        "8K".into(),
                        "16K".into(),
                        "65K".into(),
                        "4.0x".into(),
                    ],
                ],
            ]
            .concat(),
        );
        s += "\n";
        if let (Some(m), Some(p), Some(_), true) = (max_ctx[1], max_ctx[2], budget, bounded[1]) {
            checks.push(
                Check::new(
                    format!("{mode}: BPT's largest context is at least 2x memory-efficient's"),
                    "2x to 4x memory-efficient's (Table 2, one A100; abstract: up to 4x)",
                )
                .judged(format!("{p} vs {m}"), p >= 2 * m),
            );
        }
        if let Some((l, w)) = &sweep {
            s += &w.markdown();
            checks.extend(w.checks(mode, &mode_rows, *l, budget));
            files.push((bpt_budget::CSV, w.csv()));
            files.push((bpt_budget::PLOT, w.svg()));
        }
        // Table 3: activation memory against context.
        s += "### Activation memory against context (Table 3's layout)\n\n";
        let mut mem_rows = Vec::new();
        for &ctx in &contexts {
            let mut row = vec![ctx.to_string()];
            for (_, dsg, c) in &per {
                row.push(match c.memory.get(&ctx) {
                    Some((m, r)) => {
                        let block = r.q_chunk.unwrap_or(ctx) as f64;
                        let paper = layer_activation(
                            *dsg, b as f64, ctx as f64, h as f64, a as f64, block, 2.0,
                        );
                        format!("{} (Sec. 3.1: {})", mib(*m as f64), mib(paper.per_layer()))
                    }
                    None if c.oom.contains(&ctx) => "oom".into(),
                    None => "-".into(),
                });
            }
            mem_rows.push(row);
        }
        s += &table(
            &["context", "vanilla", "memory-efficient", "BPT"],
            &mem_rows,
        );
        s += &paper_table3();
        // Checks on memory: BPT below memory-efficient, linear vs quadratic growth.
        let common = per[1]
            .2
            .memory
            .keys()
            .filter(|k| per[2].2.memory.contains_key(k))
            .max()
            .copied();
        if let Some(ctx) = common {
            let (m, p) = (
                per[1].2.memory[&ctx].0 as f64,
                per[2].2.memory[&ctx].0 as f64,
            );
            checks.push(
                Check::new(
                    format!("{mode}: at the largest common context {ctx}, BPT's activation memory is at least 2x below memory-efficient's"),
                    "Sec. 3.1: 2bsh against memory-efficient's 8bsh FFN and attention activations",
                )
                .judged(format!("{} vs {}, {:.1}x", mib(p), mib(m), m / p), m >= 2.0 * p),
            );
        }
        let growth: [Growth; 2] = [
            (2, "linearly", "Sec. 3.1: 2bsh, linear in s", |g| g < 1.2),
            (
                0,
                "quadratically",
                "Sec. 3.1: 5bs²a, quadratic in s",
                |g| g > 1.5,
            ),
        ];
        for (i, want, paper, holds) in growth {
            let pts: Vec<(f64, f64)> = per[i]
                .2
                .memory
                .iter()
                .map(|(k, (m, _))| (*k as f64, *m as f64))
                .collect();
            if let Some(g) = growth_exponent(&pts) {
                checks.push(
                    Check::new(
                        format!("{mode}: {} memory grows {want} with context", per[i].0),
                        paper,
                    )
                    .judged(
                        format!("log-log slope of the increments over the last doublings: {g:.2}"),
                        holds(g),
                    ),
                );
            }
        }
        // Table 4: throughput.
        s += "### Tokens per second against context (Table 4's layout)\n\n";
        let mut t_rows = Vec::new();
        for &ctx in &contexts {
            let base = per[0].2.speed.get(&ctx).copied();
            let mut row = vec![ctx.to_string()];
            for (_, _, c) in &per {
                row.push(match (c.speed.get(&ctx), base) {
                    (Some(t), Some(bv)) => format!("{t:.0} ({:.2}x)", t / bv),
                    (Some(t), None) => format!("{t:.0}"),
                    (None, _) if c.oom.contains(&ctx) => "oom".into(),
                    _ => "-".into(),
                });
            }
            t_rows.push(row);
        }
        s += &table(&["context", "vanilla", "memory-efficient", "BPT"], &t_rows);
        let speedups: Vec<String> = contexts
            .iter()
            .filter_map(|ctx| {
                let (v, p) = (per[0].2.speed.get(ctx)?, per[2].2.speed.get(ctx)?);
                Some(format!("{:.2}x at {ctx}", p / v))
            })
            .collect();
        if !speedups.is_empty() {
            checks.push(
                Check::new(
                    format!("{mode}: BPT's speed-up over vanilla (tokens per second)"),
                    "1.04x to 1.2x from 2K to 16K (Table 4, GPT 1B on 8 A100s)",
                )
                .trend(speedups.join(", ")),
            );
        }
        s += "\nThe paper's Table 4 (GPT 1B, 8 A100s), speed-up over vanilla:\n\n";
        s += &table(
            &["context", "vanilla", "memory-efficient", "BPT"],
            &PAPER_TABLE4
                .iter()
                .map(|(c, v, m, p)| {
                    vec![c.to_string(), v.to_string(), m.to_string(), p.to_string()]
                })
                .collect::<Vec<_>>(),
        );
        s += "\n";
    }
    let shown: Vec<&Check> = checks
        .iter()
        .filter(|c| c.verdict != Verdict::Trend)
        .collect();
    if !shown.is_empty() {
        s += "## Checks\n\n";
        for c in shown {
            s += &format!("- {}: {} ({})\n", c.verdict, c.name, c.ours);
        }
    }
    Some(Rendered {
        text: s,
        checks,
        files,
    })
}

/// The paper's Table 3 (3B on one A100) with the Sec. 3.1 whole-model estimate
/// (`attnbench model bpt-memory`) beside each cell, and the contradiction with its Table 2.
fn paper_table3() -> String {
    let m = GptShape::by_name(RULE_MODEL).expect("a Table 1 row");
    let gib = |b: f64| b / (1u64 << 30) as f64;
    let device = 80.0 * (1u64 << 30) as f64;
    let rows: Vec<Vec<String>> = PAPER_TABLE3_3B
        .iter()
        .map(|(c, v, me, p)| {
            let mut row = vec![c.to_string()];
            for (paper, (_, d)) in [v, me, p].iter().zip(VARIANTS) {
                let model = paper_total(&m, d, *c);
                row.push(format!(
                    "{paper} (model: {:.1}{})",
                    gib(model),
                    if model > device { ", oom" } else { "" }
                ));
            }
            row
        })
        .collect();
    let largest: Vec<String> = VARIANTS
        .iter()
        .map(|(_, d)| paper_max_context(&m, *d, device).map_or("none".into(), |c| c.to_string()))
        .collect();
    let mut s = String::from(
        "\nThe paper's Table 3, 3B model on one A100, total peak GB (weights, optimizer and \
         activations), and beside each cell the Sec. 3.1 whole-model estimate in GiB \
         (`attnbench model bpt-memory --model gpt-3b`: 16 bytes per parameter, 32 checkpointed \
         layer inputs, one layer's working set and the logits, fp32, the lowest over the \
         paper's block grid; oom above 80 GiB):\n\n",
    );
    s += &table(&["context", "vanilla", "memory-efficient", "BPT"], &rows);
    s += &format!(
        "\nThe paper contradicts itself: its Table 2 gives the 3B model's largest contexts on one \
         A100 as 8K, 16K and 65K, but its Table 3 runs the same model on one A100 with \
         memory-efficient attention at 65K (75 GB) and BPT at 131K (79 GB), 4x and 2x past them. \
         The estimate sides with Table 3 for memory-efficient attention and with Table 2 for BPT: \
         on 80 GiB it fits {}, {} and {} (BPT at 131K needs {:.1} GiB).\n\n",
        largest[0],
        largest[1],
        largest[2],
        gib(paper_total(&m, Design::Bpt, 131072))
    );
    s
}

/// A growth check: the design's index in `VARIANTS`, how its memory grows, Sec. 3.1's
/// term, and the rule on the growth exponent.
type Growth = (usize, &'static str, &'static str, fn(f64) -> bool);

/// Growth exponent of memory in context from the increments of the last three points
/// (an affine function gives 1, a quadratic term tends to 2): log2 of the ratio of
/// successive increments over doublings.
fn growth_exponent(pts: &[(f64, f64)]) -> Option<f64> {
    if pts.len() < 3 {
        return None;
    }
    let n = pts.len();
    let (a, b, c) = (pts[n - 3], pts[n - 2], pts[n - 1]);
    let (d1, d2) = ((b.1 - a.1) / (b.0 - a.0), (c.1 - b.1) / (c.0 - b.0));
    if d1 <= 0.0 || d2 <= 0.0 {
        return None;
    }
    // Slope per unit of context grows as s^(e-1); over a doubling of the midpoints:
    let mid = ((b.0 + c.0) / (a.0 + b.0)).log2();
    Some(1.0 + (d2 / d1).log2() / mid)
}

#[cfg(test)]
mod tests {
    use super::growth_exponent;

    #[test]
    fn growth_exponent_tells_linear_from_quadratic() {
        let lin: Vec<(f64, f64)> = [1024.0, 2048.0, 4096.0]
            .iter()
            .map(|&s| (s, 5e6 + 300.0 * s))
            .collect();
        let quad: Vec<(f64, f64)> = [1024.0, 2048.0, 4096.0]
            .iter()
            .map(|&s| (s, 1e6 + 3.0 * s * s))
            .collect();
        assert!((growth_exponent(&lin).unwrap() - 1.0).abs() < 1e-9);
        assert!((growth_exponent(&quad).unwrap() - 2.0).abs() < 1e-9);
    }
}
