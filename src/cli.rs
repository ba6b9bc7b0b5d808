//! The command line (clap derive): `sweep`, `run`, `report`, `compare`, `list`, `model`.
//! Parsing only; each command's work lives in its own module (`sweep`, `single`,
//! `report::generate`, `compare`, `listing`, `model`).

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

use crate::compare::normalize::Normalize;
use crate::config;
use crate::config::ByteSize;
use crate::problem::VariantId;
use crate::problem::{DType, Device, InputDist, Mode, UpstreamGrad};
use crate::report::plot::Format;
use crate::sim::plan::Allreduce;

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
                  `compare`: 3 regression found, 4 only unclear verdicts with --fail-on-unclear."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// Print only the CPU kernel path this machine runs (avx512-bf16, avx512, avx2 or
    /// portable), e.g. to pick the CI baseline measured on the same path.
    #[arg(long)]
    pub kernel_path: bool,
    /// Print only this machine's key: CPU vendor, family, model and kernel path (e.g.
    /// intel-6-85-avx512), the name of its CI baseline directory.
    #[arg(long, conflicts_with = "kernel_path")]
    pub machine_key: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run every case of a config's grid and write DIR/runs.csv and DIR/meta.json.
    Sweep(SweepArgs),
    /// Run one case and print it as a table (the same fields as a CSV row).
    Run(Box<RunArgs>),
    /// Tables (tables.md), plots and derived checks from a results directory's runs.csv and
    /// meta.json alone.
    Report(ReportArgs),
    /// List variants, devices and dtypes, and what is available on this machine.
    List(ListArgs),
    /// Compare two runs case by case (CI regression gate): time, memory and error. Exit code
    /// 0 no regression, 3 regression found, 4 only unclear verdicts with --fail-on-unclear.
    Compare(CompareArgs),
    /// Time this build against another build in the same run, alternating between the two
    /// case by case (the CI time gate). Exit code 0 no kernel slower, 3 a kernel slower or a
    /// case that only the current build fails.
    Ab(Box<crate::ab::AbArgs>),
    /// Serve cases over the worker protocol (JSON lines on stdin/stdout) until stdin
    /// closes: how `ab` drives a build.
    Worker,
    /// Analytic models from the papers (no measurement).
    #[command(subcommand)]
    Model(ModelCommand),
}

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

#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// BPT Sec. 3.1: activation memory per layer for vanilla, memory-efficient and BPT
    /// layers, a whole-model estimate, and the largest context that fits a device.
    BptMemory(BptMemoryArgs),
    /// Fit the α–β link model (latency α, bandwidth β) to measured MPI runs: reads the
    /// runs.csv of each DIR, prints predicted vs measured communication, writes fit.md and
    /// fit.json to --out.
    Fit(FitArgs),
}

#[derive(Debug, Args)]
pub struct FitArgs {
    /// Results directories of MPI sweeps (each holding runs.csv).
    #[arg(required = true, value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
    /// Write fit.md and fit.json here.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct BptMemoryArgs {
    /// A model of BPT's Table 1: gpt-1b, gpt-3b, gpt-7b, gpt-13b, gpt-30b, gpt-70b.
    #[arg(long)]
    pub model: String,
    /// Sequence lengths to tabulate (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "8192,16384,32768,65536,131072"
    )]
    pub seq_len: Vec<usize>,
    /// Memory of the device, e.g. 80GB (the paper's A100).
    #[arg(long, default_value = "80GB")]
    pub device_memory: String,
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Block size c of BPT (and of its blockwise loss).
    #[arg(long, default_value_t = 2048)]
    pub block: usize,
    /// Bytes per activation: 2 as Sec. 3.1 assumes, 4 for fp32 (the paper's GPU runs).
    #[arg(long, default_value_t = 4)]
    pub activation_bytes: usize,
}

#[derive(Debug, Args)]
pub struct SweepArgs {
    /// The sweep config (TOML); see README "Config reference".
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: PathBuf,
    /// Output directory [default: results/<run name>].
    #[arg(long, short = 'o', value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Override a key of the config: an axis (`seq_len=1024,2048`, `seq_len=pow2:8:12`), or
    /// a `run.`, `report.` or `model.` key (`run.max_time_s=0.5`). Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUES")]
    pub sets: Vec<String>,
    /// Print the number of cases and the grid, run nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// With --dry-run: print the resolved config, then every case (with its case_id, flops
    /// and io_bytes), one JSON object per line: what the peer scripts (scripts/peers/) read.
    #[arg(long, requires = "dry_run")]
    pub json: bool,
    /// Continue an interrupted sweep: skip cases already in DIR/runs.csv.
    #[arg(long, conflicts_with = "force")]
    pub resume: bool,
    /// Replace the results already in DIR: what a sweep writes there (runs.csv, samples.csv,
    /// meta.json, the derived tables and report/) is deleted first; other files stay.
    #[arg(long)]
    pub force: bool,
    /// Do not write the report (DIR/report/) at the end; `attnbench report DIR` makes it later.
    #[arg(long)]
    pub no_report: bool,
    /// MPI variants: seconds one exchange or collective may take before every rank is
    /// aborted with a message (a rank died, hung or diverged).
    #[arg(long, value_name = "SECONDS", default_value_t = crate::dist::DEFAULT_TIMEOUT_S)]
    pub mpi_timeout: f64,
    /// Test hook: `stall:RANK` (the rank stops answering) or `die:RANK` (it exits) at its
    /// first exchange.
    #[arg(long, value_name = "FAULT", hide = true)]
    pub mpi_test_fault: Option<crate::dist::Fault>,
}

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
}

#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
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
    /// Sequences in the batch.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Query heads.
    #[arg(long, default_value_t = 1)]
    pub heads: usize,
    /// Key/value heads, for GQA/MQA [default: --heads].
    #[arg(long)]
    pub kv_heads: Option<usize>,
    /// Dimension d of each head.
    #[arg(long, short = 'd', default_value_t = 64)]
    pub head_dim: usize,
    /// Storage dtype of Q, K, V: f32, bf16, f16 [default: f32; with --inputs, the files'].
    #[arg(long)]
    pub dtype: Option<DType>,
    /// Where to run: cpu, or cuda (a build with `--features cuda` and an NVIDIA GPU).
    #[arg(long, default_value = "cpu")]
    pub device: Device,
    /// What to measure: fwd, fwd+bwd (forward and backward, gradients checked too), decode
    /// (--seq-len new queries against a cache of --seq-kv keys), or for the layer-* variants
    /// layer-fwd / layer-train (a GPT layer of hidden heads x head-dim; training is
    /// checkpointed).
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
    /// Query chunk (tile) size [default: the variant's; variants that do not chunk, such as
    /// naive, have none and ignore it: see `attnbench list`].
    #[arg(long)]
    pub q_chunk: Option<usize>,
    /// Key/value chunk (tile) size [default: the variant's; ignored as --q-chunk is].
    #[arg(long)]
    pub kv_chunk: Option<usize>,
    /// Worker threads [default: all logical CPUs].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Distribution of the generated inputs: normal (N(0, 1)) or uniform (U[0, 1)).
    #[arg(long, default_value = "normal")]
    pub input_dist: InputDist,
    /// Multiplies generated Q and K (scores scale by its square).
    #[arg(long, default_value_t = 1.0)]
    pub input_scale: f64,
    /// Seed of the generated inputs (the same seed gives the same inputs).
    #[arg(long, default_value_t = config::DEFAULT_SEED)]
    pub seed: u64,
    /// Untimed calls before timing.
    #[arg(long, default_value_t = config::DEFAULT_WARMUP)]
    pub warmup: usize,
    /// Keep warming up (untimed) for at least this many seconds after the --warmup calls.
    #[arg(long, default_value_t = config::DEFAULT_WARMUP_S)]
    pub warmup_s: f64,
    /// Timed calls before the spread may stop the timing (at least 3 for that).
    #[arg(long, default_value_t = config::DEFAULT_MIN_REPS)]
    pub min_reps: usize,
    /// Most timed calls.
    #[arg(long, default_value_t = config::DEFAULT_MAX_REPS)]
    pub max_reps: usize,
    /// Time cap for the timed repetitions, in seconds.
    #[arg(long, default_value_t = config::DEFAULT_MAX_TIME_S)]
    pub max_time_s: f64,
    /// Emulated device memory, e.g. 8GiB: a case predicted to need more is `oom`, not run
    /// [default: unlimited].
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

/// Runs a parsed command line and returns the exit code: 0, or `compare`'s verdict (3, 4).
pub fn dispatch(cli: &Cli) -> crate::error::Result<i32> {
    match &cli.command {
        Command::Sweep(a) => {
            crate::dist::set_timeout(a.mpi_timeout);
            if let Some(f) = a.mpi_test_fault {
                crate::dist::set_fault(f);
            }
            crate::sweep::sweep(a)
        }
        Command::Run(a) => crate::single::run(a),
        Command::Report(a) => crate::report::generate::run(&a.dir, a.out.as_deref(), &a.format),
        Command::List(a) => {
            // Under mpirun, rank 0 speaks for all.
            if crate::dist::is_root() {
                if a.kernel_path {
                    println!("{}", crate::backend::cpu::isa::Isa::detect().name());
                } else if a.machine_key {
                    println!("{}", crate::results::meta::machine_key());
                } else {
                    print!("{}", crate::listing::list());
                }
            }
            Ok(())
        }
        Command::Model(ModelCommand::BptMemory(a)) => bpt_memory(a),
        Command::Model(ModelCommand::Fit(a)) => {
            print!("{}", crate::model::fit::run(&a.dirs, a.out.as_deref())?);
            Ok(())
        }
        Command::Compare(a) => return crate::compare::command(a),
        Command::Ab(a) => return crate::ab::command(a),
        Command::Worker => {
            let stdin = std::io::stdin().lock();
            crate::worker::serve::serve(stdin, std::io::stdout().lock())
        }
    }
    .map(|()| 0)
}

fn bpt_memory(a: &BptMemoryArgs) -> crate::error::Result<()> {
    use crate::error::Error;
    use crate::model::bpt_memory::{GptShape, TABLE1};
    let model = GptShape::by_name(&a.model).ok_or_else(|| {
        let names: Vec<&str> = TABLE1.iter().map(|m| m.name).collect();
        Error::Usage(format!(
            "--model: unknown model `{}` (expected one of: {})",
            a.model,
            names.join(", ")
        ))
    })?;
    let device_bytes = a
        .device_memory
        .parse::<config::ByteSize>()
        .map_err(|e| Error::Usage(format!("--device-memory: {e}")))?
        .bytes();
    if a.batch == 0
        || a.block == 0
        || a.seq_len.contains(&0)
        || !(a.activation_bytes == 2 || a.activation_bytes == 4)
    {
        return Err(Error::Usage(
            "--batch, --block and --seq-len must be at least 1; --activation-bytes is 2 or 4"
                .into(),
        ));
    }
    print!(
        "{}",
        crate::model::bpt_table::render(&crate::model::bpt_table::Query {
            model: &model,
            seq_lens: &a.seq_len,
            batch: a.batch,
            block: a.block,
            act_bytes: a.activation_bytes,
            device_bytes,
        })
    );
    Ok(())
}
