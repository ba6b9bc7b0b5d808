//! `layer-vanilla`, `layer-memeff`, `layer-bpt`: the GPT block in BPT's three memory
//! designs (kernels: `crate::layer`; Liu & Abbeel Sec. 3, Algorithm 1). Activation memory per
//! layer: vanilla O(s^2 a + s h), memory-efficient O(s h) with a full-sequence FFN, BPT
//! O(s h) for K and V plus O(c h) per query block.

use super::Registry;
use super::{Variant, VariantInfo};
use crate::backend::cpu::isa::Isa;
use crate::error::{Error, Result};
use crate::layer::plan::{attention_of, Plan, DEFAULT_Q_BLOCK};
use crate::problem::Design;
use crate::problem::{Case, Inputs, Mode};

pub struct Layer {
    design: Design,
    info: &'static VariantInfo,
}

const MODES: &[Mode] = &[Mode::LayerFwd, Mode::LayerTrain];

pub static LAYER_VANILLA: Layer = Layer {
    design: Design::Vanilla,
    info: &VariantInfo {
        name: "layer-vanilla",
        description: "GPT block with materialized attention (naive kernel) and a full-sequence FFN",
        source: "Liu & Abbeel 2023 (Blockwise Parallel Transformer), Sec. 3.1: vanilla transformer",
        modes: MODES,
        default_q_chunk: None,
        default_kv_chunk: None,
        numerically_safe: true,
    },
};

pub static LAYER_MEMEFF: Layer = Layer {
    design: Design::MemEff,
    info: &VariantInfo {
        name: "layer-memeff",
        description: "GPT block with blockwise (flash) attention and a full-sequence FFN",
        source: "Liu & Abbeel 2023 (Blockwise Parallel Transformer), Sec. 3.1: memory-efficient attention",
        modes: MODES,
        default_q_chunk: None,
        default_kv_chunk: Some(crate::backend::cpu::flash::DEFAULT_KV_CHUNK),
        numerically_safe: true,
    },
};

pub static LAYER_BPT: Layer = Layer {
    design: Design::Bpt,
    info: &VariantInfo {
        name: "layer-bpt",
        description: "Blockwise Parallel Transformer: per query block, attention over all key blocks, then out-projection, FFN and residuals",
        source: "Liu & Abbeel 2023 (Blockwise Parallel Transformer), Algorithm 1",
        modes: MODES,
        default_q_chunk: Some(DEFAULT_Q_BLOCK),
        default_kv_chunk: Some(crate::backend::cpu::flash::DEFAULT_KV_CHUNK),
        numerically_safe: true,
    },
};

impl Variant for Layer {
    fn info(&self) -> &'static VariantInfo {
        self.info
    }

    fn layer_design(&self) -> Option<Design> {
        Some(self.design)
    }

    fn predict_workspace_bytes(&self, case: &Case, isa: Isa) -> u64 {
        Plan::new(self.design, case, attention_of(self.design).get()).predict_bytes(isa)
    }

    fn forward_cpu(&self, _: &Case, _: Isa, _: &Inputs, _: &mut [f32]) -> Result<()> {
        Err(Error::Runtime(format!(
            "{} runs in the layer modes (layer-fwd, layer-train), not on attention inputs",
            self.info.name
        )))
    }

    fn unsupported(&self, case: &Case) -> Option<String> {
        let s = &case.shape;
        let name = self.info.name;
        if s.seq_q != s.seq_kv || s.kv_heads != s.heads {
            return Some(format!(
                "variant {name} is self-attention with one key/value head per head (seq_q = seq_kv, kv_heads = heads)"
            ));
        }
        super::single_device_full_attention(self.info, case)
    }

    /// The layer's projections and FFN use the packing SGEMM.
    fn uses_packing_gemm(&self, _case: &Case) -> bool {
        true
    }
}
