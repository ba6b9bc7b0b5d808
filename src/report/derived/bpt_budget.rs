//! BPT's Table 2 against the budget (Liu & Abbeel Table 2; REPRODUCTION.md 5, "BPT
//! budgets"): the budget rule (`model::bpt_memory::rule_budget`: the measured model's
//! training state is the paper's 3B share, 0.54, of the device) and a sweep of budgets from
//! 1/4 to 4 times the rule's, spaced by 2^(1/4), with the paper's 1B share (0.26) added. Per
//! budget, the largest context of each design whose exact predicted need fits (the rows'
//! predicted workspace, inputs and outputs, GEMM packing and the rest of the model, the
//! terms `run::run_case` holds against the budget), and BPT's ratio to memory-efficient's.
//! O(rows x budgets).

use std::collections::BTreeMap;

use super::svg::{line_chart, Series};
use crate::backend::cpu::gemm::PACK_BYTES_MAX;
use crate::model::bpt_memory::{a100_state_share, budget_at_share, rule_share, GptShape};
use crate::problem::{layer_state_bytes, model_rest_bytes};
use crate::report::checks::Check;
use crate::results::record::Record;

/// The sweep's files beside `bpt.md`.
pub const CSV: &str = "bpt_budget_sweep.csv";
pub const PLOT: &str = "bpt_budget_sweep.svg";

/// The designs in `bpt_md::VARIANTS` order.
const VARIANTS: [&str; 3] = ["layer-vanilla", "layer-memeff", "layer-bpt"];

/// Budgets of the sweep: 2^(k/4) times the rule's, k = -8..=8.
const STEPS: std::ops::RangeInclusive<i32> = -8..=8;

/// One budget of the sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub budget: u64,
    /// `budget` over the rule's.
    pub over_rule: f64,
    /// Per design (vanilla, memory-efficient, BPT), the largest context that fits.
    pub largest: [Option<usize>; 3],
    /// What the budget is: "rule" (the 3B share), "1B share", or "".
    pub label: &'static str,
}

impl Point {
    /// BPT's largest context over memory-efficient's, when both fit one.
    pub fn ratio(&self) -> Option<f64> {
        match (self.largest[1], self.largest[2]) {
            (Some(m), Some(p)) => Some(p as f64 / m as f64),
            _ => None,
        }
    }
}

/// The sweep of one mode's rows.
pub struct Sweep {
    /// The rule's budget for the rows' model.
    pub rule: u64,
    /// The budget at the paper's 1B share of an A100.
    pub one_b: u64,
    /// The longest context of the rows: a design that fits it may fit longer ones.
    pub longest: usize,
    pub points: Vec<Point>,
    /// Per design, context -> the least predicted need over its rows (the block grid).
    need: [BTreeMap<usize, u64>; 3],
}

/// What `row` needs against the budget: its predicted workspace, its inputs and outputs,
/// the GEMM packing buffers of its threads and the rest of a `layers`-deep model. None for
/// a row without a prediction (skipped, failed before predicting).
pub fn need(row: &Record, layers: usize) -> Option<u64> {
    let h = row.heads * row.head_dim;
    let rest = model_rest_bytes(
        h,
        row.batch * row.seq_q * h,
        layers,
        row.mode == "layer-train",
    );
    Some(row.mem_predicted_bytes? + row.io_bytes + row.threads as u64 * PACK_BYTES_MAX + rest)
}

impl Sweep {
    /// The sweep of `rows` (one mode, one shape) for a `layers`-deep model; None without
    /// layer rows.
    pub fn new(rows: &[&Record], layers: usize) -> Option<Sweep> {
        let first = rows.first()?;
        let state = layer_state_bytes(first.heads * first.head_dim, layers);
        let rule = budget_at_share(state, rule_share());
        let one_b_model = GptShape::by_name("gpt-1b").expect("a Table 1 row");
        let one_b = budget_at_share(state, a100_state_share(&one_b_model));
        let mut need_of: [BTreeMap<usize, u64>; 3] = Default::default();
        for r in rows
            .iter()
            .filter(|r| matches!(r.status.name(), "ok" | "oom"))
        {
            let (Some(i), Some(n)) = (
                VARIANTS.iter().position(|v| *v == r.variant),
                need(r, layers),
            ) else {
                continue;
            };
            let e = need_of[i].entry(r.seq_q).or_insert(n);
            *e = (*e).min(n);
        }
        let longest = rows.iter().map(|r| r.seq_q).max()?;
        let largest = |budget: u64| -> [Option<usize>; 3] {
            std::array::from_fn(|i| {
                need_of[i]
                    .iter()
                    .filter(|(_, n)| **n <= budget)
                    .map(|(s, _)| *s)
                    .max()
            })
        };
        let mut points: Vec<Point> = STEPS
            .map(|k| {
                let budget = (rule as f64 * 2f64.powf(k as f64 / 4.0)).round() as u64;
                Point {
                    budget,
                    over_rule: budget as f64 / rule as f64,
                    largest: largest(budget),
                    label: if k == 0 { "rule" } else { "" },
                }
            })
            .collect();
        points.push(Point {
            budget: one_b,
            over_rule: one_b as f64 / rule as f64,
            largest: largest(one_b),
            label: "1B share",
        });
        points.sort_by_key(|p| p.budget);
        Some(Sweep {
            rule,
            one_b,
            longest,
            points,
            need: need_of,
        })
    }

    /// A context shown with ">=" when it is the rows' longest (a longer one was not tried).
    fn show(&self, s: Option<usize>) -> String {
        match s {
            Some(s) if s == self.longest => format!(">= {s}"),
            Some(s) => s.to_string(),
            None => "none".into(),
        }
    }

    fn show_ratio(&self, p: &Point) -> String {
        match (p.ratio(), p.largest[2]) {
            (Some(r), Some(b)) => {
                format!("{}{r:.1}x", if b == self.longest { ">= " } else { "" })
            }
            _ => "-".into(),
        }
    }

    /// The point at the 1B share.
    pub fn at_one_b(&self) -> &Point {
        self.points
            .iter()
            .find(|p| p.label == "1B share")
            .expect("the sweep has the 1B point")
    }

    /// The sweep as Markdown: the rule, the table of budgets, where the ratio is at least
    /// 2x and 4x.
    pub fn markdown(&self) -> String {
        let mib = |b: u64| format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64);
        let mut s = format!(
            "### Largest context against the budget\n\n\
             From each row's exact predicted need (workspace, inputs and outputs, GEMM \
             packing and the rest of the model, as the run holds them against the budget; \
             `{CSV}`, `{PLOT}`), for budgets from 1/4 to 4 times the rule's {} (spaced by \
             2^(1/4)) and at the paper's 1B share ({} of an A100, {}). Contexts are the \
             config's.\n\n",
            mib(self.rule),
            fmt_share(a100_state_share(
                &GptShape::by_name("gpt-1b").expect("a Table 1 row")
            )),
            mib(self.one_b),
        );
        let rows: Vec<Vec<String>> = self
            .points
            .iter()
            .map(|p| {
                vec![
                    format!(
                        "{}{}",
                        mib(p.budget),
                        if p.label.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", p.label)
                        }
                    ),
                    format!("{:.2}x", p.over_rule),
                    self.show(p.largest[0]),
                    self.show(p.largest[1]),
                    self.show(p.largest[2]),
                    self.show_ratio(p),
                ]
            })
            .collect();
        s += &crate::model::markdown::table(
            &[
                "budget",
                "of the rule's",
                "vanilla",
                "memory-efficient",
                "BPT",
                "BPT / memory-efficient",
            ],
            &rows,
        );
        let at_least = |x: f64| -> String {
            let over: Vec<String> = self
                .points
                .iter()
                .filter(|p| p.ratio().is_some_and(|r| r >= x))
                .map(|p| format!("{:.2}x", p.over_rule))
                .collect();
            if over.is_empty() {
                "at none of them".into()
            } else {
                format!(
                    "at {} of the {} budgets ({})",
                    over.len(),
                    self.points.len(),
                    over.join(", ")
                )
            }
        };
        s += &format!(
            "\nBPT / memory-efficient is at least 2x {}, and at least 4x {}. The contexts \
             are powers of two, as the paper's: a ratio moves in steps of 2.\n\n",
            at_least(2.0),
            at_least(4.0)
        );
        s
    }

    /// The sweep's rows as CSV (budget in bytes, over the rule's, largest context per design,
    /// the ratio); empty cells where nothing fits.
    pub fn csv(&self) -> String {
        let cell = |v: Option<usize>| v.map_or(String::new(), |s| s.to_string());
        let mut s = String::from(
            "budget_bytes,over_rule,label,vanilla,memeff,bpt,bpt_over_memeff,longest_tried\n",
        );
        for p in &self.points {
            s += &format!(
                "{},{:.4},{},{},{},{},{},{}\n",
                p.budget,
                p.over_rule,
                p.label,
                cell(p.largest[0]),
                cell(p.largest[1]),
                cell(p.largest[2]),
                p.ratio().map_or(String::new(), |r| format!("{r}")),
                self.longest
            );
        }
        s
    }

    /// The ratio against the budget (MiB, log2), with the 2x and 4x lines.
    pub fn svg(&self) -> String {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let ratio: Vec<(f64, f64)> = self
            .points
            .iter()
            .filter_map(|p| Some((mib(p.budget), p.ratio()?)))
            .collect();
        let (lo, hi) = (
            mib(self.points[0].budget),
            mib(self.points[self.points.len() - 1].budget),
        );
        let line = |name: &str, y: f64, color: usize| Series {
            name: name.into(),
            points: vec![(lo, y), (hi, y)],
            dashed: true,
            color,
        };
        line_chart(
            &format!(
                "BPT / memory-efficient largest context against the budget (rule: {:.1} MiB)",
                mib(self.rule)
            ),
            "memory budget (MiB)",
            "BPT / memory-efficient",
            &[
                Series {
                    name: "BPT / memory-efficient".into(),
                    points: ratio,
                    dashed: false,
                    color: 0,
                },
                line("2x", 2.0, 2),
                line("4x", 4.0, 3),
            ],
        )
    }

    /// Checks that the sweep can fail: its predicted needs give the run's own `ok` / `oom`
    /// split at the run's budget, every `ok` row's measured memory is within its predicted
    /// workspace and packing, and BPT reaches at least 2x memory-efficient's context at
    /// every budget between the paper's two single-A100 shares (3B's 0.54: the rule, to
    /// 1B's 0.26).
    pub fn checks(
        &self,
        mode: &str,
        rows: &[&Record],
        layers: usize,
        budget: Option<u64>,
    ) -> Vec<Check> {
        let mut v = Vec::new();
        if let Some(b) = budget {
            let split: Vec<&Record> = rows
                .iter()
                .copied()
                .filter(|r| matches!(r.status.name(), "ok" | "oom"))
                .filter(|r| r.mem_predicted_bytes.is_some())
                .collect();
            let wrong: Vec<String> = split
                .iter()
                .filter(|r| (need(r, layers).unwrap_or(0) <= b) != (r.status.name() == "ok"))
                .map(|r| format!("{} at {} is {}", r.variant, r.seq_q, r.status.name()))
                .collect();
            v.push(
                Check::new(
                    format!("{mode}: the sweep's predicted needs give the run's ok / oom split at its budget"),
                    "the run holds the same terms against the budget",
                )
                .judged(
                    if wrong.is_empty() {
                        format!("{} rows agree", split.len())
                    } else {
                        wrong.join(", ")
                    },
                    wrong.is_empty(),
                ),
            );
        }
        let ok: Vec<&Record> = rows
            .iter()
            .copied()
            .filter(|r| r.status.name() == "ok" && r.mem_overhead_bytes.is_some())
            .collect();
        let over: Vec<String> = ok
            .iter()
            .filter_map(|r| {
                let (m, p) = (r.mem_overhead_bytes?, r.mem_predicted_bytes?);
                (m > p + r.threads as u64 * PACK_BYTES_MAX)
                    .then(|| format!("{} at {}: {m} > {p}", r.variant, r.seq_q))
            })
            .collect();
        if !ok.is_empty() {
            v.push(
                Check::new(
                    format!("{mode}: measured activation memory is within the prediction the sweep uses"),
                    "predicted workspace plus GEMM packing bounds the measured peak",
                )
                .judged(
                    if over.is_empty() {
                        format!("{} ok rows within", ok.len())
                    } else {
                        over.join(", ")
                    },
                    over.is_empty(),
                ),
            );
        }
        let band: Vec<&Point> = self
            .points
            .iter()
            .filter(|p| p.budget >= self.rule && p.budget <= self.one_b)
            .collect();
        let below: Vec<String> = band
            .iter()
            .filter(|p| !p.ratio().is_some_and(|r| r >= 2.0))
            .map(|p| format!("{:.2}x: {}", p.over_rule, self.show_ratio(p)))
            .collect();
        let ratios: Vec<String> = band
            .iter()
            .map(|p| format!("{:.2}x: {}", p.over_rule, self.show_ratio(p)))
            .collect();
        v.push(
            Check::new(
                format!("{mode}: BPT's largest context is at least 2x memory-efficient's at every budget from the paper's 3B to its 1B share of an A100"),
                "2x to 4x (Table 2: 3B 4x at a 0.54 share, 1B 2x at 0.26)",
            )
            .judged(
                format!("budget over the rule's, ratio: {}", ratios.join(", ")),
                below.is_empty() && !band.is_empty(),
            ),
        );
        v
    }

    /// Per design, the predicted need at `ctx`, if a row has it.
    pub fn need_at(&self, design: usize, ctx: usize) -> Option<u64> {
        self.need[design].get(&ctx).copied()
    }
}

/// A share as printed: 0.54.
fn fmt_share(x: f64) -> String {
    format!("{x:.2}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::record::Status;

    fn row(variant: &str, s: usize, status: Status, predicted: u64) -> Record {
        Record {
            variant: variant.into(),
            mode: "layer-train".into(),
            batch: 1,
            heads: 4,
            head_dim: 64,
            seq_q: s,
            seq_kv: s,
            threads: 1,
            status,
            mem_predicted_bytes: Some(predicted),
            ..Record::default()
        }
    }

    #[test]
    fn the_largest_context_follows_the_predicted_need() {
        // Hidden 256, 2 layers: state 25,272,320 B, rule budget 46,800,593 B (/ 0.54),
        // 1B share 97,201,231 B (/ 0.26). A row with no inputs needs its workspace,
        // one thread's packing (PACK_BYTES_MAX = 1,146,944) and the rest of the model,
        // 18,954,240 + 4 x 256 x s.
        let pack = PACK_BYTES_MAX;
        assert_eq!(pack, 1_146_944);
        let rest = |s: usize| 18_954_240 + 1024 * s as u64;
        // Workspaces chosen so that the needs are: memeff 256 fits at 26 MB, 512 at 46 MB
        // (just under the rule); BPT 1024 under the rule, 2048 only past 2x it.
        let rows = [
            row(
                "layer-memeff",
                256,
                Status::Ok,
                26_000_000 - pack - rest(256),
            ),
            row(
                "layer-memeff",
                512,
                Status::Ok,
                46_000_000 - pack - rest(512),
            ),
            row(
                "layer-memeff",
                1024,
                Status::Oom,
                99_000_000 - pack - rest(1024),
            ),
            row(
                "layer-bpt",
                1024,
                Status::Ok,
                46_500_000 - pack - rest(1024),
            ),
            row(
                "layer-bpt",
                2048,
                Status::Oom,
                94_000_000 - pack - rest(2048),
            ),
        ];
        let refs: Vec<&Record> = rows.iter().collect();
        let s = Sweep::new(&refs, 2).unwrap();
        assert_eq!((s.rule, s.one_b), (46_800_593, 97_201_231));
        assert_eq!(s.need_at(1, 512), Some(46_000_000));
        let rule = s.points.iter().find(|p| p.label == "rule").unwrap();
        assert_eq!(rule.largest, [None, Some(512), Some(1024)]);
        assert_eq!(rule.ratio(), Some(2.0));
        // At the 1B share (2.08x): BPT 2048 fits (94 MB), memory-efficient stays at 512.
        assert_eq!(s.at_one_b().largest, [None, Some(512), Some(2048)]);
        // 17 log-spaced budgets and the 1B point, in order.
        assert_eq!(s.points.len(), 18);
        assert!(s.points.windows(2).all(|w| w[0].budget <= w[1].budget));
        // The smallest budget (1/4 of the rule) fits nothing.
        assert_eq!(s.points[0].largest, [None, None, None]);
        // The run's split agrees with the needs at the rule's budget, and every budget
        // from the rule to the 1B share has BPT at least 2x.
        let checks = s.checks("layer-train", &refs, 2, Some(s.rule));
        assert_eq!(checks.len(), 2, "no ok row has a measured peak");
        assert!(checks
            .iter()
            .all(|c| c.verdict == crate::report::checks::Verdict::Pass));
        // A budget under which memeff 512 would be oom contradicts its ok row.
        let c = s.checks("layer-train", &refs, 2, Some(45_000_000));
        assert_eq!(c[0].verdict, crate::report::checks::Verdict::Fail);
        assert!(s
            .csv()
            .lines()
            .nth(1)
            .unwrap()
            .starts_with("11700148,0.2500,,"));
    }
}
