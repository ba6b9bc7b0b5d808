//! Runs one CUDA case in the order docs/methodology.md fixes for every case: predict memory (`oom` row
//! over the budget) -> seeded inputs, uploaded -> warm-up and CUDA-event-timed repetitions
//! under the same stopping rule as the CPU (optional L2 flush before each) -> one untimed
//! checked pass (output poisoned with NaN, every launch synchronized and checked, workspace
//! allocated inside it under the device allocator's peak counter and the budget) -> error
//! against the f64 oracle -> one `Record`. Kernels are in `backend::cuda::ops`; the record
//! and CSV are the CPU's. Costs the repetitions plus one upload and download of the tensors.

use crate::backend::cuda::accounting;
use crate::backend::cuda::device::{gpu, Gpu};
use crate::backend::cuda::ops::{self, Io, Workspace};
use crate::backend::cuda::plan::{self, GpuAlgo};
use crate::error::{Error, Result};
use crate::measure::timer::{time_measured_repetitions, Timing};
use crate::problem::{Case, Inputs};
use crate::results::record::{Record, Status};
use crate::run::{
    failed, oom_by_prediction, oom_or_error, record_output_error, record_timing, Outcome, Settings,
    INTERRUPTED,
};
use crate::units;
use crate::variant::Registry;

/// The driver's allocation granularity assumed by the `cuMemGetInfo` cross-check.
const DRIVER_GRANULARITY: u64 = 2 << 20;

pub fn run_case(case: &Case, settings: &Settings, given: Option<Inputs>) -> Result<Outcome> {
    let row =
        |status, reason: String| crate::run::record_for(&settings.run_name, case, status, reason);
    let skipped = |reason: String| Outcome {
        record: row(Status::Skipped, reason),
        output: None,
        inputs: None,
        samples: Vec::new(),
    };
    let Some(algo) = case.variant.get().cuda() else {
        return Ok(skipped(format!(
            "variant {} has no CUDA kernels",
            case.variant
        )));
    };
    let gpu = match gpu() {
        Ok(g) => g,
        Err(why) => return Ok(skipped(why)),
    };
    gpu.bind()?;
    let predicted = plan::workspace_bytes(algo, case);
    if let Some(budget) = settings.memory_budget {
        let need = predicted + case.io_bytes();
        if need > budget {
            let reason = format!(
                "predicted {} device workspace + {} inputs/outputs = {} exceeds the memory budget {}",
                units::bytes_2dp(predicted),
                units::bytes_2dp(case.io_bytes()),
                units::bytes_2dp(need),
                units::bytes_2dp(budget)
            );
            return Ok(oom_by_prediction(row(Status::Oom, reason), predicted));
        }
    }
    let inputs = given.unwrap_or_else(|| {
        Inputs::generate(
            case.shape,
            case.dtype,
            case.input_dist,
            case.input_scale,
            case.seed,
        )
    });
    let mut record = row(Status::Ok, String::new());
    record.mem_predicted_bytes = Some(predicted);
    let result = measure(gpu, algo, case, settings, &inputs, &mut record);
    gpu.set_limit(None);
    gpu.set_sync_each(false);
    match result {
        Ok((out, timing)) => {
            record_output_error(&mut record, case, &inputs, &out, settings.error_rows);
            record.timed_rows = Some(case.shape.seq_q);
            Ok(Outcome {
                record,
                output: Some(out),
                inputs: Some(inputs),
                samples: timing.samples,
            })
        }
        Err(e) => {
            // A failed launch may leave queued work: drain it so the next case starts clean
            // (an error here means the context is broken, which the next case reports).
            let _ = gpu.sync("a failed case");
            let status = oom_or_error(&e);
            Ok(failed(record, status, e, Some(inputs)))
        }
    }
}

/// Timing, then the checked pass; returns the checked pass's output.
fn measure(
    gpu: &Gpu,
    algo: GpuAlgo,
    case: &Case,
    settings: &Settings,
    inputs: &Inputs,
    record: &mut Record,
) -> Result<(Vec<f32>, Timing)> {
    let tf32 = settings.gpu.tf32;
    let io = Io::upload(gpu, inputs)?;
    let timing = {
        let ws = Workspace::alloc(gpu, algo, case)?;
        let flush = match (settings.gpu.cold, gpu.info.l2_bytes) {
            (true, Some(l2)) => Some(gpu.alloc(plan::l2_flush_bytes(l2 as usize), "L2 flush")?),
            (true, None) => {
                return Err(Error::Runtime(
                    "cold timing needs the L2 size, which the driver did not report".into(),
                ))
            }
            (false, _) => None,
        };
        let mut rep = 0u8;
        let timing = time_measured_repetitions(&settings.stop, &INTERRUPTED, || {
            if let Some(f) = &flush {
                // A different byte each time, so no layer can skip the write.
                rep = rep.wrapping_add(1);
                gpu.memset(f, rep)?;
            }
            let ms = gpu.time_ms(|| ops::forward(gpu, algo, case, &io, &ws, tf32))?;
            Ok(ms / 1e3)
        })?;
        gpu.sync("the timed calls")?;
        timing
    };
    // The CPU probe says nothing about the GPU.
    record_timing(record, case, &timing, None);

    // The checked pass: inputs and output are live, the peak is reset, the workspace is
    // allocated inside (under the budget), every launch is synchronized and checked.
    gpu.poison_f32(&io.o)?;
    gpu.sync("poisoning the output")?;
    gpu.set_limit(settings.memory_budget);
    gpu.set_sync_each(true);
    gpu.reset_peak();
    let (live0, _, allocs0) = gpu.counted();
    let (free0, _) = gpu.mem_info()?;
    {
        let ws = Workspace::alloc(gpu, algo, case)?;
        let (free1, _) = gpu.mem_info()?;
        let (_, _, allocs1) = gpu.counted();
        let delta = free0.saturating_sub(free1) as u64;
        if !accounting::agrees(ws.bytes(), delta, allocs1 - allocs0, DRIVER_GRANULARITY) {
            // Another process on the GPU can move the driver's figure too: a warning, not
            // a failed row (tests/gpu.rs checks the agreement on an idle GPU).
            eprintln!(
                "warning: {}: the driver's free memory dropped by {delta} B for {} B of counted workspace",
                case.id(),
                ws.bytes()
            );
        }
        ops::forward(gpu, algo, case, &io, &ws, tf32)?;
        gpu.sync("the checked pass")?;
    }
    gpu.set_sync_each(false);
    gpu.set_limit(None);
    let (_, peak, _) = gpu.counted();
    record.mem_overhead_bytes = Some(peak - live0);
    let mut out = vec![0f32; case.shape.out_len()];
    gpu.download(&io.o, &mut out)?;
    Ok((out, timing))
}
