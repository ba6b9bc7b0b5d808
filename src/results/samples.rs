//! `samples.csv` beside `runs.csv`: the seconds of every timed repetition (`case_id`, `rep`,
//! `time_s`), appended and flushed per case like `runs.csv`, and read back by `compare` for
//! its bootstrap. Costs one short row per repetition on disk, O(samples) memory to read.
//!
//! A case's rows are consecutive with `rep` counting from 0. When a case appears twice (a
//! sweep that crashed between writing its samples and its `runs.csv` row, then resumed), a
//! new `rep = 0` starts it over: the last run of a case wins, as it does for `--resume`.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The header, in order.
pub const HEADER: [&str; 3] = ["case_id", "rep", "time_s"];

#[derive(Debug, Serialize, Deserialize)]
struct Row {
    case_id: String,
    rep: usize,
    time_s: f64,
}

/// Appends the samples of one case at a time; writes the header when it opens a new file.
pub struct SamplesSink {
    writer: ::csv::Writer<File>,
    path: PathBuf,
}

impl SamplesSink {
    pub fn open(path: &Path) -> Result<SamplesSink> {
        Ok(SamplesSink {
            writer: crate::results::runs::open_append(path, &HEADER)?,
            path: path.to_path_buf(),
        })
    }

    /// Writes one row per sample of `case_id` and flushes them to the file.
    pub fn append(&mut self, case_id: &str, samples: &[f64]) -> Result<()> {
        let err = |e: String| Error::Runtime(format!("writing {}: {e}", self.path.display()));
        for (rep, &time_s) in samples.iter().enumerate() {
            let row = Row {
                case_id: case_id.to_string(),
                rep,
                time_s,
            };
            self.writer.serialize(row).map_err(|e| err(e.to_string()))?;
        }
        self.writer.flush().map_err(|e| err(e.to_string()))
    }
}

/// Every case's samples, in call order. A malformed file is an `Input` error naming the file
/// and the row (the header is row 1); an empty file (a run of no timed case, written before
/// the header came first) holds none.
pub fn read_samples(path: &Path) -> Result<HashMap<String, Vec<f64>>> {
    let bad = |msg: String| Error::Input {
        path: path.to_path_buf(),
        msg,
    };
    if path.metadata().is_ok_and(|m| m.len() == 0) {
        return Ok(HashMap::new());
    }
    let mut r = ::csv::Reader::from_path(path).map_err(|e| bad(e.to_string()))?;
    let found = r.headers().map_err(|e| bad(e.to_string()))?.clone();
    if found.iter().ne(HEADER) {
        return Err(bad(format!(
            "expected the header `{}`, found `{}`",
            HEADER.join(","),
            found.iter().collect::<Vec<_>>().join(",")
        )));
    }
    let mut out: HashMap<String, Vec<f64>> = HashMap::new();
    for (i, row) in r.deserialize::<Row>().enumerate() {
        let line = i + 2;
        let row = row.map_err(|e| {
            bad(format!(
                "row {line}: {}",
                crate::results::runs::describe(&e, &found)
            ))
        })?;
        if !(row.time_s.is_finite() && row.time_s >= 0.0) {
            return Err(bad(format!(
                "row {line}: time_s must be a finite number of seconds >= 0, found {}",
                row.time_s
            )));
        }
        let samples = out.entry(row.case_id).or_default();
        if row.rep == 0 {
            samples.clear();
        }
        if row.rep != samples.len() {
            return Err(bad(format!(
                "row {line}: rep {} out of order (expected {})",
                row.rep,
                samples.len()
            )));
        }
        samples.push(row.time_s);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_appends_and_the_last_run_of_a_case_wins() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("samples.csv");
        let mut s = SamplesSink::open(&p).unwrap();
        s.append("a", &[1.0, 2.0]).unwrap();
        s.append("b", &[0.5]).unwrap();
        drop(s);
        let mut s = SamplesSink::open(&p).unwrap();
        s.append("a", &[3.0, 4.0, 5.0]).unwrap();
        drop(s);
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.starts_with("case_id,rep,time_s\n"), "{text}");
        assert_eq!(text.matches("case_id").count(), 1);
        let m = read_samples(&p).unwrap();
        assert_eq!(m["a"], vec![3.0, 4.0, 5.0]);
        assert_eq!(m["b"], vec![0.5]);
    }

    #[test]
    fn malformed_rows_name_the_row() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("samples.csv");
        std::fs::write(&p, "case_id,rep,time_s\na,0,1.0\na,1,fast\n").unwrap();
        let e = read_samples(&p).unwrap_err().to_string();
        assert!(e.contains("samples.csv") && e.contains("row 3"), "{e}");
        assert!(e.contains("time_s"), "{e}");
        std::fs::write(&p, "case_id,rep,time_s\na,0,-1\n").unwrap();
        let e = read_samples(&p).unwrap_err().to_string();
        assert!(e.contains("row 2"), "{e}");
        std::fs::write(&p, "case,rep,time\n").unwrap();
        let e = read_samples(&p).unwrap_err().to_string();
        assert!(e.contains("expected the header"), "{e}");
    }
}
