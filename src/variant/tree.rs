//! `tree-decode`: Tree Attention decoding over `devices` simulated devices (simulator:
//! `sim::tree`; Shyam et al. Algorithm 3, docs/papers.md, Shyam et al.): local flash attention per
//! shard, then Allreduce(max) of the logsumexps and Allreduce(sum) of numerator and
//! denominator, with the `allreduce` algorithm of the case. Host memory
//! `sim::tree::Spec::host_bytes`; per-device memory and communication counted by the
//! simulator.

use super::decode::kv_read_bytes;
use super::{Variant, VariantInfo};
use crate::backend::cpu::decode::KV_BLOCK;
use crate::backend::cpu::isa::Isa;
use crate::error::Result;
use crate::problem::{Case, Inputs, Mode};
use crate::sim::plan::Allreduce;
use crate::sim::shard::Placement;
use crate::sim::stats::SimStats;
use crate::sim::tree::{run, Spec};

/// When the case names none: the binary tree, which runs on any p (NCCL would choose).
pub const DEFAULT_ALLREDUCE: Allreduce = Allreduce::Tree;

pub struct Tree;

pub static TREE_DECODE: Tree = Tree;

static INFO: VariantInfo = VariantInfo {
    name: "tree-decode",
    description: "decode on p simulated devices: local flash attention per shard, then allreduce(max lse), allreduce(sum numerator), allreduce(sum denominator)",
    source: "Shyam et al. 2024 (Tree Attention), Algorithm 3",
    modes: &[Mode::Decode],
    default_q_chunk: None,
    default_kv_chunk: Some(KV_BLOCK),
    numerically_safe: true,
};

fn spec(case: &Case) -> Spec {
    Spec {
        placement: Placement::Contiguous,
        causal: case.causal,
        window: case.window,
        devices: case.devices,
        allreduce: case.allreduce.unwrap_or(DEFAULT_ALLREDUCE),
        bk: case.kv_chunk.unwrap_or(KV_BLOCK),
        threads: case.threads,
    }
}

impl Variant for Tree {
    fn multi_device(&self) -> bool {
        true
    }

    fn info(&self) -> &'static VariantInfo {
        &INFO
    }

    fn predict_workspace_bytes(&self, case: &Case, _isa: Isa) -> u64 {
        spec(case).host_bytes(&case.shape, case.dtype)
    }

    fn unsupported(&self, case: &Case) -> Option<String> {
        case.allreduce
            .unwrap_or(DEFAULT_ALLREDUCE)
            .unsupported(case.devices.max(1))
    }

    fn default_allreduce(&self) -> Option<Allreduce> {
        Some(DEFAULT_ALLREDUCE)
    }

    fn kv_read_bytes(&self, case: &Case) -> Option<u64> {
        Some(kv_read_bytes(case))
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
        run(&spec(case), inputs, out, None).map(Some)
    }
}
