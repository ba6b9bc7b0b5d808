//! Reading a results directory for a report: `runs.csv` (checked for the columns a report
//! needs, with a message naming the file and the missing columns) and `meta.json` (optional:
//! provenance, the config (read by `crate::report::run_config`) and the calibration). Nothing else is read, so
//! runs made elsewhere, by another build, report the same way.

use std::path::{Path, PathBuf};

use super::meta::Meta;
use super::record::{header, Record};
use crate::error::{Error, Result};
use crate::measure::calibrate::Calibration;

pub use super::{CSV_NAME, META_NAME};

/// Columns added after the first release of the CSV; older files without them still read.
pub const OPTIONAL_COLUMNS: [&str; 41] = [
    "time_bwd_median_s",
    "grad_max_abs_err",
    "grad_max_rel_err",
    "grad_err_rows",
    "grad_err_scope",
    "d_out",
    "extrapolated",
    "timed_rows",
    "diff_variant",
    "max_abs_diff",
    "splits",
    "allreduce",
    "kv_read_bytes",
    "kv_gbytes_per_s",
    "copy_gbytes_per_s",
    "copy_bw_frac",
    "comm_elements",
    "comm_max_device_bytes",
    "device_peak_elements",
    "device_peak_bytes",
    "device_pairs_max",
    "critical_path_pairs",
    "comm_time_s",
    "comm_time_min_s",
    "sim_comm_bytes",
    "sim_comm_max_device_bytes",
    "probe_gflops",
    "page_size",
    "page_order",
    "prefill_chunk",
    "prefill_steps",
    "step_max_median_s",
    "batch_spec",
    "kernel_path",
    "prefix_len",
    "kv_dtype",
    "max_abs_err_unquantized",
    "latent_dim",
    "rope_dim",
    "sinks",
    "precision",
];

/// The contents of a results directory.
#[derive(Clone, Debug)]
pub struct Results {
    pub dir: PathBuf,
    pub records: Vec<Record>,
    pub meta: Option<Meta>,
}

impl Results {
    pub fn read(dir: &Path) -> Result<Results> {
        if !dir.is_dir() {
            return Err(Error::Input {
                path: dir.to_path_buf(),
                msg: "not a results directory (expected a directory holding runs.csv)".into(),
            });
        }
        let records = read_csv(&dir.join(CSV_NAME))?;
        let meta_path = dir.join(META_NAME);
        let meta = if meta_path.exists() {
            // Bytes that are not UTF-8 are a malformed file (exit 2), not a failed read.
            let text = std::fs::read_to_string(&meta_path).map_err(|e| match e.kind() {
                std::io::ErrorKind::InvalidData => Error::Input {
                    path: meta_path.clone(),
                    msg: format!("not a meta.json written by attnbench: {e}"),
                },
                _ => Error::io(format!("cannot read {}", meta_path.display()), e),
            })?;
            Some(serde_json::from_str(&text).map_err(|e| Error::Input {
                path: meta_path.clone(),
                msg: format!("not a meta.json written by attnbench: {e}"),
            })?)
        } else {
            None
        };
        Ok(Results {
            dir: dir.to_path_buf(),
            records,
            meta,
        })
    }

    /// The run name: from the rows (they all carry it), else the directory name.
    pub fn run_name(&self) -> String {
        self.records.first().map_or_else(
            || {
                self.dir
                    .file_name()
                    .map_or("run".into(), |n| n.to_string_lossy().into_owned())
            },
            |r| r.run.clone(),
        )
    }

    pub fn calibration(&self) -> &[Calibration] {
        self.meta.as_ref().map_or(&[], |m| m.calibration.as_slice())
    }
}

/// Reads `runs.csv`, refusing an empty file, a header without the columns reports need, and
/// a file without rows.
pub fn read_csv(path: &Path) -> Result<Vec<Record>> {
    let input = |msg: String| Error::Input {
        path: path.to_path_buf(),
        msg,
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        input(format!(
            "cannot read it ({e}); a results directory holds the runs.csv a sweep writes"
        ))
    })?;
    if text.trim().is_empty() {
        return Err(input("the file is empty (no header, no rows)".into()));
    }
    check_columns(path, text.as_bytes())?;
    let records = super::runs::parse(path, text.as_bytes())?;
    if records.is_empty() {
        return Err(input(
            "no rows: the header is there but no case was recorded".into(),
        ));
    }
    Ok(records)
}

/// Refuses a `runs.csv` header without a column that reports and comparisons read (all
/// but `OPTIONAL_COLUMNS`): a missing `time_median_s` would read as no time at all.
pub fn check_columns(path: &Path, input: impl std::io::Read) -> Result<()> {
    let err = |msg: String| Error::Input {
        path: path.to_path_buf(),
        msg,
    };
    let mut r = ::csv::Reader::from_reader(input);
    let found: Vec<String> = r
        .headers()
        .map_err(|e| err(format!("reading the header: {e}")))?
        .iter()
        .map(str::to_string)
        .collect();
    // An empty file is the row reader's to name ("empty file"), not a list of every column.
    if found.iter().all(String::is_empty) {
        return Ok(());
    }
    let missing: Vec<String> = header()
        .into_iter()
        .filter(|c| !OPTIONAL_COLUMNS.contains(&c.as_str()) && !found.contains(c))
        .collect();
    if !missing.is_empty() {
        return Err(err(format!(
            "missing column{} {} (a report or comparison needs the columns attnbench writes; see docs/reference/results-format.md)",
            if missing.len() == 1 { "" } else { "s" },
            missing.join(", ")
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_headerless_and_short_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(CSV_NAME);
        let msg = |text: &str| {
            std::fs::write(&p, text).unwrap();
            match read_csv(&p) {
                Err(e @ Error::Input { .. }) => {
                    assert_eq!(e.exit_code(), 2);
                    e.to_string()
                }
                other => panic!("{other:?}"),
            }
        };
        assert!(msg("").contains("empty"));
        assert!(msg(&(header().join(",") + "\n")).contains("no rows"));
        // A case twice: the fixture's first row repeated.
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/report/runs.csv");
        let text = std::fs::read_to_string(fixture).unwrap();
        let mut lines = text.lines();
        let (head, row) = (lines.next().unwrap(), lines.next().unwrap());
        let twice = msg(&format!("{head}\n{row}\n{row}\n"));
        assert!(
            twice.contains("row 3")
                && twice.contains("appears again")
                && twice.contains("in row 2"),
            "{twice}"
        );
        // A row without a case_id (the fixture's second row with it cleared).
        let cleared = {
            let (run, rest) = row.split_once(',').unwrap();
            let (_, rest) = rest.split_once(',').unwrap();
            format!("{run},,{rest}")
        };
        assert_eq!(head.split(',').nth(1), Some("case_id"));
        let empty = msg(&format!("{head}\n{row}\n{cleared}\n"));
        assert!(
            empty.contains("row 3") && empty.contains("empty case_id"),
            "{empty}"
        );
        // A field no run writes: named with its row and column.
        let field = |col: &str, value: &str| {
            let i = head.split(',').position(|c| c == col).unwrap();
            let mut f: Vec<&str> = row.split(',').collect();
            f[i] = value;
            msg(&format!("{head}\n{}\n", f.join(",")))
        };
        for (col, value) in [
            ("max_abs_err", "-1e-7"),
            ("max_rel_err", "NaN"),
            ("dtype", "f64"),
            ("device", "tpu"),
            ("mode", "nope"),
            ("seq_q", "0"),
            ("head_dim", "0"),
        ] {
            let m = field(col, value);
            assert!(m.contains("row 2") && m.contains(col), "{col}={value}: {m}");
        }
        let short = msg("run,case_id,variant\nx,y,naive\n");
        assert!(short.contains("missing columns") && short.contains("time_median_s"));
        assert!(
            !short.contains("max_abs_diff"),
            "optional columns are not required"
        );
    }
}
