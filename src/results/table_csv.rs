//! Derived tables' rows as CSV files beside `runs.csv` (tree_vs_ring, softmax, the
//! FlashAttention IO counts, the generations): one writer and one reader for any serde
//! row type, written atomically. O(rows).

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::results::durable::write_atomic;

/// `rows` as CSV text, a header line first.
pub fn csv_text<T: Serialize>(rows: &[T]) -> Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in rows {
        w.serialize(r)
            .map_err(|e| Error::Runtime(format!("writing CSV: {e}")))?;
    }
    let bytes = w
        .into_inner()
        .map_err(|e| Error::Runtime(format!("writing CSV: {e}")))?;
    String::from_utf8(bytes).map_err(|e| Error::Runtime(format!("writing CSV: {e}")))
}

pub(crate) fn write_csv<T: Serialize>(dir: &Path, name: &str, rows: &[T]) -> Result<PathBuf> {
    let p = dir.join(name);
    write_atomic(&p, csv_text(rows)?.as_bytes())?;
    Ok(p)
}

/// The rows of `dir/name` (an error naming the file when it is missing or bad).
pub(crate) fn read_csv<T: DeserializeOwned>(dir: &Path, name: &str) -> Result<Vec<T>> {
    let p = dir.join(name);
    let bad = |e: &dyn std::fmt::Display| Error::Usage(format!("{}: {e}", p.display()));
    let mut r = csv::Reader::from_path(&p).map_err(|e| bad(&e))?;
    r.deserialize()
        .map(|row| row.map_err(|e| bad(&e)))
        .collect()
}
