//! `attnbench run`: one case from flags, measured like a sweep case and printed as a
//! grouped table with units, or with `--json` as one JSON object of every CSV column; NumPy
//! interop (`--inputs`, `--save-inputs`, `--save-output`). A case that cannot run here (a
//! sweep's `skipped` row) is an error, exit 2; `oom` by the budget and `error` (e.g. an
//! overflowing softmax) are results, printed with their reason.

use crate::backend::cpu::isa::Isa;
use crate::config::{self, ByteSize};
use crate::error::{Error, Result};
use crate::measure::timer::StopRule;
use crate::npy;
use crate::problem::{
    Allreduce, Case, DType, Device, Fp8Format, InputDist, Mode, Precision, Shape, UpstreamGrad,
    VariantId,
};
use crate::report::terminal::record_table;
use crate::results::record::RecordJson;
use crate::run::{run_case, skip_reason, Settings};
use crate::variant::Registry;
use clap::Args;
use std::path::PathBuf;

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
    /// Attention sinks: the first N keys stay visible beside the sliding window (--window).
    #[arg(long, value_name = "N")]
    pub sinks: Option<usize>,
    /// Decode: the batch's requests share their first N cached tokens (batch item 0's keys
    /// and values copied into the others; cascade-decode reads them once for all).
    #[arg(long, value_name = "N")]
    pub prefix_len: Option<usize>,
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
    /// CPU kernel path (amx-bf16, avx512-bf16, avx512, avx2, portable; one this CPU runs)
    /// [default: this CPU's measured choice, `attnbench list`].
    #[arg(long, value_name = "PATH", value_parser = Isa::parse_available)]
    pub kernel_path: Option<Isa>,
    /// Precision of the attention weights P for PV: fast (rounded to the storage dtype
    /// where that is faster: bf16 on avx512-bf16 and amx-bf16) or highest (P kept in f32)
    /// [default: fast].
    #[arg(long, value_name = "PRECISION")]
    pub precision: Option<Precision>,
    /// K and V stored as FP8 (fp8e4m3, fp8e5m2) with one scale per KV head; Q stays in
    /// --dtype (flash-decoding, decode-online, decode-naive) [default: K and V as --dtype].
    #[arg(long, value_name = "FORMAT")]
    pub kv_dtype: Option<Fp8Format>,
    /// Latent dimension d_c of multi-head latent attention's cache (mla-decode; with
    /// --rope-dim).
    #[arg(long)]
    pub latent_dim: Option<usize>,
    /// Decoupled RoPE key dimension d_r of multi-head latent attention (mla-decode; with
    /// --latent-dim).
    #[arg(long)]
    pub rope_dim: Option<usize>,
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
    /// Print the result as one JSON object instead of the table: every CSV column in CSV
    /// order, numbers as numbers, true/false, null for an empty field.
    #[arg(long)]
    pub json: bool,
}

pub fn command(args: &RunArgs) -> Result<()> {
    let usage = |m: String| Error::Usage(m);
    for (flag, v) in [
        ("--seq-len", args.seq_len),
        ("--batch", args.batch),
        ("--heads", args.heads),
        ("--head-dim", args.head_dim),
        ("--min-reps", args.min_reps),
        ("--max-reps", args.max_reps),
        ("--devices", args.devices),
        ("--error-rows", args.error_rows),
    ] {
        if v == 0 {
            return Err(usage(format!("{flag} must be at least 1")));
        }
    }
    for (flag, v) in [
        ("--seq-kv", args.seq_kv),
        ("--kv-heads", args.kv_heads),
        ("--q-chunk", args.q_chunk),
        ("--kv-chunk", args.kv_chunk),
        ("--threads", args.threads),
        ("--window", args.window),
        ("--sinks", args.sinks),
        ("--splits", args.splits),
        ("--prefix-len", args.prefix_len),
    ] {
        if v == Some(0) {
            return Err(usage(format!("{flag} must be at least 1")));
        }
    }
    if let Some(why) = args.threads.and_then(config::threads_refused) {
        return Err(usage(format!("--threads: {why}")));
    }
    if let Some(t) = args.threads {
        warn_oversubscribed(t);
    }
    if args.min_reps > args.max_reps {
        return Err(usage(format!(
            "--min-reps ({}) is larger than --max-reps ({})",
            args.min_reps, args.max_reps
        )));
    }
    // At most a day, as the config's timing keys: past it a typo (1e300) times for ever.
    let max_s = config::MAX_TIMING_S;
    if !(args.max_time_s > 0.0 && args.max_time_s <= max_s) {
        return Err(usage(format!(
            "--max-time-s must be a positive number of seconds, at most {max_s}"
        )));
    }
    if !(args.warmup_s >= 0.0 && args.warmup_s <= max_s) {
        return Err(usage(format!(
            "--warmup-s must be a number of seconds >= 0, at most {max_s}"
        )));
    }
    if !(args.input_scale.is_finite() && args.input_scale >= 0.0) {
        return Err(usage("--input-scale must be a finite number >= 0".into()));
    }
    let memory_budget = args
        .memory_budget
        .as_deref()
        .map(|s| {
            s.parse::<ByteSize>()
                .map_err(|e| usage(format!("--memory-budget: {e}")))
                // A budget of 0 bytes fits no case: refused as the config's is.
                .and_then(|b| match b.bytes() {
                    0 => Err(usage("--memory-budget must be more than 0 bytes".into())),
                    n => Ok(n),
                })
        })
        .transpose()?;

    let mla = mla_of(args)?;
    let shape = Shape {
        batch: args.batch,
        heads: args.heads,
        kv_heads: args.kv_heads.unwrap_or(args.heads),
        seq_q: args.seq_len,
        seq_kv: args.seq_kv.unwrap_or(args.seq_len),
        head_dim: args.head_dim,
    };
    let given = match &args.inputs {
        Some(dir) => {
            let inputs = npy::load_inputs(dir, &shape)?;
            if let Some(d) = args.dtype {
                if d != inputs.dtype() {
                    return Err(usage(format!(
                        "--dtype {d} disagrees with the files in {} (they hold {}); drop --dtype or convert the files",
                        dir.display(),
                        inputs.dtype()
                    )));
                }
            }
            Some(inputs)
        }
        None => None,
    };
    let dtype = given
        .as_ref()
        .map(|i| i.dtype())
        .or(args.dtype)
        .unwrap_or(DType::F32);
    let info = args.variant.info();
    let variant = args.variant.get();
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let clamp =
        |c: Option<usize>, default: Option<usize>, n: usize| default.map(|d| c.unwrap_or(d).min(n));
    let case = Case {
        variant: args.variant,
        mode: args.mode,
        device: args.device,
        dtype,
        shape,
        q_chunk: clamp(args.q_chunk, info.default_q_chunk, shape.seq_q),
        kv_chunk: clamp(args.kv_chunk, info.default_kv_chunk, shape.seq_kv),
        causal: args.causal,
        window: args.window,
        devices: args.devices,
        splits: variant
            .default_splits(&shape, threads)
            .map(|d| args.splits.unwrap_or(d)),
        allreduce: variant
            .default_allreduce()
            .map(|d| args.allreduce.unwrap_or(d)),
        threads,
        input_dist: args.input_dist,
        input_scale: args.input_scale,
        seed: args.seed,
        d_out: args.d_out,
        external: None,
        paging: None,
        prefill_chunk: None,
        batch_spec: None,
        kernel_path: args.kernel_path.filter(|_| args.device == Device::Cpu),
        prefix_len: args.prefix_len,
        kv_dtype: args.kv_dtype,
        mla,
        sinks: args.sinks,
        precision: args.precision,
    };
    let settings = Settings {
        run_name: "run".into(),
        stop: StopRule {
            warmup: args.warmup,
            warmup_s: args.warmup_s,
            min_reps: args.min_reps,
            max_reps: args.max_reps,
            min_time_s: 0.0,
            max_time_s: args.max_time_s,
            rel_spread: config::DEFAULT_REL_SPREAD,
        },
        memory_budget,
        error_rows: args.error_rows,
        extrapolate: None,
        diff_against: None,
        model_layers: None,
        gpu: Default::default(),
        externals: Default::default(),
    };
    // A case that cannot run at all is the command's failure, not a row to read.
    if let Some(reason) = skip_reason(&case) {
        return Err(usage(format!("this case cannot run: {reason}")));
    }
    // Refuse before measuring, not after.
    if let Some(dir) = &args.save_inputs {
        npy::check_inputs_absent(dir)?;
    }
    if let Some(path) = &args.save_output {
        npy::refuse_existing(path)?;
    }
    if case.device == Device::Cpu {
        crate::backend::cpu::decode_path::measure_once();
    }
    let outcome = run_case(&case, &settings, given)?;
    // Under mpirun every rank ran the case; rank 0 alone prints and writes files.
    if !crate::dist::is_root() {
        return Ok(());
    }
    if args.json {
        let json = serde_json::to_string(&RecordJson::of(&outcome.record))
            .map_err(|e| Error::Runtime(format!("serializing the result: {e}")))?;
        println!("{json}");
    } else {
        print!("{}", record_table(&outcome.record));
    }
    if let (Some(dir), Some(inputs)) = (&args.save_inputs, &outcome.inputs) {
        npy::save_inputs(dir, inputs)?;
        eprintln!("inputs written to {}", dir.display());
    }
    if let Some(path) = &args.save_output {
        let out = outcome.output.as_ref().ok_or_else(|| {
            Error::Runtime(format!(
                "no output to write to {}: the case did not run ({}: {})",
                path.display(),
                outcome.record.status,
                outcome.record.reason
            ))
        })?;
        let s = &case.shape;
        npy::save_f32(path, out, &[s.batch, s.heads, s.seq_q, s.head_dim])?;
        eprintln!("output written to {}", path.display());
    }
    Ok(())
}

/// A warning on stderr when `threads` exceeds this machine's logical CPUs: the workers
/// then share cores, and the times measure that.
pub fn warn_oversubscribed(threads: usize) {
    let cpus = config::default_threads();
    if threads > cpus {
        eprintln!(
            "warning: threads = {threads} is more than this machine's {cpus} logical CPUs: the workers share cores, and the times measure that"
        );
    }
}

/// The MLA dimensions `--latent-dim` and `--rope-dim` give: both or neither, each at least
/// 1, and only for a variant that reads an MLA cache (mla-decode needs them).
fn mla_of(args: &RunArgs) -> Result<Option<crate::problem::Mla>> {
    let usage = Error::Usage;
    let reads = args.variant.get().reads_mla();
    match (args.latent_dim, args.rope_dim) {
        (None, None) if reads => Err(usage(format!(
            "--latent-dim and --rope-dim are required by {}",
            args.variant
        ))),
        (None, None) => Ok(None),
        (Some(_), _) | (_, Some(_)) if !reads => Err(usage(format!(
            "--latent-dim and --rope-dim apply to mla-decode only, not to {}",
            args.variant
        ))),
        (Some(latent_dim), Some(rope_dim)) => {
            if latent_dim == 0 {
                return Err(usage("--latent-dim must be at least 1".into()));
            }
            if rope_dim == 0 {
                return Err(usage("--rope-dim must be at least 1".into()));
            }
            Ok(Some(crate::problem::Mla {
                latent_dim,
                rope_dim,
            }))
        }
        (Some(_), None) => Err(usage("--latent-dim needs --rope-dim".into())),
        (None, Some(_)) => Err(usage("--rope-dim needs --latent-dim".into())),
    }
}
