//! What `ab` prints and writes: a Markdown summary (verdict, one row per kernel, the cases
//! it could not judge) and, with `--out`, the same as `ab.md` beside `ab_cases.csv` (one
//! row per case: its rounds' ratio, medians, and both builds' memory and error) and
//! `ab_groups.csv` (one row per kernel). Cost: O(cases).

use std::fmt::Write as _;
use std::path::Path;

use super::{CaseRow, GroupRow, Outcome};
use crate::error::{Error, Result};
use crate::results::durable::write_atomic;
use crate::units;

pub fn markdown(o: &Outcome) -> String {
    let mut s = String::new();
    let up = 1.0 + o.threshold;
    let _ = writeln!(s, "# attnbench ab\n");
    let _ = writeln!(s, "- baseline: {}", o.baseline);
    let _ = writeln!(s, "- current: {}", o.current);
    let _ = writeln!(
        s,
        "- method: {} rounds per case, each a block of {} of timed calls (3 at least) on both \
         sides back to back in a random order; a kernel's ratio current/baseline is the \
         geometric mean of its cases' median round ratios, with a 95% bootstrap interval; \
         slower when the interval is above {up:.3}, faster when below {:.3}; {:.0} s in all",
        o.rounds,
        units::seconds(o.block_s),
        1.0 / up,
        o.seconds
    );
    let judged = o.cases.iter().filter(|c| c.status == "ok").count();
    let slower: Vec<&GroupRow> = o.slower().collect();
    let broken: Vec<&CaseRow> = o.broken().collect();
    let verdict = if !slower.is_empty() || !broken.is_empty() {
        "SLOWER"
    } else {
        "PASS"
    };
    let count = |v: &str| o.groups.iter().filter(|g| g.verdict.name() == v).count();
    let _ = writeln!(
        s,
        "\n**Verdict: {verdict}** (exit {}): {} kernels: {} slower, {} unclear, {} same, {} \
         faster; {judged} of {} cases judged; {} failed in the current build only.\n",
        o.exit_code(),
        o.groups.len(),
        slower.len(),
        count("unclear"),
        count("same"),
        count("faster"),
        o.cases.len(),
        broken.len()
    );
    let _ = writeln!(s, "| kernel | verdict | ratio [95% CI] | cases |");
    let _ = writeln!(s, "|---|---|---|---|");
    for g in &o.groups {
        let _ = writeln!(
            s,
            "| {} | {} | {:.3} [{:.3}, {:.3}] | {} |",
            g.kernel,
            g.verdict.name(),
            g.ratio,
            g.lo,
            g.hi,
            g.cases
        );
    }
    let others: Vec<&CaseRow> = o.cases.iter().filter(|c| c.status != "ok").collect();
    if !others.is_empty() {
        let _ = writeln!(s, "\nCases not judged or failed ({}):\n", others.len());
        for c in others {
            let _ = writeln!(s, "- `{}`: {}", c.case_id.replace('|', "\\|"), c.status);
        }
    }
    s
}

pub fn write(dir: &Path, o: &Outcome, md: &str) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::Io {
        context: format!("creating {}", dir.display()),
        source: e,
    })?;
    write_atomic(&dir.join("ab.md"), md.as_bytes())?;
    write_atomic(&dir.join("ab_cases.csv"), &csv_bytes(&o.cases)?)?;
    write_atomic(&dir.join("ab_groups.csv"), &csv_bytes(&o.groups)?)?;
    Ok(())
}

fn csv_bytes<T: serde::Serialize>(rows: &[T]) -> Result<Vec<u8>> {
    let mut w = ::csv::Writer::from_writer(Vec::new());
    for r in rows {
        w.serialize(r)
            .map_err(|e| Error::Runtime(format!("writing a CSV row: {e}")))?;
    }
    w.into_inner()
        .map_err(|e| Error::Runtime(format!("writing CSV: {e}")))
}
