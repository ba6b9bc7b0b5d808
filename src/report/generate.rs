//! `attnbench report`: reads a results directory (runs.csv, meta.json), writes tables.md,
//! the plots and index.html (all of it on one page) into `DIR/report/` (or `--out`),
//! regenerates the derived files (`decode.md`, `bpt.md`, `tree_vs_ring.*`) beside runs.csv
//! (or in `--out`), and prints the derived checks. `sweep` calls it at the end unless
//! `--no-report`.

use crate::report::run_config::RunConfig;
use std::path::{Path, PathBuf};

use super::checks::{rs_checks, Check, Verdict};
use super::derived::{write_renderings, Sources};
use super::figures::{is_plot_file, write_all};
use super::plot::Format;
use super::select::{layout_of, rs_rows, TABLE2};
use super::series::chunk_grids;
use super::summary::{choose, summarize, Summary};
use super::tables_md::{render, Inputs};
use crate::error::{Error, Result};
use crate::results::load::{Results, CSV_NAME};
use crate::results::meta::read_bandwidths;

/// The report directory's name inside a results directory.
pub const REPORT_DIR: &str = "report";
pub const TABLES_NAME: &str = "tables.md";

/// What a report wrote.
#[derive(Debug)]
pub struct Generated {
    pub out: PathBuf,
    /// Every file written, relative to `out`.
    pub files: Vec<String>,
    /// The derived files regenerated from the rows and the sweep's measurements
    /// (`decode.md`, `bpt.md`, `tree_vs_ring.*`): beside `runs.csv`, where `sweep` writes
    /// them, or in `out` when it was given.
    pub derived: Vec<PathBuf>,
    pub checks: Vec<Check>,
    /// Each variant against the reference (`report::summary`); None when nothing was timed.
    pub summary: Option<Summary>,
}

/// The report of the results directory `dir` (or of the directory of `dir`, a `runs.csv`)
/// into `out` [default: `dir/report`]; the summary against `reference` [default: the run's
/// `[report] reference`, else naive, else the first variant timed].
pub fn generate(
    dir: &Path,
    out: Option<&Path>,
    formats: &[Format],
    reference: Option<&str>,
) -> Result<Generated> {
    let dir = match dir.parent() {
        Some(parent) if dir.is_file() && dir.file_name() == Some(CSV_NAME.as_ref()) => {
            if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            }
        }
        _ => dir,
    };
    let results = Results::read(dir)?;
    let summary = choose(&results.records, reference, results.reference().as_deref())
        .map_err(Error::Usage)?
        .map(|(name, chosen)| summarize(&results.records, &name, chosen));
    let derived_dir = out.unwrap_or(dir).to_path_buf();
    let out = out.map_or_else(|| dir.join(REPORT_DIR), Path::to_path_buf);
    if out.exists() && !out.is_dir() {
        return Err(Error::Usage(format!(
            "--out {}: is a file, not a directory",
            out.display()
        )));
    }
    std::fs::create_dir_all(&out)
        .map_err(|e| Error::io(format!("cannot create {}", out.display()), e))?;
    remove_old_plots(&out)?;
    let paper = results.paper();
    let layout = paper.as_ref().and_then(|p| layout_of(&p.id));
    let rows = rs_rows(&results.records, &layout.unwrap_or(TABLE2));
    let checks = match (&paper, &layout) {
        (Some(p), Some(l)) => rs_checks(&rows, p, l),
        _ => Vec::new(),
    };
    let grids = chunk_grids(&results.records);
    let plots = write_all(&results, &grids, &out, formats)?;
    let md = render(&Inputs {
        results: &results,
        paper: paper.as_ref(),
        layout: layout.as_ref(),
        rows: &rows,
        checks: &checks,
        grids: &grids,
        plots: &plots,
        summary: summary.as_ref(),
    });
    let tables = out.join(TABLES_NAME);
    crate::results::durable::write_atomic(&tables, md.as_bytes())?;
    let mut files = vec![TABLES_NAME.to_string()];
    for img in plots.iter().flat_map(|p| &p.images) {
        let stem = img
            .file
            .rsplit_once('.')
            .map_or(img.file.as_str(), |(s, _)| s);
        files.extend(formats.iter().map(|f| format!("{stem}.{}", f.ext())));
    }
    let model = results.model()?;
    let measured = crate::results::tree_vs_ring::read(dir)?;
    let derived = write_renderings(
        &derived_dir,
        &Sources {
            records: &results.records,
            model_layers: results.model_layers(),
            budget: results.memory_budget(),
            model: model.as_ref(),
            measured: measured.as_ref(),
            read_bandwidth: &read_bandwidths(results.calibration()),
        },
    )?;
    // The one-page view of all of it (index.html), after the files it inlines.
    super::html::write(&super::html::Sources {
        out: &out,
        tables_md: &md,
        plots: &files[1..],
        derived: &derived,
    })?;
    files.push(super::html::HTML_NAME.to_string());
    Ok(Generated {
        out,
        files,
        derived,
        checks,
        summary,
    })
}

/// The checks as terminal lines: "PASS  name: ours (paper: ...)".
pub fn checks_text(checks: &[Check]) -> String {
    checks
        .iter()
        .map(|c| {
            let v = match c.verdict {
                Verdict::NotApplicable => "n/a ".to_string(),
                v => v.to_string(),
            };
            format!("  {v}  {}: {} (paper: {})\n", c.name, c.ours, c.paper)
        })
        .collect()
}

/// Removes the plots of an earlier report in `out`, so a chart that is now split into
/// facets (or no longer drawn) leaves no stale file beside the new ones; other files stay.
fn remove_old_plots(out: &Path) -> Result<()> {
    let entries = std::fs::read_dir(out)
        .map_err(|e| Error::io(format!("cannot read {}", out.display()), e))?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_file() && entry.file_name().to_str().is_some_and(is_plot_file) {
            std::fs::remove_file(&path)
                .map_err(|e| Error::io(format!("cannot remove {}", path.display()), e))?;
        }
    }
    Ok(())
}

/// `attnbench report DIR`: generate, then print where it went, the checks and the summary.
pub fn run(
    dir: &Path,
    out: Option<&Path>,
    formats: &[Format],
    reference: Option<&str>,
) -> Result<()> {
    let g = generate(dir, out, formats, reference)?;
    print(&g);
    Ok(())
}

/// Where a report went, its checks and its summary, on stdout.
pub fn print(g: &Generated) {
    println!(
        "report written to {}: {}",
        g.out.display(),
        g.files.join(", ")
    );
    for p in &g.derived {
        println!("wrote {}", p.display());
    }
    if !g.checks.is_empty() {
        println!("derived checks:\n{}", checks_text(&g.checks));
    }
    if let Some(summary) = &g.summary {
        print!("{}", summary.text());
    }
}
