//! The CUDA backend of the measuring sequence: inputs uploaded once; warm-up and
//! CUDA-event-timed repetitions (optional L2 flush before each, `run.gpu_cold`); one
//! checked call with the output poisoned with NaN, every launch synchronized and checked,
//! and the workspace allocated inside it under the device allocator's peak counter and the
//! budget; the output downloaded for the f64 oracle. Kernels are in `backend::cuda::ops`.
//! Costs the repetitions plus one upload and download of the tensors. The device code
//! needs the `cuda` feature; without it every CUDA case is skipped with the reason.

use crate::backend::cuda::plan;
use crate::error::Result;
use crate::measure::timer::{StopRule, Timing};
use crate::problem::{Case, Inputs};
use crate::results::record::Record;
use crate::run::{Backend, Settings, Step};
use crate::variant::impossible::Impossible;
use crate::variant::Registry;

/// NVIDIA GPUs, through `backend::cuda`.
pub struct Cuda;

/// Why a CUDA case cannot run: the variant has no CUDA kernels, its GPU algorithm does not
/// take the case, or there is no usable GPU here (no `cuda` feature, driver, device, NVRTC
/// or cuBLAS). The case's own reasons come first, so they read the same on every machine.
pub fn skip_reason(case: &Case) -> Option<String> {
    // The runner checks `variant::impossible` first; its words again for any other caller.
    let Some(algo) = case.variant.get().cuda() else {
        return Some(Impossible::NoCuda.message(case.variant, case.variant_name()));
    };
    plan::unsupported(algo, case).or_else(crate::backend::cuda::unavailable_reason)
}

impl Backend for Cuda {
    fn unavailable(&self, case: &Case) -> Option<String> {
        skip_reason(case)
    }

    fn predicted_bytes(&self, case: &Case) -> u64 {
        case.variant
            .get()
            .cuda()
            .map_or(0, |algo| plan::workspace_bytes(algo, case))
    }

    fn budget_terms(&self, case: &Case, predicted: u64) -> Vec<(u64, &'static str)> {
        vec![
            (predicted, "device workspace"),
            (case.io_bytes(), "inputs/outputs"),
        ]
    }

    /// The device budget binds in the checked call (`memory_pass`), where the workspace is
    /// allocated under the counter; host allocations are not limited.
    fn set_limit(&self, _limit: Option<u64>) {}

    fn step<'a>(
        &self,
        case: &'a Case,
        settings: &Settings,
        inputs: Option<&'a Inputs>,
    ) -> Result<Box<dyn Step + 'a>> {
        device::step(case, settings, inputs)
    }

    fn time(
        &self,
        _case: &Case,
        settings: &Settings,
        stop: &StopRule,
        step: &mut dyn Step,
    ) -> Result<(Timing, Option<f64>)> {
        // The CPU's machine-speed probe says nothing about the GPU.
        Ok((device::time(settings, stop, step)?, None))
    }

    fn memory_pass(
        &self,
        settings: &Settings,
        record: &mut Record,
        step: &mut dyn Step,
    ) -> Result<()> {
        record.mem_overhead_bytes = Some(device::memory_pass(settings, step)?);
        Ok(())
    }

    fn recover(&self) {
        device::recover();
    }
}

/// The device side: the forward step, event timing and the checked call.
#[cfg(feature = "cuda")]
mod device {
    use crate::backend::cuda::accounting;
    use crate::backend::cuda::device::{gpu, Gpu};
    use crate::backend::cuda::ops::{self, Io, Workspace};
    use crate::backend::cuda::plan::{self, GpuAlgo};
    use crate::error::{Error, Result};
    use crate::measure::timer::{time_measured_repetitions, StopRule, Timing};
    use crate::problem::{Case, Inputs};
    use crate::results::record::Record;
    use crate::run::{record_output_error, Settings, Step, INTERRUPTED};
    use crate::variant::Registry;

    /// The driver's allocation granularity assumed by the `cuMemGetInfo` cross-check.
    const DRIVER_GRANULARITY: u64 = 2 << 20;

    fn the_gpu() -> Result<&'static Gpu> {
        gpu().map_err(Error::Runtime)
    }

    pub fn step<'a>(
        case: &'a Case,
        settings: &Settings,
        inputs: Option<&'a Inputs>,
    ) -> Result<Box<dyn Step + 'a>> {
        let inputs = inputs.ok_or_else(|| Error::Runtime(format!("{}: no inputs", case.id())))?;
        let algo = case.variant.get().cuda().ok_or_else(|| {
            Error::Runtime(format!("variant {} has no CUDA kernels", case.variant))
        })?;
        let gpu = the_gpu()?;
        gpu.bind()?;
        let io = Io::upload(gpu, inputs)?;
        let ws = Workspace::alloc(gpu, algo, case)?;
        Ok(Box::new(ForwardStep {
            gpu,
            algo,
            case,
            inputs,
            tf32: settings.gpu.tf32,
            io,
            timed_ws: Some(ws),
            out: Vec::new(),
        }))
    }

    /// A forward case on the GPU: its inputs and output on the device, and the workspace
    /// of the timed calls (the checked call allocates its own, under the counter).
    struct ForwardStep<'a> {
        gpu: &'static Gpu,
        algo: GpuAlgo,
        case: &'a Case,
        inputs: &'a Inputs,
        tf32: bool,
        io: Io<'static>,
        timed_ws: Option<Workspace<'static>>,
        /// The checked call's output, downloaded.
        out: Vec<f32>,
    }

    impl Step for ForwardStep<'_> {
        fn call(&mut self) -> Result<()> {
            let ws = self.timed_ws.as_ref().ok_or_else(|| {
                Error::Runtime("the timed calls' workspace is already freed".into())
            })?;
            ops::forward(self.gpu, self.algo, self.case, &self.io, ws, self.tf32)
        }

        fn after_timing(&mut self, _record: &mut Record) {
            self.timed_ws = None;
        }

        fn poison(&mut self) -> Result<()> {
            self.gpu.poison_f32(&self.io.o)?;
            self.gpu.sync("poisoning the output")
        }

        fn checked_call(&mut self) -> Result<()> {
            let (gpu, case) = (self.gpu, self.case);
            let (_, _, allocs0) = gpu.counted();
            let (free0, _) = gpu.mem_info()?;
            let ws = Workspace::alloc(gpu, self.algo, case)?;
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
            ops::forward(gpu, self.algo, case, &self.io, &ws, self.tf32)?;
            gpu.sync("the checked pass")
        }

        fn check(&mut self, record: &mut Record, settings: &Settings) -> Result<()> {
            let mut out = vec![0f32; self.case.shape.out_len()];
            self.gpu.download(&self.io.o, &mut out)?;
            record_output_error(record, self.case, self.inputs, &out, settings.error_rows);
            self.out = out;
            Ok(())
        }

        fn into_output(self: Box<Self>) -> Vec<f32> {
            self.out
        }
    }

    /// Warm-up and CUDA-event-timed calls under the CPU's stopping rule; with
    /// `run.gpu_cold`, a memset of twice the L2 size before each.
    pub fn time(settings: &Settings, stop: &StopRule, step: &mut dyn Step) -> Result<Timing> {
        let gpu = the_gpu()?;
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
        let timing = time_measured_repetitions(stop, &INTERRUPTED, || {
            if let Some(f) = &flush {
                // A different byte each time, so no layer can skip the write.
                rep = rep.wrapping_add(1);
                gpu.memset(f, rep)?;
            }
            let ms = gpu.time_ms(|| step.call())?;
            Ok(ms / 1e3)
        })?;
        gpu.sync("the timed calls")?;
        Ok(timing)
    }

    /// The checked call with inputs and output live and the peak reset: the workspace is
    /// allocated inside it under the budget, and every launch is synchronized and checked.
    /// Returns the peak bytes above what was live before it.
    pub fn memory_pass(settings: &Settings, step: &mut dyn Step) -> Result<u64> {
        let gpu = the_gpu()?;
        gpu.set_limit(settings.memory_budget);
        gpu.set_sync_each(true);
        gpu.reset_peak();
        let (live0, _, _) = gpu.counted();
        let result = step.checked_call();
        gpu.set_sync_each(false);
        gpu.set_limit(None);
        result?;
        let (_, peak, _) = gpu.counted();
        Ok(peak - live0)
    }

    /// After a failed case: a failed launch may leave queued work, drained so the next case
    /// starts clean (an error here means the context is broken, which the next case reports).
    pub fn recover() {
        if let Ok(gpu) = gpu() {
            gpu.set_limit(None);
            gpu.set_sync_each(false);
            let _ = gpu.sync("a failed case");
        }
    }
}

/// Without the `cuda` feature every CUDA case is skipped (`skip_reason`) before these run.
#[cfg(not(feature = "cuda"))]
mod device {
    use crate::error::{Error, Result};
    use crate::measure::timer::{StopRule, Timing};
    use crate::problem::{Case, Inputs};
    use crate::run::{Settings, Step};

    fn not_built() -> Error {
        Error::Runtime("this attnbench was built without the `cuda` feature".into())
    }

    pub fn step<'a>(
        _case: &'a Case,
        _settings: &Settings,
        _inputs: Option<&'a Inputs>,
    ) -> Result<Box<dyn Step + 'a>> {
        Err(not_built())
    }

    pub fn time(_settings: &Settings, _stop: &StopRule, _step: &mut dyn Step) -> Result<Timing> {
        Err(not_built())
    }

    pub fn memory_pass(_settings: &Settings, _step: &mut dyn Step) -> Result<u64> {
        Err(not_built())
    }

    pub fn recover() {}
}
