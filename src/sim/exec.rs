//! Runs a collective `Plan` over per-device buffers through the communication layer: each
//! round, every sender posts a copy of its range, the round is delivered, and every
//! receiver adds (sum or max) or stores what arrived. The payload sizes are checked against
//! the plan, so a mixed-up message is an error, not a silent wrong sum. Time O(elements of
//! the plan); in flight at once, one round's messages (`Plan::max_round_elements`).

use super::comm::Comm;
use super::plan::Plan;
use crate::error::{Error, Result};
use crate::problem::Tensor;

/// The reduction of an allreduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    Sum,
    Max,
}

/// The allreduce of `plan` over `bufs` (one per device, equal lengths), as collective `name`.
pub fn allreduce(
    comm: &mut Comm,
    name: &str,
    plan: &Plan,
    bufs: &mut [Vec<f32>],
    op: Reduce,
) -> Result<()> {
    comm.begin(name)?;
    for round in &plan.rounds {
        for t in round {
            let payload = bufs[t.src][t.range.clone()].to_vec();
            comm.send(t.src, t.dst, vec![Tensor::F32(payload)])?;
        }
        comm.deliver()?;
        for t in round {
            let msg = comm.recv(t.dst, t.src)?;
            let payload = match msg.parts.as_slice() {
                [Tensor::F32(v)] if v.len() == t.range.len() => v,
                _ => {
                    return Err(Error::Runtime(format!(
                        "simulated communication: {name}: device {} got a message of {} elements from device {}, expected {}",
                        t.dst,
                        msg.elements(),
                        t.src,
                        t.range.len()
                    )))
                }
            };
            let dst = &mut bufs[t.dst][t.range.clone()];
            match (t.reduce, op) {
                (false, _) => dst.copy_from_slice(payload),
                (true, Reduce::Sum) => dst.iter_mut().zip(payload).for_each(|(a, b)| *a += b),
                (true, Reduce::Max) => dst
                    .iter_mut()
                    .zip(payload)
                    .for_each(|(a, b)| *a = a.max(*b)),
            }
        }
    }
    Ok(())
}

/// The broadcast of `plan` (every transfer carries the whole tensor): each receiver gets its
/// own copy in `held`. Returns the devices that received one, in order.
pub fn broadcast(
    comm: &mut Comm,
    name: &str,
    plan: &Plan,
    held: &mut [Option<Tensor>],
) -> Result<Vec<usize>> {
    comm.begin(name)?;
    let mut got = Vec::new();
    for round in &plan.rounds {
        for t in round {
            let copy = held[t.src].clone().ok_or_else(|| {
                Error::Runtime(format!(
                    "simulated communication: {name}: device {} forwards data it does not have",
                    t.src
                ))
            })?;
            comm.send(t.src, t.dst, vec![copy])?;
        }
        comm.deliver()?;
        for t in round {
            let mut msg = comm.recv(t.dst, t.src)?;
            held[t.dst] = msg.parts.pop();
            got.push(t.dst);
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::comm::Fault;
    use crate::sim::plan::{allreduce as plan_allreduce, broadcast as plan_broadcast, Allreduce};

    #[test]
    fn allreduce_through_the_comm_layer_counts_exactly() {
        for alg in [
            Allreduce::Ring,
            Allreduce::Tree,
            Allreduce::TwoLevel { per_node: 2 },
        ] {
            let (p, m) = (6, 11);
            let plan = plan_allreduce(alg, p, m).unwrap();
            let mut bufs: Vec<Vec<f32>> = (0..p)
                .map(|i| (0..m).map(|j| (i * j) as f32).collect())
                .collect();
            let mut comm = Comm::new(p, None);
            allreduce(&mut comm, "sum", &plan, &mut bufs, Reduce::Sum).unwrap();
            let log = comm.finish().unwrap();
            assert_eq!(log[0].elements(), 2 * (p as u64 - 1) * m as u64, "{alg}");
            assert_eq!(log[0].steps, plan.steps() as u64);
            for b in &bufs {
                for (j, x) in b.iter().enumerate() {
                    assert_eq!(*x, (0..p).map(|i| (i * j) as f32).sum::<f32>());
                }
            }
        }
    }

    #[test]
    fn max_allreduce_and_broadcast() {
        let plan = plan_allreduce(Allreduce::Tree, 5, 3).unwrap();
        let mut bufs: Vec<Vec<f32>> = (0..5).map(|i| vec![i as f32, -(i as f32), 0.5]).collect();
        let mut comm = Comm::new(5, None);
        allreduce(&mut comm, "max", &plan, &mut bufs, Reduce::Max).unwrap();
        assert!(bufs.iter().all(|b| b == &vec![4.0, 0.0, 0.5]));
        let mut held: Vec<Option<Tensor>> = vec![None; 5];
        held[4] = Some(Tensor::F32(vec![7.0]));
        let got = broadcast(&mut comm, "bcast", &plan_broadcast(4, 5, 1), &mut held).unwrap();
        assert_eq!(got.len(), 4);
        assert!(held.iter().all(|h| h == &Some(Tensor::F32(vec![7.0]))));
        comm.finish().unwrap();
    }

    #[test]
    fn every_dropped_or_duplicated_message_of_every_allreduce_is_caught() {
        for alg in [
            Allreduce::Ring,
            Allreduce::Tree,
            Allreduce::TwoLevel { per_node: 2 },
        ] {
            let (p, m) = (4, 5);
            let plan = plan_allreduce(alg, p, m).unwrap();
            for nth in 0..plan.messages() as u64 {
                for fault in [Fault::Drop { nth }, Fault::Duplicate { nth }] {
                    let mut bufs = vec![vec![1.0f32; m]; p];
                    let mut comm = Comm::new(p, Some(fault));
                    let r = allreduce(&mut comm, "sum", &plan, &mut bufs, Reduce::Sum)
                        .and_then(|()| comm.finish().map(|_| ()));
                    assert!(r.is_err(), "{alg}: {fault:?} went unnoticed");
                }
            }
        }
    }
}
