//! Tree Attention's end-to-end Tables 1-2 as one call for `attnbench reproduce` (Shyam et
//! al. Sec. 6.4 and App. C.3; docs/papers.md, Shyam et al.): measures (`run::generate`),
//! writes `generate.csv` (`results::generate`), `generate.md`
//! (`report::derived::generate_md`) and `meta.json` into a directory and returns the
//! checks, or renders `generate.md` again from the rows there. Not a command of its own:
//! `reproduce` calls it. Cost: that of `run::generate::measure` (seconds with `--quick`,
//! minutes in full).

use std::path::Path;

use crate::error::{Error, Result};
use crate::report::checks::Check;
use crate::report::derived::generate_md;
use crate::results::durable::write_atomic;
use crate::results::generate;
use crate::results::meta::Meta;
use crate::results::META_NAME;
use crate::run::INTERRUPTED;

/// Measures the generations (prompt lengths 1K-8K, 3 repetitions; 1K and 2K, one, when
/// `quick`), writes `generate.csv`, `generate.md` and `meta.json` into `dir` (created) and
/// returns the checks.
pub fn reproduce_generate(dir: &Path, quick: bool) -> Result<Vec<Check>> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let rows = crate::run::generate::measure(quick, &INTERRUPTED)?;
    let csv = generate::write(dir, &rows)?;
    let config = serde_json::json!({ "generate": {
        "quick": quick,
        "tokens": crate::run::generate::tokens(quick),
        "devices": crate::run::generate::DEVICES,
        "steps": crate::run::generate::STEPS,
    } });
    Meta::collect(config, vec![1], Vec::new()).write(&dir.join(META_NAME))?;
    let checks = render(dir, &rows)?;
    eprintln!(
        "generate: wrote {} and {}",
        csv.display(),
        dir.join(generate_md::MARKDOWN).display()
    );
    Ok(checks)
}

/// Under `mpirun` (feature `mpi`): this rank's part of the generations on the run's
/// ranks (`run::generate_ranks`); rank 0 writes `generate.csv` and `meta.json` into `dir`
/// (created).
pub fn measure_generate_ranks(dir: &Path, quick: bool) -> Result<()> {
    #[cfg(feature = "mpi")]
    {
        let root = crate::dist::is_root();
        let made = !root || std::fs::create_dir_all(dir).is_ok();
        if !crate::dist::all_ok(made)? {
            return Err(Error::Usage(format!("cannot create {}", dir.display())));
        }
        let rows = crate::run::generate_ranks::measure(quick, &INTERRUPTED)?;
        if root {
            let csv = generate::write(dir, &rows)?;
            let config = serde_json::json!({ "generate_ranks": {
                "quick": quick,
                "tokens": crate::run::generate::tokens(quick),
                "ranks": crate::dist::size(),
                "steps": crate::run::generate::STEPS,
            } });
            Meta::collect(config, vec![1], Vec::new()).write(&dir.join(META_NAME))?;
            eprintln!("generate on MPI ranks: wrote {}", csv.display());
        }
        Ok(())
    }
    #[cfg(not(feature = "mpi"))]
    {
        let _ = (dir, quick);
        Err(Error::Usage(
            crate::dist::unavailable(2).unwrap_or_else(|| "MPI is not available".into()),
        ))
    }
}

/// The generations of every p of `ranks` (`p<p>/generate.csv` in `dir`, each from its
/// own `mpirun`) in one `generate.csv` and `generate.md`, with this process's
/// `meta.json`; the checks.
pub fn gather_generate_ranks(dir: &Path, ranks: &[usize]) -> Result<Vec<Check>> {
    let mut rows = Vec::new();
    for p in ranks {
        rows.extend(generate::read(&dir.join(format!("p{p}")))?);
    }
    generate::write(dir, &rows)?;
    let config = serde_json::json!({ "generate_ranks": {
        "ranks": ranks,
        "steps": crate::run::generate::STEPS,
    } });
    Meta::collect(config, vec![1], Vec::new()).write(&dir.join(META_NAME))?;
    render(dir, &rows)
}

/// `generate.md` again from the `generate.csv` already in `dir`, measuring nothing; the
/// checks.
pub fn report_generate(dir: &Path) -> Result<Vec<Check>> {
    render(dir, &generate::read(dir)?)
}

fn render(dir: &Path, rows: &[generate::GenerateRow]) -> Result<Vec<Check>> {
    write_atomic(
        &dir.join(generate_md::MARKDOWN),
        generate_md::render(rows).as_bytes(),
    )?;
    Ok(generate_md::checks(rows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::checks::Verdict;

    /// The whole path at the quick lengths: both files written, the exact claim passes,
    /// and the report renders again from the CSV alone.
    #[test]
    fn reproduce_generate_writes_both_files_and_the_exact_claim_passes() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("generate");
        let checks = reproduce_generate(&out, true).unwrap();
        assert_eq!(generate::read(&out).unwrap().len(), 2 * 3 * 2);
        assert_eq!(checks[0].verdict, Verdict::Pass, "{:?}", checks[0]);
        assert!(checks[1..].iter().all(|c| c.verdict == Verdict::Trend));
        assert_eq!(report_generate(&out).unwrap(), checks);
        assert!(out.join(generate_md::MARKDOWN).is_file());
    }
}
