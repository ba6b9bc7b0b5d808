//! The blog's softmax and FlashAttention IO claims as one call for `attnbench reproduce`
//! (Transformers Inference Optimization Toolset, "Online softmax" and "FlashAttention";
//! REPRODUCTION.md 1.4): measures (`run::softmax`) and counts (`run::hbm_io`), writes
//! `softmax.csv` and `io.csv` (`results::softmax`, `results::hbm_io`), `softmax.md` and
//! `io.md` (`report::derived::softmax_md`, `io_md`) and `meta.json` into a directory and
//! returns the checks, or renders both markdown files again from the rows there. Not a
//! command of its own: `reproduce` calls it. Cost: that of `run::softmax::measure` (about
//! 10 s of timed calls per length); the IO counts take tens of milliseconds.

use std::path::Path;

use crate::error::{Error, Result};
use crate::report::checks::Check;
use crate::report::derived::{io_md, softmax_md};
use crate::results::durable::write_atomic;
use crate::results::meta::Meta;
use crate::results::META_NAME;
use crate::results::{hbm_io, softmax};
use crate::run::INTERRUPTED;

/// Measures the softmax claims (1M and 64M elements timed; 1M and 4M when `quick`) and
/// counts the IO claim's loop orders (the same grid either way), writes `softmax.csv`,
/// `io.csv`, `softmax.md`, `io.md` and `meta.json` (the build and machine) into `dir`
/// (created) and returns the checks.
pub fn reproduce_softmax(dir: &Path, quick: bool) -> Result<Vec<Check>> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let rows = crate::run::softmax::measure(quick, &INTERRUPTED)?;
    let csv = softmax::write(dir, &rows)?;
    let io = crate::run::hbm_io::count();
    let io_csv = hbm_io::write(dir, &io)?;
    let config = serde_json::json!({ "softmax": { "quick": quick } });
    Meta::collect(config, vec![1], Vec::new()).write(&dir.join(META_NAME))?;
    let checks = render(dir, &rows, &io)?;
    eprintln!(
        "softmax: wrote {}, {}, {} and {}",
        csv.display(),
        io_csv.display(),
        dir.join(softmax_md::MARKDOWN).display(),
        dir.join(io_md::MARKDOWN).display()
    );
    Ok(checks)
}

/// `softmax.md` and `io.md` again from the `softmax.csv` and `io.csv` already in `dir`,
/// measuring and counting nothing; the checks.
pub fn report_softmax(dir: &Path) -> Result<Vec<Check>> {
    render(dir, &softmax::read(dir)?, &hbm_io::read(dir)?)
}

/// Writes `softmax.md` of `rows` and `io.md` of `io` into `dir` and returns their checks,
/// the softmax claims first.
fn render(dir: &Path, rows: &[softmax::SoftmaxRow], io: &[hbm_io::IoRow]) -> Result<Vec<Check>> {
    write_atomic(
        &dir.join(softmax_md::MARKDOWN),
        softmax_md::render(rows).as_bytes(),
    )?;
    write_atomic(&dir.join(io_md::MARKDOWN), io_md::render(io).as_bytes())?;
    let mut checks = softmax_md::checks(rows);
    checks.extend(io_md::checks(io));
    Ok(checks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::checks::Verdict;

    /// The whole path at the quick lengths; run once by hand (it times about 10 s).
    #[test]
    #[ignore]
    fn reproduce_softmax_writes_its_files_and_every_exact_claim_passes() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("softmax");
        let quick = std::env::var("SOFTMAX_FULL").is_err();
        let checks = reproduce_softmax(&out, quick).unwrap();
        let md = std::fs::read_to_string(out.join(softmax_md::MARKDOWN)).unwrap();
        eprintln!("{md}");
        assert_eq!(softmax::read(&out).unwrap().len(), 6 + 12 + 6);
        assert_eq!(hbm_io::read(&out).unwrap(), crate::run::hbm_io::count());
        assert!(out.join(io_md::MARKDOWN).is_file());
        // The softmax timings are the one TREND; every other claim passes.
        let trend = softmax_md::checks(&[]).len() - 1;
        for (i, c) in checks.iter().enumerate() {
            let want = if i == trend {
                Verdict::Trend
            } else {
                Verdict::Pass
            };
            assert_eq!(c.verdict, want, "{c:?}");
        }
    }
}
