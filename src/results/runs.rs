//! `runs.csv`: one row per case, appended and flushed after every row so an interrupted or
//! crashed sweep loses nothing; the one reader (`read`: every row checked, each case once)
//! behind `--resume`, reports (`load`, which also checks the columns) and `compare`.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use super::record::{header, Record};
use crate::error::{Error, Result};

/// Appends records to `runs.csv`.
pub struct CsvSink {
    writer: ::csv::Writer<File>,
    path: PathBuf,
}

impl CsvSink {
    pub fn open(path: &Path) -> Result<CsvSink> {
        Ok(CsvSink {
            writer: open_append(path, &header())?,
            path: path.to_path_buf(),
        })
    }

    /// Writes one row and flushes it to the file.
    pub fn append(&mut self, record: &Record) -> Result<()> {
        let err = |e: String| Error::Runtime(format!("writing {}: {e}", self.path.display()));
        self.writer
            .serialize(record)
            .map_err(|e| err(e.to_string()))?;
        self.writer.flush().map_err(|e| err(e.to_string()))
    }
}

/// Opens a CSV file of these columns to append rows (without headers) to. A new or empty
/// file gets the header at once, so a run that writes no row still leaves a well-formed
/// file; an existing one must have this header.
pub fn open_append<S: AsRef<str>>(path: &Path, header: &[S]) -> Result<::csv::Writer<File>> {
    let exists = path.metadata().map(|m| m.len() > 0).unwrap_or(false);
    if exists {
        check_header(path, header)?;
    }
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error::io(format!("cannot open {}", path.display()), e))?;
    let mut writer = ::csv::WriterBuilder::new()
        .has_headers(false)
        .from_writer(file);
    if !exists {
        let err = |e: String| Error::Runtime(format!("writing {}: {e}", path.display()));
        writer
            .write_record(header.iter().map(AsRef::as_ref))
            .map_err(|e| err(e.to_string()))?;
        writer.flush().map_err(|e| err(e.to_string()))?;
    }
    Ok(writer)
}

/// Refuses a file whose header is not `want`, the columns this version writes.
pub fn check_header<S: AsRef<str>>(path: &Path, want: &[S]) -> Result<()> {
    let mut r = ::csv::Reader::from_path(path)
        .map_err(|e| Error::Runtime(format!("reading {}: {e}", path.display())))?;
    let found = r
        .headers()
        .map_err(|e| Error::Runtime(format!("reading {}: {e}", path.display())))?;
    if found.iter().ne(want.iter().map(AsRef::as_ref)) {
        return Err(Error::Runtime(format!(
            "{} has a different CSV header than this version of attnbench writes; \
             use a new --out directory (found {} columns, expected {})",
            path.display(),
            found.len(),
            want.len()
        )));
    }
    Ok(())
}

/// Every row of a `runs.csv`, each checked; a case id may appear once.
pub fn read(path: &Path) -> Result<Vec<Record>> {
    let file = File::open(path).map_err(|e| Error::Input {
        path: path.to_path_buf(),
        msg: e.to_string(),
    })?;
    parse(path, file)
}

/// Every row of a `runs.csv`, or none when the file does not exist (a sweep that wrote no
/// row yet).
pub fn read_if_present(path: &Path) -> Result<Vec<Record>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    read(path)
}

/// `read` of the contents of `path` already at hand (`input`), for a caller that read the
/// file itself (a report checks the header's columns first).
pub fn parse(path: &Path, input: impl std::io::Read) -> Result<Vec<Record>> {
    let bad = |msg: String| Error::Input {
        path: path.to_path_buf(),
        msg,
    };
    let mut r = ::csv::Reader::from_reader(input);
    let header = r.headers().map_err(|e| bad(e.to_string()))?.clone();
    if header.is_empty() || header.iter().all(str::is_empty) {
        return Err(bad("empty file: expected the runs.csv header".into()));
    }
    for col in ["case_id", "status"] {
        if !header.iter().any(|h| h == col) {
            return Err(bad(format!(
                "the header has no `{col}` column: not a runs.csv written by attnbench sweep"
            )));
        }
    }
    let mut records = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, rec) in r.deserialize::<Record>().enumerate() {
        let row = i + 2;
        let rec = rec.map_err(|e| bad(format!("row {row}: {}", describe(&e, &header))))?;
        if rec.case_id.is_empty() {
            return Err(bad(format!("row {row}: empty case_id")));
        }
        // A time is a finite number of seconds, 0 or more: a report would draw "-1 s" or
        // "NaN s", and its plots would drop the row without a word.
        let times = [
            ("time_median_s", rec.time_median_s),
            ("time_min_s", rec.time_min_s),
            ("time_max_s", rec.time_max_s),
            ("time_mad_s", rec.time_mad_s),
            ("time_bwd_median_s", rec.time_bwd_median_s),
            ("comm_time_s", rec.comm_time_s),
            ("comm_time_min_s", rec.comm_time_min_s),
            ("step_max_median_s", rec.step_max_median_s),
        ];
        for (col, t) in times {
            if let Some(t) = t.filter(|t| !(t.is_finite() && *t >= 0.0)) {
                return Err(bad(format!(
                    "row {row}, column {col}: {t} is not a time (a finite number of seconds, 0 or more)"
                )));
            }
        }
        check_fields(&rec).map_err(|m| bad(format!("row {row}, {m}")))?;
        if let Some(first) = seen.insert(rec.case_id.clone(), row) {
            return Err(bad(format!(
                "row {row}: case_id `{}` appears again: it already appears in row {first} \
                 (a runs.csv holds each case once)",
                rec.case_id
            )));
        }
        records.push(rec);
    }
    Ok(records)
}

/// The fields a report and a comparison read as numbers or names, beyond the times: an
/// error is NaN-free and 0 or more (a negative error would pass any gate), the dtype,
/// device and mode are ones this build knows, and no size is 0 (rates divide by them).
fn check_fields(rec: &Record) -> std::result::Result<(), String> {
    use crate::problem::{DType, Device, Mode};
    let errors = [
        ("max_abs_err", rec.max_abs_err),
        ("max_rel_err", rec.max_rel_err),
        ("grad_max_abs_err", rec.grad_max_abs_err),
        ("grad_max_rel_err", rec.grad_max_rel_err),
        ("max_abs_diff", rec.max_abs_diff),
    ];
    for (col, e) in errors {
        // +inf is kept: it is how an overflowing output's error is written.
        if let Some(e) = e.filter(|e| e.is_nan() || *e < 0.0) {
            return Err(format!(
                "column {col}: {e} is not an error (a number, 0 or more)"
            ));
        }
    }
    let names = [
        ("dtype", &rec.dtype, rec.dtype.parse::<DType>().is_ok()),
        ("device", &rec.device, rec.device.parse::<Device>().is_ok()),
        ("mode", &rec.mode, rec.mode.parse::<Mode>().is_ok()),
    ];
    for (col, v, known) in names {
        if !known {
            return Err(format!("column {col}: unknown `{v}`"));
        }
    }
    let sizes = [
        ("batch", rec.batch),
        ("heads", rec.heads),
        ("kv_heads", rec.kv_heads),
        ("seq_q", rec.seq_q),
        ("seq_kv", rec.seq_kv),
        ("head_dim", rec.head_dim),
        ("devices", rec.devices),
    ];
    for (col, n) in sizes {
        if n == 0 {
            return Err(format!("column {col}: a size of 0"));
        }
    }
    Ok(())
}

/// The case ids already in a CSV file (for `--resume`); empty when the file does not exist.
pub fn done_case_ids(path: &Path) -> Result<HashSet<String>> {
    Ok(read_if_present(path)?
        .into_iter()
        .map(|r| r.case_id)
        .collect())
}

/// A CSV read error in words, naming the column when it concerns one field (for messages
/// such as "runs.csv: row 7: column `reps`: invalid digit found in string").
pub fn describe(e: &::csv::Error, header: &::csv::StringRecord) -> String {
    match e.kind() {
        ::csv::ErrorKind::Deserialize { err, .. } => {
            match err.field().and_then(|i| header.get(i as usize)) {
                Some(col) => format!("column `{col}`: {}", err.kind()),
                None => err.kind().to_string(),
            }
        }
        ::csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => format!("{len} fields where the header has {expected_len}"),
        _ => e.to_string(),
    }
}
