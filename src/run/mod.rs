//! Runs one case, in the order docs/methodology.md fixes: validate and predict memory (skip or `oom`
//! with a reason, never a crash) -> seeded inputs -> warm-up and timed repetitions until the
//! stopping rule -> one untimed pass under the memory probe -> error against the f64 oracle
//! -> one `Record`. Kernels run inside a rayon pool of the case's thread count.

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod extrapolate;
pub mod interleave;

use crate::variant::Registry;
use std::sync::atomic::{AtomicBool, Ordering};

use std::time::Instant;

use crate::backend::cpu::gemm::PACK_BYTES_MAX;
use crate::backend::cpu::isa::Isa;
use crate::backend::cpu::workspace::{try_zeroed, WarmCalls};

use crate::error::{Error, Result};
use crate::layer;
use crate::measure::alloc::{self, MemoryProbe};
use crate::measure::probe::probe_pool;
use crate::measure::rss;
use crate::measure::stats::Summary;
use crate::measure::timer::{time_repetitions, StopRule, Timing};
use crate::problem::VariantId;
use crate::problem::{Case, Device, Grads, Inputs, Mode};
use crate::reference;
use crate::results::record::{Record, Status};
use crate::sim::stats::SimStats;
use crate::units;
use extrapolate::Extrapolation;

/// Everything besides the case that decides how a case is measured.
#[derive(Clone, Debug)]
pub struct Settings {
    pub run_name: String,
    pub stop: StopRule,
    /// Emulated device memory: inputs + outputs + workspace must fit.
    pub memory_budget: Option<u64>,
    /// Query rows sampled for the error when checking all rows is too costly.
    pub error_rows: usize,
    /// Time slow cases on a part and scale (`extrapolate.rs`); `None` = time in full.
    pub extrapolate: Option<Extrapolation>,
    /// Also run this variant on the same inputs and record `max_abs_diff`.
    pub diff_against: Option<VariantId>,
    /// Layer modes: the depth of the model the measured layer belongs to; its static bytes
    /// (`layer::static_bytes`) count against the memory budget.
    pub model_layers: Option<usize>,
    /// How CUDA cases are timed and computed.
    pub gpu: GpuSettings,
}

/// `[run]` keys that only CUDA cases read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuSettings {
    /// Flush the L2 cache (a memset of twice its size) before every timed repetition.
    pub cold: bool,
    /// f32 GEMMs (naive, rabe-staats) on TF32 tensor cores instead of exact FP32.
    pub tf32: bool,
}

/// Set by the Ctrl-C handler: the current case stops after its current repetition and no
/// further case starts. Every row already written stays.
pub static INTERRUPTED: AtomicBool = AtomicBool::new(false);

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

/// Why a case cannot run at all, if so. Checked before anything is allocated.
pub fn skip_reason(case: &Case) -> Option<String> {
    let info = case.variant.info();
    let s = &case.shape;
    if case.devices == 0 {
        return Some("devices must be at least 1".into());
    }
    if !info.modes.contains(&case.mode) {
        let modes: Vec<&str> = info.modes.iter().map(|m| m.name()).collect();
        return Some(format!(
            "variant {} does not implement mode {} (it has: {})",
            info.name,
            case.mode,
            modes.join(", ")
        ));
    }
    // Byte and FLOP counts (4 b h n_q n_kv bytes of scores, 4 b h n_q n_kv d FLOPs) must
    // not wrap: a shape past them is refused before any count is taken.
    // A layer's weights and their FLOPs grow with hidden^2 (12 h^2 parameters).
    let hidden = s.heads.saturating_mul(s.head_dim);
    let fits = |factors: &[usize]| {
        factors
            .iter()
            .try_fold(1u64, |acc, &x| acc.checked_mul(x as u64))
            .is_some_and(|p| p <= 1 << 62)
    };
    let layer = case.mode.is_layer();
    if !fits(&[s.batch, s.heads, s.seq_q, s.seq_kv, s.head_dim, 16])
        || (layer && !fits(&[hidden, hidden, 12 * 16, s.batch, s.seq_q]))
    {
        return Some(format!(
            "shape too large to count: batch x heads x seq_q x seq_kv x head_dim = {} x {} x {} x {} x {}{} overflows 64-bit byte and FLOP counts",
            s.batch, s.heads, s.seq_q, s.seq_kv, s.head_dim,
            if layer { " (and a layer's hidden^2 x tokens)" } else { "" }
        ));
    }
    if s.kv_heads == 0 || s.kv_heads > s.heads || !s.heads.is_multiple_of(s.kv_heads) {
        return Some(format!(
            "heads ({}) must be a multiple of kv_heads ({}) for grouped-query attention",
            s.heads, s.kv_heads
        ));
    }
    if crate::dist::size() > 1 && case.variant.engine() == crate::variant::Engine::InProcess {
        return Some(format!(
            "variant {} runs in one process: under mpirun only the MPI variants run (run it without mpirun)",
            info.name
        ));
    }
    if case.device == Device::Cuda {
        return cuda_skip_reason(case);
    }
    case.variant.get().unsupported(case)
}

/// Why a CUDA case cannot run: the variant has no CUDA kernels, its GPU algorithm does not
/// take the case, or there is no usable GPU here (no `cuda` feature, driver, device, NVRTC
/// or cuBLAS). The case's own reasons come first, so they read the same on every machine.
pub fn cuda_skip_reason(case: &Case) -> Option<String> {
    let Some(algo) = case.variant.get().cuda() else {
        let gpu: Vec<&str> = VariantId::ALL
            .iter()
            .filter(|v| v.get().cuda().is_some())
            .map(|v| v.name())
            .collect();
        return Some(format!(
            "variant {} has no CUDA kernels (on the GPU: {})",
            case.variant,
            gpu.join(", ")
        ));
    };
    crate::backend::cuda::plan::unsupported(algo, case).or_else(cuda_unavailable_reason)
}

/// Why CUDA cases are skipped in this process, if they are (`attnbench list` shows it too).
pub fn cuda_unavailable_reason() -> Option<String> {
    crate::backend::cuda::unavailable_reason()
}

pub use crate::measure::pool::pool;

/// Runs a timing loop on a worker of the case's pool: each timed call then starts on that
/// worker (a kernel's `install` of the same pool runs inline), so no call pays a hand-off
/// to a sleeping thread, which on a small case can cost as much as the kernel. The loop
/// runs warm (`WarmCalls`): a kernel's scratch buffers are those the previous call freed,
/// not fresh pages the operating system must zero. The memory probe runs after it, cold.
/// The machine-speed probe (`measure::probe`) runs on every thread of the pool just before
/// and just after the loop; their mean is returned beside the timing.
fn time_on_worker(
    case: &Case,
    stop: &StopRule,
    f: impl FnMut() -> Result<()> + Send,
) -> Result<(Timing, f64)> {
    // Every rank of an MPI variant makes the same number of calls (each a collective), so a
    // signal does not cut its loop short on one rank; the sweep stops between cases instead,
    // where the ranks agree to.
    static NEVER: AtomicBool = AtomicBool::new(false);
    let flag = if case.variant.engine() == crate::variant::Engine::Mpi {
        &NEVER
    } else {
        &INTERRUPTED
    };
    pool(case.threads)?.install(|| {
        let _warm = WarmCalls::start();
        let before = probe_pool();
        let timing = time_repetitions(stop, flag, f)?;
        let after = probe_pool();
        Ok((timing, (before + after) / 2.0))
    })
}

/// One forward call of the case's variant into `out`, inside its thread pool, with the
/// fastest kernel path of this CPU.
pub fn forward(case: &Case, inputs: &Inputs, out: &mut [f32]) -> Result<()> {
    forward_with(case, Isa::detect(), inputs, out)
}

/// [`forward`] on a given kernel path (tests run every path the CPU has).
pub fn forward_with(case: &Case, isa: Isa, inputs: &Inputs, out: &mut [f32]) -> Result<()> {
    check_call(case, isa, inputs)?;
    let variant = case.variant.get();
    pool(case.threads)?.install(|| variant.forward_cpu(case, isa, inputs, out))
}

/// What a kernel call requires of its caller: an available kernel path, and inputs of the
/// case's dtype and shape (kernels size their workspace from the case).
fn check_call(case: &Case, isa: Isa, inputs: &Inputs) -> Result<()> {
    if !isa.available() {
        return Err(Error::Runtime(format!(
            "kernel path {isa} is not available on this CPU"
        )));
    }
    if inputs.dtype() != case.dtype || inputs.shape != case.shape {
        return Err(Error::Runtime(format!(
            "inputs are {} {:?} but the case is {} {:?}",
            inputs.dtype(),
            inputs.shape,
            case.dtype,
            case.shape
        )));
    }
    Ok(())
}

/// `forward`, returning the simulated devices' counters of multi-device variants.
pub fn forward_counted(case: &Case, inputs: &Inputs, out: &mut [f32]) -> Result<Option<SimStats>> {
    let isa = Isa::detect();
    check_call(case, isa, inputs)?;
    let variant = case.variant.get();
    pool(case.threads)?.install(|| variant.forward_counted(case, isa, inputs, out))
}

/// The output of one case, computed once without measuring (for tests and `--save-output`).
pub fn output(case: &Case, inputs: &Inputs) -> Result<Vec<f32>> {
    output_with(case, Isa::detect(), inputs)
}

/// [`output`] on a given kernel path.
pub fn output_with(case: &Case, isa: Isa, inputs: &Inputs) -> Result<Vec<f32>> {
    let mut out = try_zeroed(case.shape.out_len(), "output")?;
    forward_with(case, isa, inputs, &mut out)?;
    Ok(out)
}

/// Bytes of `matrixmultiply` packing buffers a case may allocate beyond its prediction: one
/// per thread when its variant's kernels use that SGEMM (`Variant::uses_packing_gemm`).
pub fn packing_bytes(case: &Case) -> u64 {
    if case.variant.get().uses_packing_gemm(case) {
        case.threads as u64 * PACK_BYTES_MAX
    } else {
        0
    }
}

/// What a measured case leaves besides its record.
pub struct Outcome {
    pub record: Record,
    /// The output of the probe pass, when the case ran.
    pub output: Option<Vec<f32>>,
    /// The inputs it ran on (generated or given).
    pub inputs: Option<Inputs>,
    /// Seconds of each timed repetition, in call order (`samples.csv`); empty when the case
    /// was not run (skipped, oom by prediction) or failed.
    pub samples: Vec<f64>,
}

/// Measures one case. `given` replaces the generated inputs (`run --inputs`). Failures of
/// the case itself (oom, non-finite output) are rows, not errors; `Err` is kept for
/// failures of the harness.
pub fn run_case(case: &Case, settings: &Settings, given: Option<Inputs>) -> Result<Outcome> {
    let row = |status, reason: String| record_for(&settings.run_name, case, status, reason);
    if let Some(reason) = skip_reason(case) {
        return Ok(Outcome {
            record: row(Status::Skipped, reason),
            output: None,
            inputs: None,
            samples: Vec::new(),
        });
    }
    #[cfg(feature = "cuda")]
    if case.device == Device::Cuda {
        return cuda::run_case(case, settings, given);
    }
    let predicted = predicted_bytes(case);
    let fixed = static_bytes(case, settings);
    if let Some(budget) = settings.memory_budget {
        // The backward GEMM's packing buffers are allocated infallibly (an allocation over
        // the limit there would abort), so they must fit too: one per thread at most.
        let packing = packing_bytes(case);
        let need = predicted + case.io_bytes() + packing + fixed;
        if need > budget {
            let model = if fixed > 0 {
                format!(" + {} rest of the model", units::bytes_2dp(fixed))
            } else {
                String::new()
            };
            let reason = format!(
                "predicted {} workspace + {} inputs/outputs + {} GEMM packing{model} = {} exceeds the memory budget {}",
                units::bytes_2dp(predicted),
                units::bytes_2dp(case.io_bytes()),
                units::bytes_2dp(packing),
                units::bytes_2dp(need),
                units::bytes_2dp(budget)
            );
            return Ok(oom_by_prediction(row(Status::Oom, reason), predicted));
        }
    }
    alloc::set_limit(settings.memory_budget.map(|b| b.saturating_sub(fixed)));
    let result = measure_case(case, settings, given, predicted);
    alloc::set_limit(None);
    result
}

/// The row of a case that was not run because its predicted memory exceeds the budget.
pub(crate) fn oom_by_prediction(mut record: Record, predicted: u64) -> Outcome {
    record.mem_predicted_bytes = Some(predicted);
    Outcome {
        record,
        output: None,
        inputs: None,
        samples: Vec::new(),
    }
}

/// Bytes of the rest of the model a layer case belongs to (`Settings::model_layers`),
/// which are not allocated but count against the budget; 0 for attention cases.
pub fn static_bytes(case: &Case, settings: &Settings) -> u64 {
    match settings.model_layers {
        Some(l) if case.mode.is_layer() => layer::static_bytes(case, l),
        _ => 0,
    }
}

fn measure(
    case: &Case,
    settings: &Settings,
    given: Option<Inputs>,
    predicted: u64,
) -> Result<Outcome> {
    let mut record = record_for(&settings.run_name, case, Status::Ok, "");
    record.mem_predicted_bytes = Some(predicted);
    let inputs = match given {
        Some(i) => i,
        None => Inputs::generate(
            case.shape,
            case.dtype,
            case.input_dist,
            case.input_scale,
            case.seed,
        ),
    };
    let mut out = match try_zeroed(case.shape.out_len(), "output") {
        Ok(o) => o,
        Err(e) => return Ok(failed(record, Status::Oom, e, Some(inputs))),
    };

    let stop = stop_rule(case, &settings.stop);
    let timing = time_on_worker(case, &stop, || forward(case, &inputs, &mut out));
    let (timing, probe) = match timing {
        Ok(t) => t,
        Err(e) => {
            let status = oom_or_error(&e);
            return Ok(failed(record, status, e, Some(inputs)));
        }
    };
    record_timing(&mut record, case, &timing, Some(probe));
    if let Err(e) = memory_and_error(&mut record, case, settings, &inputs, &mut out) {
        let status = oom_or_error(&e);
        return Ok(failed(record, status, e, Some(inputs)));
    }
    Ok(Outcome {
        record,
        output: Some(out),
        inputs: Some(inputs),
        samples: timing.samples,
    })
}

/// The untimed steps after a forward case's timed calls: the memory probe pass, then the
/// output's error against the oracle. The probe pass poisons the output (a row the kernel
/// forgets to write stays NaN and shows as an error) and resets the peak just before the
/// call, so the overhead excludes inputs and outputs, which are already live. `Err`: the
/// probe pass failed (the caller's row is then `oom` or `error`).
pub(crate) fn memory_and_error(
    record: &mut Record,
    case: &Case,
    settings: &Settings,
    inputs: &Inputs,
    out: &mut [f32],
) -> Result<()> {
    out.fill(f32::NAN);
    if let Some(stats) = probe_pass(record, || forward_counted(case, inputs, out))? {
        record.set_sim(&stats);
    }
    // Under MPI only rank 0 writes the record, and only it has every output row (prefill).
    if crate::dist::is_root() {
        record_output_error(record, case, inputs, out, settings.error_rows);
    }
    Ok(())
}

/// The stopping rule of a case. Every rank of an MPI variant must make the same number of
/// calls (each is a collective), so those warm up for exactly `warmup` calls and stop after
/// exactly `min_reps` timed calls, not on their own clocks.
pub(crate) fn stop_rule(case: &Case, rule: &StopRule) -> StopRule {
    if case.variant.engine() != crate::variant::Engine::Mpi {
        return rule.clone();
    }
    let reps = rule.min_reps.max(1);
    StopRule {
        warmup_s: 0.0,
        min_reps: reps,
        max_reps: reps,
        min_time_s: 0.0,
        max_time_s: f64::INFINITY,
        ..rule.clone()
    }
}

/// Forward + backward: times the pair (and the backward alone within the same calls),
/// probes the memory of the whole differentiation (inputs, dO, output and gradients are
/// live before it, so they are excluded), checks output and gradients against the oracle.
fn measure_train(
    case: &Case,
    settings: &Settings,
    given: Option<Inputs>,
    predicted: u64,
) -> Result<Outcome> {
    let mut record = record_for(&settings.run_name, case, Status::Ok, "");
    record.mem_predicted_bytes = Some(predicted);
    let inputs = given.unwrap_or_else(|| {
        Inputs::generate(
            case.shape,
            case.dtype,
            case.input_dist,
            case.input_scale,
            case.seed,
        )
    });
    let d_out = case.d_out.make(&case.shape, case.seed);
    let s = &case.shape;
    let buffers = (|| -> Result<_> {
        let out = try_zeroed(s.out_len(), "output")?;
        let grads = Grads {
            dq: try_zeroed(s.q_len(), "dQ")?,
            dk: try_zeroed(s.kv_len(), "dK")?,
            dv: try_zeroed(s.kv_len(), "dV")?,
        };
        Ok((out, grads))
    })();
    let (mut out, mut grads) = match buffers {
        Ok(b) => b,
        Err(e) => return Ok(failed(record, Status::Oom, e, Some(inputs))),
    };

    let mut bwd_times = Vec::new();
    let timing = time_on_worker(case, &settings.stop, || {
        bwd_times.push(train_step(case, &inputs, &d_out, &mut out, &mut grads)?);
        Ok(())
    });
    let (timing, probe) = match timing {
        Ok(t) => t,
        Err(e) => {
            let status = oom_or_error(&e);
            return Ok(failed(record, status, e, Some(inputs)));
        }
    };
    record_timing(&mut record, case, &timing, Some(probe));
    // Warm-up calls come first: the timed ones are the last `reps`.
    let timed = &bwd_times[bwd_times.len().saturating_sub(timing.samples.len())..];
    record.time_bwd_median_s = Summary::of(timed).map(|s| s.median);

    out.fill(f32::NAN);
    for g in [&mut grads.dq, &mut grads.dk, &mut grads.dv] {
        g.fill(f32::NAN);
    }
    let pass = || train_step(case, &inputs, &d_out, &mut out, &mut grads).map(|_| ());
    if let Err(e) = probe_pass(&mut record, pass) {
        let status = oom_or_error(&e);
        return Ok(failed(record, status, e, Some(inputs)));
    }

    record_output_error(&mut record, case, &inputs, &out, settings.error_rows);
    let g = reference::grad::check(&inputs, case.causal, &d_out, &grads, settings.error_rows);
    record.grad_max_abs_err = Some(g.max_abs);
    record.grad_max_rel_err = Some(g.max_rel);
    record.grad_err_rows = Some(g.rows);
    record.grad_err_scope = g.scope().to_string();
    if g.non_finite > 0 && record.status == Status::Ok {
        record.status = Status::Error;
        record.reason = format!(
            "{} of the checked gradient values are NaN or infinite",
            g.non_finite
        );
    }
    Ok(Outcome {
        record,
        output: Some(out),
        inputs: Some(inputs),
        samples: timing.samples,
    })
}

/// A transformer-layer case (`crate::layer`): seeded parameters and input, timed calls
/// (a forward, or a checkpointed training step), one call under the memory probe (x, out,
/// parameters and, for training, dout, dx and the parameter gradient are live before it),
/// then output and gradient errors against the f64 oracle.
fn measure_layer(case: &Case, settings: &Settings, predicted: u64) -> Result<Outcome> {
    let mut record = record_for(&settings.run_name, case, Status::Ok, "");
    record.mem_predicted_bytes = Some(predicted);
    let train = case.mode == Mode::LayerTrain;
    let (params, x) = layer::generate(case);
    let d_out = if train {
        case.d_out.make(&case.shape, case.seed)
    } else {
        Vec::new()
    };
    let n = case.tokens_len();
    let buffers = (|| -> Result<_> {
        let out = try_zeroed(n, "layer output")?;
        let (dx, dp) = if train {
            (
                try_zeroed(n, "dx")?,
                try_zeroed(params.len(), "parameter gradient")?,
            )
        } else {
            (Vec::new(), Vec::new())
        };
        Ok((out, dx, dp))
    })();
    let (mut out, mut dx, mut dp) = match buffers {
        Ok(b) => b,
        Err(e) => return Ok(failed(record, Status::Oom, e, None)),
    };
    let isa = Isa::detect();
    let threads = pool(case.threads)?;
    let plan = crate::variant::layer_plan(case)?;
    let call = |out: &mut [f32], dx: &mut [f32], dp: &mut [f32]| {
        threads.install(|| layer::run_once(&plan, isa, &params, &x, &d_out, out, dx, dp))
    };
    let timing = time_on_worker(case, &settings.stop, || call(&mut out, &mut dx, &mut dp));
    let (timing, probe) = match timing {
        Ok(t) => t,
        Err(e) => {
            let status = oom_or_error(&e);
            return Ok(failed(record, status, e, None));
        }
    };
    record_timing(&mut record, case, &timing, Some(probe));
    for v in [&mut out, &mut dx, &mut dp] {
        layer::poison(v);
    }
    if let Err(e) = probe_pass(&mut record, || call(&mut out, &mut dx, &mut dp)) {
        let status = oom_or_error(&e);
        return Ok(failed(record, status, e, None));
    }
    let grads = train.then_some((&d_out[..], &dx[..], &dp[..]));
    let err = layer::check(case, &params, &x, &out, grads);
    record.max_abs_err = Some(err.out_max_abs);
    record.max_rel_err = Some(err.out_max_rel);
    record.err_rows = Some(err.out_rows);
    if let Some((abs, rel)) = err.grad {
        record.grad_max_abs_err = Some(abs);
        record.grad_max_rel_err = Some(rel);
        record.grad_err_rows = Some(err.out_rows);
        record.grad_err_scope = "all".into();
    } else if train {
        record.grad_err_scope = "none: too large for the f64 oracle".into();
    }
    if err.non_finite > 0 {
        record.status = Status::Error;
        record.reason = format!("{} checked values are NaN or infinite", err.non_finite);
    }
    record.timed_rows = Some(case.shape.seq_q);
    Ok(Outcome {
        record,
        output: Some(out),
        inputs: None,
        samples: timing.samples,
    })
}

/// One training step of the case's variant inside its pool: the forward that keeps what
/// its backward needs, then the backward. Returns the backward's own time in seconds.
pub fn train_step(
    case: &Case,
    inputs: &Inputs,
    d_out: &[f32],
    out: &mut [f32],
    grads: &mut Grads,
) -> Result<f64> {
    train_step_with(case, Isa::detect(), inputs, d_out, out, grads)
}

/// [`train_step`] with the forward on a given kernel path.
pub fn train_step_with(
    case: &Case,
    isa: Isa,
    inputs: &Inputs,
    d_out: &[f32],
    out: &mut [f32],
    grads: &mut Grads,
) -> Result<f64> {
    check_call(case, isa, inputs)?;
    let variant = case.variant.get();
    pool(case.threads)?.install(|| {
        let saved = variant.forward_train_cpu(case, isa, inputs, out)?;
        let start = Instant::now();
        variant.backward_cpu(case, inputs, out, &saved, d_out, grads)?;
        Ok(start.elapsed().as_secs_f64())
    })
}

/// Runs `pass` once under the memory probe (peak reset just before it, so what is already
/// live, inputs and outputs, is excluded) and records the overhead and peak RSS.
fn probe_pass<T>(record: &mut Record, pass: impl FnOnce() -> Result<T>) -> Result<T> {
    rss::reset_peak_rss();
    let probe = MemoryProbe::start();
    let result = pass();
    let overhead = probe.finish();
    let value = result?;
    record.mem_overhead_bytes = Some(overhead);
    record.peak_rss_bytes = rss::peak_rss_bytes();
    Ok(value)
}

/// The timing's columns; `probe`: the machine-speed probe around it (CPU cases).
pub(crate) fn record_timing(record: &mut Record, case: &Case, timing: &Timing, probe: Option<f64>) {
    let sm = &timing.summary;
    record.probe_gflops = probe;
    record.reps = sm.reps;
    record.time_median_s = Some(sm.median);
    record.time_min_s = Some(sm.min);
    record.time_max_s = Some(sm.max);
    record.time_mad_s = Some(sm.mad);
    record.gflops = (sm.median > 0.0).then(|| case.flops() / sm.median / 1e9);
    record.set_bandwidth(None);
    record.stopped_by = timing.stopped_by.name().to_string();
}

/// The output's error against the oracle; a non-finite value makes the row `error`.
pub(crate) fn record_output_error(
    record: &mut Record,
    case: &Case,
    inputs: &Inputs,
    out: &[f32],
    sample: usize,
) {
    let rows = reference::rows_to_check(&case.shape, sample);
    let err = reference::check_masked(inputs, case.causal, case.window, out, &rows);
    record.max_abs_err = Some(err.max_abs);
    record.max_rel_err = Some(err.max_rel);
    record.err_rows = Some(err.rows);
    if err.non_finite > 0 {
        record.status = Status::Error;
        record.reason = format!(
            "{} of the checked output values are NaN or infinite{}",
            err.non_finite,
            if case.variant.info().numerically_safe {
                ""
            } else {
                " (exp overflow: this variant does not subtract the row max)"
            }
        );
    }
}

pub(crate) fn oom_or_error(e: &Error) -> Status {
    match e {
        Error::OutOfMemory(_) => Status::Oom,
        _ => Status::Error,
    }
}

pub(crate) fn failed(
    mut record: Record,
    status: Status,
    e: Error,
    inputs: Option<Inputs>,
) -> Outcome {
    record.status = status;
    record.reason = e.to_string();
    Outcome {
        record,
        output: None,
        inputs,
        samples: Vec::new(),
    }
}

/// The row of `case` before measuring, with what its variant determines (bytes of K and V
/// the decode variants read).
pub fn record_for(run: &str, case: &Case, status: Status, reason: impl Into<String>) -> Record {
    let mut record = Record::for_case(run, case, status, reason);
    record.kv_read_bytes = case.variant.get().kv_read_bytes(case);
    record
}

/// `measure` with the optional steps `Settings` asks for: time extrapolation of slow cases
/// and the paired difference against another variant's output.
fn measure_case(
    case: &Case,
    settings: &Settings,
    given: Option<Inputs>,
    predicted: u64,
) -> Result<Outcome> {
    if case.mode.is_layer() {
        return measure_layer(case, settings, predicted);
    }
    let mut outcome = match settings.extrapolate {
        Some(x) => measure_extrapolated(case, settings, given, predicted, x)?,
        None => measure_mode(case, settings, given, predicted)?,
    };
    if let Some(inputs) = &outcome.inputs {
        finish_outcome(
            case,
            settings,
            inputs,
            &mut outcome.record,
            outcome.output.as_deref(),
        );
    }
    Ok(outcome)
}

/// The columns every measured case gets after its own steps: the rows timed, and the
/// paired difference against `settings.diff_against` on the same inputs.
pub(crate) fn finish_outcome(
    case: &Case,
    settings: &Settings,
    inputs: &Inputs,
    record: &mut Record,
    output: Option<&[f32]>,
) {
    if record.reps > 0 && record.timed_rows.is_none() {
        record.timed_rows = Some(case.shape.seq_q);
    }
    if let (Some(base), Some(out)) = (settings.diff_against, output) {
        paired_diff(case, settings, base, inputs, out, record);
    }
}

/// Times the case on its first query chunks and scales, when one full call is estimated
/// above the cap and the case is eligible (see `extrapolate.rs`); otherwise `measure`. The
/// estimate is one call of the part, which also serves as a warm-up.
fn measure_extrapolated(
    case: &Case,
    settings: &Settings,
    given: Option<Inputs>,
    predicted: u64,
    x: Extrapolation,
) -> Result<Outcome> {
    let Some(rows) = extrapolate::part_rows(case, x.q_chunks) else {
        return measure_mode(case, settings, given, predicted);
    };
    let part = extrapolate::part_case(case, rows);
    let predicted_part = predicted_bytes(&part);
    if predicted_part != predicted {
        // Memory is never extrapolated: this variant's workspace depends on the query rows.
        return measure_mode(case, settings, given, predicted);
    }
    let inputs = given.unwrap_or_else(|| case_inputs(case));
    let (part_inputs, full_q) = extrapolate::split_inputs(inputs, rows);
    let slow = time_one_call(&part, &part_inputs)
        .is_ok_and(|t| extrapolate::estimate_full_s(t, case, rows) > x.above_s);
    if !slow || interrupted() {
        let full = extrapolate::join_inputs(part_inputs, full_q, case.shape);
        return measure_mode(case, settings, Some(full), predicted);
    }
    drop(full_q);
    // The estimate call was a warm-up of exactly this part.
    let mut part_settings = settings.clone();
    part_settings.stop.warmup = settings.stop.warmup.saturating_sub(1);
    let outcome = measure_mode(&part, &part_settings, Some(part_inputs), predicted_part)?;
    Ok(extrapolate::scale_outcome(
        outcome,
        case,
        &settings.run_name,
        predicted,
    ))
}

fn case_inputs(case: &Case) -> Inputs {
    Inputs::generate(
        case.shape,
        case.dtype,
        case.input_dist,
        case.input_scale,
        case.seed,
    )
}

/// One untimed-harness call of the case (its mode's step), timed once.
fn time_one_call(case: &Case, inputs: &Inputs) -> Result<f64> {
    let s = &case.shape;
    let mut out = try_zeroed(s.out_len(), "output")?;
    if case.mode != Mode::FwdBwd {
        let t0 = Instant::now();
        forward(case, inputs, &mut out)?;
        return Ok(t0.elapsed().as_secs_f64());
    }
    let d_out = case.d_out.make(s, case.seed);
    let mut grads = Grads {
        dq: try_zeroed(s.q_len(), "dQ")?,
        dk: try_zeroed(s.kv_len(), "dK")?,
        dv: try_zeroed(s.kv_len(), "dV")?,
    };
    let t0 = Instant::now();
    train_step(case, inputs, &d_out, &mut out, &mut grads)?;
    Ok(t0.elapsed().as_secs_f64())
}

/// The workspace bytes the case's variant predicts for the case's mode.
pub fn predicted_bytes(case: &Case) -> u64 {
    let variant = case.variant.get();
    match case.mode {
        Mode::FwdBwd => variant.predict_train_workspace_bytes(case, Isa::detect()),
        _ => variant.predict_workspace_bytes(case, Isa::detect()),
    }
}

/// The measurement of the case's mode: a forward, or a forward + backward.
fn measure_mode(
    case: &Case,
    settings: &Settings,
    given: Option<Inputs>,
    predicted: u64,
) -> Result<Outcome> {
    match case.mode {
        Mode::FwdBwd => measure_train(case, settings, given, predicted),
        _ => measure(case, settings, given, predicted),
    }
}

/// The paper's error measure (Rabe–Staats 5.1): max |out - out of `base`| over every output
/// value, both computed on the same inputs (the rows the case computed, when it was
/// extrapolated); untimed, after the memory probe. Left empty when `base` would not fit the
/// memory budget beside this case's inputs and output, or fails.
fn paired_diff(
    case: &Case,
    settings: &Settings,
    base: VariantId,
    inputs: &Inputs,
    out: &[f32],
    record: &mut Record,
) {
    if base == case.variant || record.status != Status::Ok {
        return;
    }
    let info = base.info();
    let mut b = case.clone();
    b.variant = base;
    b.shape = inputs.shape;
    b.q_chunk = info.default_q_chunk.map(|c| c.min(b.shape.seq_q));
    b.kv_chunk = info.default_kv_chunk.map(|c| c.min(b.shape.seq_kv));
    record.diff_variant = base.name().to_string();
    if let Some(budget) = settings.memory_budget {
        let need = base.get().predict_workspace_bytes(&b, Isa::detect())
            + b.io_bytes()
            + 4 * b.shape.out_len() as u64
            + b.threads as u64 * PACK_BYTES_MAX;
        if need > budget {
            return;
        }
    }
    let Ok(mut base_out) = try_zeroed(b.shape.out_len(), "diff_against output") else {
        return;
    };
    if forward(&b, inputs, &mut base_out).is_ok() {
        record.max_abs_diff = Some(max_abs_diff(out, &base_out));
    }
}

/// max |a - b| in f64; a NaN difference counts as infinite.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let d = (*x as f64 - *y as f64).abs();
            if d.is_nan() {
                f64::INFINITY
            } else {
                d
            }
        })
        .fold(0.0, f64::max)
}
