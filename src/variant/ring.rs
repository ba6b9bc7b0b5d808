//! `ring-decode`, `ring-prefill`, `stripe-prefill`: Ring Attention over `devices`
//! simulated devices (simulator: `sim::ring`; docs/papers.md, Other sources (Ring Attention), Transformers Inference Optimization Toolset). The key/value
//! shards rotate around the ring in p steps, each device folding the visiting shard into
//! its running online-softmax state; striped placement puts token k on device k mod p. Host memory:
//! the devices' copies (`sim::ring::Spec::host_bytes`); per-device memory and
//! communication are counted by the simulator and land in the record.

use super::decode::kv_read_bytes;
use super::{Variant, VariantInfo};
use crate::backend::cpu::decode::KV_BLOCK;
use crate::backend::cpu::isa::Isa;
use crate::error::Result;
use crate::problem::{Case, Inputs, Mode};
use crate::sim::ring::{run, Spec};
use crate::sim::shard::Placement;
use crate::sim::stats::SimStats;

/// Query rows per work item of a prefill step (B_r): as `flash`'s.
pub const PREFILL_Q_CHUNK: usize = crate::backend::cpu::flash::DEFAULT_Q_CHUNK;
/// Keys per block of a prefill step (B_c): as `flash`'s (the scores tile is B_r x B_c).
pub const PREFILL_KV_CHUNK: usize = crate::backend::cpu::flash::DEFAULT_KV_CHUNK;

pub struct Ring {
    placement: Placement,
    decode: bool,
    info: &'static VariantInfo,
}

pub static RING_DECODE: Ring = Ring {
    placement: Placement::Contiguous,
    decode: true,
    info: &VariantInfo {
        name: "ring-decode",
        description: "decode on p simulated devices: q broadcast, KV shards rotate around the ring in p steps, running (o, max, sum) per device",
        source: "Shyam et al. 2024 (Tree Attention), Sec. 6: its Ring Attention decode baseline",
        modes: &[Mode::Decode],
        default_q_chunk: None,
        default_kv_chunk: Some(KV_BLOCK),
        numerically_safe: true,
    },
};

pub static RING_PREFILL: Ring = Ring {
    placement: Placement::Contiguous,
    decode: false,
    info: &VariantInfo {
        name: "ring-prefill",
        description: "self-attention on p simulated devices, queries and KV sharded contiguously; KV rotates, causal blocks above the diagonal skipped",
        source: "Ring Attention (Liu et al. 2023), as in the Transformers Inference Optimization Toolset (2024)",
        modes: &[Mode::Fwd],
        default_q_chunk: Some(PREFILL_Q_CHUNK),
        default_kv_chunk: Some(PREFILL_KV_CHUNK),
        numerically_safe: true,
    },
};

pub static STRIPE_PREFILL: Ring = Ring {
    placement: Placement::Striped,
    decode: false,
    info: &VariantInfo {
        name: "stripe-prefill",
        description: "ring-prefill with Striped Attention's placement (token k on device k mod p): causal work balanced over devices",
        source: "Striped Attention (Brandon et al. 2023), as in the Transformers Inference Optimization Toolset (2024)",
        modes: &[Mode::Fwd],
        default_q_chunk: Some(PREFILL_Q_CHUNK),
        default_kv_chunk: Some(PREFILL_KV_CHUNK),
        numerically_safe: true,
    },
};

impl Ring {
    fn spec(&self, case: &Case) -> Spec {
        Spec {
            placement: self.placement,
            decode: self.decode,
            causal: case.causal,
            window: case.window,
            devices: case.devices,
            bq: case.q_chunk.unwrap_or(PREFILL_Q_CHUNK),
            bk: case.kv_chunk.unwrap_or(if self.decode {
                KV_BLOCK
            } else {
                PREFILL_KV_CHUNK
            }),
            threads: case.threads,
        }
    }
}

impl Variant for Ring {
    fn multi_device(&self) -> bool {
        true
    }

    fn info(&self) -> &'static VariantInfo {
        self.info
    }

    fn predict_workspace_bytes(&self, case: &Case, _isa: Isa) -> u64 {
        self.spec(case).host_bytes(&case.shape, case.dtype)
    }

    fn unsupported(&self, case: &Case) -> Option<String> {
        let s = &case.shape;
        (!self.decode && s.seq_q != s.seq_kv).then(|| {
            format!(
                "{} shards queries and keys alike: seq_q ({}) must equal seq_kv ({})",
                self.info.name, s.seq_q, s.seq_kv
            )
        })
    }

    fn kv_read_bytes(&self, case: &Case) -> Option<u64> {
        self.decode.then(|| kv_read_bytes(case))
    }

    fn forward_cpu(&self, case: &Case, isa: Isa, inputs: &Inputs, out: &mut [f32]) -> Result<()> {
        self.forward_counted(case, isa, inputs, out).map(|_| ())
    }

    fn forward_counted(
        &self,
        case: &Case,
        _isa: Isa,
        inputs: &Inputs,
        out: &mut [f32],
    ) -> Result<Option<SimStats>> {
        run(&self.spec(case), inputs, out, None).map(Some)
    }
}
