//! One prepared case of a plugin, in the worker process: its inputs in the case's dtype
//! (read from the driver's raw f32 files), its output, and the allocator table through
//! which the plugin takes its scratch. The checked call's overhead is what that table
//! handed out at its peak, counted by the process's counting allocator exactly as for
//! attnbench's own kernels (the inputs and output are live before the meter starts, so
//! they are not in it); a plugin that allocates on its own (`ATTNBENCH_OWN_ALLOCATIONS`)
//! gets the peak RSS growth of the call instead. Cost: the plugin's calls, plus reading
//! the inputs and writing the output once per case.

use std::alloc::Layout;
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::time::Instant;

use half::{bf16, f16};

use super::abi::{self, Allocator, Plugin};
use crate::error::{Error, Result};
use crate::measure::alloc::{self, OverheadMeter};
use crate::measure::rss;
use crate::problem::{Case, Device, Mode, Tensor};
use crate::worker::files;
use crate::worker::protocol::{Called, Checked, InputFiles, Prepared};

/// What the memory figure of a plugin counts, in the row's words.
pub const SOURCE_TABLE: &str = "the plugin's allocator table (exact)";
pub const SOURCE_RSS: &str = "peak RSS growth (the plugin allocates on its own)";
pub const SOURCE_DEVICE: &str = "the plugin's allocator table on the GPU (exact)";

/// A plugin and the case it has prepared, if any.
pub struct Host {
    pub plugin: Plugin,
    case: Option<Loaded>,
}

/// The start of a tensor's elements, for a descriptor.
fn data_ptr(t: &mut Tensor) -> *mut c_void {
    match t {
        Tensor::F32(v) => v.as_mut_ptr().cast(),
        Tensor::Bf16(v) => v.as_mut_ptr().cast(),
        Tensor::F16(v) => v.as_mut_ptr().cast(),
    }
}

/// Fills a tensor with its dtype's NaN (the output, before the checked call).
fn fill_nan(t: &mut Tensor) {
    match t {
        Tensor::F32(v) => v.fill(f32::NAN),
        Tensor::Bf16(v) => v.fill(bf16::NAN),
        Tensor::F16(v) => v.fill(f16::NAN),
    }
}

/// A prepared case.
struct Loaded {
    c: abi::Case,
    /// In the case's storage dtype.
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    shapes: [[usize; 4]; 2],
    output: PathBuf,
    scratch: Box<Scratch>,
    /// The memory budget while the plugin runs.
    budget: Option<u64>,
    /// The case's device buffers, for a CUDA case.
    #[cfg(feature = "cuda")]
    device: Option<super::device::DeviceCase>,
}

/// The allocator table's state: every live block, so `free` knows its layout. Its room is
/// reserved before the meter starts, so bookkeeping adds nothing to the counted bytes for
/// up to `ROOM` live blocks.
struct Scratch {
    live: Vec<(usize, Layout)>,
    /// A request refused (the memory budget, or the machine): the failed call is `oom`.
    refused: Option<usize>,
}

const ROOM: usize = 1024;

extern "C" fn scratch_alloc(ctx: *mut c_void, bytes: usize, align: usize) -> *mut c_void {
    // SAFETY: ctx is the `Scratch` of the prepared case, alive during the call.
    let s = unsafe { &mut *ctx.cast::<Scratch>() };
    let Ok(layout) = Layout::from_size_align(bytes.max(1), align.max(1)) else {
        s.refused = Some(bytes);
        return std::ptr::null_mut();
    };
    // SAFETY: a non-zero size.
    let p = unsafe { std::alloc::alloc(layout) };
    if p.is_null() {
        s.refused = Some(bytes);
    } else {
        s.live.push((p as usize, layout));
    }
    p.cast()
}

extern "C" fn scratch_free(ctx: *mut c_void, ptr: *mut c_void) {
    // SAFETY: as in `scratch_alloc`.
    let s = unsafe { &mut *ctx.cast::<Scratch>() };
    if let Some(i) = s.live.iter().position(|&(p, _)| p == ptr as usize) {
        let (p, layout) = s.live.swap_remove(i);
        // SAFETY: allocated by `scratch_alloc` with this layout.
        unsafe { std::alloc::dealloc(p as *mut u8, layout) };
    }
}

impl Scratch {
    /// Frees what the plugin left allocated (a leak is its bug; the memory is not kept).
    fn free_all(&mut self) {
        for (p, layout) in self.live.drain(..) {
            // SAFETY: allocated by `scratch_alloc` with this layout.
            unsafe { std::alloc::dealloc(p as *mut u8, layout) };
        }
    }
}

impl Host {
    pub fn new(plugin: Plugin) -> Host {
        Host { plugin, case: None }
    }

    /// Loads the case's inputs and allocates its output, unless the plugin refuses it.
    /// `budget`: live bytes of this process past which the allocator table refuses a large
    /// request (the run's memory budget; the inputs and output count against it).
    pub fn prepare(
        &mut self,
        case: &Case,
        inputs: &InputFiles,
        output: &Path,
        budget: Option<u64>,
    ) -> Result<Prepared> {
        self.release();
        let s = case.shape;
        let c = abi::Case {
            batch: s.batch as i64,
            heads: s.heads as i64,
            kv_heads: s.kv_heads as i64,
            seq_q: s.seq_q as i64,
            seq_kv: s.seq_kv as i64,
            head_dim: s.head_dim as i64,
            dtype: abi::dtype_code(case.dtype),
            device: match case.device {
                Device::Cpu => 0,
                Device::Cuda => 1,
            },
            mode: i32::from(case.mode == Mode::Decode),
            causal: i32::from(case.causal),
            window: case.window.map_or(0, |w| w as i64),
            scale: s.scale(),
            threads: case.threads.min(i32::MAX as usize) as i32,
            stream: std::ptr::null_mut(),
        };
        if case.device == Device::Cuda && cfg!(not(feature = "cuda")) {
            return Ok(refused(
                "this attnbench was built without the `cuda` feature: CUDA plugins need it",
            ));
        }
        if let Some(why) = self.plugin.supports(&c) {
            return Ok(refused(&why));
        }
        let workspace_bytes = self.plugin.workspace_bytes(&c);
        let q_shape = [s.batch, s.heads, s.seq_q, s.head_dim];
        let kv_shape = [s.batch, s.kv_heads, s.seq_kv, s.head_dim];
        let read =
            |p: &Path, n: usize| files::read_f32(p, n).map(|v| Tensor::from_f32(v, case.dtype));
        let mut scratch = Box::new(Scratch {
            live: Vec::new(),
            refused: None,
        });
        scratch
            .live
            .try_reserve_exact(ROOM)
            .map_err(|_| Error::OutOfMemory("the plugin's allocator table".into()))?;
        #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
        let mut loaded = Loaded {
            c,
            q: read(&inputs.q, s.q_len())?,
            k: read(&inputs.k, s.kv_len())?,
            v: read(&inputs.v, s.kv_len())?,
            o: Tensor::from_f32(vec![0.0; s.out_len()], case.dtype),
            shapes: [q_shape, kv_shape],
            output: output.to_path_buf(),
            scratch,
            budget,
            #[cfg(feature = "cuda")]
            device: None,
        };
        #[cfg(feature = "cuda")]
        if case.device == Device::Cuda {
            let l = &loaded;
            let device = super::device::DeviceCase::new([&l.q, &l.k, &l.v, &l.o], budget);
            let device = match device {
                Err(Error::Unsupported(why)) => return Ok(refused(&why)),
                other => other?,
            };
            loaded.c.stream = device.stream();
            loaded.device = Some(device);
        }
        self.case = Some(loaded);
        Ok(Prepared {
            supported: true,
            reason: String::new(),
            workspace_bytes,
        })
    }

    /// `n` calls, each timed by the host clock (the plugin's CPU call returns when done),
    /// or, for a CUDA case, by events on its stream.
    pub fn call(&mut self, n: usize) -> Result<Called> {
        let p = prepared(&mut self.case)?;
        let mut seconds = Vec::with_capacity(n);
        for _ in 0..n {
            #[cfg(feature = "cuda")]
            if let Some(d) = &mut p.device {
                seconds.push(d.timed_forward(&self.plugin, &p.c, p.shapes)?);
                continue;
            }
            let t0 = Instant::now();
            forward(&self.plugin, p)?;
            seconds.push(t0.elapsed().as_secs_f64());
        }
        Ok(Called { seconds })
    }

    /// The checked call: output poisoned, one call under the memory figure, the output
    /// written to the prepare's path.
    pub fn check(&mut self) -> Result<Checked> {
        let p = prepared(&mut self.case)?;
        #[cfg(feature = "cuda")]
        if let Some(d) = &mut p.device {
            d.poison(p.c.dtype)?;
            let overhead = d.counted_forward(&self.plugin, &p.c, p.shapes)?;
            d.download(&mut p.o)?;
            files::write(&p.output, &p.o)?;
            return Ok(Checked {
                mem_overhead_bytes: Some(overhead),
                memory_source: SOURCE_DEVICE.into(),
            });
        }
        fill_nan(&mut p.o);
        let own = self.plugin.flags & abi::OWN_ALLOCATIONS != 0;
        let rss_before = rss::current_rss_bytes();
        rss::reset_peak_rss();
        let meter = OverheadMeter::start();
        let result = forward(&self.plugin, p);
        let counted = meter.finish();
        let peak_rss = rss::peak_rss_bytes();
        result?;
        let (mem_overhead_bytes, memory_source) = if own {
            let grown = peak_rss.zip(rss_before).map(|(p, b)| p.saturating_sub(b));
            (grown, SOURCE_RSS)
        } else {
            (Some(counted), SOURCE_TABLE)
        };
        files::write(&p.output, &p.o)?;
        Ok(Checked {
            mem_overhead_bytes,
            memory_source: memory_source.into(),
        })
    }

    pub fn release(&mut self) {
        if let Some(mut p) = self.case.take() {
            p.scratch.free_all();
            #[cfg(feature = "cuda")]
            if let Some(d) = &mut p.device {
                d.scratch.free_all();
            }
        }
    }
}

/// The prepared case, or why there is none.
fn prepared(case: &mut Option<Loaded>) -> Result<&mut Loaded> {
    case.as_mut()
        .ok_or_else(|| Error::Runtime("no case is prepared (send prepare first)".into()))
}

/// One forward call of the plugin on the case's host buffers, its scratch from the
/// allocator table under the run's memory budget.
fn forward(plugin: &Plugin, p: &mut Loaded) -> Result<()> {
    let data = [&mut p.q, &mut p.k, &mut p.v, &mut p.o].map(data_ptr);
    let [q, k, v, mut o] = abi::descriptors(p.c.dtype, p.shapes, data);
    p.scratch.refused = None;
    let table = Allocator {
        ctx: (&mut *p.scratch as *mut Scratch).cast(),
        alloc: scratch_alloc,
        free: scratch_free,
    };
    alloc::set_limit(p.budget);
    let result = plugin.forward(&p.c, [&q, &k, &v], &mut o, &table);
    alloc::set_limit(None);
    let leaked: usize = p.scratch.live.iter().map(|(_, l)| l.size()).sum();
    p.scratch.free_all();
    forward_outcome(&plugin.name, result, p.scratch.refused, leaked)
}

/// What a forward call comes to: its error (`oom` when the table refused a request), or
/// an error when it returned holding scratch.
pub(super) fn forward_outcome(
    plugin: &str,
    result: std::result::Result<(), String>,
    refused: Option<usize>,
    leaked: usize,
) -> Result<()> {
    match (result, refused) {
        (Err(e), Some(bytes)) => Err(Error::OutOfMemory(format!(
            "{e} (the allocator table refused {bytes} bytes)"
        ))),
        (Err(e), None) => Err(Error::Runtime(e)),
        (Ok(()), _) if leaked > 0 => Err(Error::Runtime(format!(
            "{plugin}: forward returned with {leaked} bytes of scratch not freed"
        ))),
        (Ok(()), _) => Ok(()),
    }
}

fn refused(why: &str) -> Prepared {
    Prepared {
        supported: false,
        reason: why.to_string(),
        workspace_bytes: None,
    }
}
