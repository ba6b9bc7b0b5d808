//! The command line (clap derive): the subcommands and their dispatch. Each command owns
//! its arguments and its work (`crate::commands`).

use clap::{Parser, Subcommand};

use crate::commands::ab::AbArgs;
use crate::commands::compare::CompareArgs;
use crate::commands::list::ListArgs;
use crate::commands::model::ModelCommand;
use crate::commands::report::ReportArgs;
use crate::commands::reproduce::ReproduceArgs;
use crate::commands::run::RunArgs;
use crate::commands::sweep::SweepArgs;

#[derive(Debug, Parser)]
#[command(
    name = "attnbench",
    version,
    about = "Benchmark exact attention algorithms: runtime, memory overhead and error against an f64 oracle",
    long_about = "Benchmark exact attention algorithms (naive, Rabe-Staats chunked, FlashAttention-style \
                  tiled online softmax, ...): runtime, memory overhead beyond inputs and outputs, and \
                  max-abs error against an f64 oracle, swept over sequence length, chunk sizes, heads \
                  and precision. Results go to CSV (one row per case) with a meta.json beside it.\n\n\
                  Exit codes: 0 ok, 1 runtime failure, 2 usage or config error, 130 interrupted; \
                  `compare`: 3 regression found, 4 only unclear verdicts with --fail-on-unclear; \
                  `reproduce`: 3 a paper's claim failed."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run every case of a config's grid and write DIR/runs.csv and DIR/meta.json.
    Sweep(SweepArgs),
    /// Run one case and print it as a table with units, or with --json every CSV column as
    /// one JSON object.
    Run(Box<RunArgs>),
    /// Tables (tables.md), plots and derived checks from a results directory's runs.csv and
    /// meta.json alone.
    Report(ReportArgs),
    /// Regenerate every reproduced paper table (or those of the PAPERs named) from its
    /// config into results/papers/, then judge each claim of docs/papers.md: PASS, FAIL or
    /// TREND, written to <paper>/claims.md. Exit code 0 every claim holds, 3 a claim failed
    /// or lacks its rows.
    Reproduce(ReproduceArgs),
    /// List variants, devices and dtypes, and what is available on this machine.
    List(ListArgs),
    /// Compare two runs case by case (CI regression gate): time, memory and error. Exit code
    /// 0 no regression, 3 regression found, 4 only unclear verdicts with --fail-on-unclear.
    Compare(CompareArgs),
    /// Time this build against another build in the same run, alternating between the two
    /// case by case (the CI time gate). Exit code 0 no kernel slower, 3 a kernel slower or a
    /// case that only the current build fails.
    Ab(Box<AbArgs>),
    /// Serve cases over the worker protocol (JSON lines on stdin/stdout) until stdin
    /// closes: how `ab` drives a build, and how a sweep runs a C-ABI plugin (`--plugin`).
    Worker(WorkerArgs),
    /// Analytic models from the papers (no measurement).
    #[command(subcommand)]
    Model(ModelCommand),
}

#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// Serve this C-ABI plugin (include/attnbench.h) call by call, for a sweep's
    /// `plugin:NAME` cases (docs/reference/worker-protocol.md).
    #[arg(long, value_name = "LIBRARY")]
    pub plugin: Option<std::path::PathBuf>,
}

/// The command line of this process, parsed; bad input ends the process with clap's
/// message and exit code 2.
pub fn parse() -> Cli {
    <Cli as clap::Parser>::parse()
}

/// Runs a parsed command line and returns the exit code: 0, or `compare`'s and `ab`'s
/// verdict (3, 4).
pub fn dispatch(cli: &Cli) -> crate::error::Result<i32> {
    use crate::commands;
    match &cli.command {
        Command::Sweep(a) => commands::sweep::command(a),
        Command::Run(a) => commands::run::command(a),
        Command::Report(a) => commands::report::command(a),
        Command::List(a) => commands::list::command(a),
        Command::Model(m) => commands::model::command(m),
        Command::Compare(a) => return commands::compare::command(a),
        Command::Ab(a) => return commands::ab::command(a),
        Command::Reproduce(a) => return commands::reproduce::command(a),
        Command::Worker(a) => {
            crate::run::serve::prepare(a.plugin.as_deref());
            let stdin = std::io::stdin().lock();
            crate::run::serve::serve(stdin, std::io::stdout().lock(), a.plugin.as_deref())
        }
    }
    .map(|()| 0)
}
