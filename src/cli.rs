//! The command line (clap derive): `sweep`, `run`, `list`. Parsing only; each command's
//! work lives in its own module (`sweep`, `single`, `listing`).

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

use crate::config;
use crate::problem::{DType, Device, InputDist, Mode, UpstreamGrad};
use crate::sim::plan::Allreduce;
use crate::variant::VariantId;

#[derive(Debug, Parser)]
#[command(
    name = "attnbench",
    version,
    about = "Benchmark exact attention algorithms: runtime, memory overhead and error against an f64 oracle",
    long_about = "Benchmark exact attention algorithms (naive, Rabe-Staats chunked, FlashAttention-style \
                  tiled online softmax, ...): runtime, memory overhead beyond inputs and outputs, and \
                  max-abs error against an f64 oracle, swept over sequence length, chunk sizes, heads \
                  and precision. Results go to CSV (one row per case) with a meta.json beside it.\n\n\
                  Exit codes: 0 ok, 1 runtime failure, 2 usage or config error, 130 interrupted."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run every case of a config's grid and write DIR/runs.csv and DIR/meta.json.
    Sweep(SweepArgs),
    /// Run one case and print it as a table (the same fields as a CSV row).
    Run(Box<RunArgs>),
    /// List variants, devices and dtypes, and what is available on this machine.
    List,
}

#[derive(Debug, Args)]
pub struct SweepArgs {
    /// The sweep config (TOML); see README "Config reference".
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: PathBuf,
    /// Output directory [default: results/<run name>].
    #[arg(long, short = 'o', value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Override an axis or a [run] key: `seq_len=1024,2048`, `seq_len=pow2:8:12`,
    /// `run.max_time_s=0.5`. Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUES")]
    pub sets: Vec<String>,
    /// Print the number of cases and the grid, run nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Continue an interrupted sweep: skip cases already in DIR/runs.csv.
    #[arg(long, conflicts_with = "force")]
    pub resume: bool,
    /// Replace the results already in DIR (runs.csv and meta.json are deleted first).
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Variant name (see `attnbench list`).
    #[arg(long, short = 'v')]
    pub variant: VariantId,
    /// Query sequence length (and key/value length unless --seq-kv is given).
    #[arg(long, short = 'n')]
    pub seq_len: usize,
    /// Key/value sequence length [default: --seq-len].
    #[arg(long)]
    pub seq_kv: Option<usize>,
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    #[arg(long, default_value_t = 1)]
    pub heads: usize,
    /// Key/value heads, for GQA/MQA [default: --heads].
    #[arg(long)]
    pub kv_heads: Option<usize>,
    #[arg(long, short = 'd', default_value_t = 64)]
    pub head_dim: usize,
    /// Storage dtype of Q, K, V: f32, bf16, f16 (with --inputs: taken from the files).
    #[arg(long)]
    pub dtype: Option<DType>,
    #[arg(long, default_value = "cpu")]
    pub device: Device,
    /// What to measure: fwd, fwd+bwd (forward and backward, gradients checked too), or
    /// decode (--seq-len new queries against a cache of --seq-kv keys).
    #[arg(long, default_value = "fwd")]
    pub mode: Mode,
    /// Sliding window: each query attends to the last N keys up to its causal bound.
    #[arg(long, value_name = "N")]
    pub window: Option<usize>,
    /// Simulated devices the sequence is sharded over (ring-*, stripe-*, tree-* variants).
    #[arg(long, default_value_t = 1)]
    pub devices: usize,
    /// Split-KV parts of flash-decoding [default: enough for the threads].
    #[arg(long)]
    pub splits: Option<usize>,
    /// Allreduce algorithm of tree-decode: ring, tree, two-level, two-level:N [default: tree].
    #[arg(long)]
    pub allreduce: Option<Allreduce>,
    /// Upstream gradient dO of fwd+bwd: random (seeded N(0,1)) or ones (grad of sum(out)).
    #[arg(long, default_value = "random")]
    pub d_out: UpstreamGrad,
    /// Causal mask, bottom-right aligned when seq_q != seq_kv.
    #[arg(long)]
    pub causal: bool,
    /// Query chunk (tile) size [default: the variant's].
    #[arg(long)]
    pub q_chunk: Option<usize>,
    /// Key/value chunk (tile) size [default: the variant's].
    #[arg(long)]
    pub kv_chunk: Option<usize>,
    /// Worker threads [default: all logical CPUs].
    #[arg(long)]
    pub threads: Option<usize>,
    #[arg(long, default_value = "normal")]
    pub input_dist: InputDist,
    /// Multiplies generated Q and K (scores scale by its square).
    #[arg(long, default_value_t = 1.0)]
    pub input_scale: f64,
    #[arg(long, default_value_t = config::DEFAULT_SEED)]
    pub seed: u64,
    /// Untimed calls before timing.
    #[arg(long, default_value_t = config::DEFAULT_WARMUP)]
    pub warmup: usize,
    #[arg(long, default_value_t = config::DEFAULT_MIN_REPS)]
    pub min_reps: usize,
    #[arg(long, default_value_t = config::DEFAULT_MAX_REPS)]
    pub max_reps: usize,
    /// Time cap for the timed repetitions, in seconds.
    #[arg(long, default_value_t = config::DEFAULT_MAX_TIME_S)]
    pub max_time_s: f64,
    /// Emulated device memory, e.g. 8GiB: larger cases are `oom`.
    #[arg(long)]
    pub memory_budget: Option<String>,
    /// Query rows sampled for the error when checking all rows is too costly.
    #[arg(long, default_value_t = config::DEFAULT_ERROR_ROWS)]
    pub error_rows: usize,
    /// Load q.npy, k.npy, v.npy from DIR ([batch, heads, seq, head_dim]; f32, f16,
    /// bf16 as u16 bits, or f64) instead of generating inputs.
    #[arg(long, value_name = "DIR")]
    pub inputs: Option<PathBuf>,
    /// Write the inputs used to DIR as q.npy, k.npy, v.npy.
    #[arg(long, value_name = "DIR")]
    pub save_inputs: Option<PathBuf>,
    /// Write the output (f32, [batch, heads, seq_q, head_dim]) to FILE.npy.
    #[arg(long, value_name = "FILE")]
    pub save_output: Option<PathBuf>,
}

/// Runs a parsed command line.
pub fn dispatch(cli: &Cli) -> crate::error::Result<()> {
    match &cli.command {
        Command::Sweep(a) => crate::sweep::sweep(a),
        Command::Run(a) => crate::single::run(a),
        Command::List => {
            print!("{}", crate::listing::list());
            Ok(())
        }
    }
}
