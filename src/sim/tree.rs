//! Tree Attention decoding on simulated devices: Shyam et al. Algorithm 3 (docs/papers.md
//! 2.7). The query is broadcast from the last device; each device's local flash attention
//! over its own contiguous shard gives (o, lse); then m = Allreduce(max, lse),
//! n = o e^(lse - m), d = e^(lse - m), n_g = Allreduce(sum, n), d_g = Allreduce(sum, d),
//! z = n_g / d_g, all in place (no output tensor is allocated, as the paper says). The
//! allreduce algorithm is selectable (ring, binary tree, two-level). Per device: kv shard +
//! q + n + d + m = eq. (9) exactly; communication 2(p-1)/p (b·d + 2·b·n_h) per device
//! (eq. (14)). Time O(t * d) per row and device plus the three allreduces.

use super::comm::{Comm, Fault};
use super::device::DeviceMemory;
use super::exec::{self, Reduce};
use super::local::{self, Carry, Geometry, KvRef, Work};
use super::plan::{self, Allreduce, Plan};
use super::ring::distribute_queries;
use super::shard::{Layout, Placement};
use super::stats::{Planned, SimStats};
use crate::backend::cpu::decode::{Mask, Positions};
use crate::backend::cpu::workspace::{try_zeroed, Workspace};
use crate::error::{Error, Result};
use crate::problem::{DType, Inputs, Shape};

pub const ALLREDUCE_MAX: &str = "allreduce max(lse)";
pub const ALLREDUCE_NUM: &str = "allreduce sum(numerator)";
pub const ALLREDUCE_DEN: &str = "allreduce sum(denominator)";

#[derive(Clone, Copy, Debug)]
pub struct Spec {
    /// Contiguous shards (`Contiguous`, or `Appended` after a prefill); not `Striped`.
    pub placement: Placement,
    pub causal: bool,
    pub window: Option<usize>,
    pub devices: usize,
    pub allreduce: Allreduce,
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
            bq: (s.group() * s.seq_q).max(1),
            // A device's run is its shard: a longer key block would only size scratch
            // (scores, K^T) that no block fills.
            bk: self
                .bk
                .min(self.layout(s).lens().into_iter().max().unwrap_or(1))
                .max(1),
        }
    }

    pub(crate) fn workspace(&self, s: &Shape, dtype: DType) -> (usize, usize) {
        let geo = self.geometry(s);
        let tq = vec![s.seq_q; self.p()];
        let workers = self.threads.min(local::items(&geo, &tq)).max(1);
        (workers, local::worker_floats(&geo, geo.bq, dtype, true))
    }

    /// The three allreduce plans: over the row statistics (b·h·seq_q) and over the
    /// numerator (b·h·seq_q·d).
    pub fn plans(&self, s: &Shape) -> Result<(Plan, Plan)> {
        let rows = s.batch * s.heads * s.seq_q;
        let p = self.p();
        let ar = |m| plan::allreduce(self.allreduce, p, m).map_err(Error::Runtime);
        Ok((ar(rows)?, ar(rows * s.head_dim)?))
    }

    /// What the simulation sends for this case, from its schedules alone: the q broadcast,
    /// then the allreduces of the max, the numerator and the denominator (f32).
    pub fn planned(&self, s: &Shape, dtype: DType) -> Result<Planned> {
        let p = self.p();
        let (rows, num) = self.plans(s)?;
        let bcast = plan::broadcast(p - 1, p, s.q_len());
        Ok(Planned::of(
            p,
            &[
                (&bcast, dtype.size_bytes()),
                (&rows, 4),
                (&num, 4),
                (&rows, 4),
            ],
        ))
    }

    /// Host bytes one call allocates besides inputs and output: each device's q, o (then n),
    /// lse (then d) and m, one round of allreduce messages in flight, kernel scratch.
    pub fn host_bytes(&self, s: &Shape, dtype: DType) -> u64 {
        let (p, es) = (self.p() as u64, dtype.size_bytes() as u64);
        let rows = (s.batch * s.heads * s.seq_q) as u64;
        let per_device = s.q_len() as u64 * es + (s.out_len() as u64 + 2 * rows) * 4;
        let in_flight = self
            .plans(s)
            .map(|(a, b)| a.max_round_elements().max(b.max_round_elements()) * 4)
            .unwrap_or(0);
        let (workers, floats) = self.workspace(s, dtype);
        p * per_device + in_flight + Workspace::bytes(workers, floats)
    }
}

/// Tree decoding of `inputs` into `out`; `fault` injects a link bug (tests).
pub fn run(
    spec: &Spec,
    inputs: &Inputs,
    out: &mut [f32],
    fault: Option<Fault>,
) -> Result<SimStats> {
    let s = inputs.shape;
    let (p, d) = (spec.p(), s.head_dim);
    let dtype = inputs.dtype();
    let layout = spec.layout(&s);
    let geo = spec.geometry(&s);
    let (plan_rows, plan_num) = spec.plans(&s)?;
    let mut comm = Comm::new(p, fault);
    let mut mem = vec![DeviceMemory::default(); p];
    for (i, m) in mem.iter_mut().enumerate() {
        m.hold(
            "kv shard",
            2 * s.batch * s.kv_heads * layout.len(i) * d,
            dtype.size_bytes(),
        );
    }
    // 1. Scatter q (a broadcast from the device that made the new token).
    let q = distribute_queries(true, inputs, &layout, &mut comm, &mut mem)?;

    // 2. Local flash attention on each shard: (o, lse).
    let rows = s.batch * s.heads * s.seq_q;
    let mut o = Vec::with_capacity(p);
    let mut lse = Vec::with_capacity(p);
    for m in mem.iter_mut() {
        o.push(try_zeroed(rows * d, "tree local output o")?);
        let mut l = try_zeroed(rows, "tree local logsumexp")?;
        l.fill(f32::NEG_INFINITY);
        lse.push(l);
        m.hold("o", rows * d, 4);
        m.hold("lse", rows, 4);
    }
    let (workers, floats) = spec.workspace(&s, dtype);
    let ws = Workspace::new(workers, floats, "tree attention tiles")?;
    let works: Vec<Work> = o
        .iter_mut()
        .zip(lse.iter_mut())
        .enumerate()
        .map(|(i, (o, lse))| {
            let pos = layout.positions(i);
            Work {
                device: i,
                q: &q[i],
                tq: s.seq_q,
                qpos: Positions {
                    start: s.seq_kv as i64 - s.seq_q as i64,
                    stride: 1,
                },
                kv: KvRef {
                    k: &inputs.k,
                    v: &inputs.v,
                    base0: pos.start as usize * d,
                    head_stride: s.seq_kv * d,
                    len: layout.len(i),
                    pos,
                },
                carry: Carry::Once { o, lse },
            }
        })
        .collect();
    let work = vec![local::step(works, &geo, &ws, p)];

    // 3. m = Allreduce(max, lse).
    let mut m = Vec::with_capacity(p);
    for (l, mm) in lse.iter().zip(mem.iter_mut()) {
        let mut x = try_zeroed(rows, "tree global max m")?;
        x.copy_from_slice(l);
        m.push(x);
        mm.hold("m", rows, 4);
    }
    exec::allreduce(&mut comm, ALLREDUCE_MAX, &plan_rows, &mut m, Reduce::Max)?;

    // 4. n = o e^(lse - m), d = e^(lse - m), in place (o becomes n, lse becomes d).
    for i in 0..p {
        for r in 0..rows {
            let f = if m[i][r] == f32::NEG_INFINITY {
                0.0
            } else {
                (lse[i][r] - m[i][r]).exp()
            };
            lse[i][r] = f;
            for x in &mut o[i][r * d..(r + 1) * d] {
                *x *= f;
            }
        }
        mem[i].rename("o", "n");
        mem[i].rename("lse", "d");
    }

    // 5. n_g = Allreduce(sum, n), d_g = Allreduce(sum, d).
    exec::allreduce(&mut comm, ALLREDUCE_NUM, &plan_num, &mut o, Reduce::Sum)?;
    exec::allreduce(&mut comm, ALLREDUCE_DEN, &plan_rows, &mut lse, Reduce::Sum)?;

    // 6. z = n_g / d_g on every device (in n's buffer); any device's is the answer.
    for (n, den) in o.iter_mut().zip(&lse) {
        for (r, &dg) in den.iter().enumerate() {
            let inv = if dg > 0.0 { 1.0 / dg } else { 0.0 };
            for x in &mut n[r * d..(r + 1) * d] {
                *x *= inv;
            }
        }
    }
    if let Some(last) = o.last() {
        out.copy_from_slice(last);
    }
    Ok(SimStats {
        collectives: comm.finish()?,
        memory: mem,
        work,
        ..SimStats::default()
    })
}
