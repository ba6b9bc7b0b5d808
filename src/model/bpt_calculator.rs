//! Renders the BPT memory calculator as Markdown: per-layer activation memory (Sec. 3.1) for
//! the requested sequence lengths, the whole-model estimate, and the largest context per
//! design beside the paper's Table 2 where it has a single-device row.

use super::bpt_memory::{
    layer_activation, max_context, model_memory, Design, GptShape, TABLE2_ONE_A100,
};
use crate::units;

pub struct Query<'a> {
    pub model: &'a GptShape,
    pub seq_lens: &'a [usize],
    pub batch: usize,
    pub block: usize,
    pub act_bytes: usize,
    pub device_bytes: u64,
}

pub fn render(q: &Query) -> String {
    let m = q.model;
    let (b, c, act) = (q.batch as f64, q.block as f64, q.act_bytes as f64);
    let gib = |x: f64| units::bytes_2dp(x.max(0.0) as u64);
    let mut out = format!(
        "# BPT memory model: {} ({} layers, d_model {}, {} heads; {:.2e} parameters by 12Lh^2 + Vh, paper label {:.1e})\n\n\
         Batch {}, block {}, {}-byte activations (the paper's Sec. 3.1 assumes 2; its GPU runs were fp32 = 4). \
         Formulas: Liu & Abbeel Sec. 3.1. Whole-model memory = 16 B/param (weights, grads, Adam) + L saved layer inputs \
         + one layer's working set + logits (f32; BPT blockwise).\n\n",
        m.name, m.layers, m.d_model, m.heads, m.params(), m.params_label, q.batch, q.block, q.act_bytes
    );
    out += "| seq_len | design | attention / layer | FFN / layer | per layer | whole model |\n|---|---|---|---|---|---|\n";
    for &s in q.seq_lens {
        for d in Design::ALL {
            let l = layer_activation(
                d,
                b,
                s as f64,
                m.d_model as f64,
                m.heads as f64,
                c,
                act / 2.0,
            );
            let total = model_memory(m, d, b, s as f64, c, act).total();
            out += &format!(
                "| {s} | {} | {} | {} | {} | {} |\n",
                d.name(),
                gib(l.attention),
                gib(l.ffn),
                gib(l.per_layer()),
                gib(total)
            );
        }
    }
    out += &format!(
        "\n## Largest context on one device of {}\n\n| design | this model | paper Table 2 (1 A100, trend only) |\n|---|---|---|\n",
        units::bytes_2dp(q.device_bytes)
    );
    let paper = TABLE2_ONE_A100.iter().find(|r| r.0 == m.name);
    for (i, d) in Design::ALL.into_iter().enumerate() {
        let ours = max_context(m, d, b, c, act, q.device_bytes as f64)
            .map_or("does not fit at 1024".to_string(), |s| s.to_string());
        let theirs = paper.map_or("-".to_string(), |r| [r.1, r.2, r.3][i].to_string());
        out += &format!("| {} | {ours} | {theirs} |\n", d.name());
    }
    out += "\nThe estimate leaves out framework buffers, fragmentation and the other temporaries of a real \
            step, so it predicts longer contexts than the paper measured, and at power-of-two resolution it can give \
            memory-efficient and BPT the same context (e.g. gpt-3b) where the paper measured 4x. What is exact: \
            the per-layer formulas, the 4x per-layer saving, and BPT <= memory-efficient < vanilla once s >> c (BPT's 19bch FFN block is below 8bsh only while c < 8s/19).\n";
    out
}
