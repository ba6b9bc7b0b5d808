//! A plugin's CUDA case (feature `cuda`): the inputs and output in device memory of the
//! process's GPU (`backend::cuda::device`), the case's stream handed to the plugin, each
//! call timed by CUDA events on that stream, and the allocator table backed by the GPU's
//! counted allocator, so device scratch is counted exactly as attnbench's own CUDA
//! workspaces. Cost: one upload per case, one download per checked call.

use std::ffi::c_void;

use half::{bf16, f16};

use super::abi::{self, Allocator, Plugin};
use super::host::forward_outcome;
use crate::backend::cuda::device::{gpu, DeviceBuffer, Gpu};
use crate::error::{Error, Result};
use crate::problem::Tensor;

/// The device side of a prepared case.
pub struct DeviceCase {
    pub gpu: &'static Gpu,
    /// q, k, v, o.
    pub buffers: [DeviceBuffer<'static>; 4],
    pub scratch: Box<DeviceScratch>,
    /// The run's memory budget on the device (its inputs and output count against it).
    budget: Option<u64>,
}

/// Scratch blocks the plugin holds, and a refused request.
pub struct DeviceScratch {
    gpu: &'static Gpu,
    live: Vec<DeviceBuffer<'static>>,
    pub refused: Option<usize>,
}

pub extern "C" fn device_alloc(ctx: *mut c_void, bytes: usize, _align: usize) -> *mut c_void {
    // SAFETY: ctx is the case's `DeviceScratch`, alive during the call.
    let s = unsafe { &mut *ctx.cast::<DeviceScratch>() };
    // cuMemAlloc aligns to at least 256 bytes, more than any kernel asks.
    match s.gpu.alloc(bytes, "plugin scratch") {
        Ok(b) => {
            let p = b.ptr as *mut c_void;
            s.live.push(b);
            p
        }
        Err(_) => {
            s.refused = Some(bytes);
            std::ptr::null_mut()
        }
    }
}

pub extern "C" fn device_free(ctx: *mut c_void, ptr: *mut c_void) {
    // SAFETY: as in `device_alloc`.
    let s = unsafe { &mut *ctx.cast::<DeviceScratch>() };
    if let Some(i) = s.live.iter().position(|b| b.ptr == ptr as u64) {
        drop(s.live.swap_remove(i));
    }
}

impl DeviceScratch {
    /// Bytes still held, then freed (a leak is the plugin's bug; the memory is not kept).
    pub fn free_all(&mut self) -> usize {
        let held = self.live.iter().map(|b| b.bytes).sum();
        self.live.clear();
        held
    }
}

impl DeviceCase {
    /// Device buffers the size of `host`'s q, k, v and o, the first three copied there.
    pub fn new(host: [&Tensor; 4], budget: Option<u64>) -> Result<DeviceCase> {
        let gpu = gpu().map_err(Error::Unsupported)?;
        gpu.bind()?;
        let alloc = |i: usize| {
            let t = host[i];
            gpu.alloc(t.len() * t.dtype().size_bytes(), ["q", "k", "v", "o"][i])
        };
        let buffers = [alloc(0)?, alloc(1)?, alloc(2)?, alloc(3)?];
        for (t, b) in host.iter().zip(&buffers).take(3) {
            match t {
                Tensor::F32(x) => gpu.upload(b, x)?,
                Tensor::Bf16(x) => gpu.upload(b, x)?,
                Tensor::F16(x) => gpu.upload(b, x)?,
            }
        }
        gpu.sync("uploading the plugin's inputs")?;
        Ok(DeviceCase {
            gpu,
            buffers,
            scratch: Box::new(DeviceScratch {
                gpu,
                live: Vec::new(),
                refused: None,
            }),
            budget,
        })
    }

    /// The stream the plugin enqueues on.
    pub fn stream(&self) -> *mut c_void {
        self.gpu.stream.cu_stream() as *mut c_void
    }

    pub fn ptr(&self, i: usize) -> *mut c_void {
        self.buffers[i].ptr as *mut c_void
    }

    /// One forward call enqueued on the case's stream, its scratch from the device table.
    pub fn forward(
        &mut self,
        plugin: &Plugin,
        c: &abi::Case,
        shapes: [[usize; 4]; 2],
    ) -> Result<()> {
        let data = [0, 1, 2, 3].map(|i| self.ptr(i));
        let [q, k, v, mut o] = abi::descriptors(c.dtype, shapes, data);
        self.scratch.refused = None;
        let table = Allocator {
            ctx: (&mut *self.scratch as *mut DeviceScratch).cast(),
            alloc: device_alloc,
            free: device_free,
        };
        self.gpu.set_limit(self.budget);
        let result = plugin.forward(c, [&q, &k, &v], &mut o, &table);
        self.gpu.set_limit(None);
        let leaked = self.scratch.free_all();
        forward_outcome(&plugin.name, result, self.scratch.refused, leaked)
    }

    /// [`DeviceCase::forward`] timed by CUDA events on the case's stream, in seconds.
    pub fn timed_forward(
        &mut self,
        plugin: &Plugin,
        c: &abi::Case,
        shapes: [[usize; 4]; 2],
    ) -> Result<f64> {
        let gpu = self.gpu;
        gpu.time_ms(|| self.forward(plugin, c, shapes))
            .map(|ms| ms / 1e3)
    }

    /// The output filled with its dtype's NaN (before the checked call).
    pub fn poison(&self, dtype: i32) -> Result<()> {
        let o = &self.buffers[3];
        match dtype {
            abi::F16 => self.gpu.fill_u16(o, f16::NAN.to_bits()),
            abi::BF16 => self.gpu.fill_u16(o, bf16::NAN.to_bits()),
            _ => self.gpu.poison_f32(o),
        }
    }

    /// One forward under the GPU allocator's count: the device bytes at its peak beyond
    /// those live before it (the inputs and the output).
    pub fn counted_forward(
        &mut self,
        plugin: &Plugin,
        c: &abi::Case,
        shapes: [[usize; 4]; 2],
    ) -> Result<u64> {
        let gpu = self.gpu;
        gpu.sync("before the checked call")?;
        let before = gpu.counted().0;
        gpu.reset_peak();
        self.forward(plugin, c, shapes)?;
        gpu.sync("the checked call")?;
        Ok(gpu.counted().1.saturating_sub(before))
    }

    /// The output, copied into the host tensor `o`.
    pub fn download(&self, o: &mut Tensor) -> Result<()> {
        let b = &self.buffers[3];
        match o {
            Tensor::F32(x) => self.gpu.download(b, x),
            Tensor::Bf16(x) => self.gpu.download(b, x),
            Tensor::F16(x) => self.gpu.download(b, x),
        }
    }
}
