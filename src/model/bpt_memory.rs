//! The Blockwise Parallel Transformer's activation-memory analysis (Liu & Abbeel Sec. 3.1;
//! docs/papers.md, Liu & Abbeel) and a whole-model memory estimate for the largest trainable context
//! (Table 2's question). Per layer, in bytes with the paper's 2-byte activations:
//! vanilla attention 11bsh + 5bs^2a, vanilla FFN 19bsh (8bsh checkpointed), memory-efficient
//! 2bsh + 8bsh, BPT 2bsh. O(1) arithmetic.

use serde::Serialize;

pub use crate::problem::Design;

/// GPT shapes of BPT's Table 1 (Liu & Abbeel).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct GptShape {
    pub name: &'static str,
    /// The paper's parameter count label.
    pub params_label: f64,
    pub layers: usize,
    pub d_model: usize,
    pub heads: usize,
    pub d_head: usize,
}

/// Vocabulary of the paper's code (`model.py`).
pub const VOCAB: usize = 50432;

/// Table 1 as printed. The 13B row says d_model 5140 (the code uses 5120; 40 x 128 = 5120).
pub const TABLE1: [GptShape; 6] = [
    GptShape {
        name: "gpt-1b",
        params_label: 1.3e9,
        layers: 24,
        d_model: 2048,
        heads: 16,
        d_head: 128,
    },
    GptShape {
        name: "gpt-3b",
        params_label: 2.7e9,
        layers: 32,
        d_model: 2560,
        heads: 32,
        d_head: 80,
    },
    GptShape {
        name: "gpt-7b",
        params_label: 6.7e9,
        layers: 32,
        d_model: 4096,
        heads: 32,
        d_head: 128,
    },
    GptShape {
        name: "gpt-13b",
        params_label: 13.0e9,
        layers: 40,
        d_model: 5140,
        heads: 40,
        d_head: 128,
    },
    GptShape {
        name: "gpt-30b",
        params_label: 30.0e9,
        layers: 48,
        d_model: 7168,
        heads: 56,
        d_head: 128,
    },
    GptShape {
        name: "gpt-70b",
        params_label: 70.0e9,
        layers: 80,
        d_model: 8192,
        heads: 64,
        d_head: 128,
    },
];

impl GptShape {
    pub fn by_name(name: &str) -> Option<GptShape> {
        TABLE1.iter().copied().find(|m| m.name == name)
    }

    /// Parameters of a GPT with 4h FFN: 12 L h^2 (QKV, output, two FFN matrices) plus the
    /// token embedding V h (tied head); biases and norms are below 0.1% and left out.
    pub fn params(&self) -> f64 {
        let (l, h) = (self.layers as f64, self.d_model as f64);
        12.0 * l * h * h + VOCAB as f64 * h
    }
}

/// One layer's activation memory, bytes, as Sec. 3.1 itemizes it (2-byte activations;
/// `scale` multiplies every term, e.g. 2 for the paper's fp32 GPU runs).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LayerActivation {
    /// Largest attention activation with checkpointing.
    pub attention: f64,
    /// Largest FFN activation with checkpointing.
    pub ffn: f64,
}

impl LayerActivation {
    /// The layer's activation memory: attention and FFN run one after the other.
    pub fn per_layer(&self) -> f64 {
        self.attention.max(self.ffn)
    }
}

/// Sec. 3.1 for batch `b`, sequence `s`, hidden `h`, heads `a`, block `c`.
pub fn layer_activation(
    design: Design,
    b: f64,
    s: f64,
    h: f64,
    a: f64,
    c: f64,
    scale: f64,
) -> LayerActivation {
    // A block is at most the whole sequence (`min(chunk, n)`).
    let c = c.min(s);
    let (attention, ffn) = match design {
        // x 2bsh, Q and K 4bsh, QK^T 2bs^2a, mask bs^2a, scores 2bs^2a, V 2bsh,
        // out-projection input 2bsh, dropout mask bsh.
        Design::Vanilla => (11.0 * b * s * h + 5.0 * b * s * s * a, 8.0 * b * s * h),
        Design::MemEff => (2.0 * b * s * h, 8.0 * b * s * h),
        // KV loop 4bch vs the query loop's 2bsh outputs; FFN block 19bch vs the 2bsh output.
        Design::Bpt => (
            (4.0 * b * c * h).max(2.0 * b * s * h),
            (19.0 * b * c * h).max(2.0 * b * s * h),
        ),
    };
    LayerActivation {
        attention: attention * scale,
        ffn: ffn * scale,
    }
}

/// The FFN's un-checkpointed total, 2 + 8 + 8 + 1 = 19bsh (vanilla and memory-efficient).
pub fn vanilla_ffn_total(b: f64, s: f64, h: f64) -> f64 {
    19.0 * b * s * h
}

/// A whole training step's memory, bytes, for one device holding the whole model.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ModelMemory {
    /// Weights, gradients and two Adam moments: 16 bytes per parameter (f32).
    pub static_bytes: f64,
    /// Each layer's saved input (checkpointing): L b s h activations.
    pub checkpoints: f64,
    /// The largest layer's working set during its recompute (Sec. 3.1).
    pub layer_peak: f64,
    /// Logits for the loss: b s V f32 in full, or b c V for BPT's blockwise head and loss.
    pub head: f64,
}

impl ModelMemory {
    pub fn total(&self) -> f64 {
        self.static_bytes + self.checkpoints + self.layer_peak + self.head
    }
}

/// Memory of training `model` at sequence length `s` with activations of `act_bytes` bytes
/// (2 as in Sec. 3.1, 4 for fp32), batch `b` and block size `c`.
pub fn model_memory(
    model: &GptShape,
    design: Design,
    b: f64,
    s: f64,
    c: f64,
    act_bytes: f64,
) -> ModelMemory {
    let h = model.d_model as f64;
    let scale = act_bytes / 2.0;
    let layer = layer_activation(design, b, s, h, model.heads as f64, c, scale);
    let logits_rows = if design == Design::Bpt { c.min(s) } else { s };
    ModelMemory {
        static_bytes: 16.0 * model.params(),
        checkpoints: model.layers as f64 * b * s * h * act_bytes,
        layer_peak: layer.per_layer(),
        head: b * logits_rows * VOCAB as f64 * 4.0,
    }
}

/// The largest power-of-two sequence length (from 1024 up to 2^24) that fits `device_bytes`,
/// or None if even 1024 does not.
pub fn max_context(
    model: &GptShape,
    design: Design,
    b: f64,
    c: f64,
    act_bytes: f64,
    device_bytes: f64,
) -> Option<usize> {
    (10..=24)
        .map(|k| 1usize << k)
        .take_while(|&s| {
            model_memory(model, design, b, s as f64, c, act_bytes).total() <= device_bytes
        })
        .last()
}

/// The paper's device, "NVIDIA 80GB A100 GPUs" (Liu & Abbeel Sec. 4, seed 002 L189).
pub const A100_BYTES: f64 = 80e9;

/// The share of its 80 GB A100 that `model`'s training state takes in the paper: 16 bytes
/// per parameter (f32 weights, gradients, two Adam moments; the runs were full precision,
/// L191) of Table 1's label over 80 GB. The 3B model's 2.7e9 x 16 B = 43.2 GB, 0.54 of the
/// device, is the 43-44 GB floor of Table 3 at 8K (L225; REPRODUCTION.md 1.2).
pub fn a100_state_share(model: &GptShape) -> f64 {
    16.0 * model.params_label / A100_BYTES
}

/// The model whose share of the A100 the budget rule keeps: the 3B of Table 2's 4x row and
/// of Table 3, the one setup whose memory the paper prints.
pub const RULE_MODEL: &str = "gpt-3b";

/// The budget rule of a scaled-down Table 2: a device whose share taken by the measured
/// model's training state (`state_bytes`, `problem::layer_state_bytes`) is the paper's 3B
/// share of its A100 (`a100_state_share`, 0.54), so budget = state / 0.54. O(1).
pub fn rule_budget(state_bytes: u64) -> u64 {
    budget_at_share(state_bytes, rule_share())
}

/// `a100_state_share` of `RULE_MODEL`.
pub fn rule_share() -> f64 {
    let m = GptShape::by_name(RULE_MODEL).expect("RULE_MODEL is a Table 1 row");
    a100_state_share(&m)
}

/// The budget of which `state_bytes` is the fraction `share`, rounded to a byte.
pub fn budget_at_share(state_bytes: u64, share: f64) -> u64 {
    (state_bytes as f64 / share).round() as u64
}

/// The block sizes of the paper's grid search (A.1, L367): "For each method, we reported
/// the lowest memory achieved".
pub const PAPER_BLOCKS: [usize; 7] = [16, 64, 128, 512, 1024, 2048, 4096];

/// `model_memory`'s total for one sequence of `s` tokens in fp32 (the paper's GPU runs),
/// the lowest over `PAPER_BLOCKS` as the paper reports. O(blocks).
pub fn paper_total(model: &GptShape, design: Design, s: usize) -> f64 {
    PAPER_BLOCKS
        .iter()
        .map(|&c| model_memory(model, design, 1.0, s as f64, c as f64, 4.0).total())
        .fold(f64::INFINITY, f64::min)
}

/// The largest power-of-two context (1024 to 2^24) whose `paper_total` fits
/// `device_bytes`, or None.
pub fn paper_max_context(model: &GptShape, design: Design, device_bytes: f64) -> Option<usize> {
    (10..=24)
        .map(|k| 1usize << k)
        .take_while(|&s| paper_total(model, design, s) <= device_bytes)
        .last()
}

/// BPT Table 2's single-A100 rows that this single-device estimate can be set beside:
/// (model, vanilla, memory-efficient, BPT). 350M is not in Table 1, so it is left out.
pub const TABLE2_ONE_A100: [(&str, usize, usize, usize); 2] = [
    ("gpt-1b", 16384, 65536, 131072),
    ("gpt-3b", 8192, 16384, 65536),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_layer_formulas_are_the_papers() {
        let (b, s, h, a, c) = (2.0, 4096.0, 1024.0, 16.0, 256.0);
        let v = layer_activation(Design::Vanilla, b, s, h, a, c, 1.0);
        assert_eq!(v.attention, 11.0 * b * s * h + 5.0 * b * s * s * a);
        assert_eq!(v.ffn, 8.0 * b * s * h);
        assert_eq!(
            vanilla_ffn_total(b, s, h),
            (2.0 + 8.0 + 8.0 + 1.0) * b * s * h
        );
        let m = layer_activation(Design::MemEff, b, s, h, a, c, 1.0);
        assert_eq!(
            (m.attention, m.ffn, m.per_layer()),
            (2.0 * b * s * h, 8.0 * b * s * h, 8.0 * b * s * h)
        );
        let p = layer_activation(Design::Bpt, b, s, h, a, c, 1.0);
        assert_eq!(p.per_layer(), 2.0 * b * s * h);
        // The paper's 4x saving of BPT over memory-efficient attention.
        assert_eq!(m.per_layer() / p.per_layer(), 4.0);
        // When a block is as long as the sequence, BPT's FFN block dominates (19bch).
        let whole = layer_activation(Design::Bpt, b, s, h, a, s, 1.0);
        assert_eq!(whole.ffn, 19.0 * b * s * h);
        // fp32 activations double every term.
        assert_eq!(
            layer_activation(Design::Bpt, b, s, h, a, c, 2.0).per_layer(),
            4.0 * b * s * h
        );
    }

    #[test]
    fn table1_parameter_counts_match_the_labels() {
        for m in &TABLE1[..5] {
            let rel = (m.params() - m.params_label).abs() / m.params_label;
            assert!(
                rel < 0.03,
                "{}: {:.3e} vs {:.1e}",
                m.name,
                m.params(),
                m.params_label
            );
            assert_eq!(
                m.heads * m.d_head,
                if m.name == "gpt-13b" { 5120 } else { m.d_model }
            );
        }
        // 12 L h^2 gives 64.8B for the "70B" row: the label rounds up its real width.
        let big = TABLE1[5].params();
        assert!((64.0e9..66.0e9).contains(&big), "{big:e}");
    }

    #[test]
    fn the_budget_rule_is_the_3b_share_of_an_a100() {
        // 16 x 2.7e9 / 80e9 = 0.54; 16 x 1.3e9 / 80e9 = 0.26.
        assert!((rule_share() - 0.54).abs() < 1e-12);
        let one_b = GptShape::by_name("gpt-1b").unwrap();
        assert!((a100_state_share(&one_b) - 0.26).abs() < 1e-12);
        // The paper's own case: the 3B's 43.2 GB of state gives back the 80 GB device.
        assert_eq!(rule_budget(43_200_000_000), 80_000_000_000);
        // 2 layers of hidden 256: 16 x 2 x (12 x 256^2 + 13 x 256) = 25,272,320 bytes,
        // / 0.54 = 46,800,592.6.
        assert_eq!(rule_budget(25_272_320), 46_800_593);
    }

    #[test]
    fn paper_totals_take_the_lowest_block() {
        let m = GptShape::by_name("gpt-3b").unwrap();
        // Vanilla and memory-efficient do not depend on the block; BPT's blockwise loss
        // does, so its lowest is at the smallest block.
        let at = |d, c: f64| model_memory(&m, d, 1.0, 8192.0, c, 4.0).total();
        assert_eq!(
            paper_total(&m, Design::MemEff, 8192),
            at(Design::MemEff, 2048.0)
        );
        assert_eq!(paper_total(&m, Design::Bpt, 8192), at(Design::Bpt, 16.0));
        assert!(at(Design::Bpt, 16.0) < at(Design::Bpt, 4096.0));
        // On 80 GiB: vanilla 8K (its 16K needs 128 GiB), memory-efficient 65K (74.2 GiB),
        // BPT 65K (131K needs 81 GiB).
        let gib80 = 80.0 * (1u64 << 30) as f64;
        let ctx: Vec<Option<usize>> = Design::ALL
            .iter()
            .map(|&d| paper_max_context(&m, d, gib80))
            .collect();
        assert_eq!(ctx, [Some(8192), Some(65536), Some(65536)]);
    }

    #[test]
    fn designs_are_ordered_at_every_length_and_in_max_context() {
        let one_a100 = 80e9;
        // In the paper's regime s >> c (BPT's FFN block 19bch is below memory-efficient's
        // 8bsh only while c < 8s/19), here s >= 4c.
        for m in &TABLE1 {
            for k in 13..=20 {
                let s = (1u64 << k) as f64;
                let t: Vec<f64> = Design::ALL
                    .iter()
                    .map(|&d| model_memory(m, d, 1.0, s, 2048.0, 4.0).total())
                    .collect();
                assert!(t[0] > t[1] && t[1] >= t[2], "{} s={s}: {t:?}", m.name);
            }
        }
        for (name, ..) in TABLE2_ONE_A100 {
            let m = GptShape::by_name(name).unwrap();
            let ctx: Vec<usize> = Design::ALL
                .iter()
                .map(|&d| max_context(&m, d, 1.0, 2048.0, 4.0, one_a100).unwrap())
                .collect();
            assert!(ctx[0] < ctx[1] && ctx[1] <= ctx[2], "{name}: {ctx:?}");
        }
        // The vanilla model is quadratic: doubling s more than doubles its layer peak.
        let m = GptShape::by_name("gpt-1b").unwrap();
        let peak = |s: f64| model_memory(&m, Design::Vanilla, 1.0, s, 2048.0, 4.0).layer_peak;
        assert!(peak(32768.0) > 3.5 * peak(16384.0));
    }
}
