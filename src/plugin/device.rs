//! A plugin's CUDA case (feature `cuda`): the inputs and output in device memory of the
//! process's GPU (`backend::cuda::device`), the case's stream handed to the plugin, each
//! call timed by CUDA events on that stream, and the allocator table backed by the GPU's
//! counted allocator, so device scratch is counted exactly as attnbench's own CUDA
//! workspaces. Cost: one upload per case, one download per checked call.

use std::ffi::c_void;

use super::abi::{self, Allocator, Plugin, Tensor};
use super::host::forward_outcome;
use crate::backend::cuda::device::{gpu, DeviceBuffer, Gpu};
use crate::error::{Error, Result};

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
    /// Device buffers of `bytes` each (q, k, v, o), the first three filled by `upload`.
    pub fn new(
        bytes: [usize; 4],
        budget: Option<u64>,
        upload: impl Fn(&Gpu, usize, &DeviceBuffer<'static>) -> Result<()>,
    ) -> Result<DeviceCase> {
        let gpu = gpu().map_err(Error::Unsupported)?;
        gpu.bind()?;
        let alloc = |i: usize| gpu.alloc(bytes[i], ["q", "k", "v", "o"][i]);
        let buffers = [alloc(0)?, alloc(1)?, alloc(2)?, alloc(3)?];
        for (i, b) in buffers.iter().enumerate().take(3) {
            upload(gpu, i, b)?;
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
        let d = c.dtype;
        let q = Tensor::contiguous(self.ptr(0), d, shapes[0]);
        let k = Tensor::contiguous(self.ptr(1), d, shapes[1]);
        let v = Tensor::contiguous(self.ptr(2), d, shapes[1]);
        let mut o = Tensor::contiguous(self.ptr(3), d, shapes[0]);
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

    /// The output filled with the dtype's NaN (`half`: 16-bit words `bits`, else f32).
    pub fn poison(&self, half: Option<u16>) -> Result<()> {
        match half {
            Some(bits) => self.gpu.fill_u16(&self.buffers[3], bits),
            None => self.gpu.poison_f32(&self.buffers[3]),
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

    /// The output, copied to the host.
    pub fn download<T>(&self, dst: &mut [T]) -> Result<()> {
        self.gpu.download(&self.buffers[3], dst)
    }
}
