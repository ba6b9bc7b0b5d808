//! `attnbench report`: tables, plots and derived files from a results directory
//! (`crate::report::generate`).

use clap::builder::PossibleValue;
use clap::{Args, ValueEnum};
use std::path::PathBuf;

use crate::report::plot::Format;

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A results directory (holding runs.csv and, optionally, meta.json).
    #[arg(value_name = "RESULTS_DIR")]
    pub dir: PathBuf,
    /// Plot formats, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "png,svg")]
    pub format: Vec<Format>,
    /// Output directory [default: RESULTS_DIR/report].
    #[arg(long, short = 'o', value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// The variant the summary compares every other with [default: the run's `[report]
    /// reference`, else naive, else the first variant with timed rows].
    #[arg(long, value_name = "VARIANT")]
    pub reference: Option<String>,
}

/// The plot formats as command-line values (`png`, `svg`).
impl ValueEnum for Format {
    fn value_variants<'a>() -> &'a [Self] {
        &[Format::Png, Format::Svg]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.ext()))
    }
}

pub fn command(a: &ReportArgs) -> crate::error::Result<()> {
    let dir = if a.dir.is_file() {
        a.dir.parent().unwrap_or(&a.dir)
    } else {
        &a.dir
    };
    if crate::results::durable::being_written(dir) {
        eprintln!(
            "note: a sweep is writing {} now: this report shows the rows written so far; report again when it finishes",
            dir.display()
        );
    }
    crate::report::generate::run(&a.dir, a.out.as_deref(), &a.format, a.reference.as_deref())
}
