//! `[report]`: what the report joins with the measured rows. `paper_table` names a paper's
//! published table (CSV, see `report::paper`); it is read and checked when the config loads,
//! and the parsed table is part of the resolved config, so `meta.json` carries it and a
//! report needs only the results directory.

use serde::Serialize;
use std::path::Path;
use toml::Value;

use super::schema::RawReport;
use super::source::{Section, Source};
use crate::config::paper::PaperTable;
use crate::error::{Error, Result};

/// Resolved `[report]` table.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ReportConfig {
    /// The path as written in the config.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paper_table: Option<String>,
    /// Its contents, parsed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paper: Option<PaperTable>,
    /// The variant the report's summary compares the others with (`report::summary`); one
    /// of the grid's variants, checked when the config loads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
}

/// Check `[report]` and read the paper table it names. A relative `paper_table` is looked
/// up from the current directory first (configs name repository paths, run from its root),
/// then from the config file's directory.
pub(super) fn resolve_report(raw: Option<RawReport>, src: &Source) -> Result<ReportConfig> {
    let raw = raw.unwrap_or_default();
    let reference = match raw.reference {
        None => None,
        Some(Value::String(s)) if !s.trim().is_empty() => Some(s),
        Some(v) => {
            return Err(src.err(
                Section::Report,
                "reference",
                format!(
                    "expected the name of a variant of the grid, e.g. \"naive\", got {} {v}",
                    v.type_str()
                ),
            ))
        }
    };
    let err = |msg: String| src.err(Section::Report, "paper_table", msg);
    let Some(value) = raw.paper_table else {
        return Ok(ReportConfig {
            reference,
            ..ReportConfig::default()
        });
    };
    let written = match &value {
        Value::String(s) if !s.trim().is_empty() => s.clone(),
        v => {
            return Err(err(format!(
                "expected a path to a paper table CSV, e.g. \"configs/papers/rabe_staats_table2.csv\", got {} {v}",
                v.type_str()
            )))
        }
    };
    let path = src.locate(Path::new(&written)).ok_or_else(|| {
        err(format!(
            "`{written}` not found (looked in the current directory and beside the config)"
        ))
    })?;
    let paper = PaperTable::read(&path).map_err(|e| match e {
        Error::Input { path, msg } => err(format!("{}: {msg}", path.display())),
        other => err(other.to_string()),
    })?;
    Ok(ReportConfig {
        paper_table: Some(written),
        paper: Some(paper),
        reference,
    })
}
