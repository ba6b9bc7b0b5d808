//! The blog's softmax claims as one call for `attnbench reproduce` (Transformers Inference
//! Optimization Toolset, "Online softmax"; REPRODUCTION.md 1.4): measures (`run::softmax`),
//! writes `softmax.csv` (`results::softmax`) and `softmax.md` (`report::derived::softmax_md`)
//! into a directory and returns the checks. Not a command of its own: `reproduce` calls it.
//! Cost: that of `run::softmax::measure` (about 10 s of timed calls per length).

use std::path::Path;

use crate::error::{Error, Result};
use crate::report::checks::Check;
use crate::report::derived::softmax_md;
use crate::results::durable::write_atomic;
use crate::results::softmax;
use crate::run::INTERRUPTED;

/// Measures the softmax claims (1M and 64M elements timed; 1M and 4M when `quick`), writes
/// `softmax.csv` and `softmax.md` into `dir` (created) and returns the checks.
pub fn reproduce_softmax(dir: &Path, quick: bool) -> Result<Vec<Check>> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let rows = crate::run::softmax::measure(quick, &INTERRUPTED)?;
    let csv = softmax::write(dir, &rows)?;
    let md = dir.join(softmax_md::MARKDOWN);
    write_atomic(&md, softmax_md::render(&rows).as_bytes())?;
    eprintln!("softmax: wrote {} and {}", csv.display(), md.display());
    Ok(softmax_md::checks(&rows))
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
