//! Predicted decode latency of Ring and Tree Attention (docs/papers.md, Shyam et al.): the
//! communication of each algorithm is its own schedule (`sim::plan`, the one the simulator
//! runs), priced round by round with the α–β links of a two-level topology (a round lasts as
//! long as its slowest message); the compute term T_comp(t) of one device's shard is a
//! roofline of a named GPU, max(4·b·n_h·t·d_h/F, 2·b·t·d·B/BW), or a per-token time measured
//! on this machine. Ring: q broadcast, then p - 1 steps of max(T_comp, rotation round)
//! (overlapped) or T_comp + round (not), then the last T_comp. Tree: q broadcast, T_comp,
//! Allreduce(max) over b·n_h, Allreduce(sum) over b·d and over b·n_h. Time
//! O(rounds * p) per prediction.

use serde::Serialize;

use super::topology::{Gpu, Topology};
use crate::sim::plan::{self, Allreduce, Plan};

/// The decode problem of a prediction: b sequences, one new query, n_h heads of d_h,
/// `tokens` cached, on `p` devices; elements of `bytes` bytes on the wire and in HBM.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Problem {
    pub batch: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub tokens: usize,
    pub devices: usize,
    pub bytes: usize,
}

impl Problem {
    fn d(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Keys per device (the first N mod p devices hold one more).
    pub fn t(&self) -> usize {
        self.tokens.div_ceil(self.devices.max(1))
    }
}

/// Where the compute term comes from.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum Compute {
    Roofline(Gpu),
    /// Seconds per cached token of one device's local decode, measured on this machine.
    Measured {
        seconds_per_token: f64,
    },
}

impl Compute {
    /// T_comp(t): one device's local attention over t keys.
    pub fn seconds(&self, x: &Problem, t: usize) -> f64 {
        match self {
            Compute::Roofline(g) => {
                let flops = 4.0 * (x.batch * x.heads * t * x.head_dim) as f64;
                let bytes = 2.0 * (x.batch * t * x.d() * x.bytes) as f64;
                (flops / g.flops).max(bytes / g.hbm_bytes_per_s)
            }
            Compute::Measured { seconds_per_token } => seconds_per_token * t as f64,
        }
    }
}

/// Seconds of one round: its slowest message.
pub fn round_seconds(round: &[plan::Transfer], topo: &Topology, bytes: usize) -> f64 {
    round
        .iter()
        .map(|t| {
            topo.link(t.src, t.dst)
                .seconds((t.range.len() * bytes) as f64)
        })
        .fold(0.0, f64::max)
}

/// Seconds of a whole plan, rounds one after the other.
pub fn plan_seconds(plan: &Plan, topo: &Topology, bytes: usize) -> f64 {
    plan.rounds
        .iter()
        .map(|r| round_seconds(r, topo, bytes))
        .sum()
}

/// A ring pass whose step s computes for `compute[s]` seconds (its busiest device), then
/// sends round s of `rotation` (the last step sends none): with `overlap` a step lasts the
/// longer of its compute and its round, else their sum. `compute` and `communication` are
/// the sums of each part alone.
pub fn ring_steps(
    compute: &[f64],
    rotation: &Plan,
    topo: &Topology,
    bytes: usize,
    overlap: bool,
) -> Latency {
    let mut l = Latency::default();
    for (s, &c) in compute.iter().enumerate() {
        let r = rotation
            .rounds
            .get(s)
            .map_or(0.0, |round| round_seconds(round, topo, bytes));
        l.compute += c;
        l.communication += r;
        l.total += if overlap { c.max(r) } else { c + r };
    }
    l
}

/// A predicted latency and its parts, seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Latency {
    pub compute: f64,
    pub communication: f64,
    pub total: f64,
}

fn broadcast_q(x: &Problem, topo: &Topology) -> f64 {
    let p = x.devices.max(1);
    plan_seconds(&plan::broadcast(p - 1, p, x.batch * x.d()), topo, x.bytes)
}

/// Ring decode: p - 1 rotation rounds of 2·b·t·d elements per device.
pub fn ring_decode(x: &Problem, topo: &Topology, compute: &Compute, overlap: bool) -> Latency {
    let p = x.devices.max(1);
    let shards: Vec<usize> = plan::even_chunks(0..x.tokens, p)
        .iter()
        .map(|c| 2 * x.batch * c.len() * x.d())
        .collect();
    let rotation = plan::rotation(&shards);
    let comp = compute.seconds(x, x.t());
    let bcast = broadcast_q(x, topo);
    let mut total = bcast;
    let mut comm = bcast;
    for round in &rotation.rounds {
        let c = round_seconds(round, topo, x.bytes);
        comm += c;
        total += if overlap { comp.max(c) } else { comp + c };
    }
    total += comp;
    Latency {
        compute: comp * p as f64,
        communication: comm,
        total,
    }
}

/// Tree decode (Algorithm 3) with the allreduce `alg`; Err if `alg` cannot run on p.
pub fn tree_decode(
    x: &Problem,
    topo: &Topology,
    compute: &Compute,
    alg: Allreduce,
) -> Result<Latency, String> {
    let p = x.devices.max(1);
    let rows = x.batch * x.heads;
    let ar_rows = plan_seconds(&plan::allreduce(alg, p, rows)?, topo, x.bytes);
    let ar_num = plan_seconds(&plan::allreduce(alg, p, x.batch * x.d())?, topo, x.bytes);
    let comm = broadcast_q(x, topo) + 2.0 * ar_rows + ar_num;
    let comp = compute.seconds(x, x.t());
    Ok(Latency {
        compute: comp,
        communication: comm,
        total: comp + comm,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(tokens: usize, devices: usize) -> Problem {
        Problem {
            batch: 1,
            heads: 16,
            head_dim: 128,
            tokens,
            devices,
            bytes: 2,
        }
    }

    fn h100() -> Compute {
        Compute::Roofline(Gpu::named("h100").unwrap())
    }

    /// Pricing the schedules reproduces docs/papers.md, Shyam et al.'s closed forms.
    #[test]
    fn priced_plans_equal_the_closed_forms() {
        let topo = Topology::preset("dgx-h100").unwrap();
        let (a, b) = (topo.inter.alpha_s, topo.inter.beta_bytes_per_s);
        for p in [16usize, 64, 128] {
            let m = 2048 * p; // divisible: every ring chunk is m/p
            let ring = plan_seconds(&plan::allreduce(Allreduce::Ring, p, m).unwrap(), &topo, 2);
            let want = 2.0 * (p - 1) as f64 * (a + (2 * m / p) as f64 / b);
            assert!((ring - want).abs() < 1e-12 * want.max(1.0), "ring p {p}");
            // Binomial tree: the first log2(8) levels stay inside a node.
            let tree = plan_seconds(&plan::allreduce(Allreduce::Tree, p, m).unwrap(), &topo, 2);
            let levels = p.trailing_zeros() as f64;
            let want = 2.0
                * (3.0 * topo.intra.seconds((2 * m) as f64)
                    + (levels - 3.0) * topo.inter.seconds((2 * m) as f64));
            assert!((tree - want).abs() < 1e-12, "tree p {p}");
            // Two-level: intra ring reduce-scatter and all-gather, inter tree on m/8.
            let two = plan_seconds(
                &plan::allreduce(Allreduce::TwoLevel { per_node: 8 }, p, m).unwrap(),
                &topo,
                2,
            );
            let nodes = (p / 8).trailing_zeros() as f64;
            let want = 2.0 * 7.0 * topo.intra.seconds((2 * m / 8) as f64)
                + 2.0 * nodes * topo.inter.seconds((2 * m / 8) as f64);
            assert!((two - want).abs() < 1e-12, "two-level p {p}");
        }
    }

    #[test]
    fn ring_step_is_the_kv_shard_over_the_slowest_link() {
        let topo = Topology::preset("dgx-h100").unwrap();
        // 640k tokens on 8 GPUs in one node: 655 MB per step over NVLink, 7 steps.
        let x = problem(640_000, 8);
        let r = ring_decode(&x, &topo, &h100(), true);
        let step = topo.intra.seconds(655_360_000.0);
        assert!(r.total > 7.0 * step && r.total < 7.0 * step + 1e-3, "{r:?}");
        // The roofline compute of one shard: 655 MB read at 3.35 TB/s, about 2e-4 s.
        assert!((h100().seconds(&x, 80_000) - 655.36e6 / 3.35e12).abs() < 1e-12);
    }

    #[test]
    fn ring_steps_overlap_each_round_with_its_step() {
        // Two 1000-byte shards on a PCIe pair: one round of 10 µs + 1000 B / 32 GB/s.
        let topo = Topology::preset("pcie-pair").unwrap();
        let rot = plan::rotation(&[250, 250]);
        let round = 10e-6 + 1000.0 / 32e9;
        let l = ring_steps(&[1e-3, 2e-3], &rot, &topo, 4, true);
        assert!((l.communication - round).abs() < 1e-15, "{l:?}");
        assert!((l.compute - 3e-3).abs() < 1e-15);
        assert!(
            (l.total - 3e-3).abs() < 1e-15,
            "compute hides the round: {l:?}"
        );
        let l = ring_steps(&[1e-6, 2e-3], &rot, &topo, 4, true);
        assert!(
            (l.total - (round + 2e-3)).abs() < 1e-15,
            "the round outlasts step 0"
        );
        let l = ring_steps(&[1e-3, 2e-3], &rot, &topo, 4, false);
        assert!((l.total - (3e-3 + round)).abs() < 1e-15);
    }

    /// The paper's direction: tree flattens with more devices, ring grows; tree wins big
    /// at 128 devices and 5.12M tokens.
    #[test]
    fn tree_flattens_while_ring_grows() {
        let topo = Topology::preset("dgx-h100").unwrap();
        let alg = Allreduce::TwoLevel { per_node: 8 };
        let ring = |n, p| ring_decode(&problem(n, p), &topo, &h100(), true).total;
        let tree = |n, p| {
            tree_decode(&problem(n, p), &topo, &h100(), alg)
                .unwrap()
                .total
        };
        for p in [8, 64, 128] {
            assert!(ring(5_120_000, p) > 10.0 * ring(80_000, p));
        }
        for p in [64, 128] {
            assert!(tree(5_120_000, p) < 2.0 * tree(80_000, p));
            assert!(tree(5_120_000, p) < ring(80_000, p));
        }
        assert!(ring(5_120_000, 128) / tree(5_120_000, 128) > 8.0);
    }
}
