//! The C ABI of `include/attnbench.h`, version [`ABI_VERSION`], as `#[repr(C)]` types, and
//! a loaded plugin. Opening checks, in this order: the library loads, it exports
//! `attnbench_plugin_entry`, the table it returns is not null, its `abi_version` is this
//! one (read before any other field or function), and `supports` and `forward` are set.
//! Cost: one `dlopen`.

use std::ffi::{c_char, c_void, CStr};
use std::path::Path;

use crate::error::{Error, Result};
use crate::problem::DType;

/// The ABI version this build speaks (`ATTNBENCH_ABI_VERSION`).
pub const ABI_VERSION: u32 = 1;

/// `ATTNBENCH_OWN_ALLOCATIONS`: the plugin allocates its scratch itself.
pub const OWN_ALLOCATIONS: u32 = 1;

/// `enum attnbench_dtype`.
pub const F32: i32 = 0;
pub const F16: i32 = 1;
pub const BF16: i32 = 2;

/// The header's code of a storage dtype.
pub fn dtype_code(d: DType) -> i32 {
    match d {
        DType::F32 => F32,
        DType::F16 => F16,
        DType::Bf16 => BF16,
    }
}

/// The exported entry point.
pub const ENTRY: &str = "attnbench_plugin_entry";

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Tensor {
    pub data: *mut c_void,
    pub dtype: i32,
    pub ndim: i32,
    pub shape: [i64; 4],
    pub strides: [i64; 4],
}

impl Tensor {
    /// A C-order 4-d tensor over `data`.
    pub fn contiguous(data: *mut c_void, dtype: i32, shape: [usize; 4]) -> Tensor {
        let s = shape.map(|x| x as i64);
        Tensor {
            data,
            dtype,
            ndim: 4,
            shape: s,
            strides: [s[1] * s[2] * s[3], s[2] * s[3], s[3], 1],
        }
    }
}

/// The descriptors of q, k, v and o over `data` (in that order), C order: q and o of
/// `shapes[0]`, k and v of `shapes[1]`.
pub fn descriptors(dtype: i32, shapes: [[usize; 4]; 2], data: [*mut c_void; 4]) -> [Tensor; 4] {
    let [q, k, v, o] = data;
    let [q_shape, kv_shape] = shapes;
    [
        Tensor::contiguous(q, dtype, q_shape),
        Tensor::contiguous(k, dtype, kv_shape),
        Tensor::contiguous(v, dtype, kv_shape),
        Tensor::contiguous(o, dtype, q_shape),
    ]
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub batch: i64,
    pub heads: i64,
    pub kv_heads: i64,
    pub seq_q: i64,
    pub seq_kv: i64,
    pub head_dim: i64,
    pub dtype: i32,
    pub device: i32,
    pub mode: i32,
    pub causal: i32,
    pub window: i64,
    pub scale: f32,
    pub threads: i32,
    pub stream: *mut c_void,
}

#[repr(C)]
pub struct Allocator {
    pub ctx: *mut c_void,
    pub alloc: extern "C" fn(ctx: *mut c_void, bytes: usize, align: usize) -> *mut c_void,
    pub free: extern "C" fn(ctx: *mut c_void, ptr: *mut c_void),
}

type Supports = extern "C" fn(*const Case) -> *const c_char;
type WorkspaceBytes = extern "C" fn(*const Case) -> u64;
type Forward = extern "C" fn(
    *const Case,
    *const Tensor,
    *const Tensor,
    *const Tensor,
    *mut Tensor,
    *const Allocator,
) -> i32;
type LastError = extern "C" fn() -> *const c_char;

#[repr(C)]
struct Table {
    abi_version: u32,
    flags: u32,
    name: *const c_char,
    supports: Option<Supports>,
    workspace_bytes: Option<WorkspaceBytes>,
    forward: Option<Forward>,
    last_error: Option<LastError>,
}

/// An opened plugin. The library stays loaded as long as this lives.
pub struct Plugin {
    pub name: String,
    pub flags: u32,
    supports: Supports,
    workspace_bytes: Option<WorkspaceBytes>,
    forward: Forward,
    last_error: Option<LastError>,
    _library: libloading::Library,
}

impl Plugin {
    /// Opens `path` and checks its table (see the module doc).
    pub fn open(path: &Path) -> Result<Plugin> {
        let fail = |msg: String| Error::Runtime(format!("plugin {}: {msg}", path.display()));
        // SAFETY: loading runs the library's initializers: foreign code, which is why
        // plugins run in a worker process of their own.
        let library = unsafe { libloading::Library::new(path) }
            .map_err(|e| fail(format!("cannot load it: {e}")))?;
        // SAFETY: the header declares the entry as `const attnbench_plugin *(void)`.
        let entry = unsafe { library.get::<extern "C" fn() -> *const Table>(ENTRY.as_bytes()) }
            .map_err(|e| {
                fail(format!(
                    "it does not export {ENTRY} (build it against include/attnbench.h): {e}"
                ))
            })?;
        let table = entry();
        if table.is_null() {
            return Err(fail(format!("{ENTRY} returned NULL")));
        }
        // SAFETY: every version of the table starts with its u32 version.
        let version = unsafe { std::ptr::read(table.cast::<u32>()) };
        if version != ABI_VERSION {
            return Err(fail(format!(
                "built for attnbench plugin ABI version {version}, but this attnbench speaks version {ABI_VERSION}: rebuild it against this attnbench's include/attnbench.h (it was not called)"
            )));
        }
        // SAFETY: version 1's table is `Table`, and the library outlives the reference.
        let t = unsafe { &*table };
        let name = if t.name.is_null() {
            path.display().to_string()
        } else {
            // SAFETY: the header asks for a NUL-terminated string.
            unsafe { CStr::from_ptr(t.name) }
                .to_string_lossy()
                .into_owned()
        };
        let (Some(supports), Some(forward)) = (t.supports, t.forward) else {
            return Err(fail(
                "its table leaves supports or forward NULL (both are required)".into(),
            ));
        };
        Ok(Plugin {
            name,
            flags: t.flags,
            supports,
            workspace_bytes: t.workspace_bytes,
            forward,
            last_error: t.last_error,
            _library: library,
        })
    }

    /// `None` when the plugin runs `case`, else its reason.
    pub fn supports(&self, case: &Case) -> Option<String> {
        let why = (self.supports)(case);
        (!why.is_null()).then(|| {
            // SAFETY: a NUL-terminated static string, per the header.
            let s = unsafe { CStr::from_ptr(why) }
                .to_string_lossy()
                .into_owned();
            if s.is_empty() {
                "the plugin does not support this case".into()
            } else {
                s
            }
        })
    }

    pub fn workspace_bytes(&self, case: &Case) -> Option<u64> {
        self.workspace_bytes.map(|f| f(case))
    }

    /// One forward call; a non-zero return is an error with the plugin's message.
    pub fn forward(
        &self,
        case: &Case,
        [q, k, v]: [&Tensor; 3],
        o: &mut Tensor,
        scratch: &Allocator,
    ) -> std::result::Result<(), String> {
        let rc = (self.forward)(case, q, k, v, o, scratch);
        if rc == 0 {
            return Ok(());
        }
        let msg = self
            .last_error
            .map(|f| f())
            .filter(|p| !p.is_null())
            // SAFETY: a NUL-terminated string, per the header.
            .map(|p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
            .unwrap_or_default();
        Err(format!(
            "{}: forward returned {rc}{}",
            self.name,
            if msg.is_empty() {
                String::new()
            } else {
                format!(": {msg}")
            }
        ))
    }
}
