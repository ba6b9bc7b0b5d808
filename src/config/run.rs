//! `[run]`: sweep-wide settings (name, seed, the stopping rule, memory budget, threads),
//! their defaults and their checks.

use serde::Serialize;
use toml::Value;

use super::axis::Axis;
use super::schema::RawRun;
use super::size::ByteSize;
use super::source::{Section, Source};
use crate::backend::cpu::decode::GEMM_MIN_ROWS;
use crate::backend::cpu::isa::Isa;
use crate::error::Result;
use crate::problem::VariantId;

/// Resolved `[run]` table. Times are seconds; see docs/methodology.md for the stopping
/// rule these parameters drive.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunConfig {
    /// Run name; the default output directory is `results/<name>`.
    pub name: String,
    pub seed: u64,
    /// Untimed repetitions before the timed ones.
    pub warmup: usize,
    /// Warm up for at least this many seconds (after the `warmup` calls).
    pub warmup_s: f64,
    /// Timed calls at least, even past `max_time_s`.
    pub min_reps: usize,
    pub max_reps: usize,
    /// Keep repeating at least this long.
    pub min_time_s: f64,
    /// Per-case cap on the time spent in timed repetitions, once `min_reps` are made.
    pub max_time_s: f64,
    /// Stop once MAD/median is under this (after `min_reps`).
    pub rel_spread: f64,
    /// Emulated device memory: cases predicted above it are `oom` rows.
    pub memory_budget: Option<ByteSize>,
    /// `memory_budget = "bpt-rule"`: the budget is BPT's rule for the model's layers
    /// (`model::bpt_memory::rule_budget`), resolved into `memory_budget` once the axes give
    /// the hidden size.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub memory_budget_rule: bool,
    /// Query rows sampled for the error when checking all rows is too costly.
    pub error_rows: usize,
    /// Default of the `threads` axis.
    pub threads: usize,
    /// Measure SGEMM GFLOP/s and copy bandwidth at sweep start.
    pub calibrate: bool,
    /// Per-case time cap: a non-causal case whose one call is estimated above this many
    /// seconds is timed on its first `extrapolate_q_chunks` query chunks and its time scaled
    /// by the row ratio (`extrapolate.rs`); `None` = every case is timed in full.
    pub extrapolate_above_s: Option<f64>,
    /// Query chunks (of the case's q_chunk, 1024 rows for variants without one) timed when
    /// a case is extrapolated, rounded up to a multiple of the case's threads.
    pub extrapolate_q_chunks: usize,
    /// Also run this variant on the same inputs (untimed) and record the max abs difference
    /// of the outputs (`max_abs_diff`): the paper's error measure.
    pub diff_against: Option<VariantId>,
    /// Layer modes: depth of the model the measured layer stands for; its static bytes (16
    /// per parameter per layer, plus the other layers' checkpointed inputs) count against
    /// `memory_budget` (`layer::static_bytes`).
    pub model_layers: Option<usize>,
    /// CUDA cases: flush the L2 cache before every timed repetition (cold timing).
    pub cold: bool,
    /// CUDA cases: f32 GEMMs (naive, rabe-staats) on TF32 tensor cores instead of FP32.
    pub tf32: bool,
    /// Axes that turn fastest in the expansion, the last fastest (default: none, the fixed
    /// order). Cases that differ only in these run back to back, so comparing them is not
    /// spread over the machine's slow drifts (1 vs 2 threads, or one algorithm vs another).
    pub innermost: Vec<Axis>,
    /// CPU cases: consecutive cases of the expansion that run on the same inputs (they
    /// differ only in variant, threads, mask, chunks ...) are timed in alternation, one call
    /// of each per round, instead of one case after the other (`interleave.rs`).
    pub interleave: bool,
    /// CPU decode loops: the SGEMM from this many query rows per KV head, dot products
    /// below, for every dtype; `None` (the default, "measured"): the machine's probe decides
    /// (`backend::cpu::decode_path`). A pinned value keeps memory figures byte-identical
    /// from run to run, which the CI gate's exact memory comparison needs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode_gemm_rows: Option<usize>,
    /// CPU cases: the kernel path every case forces unless the `kernel_path` axis names
    /// its own (the axis's default, as `threads` is of its axis); `None`: this CPU's
    /// measured choice (`backend::cpu::isa`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_path: Option<Isa>,
}

pub const DEFAULT_SEED: u64 = 0;
pub const DEFAULT_WARMUP: usize = 1;
pub const DEFAULT_WARMUP_S: f64 = 0.0;
pub const DEFAULT_MIN_REPS: usize = 3;
pub const DEFAULT_MAX_REPS: usize = 50;
pub const DEFAULT_MIN_TIME_S: f64 = 0.0;
pub const DEFAULT_MAX_TIME_S: f64 = 5.0;
pub const DEFAULT_REL_SPREAD: f64 = 0.02;
pub const DEFAULT_ERROR_ROWS: usize = 256;
pub const DEFAULT_EXTRAPOLATE_Q_CHUNKS: usize = 4;

/// The machine's available parallelism (1 if it cannot be read).
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The most worker threads a case may ask for: 8 per logical CPU, at least 64. Beyond it a
/// pool of spinning workers measures only oversubscription (100000 of them took minutes to
/// stop), so it is refused, naming the key.
pub fn max_threads() -> usize {
    (8 * default_threads()).max(64)
}

/// Why `threads` is refused, if it is.
pub fn threads_refused(threads: usize) -> Option<String> {
    if threads == 0 {
        Some("must be at least 1".into())
    } else if threads > max_threads() {
        Some(format!(
            "{threads} is more than {} (8 per logical CPU of this machine, at least 64)",
            max_threads()
        ))
    } else {
        None
    }
}

impl RunConfig {
    /// All defaults, with this name (for single-case runs that have no config file).
    pub fn new(name: impl Into<String>) -> RunConfig {
        RunConfig {
            name: name.into(),
            seed: DEFAULT_SEED,
            warmup: DEFAULT_WARMUP,
            warmup_s: DEFAULT_WARMUP_S,
            min_reps: DEFAULT_MIN_REPS,
            max_reps: DEFAULT_MAX_REPS,
            min_time_s: DEFAULT_MIN_TIME_S,
            max_time_s: DEFAULT_MAX_TIME_S,
            rel_spread: DEFAULT_REL_SPREAD,
            memory_budget: None,
            memory_budget_rule: false,
            error_rows: DEFAULT_ERROR_ROWS,
            threads: default_threads(),
            calibrate: true,
            extrapolate_above_s: None,
            extrapolate_q_chunks: DEFAULT_EXTRAPOLATE_Q_CHUNKS,
            diff_against: None,
            model_layers: None,
            cold: false,
            tf32: false,
            innermost: Vec::new(),
            interleave: false,
            decode_gemm_rows: None,
            kernel_path: None,
        }
    }
}

/// The value of `memory_budget` that asks for BPT's budget rule.
pub const BUDGET_RULE: &str = "bpt-rule";

/// Longest `warmup_s`, `min_time_s` or `max_time_s` taken: past a day a typo (1e300) would
/// time one case for ever.
pub const MAX_TIMING_S: f64 = 86_400.0;

/// A run name names the directory `results/<name>`: one path component, so no separator,
/// no `.` or `..` (which would write into or above `results/`) and no control characters.
pub fn is_run_name(s: &str) -> bool {
    !s.trim().is_empty()
        && s != "."
        && s != ".."
        && !s.contains(['/', '\\'])
        && !s.chars().any(char::is_control)
}

/// Check `[run]` and fill its defaults.
pub(super) fn resolve_run(raw: Option<RawRun>, src: &Source) -> Result<RunConfig> {
    let raw = raw.unwrap_or_default();
    let f = Fields(src);
    let name = match &raw.name {
        None => return Err(f.err("name", "required: the run name, e.g. name = \"quick\"")),
        Some(Value::String(s)) if is_run_name(s) => s.clone(),
        Some(v) => {
            return Err(f.err(
                "name",
                format!(
                    "expected a non-empty string without path separators or control characters, not `.` or `..`, got {}",
                    show(v)
                ),
            ))
        }
    };
    let seed = f.int("seed", &raw.seed, DEFAULT_SEED)?;
    let warmup = f.count("warmup", &raw.warmup, DEFAULT_WARMUP)?;
    let warmup_s = f.number("warmup_s", &raw.warmup_s, DEFAULT_WARMUP_S)?;
    let min_reps = f.count("min_reps", &raw.min_reps, DEFAULT_MIN_REPS)?;
    let max_reps = f.count("max_reps", &raw.max_reps, DEFAULT_MAX_REPS)?;
    let error_rows = f.count("error_rows", &raw.error_rows, DEFAULT_ERROR_ROWS)?;
    let threads = f.count("threads", &raw.threads, default_threads())?;
    let min_time_s = f.number("min_time_s", &raw.min_time_s, DEFAULT_MIN_TIME_S)?;
    let max_time_s = f.number("max_time_s", &raw.max_time_s, DEFAULT_MAX_TIME_S)?;
    let rel_spread = f.number("rel_spread", &raw.rel_spread, DEFAULT_REL_SPREAD)?;
    let flag = |key: &str, v: &Option<Value>, default: bool| match v {
        None => Ok(default),
        Some(Value::Boolean(b)) => Ok(*b),
        Some(v) => Err(f.err(key, format!("expected true or false, got {}", show(v)))),
    };
    let calibrate = flag("calibrate", &raw.calibrate, true)?;
    let cold = flag("cold", &raw.cold, false)?;
    let tf32 = flag("tf32", &raw.tf32, false)?;
    let interleave = flag("interleave", &raw.interleave, false)?;
    let extrapolate_above_s = match raw.extrapolate_above_s {
        None => None,
        Some(_) => Some(f.number("extrapolate_above_s", &raw.extrapolate_above_s, 0.0)?),
    };
    if extrapolate_above_s.is_some_and(|s| s <= 0.0) {
        return Err(f.err(
            "extrapolate_above_s",
            "must be greater than 0 (leave it out to time every case in full)",
        ));
    }
    let extrapolate_q_chunks = f.count(
        "extrapolate_q_chunks",
        &raw.extrapolate_q_chunks,
        DEFAULT_EXTRAPOLATE_Q_CHUNKS,
    )?;
    if extrapolate_q_chunks == 0 {
        return Err(f.err("extrapolate_q_chunks", "must be at least 1"));
    }
    let diff_against = match &raw.diff_against {
        None => None,
        Some(Value::String(s)) => Some(
            s.parse::<VariantId>()
                .map_err(|m| f.err("diff_against", m))?,
        ),
        Some(v) => {
            return Err(f.err(
                "diff_against",
                format!("expected a variant name, e.g. \"naive\", got {}", show(v)),
            ))
        }
    };
    let model_layers = match raw.model_layers {
        None => None,
        Some(_) => Some(f.count("model_layers", &raw.model_layers, 1)?),
    };
    if model_layers == Some(0) {
        return Err(f.err("model_layers", "must be at least 1"));
    }
    let innermost = match &raw.innermost {
        None => Vec::new(),
        Some(Value::Array(items)) => {
            let mut axes = Vec::new();
            for item in items {
                let axis = match item {
                    Value::String(s) => Axis::from_name(s),
                    _ => None,
                };
                let Some(axis) = axis else {
                    return Err(f.err(
                        "innermost",
                        format!(
                            "expected axis names ({}), got {}",
                            Axis::names().join(", "),
                            show(item)
                        ),
                    ));
                };
                if axes.contains(&axis) {
                    return Err(f.err("innermost", format!("`{}` is named twice", axis.name())));
                }
                axes.push(axis);
            }
            axes
        }
        Some(v) => {
            return Err(f.err(
                "innermost",
                format!(
                    "expected a list of axis names, e.g. [\"threads\"], got {}",
                    show(v)
                ),
            ))
        }
    };
    let decode_gemm_rows = match &raw.decode_gemm_rows {
        None => None,
        Some(Value::String(s)) if s == "measured" => None,
        Some(Value::Integer(n)) if *n >= GEMM_MIN_ROWS as i64 => Some(*n as usize),
        Some(v) => {
            return Err(f.err(
                "decode_gemm_rows",
                format!(
                    "expected \"measured\" or a number of query rows per KV head of at least {GEMM_MIN_ROWS}, got {}",
                    show(v)
                ),
            ))
        }
    };
    let kernel_path = match &raw.kernel_path {
        None => None,
        Some(Value::String(s)) => {
            Some(Isa::parse_available(s).map_err(|m| f.err("kernel_path", m))?)
        }
        Some(v) => {
            return Err(f.err(
                "kernel_path",
                format!(
                    "expected a kernel path name ({}), got {}",
                    Isa::names().join(", "),
                    show(v)
                ),
            ))
        }
    };
    let memory_budget_rule =
        matches!(&raw.memory_budget, Some(Value::String(s)) if s == BUDGET_RULE);
    let memory_budget = match &raw.memory_budget {
        Some(v) if !memory_budget_rule => {
            Some(byte_size(v).map_err(|m| f.err("memory_budget", m))?)
        }
        _ => None,
    };
    if memory_budget_rule && model_layers.is_none() {
        return Err(f.err(
            "memory_budget",
            format!(
                "\"{BUDGET_RULE}\" sizes the budget from the model's layers: set run.model_layers"
            ),
        ));
    }

    if min_reps == 0 {
        return Err(f.err("min_reps", "must be at least 1"));
    }
    if min_reps > max_reps {
        return Err(f.err(
            "min_reps",
            format!("{min_reps} is greater than run.max_reps = {max_reps}"),
        ));
    }
    if max_time_s <= 0.0 {
        return Err(f.err(
            "max_time_s",
            format!("must be greater than 0, got {max_time_s}"),
        ));
    }
    if min_time_s > max_time_s {
        return Err(f.err(
            "min_time_s",
            format!("{min_time_s} is greater than run.max_time_s = {max_time_s}"),
        ));
    }
    if error_rows == 0 {
        return Err(f.err("error_rows", "must be at least 1"));
    }
    for (key, s) in [
        ("warmup_s", warmup_s),
        ("min_time_s", min_time_s),
        ("max_time_s", max_time_s),
    ] {
        if s > MAX_TIMING_S {
            return Err(f.err(key, format!("{s} is more than {MAX_TIMING_S} s (a day)")));
        }
    }
    if let Some(why) = threads_refused(threads) {
        return Err(f.err("threads", why));
    }
    Ok(RunConfig {
        name,
        seed,
        warmup,
        warmup_s,
        min_reps,
        max_reps,
        min_time_s,
        max_time_s,
        rel_spread,
        memory_budget,
        memory_budget_rule,
        error_rows,
        threads,
        calibrate,
        extrapolate_above_s,
        extrapolate_q_chunks,
        diff_against,
        model_layers,
        cold,
        tf32,
        innermost,
        interleave,
        decode_gemm_rows,
        kernel_path,
    })
}

/// Typed reads of `[run]` leaves, errors naming `run.KEY`.
struct Fields<'a>(&'a Source<'a>);

impl Fields<'_> {
    fn err(&self, key: &str, msg: impl std::fmt::Display) -> crate::error::Error {
        self.0.err(Section::Run, key, msg)
    }

    fn int(&self, key: &str, v: &Option<Value>, default: u64) -> Result<u64> {
        match v {
            None => Ok(default),
            Some(Value::Integer(n)) if *n >= 0 => Ok(*n as u64),
            Some(v) => Err(self.err(
                key,
                format!("expected a non-negative integer, got {}", show(v)),
            )),
        }
    }

    fn count(&self, key: &str, v: &Option<Value>, default: usize) -> Result<usize> {
        let n = self.int(key, v, default as u64)?;
        usize::try_from(n).map_err(|_| self.err(key, format!("{n} is too large")))
    }

    /// A finite number >= 0 (an integer is accepted).
    fn number(&self, key: &str, v: &Option<Value>, default: f64) -> Result<f64> {
        let x = match v {
            None => return Ok(default),
            Some(Value::Integer(n)) => *n as f64,
            Some(Value::Float(x)) => *x,
            Some(v) => return Err(self.err(key, format!("expected a number, got {}", show(v)))),
        };
        if x.is_finite() && x >= 0.0 {
            Ok(x)
        } else {
            Err(self.err(key, format!("expected a finite number >= 0, got {x}")))
        }
    }
}

fn byte_size(v: &Value) -> Result<ByteSize, String> {
    let b = match v {
        Value::String(s) => s.parse::<ByteSize>()?,
        Value::Integer(n) if *n >= 0 => ByteSize(*n as u64),
        _ => {
            return Err(format!(
                "expected a size string like \"8GiB\", an integer number of bytes or \"{BUDGET_RULE}\", got {}",
                show(v)
            ))
        }
    };
    if b.0 == 0 {
        return Err("must be greater than 0".into());
    }
    Ok(b)
}

fn show(v: &Value) -> String {
    format!("{} {v}", v.type_str())
}
