//! End-to-end generation with Ring and Tree Attention (Shyam et al. Tables 1-2, Sec. 6.4
//! and App. C.3; docs/papers.md, Shyam et al.): the tiny GQA decoder of
//! `layer::decoder` (`Config::TINY`) prefills N prompt tokens with ring attention on p
//! simulated devices (`sim::ring`, causal, contiguous shards), then decodes `STEPS` tokens,
//! each step's attention over the sharded cache by ring decode or tree decode (`sim::ring`,
//! `sim::tree`), the new key and value appended to the last shard, K/V repeated to every
//! query head before they are communicated (the paper's `repeat_kv`). The rest of the
//! model runs on one device (the prefill's projections and MLP sequence-parallel).
//!
//! Time is simulated, not a cluster's wall time: each attention call's wall time on this
//! machine is spread over the devices in proportion to their counted query-key pairs, the
//! busiest device per step makes the critical path, and the messages of the schedules the
//! simulator ran are priced with the α–β link presets (`model::cost`); ring steps overlap
//! their transfer with their compute (as favourable to ring as it gets). Every generation is
//! compared with one device's (flash attention and flash-decoding on the unrepeated GQA
//! cache). Cost per point: two generations per repetition plus the reference, each
//! O(L·N²·n_h·d_h / p) for the prefill's busiest device (O(L·N²·n_h·d_h) simulated here).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::backend::cpu::decode::KV_BLOCK;
use crate::backend::cpu::flash::{DEFAULT_KV_CHUNK, DEFAULT_Q_CHUNK};
use crate::error::{Error, Result};
use crate::layer::decoder::{self, Attention, Config, Generated, LayerCaches, Weights};
use crate::model::cost::{plan_seconds, ring_steps};
use crate::model::topology::Topology;
use crate::problem::{DType, Inputs, Mode, Shape, Tensor, VariantId};
use crate::results::generate::GenerateRow;
use crate::run::output;
use crate::run::tree_vs_ring::{one_device_case, relative_difference};
use crate::sim::plan::{self, Allreduce};
use crate::sim::shard::Placement;
use crate::sim::stats::SimStats;
use crate::sim::{ring, tree};

/// Decode steps after the prefill (the paper's `generate(x, 10)`).
pub const STEPS: usize = 10;
/// Devices: Table 1's 8 H100s and 4 MI300x, Table 2's 2 RTX 4090s.
pub const DEVICES: [usize; 3] = [8, 4, 2];
/// Prompt lengths: Table 1's 32k..256k scaled down by 32 (`--quick`: the first two).
pub const TOKENS: [usize; 4] = [1024, 2048, 4096, 8192];
pub const QUICK_TOKENS: [usize; 2] = [1024, 2048];
/// Generations per method and point (the median is kept); one with `--quick`.
pub const REPS: usize = 3;
pub const SEED: u64 = 7;
/// The allreduce of tree decode: binomial, what NCCL picks for small messages in a node.
pub const ALLREDUCE: Allreduce = Allreduce::Tree;
/// f32 on the wire.
const WIRE_BYTES: usize = 4;

/// The attention of the decode steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Ring,
    Tree,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::Ring => "ring",
            Method::Tree => "tree",
        }
    }
}

/// The link preset of p devices: a PCIe pair for 2 (Table 2's RTX 4090s), one DGX H100
/// node (NVLink) for more (Table 1).
pub fn topology(p: usize) -> Topology {
    let name = if p <= 2 { "pcie-pair" } else { "dgx-h100" };
    Topology::preset(name).expect("a preset")
}

/// The prompt lengths of a run.
pub fn tokens(quick: bool) -> &'static [usize] {
    if quick {
        &QUICK_TOKENS
    } else {
        &TOKENS
    }
}

/// Seconds of one generation's attention (simulated, or a rank's wall clock on MPI
/// ranks) and its messages, and the bytes its devices sent.
#[derive(Clone, Copy, Debug, Default)]
pub struct Clock {
    pub(super) prefill_s: f64,
    pub(super) prefill_comm_s: f64,
    pub(super) decode_s: f64,
    pub(super) decode_comm_s: f64,
    pub(super) bytes: u64,
}

/// The attention of every layer on p simulated devices.
struct Sharded {
    method: Method,
    p: usize,
    cfg: Config,
    topo: Topology,
    prompt: usize,
    cache: LayerCaches,
    clock: Clock,
}

impl Sharded {
    fn new(method: Method, p: usize, cfg: Config, prompt: usize) -> Sharded {
        Sharded {
            method,
            p,
            cfg,
            topo: topology(p),
            prompt,
            cache: LayerCaches::new(&cfg),
            clock: Clock::default(),
        }
    }

    /// The layer's inputs with the cache's K and V repeated to every query head.
    fn inputs(&self, layer: usize, q: &[f32], seq_q: usize) -> Inputs {
        let c = &self.cfg;
        let group = c.heads / c.kv_heads;
        let shape = Shape {
            batch: 1,
            heads: c.heads,
            kv_heads: c.heads,
            seq_q,
            seq_kv: self.cache.k[layer].len(),
            head_dim: c.head_dim,
        };
        Inputs {
            shape,
            q: Tensor::F32(q.to_vec()),
            k: Tensor::F32(self.cache.k[layer].repeated(group)),
            v: Tensor::F32(self.cache.v[layer].repeated(group)),
            paged: Vec::new(),
            fp8: Vec::new(),
            mla: None,
        }
    }

    /// A ring call: its critical path (each step's busiest device, overlapped with the
    /// step's rotation round) plus, in decode, the q broadcast; and its messages alone.
    fn ring(&mut self, x: &Inputs, decode: bool, out: &mut [f32]) -> Result<(f64, f64)> {
        let spec = ring_spec(self.p, self.prompt, decode);
        let t0 = Instant::now();
        let stats = ring::run(&spec, x, out, None)?;
        let wall = t0.elapsed().as_secs_f64();
        let (bcast, rotation) = spec.schedules(&x.shape);
        let l = ring_steps(
            &step_seconds(&stats, wall),
            &rotation,
            &self.topo,
            WIRE_BYTES,
            true,
        );
        let b = if decode {
            plan_seconds(&bcast, &self.topo, WIRE_BYTES)
        } else {
            0.0
        };
        self.clock.bytes += stats.bytes();
        Ok((l.total + b, l.communication + b))
    }

    /// A tree call: the busiest device's local attention, then the q broadcast and the
    /// three allreduces priced.
    fn tree(&mut self, x: &Inputs, out: &mut [f32]) -> Result<(f64, f64)> {
        let spec = tree_spec(self.p, self.prompt);
        let t0 = Instant::now();
        let stats = tree::run(&spec, x, out, None)?;
        let wall = t0.elapsed().as_secs_f64();
        let (rows, num) = spec.plans(&x.shape)?;
        let p = self.p;
        let bcast = plan::broadcast(p - 1, p, x.shape.q_len());
        let comm = plan_seconds(&bcast, &self.topo, WIRE_BYTES)
            + 2.0 * plan_seconds(&rows, &self.topo, WIRE_BYTES)
            + plan_seconds(&num, &self.topo, WIRE_BYTES);
        self.clock.bytes += stats.bytes();
        let compute: f64 = step_seconds(&stats, wall).iter().sum();
        Ok((compute + comm, comm))
    }
}

/// The ring attention of the protocol on p devices after a `prompt`-token prefill: the
/// causal prefill over contiguous shards, or one decode step with the new tokens on the
/// last device; one thread.
pub(super) fn ring_spec(p: usize, prompt: usize, decode: bool) -> ring::Spec {
    ring::Spec {
        placement: if decode {
            Placement::Appended { prefill: prompt }
        } else {
            Placement::Contiguous
        },
        decode,
        causal: !decode,
        window: None,
        devices: p,
        bq: DEFAULT_Q_CHUNK,
        bk: if decode { KV_BLOCK } else { DEFAULT_KV_CHUNK },
        threads: 1,
    }
}

/// The tree decode of the protocol on p devices after a `prompt`-token prefill (`ALLREDUCE`).
pub(super) fn tree_spec(p: usize, prompt: usize) -> tree::Spec {
    tree::Spec {
        placement: Placement::Appended { prefill: prompt },
        causal: false,
        window: None,
        devices: p,
        allreduce: ALLREDUCE,
        bk: KV_BLOCK,
        threads: 1,
    }
}

/// Each step's seconds on its busiest device: the call's wall time here spread over the
/// steps and devices in proportion to the query-key pairs counted for each.
fn step_seconds(stats: &SimStats, wall: f64) -> Vec<f64> {
    let total = stats.pairs_total().max(1) as f64;
    stats
        .work
        .iter()
        .map(|s| wall * s.iter().copied().max().unwrap_or(0) as f64 / total)
        .collect()
}

impl Attention for Sharded {
    fn prefill(
        &mut self,
        layer: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Result<()> {
        self.cache.append(layer, k, v, n);
        // Both methods prefill with ring attention (the paper's protocol).
        let x = self.inputs(layer, q, n);
        let (t, c) = self.ring(&x, false, out)?;
        self.clock.prefill_s += t;
        self.clock.prefill_comm_s += c;
        Ok(())
    }

    fn decode(
        &mut self,
        layer: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        self.cache.append(layer, k, v, 1);
        let x = self.inputs(layer, q, 1);
        let (t, c) = match self.method {
            Method::Ring => self.ring(&x, true, out)?,
            Method::Tree => self.tree(&x, out)?,
        };
        self.clock.decode_s += t;
        self.clock.decode_comm_s += c;
        Ok(())
    }
}

/// One device: flash attention (causal) for the prefill and flash-decoding for each step,
/// on the GQA cache as it is (no repeat): the reference the sharded generations must equal.
struct OneDevice {
    cfg: Config,
    cache: LayerCaches,
}

impl OneDevice {
    fn new(cfg: Config) -> OneDevice {
        OneDevice {
            cfg,
            cache: LayerCaches::new(&cfg),
        }
    }

    fn attend(&self, layer: usize, q: &[f32], seq_q: usize, out: &mut [f32]) -> Result<()> {
        let c = &self.cfg;
        let shape = Shape {
            batch: 1,
            heads: c.heads,
            kv_heads: c.kv_heads,
            seq_q,
            seq_kv: self.cache.k[layer].len(),
            head_dim: c.head_dim,
        };
        let (v, mode, causal) = if seq_q > 1 {
            (VariantId::Flash, Mode::Fwd, true)
        } else {
            (VariantId::FlashDecoding, Mode::Decode, false)
        };
        let case = one_device_case(v, mode, shape, causal, DType::F32, 1);
        let x = Inputs {
            shape,
            q: Tensor::F32(q.to_vec()),
            k: Tensor::F32(self.cache.k[layer].repeated(1)),
            v: Tensor::F32(self.cache.v[layer].repeated(1)),
            paged: Vec::new(),
            fp8: Vec::new(),
            mla: None,
        };
        out.copy_from_slice(&output(&case, &x)?);
        Ok(())
    }
}

impl Attention for OneDevice {
    fn prefill(
        &mut self,
        layer: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Result<()> {
        self.cache.append(layer, k, v, n);
        self.attend(layer, q, n, out)
    }

    fn decode(
        &mut self,
        layer: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        self.cache.append(layer, k, v, 1);
        self.attend(layer, q, 1, out)
    }
}

/// One device's generation of `n` prompt tokens (the reference).
pub fn reference(w: &Weights, n: usize) -> Result<Generated> {
    let prompt = decoder::prompt(&w.cfg, n, SEED);
    decoder::generate(w, &prompt, STEPS, &mut OneDevice::new(w.cfg))
}

/// One sharded generation of `n` prompt tokens on `p` devices, and its simulated times.
pub fn sharded(w: &Weights, n: usize, p: usize, method: Method) -> Result<(Generated, Clock)> {
    let prompt = decoder::prompt(&w.cfg, n, SEED);
    let mut attn = Sharded::new(method, p, w.cfg, n);
    let g = decoder::generate(w, &prompt, STEPS, &mut attn)?;
    Ok((g, attn.clock))
}

/// The parts both methods run alike: the ring prefill (bit-identical caches) and the
/// decode steps' projections and MLP. Each method's own timings of them differ only by
/// this machine's noise, so both are charged the same figures, from both methods' runs
/// pooled: the run of median prefill (its parts) and the median decode rest.
#[derive(Clone, Copy, Debug, Default)]
struct Shared {
    prefill_attention_s: f64,
    prefill_comm_s: f64,
    prefill_other_s: f64,
    decode_other_s: f64,
}

impl Shared {
    /// From every run of both methods; the prefill's rest of the model (its projections
    /// and MLP, sequence-parallel) counted as its timed seconds over `parallel` (p when
    /// one process ran every device's tokens, 1 when each rank timed its own).
    fn of(runs: &[&(Generated, Clock)], parallel: usize) -> Shared {
        let mut pre: Vec<(f64, f64, f64)> = runs
            .iter()
            .map(|(g, c)| {
                (
                    c.prefill_s,
                    c.prefill_comm_s,
                    g.prefill_other_s / parallel as f64,
                )
            })
            .collect();
        pre.sort_by(|a, b| (a.0 + a.2).total_cmp(&(b.0 + b.2)));
        let mut rest: Vec<f64> = runs.iter().map(|(g, _)| g.decode_other_s).collect();
        rest.sort_by(f64::total_cmp);
        let (a, c, o) = pre.get(pre.len() / 2).copied().unwrap_or_default();
        Shared {
            prefill_attention_s: a,
            prefill_comm_s: c,
            prefill_other_s: o,
            decode_other_s: rest.get(rest.len() / 2).copied().unwrap_or_default(),
        }
    }
}

/// The row of one method's runs against the reference: the run of median decode
/// attention, with the shared parts; the worst error over every run.
fn row(
    method: Method,
    (p, links): (usize, String),
    n: usize,
    runs: &[(Generated, Clock)],
    shared: &Shared,
    reference: &Generated,
) -> GenerateRow {
    let mut decode: Vec<&Clock> = runs.iter().map(|(_, c)| c).collect();
    decode.sort_by(|a, b| a.decode_s.total_cmp(&b.decode_s));
    let clock = decode
        .get(decode.len() / 2)
        .copied()
        .copied()
        .unwrap_or_default();
    let prefill_s = shared.prefill_attention_s + shared.prefill_other_s;
    let decode_s = clock.decode_s + shared.decode_other_s;
    let max_rel_err = runs
        .iter()
        .flat_map(|(g, _)| g.logits.iter().zip(&reference.logits))
        .map(|(a, b)| relative_difference(a, b))
        .fold(0.0, f64::max);
    GenerateRow {
        method: method.name().into(),
        devices: p,
        tokens: n,
        steps: STEPS,
        topology: links,
        reps: runs.len(),
        total_s: prefill_s + decode_s,
        prefill_s,
        prefill_attention_s: shared.prefill_attention_s,
        prefill_comm_s: shared.prefill_comm_s,
        prefill_other_s: shared.prefill_other_s,
        decode_s,
        decode_attention_s: clock.decode_s,
        decode_comm_s: clock.decode_comm_s,
        decode_other_s: shared.decode_other_s,
        comm_bytes: clock.bytes,
        max_rel_err,
        tokens_match: runs.iter().all(|(g, _)| g.tokens == reference.tokens),
    }
}

/// Both methods' generations of one point, interleaved: one warm-up of each (none when
/// `quick`), then `REPS` each (one when `quick`), ring first on even repetitions and tree
/// first on odd, so both see the same machine speed.
pub(super) fn interleaved(
    quick: bool,
    mut generate: impl FnMut(Method) -> Result<(Generated, Clock)>,
) -> Result<[Vec<(Generated, Clock)>; 2]> {
    if !quick {
        for m in [Method::Ring, Method::Tree] {
            generate(m)?;
        }
    }
    let mut runs: [Vec<(Generated, Clock)>; 2] = [Vec::new(), Vec::new()];
    for rep in 0..if quick { 1 } else { REPS } {
        let order = if rep % 2 == 0 {
            [Method::Ring, Method::Tree]
        } else {
            [Method::Tree, Method::Ring]
        };
        for m in order {
            runs[m as usize].push(generate(m)?);
        }
    }
    Ok(runs)
}

/// The two rows of one point from its `interleaved` runs: both methods charged the shared
/// parts of every run pooled (the prefill's rest over `parallel`, as `Shared::of`), each
/// its own decode attention; each row's progress line on stderr after `label`.
pub(super) fn point_rows(
    runs: &[Vec<(Generated, Clock)>; 2],
    (p, links): (usize, String),
    n: usize,
    parallel: usize,
    reference: &Generated,
    label: &str,
) -> Vec<GenerateRow> {
    let pooled: Vec<&(Generated, Clock)> = runs.iter().flatten().collect();
    let shared = Shared::of(&pooled, parallel);
    [Method::Ring, Method::Tree]
        .into_iter()
        .zip(runs)
        .map(|(m, v)| {
            let r = row(m, (p, links.clone()), n, v, &shared, reference);
            eprintln!(
                "{label} N {n} {}: {:.3} s (prefill {:.3}, decode {:.4}), err {:.1e}",
                m.name(),
                r.total_s,
                r.prefill_s,
                r.decode_s,
                r.max_rel_err
            );
            r
        })
        .collect()
}

/// Every point: per prompt length the reference once, then per p the two methods'
/// generations `interleaved`. One thread (the devices share this machine's cores either
/// way).
pub fn measure(quick: bool, stop: &AtomicBool) -> Result<Vec<GenerateRow>> {
    let w = Weights::generate(Config::TINY, SEED);
    let pool = crate::measure::pool::pool(1)?;
    pool.install(|| {
        let mut rows = Vec::new();
        for &n in tokens(quick) {
            let reference = reference(&w, n)?;
            for &p in &DEVICES {
                if stop.load(Ordering::Relaxed) {
                    return Err(Error::Interrupted("generate: stopped by a signal".into()));
                }
                let runs = interleaved(quick, |m| sharded(&w, n, p, m))?;
                // One process timed every device's prefill tokens.
                rows.extend(point_rows(
                    &runs,
                    (p, topology(p).name),
                    n,
                    p,
                    &reference,
                    &format!("generate: p {p}"),
                ));
            }
        }
        Ok(rows)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ring and tree generation equal one device's: every token, and every step's logits
    /// within 1e-6 relative (Shyam et al.: outputs equal to vanilla, f32), on every p of
    /// the table and a p that does not divide N.
    #[test]
    fn ring_and_tree_generation_equal_one_device() {
        let w = Weights::generate(Config::TINY, SEED);
        let n = 301;
        let reference = reference(&w, n).unwrap();
        for p in [2, 3, 4, 8] {
            for m in [Method::Ring, Method::Tree] {
                let run = sharded(&w, n, p, m).unwrap();
                let shared = Shared::of(&[&run], p);
                let tokens = run.0.tokens.clone();
                let r = row(m, (p, topology(p).name), n, &[run], &shared, &reference);
                assert!(r.tokens_match, "{m:?} p {p}: {tokens:?}");
                assert!(r.max_rel_err <= 1e-6, "{m:?} p {p}: {}", r.max_rel_err);
                assert!(r.comm_bytes > 0 && r.total_s > 0.0, "{r:?}");
                assert!(r.prefill_comm_s > 0.0 && r.decode_comm_s > 0.0, "{r:?}");
            }
        }
    }

    /// The shared parts: the pooled run of median prefill (attention plus the rest over
    /// p), and the median decode rest.
    #[test]
    fn both_methods_are_charged_the_median_shared_parts() {
        let run = |pre_attn: f64, pre_other: f64, dec_other: f64| {
            let g = Generated {
                tokens: vec![],
                logits: vec![],
                prefill_other_s: pre_other,
                decode_other_s: dec_other,
            };
            let c = Clock {
                prefill_s: pre_attn,
                prefill_comm_s: pre_attn / 10.0,
                ..Clock::default()
            };
            (g, c)
        };
        // Prefill totals with p = 4: 1.0 + 0.5, 2.0 + 0.25, 0.5 + 0.25.
        let runs = [run(1.0, 2.0, 0.3), run(2.0, 1.0, 0.1), run(0.5, 1.0, 0.2)];
        let s = Shared::of(&runs.iter().collect::<Vec<_>>(), 4);
        assert_eq!(s.prefill_attention_s, 1.0);
        assert_eq!(s.prefill_comm_s, 0.1);
        assert_eq!(s.prefill_other_s, 0.5);
        assert_eq!(s.decode_other_s, 0.2);
    }

    /// Tree decode sends a fixed few rows per step; ring moves the cache: on the same
    /// prefill (the same ring traffic) ring's bytes exceed tree's by the decode rotations.
    #[test]
    fn ring_decode_moves_the_cache_and_tree_only_the_statistics() {
        let w = Weights::generate(Config::TINY, SEED);
        let (n, p) = (256, 4);
        let (_, ring) = sharded(&w, n, p, Method::Ring).unwrap();
        let (_, tree) = sharded(&w, n, p, Method::Tree).unwrap();
        let c = Config::TINY;
        // Per layer and step, each of ring's p - 1 rounds moves every shard: the whole
        // cache (at least the n prompt tokens), 2·n_h·d_h·4 bytes per token (K/V repeated).
        let per_token = (2 * c.heads * c.head_dim * WIRE_BYTES) as u64;
        let rotation_floor =
            (c.layers * STEPS) as u64 * (p as u64 - 1) * (n / p) as u64 * per_token;
        assert!(
            ring.bytes - tree.bytes >= rotation_floor,
            "{ring:?} {tree:?}"
        );
    }
}
