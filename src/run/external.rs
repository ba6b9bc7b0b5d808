//! The backend of external implementations (`plugin:NAME`, `python:NAME`): each runs in a
//! worker process of its own (`attnbench worker --plugin LIB`, `python -m attnbench_peer`),
//! driven call by call over the worker protocol (docs/reference/worker-protocol.md), so
//! the driver keeps the schedule: the same stopping rule, warm-up and rounds as its own
//! cases, interleaved with them (`interleave.rs`). The inputs go to the worker as raw f32
//! files, the checked call's output comes back the same way and meets the same f64 oracle.
//! A worker that crashes, hangs past its `timeout_s` or answers with an error costs one
//! row (`error`, `timeout`) and is started afresh for the next case. An output off the
//! oracle by more than the dtype's tolerance makes the row `error`: for foreign code that
//! is a wrong result, not a precision to report. Cost per timed call: one pipe round trip
//! besides the call, which the worker's own clock leaves out of the sample.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::{record_output_error, Backend, Settings, Step, INTERRUPTED};
use crate::error::{Error, Result};
use crate::measure::timer::{time_measured_repetitions, StopRule, Timing};
use crate::problem::{Case, ExternalSpec, Inputs};
use crate::results::record::{Record, Status};
use crate::worker::client::{this_executable, Failure, Worker};
use crate::worker::files;
use crate::worker::protocol::{Called, Checked, InputFiles, Prepared, Released, Request};

pub struct External;

/// Workers kept between cases, by [`worker_key`]; a step takes its worker out and puts it
/// back when it ends, unless the worker was lost.
static WORKERS: Mutex<BTreeMap<String, Worker>> = Mutex::new(BTreeMap::new());

impl Backend for External {
    fn unavailable(&self, _case: &Case) -> Option<String> {
        None
    }

    /// Unknown before the worker is asked (`prepare` may report the plugin's prediction).
    fn predicted_bytes(&self, _case: &Case) -> u64 {
        0
    }

    fn budget_terms(&self, case: &Case, _predicted: u64) -> Vec<(u64, &'static str)> {
        vec![(case.io_bytes(), "inputs/outputs")]
    }

    /// The worker is another process: the budget goes to it with `prepare`, where the
    /// plugin host's allocator table enforces it.
    fn set_limit(&self, _limit: Option<u64>) {}

    fn step<'a>(
        &self,
        case: &'a Case,
        settings: &Settings,
        inputs: Option<&'a Inputs>,
    ) -> Result<Box<dyn Step + 'a>> {
        let name = case.variant_name();
        let spec = settings.externals.get(name).ok_or_else(|| {
            Error::Runtime(format!(
                "{name} is not defined in this run's [plugins] or [python] tables"
            ))
        })?;
        let inputs = inputs.ok_or_else(|| Error::Runtime(format!("{name}: no inputs")))?;
        let files = Files::write(inputs)?;
        let worker = take_worker(case, spec)?;
        let mut step = ExternalStep {
            case,
            inputs,
            worker: Some(worker),
            files,
            workspace_bytes: None,
            checked: None,
            output: Vec::new(),
        };
        let prepare = Request::Prepare {
            case: Box::new(case.clone()),
            inputs: step.files.inputs(),
            output: step.files.output(),
            memory_budget: settings.memory_budget,
        };
        let prepared: Prepared = step.request(&prepare)?;
        if !prepared.supported {
            return Err(Error::Unsupported(prepared.reason));
        }
        step.workspace_bytes = prepared.workspace_bytes;
        Ok(Box::new(step))
    }

    fn time(
        &self,
        _case: &Case,
        _settings: &Settings,
        stop: &StopRule,
        step: &mut dyn Step,
    ) -> Result<(Timing, Option<f64>)> {
        let timing = time_measured_repetitions(stop, &INTERRUPTED, || step.timed_call())?;
        Ok((timing, None))
    }

    /// The worker's checked call; its figure reaches the row in `Step::check`.
    fn memory_pass(&self, _: &Settings, _: &mut Record, step: &mut dyn Step) -> Result<()> {
        step.checked_call()
    }
}

/// Which kept worker serves `case`: one per implementation and thread count, since the
/// thread pools of NumPy's BLAS and of OpenMP are sized once, when the process starts.
fn worker_key(case: &Case) -> String {
    format!("{} (threads {})", case.variant_name(), case.threads)
}

/// The worker of `case`'s implementation: the one kept from an earlier case, or a new one.
fn take_worker(case: &Case, spec: &ExternalSpec) -> Result<Worker> {
    let name = case.variant_name();
    let kept = WORKERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&worker_key(case));
    if let Some(mut w) = kept {
        if w.alive() {
            return Ok(w);
        }
    }
    let timeout = Duration::from_secs_f64(spec.timeout_s());
    let mut command = match spec {
        ExternalSpec::Plugin { library, .. } => {
            let mut c = Command::new(this_executable()?);
            c.arg("worker").arg("--plugin").arg(library);
            c
        }
        ExternalSpec::Python {
            call,
            arrays,
            python,
            path,
            ..
        } => {
            let mut c = Command::new(python);
            c.args(["-m", "attnbench_peer", "--arrays", arrays, call]);
            c.env("PYTHONPATH", python_path(path));
            // The case's threads for the native libraries a callable may use (NumPy's
            // BLAS, MKL, OpenMP); torch takes them from `prepare` too.
            let threads = case.threads.to_string();
            for var in THREAD_VARS {
                c.env(var, &threads);
            }
            c
        }
    };
    // A process group of its own: Ctrl-C stops the sweep after the current call (the
    // driver's handler), and does not kill the worker in the middle of it.
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    #[cfg(target_os = "linux")]
    pin_to_first_cpus(&mut command, case.threads);
    Worker::spawn(name, command, timeout)
}

/// Runs the worker on the first `threads` CPUs this process may use. Every worker of a
/// thread count then shares the same CPUs: on a VM whose vCPUs run at different speeds
/// (one stolen from more than the other), the scheduler otherwise keeps each worker on the
/// vCPU it started on, and two copies of one kernel timed in the same rounds measured 1.6x
/// apart. Left as it is when the affinity cannot be read.
#[cfg(target_os = "linux")]
fn pin_to_first_cpus(command: &mut Command, threads: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; sched_getaffinity fills it.
    let mut allowed: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `allowed` is a valid set of `size` bytes.
    if unsafe { libc::sched_getaffinity(0, size, &mut allowed) } != 0 {
        return;
    }
    // SAFETY: as above.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let cpus = (0..libc::CPU_SETSIZE as usize)
        // SAFETY: CPU_ISSET reads a valid set within CPU_SETSIZE.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &allowed) })
        .take(threads.max(1));
    for c in cpus {
        // SAFETY: c < CPU_SETSIZE.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: between fork and exec only sched_setaffinity (a system call) runs, on the
    // child's own pid; `set` is copied into the closure.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(command, move || {
            libc::sched_setaffinity(0, size, &set);
            Ok(())
        });
    }
}

/// The environment variables that size native thread pools at process start.
const THREAD_VARS: [&str; 5] = [
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
];

/// `path`, then this source tree's `python/` (where `attnbench_peer` lives when attnbench
/// was built from source and the package is not installed), then the caller's PYTHONPATH.
fn python_path(path: &[PathBuf]) -> std::ffi::OsString {
    let mut dirs: Vec<PathBuf> = path.to_vec();
    let own = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python");
    if own.is_dir() {
        dirs.push(own);
    }
    if let Some(p) = std::env::var_os("PYTHONPATH") {
        dirs.extend(std::env::split_paths(&p));
    }
    std::env::join_paths(dirs).unwrap_or_default()
}

/// The inputs and the output of one case, as raw f32 files in a directory of their own
/// (removed when the step ends).
struct Files {
    dir: PathBuf,
}

impl Files {
    fn write(inputs: &Inputs) -> Result<Files> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "attnbench-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let made = Files { dir };
        let paths = made.inputs();
        for (path, t) in [
            (&paths.q, &inputs.q),
            (&paths.k, &inputs.k),
            (&paths.v, &inputs.v),
        ] {
            files::write(path, t)?;
        }
        Ok(made)
    }

    fn inputs(&self) -> InputFiles {
        InputFiles {
            q: self.dir.join("q.f32"),
            k: self.dir.join("k.f32"),
            v: self.dir.join("v.f32"),
        }
    }

    fn output(&self) -> PathBuf {
        self.dir.join("o.f32")
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One prepared case in a worker.
struct ExternalStep<'a> {
    case: &'a Case,
    inputs: &'a Inputs,
    /// `None` once lost (crashed, hung, broke the protocol).
    worker: Option<Worker>,
    files: Files,
    workspace_bytes: Option<u64>,
    checked: Option<Checked>,
    output: Vec<f32>,
}

impl ExternalStep<'_> {
    fn request<T: serde::de::DeserializeOwned>(&mut self, req: &Request) -> Result<T> {
        let name = self.case.variant_name();
        let w = self
            .worker
            .as_mut()
            .ok_or_else(|| Error::Runtime(format!("the {name} worker was lost")))?;
        w.request(req).map_err(|f| {
            let lost = !matches!(f, Failure::Refused(_));
            let e = match f {
                Failure::TimedOut(m) => Error::Timeout(m),
                Failure::Refused(m) => refused(name, &m),
                Failure::Lost(m) => Error::Runtime(m),
            };
            if lost {
                self.worker = None;
            }
            e
        })
    }
}

/// A worker's error message as an error: `oom` when it says memory ran out (the plugin
/// host's `out of memory: ...`, Python's `MemoryError` and torch's `OutOfMemoryError`).
fn refused(name: &str, message: &str) -> Error {
    let oom = ["out of memory: ", "MemoryError", "OutOfMemoryError"]
        .iter()
        .any(|p| message.starts_with(p));
    if oom {
        let rest = message.strip_prefix("out of memory: ").unwrap_or(message);
        Error::OutOfMemory(format!("{name}: {rest}"))
    } else {
        Error::Runtime(format!("{name}: {message}"))
    }
}

impl Step for ExternalStep<'_> {
    fn call(&mut self) -> Result<()> {
        self.timed_call().map(|_| ())
    }

    /// The worker's own time of one call.
    fn timed_call(&mut self) -> Result<f64> {
        let called: Called = self.request(&Request::Call { n: 1 })?;
        match called.seconds.as_slice() {
            [s] if s.is_finite() && *s >= 0.0 => Ok(*s),
            other => Err(Error::Runtime(format!(
                "{}: the worker answered one call with the times {other:?}",
                self.case.variant_name()
            ))),
        }
    }

    fn after_timing(&mut self, record: &mut Record) {
        record.mem_predicted_bytes = self.workspace_bytes;
    }

    /// The worker fills the output with NaN itself, as the first part of `check`.
    fn poison(&mut self) -> Result<()> {
        Ok(())
    }

    fn checked_call(&mut self) -> Result<()> {
        self.checked = Some(self.request(&Request::Check)?);
        Ok(())
    }

    fn check(&mut self, record: &mut Record, settings: &Settings) -> Result<()> {
        let checked = self.checked.take().unwrap_or_default();
        record.mem_overhead_bytes = checked.mem_overhead_bytes;
        if !checked.memory_source.is_empty() {
            record.reason = format!("memory overhead: {}", checked.memory_source);
        }
        self.output = files::read_f32(&self.files.output(), self.case.shape.out_len())?;
        record_output_error(
            record,
            self.case,
            self.inputs,
            &self.output,
            settings.error_rows,
        );
        let tolerance = self.case.dtype.tolerance();
        if let (Status::Ok, Some(err)) = (record.status, record.max_abs_err) {
            if err > tolerance {
                record.status = Status::Error;
                record.reason = format!(
                    "wrong result: max_abs_err {err:.3e} against the f64 oracle exceeds the {} tolerance {tolerance:.0e}",
                    self.case.dtype
                );
            }
        }
        Ok(())
    }

    fn into_output(mut self: Box<Self>) -> Vec<f32> {
        std::mem::take(&mut self.output)
    }
}

impl Drop for ExternalStep<'_> {
    /// Frees the case in the worker and keeps the worker for the next case.
    fn drop(&mut self) {
        if self.worker.is_some() && self.request::<Released>(&Request::Release).is_ok() {
            if let Some(w) = self.worker.take() {
                WORKERS
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(worker_key(self.case), w);
            }
        }
    }
}

/// Ends every kept worker (at the end of a sweep).
pub fn stop_workers() {
    let workers = std::mem::take(&mut *WORKERS.lock().unwrap_or_else(|e| e.into_inner()));
    drop(workers);
}
