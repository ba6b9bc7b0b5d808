//! Collective schedules as data: which device sends which element range to which device in
//! each synchronous round. One schedule drives the simulated devices (`exec`), the α–β
//! cost model (`model::cost`) and the host-memory predictions, so the three cannot drift.
//! - ring allreduce: reduce-scatter then all-gather around the ring, 2(p-1) rounds of m/p
//!   elements (Patarasuk & Yuan; docs/papers.md, Shyam et al.);
//! - binary-tree allreduce: binomial-tree reduce to device 0 then broadcast, 2⌈log₂p⌉
//!   rounds of m elements;
//! - two-level: ring reduce-scatter inside each node, a binomial-tree allreduce of each
//!   chunk across nodes, ring all-gather inside each node (the topology-aware pattern of
//!   Shyam et al. Sec. 5.3);
//! - binomial broadcast from any root, and the ring rotation of Ring Attention.
//!
//! Every allreduce sends 2(p-1)m elements in all, i.e. eq. (12)'s 2(p-1)/p·m per device on
//! average. Building a plan is O(rounds * p); no data is touched here.

use std::ops::Range;

pub use crate::problem::{Allreduce, DEFAULT_PER_NODE};

/// One message: `range` of the sender's buffer goes to `dst`, which adds it elementwise
/// (`reduce`) or stores it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transfer {
    pub src: usize,
    pub dst: usize,
    pub range: Range<usize>,
    pub reduce: bool,
}

/// Rounds of transfers; all transfers of a round travel at once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub rounds: Vec<Vec<Transfer>>,
}

impl Plan {
    pub fn steps(&self) -> usize {
        self.rounds.len()
    }

    /// Elements sent by all devices together.
    pub fn elements(&self) -> u64 {
        self.rounds
            .iter()
            .flatten()
            .map(|t| t.range.len() as u64)
            .sum()
    }

    pub fn messages(&self) -> usize {
        self.rounds.iter().map(Vec::len).sum()
    }

    /// The largest number of elements in flight in one round (host memory of the
    /// simulation's message buffers).
    pub fn max_round_elements(&self) -> u64 {
        self.rounds
            .iter()
            .map(|r| r.iter().map(|t| t.range.len() as u64).sum())
            .max()
            .unwrap_or(0)
    }

    /// Elements sent by each of `p` devices.
    pub fn sent_per_device(&self, p: usize) -> Vec<u64> {
        let mut v = vec![0u64; p];
        for t in self.rounds.iter().flatten() {
            v[t.src] += t.range.len() as u64;
        }
        v
    }

    /// This plan, then `next`.
    fn then(mut self, next: Plan) -> Plan {
        self.rounds.extend(next.rounds);
        self
    }

    /// Plans over disjoint devices running side by side: round k is every plan's round k.
    fn side_by_side(plans: Vec<Plan>) -> Plan {
        let n = plans.iter().map(Plan::steps).max().unwrap_or(0);
        let mut rounds: Vec<Vec<Transfer>> = vec![Vec::new(); n];
        for plan in plans {
            for (k, r) in plan.rounds.into_iter().enumerate() {
                rounds[k].extend(r);
            }
        }
        Plan { rounds }
    }

    /// Drops empty transfers (nothing to send) and then empty rounds.
    fn pruned(mut self) -> Plan {
        for r in &mut self.rounds {
            r.retain(|t| !t.range.is_empty());
        }
        self.rounds.retain(|r| !r.is_empty());
        self
    }
}

/// `range` cut into `parts` contiguous pieces whose lengths differ by at most one (the
/// first `len % parts` are one longer).
pub fn even_chunks(range: Range<usize>, parts: usize) -> Vec<Range<usize>> {
    let (len, parts) = (range.len(), parts.max(1));
    let (base, extra) = (len / parts, len % parts);
    let mut start = range.start;
    (0..parts)
        .map(|i| {
            let n = base + usize::from(i < extra);
            let r = start..start + n;
            start += n;
            r
        })
        .collect()
}

/// The allreduce of an `m`-element buffer held by each of `p` devices.
pub fn allreduce(alg: Allreduce, p: usize, m: usize) -> Result<Plan, String> {
    if let Some(reason) = alg.unsupported(p) {
        return Err(reason);
    }
    let all: Vec<usize> = (0..p).collect();
    let plan = match alg {
        Allreduce::Ring => {
            let chunks = even_chunks(0..m, p);
            ring_reduce_scatter(&all, &chunks).then(ring_allgather(&all, &chunks))
        }
        Allreduce::Tree => binomial_allreduce(&all, 0..m),
        Allreduce::TwoLevel { per_node } => two_level(p, per_node.min(p.max(1)), m),
    };
    Ok(plan.pruned())
}

/// Ring reduce-scatter over `ranks` with one chunk per rank: in round s, rank index i
/// sends chunk (i - s) mod n to index i + 1, which adds it. After n - 1 rounds index i
/// holds the full sum of chunk (i + 1) mod n.
fn ring_reduce_scatter(ranks: &[usize], chunks: &[Range<usize>]) -> Plan {
    let n = ranks.len();
    let rounds = (0..n.saturating_sub(1))
        .map(|s| {
            (0..n)
                .map(|i| Transfer {
                    src: ranks[i],
                    dst: ranks[(i + 1) % n],
                    range: chunks[(i + n - s) % n].clone(),
                    reduce: true,
                })
                .collect()
        })
        .collect();
    Plan { rounds }
}

/// Ring all-gather after `ring_reduce_scatter`: in round s, index i forwards chunk
/// (i + 1 - s) mod n to index i + 1, which stores it.
fn ring_allgather(ranks: &[usize], chunks: &[Range<usize>]) -> Plan {
    let n = ranks.len();
    let rounds = (0..n.saturating_sub(1))
        .map(|s| {
            (0..n)
                .map(|i| Transfer {
                    src: ranks[i],
                    dst: ranks[(i + 1) % n],
                    range: chunks[(i + 1 + n - s) % n].clone(),
                    reduce: false,
                })
                .collect()
        })
        .collect();
    Plan { rounds }
}

/// Binomial tree over `ranks`: reduce to index 0 (in round k, index x with x mod 2^(k+1)
/// = 2^k sends to x - 2^k), then broadcast back down the same tree.
fn binomial_allreduce(ranks: &[usize], range: Range<usize>) -> Plan {
    let n = ranks.len();
    let mut levels = Vec::new();
    let mut step = 1;
    while step < n {
        levels.push(step);
        step *= 2;
    }
    let reduce = levels.iter().map(|&h| {
        (0..n)
            .filter(|x| x % (2 * h) == h)
            .map(|x| Transfer {
                src: ranks[x],
                dst: ranks[x - h],
                range: range.clone(),
                reduce: true,
            })
            .collect()
    });
    let bcast = levels.iter().rev().map(|&h| {
        (0..n)
            .filter(|x| x % (2 * h) == 0 && x + h < n)
            .map(|x| Transfer {
                src: ranks[x],
                dst: ranks[x + h],
                range: range.clone(),
                reduce: false,
            })
            .collect()
    });
    Plan {
        rounds: reduce.chain(bcast).collect(),
    }
}

/// Nodes of `g` consecutive devices: ring reduce-scatter in every node, a binomial-tree
/// allreduce of chunk c across the nodes (among the devices that hold it), ring
/// all-gather in every node. Sends 2(g-1)m per node plus 2(nodes-1)m: 2(p-1)m in all.
fn two_level(p: usize, g: usize, m: usize) -> Plan {
    let nodes = p / g;
    let chunks = even_chunks(0..m, g);
    let node_ranks: Vec<Vec<usize>> = (0..nodes).map(|n| (n * g..(n + 1) * g).collect()).collect();
    let intra_rs = Plan::side_by_side(
        node_ranks
            .iter()
            .map(|r| ring_reduce_scatter(r, &chunks))
            .collect(),
    );
    // After the reduce-scatter, local index (c + g - 1) mod g holds chunk c.
    let inter = Plan::side_by_side(
        (0..g)
            .map(|c| {
                let holders: Vec<usize> = (0..nodes).map(|n| n * g + (c + g - 1) % g).collect();
                binomial_allreduce(&holders, chunks[c].clone())
            })
            .collect(),
    );
    let intra_ag = Plan::side_by_side(
        node_ranks
            .iter()
            .map(|r| ring_allgather(r, &chunks))
            .collect(),
    );
    intra_rs.then(inter).then(intra_ag)
}

/// Binomial broadcast of `m` elements from `root`: in round k every device that has the
/// data (relative index x < 2^k) sends to x + 2^k. ⌈log₂p⌉ rounds, p - 1 messages.
pub fn broadcast(root: usize, p: usize, m: usize) -> Plan {
    let mut rounds = Vec::new();
    let mut h = 1;
    while h < p {
        rounds.push(
            (0..h)
                .filter(|x| x + h < p)
                .map(|x| Transfer {
                    src: (root + x) % p,
                    dst: (root + x + h) % p,
                    range: 0..m,
                    reduce: false,
                })
                .collect(),
        );
        h *= 2;
    }
    Plan { rounds }.pruned()
}

/// Ring Attention's rotation (docs/papers.md, Other sources (Ring Attention)): in round s device i sends the shard it
/// holds, shard (i - s) mod p of `shard_elems[j]` elements, to device i + 1. p - 1 rounds
/// (a forward pass needs no rotation back home).
pub fn rotation(shard_elems: &[usize]) -> Plan {
    let p = shard_elems.len();
    let rounds = (0..p.saturating_sub(1))
        .map(|s| {
            (0..p)
                .map(|i| Transfer {
                    src: i,
                    dst: (i + 1) % p,
                    range: 0..shard_elems[(i + p - s) % p],
                    reduce: false,
                })
                .collect()
        })
        .collect();
    Plan { rounds }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Applies a plan to per-device vectors (sum), as the simulator does, without counters.
    fn apply(plan: &Plan, data: &mut [Vec<f64>]) {
        for round in &plan.rounds {
            let msgs: Vec<(usize, Range<usize>, bool, Vec<f64>)> = round
                .iter()
                .map(|t| {
                    (
                        t.dst,
                        t.range.clone(),
                        t.reduce,
                        data[t.src][t.range.clone()].to_vec(),
                    )
                })
                .collect();
            for (dst, range, reduce, payload) in msgs {
                for (x, y) in data[dst][range].iter_mut().zip(payload) {
                    *x = if reduce { *x + y } else { y };
                }
            }
        }
    }

    #[test]
    fn every_allreduce_sums_exactly_and_sends_2_p_minus_1_m() {
        for alg in [
            Allreduce::Ring,
            Allreduce::Tree,
            Allreduce::TwoLevel { per_node: 2 },
            Allreduce::TwoLevel { per_node: 4 },
            Allreduce::TwoLevel { per_node: 8 },
        ] {
            for p in [1, 2, 3, 4, 5, 8, 12, 16] {
                if alg.unsupported(p).is_some() {
                    continue;
                }
                for m in [1, 3, 7, 16, 33] {
                    let plan = allreduce(alg, p, m).unwrap();
                    let mut data: Vec<Vec<f64>> = (0..p)
                        .map(|i| (0..m).map(|j| (i * 100 + j) as f64).collect())
                        .collect();
                    let want: Vec<f64> = (0..m)
                        .map(|j| (0..p).map(|i| (i * 100 + j) as f64).sum())
                        .collect();
                    apply(&plan, &mut data);
                    for (i, d) in data.iter().enumerate() {
                        assert_eq!(d, &want, "{alg} p {p} m {m} device {i}");
                    }
                    assert_eq!(
                        plan.elements(),
                        2 * (p as u64 - 1) * m as u64,
                        "{alg} p {p} m {m}"
                    );
                }
            }
        }
    }

    #[test]
    fn step_counts_follow_the_algorithms() {
        let m = 1024;
        for p in [2usize, 4, 8, 16, 64] {
            let log = p.next_power_of_two().trailing_zeros() as usize;
            assert_eq!(
                allreduce(Allreduce::Ring, p, m).unwrap().steps(),
                2 * (p - 1)
            );
            assert_eq!(allreduce(Allreduce::Tree, p, m).unwrap().steps(), 2 * log);
            assert_eq!(broadcast(p - 1, p, m).steps(), log);
            assert_eq!(broadcast(p - 1, p, m).messages(), p - 1);
        }
        // 16 devices in 2 nodes of 8: 7 + 2 * 1 + 7 rounds.
        let two = allreduce(Allreduce::TwoLevel { per_node: 8 }, 16, m).unwrap();
        assert_eq!(two.steps(), 7 + 2 + 7);
        // Within one node it is the plain ring.
        assert_eq!(
            allreduce(Allreduce::TwoLevel { per_node: 8 }, 8, m).unwrap(),
            allreduce(Allreduce::Ring, 8, m).unwrap()
        );
        assert!(allreduce(Allreduce::TwoLevel { per_node: 8 }, 12, m).is_err());
    }

    #[test]
    fn broadcast_reaches_every_device_once() {
        for p in 1..10 {
            for root in 0..p {
                let plan = broadcast(root, p, 5);
                let mut has = vec![false; p];
                has[root] = true;
                for round in &plan.rounds {
                    for t in round {
                        assert!(has[t.src] && !has[t.dst], "p {p} root {root}");
                    }
                    for t in round {
                        has[t.dst] = true;
                    }
                }
                assert!(has.iter().all(|&h| h), "p {p} root {root}");
            }
        }
    }

    #[test]
    fn rotation_brings_every_shard_past_every_device() {
        let sizes = [3usize, 2, 2, 1];
        let plan = rotation(&sizes);
        assert_eq!(plan.steps(), 3);
        // Per round, every shard moves once: 2 b t d * p in eq. (10)'s units.
        for r in &plan.rounds {
            assert_eq!(r.iter().map(|t| t.range.len()).sum::<usize>(), 8);
        }
    }

    #[test]
    fn allreduce_names_round_trip() {
        for s in ["ring", "tree", "two-level:4"] {
            assert_eq!(s.parse::<Allreduce>().unwrap().to_string(), s);
        }
        assert_eq!(
            "two-level".parse::<Allreduce>().unwrap(),
            Allreduce::TwoLevel { per_node: 8 }
        );
        assert!("two-level:0".parse::<Allreduce>().is_err());
        assert!("star".parse::<Allreduce>().unwrap_err().contains("ring"));
    }
}
