//! The claims a results directory can judge against its paper, from its rows alone
//! (runs.csv, meta.json and the sweep's measurements): the Rabe–Staats checks
//! (`checks.rs`) with the relative-speed row beside the paper's as a trend, BPT's
//! (`derived/bpt_md.rs`) and Tree Attention's (`derived/tree_vs_ring.rs`). What
//! `attnbench reproduce` prints and writes to `claims.md`. O(rows).

use std::path::Path;

use super::checks::{rs_checks, Check, Verdict};
use super::derived::{bpt_md, tree_vs_ring};
use super::run_config::RunConfig;
use super::select::{layout_of, rs_rows, RsRows, MEMORY_EFFICIENT, STANDARD};
use super::tables_md::cell;
use crate::config::paper::PaperTable;
use crate::error::Result;
use crate::model::markdown::table;
use crate::results::load::Results;
use crate::results::record::Status;
use crate::units::{percent, pow2};

/// Every claim the rows of `dir` can judge, in the order of the paper's tables; empty for
/// a run that reproduces no paper.
pub fn claims(dir: &Path) -> Result<Vec<Check>> {
    let results = Results::read(dir)?;
    let mut v = Vec::new();
    if let Some(paper) = results.paper() {
        if let Some(layout) = layout_of(&paper.id) {
            let rows = rs_rows(&results.records, &layout);
            v.extend(rs_checks(&rows, &paper, &layout));
            v.push(relative_speed(&rows, &paper));
        }
    }
    v.extend(bpt_md::checks(
        &results.records,
        results.model_layers(),
        results.memory_budget(),
    ));
    if let (Some(model), Some(measured)) =
        (results.model()?, crate::results::tree_vs_ring::read(dir)?)
    {
        v.extend(tree_vs_ring::checks(&model, &measured)?);
    }
    Ok(v)
}

/// The paper's relative-speed row (memory-efficient against standard, "within a few
/// percent") beside ours, t(standard) / t(memory-efficient) - 1 where both ran: a trend,
/// since the paper's times are a TPUv2's.
fn relative_speed(t: &RsRows, paper: &PaperTable) -> Check {
    let theirs: Vec<String> = paper
        .columns
        .iter()
        .filter_map(|&n| {
            let c = paper.cell("relative_speed", n)?;
            (c != "-").then(|| format!("{c} at {}", pow2(n)))
        })
        .collect();
    let c = Check::new(
        format!("relative speed of {MEMORY_EFFICIENT} against {STANDARD}"),
        if theirs.is_empty() {
            "not given".to_string()
        } else {
            theirs.join(", ")
        },
    );
    let time = |r: Option<&&crate::results::record::Record>| {
        r.filter(|r| r.status == Status::Ok && !r.extrapolated)
            .and_then(|r| r.time_median_s)
    };
    let ours: Vec<String> = t
        .standard
        .keys()
        .filter_map(|n| {
            let (s, m) = (time(t.standard.get(n))?, time(t.memory_efficient.get(n))?);
            (m > 0.0).then(|| format!("{} at {}", percent(s / m - 1.0), pow2(*n)))
        })
        .collect();
    if ours.is_empty() {
        c.missing(format!(
            "no n where both {STANDARD} and {MEMORY_EFFICIENT} were timed"
        ))
    } else {
        c.trend(ours.join(", "))
    }
}

/// One table's claims as Markdown: `| claim | paper | ours | verdict |`.
pub fn markdown(checks: &[Check]) -> String {
    let rows: Vec<Vec<String>> = checks
        .iter()
        .map(|c| {
            vec![
                cell(&c.name),
                cell(&c.paper),
                cell(&c.ours),
                match c.verdict {
                    Verdict::Pass | Verdict::Fail => format!("**{}**", c.verdict),
                    v => v.to_string(),
                },
            ]
        })
        .collect();
    table(&["claim", "paper", "ours", "verdict"], &rows)
}
