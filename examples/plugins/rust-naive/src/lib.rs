//! rust-naive: standard attention (scores, row max subtracted, softmax, weighted values)
//! as an attnbench plugin. The types mirror include/attnbench.h (ABI version 1); the score
//! row is scratch from attnbench's allocator table, so attnbench counts it exactly. f32 only.

use std::ffi::{c_char, c_void};

const ABI_VERSION: u32 = 1;
const F32: i32 = 0;
const CPU: i32 = 0;

#[repr(C)]
pub struct Tensor {
    data: *mut c_void,
    dtype: i32,
    ndim: i32,
    shape: [i64; 4],
    strides: [i64; 4],
}

#[repr(C)]
pub struct Case {
    batch: i64,
    heads: i64,
    kv_heads: i64,
    seq_q: i64,
    seq_kv: i64,
    head_dim: i64,
    dtype: i32,
    device: i32,
    mode: i32,
    causal: i32,
    window: i64,
    scale: f32,
    threads: i32,
    stream: *mut c_void,
}

#[repr(C)]
pub struct Allocator {
    ctx: *mut c_void,
    alloc: extern "C" fn(*mut c_void, usize, usize) -> *mut c_void,
    free: extern "C" fn(*mut c_void, *mut c_void),
}

#[repr(C)]
pub struct Plugin {
    abi_version: u32,
    flags: u32,
    name: *const c_char,
    supports: extern "C" fn(*const Case) -> *const c_char,
    workspace_bytes: Option<extern "C" fn(*const Case) -> u64>,
    forward: extern "C" fn(
        *const Case,
        *const Tensor,
        *const Tensor,
        *const Tensor,
        *mut Tensor,
        *const Allocator,
    ) -> i32,
    last_error: Option<extern "C" fn() -> *const c_char>,
}

// SAFETY: the table is immutable and its pointers are to static data.
unsafe impl Sync for Plugin {}

extern "C" fn supports(c: *const Case) -> *const c_char {
    // SAFETY: attnbench passes a valid case.
    let c = unsafe { &*c };
    if c.device != CPU {
        return c"rust-naive runs on the CPU only".as_ptr();
    }
    if c.dtype != F32 {
        return c"rust-naive takes f32 only".as_ptr();
    }
    std::ptr::null()
}

extern "C" fn workspace_bytes(c: *const Case) -> u64 {
    // SAFETY: as above.
    unsafe { (*c).seq_kv as u64 * 4 }
}

extern "C" fn forward(
    c: *const Case,
    q: *const Tensor,
    k: *const Tensor,
    v: *const Tensor,
    o: *mut Tensor,
    scratch: *const Allocator,
) -> i32 {
    // SAFETY: attnbench passes valid descriptors of f32 tensors and a live allocator table.
    let (c, q, k, v, o, a) = unsafe { (&*c, &*q, &*k, &*v, &*o, &*scratch) };
    let n = c.seq_kv as usize;
    let p = (a.alloc)(a.ctx, n * 4, 64).cast::<f32>();
    if p.is_null() {
        return 1;
    }
    // SAFETY: n floats, just allocated.
    let p = unsafe { std::slice::from_raw_parts_mut(p, n) };
    let get = |t: &Tensor, b: i64, h: i64, s: i64, d: i64| -> f32 {
        let i = b * t.strides[0] + h * t.strides[1] + s * t.strides[2] + d * t.strides[3];
        // SAFETY: indices within the descriptor's shape.
        unsafe { *t.data.cast::<f32>().offset(i as isize) }
    };
    let (group, shift) = (c.heads / c.kv_heads, c.seq_kv - c.seq_q);
    for b in 0..c.batch {
        for h in 0..c.heads {
            let kh = h / group;
            for i in 0..c.seq_q {
                let hi = if c.causal != 0 {
                    i + shift + 1
                } else {
                    c.seq_kv
                }
                .clamp(0, c.seq_kv);
                let lo = if c.window > 0 {
                    (hi - c.window).max(0)
                } else {
                    0
                };
                let mut max = f32::NEG_INFINITY;
                for j in lo..hi {
                    let s: f32 = (0..c.head_dim)
                        .map(|d| get(q, b, h, i, d) * get(k, b, kh, j, d))
                        .sum();
                    p[j as usize] = s * c.scale;
                    max = max.max(p[j as usize]);
                }
                let mut sum = 0.0;
                for j in lo..hi {
                    p[j as usize] = (p[j as usize] - max).exp();
                    sum += p[j as usize];
                }
                for d in 0..c.head_dim {
                    let acc: f32 = (lo..hi).map(|j| p[j as usize] * get(v, b, kh, j, d)).sum();
                    let i_o = b * o.strides[0] + h * o.strides[1] + i * o.strides[2] + d;
                    let out = if hi > lo { acc / sum } else { 0.0 };
                    // SAFETY: within o's shape.
                    unsafe { *o.data.cast::<f32>().offset(i_o as isize) = out };
                }
            }
        }
    }
    (a.free)(a.ctx, p.as_mut_ptr().cast());
    0
}

static PLUGIN: Plugin = Plugin {
    abi_version: ABI_VERSION,
    flags: 0,
    name: c"rust-naive".as_ptr(),
    supports,
    workspace_bytes: Some(workspace_bytes),
    forward,
    last_error: None,
};

/// The one symbol attnbench looks up.
#[no_mangle]
pub extern "C" fn attnbench_plugin_entry() -> *const Plugin {
    &PLUGIN
}
