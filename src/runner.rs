//! Runs one case, in the order DESIGN.md fixes: validate and predict memory (skip or `oom`
//! with a reason, never a crash) -> seeded inputs -> warm-up and timed repetitions until the
//! stopping rule -> one untimed pass under the memory probe -> error against the f64 oracle
//! -> one `Record`. Kernels run inside a rayon pool of the case's thread count.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use rayon::{ThreadPool, ThreadPoolBuilder};

use crate::backend::cpu::gemm::PACK_BYTES_MAX;
use crate::backend::cpu::workspace::try_zeroed;
use crate::error::{Error, Result};
use crate::measure::alloc::{self, MemoryProbe};
use crate::measure::rss;
use crate::measure::stats::Summary;
use crate::measure::timer::{time_repetitions, StopRule, Timing};
use crate::problem::{Case, Device, Grads, Inputs, Mode};
use crate::reference;
use crate::report::record::{Record, Status};
use crate::sim::stats::SimStats;

/// Everything besides the case that decides how a case is measured.
#[derive(Clone, Debug)]
pub struct Settings {
    pub run_name: String,
    pub stop: StopRule,
    /// Emulated device memory: inputs + outputs + workspace must fit.
    pub memory_budget: Option<u64>,
    /// Query rows sampled for the error when checking all rows is too costly.
    pub error_rows: usize,
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
    if case.device == Device::Cuda {
        return Some(cuda_unavailable_reason());
    }
    if s.kv_heads > s.heads || s.heads % s.kv_heads != 0 {
        return Some(format!(
            "heads ({}) must be a multiple of kv_heads ({}) for grouped-query attention",
            s.heads, s.kv_heads
        ));
    }
    case.variant.get().unsupported(case)
}

/// Why CUDA cases are skipped in this build (`attnbench list` shows it too).
pub fn cuda_unavailable_reason() -> String {
    "this attnbench was built without the `cuda` feature (GPU backend not available)".to_string()
}

/// A rayon pool with exactly `threads` workers, built once per thread count.
pub fn pool(threads: usize) -> Result<Arc<ThreadPool>> {
    static POOLS: OnceLock<Mutex<HashMap<usize, Arc<ThreadPool>>>> = OnceLock::new();
    let pools = POOLS.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = pools.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = map.get(&threads) {
        return Ok(p.clone());
    }
    let p = Arc::new(
        ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("attnbench-{i}"))
            .build()
            .map_err(|e| Error::Runtime(format!("cannot start {threads} threads: {e}")))?,
    );
    map.insert(threads, p.clone());
    Ok(p)
}

/// One forward call of the case's variant into `out`, inside its thread pool.
pub fn forward(case: &Case, inputs: &Inputs, out: &mut [f32]) -> Result<()> {
    let variant = case.variant.get();
    pool(case.threads)?.install(|| variant.forward_cpu(case, inputs, out))
}

/// `forward`, returning the simulated devices' counters of multi-device variants.
pub fn forward_counted(case: &Case, inputs: &Inputs, out: &mut [f32]) -> Result<Option<SimStats>> {
    let variant = case.variant.get();
    pool(case.threads)?.install(|| variant.forward_counted(case, inputs, out))
}

/// The output of one case, computed once without measuring (for tests and `--save-output`).
pub fn output(case: &Case, inputs: &Inputs) -> Result<Vec<f32>> {
    let mut out = try_zeroed(case.shape.out_len(), "output")?;
    forward(case, inputs, &mut out)?;
    Ok(out)
}

/// What a measured case leaves besides its record.
pub struct Outcome {
    pub record: Record,
    /// The output of the probe pass, when the case ran.
    pub output: Option<Vec<f32>>,
    /// The inputs it ran on (generated or given).
    pub inputs: Option<Inputs>,
}

/// Measures one case. `given` replaces the generated inputs (`run --inputs`). Failures of
/// the case itself (oom, non-finite output) are rows, not errors; `Err` is kept for
/// failures of the harness.
pub fn run_case(case: &Case, settings: &Settings, given: Option<Inputs>) -> Result<Outcome> {
    let row = |status, reason: String| Record::for_case(&settings.run_name, case, status, reason);
    if let Some(reason) = skip_reason(case) {
        return Ok(Outcome {
            record: row(Status::Skipped, reason),
            output: None,
            inputs: None,
        });
    }
    let variant = case.variant.get();
    let predicted = match case.mode {
        Mode::FwdBwd => variant.predict_train_workspace_bytes(case),
        _ => variant.predict_workspace_bytes(case),
    };
    if let Some(budget) = settings.memory_budget {
        // The GEMM's packing buffers are allocated infallibly (an allocation over the limit
        // there would abort), so they must fit too: one per thread at most.
        let packing = case.threads as u64 * PACK_BYTES_MAX;
        let need = predicted + case.io_bytes() + packing;
        if need > budget {
            let mut r = row(
                Status::Oom,
                format!(
                    "predicted {} workspace + {} inputs/outputs + {} GEMM packing = {} exceeds the memory budget {}",
                    human_bytes(predicted),
                    human_bytes(case.io_bytes()),
                    human_bytes(packing),
                    human_bytes(need),
                    human_bytes(budget)
                ),
            );
            r.mem_predicted_bytes = Some(predicted);
            return Ok(Outcome {
                record: r,
                output: None,
                inputs: None,
            });
        }
    }
    alloc::set_limit(settings.memory_budget);
    let result = match case.mode {
        Mode::FwdBwd => measure_train(case, settings, given, predicted),
        _ => measure(case, settings, given, predicted),
    };
    alloc::set_limit(None);
    result
}

fn measure(
    case: &Case,
    settings: &Settings,
    given: Option<Inputs>,
    predicted: u64,
) -> Result<Outcome> {
    let mut record = Record::for_case(&settings.run_name, case, Status::Ok, "");
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

    let timing = time_repetitions(&settings.stop, &INTERRUPTED, || {
        forward(case, &inputs, &mut out)
    });
    let timing = match timing {
        Ok(t) => t,
        Err(e) => {
            let status = oom_or_error(&e);
            return Ok(failed(record, status, e, Some(inputs)));
        }
    };
    record_timing(&mut record, case, &timing);

    // The probe pass: poisoned output (a row the kernel forgets to write stays NaN and shows
    // as an error), peak reset just before the call, so the overhead excludes inputs and
    // outputs, which are already live.
    out.fill(f32::NAN);
    rss::reset_peak_rss();
    let probe = MemoryProbe::start();
    let pass = forward_counted(case, &inputs, &mut out);
    let overhead = probe.finish();
    match pass {
        Err(e) => {
            let status = oom_or_error(&e);
            return Ok(failed(record, status, e, Some(inputs)));
        }
        Ok(Some(stats)) => record.set_sim(&stats),
        Ok(None) => {}
    }
    record.mem_overhead_bytes = Some(overhead);
    record.peak_rss_bytes = rss::peak_rss_bytes();

    record_output_error(&mut record, case, &inputs, &out, settings.error_rows);
    Ok(Outcome {
        record,
        output: Some(out),
        inputs: Some(inputs),
    })
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
    let mut record = Record::for_case(&settings.run_name, case, Status::Ok, "");
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
    let timing = time_repetitions(&settings.stop, &INTERRUPTED, || {
        bwd_times.push(train_step(case, &inputs, &d_out, &mut out, &mut grads)?);
        Ok(())
    });
    let timing = match timing {
        Ok(t) => t,
        Err(e) => {
            let status = oom_or_error(&e);
            return Ok(failed(record, status, e, Some(inputs)));
        }
    };
    record_timing(&mut record, case, &timing);
    // Warm-up calls come first: the timed ones are the last `reps`.
    let timed = &bwd_times[bwd_times.len().saturating_sub(timing.samples.len())..];
    record.time_bwd_median_s = Summary::of(timed).map(|s| s.median);

    out.fill(f32::NAN);
    for g in [&mut grads.dq, &mut grads.dk, &mut grads.dv] {
        g.fill(f32::NAN);
    }
    rss::reset_peak_rss();
    let probe = MemoryProbe::start();
    let pass = train_step(case, &inputs, &d_out, &mut out, &mut grads);
    let overhead = probe.finish();
    if let Err(e) = pass {
        let status = oom_or_error(&e);
        return Ok(failed(record, status, e, Some(inputs)));
    }
    record.mem_overhead_bytes = Some(overhead);
    record.peak_rss_bytes = rss::peak_rss_bytes();

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
    let variant = case.variant.get();
    pool(case.threads)?.install(|| {
        let saved = variant.forward_train_cpu(case, inputs, out)?;
        let start = Instant::now();
        variant.backward_cpu(case, inputs, out, &saved, d_out, grads)?;
        Ok(start.elapsed().as_secs_f64())
    })
}

fn record_timing(record: &mut Record, case: &Case, timing: &Timing) {
    let sm = &timing.summary;
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
fn record_output_error(
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

fn oom_or_error(e: &Error) -> Status {
    match e {
        Error::OutOfMemory(_) => Status::Oom,
        _ => Status::Error,
    }
}

fn failed(mut record: Record, status: Status, e: Error, inputs: Option<Inputs>) -> Outcome {
    record.status = status;
    record.reason = e.to_string();
    Outcome {
        record,
        output: None,
        inputs,
    }
}

/// Bytes as a short human string with binary units ("1.50 GiB").
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}
