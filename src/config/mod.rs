//! The sweep config: a TOML file (`[run]`, `[axes]`, `[[zip]]`, `[report]`, `[model]`,
//! `[plugins]`, `[python]`), `--set` overrides, checks
//! that name the key and line of every mistake, and the expansion of the axes into `Case`s.
//!
//! Loading is: parse the file against the schema (toml reports syntax errors and unknown
//! keys with their line) -> apply `--set`s to the raw table -> check every value and fill
//! defaults (`run.rs`, `axes.rs`). The stored `Config` is resolved: defaults filled and pow2
//! ranges expanded, which is what `meta.json` records.

mod axis;
pub mod expand;
mod externals;
mod grid;
mod model;
mod overrides;
pub mod paper;
mod report;
mod run;
mod schema;
mod size;
mod source;

use serde::Serialize;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

pub use axis::{Axis, AxisValue};
pub use grid::{Axes, ZipGroup};
pub use model::{CheckShape, ComputeSpec, ModelConfig};
pub use overrides::apply_set;
pub use report::ReportConfig;
pub use run::{
    default_threads, threads_refused, RunConfig, DEFAULT_ERROR_ROWS, DEFAULT_EXTRAPOLATE_Q_CHUNKS,
    DEFAULT_MAX_REPS, DEFAULT_MAX_TIME_S, DEFAULT_MIN_REPS, DEFAULT_REL_SPREAD, DEFAULT_SEED,
    DEFAULT_WARMUP, DEFAULT_WARMUP_S, MAX_TIMING_S,
};
pub use size::ByteSize;

use crate::error::{Error, Result};
use crate::problem::{Case, ExternalKind, Externals};
use schema::RawConfig;
use source::Source;

/// A checked, resolved sweep config.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Config {
    pub run: RunConfig,
    pub axes: Axes,
    pub zip: Vec<ZipGroup>,
    pub report: ReportConfig,
    /// `[model]`: the Ring-vs-Tree decode model written beside the results, if asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelConfig>,
    /// `[plugins]` and `[python]`: the external implementations the `variant` axis may name.
    #[serde(skip_serializing_if = "Externals::is_empty")]
    pub externals: Externals,
    #[serde(skip)]
    pub path: PathBuf,
}

impl Config {
    /// Read `path`, apply `sets` (`KEY=VALUES`), check, resolve.
    pub fn load(path: &Path, sets: &[String]) -> Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Config {
            path: path.to_path_buf(),
            msg: format!("cannot read the file: {e}"),
        })?;
        Config::from_str(&text, path, sets)
    }

    /// As `load`, from text already read (`path` is only for messages and `self.path`).
    pub fn from_str(text: &str, path: &Path, sets: &[String]) -> Result<Config> {
        let mut src = Source {
            path,
            text,
            overridden: BTreeSet::new(),
        };
        // The file alone against the schema first, so its errors carry file lines.
        toml::from_str::<RawConfig>(text).map_err(|e| src.toml_err(&e))?;
        let mut table: toml::Table = toml::from_str(text).map_err(|e| src.toml_err(&e))?;
        for set in sets {
            src.overridden.insert(apply_set(&mut table, set)?);
        }
        let raw: RawConfig = toml::Value::Table(table)
            .try_into()
            .map_err(|e| src.config_err(format!("after --set: {e}")))?;
        let run = run::resolve_run(raw.run, &src)?;
        let (axes, zip) = grid::resolve_axes(raw.axes, raw.zip, &run, &src)?;
        let report = report::resolve_report(raw.report, &src)?;
        let model = model::resolve_model(raw.model, &src)?;
        let externals = externals::resolve_externals(raw.plugins, raw.python, &src)?;
        let mut config = Config {
            run,
            axes,
            zip,
            report,
            model,
            externals,
            path: path.to_path_buf(),
        };
        config.check_external_names(&src)?;
        config.check_reference(&src)?;
        config.resolve_budget_rule(&src)?;
        Ok(config)
    }

    /// `memory_budget = "bpt-rule"`: the budget of which the training state of the
    /// config's `model_layers` layers is the paper's 3B share of an A100
    /// (`model::bpt_memory::rule_budget`), for the one hidden size of its layer cases.
    fn resolve_budget_rule(&mut self, src: &Source) -> Result<()> {
        let Some(layers) = self
            .run
            .model_layers
            .filter(|_| self.run.memory_budget_rule)
        else {
            return Ok(());
        };
        let mut hidden: Vec<usize> = self
            .expand()
            .iter()
            .filter(|c| c.mode.is_layer())
            .map(Case::hidden)
            .collect();
        hidden.sort_unstable();
        hidden.dedup();
        let err = |msg: String| Err(src.err(source::Section::Run, "memory_budget", msg));
        let h = match hidden[..] {
            [h] => h,
            [] => return err(format!("\"{}\" sizes the budget of layer cases; the grid has none (mode layer-fwd or layer-train)", run::BUDGET_RULE)),
            _ => return err(format!("\"{}\" needs one hidden size (heads x head_dim) for the budget; the grid has {hidden:?}", run::BUDGET_RULE)),
        };
        let state = crate::problem::layer_state_bytes(h, layers);
        self.run.memory_budget = Some(ByteSize(crate::model::bpt_memory::rule_budget(state)));
        Ok(())
    }

    /// The cartesian product of the axes (each zip group one axis), as cases in expansion
    /// order (variant outermost, seq_len innermost), duplicates after normalization dropped,
    /// combinations a variant does not have left out (`Config::expansion` counts them).
    pub fn expand(&self) -> Vec<Case> {
        self.expansion().cases
    }

    /// `expand`, with the combinations it left out (`variant::impossible`) per variant.
    pub fn expansion(&self) -> expand::Expansion {
        expand::expand(
            &self.axes,
            &self.zip,
            self.run.seed,
            self.run.threads,
            &self.run.innermost,
        )
    }

    /// Every `plugin:NAME` and `python:NAME` the variant axes give is defined by a table.
    fn check_external_names(&self, src: &Source) -> Result<()> {
        let places = std::iter::once((source::Section::Axes, self.axes.get(Axis::Variant))).chain(
            self.zip
                .iter()
                .enumerate()
                .map(|(i, g)| (source::Section::Zip(i), g.get(Axis::Variant))),
        );
        for (section, values) in places {
            for value in values.unwrap_or_default() {
                let AxisValue::External(name) = *value else {
                    continue;
                };
                if self.externals.contains_key(name) {
                    continue;
                }
                let (kind, short) =
                    ExternalKind::split(name).unwrap_or((ExternalKind::Plugin, name));
                let defined: Vec<&str> = self.externals.keys().map(String::as_str).collect();
                return Err(src.err(
                    section,
                    "variant",
                    format!(
                        "`{name}` is not defined: add it to [{}] ({short} = ...){}",
                        kind.table(),
                        if defined.is_empty() {
                            String::new()
                        } else {
                            format!("; defined: {}", defined.join(", "))
                        }
                    ),
                ));
            }
        }
        Ok(())
    }

    /// `[report] reference` names a variant the grid runs.
    fn check_reference(&self, src: &Source) -> Result<()> {
        let Some(reference) = &self.report.reference else {
            return Ok(());
        };
        let names: Vec<String> = std::iter::once(self.axes.get(Axis::Variant))
            .chain(self.zip.iter().map(|g| g.get(Axis::Variant)))
            .flat_map(|values| values.unwrap_or_default())
            .map(|v| v.to_string())
            .collect();
        if names.iter().any(|n| n == reference) {
            return Ok(());
        }
        Err(src.err(
            source::Section::Report,
            "reference",
            format!(
                "`{reference}` is not a variant of the grid (it has: {})",
                names.join(", ")
            ),
        ))
    }

    /// (axis name, values as shown) for `--dry-run`.
    pub fn grid_summary(&self) -> Vec<(String, String)> {
        expand::grid_summary(&self.axes, &self.zip, &self.run)
    }
}

#[cfg(test)]
mod tests;
