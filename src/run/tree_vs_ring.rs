//! The Tree-vs-Ring measurements of a sweep with `[model]` (Shyam et al. Sec. 6;
//! docs/papers.md, Shyam et al.): ring and tree decode simulated on scaled-down shapes and
//! counted against eqs. (8)-(14), the causal work of striped vs ring prefill (Transformers
//! Inference Optimization Toolset, "Stripe Attention"), and this machine's decode compute
//! rate. The rows go to `results::tree_vs_ring`; the report renders them. Costs one
//! simulation per check shape, two per balance point, and a few decode passes.

use std::time::Instant;

use crate::backend::cpu::decode::KV_BLOCK;
use crate::error::{Error, Result};
use crate::model::formulas::{self, Dims};
use crate::problem::{
    Case, DType, Device, InputDist, Inputs, Mode, Precision, Shape, UpstreamGrad, VariantId,
};
use crate::results::tree_vs_ring::{BalanceRow, CountRow};
use crate::run::{forward, output};
use crate::sim::plan::Allreduce;
use crate::sim::shard::Placement;
use crate::sim::{ring, tree};
use crate::variant::Registry;

/// Simulates ring and tree decode of one new query over `shape.seq_kv` cached tokens
/// (b = `shape.batch`, n_h = `shape.heads` of d_h = `shape.head_dim`) on `devices`, and
/// compares the counters with the equations.
pub fn count_shape(
    shape: Shape,
    devices: usize,
    dtype: DType,
    alg: Allreduce,
    threads: usize,
) -> Result<CountRow> {
    let p = devices;
    let shape = Shape {
        kv_heads: shape.heads,
        seq_q: 1,
        ..shape
    };
    let (batch, heads, head_dim, tokens) = (shape.batch, shape.heads, shape.head_dim, shape.seq_kv);
    let alg = if alg.unsupported(p).is_some() {
        Allreduce::Tree
    } else {
        alg
    };
    let inputs = Inputs::generate(shape, dtype, InputDist::Normal, 1.0, 0);
    let (mut ring_out, mut tree_out) =
        (vec![0.0f32; shape.out_len()], vec![0.0f32; shape.out_len()]);
    let pool = crate::measure::pool::pool(threads)?;
    let ring_spec = ring::Spec {
        placement: Placement::Contiguous,
        decode: true,
        causal: false,
        window: None,
        devices: p,
        bq: 1,
        bk: KV_BLOCK,
        threads,
    };
    let r = pool.install(|| ring::run(&ring_spec, &inputs, &mut ring_out, None))?;
    let tree_spec = tree::Spec {
        placement: Placement::Contiguous,
        causal: false,
        window: None,
        devices: p,
        allreduce: alg,
        bk: KV_BLOCK,
        threads,
    };
    let t = pool.install(|| tree::run(&tree_spec, &inputs, &mut tree_out, None))?;
    let single = single_device(&inputs, threads)?;
    let dims = Dims {
        b: batch as u64,
        t: (tokens / p) as u64,
        n_h: heads as u64,
        d_h: head_dim as u64,
        p: p as u64,
    };
    let rot = r.collective(ring::ROTATION);
    let ring_rounds = rot.map_or(0, |c| c.steps);
    let ring_iter = match rot {
        Some(c) if c.steps > 0 => c.elements() / c.steps,
        _ => 0,
    };
    let tree_names = [
        tree::ALLREDUCE_MAX,
        tree::ALLREDUCE_NUM,
        tree::ALLREDUCE_DEN,
    ];
    let tree_total: u64 = tree_names
        .iter()
        .filter_map(|n| t.collective(n))
        .map(|c| c.elements())
        .sum();
    let tree_rounds = tree_names
        .iter()
        .filter_map(|n| t.collective(n))
        .map(|c| c.steps)
        .sum();
    // The ring also keeps the running max and sum of its online softmax, which eq. (8)
    // does not list: 2·b·n_h elements.
    let stats = 2 * dims.b * dims.n_h;
    let row = CountRow {
        batch,
        heads,
        head_dim,
        tokens,
        devices: p,
        t: tokens / p,
        allreduce: alg.to_string(),
        ring_volume_per_iteration: ring_iter,
        eq10: formulas::v_ring(&dims),
        ring_rounds,
        tree_volume_total: tree_total,
        tree_volume_per_device: tree_total as f64 / p as f64,
        eq14: formulas::v_tree(&dims),
        tree_rounds,
        q_broadcast: r.collective(ring::BROADCAST_Q).map_or(0, |c| c.elements()),
        ring_vs_single: relative_difference(&ring_out, &single),
        tree_vs_single: relative_difference(&tree_out, &single),
        ring_memory: r.peak_elements(),
        eq8: formulas::mem_ring(&dims),
        tree_memory: t.peak_elements(),
        eq9: formulas::mem_tree(&dims),
        matches: false,
    };
    let matches = (p == 1 || row.ring_volume_per_iteration == row.eq10)
        && row.ring_vs_single <= SAME_OUTPUT
        && row.tree_vs_single <= SAME_OUTPUT
        && row.tree_volume_total == formulas::v_tree_total(&dims)
        && row.ring_memory == row.eq8 + stats
        && row.tree_memory == row.eq9;
    Ok(CountRow { matches, ..row })
}

/// Ring and tree must reproduce the single-device output to this relative difference.
pub const SAME_OUTPUT: f64 = 1e-6;

/// One device's flash-decoding case of `shape` (the reference of the simulated devices,
/// and the decode the compute rate times).
fn flash_decoding_case(shape: Shape, dtype: DType, threads: usize) -> Case {
    one_device_case(
        VariantId::FlashDecoding,
        Mode::Decode,
        shape,
        false,
        dtype,
        threads,
    )
}

/// A one-device case of variant `v` in `mode` on `shape`, with the variant's default
/// chunks and splits (the references of the simulated devices), P kept in f32 as the
/// simulated devices keep it (`sim::local`), so that only their split and merge differ.
pub(crate) fn one_device_case(
    v: VariantId,
    mode: Mode,
    shape: Shape,
    causal: bool,
    dtype: DType,
    threads: usize,
) -> Case {
    Case {
        variant: v,
        mode,
        device: Device::Cpu,
        dtype,
        shape,
        q_chunk: v.info().default_q_chunk.map(|c| c.min(shape.seq_q)),
        kv_chunk: v.info().default_kv_chunk.map(|c| c.min(shape.seq_kv)),
        causal,
        window: None,
        devices: 1,
        splits: v.get().default_splits(&shape, threads),
        allreduce: None,
        threads,
        input_dist: InputDist::Normal,
        input_scale: 1.0,
        seed: 0,
        d_out: UpstreamGrad::Random,
        external: None,
        paging: None,
        prefill_chunk: None,
        batch_spec: None,
        kernel_path: None,
        prefix_len: None,
        kv_dtype: None,
        mla: None,
        sinks: None,
        precision: Some(Precision::Highest),
    }
}

/// The flash-decoding output of `inputs` on one device.
fn single_device(inputs: &Inputs, threads: usize) -> Result<Vec<f32>> {
    let case = flash_decoding_case(inputs.shape, inputs.dtype(), threads);
    output(&case, inputs)
}

/// max |a - b| / max |b|.
pub(crate) fn relative_difference(a: &[f32], b: &[f32]) -> f64 {
    let diff = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() as f64)
        .fold(0.0, f64::max);
    let norm = b.iter().map(|y| y.abs() as f64).fold(0.0, f64::max);
    if norm > 0.0 {
        diff / norm
    } else {
        diff
    }
}

/// Tokens of the balance check: small enough to simulate in a moment, long enough that
/// each device's shard spans many positions.
pub const BALANCE_TOKENS: usize = 1024;

/// Simulates causal ring and striped prefill (1 head, d = 16) on each of `devices`.
pub fn balance(devices: &[usize], threads: usize) -> Result<Vec<BalanceRow>> {
    let shape = Shape {
        batch: 1,
        heads: 1,
        kv_heads: 1,
        seq_q: BALANCE_TOKENS,
        seq_kv: BALANCE_TOKENS,
        head_dim: 16,
    };
    let inputs = Inputs::generate(shape, DType::F32, InputDist::Normal, 1.0, 0);
    let pool = crate::measure::pool::pool(threads)?;
    devices
        .iter()
        .map(|&p| {
            let run = |placement| {
                let mut out = vec![0.0f32; shape.out_len()];
                let spec = ring::Spec {
                    placement,
                    decode: false,
                    causal: true,
                    window: None,
                    devices: p,
                    bq: 64,
                    bk: 256,
                    threads,
                };
                pool.install(|| ring::run(&spec, &inputs, &mut out, None))
            };
            let (r, st) = (run(Placement::Contiguous)?, run(Placement::Striped)?);
            Ok(BalanceRow {
                devices: p,
                tokens: BALANCE_TOKENS,
                total_pairs: r.pairs_total(),
                ring_busiest: r.pairs_max(),
                stripe_busiest: st.pairs_max(),
                ring_critical: r.pairs_critical(),
                stripe_critical: st.pairs_critical(),
                gain: r.pairs_critical() as f64 / st.pairs_critical().max(1) as f64,
            })
        })
        .collect()
}

/// Timed passes after one warm-up; the median is kept.
const PASSES: usize = 5;

/// Seconds per cached token of one device's local decode: flash-decoding of one new query
/// over `shape.seq_kv` cached tokens of `shape.batch` sequences and `shape.heads` heads of
/// `shape.head_dim`, timed on this machine (the median of a few passes after a warm-up).
/// Decode streams the cache, so its time scales linearly in the tokens.
pub fn seconds_per_token(shape: Shape, dtype: DType, threads: usize) -> Result<f64> {
    let tokens = shape.seq_kv;
    let shape = Shape {
        kv_heads: shape.heads,
        seq_q: 1,
        ..shape
    };
    let case = flash_decoding_case(shape, dtype, threads);
    let inputs = Inputs::generate(shape, dtype, InputDist::Normal, 1.0, 0);
    let mut out =
        crate::backend::cpu::workspace::try_zeroed(shape.out_len(), "compute-rate output")?;
    forward(&case, &inputs, &mut out)?;
    let mut times = Vec::with_capacity(PASSES);
    for _ in 0..PASSES {
        let t0 = Instant::now();
        forward(&case, &inputs, &mut out)?;
        times.push(t0.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let median = times[PASSES / 2];
    if median.is_nan() || median <= 0.0 {
        return Err(Error::Runtime(
            "the compute-rate measurement took no measurable time".into(),
        ));
    }
    Ok(median / tokens as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counted_shapes_match_the_equations() {
        for (batch, heads, head_dim, tokens, devices) in
            [(2, 4, 32, 300, 3), (1, 16, 128, 1280, 128)]
        {
            let shape = Shape {
                batch,
                heads,
                kv_heads: heads,
                seq_q: 1,
                seq_kv: tokens,
                head_dim,
            };
            for alg in [Allreduce::Ring, Allreduce::TwoLevel { per_node: 8 }] {
                let row = count_shape(shape, devices, DType::Bf16, alg, 2).unwrap();
                assert!(row.matches, "{row:?}");
            }
        }
    }

    #[test]
    fn the_measured_rate_gives_a_positive_time_per_token() {
        let shape = Shape {
            batch: 1,
            heads: 2,
            kv_heads: 2,
            seq_q: 1,
            seq_kv: 512,
            head_dim: 16,
        };
        let s = seconds_per_token(shape, DType::Bf16, 1).unwrap();
        assert!(s > 0.0 && s < 1e-3, "{s}");
    }
}
