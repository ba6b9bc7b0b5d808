//! Loading one side of a comparison: `runs.csv` (strictly: a malformed row is an error naming
//! the file and the row), `samples.csv` and `meta.json` beside it when present. Reads the CSV
//! files only, so runs made elsewhere compare the same way. Cost: O(rows + samples).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{CSV_NAME, META_NAME, SAMPLES_NAME};
use crate::error::{Error, Result};
use crate::results::record::Record;
use crate::results::samples::read_samples;

/// What `compare` needs from `meta.json`: the machine and its calibration. Parsed leniently
/// (other keys ignored) so runs of other attnbench versions still compare.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct RunMeta {
    #[serde(default)]
    pub cpu_model: Option<String>,
    #[serde(default)]
    pub cpu_id: Option<String>,
    #[serde(default)]
    pub cpu_kernel_path: Option<String>,
    #[serde(default)]
    pub logical_cpus: Option<usize>,
    #[serde(default)]
    pub git_revision: Option<String>,
    #[serde(default)]
    pub git_dirty: Option<bool>,
    #[serde(default)]
    pub calibration: Vec<CalibrationEntry>,
}

/// One calibration of `meta.json` (see `measure::calibrate::Calibration`).
#[derive(Clone, Debug, Deserialize)]
pub struct CalibrationEntry {
    pub threads: usize,
    pub sgemm_gflops: f64,
    #[serde(default)]
    pub kernel_isa: String,
}

impl RunMeta {
    /// The CPU kernel path of the run: `cpu_kernel_path`, else (runs made before it was
    /// recorded) the path its calibration was measured with; None when neither says.
    pub fn kernel_path(&self) -> Option<&str> {
        self.cpu_kernel_path.as_deref().or_else(|| {
            self.calibration
                .iter()
                .map(|c| c.kernel_isa.as_str())
                .find(|k| !k.is_empty())
        })
    }
}

/// One side of the comparison.
#[derive(Clone, Debug)]
pub struct Run {
    /// The path as the user gave it (for messages).
    pub label: String,
    pub csv_path: PathBuf,
    /// Rows in file order; case ids are unique.
    pub records: Vec<Record>,
    /// Per case, the seconds of each timed repetition; `None` without `samples.csv`.
    pub samples: Option<HashMap<String, Vec<f64>>>,
    pub meta: Option<RunMeta>,
    pub meta_path: PathBuf,
    /// Said to the user when loading left something out (a CSV not named `runs.csv`).
    pub note: Option<String>,
}

/// Loads a results directory, or a `runs.csv` file with its neighbours (a CSV of another
/// name alone). `role` ("baseline", "current") names the argument in messages.
pub fn load(path: &Path, role: &str) -> Result<Run> {
    let (dir, csv_path) = if path.is_dir() {
        (path.to_path_buf(), path.join(CSV_NAME))
    } else if path.is_file() {
        let dir = path
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        (dir, path.to_path_buf())
    } else {
        return Err(Error::Usage(format!(
            "{role} {}: no such results directory or runs.csv file",
            path.display()
        )));
    };
    if !csv_path.is_file() {
        return Err(Error::Usage(format!(
            "{role} {}: no {CSV_NAME} in this directory (is it the output of `attnbench sweep`?)",
            path.display()
        )));
    }
    let file = std::fs::File::open(&csv_path).map_err(|e| Error::Input {
        path: csv_path.clone(),
        msg: e.to_string(),
    })?;
    super::load::check_columns(&csv_path, file)?;
    let records = super::runs::read(&csv_path)?;
    if records.is_empty() {
        // Nothing to compare against would pass every gate.
        return Err(Error::Input {
            path: csv_path,
            msg: format!("{role}: no rows: the header is there but no case was recorded"),
        });
    }
    // A CSV under another name (a copy kept before a rerun) is not what the samples.csv and
    // meta.json beside it describe: they belong to that directory's runs.csv.
    let own_neighbours = csv_path.file_name() == Some(CSV_NAME.as_ref());
    let note = (!own_neighbours).then(|| {
        format!(
            "{role} {} is not named {CSV_NAME}: the {SAMPLES_NAME} and {META_NAME} beside it \
             are not read (they belong to that directory's {CSV_NAME}), so its times are \
             unclear and its machine unknown",
            path.display()
        )
    });
    let samples_path = dir.join(SAMPLES_NAME);
    let samples = if own_neighbours && samples_path.is_file() {
        Some(read_samples(&samples_path)?)
    } else {
        None
    };
    let meta_path = dir.join(META_NAME);
    let meta = if own_neighbours && meta_path.is_file() {
        Some(read_meta(&meta_path)?)
    } else {
        None
    };
    Ok(Run {
        label: path.display().to_string(),
        csv_path,
        records,
        samples,
        meta,
        meta_path,
        note,
    })
}

impl Run {
    /// Keeps only the rows of `variant`, renamed `as_name` (their `variant`, the first
    /// field of their `case_id`, and their samples' keys), so that two variants of one run,
    /// or of two runs, meet case by case: `compare --pair BASE=CUR` (one build of a kernel
    /// against another timed in the same run, or yours against a peer). The ids drop what
    /// is each variant's own (chunks, split count, allreduce), so a chunked variant meets
    /// one that does not chunk. An error when no row has that variant.
    pub fn only_variant(&mut self, variant: &str, as_name: &str) -> Result<()> {
        let rename = |id: &str| {
            let mut parts: Vec<&str> = id.split('|').collect();
            if parts.len() < 2 {
                return id.to_string();
            }
            parts[0] = as_name;
            if let Some(chunks) = parts.get_mut(7).filter(|p| p.starts_with("qc")) {
                *chunks = "qc-kc-";
            }
            parts.retain(|p| !(["sp", "ar", "pg", "pc"].iter().any(|x| p.starts_with(x))));
            parts.join("|")
        };
        let found: Vec<&str> = {
            let mut v: Vec<&str> = self.records.iter().map(|r| r.variant.as_str()).collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        if !found.contains(&variant) {
            return Err(Error::Usage(format!(
                "--pair: {} has no rows of variant `{variant}` (it has: {})",
                self.label,
                found.join(", ")
            )));
        }
        self.records.retain(|r| r.variant == variant);
        if let Some(samples) = self.samples.take() {
            let ids: std::collections::HashSet<&str> =
                self.records.iter().map(|r| r.case_id.as_str()).collect();
            self.samples = Some(
                samples
                    .into_iter()
                    .filter(|(id, _)| ids.contains(id.as_str()))
                    .map(|(id, s)| (rename(&id), s))
                    .collect(),
            );
        }
        let mut seen = std::collections::HashMap::new();
        for r in &mut self.records {
            let original = std::mem::take(&mut r.case_id);
            r.case_id = rename(&original);
            r.variant = as_name.to_string();
            if let Some(other) = seen.insert(r.case_id.clone(), original.clone()) {
                return Err(Error::Usage(format!(
                    "--pair: {} has two rows of `{variant}` that differ only in settings of the \
                     variant's own (chunks, splits, pages): `{other}` and `{original}`; \
                     pair runs of one setting each",
                    self.label
                )));
            }
        }
        self.label = format!("{} ({variant})", self.label);
        Ok(())
    }
}

fn read_meta(path: &Path) -> Result<RunMeta> {
    let bad = |msg: String| Error::Input {
        path: path.to_path_buf(),
        msg,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| bad(e.to_string()))
}
