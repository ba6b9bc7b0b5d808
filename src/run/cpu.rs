//! The CPU backend of the measuring sequence: kernels run in a warm rayon pool of the case's
//! thread count (`measure::pool`), timed by the host clock with the machine-speed probe
//! around the timed calls (`measure::probe`); memory is the counting allocator's peak over
//! one cold call (`measure::alloc`). Its steps: a forward (fwd, decode), a training step
//! (fwd+bwd) and a transformer layer (layer-fwd, layer-train). Cost: the case's calls.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use rayon::ThreadPool;

use crate::backend::cpu::gemm::PACK_BYTES_MAX;
use crate::backend::cpu::isa::Isa;
use crate::backend::cpu::workspace::{try_zeroed, WarmCalls};
use crate::error::{Error, Result};
use crate::layer;
use crate::measure::alloc::{self, OverheadMeter};
use crate::measure::probe::probe_pool;
use crate::measure::rss;
use crate::measure::stats::Summary;
use crate::measure::timer::{time_repetitions, StopRule, Timing};
use crate::problem::{Case, Grads, Inputs, Mode};
use crate::reference;
use crate::results::record::{Record, Status};
use crate::run::{pool, record_output_error, Backend, Settings, Step, INTERRUPTED};
use crate::sim::stats::SimStats;
use crate::variant::{Engine, Registry};

/// The CPU: the device every variant runs on.
pub struct Cpu;

impl Backend for Cpu {
    fn unavailable(&self, case: &Case) -> Option<String> {
        case.variant.get().unsupported(case)
    }

    fn predicted_bytes(&self, case: &Case) -> u64 {
        predicted_bytes(case)
    }

    fn budget_terms(&self, case: &Case, predicted: u64) -> Vec<(u64, &'static str)> {
        // The backward GEMM's packing buffers are allocated infallibly (an allocation over
        // the limit there would abort), so they must fit too: one per thread at most.
        vec![
            (predicted, "workspace"),
            (case.io_bytes(), "inputs/outputs"),
            (packing_bytes(case), "GEMM packing"),
        ]
    }

    fn set_limit(&self, limit: Option<u64>) {
        alloc::set_limit(limit);
    }

    fn step<'a>(
        &self,
        case: &'a Case,
        _settings: &Settings,
        inputs: Option<&'a Inputs>,
    ) -> Result<Box<dyn Step + 'a>> {
        let missing =
            || Error::Runtime(format!("{}: a {} case needs inputs", case.id(), case.mode));
        Ok(match case.mode {
            Mode::LayerFwd | Mode::LayerTrain => Box::new(LayerStep::new(case)?),
            Mode::FwdBwd => Box::new(TrainStep::new(case, inputs.ok_or_else(missing)?)?),
            Mode::Fwd | Mode::Decode => {
                Box::new(ForwardStep::new(case, inputs.ok_or_else(missing)?)?)
            }
        })
    }

    fn time(
        &self,
        case: &Case,
        _settings: &Settings,
        stop: &StopRule,
        step: &mut dyn Step,
    ) -> Result<(Timing, Option<f64>)> {
        let (timing, probe) = time_on_worker(case, stop, || step.call())?;
        Ok((timing, Some(probe)))
    }

    fn memory_pass(
        &self,
        _settings: &Settings,
        record: &mut Record,
        step: &mut dyn Step,
    ) -> Result<()> {
        rss::reset_peak_rss();
        let meter = OverheadMeter::start();
        let result = step.checked_call();
        let overhead = meter.finish();
        result?;
        record.mem_overhead_bytes = Some(overhead);
        record.peak_rss_bytes = rss::peak_rss_bytes();
        Ok(())
    }

    fn cpu_extras(&self) -> bool {
        true
    }
}

/// Runs a timing loop on a worker of the case's pool: each timed call then starts on that
/// worker (a kernel's `install` of the same pool runs inline), so no call pays a hand-off
/// to a sleeping thread, which on a small case can cost as much as the kernel. The loop
/// runs warm (`WarmCalls`): a kernel's scratch buffers are those the previous call freed,
/// not fresh pages the operating system must zero. The memory counter runs after it, cold.
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
    let flag = if case.variant.engine() == Engine::Mpi {
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

/// A forward (or decode) case: one call writes the output; the checked call also counts
/// the simulated devices' traffic of multi-device variants.
struct ForwardStep<'a> {
    case: &'a Case,
    inputs: &'a Inputs,
    out: Vec<f32>,
    sim: Option<SimStats>,
    /// A call of several serving steps (chunked prefill): the seconds of each step of the
    /// last call, and the longest step of every call, warm-up included.
    step_s: Vec<f64>,
    step_max: Vec<f64>,
}

impl<'a> ForwardStep<'a> {
    fn new(case: &'a Case, inputs: &'a Inputs) -> Result<Self> {
        let steps = case.variant.get().steps(case);
        Ok(ForwardStep {
            case,
            inputs,
            out: try_zeroed(case.shape.out_len(), "output")?,
            sim: None,
            step_s: if steps > 1 {
                vec![0.0; steps]
            } else {
                Vec::new()
            },
            step_max: Vec::new(),
        })
    }
}

impl Step for ForwardStep<'_> {
    fn call(&mut self) -> Result<()> {
        if self.step_s.is_empty() {
            return forward(self.case, self.inputs, &mut self.out);
        }
        forward_steps(self.case, self.inputs, &mut self.out, &mut self.step_s)?;
        self.step_max
            .push(self.step_s.iter().copied().fold(0.0, f64::max));
        Ok(())
    }

    fn after_timing(&mut self, record: &mut Record) {
        // Warm-up calls come first: the timed ones are the last `reps`.
        if !self.step_max.is_empty() {
            let timed = &self.step_max[self.step_max.len().saturating_sub(record.reps)..];
            record.step_max_median_s = Summary::of(timed).map(|s| s.median);
        }
    }

    fn poison(&mut self) -> Result<()> {
        self.out.fill(f32::NAN);
        Ok(())
    }

    fn checked_call(&mut self) -> Result<()> {
        self.sim = forward_counted(self.case, self.inputs, &mut self.out)?;
        Ok(())
    }

    fn check(&mut self, record: &mut Record, settings: &Settings) -> Result<()> {
        if let Some(stats) = &self.sim {
            record.set_sim(stats);
        }
        // Under MPI only rank 0 writes the record, and only it has every output row (prefill).
        if crate::dist::is_root() {
            record_output_error(
                record,
                self.case,
                self.inputs,
                &self.out,
                settings.error_rows,
            );
        }
        Ok(())
    }

    fn into_output(self: Box<Self>) -> Vec<f32> {
        self.out
    }
}

/// Forward + backward: each call is a training step, whose backward is also timed alone;
/// the checked call's output and gradients are checked against the oracle (inputs, dO,
/// output and gradients are live before it, so the memory excludes them).
struct TrainStep<'a> {
    case: &'a Case,
    inputs: &'a Inputs,
    d_out: Vec<f32>,
    out: Vec<f32>,
    grads: Grads,
    /// Seconds of the backward of every call, warm-up included.
    bwd_times: Vec<f64>,
}

impl<'a> TrainStep<'a> {
    fn new(case: &'a Case, inputs: &'a Inputs) -> Result<Self> {
        let s = &case.shape;
        let d_out = case.d_out.make(s, case.seed);
        Ok(TrainStep {
            case,
            inputs,
            d_out,
            out: try_zeroed(s.out_len(), "output")?,
            grads: Grads {
                dq: try_zeroed(s.q_len(), "dQ")?,
                dk: try_zeroed(s.kv_len(), "dK")?,
                dv: try_zeroed(s.kv_len(), "dV")?,
            },
            bwd_times: Vec::new(),
        })
    }

    fn step(&mut self) -> Result<f64> {
        train_step(
            self.case,
            self.inputs,
            &self.d_out,
            &mut self.out,
            &mut self.grads,
        )
    }
}

impl Step for TrainStep<'_> {
    fn call(&mut self) -> Result<()> {
        let bwd = self.step()?;
        self.bwd_times.push(bwd);
        Ok(())
    }

    fn after_timing(&mut self, record: &mut Record) {
        // Warm-up calls come first: the timed ones are the last `reps`.
        let timed = &self.bwd_times[self.bwd_times.len().saturating_sub(record.reps)..];
        record.time_bwd_median_s = Summary::of(timed).map(|s| s.median);
    }

    fn poison(&mut self) -> Result<()> {
        let g = &mut self.grads;
        for v in [&mut self.out, &mut g.dq, &mut g.dk, &mut g.dv] {
            v.fill(f32::NAN);
        }
        Ok(())
    }

    fn checked_call(&mut self) -> Result<()> {
        self.step().map(|_| ())
    }

    fn check(&mut self, record: &mut Record, settings: &Settings) -> Result<()> {
        let (case, inputs) = (self.case, self.inputs);
        record_output_error(record, case, inputs, &self.out, settings.error_rows);
        let g = reference::grad::check(
            inputs,
            (case.causal, case.window, case.sinks.unwrap_or(0)),
            &self.d_out,
            &self.grads,
            settings.error_rows,
        );
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
        Ok(())
    }

    fn into_output(self: Box<Self>) -> Vec<f32> {
        self.out
    }
}

/// A transformer-layer case (`crate::layer`): seeded parameters and input, a forward or a
/// checkpointed training step per call (x, out, parameters and, for training, dout, dx and
/// the parameter gradient are live before the checked call), then output and gradient
/// errors against the f64 oracle.
struct LayerStep<'a> {
    case: &'a Case,
    params: Vec<f32>,
    x: Vec<f32>,
    d_out: Vec<f32>,
    out: Vec<f32>,
    dx: Vec<f32>,
    dp: Vec<f32>,
    isa: Isa,
    threads: Arc<ThreadPool>,
    plan: layer::plan::Plan,
}

impl<'a> LayerStep<'a> {
    fn new(case: &'a Case) -> Result<Self> {
        let train = case.mode == Mode::LayerTrain;
        let (params, x) = layer::generate(case);
        let d_out = if train {
            case.d_out.make(&case.shape, case.seed)
        } else {
            Vec::new()
        };
        let n = case.tokens_len();
        let out = try_zeroed(n, "layer output")?;
        let (dx, dp) = if train {
            (
                try_zeroed(n, "dx")?,
                try_zeroed(params.len(), "parameter gradient")?,
            )
        } else {
            (Vec::new(), Vec::new())
        };
        Ok(LayerStep {
            case,
            params,
            x,
            d_out,
            out,
            dx,
            dp,
            isa: kernel_path(case),
            threads: pool(case.threads)?,
            plan: crate::variant::layer_plan(case)?,
        })
    }
}

impl Step for LayerStep<'_> {
    fn call(&mut self) -> Result<()> {
        let s = self;
        s.threads.install(|| {
            layer::run_once(
                &s.plan, s.isa, &s.params, &s.x, &s.d_out, &mut s.out, &mut s.dx, &mut s.dp,
            )
        })
    }

    fn poison(&mut self) -> Result<()> {
        for v in [&mut self.out, &mut self.dx, &mut self.dp] {
            layer::poison(v);
        }
        Ok(())
    }

    fn check(&mut self, record: &mut Record, _settings: &Settings) -> Result<()> {
        let case = self.case;
        let train = case.mode == Mode::LayerTrain;
        let grads = train.then_some((&self.d_out[..], &self.dx[..], &self.dp[..]));
        let err = layer::check(case, &self.params, &self.x, &self.out, grads);
        record.max_abs_err = Some(err.out_max_abs);
        record.max_rel_err = Some(err.out_max_rel);
        record.err_rows = Some(err.out_rows);
        // Some exactly when training: `layer::check` checks every gradient, or past
        // `FULL_CHECK_MAX_MACS` (causal) the last tokens' dx, never none.
        if let Some((abs, rel)) = err.grad {
            record.grad_max_abs_err = Some(abs);
            record.grad_max_rel_err = Some(rel);
            record.grad_err_rows = Some(err.grad_rows);
            record.grad_err_scope = if err.grad_last_rows {
                format!("dx of the last {} tokens", err.grad_rows)
            } else {
                "all".into()
            };
        }
        if err.non_finite > 0 {
            record.status = Status::Error;
            record.reason = format!("{} checked values are NaN or infinite", err.non_finite);
        }
        Ok(())
    }

    fn into_output(self: Box<Self>) -> Vec<f32> {
        self.out
    }
}

/// The kernel path a case runs on: the one it forces, else this CPU's measured choice.
pub fn kernel_path(case: &Case) -> Isa {
    case.kernel_path.unwrap_or_else(Isa::detect)
}

/// One forward call of the case's variant into `out`, inside its thread pool, on the
/// case's kernel path ([`kernel_path`]).
pub fn forward(case: &Case, inputs: &Inputs, out: &mut [f32]) -> Result<()> {
    forward_with(case, kernel_path(case), inputs, out)
}

/// [`forward`] on a given kernel path (tests run every path the CPU has).
pub fn forward_with(case: &Case, isa: Isa, inputs: &Inputs, out: &mut [f32]) -> Result<()> {
    check_call(case, isa, inputs)?;
    let variant = case.variant.get();
    pool(case.threads)?.install(|| variant.forward_cpu(case, isa, inputs, out))
}

/// [`forward`] of a call made of several serving steps, writing each step's seconds into
/// `step_s` (`Variant::steps` of them).
pub fn forward_steps(
    case: &Case,
    inputs: &Inputs,
    out: &mut [f32],
    step_s: &mut [f64],
) -> Result<()> {
    let isa = kernel_path(case);
    check_call(case, isa, inputs)?;
    let variant = case.variant.get();
    pool(case.threads)?.install(|| variant.forward_cpu_steps(case, isa, inputs, out, step_s))
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
    let isa = kernel_path(case);
    check_call(case, isa, inputs)?;
    let variant = case.variant.get();
    pool(case.threads)?.install(|| variant.forward_counted(case, isa, inputs, out))
}

/// The output of one case, computed once without measuring (for tests and `--save-output`).
pub fn output(case: &Case, inputs: &Inputs) -> Result<Vec<f32>> {
    output_with(case, kernel_path(case), inputs)
}

/// [`output`] on a given kernel path.
pub fn output_with(case: &Case, isa: Isa, inputs: &Inputs) -> Result<Vec<f32>> {
    let mut out = try_zeroed(case.shape.out_len(), "output")?;
    forward_with(case, isa, inputs, &mut out)?;
    Ok(out)
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
    train_step_with(case, kernel_path(case), inputs, d_out, out, grads)
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
        variant.backward_cpu(case, isa, inputs, out, &saved, d_out, grads)?;
        Ok(start.elapsed().as_secs_f64())
    })
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

/// The workspace bytes the case's variant predicts for the case's mode.
pub fn predicted_bytes(case: &Case) -> u64 {
    let variant = case.variant.get();
    match case.mode {
        Mode::FwdBwd => variant.predict_train_workspace_bytes(case, kernel_path(case)),
        _ => variant.predict_workspace_bytes(case, kernel_path(case)),
    }
}
