//! CUDA launch planning, pure Rust and built without the `cuda` feature too (so it is unit
//! tested everywhere): the embedded kernel sources and the NVRTC define sets each launcher
//! asks for, the architecture flag from a compute capability, which cases each GPU algorithm
//! accepts, its grid geometry and its device-workspace formula. Every function is O(1) or
//! O(number of define sets); nothing touches a device.

use crate::problem::{Case, DType, Mode, Shape};

/// Prepended to every kernel source (element types, conversions, reductions, causal bound).
pub const COMMON: &str = include_str!("kernels/common.cuh");

/// One embedded `.cu` source: a module NVRTC compiles once per define set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kernel {
    /// naive's in-place row softmax (`softmax_rows`).
    Softmax,
    /// rabe-staats' chunk summaries and combine (`chunk_summary`, `chunk_combine`).
    Chunked,
    /// flash on tensor cores, bf16/f16 (`flash_fwd`).
    Flash,
    /// flash on CUDA cores, f32 (`flash_fwd_f32`).
    FlashF32,
    /// flash-decoding's split pass and combine (`decode_split`, `decode_combine`).
    Decode,
}

impl Kernel {
    pub const ALL: [Kernel; 5] = [
        Kernel::Softmax,
        Kernel::Chunked,
        Kernel::Flash,
        Kernel::FlashF32,
        Kernel::Decode,
    ];

    pub fn file(self) -> &'static str {
        match self {
            Kernel::Softmax => "softmax.cu",
            Kernel::Chunked => "chunked.cu",
            Kernel::Flash => "flash.cu",
            Kernel::FlashF32 => "flash_f32.cu",
            Kernel::Decode => "decode.cu",
        }
    }

    /// The kernel's own source (without [`COMMON`]).
    pub fn source(self) -> &'static str {
        match self {
            Kernel::Softmax => include_str!("kernels/softmax.cu"),
            Kernel::Chunked => include_str!("kernels/chunked.cu"),
            Kernel::Flash => include_str!("kernels/flash.cu"),
            Kernel::FlashF32 => include_str!("kernels/flash_f32.cu"),
            Kernel::Decode => include_str!("kernels/decode.cu"),
        }
    }

    /// The `extern "C"` entry points the launchers look up.
    pub fn entry_points(self) -> &'static [&'static str] {
        match self {
            Kernel::Softmax => &["softmax_rows"],
            Kernel::Chunked => &["chunk_summary", "chunk_combine"],
            Kernel::Flash => &["flash_fwd"],
            Kernel::FlashF32 => &["flash_fwd_f32"],
            Kernel::Decode => &["decode_split", "decode_combine"],
        }
    }

    /// The full program NVRTC sees: the defines, [`COMMON`], then the kernel.
    pub fn program(self, defines: &Defines) -> String {
        let mut s = String::new();
        for (k, v) in &defines.0 {
            s += &format!("#define {k} {v}\n");
        }
        s += COMMON;
        s += "\n";
        s += self.source();
        s
    }

    /// Every define set a launcher may request: the NVRTC check compiles all of them.
    pub fn define_sets(self) -> Vec<Defines> {
        let kinds = [DType::F32, DType::Bf16, DType::F16];
        let mut out = Vec::new();
        match self {
            Kernel::Softmax => {
                for d in kinds {
                    for safe in [true, false] {
                        out.push(softmax_defines(d, safe));
                    }
                }
            }
            Kernel::Chunked => out.extend(kinds.map(chunked_defines)),
            Kernel::Flash => {
                for d in [DType::Bf16, DType::F16] {
                    for hd in HEAD_DIMS {
                        out.push(flash_defines(d, hd));
                    }
                }
            }
            Kernel::FlashF32 => out.extend(HEAD_DIMS.map(|hd| flash_defines(DType::F32, hd))),
            Kernel::Decode => {
                for d in kinds {
                    for hd in HEAD_DIMS {
                        for rows in DECODE_ROWS_CHOICES {
                            out.push(decode_defines(d, hd, rows));
                        }
                    }
                }
            }
        }
        out
    }
}

/// Preprocessor defines of one compilation (also the module cache's key with the kernel).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Defines(pub Vec<(&'static str, i64)>);

impl Defines {
    /// `-D` style text for logs and error messages.
    pub fn describe(&self) -> String {
        let parts: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        parts.join(",")
    }
}

/// The `ELEM_KIND` code of a storage dtype (common.cuh).
pub fn elem_kind(dtype: DType) -> i64 {
    match dtype {
        DType::F32 => 0,
        DType::Bf16 => 1,
        DType::F16 => 2,
    }
}

pub fn softmax_defines(dtype: DType, safe: bool) -> Defines {
    Defines(vec![
        ("ELEM_KIND", elem_kind(dtype)),
        ("SAFE", i64::from(safe)),
    ])
}

pub fn chunked_defines(dtype: DType) -> Defines {
    Defines(vec![("ELEM_KIND", elem_kind(dtype))])
}

pub fn flash_defines(dtype: DType, head_dim: usize) -> Defines {
    Defines(vec![
        ("ELEM_KIND", elem_kind(dtype)),
        ("HEAD_DIM", head_dim as i64),
    ])
}

/// `rows`: query rows per split block ([`decode_rows`]).
pub fn decode_defines(dtype: DType, head_dim: usize, rows: usize) -> Defines {
    Defines(vec![
        ("ELEM_KIND", elem_kind(dtype)),
        ("HEAD_DIM", head_dim as i64),
        ("D_ROWS", rows as i64),
    ])
}

/// The kernel (module) flash uses for a dtype.
pub fn flash_kernel(dtype: DType) -> Kernel {
    match dtype {
        DType::F32 => Kernel::FlashF32,
        DType::Bf16 | DType::F16 => Kernel::Flash,
    }
}

/// Head dims the fused kernels (flash, flash-decoding) are compiled for.
pub const HEAD_DIMS: [usize; 2] = [64, 128];

/// NVRTC's architecture flag for a compute capability: the real architecture (`sm_90`), so
/// the PTX is JIT-compiled by the driver for exactly this device.
pub fn arch_flag(major: i32, minor: i32) -> String {
    format!("--gpu-architecture=sm_{major}{minor}")
}

/// The oldest architecture the kernels are written for (cp.async, ldmatrix, bf16 mma,
/// `cvt.rn.bf16x2.f32`): Ampere, sm_80.
pub const MIN_COMPUTE_CAPABILITY: (i32, i32) = (8, 0);

/// Why a device of this compute capability cannot run the kernels, if so.
pub fn unsupported_device(major: i32, minor: i32) -> Option<String> {
    ((major, minor) < MIN_COMPUTE_CAPABILITY).then(|| {
        format!(
            "compute capability {major}.{minor} is below the kernels' minimum {}.{} (sm_80: cp.async, ldmatrix, bf16 mma)",
            MIN_COMPUTE_CAPABILITY.0, MIN_COMPUTE_CAPABILITY.1
        )
    })
}

/// How a variant runs on a GPU (`Variant::cuda`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GpuAlgo {
    /// cuBLAS S = scale Q K^T, the softmax kernel (`safe`: with max subtraction), cuBLAS P V.
    Naive { safe: bool },
    /// Query chunks x key chunks on cuBLAS with per-chunk summaries and a combine kernel.
    Chunked,
    /// The fused FlashAttention-2 kernel.
    Flash,
    /// Split-KV decode with the logsumexp combine.
    FlashDecoding,
}

/// Why `algo` cannot run `case` on a GPU, if so (beyond what every variant checks).
pub fn unsupported(algo: GpuAlgo, case: &Case) -> Option<String> {
    let name = case.variant.name();
    let s = &case.shape;
    if case.devices != 1 {
        return Some(format!(
            "variant {name} runs on one device (devices = {} requested)",
            case.devices
        ));
    }
    if case.mode == Mode::FwdBwd {
        return Some(format!(
            "variant {name} has no backward on the GPU yet (mode fwd+bwd runs on the CPU only)"
        ));
    }
    if case.window.is_some() && algo != GpuAlgo::FlashDecoding {
        return Some(format!(
            "variant {name} has no sliding-window support on the GPU"
        ));
    }
    let fused = matches!(algo, GpuAlgo::Flash | GpuAlgo::FlashDecoding);
    if fused && !HEAD_DIMS.contains(&s.head_dim) {
        return Some(format!(
            "the CUDA {name} kernel is compiled for head_dim 64 and 128 only (head_dim = {})",
            s.head_dim
        ));
    }
    if s.seq_q == 0 || s.seq_kv == 0 || s.batch == 0 || s.heads == 0 {
        return Some("empty tensors are not launched on the GPU".into());
    }
    let limit = i32::MAX as usize;
    let too_big = [
        s.seq_q,
        s.seq_kv,
        s.batch * s.heads,
        s.heads / s.kv_heads.max(1) * s.seq_q,
    ]
    .iter()
    .any(|&x| x > limit);
    if too_big {
        return Some("a dimension exceeds the kernels' 32-bit launch parameters".into());
    }
    // Grid y (and decode's z) is at most 65535 blocks.
    let grid_yz = match algo {
        GpuAlgo::FlashDecoding => {
            (s.batch * s.kv_heads).max((s.group() * s.seq_q).div_ceil(decode_rows(s)))
        }
        _ => s.batch * s.heads,
    };
    if grid_yz > 65_535 {
        return Some(format!(
            "the CUDA {name} launch grid would need {grid_yz} blocks in y/z (at most 65535)"
        ));
    }
    None
}

/// Device bytes `algo` allocates for `case` beyond Q, K, V and O (the memory-overhead
/// prediction; the allocator's peak is checked against it).
pub fn workspace_bytes(algo: GpuAlgo, case: &Case) -> u64 {
    let s = &case.shape;
    let bh = (s.batch * s.heads) as u64;
    match algo {
        // S (f32), with P written over it.
        GpuAlgo::Naive { .. } => 4 * bh * s.seq_q as u64 * s.seq_kv as u64,
        GpuAlgo::Chunked => {
            let c = chunk_plan(case);
            4 * bh
                * (c.q_chunk as u64 * c.k_chunk as u64
                    + c.n_k_chunks as u64 * c.q_chunk as u64 * (s.head_dim as u64 + 2))
        }
        GpuAlgo::Flash => 0,
        GpuAlgo::FlashDecoding => {
            let splits = decode_splits(case) as u64;
            4 * splits * bh * s.seq_q as u64 * (s.head_dim as u64 + 1)
        }
    }
}

/// rabe-staats' chunking on the GPU: the case's chunks (the variant's defaults, from the
/// paper, unless the config sets them), clamped to the sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkPlan {
    pub q_chunk: usize,
    pub k_chunk: usize,
    pub n_q_chunks: usize,
    pub n_k_chunks: usize,
}

pub fn chunk_plan(case: &Case) -> ChunkPlan {
    let s = &case.shape;
    let q_chunk = case.q_chunk.unwrap_or(s.seq_q).clamp(1, s.seq_q.max(1));
    let k_chunk = case.kv_chunk.unwrap_or(s.seq_kv).clamp(1, s.seq_kv.max(1));
    ChunkPlan {
        q_chunk,
        k_chunk,
        n_q_chunks: s.seq_q.div_ceil(q_chunk),
        n_k_chunks: s.seq_kv.div_ceil(k_chunk),
    }
}

impl ChunkPlan {
    /// Key chunks query chunk `qi` needs: all of them, or with the causal mask those up to
    /// the one holding the last key its last row sees (at least one, so rows that see no
    /// key still get an all-masked summary and write 0).
    pub fn used_k_chunks(&self, case: &Case, qi: usize) -> usize {
        let s = &case.shape;
        let last_row = ((qi + 1) * self.q_chunk).min(s.seq_q) - 1;
        let keys = s.visible_keys(case.causal, last_row);
        keys.div_ceil(self.k_chunk).clamp(1, self.n_k_chunks)
    }
}

/// The fused flash kernel's tiles: rows per block and keys per tile (bf16/f16: 4 warps x 16
/// rows on tensor cores; f32: 32 rows x 4 lanes on CUDA cores).
pub fn flash_tiles(dtype: DType) -> (usize, usize) {
    match dtype {
        DType::F32 => (32, 32),
        DType::Bf16 | DType::F16 => (64, 64),
    }
}

/// (grid, block, dynamic shared bytes) of flash for `case`.
pub fn flash_launch(case: &Case) -> ((u32, u32, u32), (u32, u32, u32), u32) {
    let s = &case.shape;
    let (bm, bn) = flash_tiles(case.dtype);
    let grid = (s.seq_q.div_ceil(bm) as u32, (s.batch * s.heads) as u32, 1);
    let smem = match case.dtype {
        DType::F32 => 0, // static shared memory
        _ => ((bm + 4 * bn) * (s.head_dim + 8) * 2) as u32,
    };
    (grid, (128, 1, 1), smem)
}

/// Key tiles one flash block visits: causal blocks stop at the last key their last row sees
/// (the blocks above the diagonal are never loaded).
pub fn flash_tiles_visited(case: &Case, block: usize) -> usize {
    let s = &case.shape;
    let (bm, bn) = flash_tiles(case.dtype);
    let last = ((block + 1) * bm).min(s.seq_q) - 1;
    s.visible_keys(case.causal, last).div_ceil(bn)
}

/// Query rows one decode block can handle (`D_ROWS` in decode.cu, one build each).
pub const DECODE_ROWS_CHOICES: [usize; 4] = [1, 2, 4, 8];

/// Query rows per decode block: the rows sharing a KV head (GQA group x new tokens), rounded
/// up to a build in [`DECODE_ROWS_CHOICES`] (at most 8: more rows take more blocks). A block's
/// work per key grows with its rows, so MHA decode (1 row) does not pay for 8.
pub fn decode_rows(s: &Shape) -> usize {
    let rows = (s.group() * s.seq_q).max(1);
    DECODE_ROWS_CHOICES
        .into_iter()
        .find(|&r| r >= rows)
        .unwrap_or(DECODE_ROWS_CHOICES[DECODE_ROWS_CHOICES.len() - 1])
}

/// Keys per shared-memory stage and the number of stages of the decode split pass (`TILE`,
/// `STAGES` in decode.cu).
pub const DECODE_TILE_KEYS: usize = 64;
pub const DECODE_STAGES: usize = 2;

/// Dynamic shared memory of the decode split pass (`DECODE_SHARED_BYTES` in decode.cu, which
/// traps when launched with less): the queries in f32, then `DECODE_STAGES` K tiles (rows
/// padded by 16 bytes) and V tiles. bf16 d = 128, 4 rows: 2 KiB + 2 x 33 KiB, so three blocks
/// fit an SM.
pub fn decode_shared_bytes(dtype: DType, head_dim: usize, rows: usize) -> usize {
    let esz = dtype.size_bytes();
    let piece = 16 / esz;
    let stage = DECODE_TILE_KEYS * ((head_dim + piece) + head_dim) * esz;
    rows * head_dim * 4 + DECODE_STAGES * stage
}

/// Blocks the default split count aims for: a whole number of waves on a 132-SM Hopper
/// (H100/H200 SXM) at three resident blocks per SM (bf16/f16), four waves so that the
/// last one's stragglers cost little. Decode is memory-bound: the blocks' staged tiles
/// keep the copies in flight.
pub const DECODE_TARGET_BLOCKS: usize = 132 * 3 * 4;

/// Fewest keys a split should read (below that the combine costs more than it saves).
pub const DECODE_MIN_KEYS_PER_SPLIT: usize = 256;

/// flash-decoding's default split count on the GPU: at most [`DECODE_TARGET_BLOCKS`] blocks,
/// but no split shorter than [`DECODE_MIN_KEYS_PER_SPLIT`] keys.
/// The (q_chunk, kv_chunk) of a CUDA case of `algo` where its kernel fixes them: flash's
/// tiles, clamped to the sequence; none for flash-decoding, which cuts the cache into
/// splits only. `None`: the case keeps the chunks its config gives.
pub fn fixed_chunks(
    algo: GpuAlgo,
    dtype: DType,
    seq_q: usize,
    seq_kv: usize,
) -> Option<(Option<usize>, Option<usize>)> {
    match algo {
        GpuAlgo::Flash => {
            let (bm, bn) = flash_tiles(dtype);
            Some((Some(bm.min(seq_q)), Some(bn.min(seq_kv))))
        }
        GpuAlgo::FlashDecoding => Some((None, None)),
        _ => None,
    }
}

/// The split count of a CUDA case of `algo` when the config names none: flash-decoding's
/// fills the device; any other keeps `own`, the variant's CPU rule.
pub fn default_splits(algo: GpuAlgo, shape: &Shape, own: Option<usize>) -> Option<usize> {
    match algo {
        GpuAlgo::FlashDecoding => own.map(|_| decode_default_splits(shape)),
        _ => own,
    }
}

pub fn decode_default_splits(s: &Shape) -> usize {
    let blocks = s.batch * s.kv_heads * (s.group() * s.seq_q).div_ceil(decode_rows(s));
    let want = DECODE_TARGET_BLOCKS / blocks.max(1);
    let most = s.seq_kv.div_ceil(DECODE_MIN_KEYS_PER_SPLIT).max(1);
    want.clamp(1, most)
}

/// The split count a flash-decoding case runs with: the case's (the config's `splits`, or
/// [`decode_default_splits`]), at most one per key.
pub fn decode_splits(case: &Case) -> usize {
    let s = &case.shape;
    case.splits
        .unwrap_or_else(|| decode_default_splits(s))
        .clamp(1, s.seq_kv.max(1))
}

/// A kernel launch's grid or block dimensions.
pub type Dim3 = (u32, u32, u32);

/// (grid, block, keys per split, dynamic shared bytes) of the decode split pass for
/// `splits` parts.
pub fn decode_launch(case: &Case, splits: usize) -> (Dim3, Dim3, usize, u32) {
    let s = &case.shape;
    let splits = splits.clamp(1, s.seq_kv.max(1));
    let per = s.seq_kv.div_ceil(splits);
    let rows = decode_rows(s);
    let grid = (
        splits as u32,
        (s.batch * s.kv_heads) as u32,
        (s.group() * s.seq_q).div_ceil(rows) as u32,
    );
    let shared = decode_shared_bytes(case.dtype, s.head_dim, rows) as u32;
    (grid, (128, 1, 1), per, shared)
}

/// Bytes memset between repetitions for cold (L2-flushed) timing: twice the L2 size, so no
/// line of the previous call survives.
pub fn l2_flush_bytes(l2_bytes: usize) -> usize {
    2 * l2_bytes.max(1 << 20)
}

/// What `meta.json` records of the GPU a sweep ran on (clocks are the driver's reported
/// maximum application clocks, not a measurement under load).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GpuInfo {
    pub name: String,
    pub compute_capability: String,
    pub multiprocessors: Option<i32>,
    pub memory_bytes: Option<u64>,
    pub l2_bytes: Option<u64>,
    pub sm_clock_mhz: Option<i32>,
    pub memory_clock_mhz: Option<i32>,
    pub memory_bus_bits: Option<i32>,
    pub driver_version: Option<String>,
    pub nvrtc_version: Option<String>,
    /// Device-to-device copy bandwidth, bytes read + written per second / 1e9 (median of
    /// repeated 256 MiB copies when the device was opened): decode rows' `copy_bw_frac`
    /// denominator.
    pub copy_gbytes_per_s: Option<f64>,
}

#[cfg(test)]
mod tests;
