//! `attnbench compare`: two results directories case by case, the CI regression gate
//! (`crate::compare`).

use clap::builder::PossibleValue;
use clap::{Args, ValueEnum};
use std::path::PathBuf;

use crate::compare::normalize::Normalize;
use crate::compare::{self, Options, MAX_BOOTSTRAP, MIN_BOOTSTRAP};
use crate::config::ByteSize;
use crate::error::{Error, Result};
use crate::results::compared::{self, Run};

#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
pub struct CompareArgs {
    /// The reference run: a results directory or its runs.csv.
    #[arg(value_name = "BASELINE")]
    pub baseline: PathBuf,
    /// The run to judge: a results directory or its runs.csv.
    #[arg(value_name = "CURRENT")]
    pub current: PathBuf,
    /// Relative time change that counts: slower when the whole 95% interval of the ratio of
    /// medians is above 1 + T, faster when it is below 1 / (1 + T).
    #[arg(long, default_value_t = 0.10, value_name = "T")]
    pub time_threshold: f64,
    /// Memory overhead increase tolerated beyond the built-in allowance (2 KiB, plus one GEMM
    /// packing buffer per extra thread), e.g. 0, 4096 or 1MiB.
    #[arg(long, default_value = "0", value_name = "BYTES")]
    pub mem_threshold: ByteSize,
    /// Error regression: max_abs_err grew by more than this factor and is above the dtype's
    /// tolerance.
    #[arg(long, default_value_t = 2.0, value_name = "FACTOR")]
    pub err_threshold: f64,
    /// Express times in units of each run's calibrated SGEMM seconds per GFLOP (meta.json), or
    /// of each case's machine-speed probe measured with it (`probe`: divides out a shared
    /// machine's slow stretches case by case), before comparing [default: calibration when
    /// the two runs' machines differ, else none].
    #[arg(long, value_enum)]
    pub normalize: Option<Normalize>,
    /// Exit 4 when some time verdicts are unclear (and nothing regressed).
    #[arg(long)]
    pub fail_on_unclear: bool,
    /// Show the time verdicts but let none of them fail the comparison: for a baseline
    /// measured at another hour or on another machine, where `attnbench ab` (both builds
    /// timed in one run) gates time instead. Memory, error and status still gate.
    #[arg(long, conflicts_with = "fail_on_unclear")]
    pub no_time_gate: bool,
    /// Compare the rows of variant BASE in BASELINE with those of variant CUR in CURRENT,
    /// case by case (BASELINE and CURRENT may be one run; chunk sizes and split counts, each
    /// variant's own, are not matched): two builds of your kernel timed interleaved in one
    /// sweep (`--pair plugin:base=plugin:head`), or yours against a peer
    /// (`--pair flash=plugin:mine`).
    #[arg(long, value_name = "BASE=CUR")]
    pub pair: Option<String>,
    /// Print the comparison as JSON instead of Markdown.
    #[arg(long)]
    pub json: bool,
    /// Bootstrap resamples per case for the interval.
    #[arg(long, default_value_t = 2000, value_name = "N")]
    pub bootstrap: usize,
    /// Seed of the bootstrap's random numbers (the verdicts are deterministic for a seed).
    #[arg(long, default_value_t = 0, value_name = "S")]
    pub seed: u64,
}

/// The normalizations as command-line values.
impl ValueEnum for Normalize {
    fn value_variants<'a>() -> &'a [Self] {
        &Normalize::ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.name()).help(self.help()))
    }
}

/// The `compare` command: load, compare, print, and return the exit code.
pub fn command(args: &CompareArgs) -> Result<i32> {
    let opts = options(args)?;
    let mut baseline = compared::load(&args.baseline, "baseline")?;
    let mut current = compared::load(&args.current, "current")?;
    if let Some(pair) = &args.pair {
        let (base, cur) = pair
            .split_once('=')
            .filter(|(b, c)| !b.is_empty() && !c.is_empty())
            .ok_or_else(|| {
                Error::Usage(format!(
                    "--pair: expected BASE=CUR, two variant names, e.g. plugin:base=plugin:head, got `{pair}`"
                ))
            })?;
        baseline.only_variant(base, cur)?;
        current.only_variant(cur, cur)?;
    }
    for note in [&baseline.note, &current.note].into_iter().flatten() {
        eprintln!("note: {note}");
    }
    let file = |r: &Run| r.csv_path.canonicalize().ok();
    if args.pair.is_none() && file(&baseline).is_some_and(|b| file(&current) == Some(b)) {
        eprintln!(
            "note: the baseline and the current run are the same file ({}): every case \
             compares with itself",
            current.csv_path.display()
        );
    }
    let c = compare::compare(&baseline, &current, &opts)?;
    if args.json {
        println!("{}", compare::render::json(&c)?);
    } else {
        print!("{}", compare::render::markdown(&c));
    }
    Ok(c.exit_code)
}

/// The comparison's options from the flags, checked.
fn options(a: &CompareArgs) -> Result<Options> {
    if !(a.time_threshold.is_finite() && a.time_threshold > 0.0) {
        return Err(Error::Usage(format!(
            "--time-threshold must be a positive fraction such as 0.10, got {}",
            a.time_threshold
        )));
    }
    if !(a.err_threshold.is_finite() && a.err_threshold >= 1.0) {
        return Err(Error::Usage(format!(
            "--err-threshold must be a growth factor >= 1 such as 2, got {}",
            a.err_threshold
        )));
    }
    if !(MIN_BOOTSTRAP..=MAX_BOOTSTRAP).contains(&a.bootstrap) {
        return Err(Error::Usage(format!(
            "--bootstrap must be from {MIN_BOOTSTRAP} to {MAX_BOOTSTRAP} resamples, got {}",
            a.bootstrap
        )));
    }
    Ok(Options {
        time_threshold: a.time_threshold,
        mem_threshold_bytes: a.mem_threshold.bytes(),
        err_factor: a.err_threshold,
        normalize: a.normalize,
        fail_on_unclear: a.fail_on_unclear,
        time_gate: !a.no_time_gate,
        bootstrap: a.bootstrap,
        seed: a.seed,
    })
}
