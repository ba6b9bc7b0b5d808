//! Ring Attention on simulated devices (Liu et al. 2023; docs/papers.md, Other sources (Ring Attention); Transformers Inference Optimization Toolset
//! "Ring Attention" and "Stripe Attention"). Each device holds one shard of the keys and
//! values; in p steps it folds the shard it holds into its running (o, lse), then sends
//! that shard to device i + 1 and receives shard (i - s - 1) mod p from device i - 1
//! (p - 1 transfers: a forward pass needs no rotation back home).
//! - decode: the query rows are broadcast from the last device (which made the new token)
//!   and every device attends them to every shard in turn;
//! - prefill: the queries are sharded like the keys; causal blocks above the diagonal are
//!   skipped (they cost no work); with Striped placement token k lives on device k mod p,
//!   which evens the causal work out.
//!
//! Per device: kv shard + one visiting shard + q + o, and the running max and sum of the
//! online softmax (eq. (8) plus the 2·b·n_h statistics it leaves out); communication
//! 2·b·t·d_kv per device per step (eq. (10)).
//! Time O(p * t * N * d) for decode (every device sees every key), O(N^2 d / p) per device
//! for prefill.

use super::comm::{Comm, Fault};
use super::device::DeviceMemory;
use super::exec;
use super::local::{self, Carry, Geometry, KvRef, Work};
use super::plan::{self, Plan};
use super::shard::{gather, Layout, Placement};
use super::stats::{Planned, SimStats};
use crate::backend::cpu::decode::{Mask, Positions};
use crate::backend::cpu::workspace::{try_zeroed, Workspace};
use crate::error::{Error, Result};
use crate::problem::{DType, Inputs, Shape, Tensor};

/// The collectives' names in the counters.
pub const BROADCAST_Q: &str = "broadcast q";
pub const ROTATION: &str = "ring kv rotation";

#[derive(Clone, Copy, Debug)]
pub struct Spec {
    pub placement: Placement,
    /// Decode (queries broadcast) or prefill (queries sharded; needs seq_q = seq_kv).
    pub decode: bool,
    pub causal: bool,
    pub window: Option<usize>,
    pub devices: usize,
    /// Query rows per work item in prefill.
    pub bq: usize,
    pub bk: usize,
    pub threads: usize,
}

impl Spec {
    pub(crate) fn p(&self) -> usize {
        self.devices.max(1)
    }

    pub(crate) fn layout(&self, s: &Shape) -> Layout {
        Layout {
            placement: self.placement,
            p: self.p(),
            n: s.seq_kv,
        }
    }

    pub(crate) fn geometry(&self, s: &Shape) -> Geometry {
        Geometry {
            shape: *s,
            mask: Mask {
                causal: self.causal,
                window: self.window,
                kv_len: s.seq_kv,
                // The simulated devices take no sinks (`variant::impossible`).
                sinks: 0,
            },
            bq: if self.decode {
                (s.group() * s.seq_q).max(1)
            } else {
                self.bq.max(1)
            },
            bk: self.bk.max(1),
        }
    }

    /// Query rows per device.
    pub(crate) fn tq(&self, s: &Shape) -> Vec<usize> {
        let l = self.layout(s);
        (0..self.p())
            .map(|i| if self.decode { s.seq_q } else { l.len(i) })
            .collect()
    }

    /// (workers, floats per worker) of the kernel scratch.
    pub(crate) fn workspace(&self, s: &Shape, dtype: DType) -> (usize, usize) {
        let geo = self.geometry(s);
        let tq = self.tq(s);
        let rows = tq
            .iter()
            .map(|t| (s.group() * t).min(geo.bq))
            .max()
            .unwrap_or(0);
        let workers = self.threads.min(local::items(&geo, &tq)).max(1);
        (workers, local::worker_floats(&geo, rows, dtype, false))
    }

    /// Host bytes one call allocates besides inputs and output: the devices' copies (q,
    /// acc, m, l, the visiting shards; striped devices also own a permuted copy of their
    /// shard) and the kernel scratch. The simulation allocates exactly these.
    pub fn host_bytes(&self, s: &Shape, dtype: DType) -> u64 {
        let (p, es) = (self.p() as u64, dtype.size_bytes() as u64);
        let rows = (s.batch * s.heads * s.seq_q) as u64;
        let copies = if self.decode { p } else { 1 };
        let q = copies * s.q_len() as u64 * es;
        let o = copies * (s.out_len() as u64 + 2 * rows) * 4;
        let kv = 2 * s.kv_len() as u64 * es;
        let visiting = if p > 1 { kv } else { 0 };
        let own = match self.placement {
            Placement::Striped => kv,
            Placement::Contiguous | Placement::Appended { .. } => 0,
        };
        let (workers, floats) = self.workspace(s, dtype);
        q + o + visiting + own + Workspace::bytes(workers, floats)
    }
}

impl Spec {
    /// What the simulation sends for this case, from its schedules alone: the q broadcast
    /// (decode) and the rotation of the key/value shards.
    pub fn planned(&self, s: &Shape, dtype: DType) -> Planned {
        let (p, es) = (self.p(), dtype.size_bytes());
        let (bcast, rotation) = self.schedules(s);
        if self.decode {
            Planned::of(p, &[(&bcast, es), (&rotation, es)])
        } else {
            Planned::of(p, &[(&rotation, es)])
        }
    }
}

impl Spec {
    /// The schedules a call runs: the q broadcast from the last device (decode only) and
    /// the rotation of the key/value shards (the sizes of this layout).
    pub fn schedules(&self, s: &Shape) -> (Plan, Plan) {
        let p = self.p();
        let layout = self.layout(s);
        let sizes: Vec<usize> = (0..p).map(|j| shard_elements(s, &layout, j)).collect();
        (plan::broadcast(p - 1, p, s.q_len()), plan::rotation(&sizes))
    }
}

/// Elements of shard j's keys and values.
pub(crate) fn shard_elements(s: &Shape, layout: &Layout, j: usize) -> usize {
    2 * s.batch * s.kv_heads * layout.len(j) * s.head_dim
}

/// Ring Attention of `inputs` into `out`; `fault` injects a link bug (tests).
pub fn run(
    spec: &Spec,
    inputs: &Inputs,
    out: &mut [f32],
    fault: Option<Fault>,
) -> Result<SimStats> {
    let s = inputs.shape;
    let (p, d) = (spec.p(), s.head_dim);
    let dtype = inputs.dtype();
    let es = dtype.size_bytes();
    let layout = spec.layout(&s);
    let geo = spec.geometry(&s);
    let kv_heads = s.batch * s.kv_heads;
    let mut comm = Comm::new(p, fault);
    let mut mem = vec![DeviceMemory::default(); p];

    // Own shards: views of the cache when contiguous, permuted copies when striped.
    let mut owned: Vec<Option<(Tensor, Tensor)>> = Vec::with_capacity(p);
    for (i, m) in mem.iter_mut().enumerate() {
        let (t, pos) = (layout.len(i), layout.positions(i));
        owned.push(match spec.placement {
            Placement::Contiguous | Placement::Appended { .. } => None,
            Placement::Striped => Some((
                gather(&inputs.k, kv_heads, s.seq_kv, d, pos, t, "striped K shard")?,
                gather(&inputs.v, kv_heads, s.seq_kv, d, pos, t, "striped V shard")?,
            )),
        });
        m.hold("kv shard", shard_elements(&s, &layout, i), es);
    }
    let own = |i: usize| -> KvRef {
        let (t, pos) = (layout.len(i), layout.positions(i));
        match &owned[i] {
            None => KvRef {
                k: &inputs.k,
                v: &inputs.v,
                base0: pos.start as usize * d,
                head_stride: s.seq_kv * d,
                len: t,
                pos,
            },
            Some((k, v)) => KvRef::packed(k, v, t, d, pos),
        }
    };

    let q = distribute_queries(spec.decode, inputs, &layout, &mut comm, &mut mem)?;
    let tq = spec.tq(&s);
    let (mut acc, mut run_max, mut run_sum) = (
        Vec::with_capacity(p),
        Vec::with_capacity(p),
        Vec::with_capacity(p),
    );
    for (i, mm) in mem.iter_mut().enumerate() {
        let rows = s.batch * s.heads * tq[i];
        acc.push(try_zeroed(rows * d, "ring output accumulator")?);
        let mut m = try_zeroed(rows, "ring running max")?;
        m.fill(f32::NEG_INFINITY);
        run_max.push(m);
        run_sum.push(try_zeroed(rows, "ring running sum")?);
        mm.hold("o", rows * d, 4);
        mm.hold("m", rows, 4);
        mm.hold("l", rows, 4);
    }
    let (workers, floats) = spec.workspace(&s, dtype);
    let ws = Workspace::new(workers, floats, "ring attention tiles")?;

    let sizes: Vec<usize> = (0..p).map(|j| shard_elements(&s, &layout, j)).collect();
    let rotation = plan::rotation(&sizes);
    let mut visiting: Vec<Option<(Tensor, Tensor)>> = (0..p).map(|_| None).collect();
    let mut work = Vec::with_capacity(p);
    if p > 1 {
        comm.begin(ROTATION)?;
    }
    for step in 0..p {
        let works: Vec<Work> = acc
            .iter_mut()
            .zip(run_max.iter_mut())
            .zip(run_sum.iter_mut())
            .enumerate()
            .map(|(i, ((acc, m), l))| {
                let j = (i + p - step) % p;
                let kv = match &visiting[i] {
                    Some((k, v)) if step > 0 => {
                        KvRef::packed(k, v, layout.len(j), d, layout.positions(j))
                    }
                    _ => own(i),
                };
                Work {
                    device: i,
                    q: &q[i],
                    tq: tq[i],
                    qpos: query_positions(spec, &s, &layout, i),
                    kv,
                    carry: Carry::Running {
                        acc,
                        m,
                        l,
                        last: step + 1 == p,
                    },
                }
            })
            .collect();
        work.push(local::step(works, &geo, &ws, p));
        let Some(round) = rotation.rounds.get(step) else {
            continue;
        };
        for t in round {
            let j = (t.src + p - step) % p;
            let (k, v) = if step == 0 {
                // The device's own shard leaves in a buffer of its own (a copy of the view,
                // or of its permuted copy), which then travels around the ring.
                mem[t.src].hold("visiting kv", sizes[j], es);
                let t_len = layout.len(t.src);
                match &owned[t.src] {
                    None => {
                        let pos = layout.positions(t.src);
                        (
                            gather(&inputs.k, kv_heads, s.seq_kv, d, pos, t_len, "K to send")?,
                            gather(&inputs.v, kv_heads, s.seq_kv, d, pos, t_len, "V to send")?,
                        )
                    }
                    Some((k, v)) => {
                        let pos = Positions::CONTIGUOUS;
                        (
                            gather(k, kv_heads, t_len, d, pos, t_len, "K to send")?,
                            gather(v, kv_heads, t_len, d, pos, t_len, "V to send")?,
                        )
                    }
                }
            } else {
                visiting[t.src].take().ok_or_else(|| {
                    Error::Runtime(format!(
                        "simulated ring: device {} has no shard to forward at step {step}",
                        t.src
                    ))
                })?
            };
            mem[t.src].release("visiting kv");
            comm.send(t.src, t.dst, vec![k, v])?;
        }
        comm.deliver()?;
        for t in round {
            let msg = comm.recv(t.dst, t.src)?;
            let j = (t.dst + p - step - 1) % p;
            let mut parts = msg.parts;
            let (v, k) = (parts.pop(), parts.pop());
            match (k, v, parts.is_empty()) {
                (Some(k), Some(v), true) if k.len() + v.len() == sizes[j] => {
                    mem[t.dst].hold("visiting kv", sizes[j], es);
                    visiting[t.dst] = Some((k, v));
                }
                _ => {
                    return Err(Error::Runtime(format!(
                        "simulated ring: device {} received a malformed shard {j} from device {}",
                        t.dst, t.src
                    )))
                }
            }
        }
    }

    write_output(spec, &s, &layout, &acc, out);
    Ok(SimStats {
        collectives: comm.finish()?,
        memory: mem,
        work,
        ..SimStats::default()
    })
}

/// Positions of device i's query rows.
pub(crate) fn query_positions(spec: &Spec, s: &Shape, layout: &Layout, i: usize) -> Positions {
    if spec.decode {
        Positions {
            start: s.seq_kv as i64 - s.seq_q as i64,
            stride: 1,
        }
    } else {
        layout.positions(i)
    }
}

/// Every device's queries: decode broadcasts Q from the last device (which made the new
/// token) through the comm layer; prefill gives each device its own rows (computed there in
/// a real model, so no communication).
pub(super) fn distribute_queries(
    decode: bool,
    inputs: &Inputs,
    layout: &Layout,
    comm: &mut Comm,
    mem: &mut [DeviceMemory],
) -> Result<Vec<Tensor>> {
    let s = &inputs.shape;
    let (p, es, d) = (layout.p, inputs.dtype().size_bytes(), s.head_dim);
    let heads = s.batch * s.heads;
    if !decode {
        let mut q = Vec::with_capacity(p);
        for (i, m) in mem.iter_mut().enumerate() {
            let t = layout.len(i);
            q.push(gather(
                &inputs.q,
                heads,
                s.seq_q,
                d,
                layout.positions(i),
                t,
                "q shard",
            )?);
            m.hold("q", heads * t * d, es);
        }
        return Ok(q);
    }
    let root = p - 1;
    let mut held: Vec<Option<Tensor>> = (0..p).map(|_| None).collect();
    held[root] = Some(gather(
        &inputs.q,
        1,
        s.q_len() / d.max(1),
        d,
        Positions::CONTIGUOUS,
        s.q_len() / d.max(1),
        "q",
    )?);
    mem[root].hold("q", s.q_len(), es);
    let got = exec::broadcast(
        comm,
        BROADCAST_Q,
        &plan::broadcast(root, p, s.q_len()),
        &mut held,
    )?;
    for i in got {
        mem[i].hold("q", s.q_len(), es);
    }
    held.into_iter()
        .enumerate()
        .map(|(i, t)| {
            t.ok_or_else(|| {
                Error::Runtime(format!("simulated broadcast: device {i} never received q"))
            })
        })
        .collect()
}

/// Decode: every device holds the whole answer; the last device's is returned. Prefill:
/// each device's rows go back to their token positions.
pub(crate) fn write_output(
    spec: &Spec,
    s: &Shape,
    layout: &Layout,
    o: &[Vec<f32>],
    out: &mut [f32],
) {
    if spec.decode {
        if let Some(last) = o.last() {
            out.copy_from_slice(last);
        }
        return;
    }
    for (i, oi) in o.iter().enumerate() {
        write_rows(s, layout, i, oi, out);
    }
}

/// Prefill: device `i`'s output rows `o` (`[b·h, t, d]`) to their positions in `out`.
pub(crate) fn write_rows(s: &Shape, layout: &Layout, i: usize, o: &[f32], out: &mut [f32]) {
    let d = s.head_dim;
    let (t, pos) = (layout.len(i), layout.positions(i));
    for bh in 0..s.batch * s.heads {
        for a in 0..t {
            let src = (bh * t + a) * d;
            let dst = (bh * s.seq_q + pos.at(a) as usize) * d;
            out[dst..dst + d].copy_from_slice(&o[src..src + d]);
        }
    }
}
