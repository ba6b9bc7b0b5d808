//! The blog's softmax claims as one call for `attnbench reproduce` (Transformers Inference
//! Optimization Toolset, "Online softmax"; REPRODUCTION.md 1.4): measures (`run::softmax`),
//! writes `softmax.csv` (`results::softmax`), `softmax.md` (`report::derived::softmax_md`)
//! and `meta.json` into a directory and returns the checks, or renders `softmax.md` again
//! from the rows there. Not a command of its own: `reproduce` calls it.
//! Cost: that of `run::softmax::measure` (about 10 s of timed calls per length).

use std::path::Path;

use crate::error::{Error, Result};
use crate::report::checks::Check;
use crate::report::derived::softmax_md;
use crate::results::durable::write_atomic;
use crate::results::meta::Meta;
use crate::results::softmax;
use crate::results::META_NAME;
use crate::run::INTERRUPTED;

/// Measures the softmax claims (1M and 64M elements timed; 1M and 4M when `quick`), writes
/// `softmax.csv`, `softmax.md` and `meta.json` (the build and machine) into `dir` (created)
/// and returns the checks.
pub fn reproduce_softmax(dir: &Path, quick: bool) -> Result<Vec<Check>> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let rows = crate::run::softmax::measure(quick, &INTERRUPTED)?;
    let csv = softmax::write(dir, &rows)?;
    let config = serde_json::json!({ "softmax": { "quick": quick } });
    Meta::collect(config, vec![1], Vec::new()).write(&dir.join(META_NAME))?;
    let checks = render(dir, &rows)?;
    eprintln!(
        "softmax: wrote {} and {}",
        csv.display(),
        dir.join(softmax_md::MARKDOWN).display()
    );
    Ok(checks)
}

/// `softmax.md` again from the `softmax.csv` already in `dir`, measuring nothing; the
/// checks.
pub fn report_softmax(dir: &Path) -> Result<Vec<Check>> {
    render(dir, &softmax::read(dir)?)
}

/// Writes `softmax.md` of `rows` into `dir` and returns their checks.
fn render(dir: &Path, rows: &[softmax::SoftmaxRow]) -> Result<Vec<Check>> {
    write_atomic(
        &dir.join(softmax_md::MARKDOWN),
        softmax_md::render(rows).as_bytes(),
    )?;
    Ok(softmax_md::checks(rows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::checks::Verdict;

    /// The whole path at the quick lengths; run once by hand (it times about 10 s).
    #[test]
    #[ignore]
    fn reproduce_softmax_writes_both_files_and_every_exact_claim_passes() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("softmax");
        let quick = std::env::var("SOFTMAX_FULL").is_err();
        let checks = reproduce_softmax(&out, quick).unwrap();
        let md = std::fs::read_to_string(out.join(softmax_md::MARKDOWN)).unwrap();
        eprintln!("{md}");
        assert_eq!(softmax::read(&out).unwrap().len(), 6 + 12 + 6);
        for c in &checks[..checks.len() - 1] {
            assert_eq!(c.verdict, Verdict::Pass, "{c:?}");
        }
        assert_eq!(checks[checks.len() - 1].verdict, Verdict::Trend);
    }
}
