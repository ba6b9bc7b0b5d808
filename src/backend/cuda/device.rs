//! The CUDA device: discovery guarded by `is_culib_present` (cudarc panics on a missing
//! driver library), one context, stream and cuBLAS handle per process on device 0, the
//! allocator every device buffer goes through (live/peak bytes, budget limit, cross-checked
//! with `cuMemGetInfo`), NVRTC modules cached per (kernel, defines), checked kernel launches
//! and strided-batched GEMMs, CUDA-event timing. Costs: opening the device once (hundreds
//! of ms), each kernel's first compile (tens to hundreds of ms), then O(1) per call.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::sys as blas_sys;
use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::{self as drv, CUdevice_attribute, CUfunction_attribute_enum, CUresult};
use cudarc::driver::{result as drv_result, CudaContext, CudaFunction, CudaModule, CudaStream};

use super::accounting::{Counter, OverLimit};
use super::nvrtc;
use super::plan::{self, Defines, GpuInfo, Kernel};
use crate::error::{Error, Result};
use crate::problem::DType;

/// The process's GPU: device 0, opened on first use.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    blas: CudaBlas,
    pub info: GpuInfo,
    arch: String,
    modules: Mutex<HashMap<(Kernel, Defines), Arc<CudaModule>>>,
    counter: Mutex<Counter>,
    /// Synchronize and check after every launch (the untimed correctness pass), so a fault
    /// is attributed to the kernel that caused it.
    sync_each: Mutex<bool>,
}

/// The GPU, or why there is none usable (the reason of every skipped CUDA row).
pub fn gpu() -> std::result::Result<&'static Gpu, String> {
    static GPU: OnceLock<std::result::Result<Gpu, String>> = OnceLock::new();
    GPU.get_or_init(|| {
        // cudarc panics inside when a library vanishes between the check and the use; a
        // panic here must become a reason, not an abort of the sweep.
        std::panic::catch_unwind(Gpu::open)
            .unwrap_or_else(|_| Err("opening the CUDA device panicked".into()))
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Why CUDA cases cannot run here, if so.
pub fn unavailable_reason() -> Option<String> {
    gpu().err()
}

fn drv_err(what: &str, e: drv_result::DriverError) -> Error {
    if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        Error::OutOfMemory(format!("{what}: CUDA out of memory"))
    } else {
        Error::Runtime(format!("{what}: {e:?}"))
    }
}

impl Gpu {
    fn open() -> std::result::Result<Gpu, String> {
        // SAFETY: these only try to open the shared libraries by their candidate names.
        if !unsafe { drv::is_culib_present() } {
            return Err("no CUDA driver (libcuda.so not found)".into());
        }
        drv_result::init().map_err(|e| format!("the CUDA driver did not initialize: {e:?}"))?;
        let count =
            CudaContext::device_count().map_err(|e| format!("cannot count CUDA devices: {e:?}"))?;
        if count < 1 {
            return Err("no CUDA device found".into());
        }
        if let Some(why) = nvrtc::nvrtc_missing() {
            return Err(why);
        }
        // SAFETY: as above.
        if !unsafe { blas_sys::is_culib_present() } {
            return Err(
                "cuBLAS not found (libcublas.so.13: add the CUDA toolkit's lib64 to LD_LIBRARY_PATH)"
                    .into(),
            );
        }
        let ctx = CudaContext::new(0).map_err(|e| format!("cannot open CUDA device 0: {e:?}"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| format!("cannot read the compute capability: {e:?}"))?;
        if let Some(why) = plan::unsupported_device(major, minor) {
            return Err(why);
        }
        let stream = ctx.default_stream();
        let blas = CudaBlas::new(stream.clone()).map_err(|e| format!("cuBLAS handle: {e:?}"))?;
        let attr = |a: CUdevice_attribute| ctx.attribute(a).ok();
        let mut driver = 0;
        // SAFETY: the driver library is loaded; the call writes one int.
        let driver_ok = unsafe { drv::cuDriverGetVersion(&mut driver) } == CUresult::CUDA_SUCCESS;
        let info = GpuInfo {
            name: ctx.name().unwrap_or_else(|_| "unknown".into()),
            compute_capability: format!("{major}.{minor}"),
            multiprocessors: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
            memory_bytes: ctx.total_mem().ok().map(|b| b as u64),
            l2_bytes: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE).map(|b| b as u64),
            sm_clock_mhz: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)
                .map(|k| k / 1000),
            memory_clock_mhz: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)
                .map(|k| k / 1000),
            memory_bus_bits: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH),
            driver_version: driver_ok
                .then(|| format!("{}.{}", driver / 1000, (driver % 1000) / 10)),
            nvrtc_version: nvrtc::version().map(|(a, b)| format!("{a}.{b}")),
            copy_gbytes_per_s: copy_bandwidth(&stream).ok(),
        };
        Ok(Gpu {
            ctx,
            stream,
            blas,
            info,
            arch: plan::arch_flag(major, minor),
            modules: Mutex::new(HashMap::new()),
            counter: Mutex::new(Counter::default()),
            sync_each: Mutex::new(false),
        })
    }

    /// Makes the context current on the calling thread (raw driver calls need it).
    pub fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| drv_err("binding the CUDA context", e))
    }

    fn counter(&self) -> std::sync::MutexGuard<'_, Counter> {
        self.counter.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Allocates `bytes` of device memory, counted, refused beyond the limit.
    pub fn alloc(&self, bytes: usize, what: &str) -> Result<DeviceBuffer<'_>> {
        let bytes64 = bytes as u64;
        self.counter().reserve(bytes64).map_err(|e: OverLimit| {
            Error::OutOfMemory(format!(
                "{what}: {} B requested with {} B live exceeds the memory budget {} B",
                e.requested, e.live, e.limit
            ))
        })?;
        // SAFETY: a plain allocation in the current context; freed by the buffer's Drop.
        match unsafe { drv_result::malloc_sync(bytes.max(1)) } {
            Ok(ptr) => Ok(DeviceBuffer {
                gpu: self,
                ptr,
                bytes,
            }),
            Err(e) => {
                self.counter().release(bytes64);
                Err(drv_err(what, e))
            }
        }
    }

    /// Live and peak counted bytes, and the number of allocations so far.
    pub fn counted(&self) -> (u64, u64, u64) {
        let c = self.counter();
        (c.live(), c.peak(), c.allocations())
    }

    pub fn reset_peak(&self) {
        self.counter().reset_peak();
    }

    pub fn set_limit(&self, limit: Option<u64>) {
        self.counter().set_limit(limit);
    }

    /// The driver's (free, total) device memory.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        drv_result::mem_get_info().map_err(|e| drv_err("cuMemGetInfo", e))
    }

    pub fn set_sync_each(&self, on: bool) {
        *self.sync_each.lock().unwrap_or_else(|e| e.into_inner()) = on;
    }

    /// The entry point `name` of `kernel` compiled with `defines` for this device.
    pub fn function(&self, kernel: Kernel, defines: &Defines, name: &str) -> Result<CudaFunction> {
        let key = (kernel, defines.clone());
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        let module = match modules.get(&key) {
            Some(m) => m.clone(),
            None => {
                let cubin = nvrtc::cached(kernel, defines, &self.arch).map_err(Error::Runtime)?;
                let m = self
                    .ctx
                    .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
                    .map_err(|e| drv_err(&format!("loading {}", kernel.file()), e))?;
                modules.insert(key, m.clone());
                m
            }
        };
        module
            .load_function(name)
            .map_err(|e| drv_err(&format!("{} has no kernel {name}", kernel.file()), e))
    }

    /// Raises a kernel's dynamic shared-memory limit (needed above 48 KiB).
    pub fn allow_shared(&self, f: &CudaFunction, bytes: u32) -> Result<()> {
        if bytes <= 48 * 1024 {
            return Ok(());
        }
        f.set_attribute(
            CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
        )
        .map_err(|e| drv_err("raising the shared-memory limit", e))
    }

    /// Launches `f` on the stream; in the checked pass also synchronizes and surfaces any
    /// fault of this kernel.
    pub fn launch(
        &self,
        f: &CudaFunction,
        what: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared: u32,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        // SAFETY: `args` point to values that outlive the call (the launchers keep them on
        // their stack), in the order and types of the kernel's parameters; every pointer
        // argument is a live DeviceBuffer of the size the kernel indexes (see the launchers).
        unsafe {
            drv_result::launch_kernel(
                f.cu_function(),
                grid,
                block,
                shared,
                self.stream.cu_stream(),
                args,
            )
        }
        .map_err(|e| drv_err(&format!("launching {what}"), e))?;
        if *self.sync_each.lock().unwrap_or_else(|e| e.into_inner()) {
            self.sync(what)?;
        }
        Ok(())
    }

    /// Waits for the stream; a fault of any earlier launch surfaces here.
    pub fn sync(&self, what: &str) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| drv_err(&format!("after {what}"), e))
    }

    /// C = alpha op(A) op(B) in cuBLAS's column-major terms, `batch` times with the given
    /// element strides: A and B of `ab` (f32, bf16 or f16), C f32, f32 accumulation (TF32
    /// tensor cores for f32 when `tf32`).
    pub fn gemm(&self, g: &Gemm, ab: DType, tf32: bool) -> Result<()> {
        let dt = match ab {
            DType::F32 => blas_sys::cudaDataType::CUDA_R_32F,
            DType::Bf16 => blas_sys::cudaDataType::CUDA_R_16BF,
            DType::F16 => blas_sys::cudaDataType::CUDA_R_16F,
        };
        let compute = if ab == DType::F32 && tf32 {
            blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
        } else {
            blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
        };
        let op = |t: bool| {
            if t {
                blas_sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas_sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let beta = 0.0f32;
        // SAFETY: the pointers are live DeviceBuffers sized for m, n, k, the leading
        // dimensions, strides and batch (checked by the launchers' callers' formulas).
        unsafe {
            cudarc::cublas::result::gemm_strided_batched_ex(
                *self.blas.handle(),
                op(g.trans_a),
                op(g.trans_b),
                g.m,
                g.n,
                g.k,
                (&g.alpha) as *const f32 as *const c_void,
                g.a as *const c_void,
                dt,
                g.lda,
                g.stride_a,
                g.b as *const c_void,
                dt,
                g.ldb,
                g.stride_b,
                (&beta) as *const f32 as *const c_void,
                g.c as *mut c_void,
                blas_sys::cudaDataType::CUDA_R_32F,
                g.ldc,
                g.stride_c,
                g.batch,
                compute,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| Error::Runtime(format!("cuBLAS GEMM ({}): {e:?}", g.what)))?;
        if *self.sync_each.lock().unwrap_or_else(|e| e.into_inner()) {
            self.sync(g.what)?;
        }
        Ok(())
    }

    /// Fills `bytes` of `buf` with the byte `value` (L2 flush, zeroing).
    pub fn memset(&self, buf: &DeviceBuffer<'_>, value: u8) -> Result<()> {
        // SAFETY: within the buffer.
        unsafe { drv_result::memset_d8_async(buf.ptr, value, buf.bytes, self.stream.cu_stream()) }
            .map_err(|e| drv_err("cuMemsetD8Async", e))
    }

    /// Fills an f32 buffer with quiet NaN (the output is poisoned before the checked pass).
    pub fn poison_f32(&self, buf: &DeviceBuffer<'_>) -> Result<()> {
        // SAFETY: within the buffer (bytes / 4 words).
        let r = unsafe {
            drv::cuMemsetD32Async(buf.ptr, 0x7fc0_0000, buf.bytes / 4, self.stream.cu_stream())
        };
        r.result().map_err(|e| drv_err("cuMemsetD32Async", e))
    }

    /// Fills a buffer of 16-bit words with `bits` (f16 or bf16 NaN before a checked pass).
    pub fn fill_u16(&self, buf: &DeviceBuffer<'_>, bits: u16) -> Result<()> {
        // SAFETY: within the buffer (bytes / 2 words).
        let r =
            unsafe { drv::cuMemsetD16Async(buf.ptr, bits, buf.bytes / 2, self.stream.cu_stream()) };
        r.result().map_err(|e| drv_err("cuMemsetD16Async", e))
    }

    /// Copies host bytes to the start of `buf`.
    pub fn upload<T>(&self, buf: &DeviceBuffer<'_>, src: &[T]) -> Result<()> {
        assert!(
            std::mem::size_of_val(src) <= buf.bytes,
            "upload overruns the buffer"
        );
        // SAFETY: size checked above; synchronous copy.
        unsafe { drv_result::memcpy_htod_sync(buf.ptr, src) }
            .map_err(|e| drv_err("copy to the device", e))
    }

    /// Copies the start of `buf` into `dst`.
    pub fn download<T>(&self, buf: &DeviceBuffer<'_>, dst: &mut [T]) -> Result<()> {
        assert!(
            std::mem::size_of_val(dst) <= buf.bytes,
            "download overruns the buffer"
        );
        self.sync("the kernels before a copy to the host")?;
        // SAFETY: size checked above; synchronous copy after the stream is idle.
        unsafe { drv_result::memcpy_dtoh_sync(dst, buf.ptr) }
            .map_err(|e| drv_err("copy to the host", e))
    }

    /// Milliseconds of GPU time `f` enqueues, between two events on the stream.
    pub fn time_ms(&self, f: impl FnOnce() -> Result<()>) -> Result<f64> {
        let flags = Some(drv::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.ctx.new_event(flags).map_err(|e| drv_err("event", e))?;
        let end = self.ctx.new_event(flags).map_err(|e| drv_err("event", e))?;
        start
            .record(&self.stream)
            .map_err(|e| drv_err("event record", e))?;
        f()?;
        end.record(&self.stream)
            .map_err(|e| drv_err("event record", e))?;
        end.synchronize()
            .map_err(|e| drv_err("after the timed call", e))?;
        let ms = start
            .elapsed_ms(&end)
            .map_err(|e| drv_err("event time", e))?;
        Ok(ms as f64)
    }
}

/// One strided-batched GEMM in cuBLAS's column-major terms (device pointers as integers).
pub struct Gemm {
    pub what: &'static str,
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub alpha: f32,
    pub a: u64,
    pub lda: i32,
    pub stride_a: i64,
    pub b: u64,
    pub ldb: i32,
    pub stride_b: i64,
    pub c: u64,
    pub ldc: i32,
    pub stride_c: i64,
    pub batch: i32,
}

/// A counted device allocation; freed (and uncounted) on drop.
pub struct DeviceBuffer<'a> {
    gpu: &'a Gpu,
    pub ptr: u64,
    pub bytes: usize,
}

impl DeviceBuffer<'_> {
    /// The device address `elems` elements of `elem_bytes` past the start.
    pub fn at(&self, elems: usize, elem_bytes: usize) -> u64 {
        debug_assert!(elems * elem_bytes <= self.bytes);
        self.ptr + (elems * elem_bytes) as u64
    }
}

impl Drop for DeviceBuffer<'_> {
    fn drop(&mut self) {
        // cuMemFree waits for work using the memory; a failure here (a context already
        // broken by an earlier fault) has been reported by that fault.
        // SAFETY: allocated by `Gpu::alloc`, freed once.
        let _ = unsafe { drv_result::free_sync(self.ptr) };
        self.gpu.counter().release(self.bytes as u64);
    }
}

/// Device-to-device copy bandwidth (bytes read + written / s / 1e9): the median of 10 event-
/// timed 256 MiB copies after one warm-up, on buffers freed before any case runs.
fn copy_bandwidth(stream: &Arc<CudaStream>) -> std::result::Result<f64, String> {
    const BYTES: usize = 256 << 20;
    let ctx = stream.context();
    // SAFETY: two plain allocations, freed below; the copies stay inside them.
    let (src, dst) = unsafe {
        let src = drv_result::malloc_sync(BYTES).map_err(|e| format!("{e:?}"))?;
        match drv_result::malloc_sync(BYTES) {
            Ok(dst) => (src, dst),
            Err(e) => {
                let _ = drv_result::free_sync(src);
                return Err(format!("{e:?}"));
            }
        }
    };
    let run = || -> std::result::Result<f64, String> {
        let flags = Some(drv::CUevent_flags::CU_EVENT_DEFAULT);
        let start = ctx.new_event(flags).map_err(|e| format!("{e:?}"))?;
        let end = ctx.new_event(flags).map_err(|e| format!("{e:?}"))?;
        let mut times = Vec::new();
        for i in 0..11 {
            start.record(stream).map_err(|e| format!("{e:?}"))?;
            // SAFETY: both buffers hold BYTES.
            unsafe { drv_result::memcpy_dtod_async(dst, src, BYTES, stream.cu_stream()) }
                .map_err(|e| format!("{e:?}"))?;
            end.record(stream).map_err(|e| format!("{e:?}"))?;
            end.synchronize().map_err(|e| format!("{e:?}"))?;
            let ms = start.elapsed_ms(&end).map_err(|e| format!("{e:?}"))? as f64;
            if i > 0 {
                times.push(ms);
            }
        }
        times.sort_by(f64::total_cmp);
        let ms = times[times.len() / 2];
        Ok(2.0 * BYTES as f64 / (ms / 1e3) / 1e9)
    };
    let r = run();
    // SAFETY: allocated above, the stream is idle (synchronized after the last copy or
    // failed before enqueuing more).
    unsafe {
        let _ = stream.synchronize();
        let _ = drv_result::free_sync(src);
        let _ = drv_result::free_sync(dst);
    }
    r
}
