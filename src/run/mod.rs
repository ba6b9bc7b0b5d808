//! The measuring sequence, written once for every mode and device, in the order
//! docs/methodology.md fixes: validate and predict memory (skip or `oom` with a reason,
//! never a crash) -> seeded inputs -> warm-up and timed repetitions until the stopping rule
//! -> outputs poisoned, one checked call under the memory counter -> error against the f64
//! oracle -> one `Record`. What differs by mode is a [`Step`] (the calls, the buffers, the
//! checks); what differs by device is a [`Backend`] (`cpu.rs`, `cuda.rs`: how calls are
//! timed and memory counted). `interleave.rs` and `extrapolate.rs` drive this sequence.
//! Costs the case's calls plus the oracle on the checked rows.

pub mod cpu;
pub mod cuda;
pub mod external;
pub mod extrapolate;
pub mod generate;
#[cfg(feature = "mpi")]
pub mod generate_ranks;
pub mod hbm_io;
pub mod interleave;
pub mod serve;
pub mod softmax;
pub mod tree_vs_ring;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::backend::cpu::gemm::PACK_BYTES_MAX;
use crate::backend::cpu::workspace::try_zeroed;
use crate::error::{Error, Result};
use crate::layer;
use crate::measure::timer::{StopRule, Timing};
use crate::problem::{Case, Device, Externals, Inputs, VariantId};
use crate::reference;
use crate::results::record::{Record, Status};
use crate::units;
use crate::variant::Registry;
use extrapolate::Extrapolation;

pub use crate::measure::pool::pool;
pub use cpu::{
    forward, forward_counted, forward_with, output, output_with, packing_bytes, predicted_bytes,
    train_step, train_step_with,
};

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
    /// The external implementations (`[plugins]`, `[python]`) its cases may name.
    pub externals: Externals,
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

/// What the measuring sequence asks of the device a case runs on. One implementation per
/// device (`cpu.rs`, `cuda.rs`), picked by [`backend_of`]: a new device is one file that
/// implements this trait and one arm there.
pub trait Backend: Sync {
    /// Why the case cannot run on this device (no kernels here for its variant or mode, no
    /// device), if so; asked after the reasons every device shares.
    fn unavailable(&self, case: &Case) -> Option<String>;
    /// Workspace bytes the case's kernels are predicted to allocate for its mode.
    fn predicted_bytes(&self, case: &Case) -> u64;
    /// What must fit in the memory budget, each with the name the `oom` reason gives it,
    /// the predicted workspace first.
    fn budget_terms(&self, case: &Case, predicted: u64) -> Vec<(u64, &'static str)>;
    /// Limits what the case may allocate while it is measured; `None` lifts the limit.
    fn set_limit(&self, limit: Option<u64>);
    /// The case's mode on this device, its buffers allocated (and inputs uploaded).
    /// `inputs` is `None` for the layer modes, whose step generates its own.
    fn step<'a>(
        &self,
        case: &'a Case,
        settings: &Settings,
        inputs: Option<&'a Inputs>,
    ) -> Result<Box<dyn Step + 'a>>;
    /// Warm-up and timed calls of `step` under `stop`, and the machine-speed probe around
    /// them where the device has one.
    fn time(
        &self,
        case: &Case,
        settings: &Settings,
        stop: &StopRule,
        step: &mut dyn Step,
    ) -> Result<(Timing, Option<f64>)>;
    /// `step`'s checked call under this device's memory counter, reset just before it (the
    /// inputs and outputs, already live, are excluded); writes `mem_overhead_bytes`.
    fn memory_pass(
        &self,
        settings: &Settings,
        record: &mut Record,
        step: &mut dyn Step,
    ) -> Result<()>;
    /// After a failed call: leaves the device ready for the next case.
    fn recover(&self) {}
    /// Whether `run.extrapolate_above_s` and `run.diff_against` apply to its cases: the
    /// estimate times one call by the host clock, and the paired difference runs the other
    /// variant's CPU forward.
    fn cpu_extras(&self) -> bool {
        false
    }
}

/// One mode of one case on one device, holding its buffers: the calls the sequence times
/// and checks. `cpu.rs` has a forward, a training step and a layer step; `cuda.rs` a forward.
pub trait Step: Send {
    /// One call of the mode, as it is timed (a device that runs asynchronously enqueues it).
    fn call(&mut self) -> Result<()>;
    /// One call and its seconds: by default the host clock around [`Step::call`]; a step
    /// whose calls run elsewhere reports that side's clock (`external.rs`: the worker's).
    fn timed_call(&mut self) -> Result<f64> {
        let t0 = Instant::now();
        self.call()?;
        Ok(t0.elapsed().as_secs_f64())
    }
    /// After the timed calls and their columns: the mode's own timing columns, and freeing
    /// what only the timed calls use.
    fn after_timing(&mut self, _record: &mut Record) {}
    /// Fills every output with NaN before the checked call: a value the kernel forgets to
    /// write then shows as an error.
    fn poison(&mut self) -> Result<()>;
    /// The call under the memory counter; by default [`Step::call`].
    fn checked_call(&mut self) -> Result<()> {
        self.call()
    }
    /// The checked call's outputs against the f64 oracle (a non-finite value makes the row
    /// `error`).
    fn check(&mut self, record: &mut Record, settings: &Settings) -> Result<()>;
    /// The checked call's output.
    fn into_output(self: Box<Self>) -> Vec<f32>;
}

/// The backend of a device.
pub fn backend_of(device: Device) -> &'static dyn Backend {
    match device {
        Device::Cpu => &cpu::Cpu,
        Device::Cuda => &cuda::Cuda,
    }
}

/// The backend that runs `case`: a worker process for an external implementation,
/// else its device's.
pub fn backend_for(case: &Case) -> &'static dyn Backend {
    match case.variant.engine() {
        crate::variant::Engine::Worker => &external::External,
        _ => backend_of(case.device),
    }
}

/// Why a case cannot run at all, if so. Checked before anything is allocated.
pub fn skip_reason(case: &Case) -> Option<String> {
    let info = case.variant.info();
    let s = &case.shape;
    // A combination the variant does not have (a sweep leaves these out), in its words.
    if let Some(why) = crate::variant::impossible::impossible(case) {
        return Some(why.message(case.variant, case.variant_name()));
    }
    if let Some(why) = too_large_to_count(case) {
        return Some(why);
    }
    if let Some(why) = precision_problem(case) {
        return Some(why);
    }
    if let Some(why) = case.prefix_problem() {
        return Some(why);
    }
    if let Some(why) = case.sinks_problem() {
        return Some(why);
    }
    // An MLA cache is read by the variants that read one, and only by them.
    match (case.mla, case.variant.get().reads_mla()) {
        (Some(_), false) => {
            return Some(format!(
                "variant {} reads no MLA cache: latent_dim and rope_dim apply to mla-decode only",
                case.variant_name()
            ))
        }
        (None, true) => {
            return Some(format!(
                "variant {} needs latent_dim and rope_dim (its MLA cache)",
                info.name
            ))
        }
        (Some(m), true) => {
            if let Some(why) = m.unsupported() {
                return Some(why);
            }
        }
        (None, false) => {}
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
    backend_for(case).unavailable(case)
}

/// Why CUDA cases are skipped in this process, if they are (`attnbench list` shows it too).
pub fn cuda_unavailable_reason() -> Option<String> {
    crate::backend::cuda::unavailable_reason()
}

/// What a measured case leaves besides its record.
pub struct Outcome {
    pub record: Record,
    /// The output of the checked call, when the case ran.
    pub output: Option<Vec<f32>>,
    /// The inputs it ran on (generated or given).
    pub inputs: Option<Inputs>,
    /// Seconds of each timed repetition, in call order (`samples.csv`); empty when the case
    /// was not run (skipped, oom by prediction) or failed.
    pub samples: Vec<f64>,
}

impl Outcome {
    /// A case that was not run: its row only.
    fn not_run(record: Record) -> Outcome {
        Outcome {
            record,
            output: None,
            inputs: None,
            samples: Vec::new(),
        }
    }
}

/// Measures one case. `given` replaces the generated inputs (`run --inputs`). Failures of
/// the case itself (oom, non-finite output) are rows, not errors; `Err` is kept for
/// failures of the harness.
pub fn run_case(case: &Case, settings: &Settings, given: Option<Inputs>) -> Result<Outcome> {
    let row = |status, reason: String| record_for(&settings.run_name, case, status, reason);
    if let Some(reason) = skip_reason(case) {
        return Ok(Outcome::not_run(row(Status::Skipped, reason)));
    }
    let backend = backend_for(case);
    let predicted = backend.predicted_bytes(case);
    let fixed = static_bytes(case, settings);
    if let Some(budget) = settings.memory_budget {
        let mut terms = backend.budget_terms(case, predicted);
        if fixed > 0 {
            terms.push((fixed, "rest of the model"));
        }
        let need: u64 = terms.iter().map(|t| t.0).sum();
        if need > budget {
            let terms: Vec<String> = terms
                .iter()
                .map(|(b, what)| format!("{} {what}", units::bytes_2dp(*b)))
                .collect();
            let reason = format!(
                "predicted {} = {} exceeds the memory budget {}",
                terms.join(" + "),
                units::bytes_2dp(need),
                units::bytes_2dp(budget)
            );
            let mut record = row(Status::Oom, reason);
            record.mem_predicted_bytes = Some(predicted);
            return Ok(Outcome::not_run(record));
        }
    }
    backend.set_limit(settings.memory_budget.map(|b| b.saturating_sub(fixed)));
    let mut outcome = match settings.extrapolate {
        Some(x) if backend.cpu_extras() => {
            measure_extrapolated(backend, case, settings, given, predicted, x)
        }
        _ => measure(backend, case, settings, given, predicted),
    };
    let o = &mut outcome;
    finish_outcome(
        backend,
        case,
        settings,
        o.inputs.as_ref(),
        &mut o.record,
        o.output.as_deref(),
    );
    backend.set_limit(None);
    Ok(outcome)
}

/// The sequence from inputs to record: the case's step on its backend, timed, then
/// [`after_timing`]. A failed call is the row's status and reason.
fn measure(
    backend: &dyn Backend,
    case: &Case,
    settings: &Settings,
    given: Option<Inputs>,
    predicted: u64,
) -> Outcome {
    let inputs = match (!case.mode.is_layer())
        .then(|| case_inputs(case, given))
        .transpose()
    {
        Ok(x) => x,
        Err(e) => return inputs_failed(case, settings, predicted, e),
    };
    let mut record = record_for(&settings.run_name, case, Status::Ok, "");
    record.mem_predicted_bytes = Some(predicted);
    let measured = (|| {
        let mut step = backend.step(case, settings, inputs.as_ref())?;
        let stop = stop_rule(case, &settings.stop);
        let (timing, probe) = backend.time(case, settings, &stop, step.as_mut())?;
        after_timing(backend, case, settings, &mut record, step, timing, probe)
    })();
    let (output, samples) = match measured {
        Ok((output, samples)) => (Some(output), samples),
        Err(e) => {
            backend.recover();
            fail(&mut record, e);
            (None, Vec::new())
        }
    };
    Outcome {
        record,
        output,
        inputs,
        samples,
    }
}

/// Everything after a step's timed calls: the timing's columns, the outputs poisoned, the
/// checked call under the memory counter, the errors against the oracle. Returns the
/// checked call's output and the timed samples. `interleave.rs` times its cases in
/// alternation and then runs this for each.
pub(crate) fn after_timing(
    backend: &dyn Backend,
    case: &Case,
    settings: &Settings,
    record: &mut Record,
    mut step: Box<dyn Step + '_>,
    timing: Timing,
    probe: Option<f64>,
) -> Result<(Vec<f32>, Vec<f64>)> {
    record_timing(record, case, &timing, probe);
    step.after_timing(record);
    step.poison()?;
    backend.memory_pass(settings, record, step.as_mut())?;
    // The f64 oracle is the harness's, not the emulated device's: its buffers do not count
    // against the budget (under a small one they would abort the process).
    let limit = crate::measure::alloc::limit();
    crate::measure::alloc::set_limit(None);
    let checked = step.check(record, settings);
    crate::measure::alloc::set_limit(limit);
    checked?;
    Ok((step.into_output(), timing.samples))
}

/// A failed call's row: `oom` when an allocation failed, `error` otherwise.
pub(crate) fn fail(record: &mut Record, e: Error) {
    record.status = match e {
        Error::OutOfMemory(_) => Status::Oom,
        Error::Unsupported(_) => Status::Skipped,
        Error::Timeout(_) => Status::Timeout,
        _ => Status::Error,
    };
    record.reason = e.to_string();
}

/// Why a case cannot keep P in f32 as `precision = highest` asks (a skipped row, never a
/// silently rounded P). attnbench's CPU kernels honour it: naive, rabe-staats, flash,
/// chunked-prefill and flash-varlen take their f32-P path (bf16 PV off), and every other
/// CPU variant already multiplies f32 P by f32 V (decode loops, ring, tree, layers), so it
/// runs the same code. The GPU kernels round P (tensor cores, TF32) and an external
/// implementation's arithmetic is its own.
pub fn precision_problem(case: &Case) -> Option<String> {
    if !case.highest() {
        return None;
    }
    if case.variant == VariantId::External {
        return Some(format!(
            "precision highest: {} is an external implementation, whose precision of P attnbench cannot set",
            case.variant_name()
        ));
    }
    if case.device == Device::Cuda {
        return Some(
            "precision highest runs on the CPU only: the CUDA kernels round P for PV (tensor cores in the storage dtype, TF32 GEMMs)"
                .into(),
        );
    }
    None
}

/// The columns every measured case gets after its own steps: the rows timed, and the
/// paired difference against `settings.diff_against` on the same inputs.
pub(crate) fn finish_outcome(
    backend: &dyn Backend,
    case: &Case,
    settings: &Settings,
    inputs: Option<&Inputs>,
    record: &mut Record,
    output: Option<&[f32]>,
) {
    if record.reps > 0 && record.timed_rows.is_none() {
        record.timed_rows = Some(case.shape.seq_q);
    }
    if let (true, Some(base), Some(inputs), Some(out)) =
        (backend.cpu_extras(), settings.diff_against, inputs, output)
    {
        paired_diff(case, settings, base, inputs, out, record);
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

/// Times the case on its first query chunks and scales, when one full call is estimated
/// above the cap and the case is eligible (see `extrapolate.rs`); otherwise `measure`. The
/// estimate is one call of the part, which also serves as a warm-up.
fn measure_extrapolated(
    backend: &dyn Backend,
    case: &Case,
    settings: &Settings,
    given: Option<Inputs>,
    predicted: u64,
    x: Extrapolation,
) -> Outcome {
    // Memory is never extrapolated: a case whose part needs another workspace runs whole.
    let Some((rows, part)) = extrapolation_part(backend, case, x) else {
        return measure(backend, case, settings, given, predicted);
    };
    let inputs = match case_inputs(case, given) {
        Ok(x) => x,
        Err(e) => return inputs_failed(case, settings, predicted, e),
    };
    let (part_inputs, full_q) = extrapolate::split_inputs(inputs, rows);
    let slow = part_is_slow(backend, case, (rows, &part), settings, &part_inputs, x);
    if !slow || interrupted() {
        let full = extrapolate::join_inputs(part_inputs, full_q, case.shape);
        return measure(backend, case, settings, Some(full), predicted);
    }
    drop(full_q);
    // The estimate call was a warm-up of exactly this part.
    let mut part_settings = settings.clone();
    part_settings.stop.warmup = settings.stop.warmup.saturating_sub(1);
    let outcome = measure(backend, &part, &part_settings, Some(part_inputs), predicted);
    extrapolate::scale_outcome(outcome, case, &settings.run_name, predicted)
}

/// The part `case` would be timed on under `x`, with its query rows: its first query
/// chunks, where the case can be split (`extrapolate::part_rows`) and the part needs the
/// case's own workspace.
fn extrapolation_part(
    backend: &dyn Backend,
    case: &Case,
    x: Extrapolation,
) -> Option<(usize, Case)> {
    let rows = extrapolate::part_rows(case, x.q_chunks)?;
    let part = extrapolate::part_case(case, rows);
    (backend.predicted_bytes(&part) == backend.predicted_bytes(case)).then_some((rows, part))
}

/// Whether one call of the part (of `rows` query rows) on `inputs` estimates the full
/// call of `case` above the cap.
fn part_is_slow(
    backend: &dyn Backend,
    case: &Case,
    (rows, part): (usize, &Case),
    settings: &Settings,
    inputs: &Inputs,
    x: Extrapolation,
) -> bool {
    time_one_call(backend, part, settings, inputs)
        .is_ok_and(|t| extrapolate::estimate_full_s(t, case, rows) > x.above_s)
}

/// Whether `measure_extrapolated` would time `case` on a part: it can be split, its part
/// needs the same workspace, and one call of the part estimates the full call above the
/// cap. Costs one call of the part, on inputs made for the part. An interleaved group
/// asks it of each member: a case timed on a part cannot alternate with whole ones.
pub(crate) fn would_extrapolate(case: &Case, settings: &Settings, x: Extrapolation) -> bool {
    let backend = backend_for(case);
    let Some((rows, part)) = extrapolation_part(backend, case, x) else {
        return false;
    };
    let Ok(inputs) = Inputs::try_for_case(&part) else {
        return false;
    };
    pool(case.threads).is_ok_and(|pool| {
        pool.install(|| part_is_slow(backend, case, (rows, &part), settings, &inputs, x))
    })
}

/// One call of the case's step, built afresh and timed once by the host clock: the
/// estimate of `measure_extrapolated` (only on backends whose calls return when the work
/// is done, `Backend::cpu_extras`).
fn time_one_call(
    backend: &dyn Backend,
    case: &Case,
    settings: &Settings,
    inputs: &Inputs,
) -> Result<f64> {
    let mut step = backend.step(case, settings, Some(inputs))?;
    let t0 = Instant::now();
    step.call()?;
    Ok(t0.elapsed().as_secs_f64())
}

/// The row of a case whose inputs could not be made (`oom` where they did not fit).
fn inputs_failed(case: &Case, settings: &Settings, predicted: u64, e: Error) -> Outcome {
    let mut record = record_for(&settings.run_name, case, Status::Ok, "");
    record.mem_predicted_bytes = Some(predicted);
    fail(&mut record, e);
    Outcome::not_run(record)
}

/// The given inputs (`run --inputs`) or the case's seeded ones, with the page pool a case
/// of a paged cache reads.
fn case_inputs(case: &Case, given: Option<Inputs>) -> Result<Inputs> {
    match given {
        Some(x) => x.share_prefix(case).try_prepared_for(case),
        None => Inputs::try_for_case(case),
    }
}

/// The timing's columns; `probe`: the machine-speed probe around it (CPU cases).
fn record_timing(record: &mut Record, case: &Case, timing: &Timing, probe: Option<f64>) {
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
    let rows = reference::rows_to_check_case(case, sample);
    // An FP8 cache: the kernel's error against the cache as stored, and beside it what the
    // quantization costs, against the unquantized K and V.
    let stored = match case.kv_dtype {
        Some(f) => match inputs.try_dequantized(f) {
            Ok(x) => {
                let raw = reference::check_case(case, inputs, out, &rows);
                record.max_abs_err_unquantized = Some(raw.max_abs);
                Some(x)
            }
            Err(e) => {
                record.status = Status::Error;
                record.reason = format!("the oracle's FP8 inputs: {e}");
                return;
            }
        },
        None => None,
    };
    let err = reference::check_case(case, stored.as_ref().unwrap_or(inputs), out, &rows);
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

/// The row of `case` before measuring, with what its variant determines (bytes of K and V
/// the decode variants read).
pub fn record_for(run: &str, case: &Case, status: Status, reason: impl Into<String>) -> Record {
    let mut record = Record::for_case(run, case, status, reason);
    record.kv_read_bytes = case.variant.get().kv_read_bytes(case);
    record
}

/// The paper's error measure (Rabe–Staats 5.1): max |out - out of `base`| over every output
/// value, both computed on the same inputs (the rows the case computed, when it was
/// extrapolated); untimed, after the memory counter. Left empty when `base` would not fit the
/// memory budget beside this case's inputs and output, or fails.
fn paired_diff(
    case: &Case,
    settings: &Settings,
    base: VariantId,
    inputs: &Inputs,
    out: &[f32],
    record: &mut Record,
) {
    // A ragged batch is only a ragged variant's to compute.
    let ragged = case.batch_spec.is_some() && !base.get().ragged();
    if base == case.variant || record.status != Status::Ok || ragged {
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
        let need = base.get().predict_workspace_bytes(&b, cpu::kernel_path(&b))
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

/// Byte and FLOP counts (4 b h n_q n_kv bytes of scores, 4 b h n_q n_kv d FLOPs) must
/// not wrap: a shape past them is refused before any count is taken (`Case::io_bytes` and
/// `Case::flops` are only meaningful when this is `None`).
pub fn too_large_to_count(case: &Case) -> Option<String> {
    let s = &case.shape;
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
    None
}
