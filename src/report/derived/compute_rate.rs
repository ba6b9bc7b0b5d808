//! The measured compute term of the model: one device's local decode (flash-decoding over
//! t cached tokens of the model's shape) timed on this machine at one cache length, as
//! seconds per cached token; decode streams the cache, so time scales linearly in t.
//! Costs a few passes over a cache of 2·b·t·d elements.

use crate::variant::Registry;
use std::time::Instant;

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::problem::VariantId;
use crate::problem::{Case, Device, InputDist, Inputs, Mode, Shape, UpstreamGrad};
use crate::run::forward;

/// Timed passes after one warm-up; the median is kept.
const PASSES: usize = 5;

pub fn seconds_per_token(cfg: &ModelConfig, tokens: usize, threads: usize) -> Result<f64> {
    let shape = Shape {
        batch: cfg.batch,
        heads: cfg.heads,
        kv_heads: cfg.heads,
        seq_q: 1,
        seq_kv: tokens,
        head_dim: cfg.head_dim,
    };
    let v = VariantId::FlashDecoding;
    let case = Case {
        variant: v,
        mode: Mode::Decode,
        device: Device::Cpu,
        dtype: cfg.dtype,
        shape,
        q_chunk: None,
        kv_chunk: v.info().default_kv_chunk.map(|c| c.min(tokens)),
        causal: false,
        window: None,
        devices: 1,
        splits: v.get().default_splits(&shape, threads),
        allreduce: None,
        threads,
        input_dist: InputDist::Normal,
        input_scale: 1.0,
        seed: 0,
        d_out: UpstreamGrad::Random,
    };
    let inputs = Inputs::generate(shape, cfg.dtype, InputDist::Normal, 1.0, 0);
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
    use crate::config::{ComputeSpec, ModelConfig};
    use crate::model::topology::Topology;
    use crate::sim::plan::Allreduce;

    #[test]
    fn the_measured_rate_gives_a_positive_time_per_token() {
        let cfg = ModelConfig {
            topology: Topology::preset("pcie-pair").unwrap(),
            compute: ComputeSpec::Measured { probe_tokens: 512 },
            devices: vec![2],
            tokens: vec![1024],
            batch: 1,
            heads: 2,
            head_dim: 16,
            dtype: crate::problem::DType::Bf16,
            allreduce: Allreduce::Ring,
            overlap: true,
            check: Vec::new(),
        };
        let s = seconds_per_token(&cfg, 512, 1).unwrap();
        assert!(s > 0.0 && s < 1e-3, "{s}");
    }
}
