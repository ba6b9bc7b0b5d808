//! Tree Attention decoding with one MPI rank per device (Shyam et al. Algorithm 3;
//! docs/papers.md, Shyam et al.): q from the last rank to all; local flash attention over the rank's
//! own shard gives (o, lse) (the simulation's kernels, `sim::local`); then m =
//! Allreduce(max, lse), n = o e^(lse - m), d = e^(lse - m), Allreduce(sum) of n and of d,
//! z = n / d. `library` runs MPI_Ibcast and MPI_Iallreduce (the library chooses the
//! algorithm; not counted); otherwise the simulation's schedules run over point-to-point
//! messages (ring, binary tree or two-level allreduce, binomial broadcast), counted exactly
//! as there. Per rank: kv shard + q + n + d + m = eq. (9); communication 2(p-1)/p (b·d +
//! 2·b·n_h) per rank on average (eq. (14)). Time O(t * d) per row plus the allreduces.

use super::link::Link;
use super::ring::broadcast_q;
use crate::backend::cpu::decode::Positions;
use crate::backend::cpu::workspace::{try_zeroed, Workspace};
use crate::error::Result;
use crate::problem::Inputs;
use crate::sim::device::DeviceMemory;
use crate::sim::exec::Reduce;
use crate::sim::local::{self, Carry, KvRef, Work};
use crate::sim::plan::Plan;
use crate::sim::stats::SimStats;
use crate::sim::tree::{Spec, ALLREDUCE_DEN, ALLREDUCE_MAX, ALLREDUCE_NUM};

/// The allreduce of one buffer: the library's, or the schedule's over point-to-point.
fn allreduce(
    link: &mut Link,
    plan: Option<&Plan>,
    name: &str,
    buf: &mut [f32],
    op: Reduce,
) -> Result<()> {
    match plan {
        Some(plan) => link.allreduce_plan(name, plan, buf, op),
        None => {
            link.library_allreduce(name, buf, op);
            Ok(())
        }
    }
}

/// Tree decoding of `inputs` on this rank into `out` (every rank ends with the whole
/// output). Returns the gathered counters when `counted` (the checked call).
pub fn run(
    spec: &Spec,
    library: bool,
    inputs: &Inputs,
    out: &mut [f32],
    counted: bool,
) -> Result<Option<SimStats>> {
    let s = inputs.shape;
    let mut link = Link::new();
    let (me, p) = (link.rank, link.p);
    if spec.p() != p {
        return Err(super::not_here(spec.p()));
    }
    let (d, dtype) = (s.head_dim, inputs.dtype());
    let layout = spec.layout(&s);
    let geo = spec.geometry(&s);
    let plans = if library { None } else { Some(spec.plans(&s)?) };
    let (plan_rows, plan_num) = match &plans {
        Some((r, n)) => (Some(r), Some(n)),
        None => (None, None),
    };
    let mut mem = DeviceMemory::default();
    mem.hold(
        "kv shard",
        2 * s.batch * s.kv_heads * layout.len(me) * d,
        dtype.size_bytes(),
    );
    // 1. q from the rank that made the new token.
    let q = broadcast_q(&mut link, inputs, library);
    mem.hold("q", s.q_len(), dtype.size_bytes());

    // 2. Local flash attention on the own shard: (o, lse).
    let rows = s.batch * s.heads * s.seq_q;
    let mut o = try_zeroed(rows * d, "tree local output o")?;
    let mut lse = try_zeroed(rows, "tree local logsumexp")?;
    lse.fill(f32::NEG_INFINITY);
    mem.hold("o", rows * d, 4);
    mem.hold("lse", rows, 4);
    let (workers, floats) = spec.workspace(&s, dtype);
    let ws = Workspace::new(workers, floats, "tree attention tiles")?;
    let pos = layout.positions(me);
    let w = Work {
        device: me,
        q: &q,
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
            len: layout.len(me),
            pos,
        },
        carry: Carry::Once {
            o: &mut o,
            lse: &mut lse,
        },
    };
    let work = [local::step(vec![w], &geo, &ws, p)[me]];

    // The allreduces start together, so that their clock measures them and not the wait
    // for the slowest rank's local attention (which stays in the step time either way).
    link.sync("waiting for every rank's local attention");

    // 3. m = Allreduce(max, lse).
    let mut m = lse.clone();
    mem.hold("m", rows, 4);
    allreduce(&mut link, plan_rows, ALLREDUCE_MAX, &mut m, Reduce::Max)?;

    // 4. n = o e^(lse - m), d = e^(lse - m), in place.
    for r in 0..rows {
        let f = if m[r] == f32::NEG_INFINITY {
            0.0
        } else {
            (lse[r] - m[r]).exp()
        };
        lse[r] = f;
        for x in &mut o[r * d..(r + 1) * d] {
            *x *= f;
        }
    }
    mem.rename("o", "n");
    mem.rename("lse", "d");

    // 5. Allreduce(sum) of the numerator and the denominator.
    allreduce(&mut link, plan_num, ALLREDUCE_NUM, &mut o, Reduce::Sum)?;
    allreduce(&mut link, plan_rows, ALLREDUCE_DEN, &mut lse, Reduce::Sum)?;

    // 6. z = n / d.
    for (r, &dg) in lse.iter().enumerate() {
        let inv = if dg > 0.0 { 1.0 / dg } else { 0.0 };
        for x in &mut o[r * d..(r + 1) * d] {
            *x *= inv;
        }
    }
    out.copy_from_slice(&o);
    if !counted {
        link.close();
        return Ok(None);
    }
    let mut stats = link.finish(&mem, &work, !library)?;
    if !library {
        let planned = spec.planned(&s, dtype)?;
        stats.sim_bytes = Some(planned.bytes);
        stats.sim_max_device_bytes = Some(planned.max_device_bytes);
    }
    Ok(Some(stats))
}
