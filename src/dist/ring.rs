//! Ring Attention with one MPI rank per device (Liu et al. 2023; docs/papers.md, Other sources (Ring Attention)): rank
//! i holds key/value shard i (contiguous, t = N/p), and in p steps folds the shard it holds
//! into its running (acc, max, sum) with the simulation's kernels (`sim::local`), while the
//! shard already travels on: each step posts a nonblocking send of the shard to rank i + 1
//! and a receive of the next one from rank i - 1 (MPI_Isend/MPI_Irecv, double-buffered),
//! computes, then waits. Decode broadcasts q from the last rank along the simulation's
//! binomial schedule. Per rank: kv shard + the travelling shard + the incoming one (double
//! buffering: one shard more than eq. (8)) + q + o + max + sum; communication 2·b·t·d_kv
//! per rank per step (eq. (10)), counted as in the simulation. Time O(t * N * d) per rank
//! for decode.

use super::link::{tensor_bytes, tensor_bytes_mut, Link};
use crate::backend::cpu::workspace::{try_zeroed, Workspace};
use crate::error::{Error, Result};
use crate::problem::{DType, Inputs, Tensor};
use crate::sim::device::DeviceMemory;
use crate::sim::local::{self, Carry, KvRef, Work};
use crate::sim::plan;
use crate::sim::ring::{
    query_positions, shard_elements, write_output, write_rows, Spec, BROADCAST_Q, ROTATION,
};
use crate::sim::shard::{gather, Placement};
use crate::sim::stats::SimStats;

/// A zeroed tensor of `len` elements of `dtype` (a receive buffer).
pub(super) fn zeros(dtype: DType, len: usize) -> Tensor {
    match dtype {
        DType::F32 => Tensor::F32(vec![0.0; len]),
        DType::Bf16 => Tensor::Bf16(vec![half::bf16::ZERO; len]),
        DType::F16 => Tensor::F16(vec![half::f16::ZERO; len]),
    }
}

/// `t` padded with zeros to `len` elements (a buffer that later receives larger shards).
fn grown(t: Tensor, len: usize) -> Tensor {
    fn pad<T: Copy + Default>(mut v: Vec<T>, len: usize) -> Vec<T> {
        v.resize(len.max(v.len()), T::default());
        v
    }
    match t {
        Tensor::F32(v) => Tensor::F32(pad(v, len)),
        Tensor::Bf16(v) => Tensor::Bf16(pad(v, len)),
        Tensor::F16(v) => Tensor::F16(pad(v, len)),
    }
}

/// q on every rank: the last rank's (it made the new token) sent along the binomial
/// broadcast schedule of the simulation; `library` uses MPI_Ibcast instead (not counted).
pub(super) fn broadcast_q(link: &mut Link, inputs: &Inputs, library: bool) -> Tensor {
    let p = link.p;
    let n = inputs.shape.q_len();
    let mut q = if link.rank == p - 1 {
        inputs.q.clone()
    } else {
        zeros(inputs.dtype(), n)
    };
    if library {
        link.library_broadcast(BROADCAST_Q, p - 1, &mut q);
    } else {
        link.broadcast_plan(BROADCAST_Q, &plan::broadcast(p - 1, p, n), &mut q);
    }
    q
}

/// Ring Attention of `inputs` on this rank into `out` (decode: the whole output on every
/// rank; prefill: this rank's rows at their positions, every rank's gathered on rank 0
/// instead when `counted`). Contiguous or appended shards (not striped). Returns the
/// gathered counters when `counted` (the checked call), else records the call's
/// communication time.
pub fn run(
    spec: &Spec,
    inputs: &Inputs,
    out: &mut [f32],
    counted: bool,
) -> Result<Option<SimStats>> {
    let s = inputs.shape;
    let mut link = Link::new();
    let (me, p) = (link.rank, link.p);
    if spec.p() != p || spec.placement == Placement::Striped {
        return Err(super::not_here(spec.p()));
    }
    let (d, dtype) = (s.head_dim, inputs.dtype());
    let es = dtype.size_bytes();
    let layout = spec.layout(&s);
    let geo = spec.geometry(&s);
    let kv_heads = s.batch * s.kv_heads;
    let sizes: Vec<usize> = (0..p).map(|j| shard_elements(&s, &layout, j)).collect();
    let mut mem = DeviceMemory::default();
    mem.hold("kv shard", sizes[me], es);

    // The shard that travels starts as a packed copy of this rank's own.
    let (t, pos) = (layout.len(me), layout.positions(me));
    // Both buffers hold the largest shard: shards differ by one token when p does not
    // divide N, and each buffer carries every shard in turn.
    let max_half = sizes.iter().max().copied().unwrap_or(0) / 2;
    let mut cur = (
        grown(
            gather(&inputs.k, kv_heads, s.seq_kv, d, pos, t, "K shard to send")?,
            max_half,
        ),
        grown(
            gather(&inputs.v, kv_heads, s.seq_kv, d, pos, t, "V shard to send")?,
            max_half,
        ),
    );
    let q = if spec.decode {
        let q = broadcast_q(&mut link, inputs, false);
        mem.hold("q", s.q_len(), es);
        q
    } else {
        let heads = s.batch * s.heads;
        mem.hold("q", heads * t * d, es);
        gather(&inputs.q, heads, s.seq_q, d, pos, t, "q shard")?
    };
    let tq = spec.tq(&s)[me];
    let rows = s.batch * s.heads * tq;
    let mut acc = try_zeroed(rows * d, "ring output accumulator")?;
    let mut run_max = try_zeroed(rows, "ring running max")?;
    run_max.fill(f32::NEG_INFINITY);
    let mut run_sum = try_zeroed(rows, "ring running sum")?;
    mem.hold("o", rows * d, 4);
    mem.hold("m", rows, 4);
    mem.hold("l", rows, 4);
    let (workers, floats) = spec.workspace(&s, dtype);
    let ws = Workspace::new(workers, floats, "ring attention tiles")?;

    let mut nxt = if p > 1 {
        mem.hold("visiting kv", sizes[me], es);
        mem.hold("incoming kv", max_half * 2, es);
        link.begin(ROTATION);
        (zeros(dtype, max_half), zeros(dtype, max_half))
    } else {
        (zeros(dtype, 0), zeros(dtype, 0))
    };
    let (next, prev) = ((me + 1) % p, (me + p - 1) % p);
    let mut work = Vec::with_capacity(p);
    for step in 0..p {
        let j = (me + p - step) % p;
        let w = Work {
            device: me,
            q: &q,
            tq,
            qpos: query_positions(spec, &s, &layout, me),
            kv: KvRef::packed(&cur.0, &cur.1, layout.len(j), d, layout.positions(j)),
            carry: Carry::Running {
                acc: &mut acc,
                m: &mut run_max,
                l: &mut run_sum,
                last: step + 1 == p,
            },
        };
        let compute = || local::step(vec![w], &geo, &ws, p)[me];
        if step + 1 == p {
            work.push(compute());
            break;
        }
        // Shard j leaves for rank i + 1 while shard jn arrives from rank i - 1.
        let jn = (me + p - step - 1) % p;
        let (hs, hr) = (sizes[j] / 2, sizes[jn] / 2);
        let sends = [
            (next, tensor_bytes(&cur.0, 0..hs)),
            (next, tensor_bytes(&cur.1, 0..hs)),
        ];
        let mut recvs = [
            (prev, tensor_bytes_mut(&mut nxt.0, 0..hr)),
            (prev, tensor_bytes_mut(&mut nxt.1, 0..hr)),
        ];
        let what =
            format!("{ROTATION}, step {step} (rank {me} sends to {next}, receives from {prev})");
        work.push(link.exchange(&sends, &mut recvs, &what, compute));
        link.count_send(sizes[j], sizes[j] * es);
        link.count_recv(sizes[jn], sizes[jn] * es);
        link.end_round();
        std::mem::swap(&mut cur, &mut nxt);
    }

    if spec.decode {
        out.copy_from_slice(&acc);
    } else if counted {
        gather_rows(&mut link, spec, inputs, &acc, out)?;
    } else {
        write_rows(&s, &layout, me, &acc, out);
    }
    if !counted {
        link.close();
        return Ok(None);
    }
    let planned = spec.planned(&s, dtype);
    let mut stats = link.finish(&mem, &work, true)?;
    stats.sim_bytes = Some(planned.bytes);
    stats.sim_max_device_bytes = Some(planned.max_device_bytes);
    Ok(Some(stats))
}

/// Prefill: every rank's output rows to rank 0, which writes them to their positions (for
/// the error check; harness traffic, not counted and not timed).
fn gather_rows(
    link: &mut Link,
    spec: &Spec,
    inputs: &Inputs,
    acc: &[f32],
    out: &mut [f32],
) -> Result<()> {
    let s = inputs.shape;
    let (me, p) = (link.rank, link.p);
    let layout = spec.layout(&s);
    let len = |r: usize| s.batch * s.heads * layout.len(r) * s.head_dim;
    if me != 0 {
        let bytes: &[u8] = super::link::f32_bytes(acc);
        link.exchange(&[(0, bytes)], &mut [], "gathering the output rows", || ());
        return Ok(());
    }
    let mut all: Vec<Vec<f32>> = (0..p)
        .map(|r| vec![0.0; if r == 0 { 0 } else { len(r) }])
        .collect();
    {
        let mut recvs: Vec<(usize, &mut [u8])> = all
            .iter_mut()
            .enumerate()
            .skip(1)
            .map(|(r, v)| (r, super::link::f32_bytes_mut(v)))
            .collect();
        link.exchange(&[], &mut recvs, "gathering the output rows", || ());
    }
    all[0] = acc.to_vec();
    if all.iter().enumerate().any(|(r, v)| v.len() != len(r)) {
        return Err(Error::Runtime(
            "ring prefill: output rows of the wrong size".into(),
        ));
    }
    write_output(spec, &s, &layout, &all, out);
    Ok(())
}
