//! The GPU algorithms as launch sequences: naive (cuBLAS S = scale Q K^T, in-place softmax,
//! cuBLAS P V), rabe-staats (Rabe & Staats Figure 1: per query chunk, per key chunk a cuBLAS
//! score GEMM, the summary kernel and a cuBLAS value GEMM, then the combine kernel), flash
//! (one fused FA2 kernel) and flash-decoding (split pass + combine). Only enqueues work;
//! measurement lives in `crate::run::cuda`. Extra memory is exactly
//! `plan::workspace_bytes`, allocated up front by [`Workspace::alloc`].

use std::ffi::c_void;

use super::device::{DeviceBuffer, Gemm, Gpu};
use super::plan::{self, GpuAlgo, Kernel};
use crate::error::{Error, Result};
use crate::problem::{Case, Inputs, Tensor};

/// Q, K, V (storage dtype) and O (f32) on the device.
pub struct Io<'a> {
    pub q: DeviceBuffer<'a>,
    pub k: DeviceBuffer<'a>,
    pub v: DeviceBuffer<'a>,
    pub o: DeviceBuffer<'a>,
}

impl<'a> Io<'a> {
    pub fn upload(gpu: &'a Gpu, inputs: &Inputs) -> Result<Io<'a>> {
        let s = &inputs.shape;
        let es = inputs.dtype().size_bytes();
        let put = |t: &Tensor, what: &str| -> Result<DeviceBuffer<'a>> {
            let buf = gpu.alloc(t.len() * es, what)?;
            match t {
                Tensor::F32(v) => gpu.upload(&buf, v)?,
                Tensor::Bf16(v) => gpu.upload(&buf, v)?,
                Tensor::F16(v) => gpu.upload(&buf, v)?,
            }
            Ok(buf)
        };
        Ok(Io {
            q: put(&inputs.q, "Q")?,
            k: put(&inputs.k, "K")?,
            v: put(&inputs.v, "V")?,
            o: gpu.alloc(s.out_len() * 4, "O")?,
        })
    }
}

/// The algorithm's device scratch, allocated before the call.
pub struct Workspace<'a> {
    bufs: Vec<DeviceBuffer<'a>>,
}

impl<'a> Workspace<'a> {
    /// Exactly `plan::workspace_bytes(algo, case)` bytes, in the buffers the launcher uses.
    pub fn alloc(gpu: &'a Gpu, algo: GpuAlgo, case: &Case) -> Result<Workspace<'a>> {
        let s = &case.shape;
        let bh = s.batch * s.heads;
        let sizes: Vec<(usize, &str)> = match algo {
            GpuAlgo::Naive { .. } => vec![(4 * bh * s.seq_q * s.seq_kv, "naive S/P")],
            GpuAlgo::Chunked => {
                let c = plan::chunk_plan(case);
                let rows = bh * c.n_k_chunks * c.q_chunk;
                vec![
                    (4 * bh * c.q_chunk * c.k_chunk, "chunk scores S/E"),
                    (4 * rows, "chunk maxima"),
                    (4 * rows, "chunk sums"),
                    (4 * rows * s.head_dim, "chunk values"),
                ]
            }
            GpuAlgo::Flash => vec![],
            GpuAlgo::FlashDecoding => {
                let rows = plan::decode_splits(case) * bh * s.seq_q;
                vec![
                    (4 * rows * s.head_dim, "split outputs"),
                    (4 * rows, "split logsumexp"),
                ]
            }
        };
        let bufs = sizes
            .into_iter()
            .map(|(bytes, what)| gpu.alloc(bytes, what))
            .collect::<Result<Vec<_>>>()?;
        Ok(Workspace { bufs })
    }

    pub fn bytes(&self) -> u64 {
        self.bufs.iter().map(|b| b.bytes as u64).sum()
    }
}

fn arg<T>(x: &mut T) -> *mut c_void {
    x as *mut T as *mut c_void
}

fn int(x: usize, what: &str) -> Result<i32> {
    i32::try_from(x).map_err(|_| Error::Runtime(format!("{what} = {x} exceeds a 32-bit int")))
}

/// Enqueues one forward of `algo` for `case` on the GPU's stream (`tf32`: f32 GEMMs on TF32
/// tensor cores).
pub fn forward(
    gpu: &Gpu,
    algo: GpuAlgo,
    case: &Case,
    io: &Io<'_>,
    ws: &Workspace<'_>,
    tf32: bool,
) -> Result<()> {
    match algo {
        GpuAlgo::Naive { safe } => naive(gpu, case, io, ws, safe, tf32),
        GpuAlgo::Chunked => chunked(gpu, case, io, ws, tf32),
        GpuAlgo::Flash => flash(gpu, case, io),
        GpuAlgo::FlashDecoding => decode(gpu, case, io, ws),
    }
}

/// Row-major S [rows = group * n_q, n_kv] per (batch, kv head) is column-major S^T, so
/// S^T = K Q^T: op(A) = K^T stored [n_kv][d] read transposed, B = Q^T stored [rows][d]. The
/// query heads of one GQA group are consecutive in Q, so one batched GEMM over
/// (batch, kv head) covers them all. Then O^T = V^T P^T with P over S's bytes.
fn naive(
    gpu: &Gpu,
    case: &Case,
    io: &Io<'_>,
    ws: &Workspace<'_>,
    safe: bool,
    tf32: bool,
) -> Result<()> {
    let s = &case.shape;
    let (nq, nkv, d) = (s.seq_q, s.seq_kv, s.head_dim);
    let rows = s.group() * nq;
    let batch = int(s.batch * s.kv_heads, "batch * kv_heads")?;
    let sbuf = &ws.bufs[0];
    gpu.gemm(
        &Gemm {
            what: "naive S = scale Q K^T",
            trans_a: true,
            trans_b: false,
            m: int(nkv, "seq_kv")?,
            n: int(rows, "group * seq_q")?,
            k: int(d, "head_dim")?,
            alpha: s.scale(),
            a: io.k.ptr,
            lda: int(d, "head_dim")?,
            stride_a: (nkv * d) as i64,
            b: io.q.ptr,
            ldb: int(d, "head_dim")?,
            stride_b: (rows * d) as i64,
            c: sbuf.ptr,
            ldc: int(nkv, "seq_kv")?,
            stride_c: (rows * nkv) as i64,
            batch,
        },
        case.dtype,
        tf32,
    )?;
    let f = gpu.function(
        Kernel::Softmax,
        &plan::softmax_defines(case.dtype, safe),
        "softmax_rows",
    )?;
    let total = (s.batch * s.heads * nq) as i64;
    let (mut sp, mut rows_arg) = (sbuf.ptr, total);
    let (mut sq, mut skv, mut causal) =
        (int(nq, "seq_q")?, int(nkv, "seq_kv")?, case.causal as i32);
    gpu.launch(
        &f,
        "softmax_rows",
        (total.min(1 << 20) as u32, 1, 1),
        (256, 1, 1),
        0,
        &mut [
            arg(&mut sp),
            arg(&mut rows_arg),
            arg(&mut sq),
            arg(&mut skv),
            arg(&mut causal),
        ],
    )?;
    // P elements per f32 slot of S: 1 for f32, 2 for 16-bit storage.
    let per = 4 / case.dtype.size_bytes();
    gpu.gemm(
        &Gemm {
            what: "naive O = P V",
            trans_a: false,
            trans_b: false,
            m: int(d, "head_dim")?,
            n: int(rows, "group * seq_q")?,
            k: int(nkv, "seq_kv")?,
            alpha: 1.0,
            a: io.v.ptr,
            lda: int(d, "head_dim")?,
            stride_a: (nkv * d) as i64,
            b: sbuf.ptr,
            ldb: int(nkv * per, "seq_kv")?,
            stride_b: (rows * nkv * per) as i64,
            c: io.o.ptr,
            ldc: int(d, "head_dim")?,
            stride_c: (rows * d) as i64,
            batch,
        },
        case.dtype,
        tf32,
    )
}

/// Per query chunk qi and key chunk j < used(qi): S = scale Q_qi K_j^T into the chunk buffer
/// (one GEMM per GQA group member, batched over (batch, kv head)), the summary kernel (m_j,
/// E in place, l_j), v_j = E V_j into slot j; then the combine writes O's rows of chunk qi.
fn chunked(gpu: &Gpu, case: &Case, io: &Io<'_>, ws: &Workspace<'_>, tf32: bool) -> Result<()> {
    let s = &case.shape;
    let c = plan::chunk_plan(case);
    let (nq, nkv, d, g) = (s.seq_q, s.seq_kv, s.head_dim, s.group());
    let (qc, kc, nkc) = (c.q_chunk, c.k_chunk, c.n_k_chunks);
    let es = case.dtype.size_bytes();
    let per = 4 / es;
    let batch = int(s.batch * s.kv_heads, "batch * kv_heads")?;
    let bh = s.batch * s.heads;
    let [sbuf, ms, ls, vs] = &ws.bufs[..] else {
        return Err(Error::Runtime(
            "rabe-staats workspace has the wrong layout".into(),
        ));
    };
    let defines = plan::chunked_defines(case.dtype);
    let summary = gpu.function(Kernel::Chunked, &defines, "chunk_summary")?;
    let combine = gpu.function(Kernel::Chunked, &defines, "chunk_combine")?;
    for qi in 0..c.n_q_chunks {
        let q0 = qi * qc;
        let rows = qc.min(nq - q0);
        let used = c.used_k_chunks(case, qi);
        for jc in 0..used {
            let k0 = jc * kc;
            let cols = kc.min(nkv - k0);
            for gi in 0..g {
                gpu.gemm(
                    &Gemm {
                        what: "rabe-staats S = scale Q_i K_j^T",
                        trans_a: true,
                        trans_b: false,
                        m: int(cols, "k_chunk")?,
                        n: int(rows, "q_chunk")?,
                        k: int(d, "head_dim")?,
                        alpha: s.scale(),
                        a: io.k.at(k0 * d, es),
                        lda: int(d, "head_dim")?,
                        stride_a: (nkv * d) as i64,
                        b: io.q.at((gi * nq + q0) * d, es),
                        ldb: int(d, "head_dim")?,
                        stride_b: (g * nq * d) as i64,
                        c: sbuf.at(gi * qc * kc, 4),
                        ldc: int(kc, "k_chunk")?,
                        stride_c: (g * qc * kc) as i64,
                        batch,
                    },
                    case.dtype,
                    tf32,
                )?;
            }
            let (mut sp, mut mp, mut lp) = (sbuf.ptr, ms.ptr, ls.ptr);
            let (mut a_qc, mut a_kc, mut a_rows, mut a_cols) = (
                int(qc, "q_chunk")?,
                int(kc, "k_chunk")?,
                rows as i32,
                cols as i32,
            );
            let (mut a_q0, mut a_k0, mut a_jc, mut a_nkc) = (
                int(q0, "q0")?,
                int(k0, "k0")?,
                jc as i32,
                int(nkc, "key chunks")?,
            );
            let (mut a_nq, mut a_nkv, mut a_causal) = (nq as i32, nkv as i32, case.causal as i32);
            gpu.launch(
                &summary,
                "chunk_summary",
                (rows as u32, bh as u32, 1),
                (128, 1, 1),
                0,
                &mut [
                    arg(&mut sp),
                    arg(&mut mp),
                    arg(&mut lp),
                    arg(&mut a_qc),
                    arg(&mut a_kc),
                    arg(&mut a_rows),
                    arg(&mut a_cols),
                    arg(&mut a_q0),
                    arg(&mut a_k0),
                    arg(&mut a_jc),
                    arg(&mut a_nkc),
                    arg(&mut a_nq),
                    arg(&mut a_nkv),
                    arg(&mut a_causal),
                ],
            )?;
            for gi in 0..g {
                gpu.gemm(
                    &Gemm {
                        what: "rabe-staats v_j = E V_j",
                        trans_a: false,
                        trans_b: false,
                        m: int(d, "head_dim")?,
                        n: int(rows, "q_chunk")?,
                        k: int(cols, "k_chunk")?,
                        alpha: 1.0,
                        a: io.v.at(k0 * d, es),
                        lda: int(d, "head_dim")?,
                        stride_a: (nkv * d) as i64,
                        b: sbuf.at(gi * qc * kc * per, es),
                        ldb: int(kc * per, "k_chunk")?,
                        stride_b: (g * qc * kc * per) as i64,
                        c: vs.at((gi * nkc + jc) * qc * d, 4),
                        ldc: int(d, "head_dim")?,
                        stride_c: (g * nkc * qc * d) as i64,
                        batch,
                    },
                    case.dtype,
                    tf32,
                )?;
            }
        }
        let (mut mp, mut lp, mut vp, mut op) = (ms.ptr, ls.ptr, vs.ptr, io.o.ptr);
        let (mut a_qc, mut a_rows, mut a_q0, mut a_used) =
            (qc as i32, rows as i32, q0 as i32, used as i32);
        let (mut a_nkc, mut a_nq, mut a_d) = (nkc as i32, nq as i32, int(d, "head_dim")?);
        gpu.launch(
            &combine,
            "chunk_combine",
            (rows as u32, bh as u32, 1),
            (128, 1, 1),
            0,
            &mut [
                arg(&mut mp),
                arg(&mut lp),
                arg(&mut vp),
                arg(&mut op),
                arg(&mut a_qc),
                arg(&mut a_rows),
                arg(&mut a_q0),
                arg(&mut a_used),
                arg(&mut a_nkc),
                arg(&mut a_nq),
                arg(&mut a_d),
            ],
        )?;
    }
    Ok(())
}

fn flash(gpu: &Gpu, case: &Case, io: &Io<'_>) -> Result<()> {
    let s = &case.shape;
    let kernel = plan::flash_kernel(case.dtype);
    let entry = kernel.entry_points()[0];
    let f = gpu.function(kernel, &plan::flash_defines(case.dtype, s.head_dim), entry)?;
    let (grid, block, shared) = plan::flash_launch(case);
    gpu.allow_shared(&f, shared)?;
    let (mut q, mut k, mut v, mut o) = (io.q.ptr, io.k.ptr, io.v.ptr, io.o.ptr);
    let (mut heads, mut group) = (int(s.heads, "heads")?, int(s.group(), "group")?);
    let (mut nq, mut nkv, mut causal) = (
        int(s.seq_q, "seq_q")?,
        int(s.seq_kv, "seq_kv")?,
        case.causal as i32,
    );
    let mut scale_log2 = s.scale() * std::f32::consts::LOG2_E;
    gpu.launch(
        &f,
        entry,
        grid,
        block,
        shared,
        &mut [
            arg(&mut q),
            arg(&mut k),
            arg(&mut v),
            arg(&mut o),
            arg(&mut heads),
            arg(&mut group),
            arg(&mut nq),
            arg(&mut nkv),
            arg(&mut causal),
            arg(&mut scale_log2),
        ],
    )
}

fn decode(gpu: &Gpu, case: &Case, io: &Io<'_>, ws: &Workspace<'_>) -> Result<()> {
    let s = &case.shape;
    let splits = plan::decode_splits(case);
    let (grid, block, per, shared) = plan::decode_launch(case, splits);
    let defines = plan::decode_defines(case.dtype, s.head_dim, plan::decode_rows(s));
    let split = gpu.function(Kernel::Decode, &defines, "decode_split")?;
    gpu.allow_shared(&split, shared)?;
    let combine = gpu.function(Kernel::Decode, &defines, "decode_combine")?;
    let [part_o, part_lse] = &ws.bufs[..] else {
        return Err(Error::Runtime(
            "flash-decoding workspace has the wrong layout".into(),
        ));
    };
    let (mut q, mut k, mut v, mut po, mut pl) =
        (io.q.ptr, io.k.ptr, io.v.ptr, part_o.ptr, part_lse.ptr);
    let (mut batch, mut heads, mut group) = (
        int(s.batch, "batch")?,
        int(s.heads, "heads")?,
        int(s.group(), "group")?,
    );
    let (mut nq, mut nkv, mut causal) = (
        int(s.seq_q, "seq_q")?,
        int(s.seq_kv, "seq_kv")?,
        case.causal as i32,
    );
    let mut window = int(case.window.unwrap_or(0), "window")?;
    let mut per_arg = int(per, "keys per split")?;
    let mut scale_log2 = s.scale() * std::f32::consts::LOG2_E;
    gpu.launch(
        &split,
        "decode_split",
        grid,
        block,
        shared,
        &mut [
            arg(&mut q),
            arg(&mut k),
            arg(&mut v),
            arg(&mut po),
            arg(&mut pl),
            arg(&mut batch),
            arg(&mut heads),
            arg(&mut group),
            arg(&mut nq),
            arg(&mut nkv),
            arg(&mut causal),
            arg(&mut window),
            arg(&mut per_arg),
            arg(&mut scale_log2),
        ],
    )?;
    let rows = (s.batch * s.heads * s.seq_q) as i64;
    let (mut po, mut pl, mut o, mut rows_arg, mut splits_arg) =
        (part_o.ptr, part_lse.ptr, io.o.ptr, rows, splits as i32);
    gpu.launch(
        &combine,
        "decode_combine",
        (rows.min(1 << 20) as u32, 1, 1),
        (s.head_dim as u32, 1, 1),
        0,
        &mut [
            arg(&mut po),
            arg(&mut pl),
            arg(&mut o),
            arg(&mut rows_arg),
            arg(&mut splits_arg),
        ],
    )
}
