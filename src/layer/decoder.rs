//! A tiny Llama-style decoder-only model with grouped-query attention, for end-to-end
//! generation (Shyam et al. Tables 1-2: prefill, then decode token by token;
//! docs/papers.md, Shyam et al.): token embedding, per layer RMSNorm, Q/K/V projections
//! with RoPE (`heads` query heads on `kv_heads` key/value heads), attention, output
//! projection, residual, RMSNorm, SwiGLU MLP, residual; a final RMSNorm and the LM head on
//! the last token, greedy next token. The attention is a parameter (`Attention`): the model
//! runs the rest on one device and hands each layer's Q, K, V to it. f32 throughout.
//! Cost per token and layer 2·h·(2·n_h + 2·n_kv)·d_h + 6·h·f FLOPs besides attention, plus
//! 2·h·vocab for the LM head.

use std::ops::Range;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

use super::ops::gemm;
use crate::backend::cpu::gemm::MatRef;
use crate::error::{Error, Result};

/// RMSNorm epsilon (Llama's).
pub const RMS_EPS: f32 = 1e-5;
/// RoPE base (Llama 2's).
pub const ROPE_THETA: f32 = 10_000.0;

/// The model's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// SwiGLU inner width.
    pub ffn: usize,
    pub vocab: usize,
}

impl Config {
    /// The model of the generation table: 2 layers, hidden 256, 8 query heads on 2 KV
    /// heads of 32, SwiGLU 512, vocabulary 512.
    pub const TINY: Config = Config {
        layers: 2,
        hidden: 256,
        heads: 8,
        kv_heads: 2,
        head_dim: 32,
        ffn: 512,
        vocab: 512,
    };

    fn q_width(&self) -> usize {
        self.heads * self.head_dim
    }

    fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// One layer's weights, row-major `[in, out]`.
struct Layer {
    attn_norm: Vec<f32>,
    wq: Vec<f32>,
    wk: Vec<f32>,
    wv: Vec<f32>,
    wo: Vec<f32>,
    mlp_norm: Vec<f32>,
    w_gate: Vec<f32>,
    w_up: Vec<f32>,
    w_down: Vec<f32>,
}

/// Seeded weights: N(0, 1/fan_in) matrices (activations stay O(1)), N(0, 1) embeddings,
/// unit norm gains.
pub struct Weights {
    pub cfg: Config,
    embed: Vec<f32>,
    layers: Vec<Layer>,
    final_norm: Vec<f32>,
    lm_head: Vec<f32>,
}

impl Weights {
    pub fn generate(cfg: Config, seed: u64) -> Weights {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut mat = |rows: usize, cols: usize, scale: f32| -> Vec<f32> {
            (0..rows * cols)
                .map(|_| {
                    let x: f32 = StandardNormal.sample(&mut rng);
                    x * scale
                })
                .collect()
        };
        let h = cfg.hidden;
        let fan = |n: usize| 1.0 / (n as f32).sqrt();
        let embed = mat(cfg.vocab, h, 1.0);
        let layers = (0..cfg.layers)
            .map(|_| Layer {
                attn_norm: vec![1.0; h],
                wq: mat(h, cfg.q_width(), fan(h)),
                wk: mat(h, cfg.kv_width(), fan(h)),
                wv: mat(h, cfg.kv_width(), fan(h)),
                wo: mat(cfg.q_width(), h, fan(cfg.q_width())),
                mlp_norm: vec![1.0; h],
                w_gate: mat(h, cfg.ffn, fan(h)),
                w_up: mat(h, cfg.ffn, fan(h)),
                w_down: mat(cfg.ffn, h, fan(cfg.ffn)),
            })
            .collect();
        let lm_head = mat(h, cfg.vocab, fan(h));
        Weights {
            cfg,
            embed,
            layers,
            final_norm: vec![1.0; h],
            lm_head,
        }
    }
}

/// `n` seeded prompt tokens, uniform over the vocabulary.
pub fn prompt(cfg: &Config, n: usize, seed: u64) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7072_6f6d_7074);
    (0..n)
        .map(|_| rng.random_range(0..cfg.vocab as u32))
        .collect()
}

/// The attention of every layer, over the sequence's key/value cache, which the
/// implementation keeps (on one device, or sharded over several).
pub trait Attention {
    /// Causal self-attention of the `n` prompt tokens this device runs (`prefill_tokens`)
    /// in `layer`: q `[heads, n, d_h]`, k and v `[kv_heads, n, d_h]` (RoPE applied) into
    /// `out` `[heads, n, d_h]`; k and v become the layer's cache.
    fn prefill(
        &mut self,
        layer: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Result<()>;

    /// One new token in `layer`: its k and v `[kv_heads, d_h]` are appended to the cache,
    /// then q `[heads, d_h]` attends to the whole cache, into `out` `[heads, d_h]`.
    fn decode(
        &mut self,
        layer: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        out: &mut [f32],
    ) -> Result<()>;

    /// The prompt tokens this device runs through the model in the prefill: all of them
    /// on one device; its own contiguous block when the prefill is sequence-parallel.
    fn prefill_tokens(&self, n: usize) -> Range<usize> {
        0..n
    }

    /// The logits every device continues from: those of the device that holds the
    /// sequence's last token (a broadcast when the devices are processes; as they are on
    /// one device).
    fn shared_logits(&mut self, logits: Vec<f32>) -> Result<Vec<f32>> {
        Ok(logits)
    }
}

/// A key or value cache of one layer, head by head: `rows[h]` is `[len, d_h]`.
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    d: usize,
    rows: Vec<Vec<f32>>,
}

impl KvCache {
    pub fn new(heads: usize, d: usize) -> KvCache {
        KvCache {
            d,
            rows: vec![Vec::new(); heads],
        }
    }

    pub fn len(&self) -> usize {
        self.rows.first().map_or(0, |r| r.len() / self.d.max(1))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `n` tokens of `x` (`[heads, n, d_h]`).
    pub fn append(&mut self, x: &[f32], n: usize) {
        let per = n * self.d;
        for (h, r) in self.rows.iter_mut().enumerate() {
            r.extend_from_slice(&x[h * per..(h + 1) * per]);
        }
    }

    /// The cache as one `[heads · group, len, d_h]` tensor, each head repeated `group`
    /// times in place (Llama's `repeat_kv`: query head j reads key/value head j / group).
    pub fn repeated(&self, group: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.rows.len() * group * self.len() * self.d);
        for r in &self.rows {
            for _ in 0..group {
                out.extend_from_slice(r);
            }
        }
        out
    }
}

/// Every layer's key and value caches, as an `Attention` keeps them.
#[derive(Clone, Debug)]
pub struct LayerCaches {
    pub k: Vec<KvCache>,
    pub v: Vec<KvCache>,
}

impl LayerCaches {
    pub fn new(cfg: &Config) -> LayerCaches {
        let one = KvCache::new(cfg.kv_heads, cfg.head_dim);
        LayerCaches {
            k: vec![one.clone(); cfg.layers],
            v: vec![one; cfg.layers],
        }
    }

    /// Appends `n` tokens' keys and values (`[kv_heads, n, d_h]` each) to `layer`'s.
    pub fn append(&mut self, layer: usize, k: &[f32], v: &[f32], n: usize) {
        self.k[layer].append(k, n);
        self.v[layer].append(v, n);
    }
}

/// What one generation produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Generated {
    /// The greedy token after the prompt, then one per decode step.
    pub tokens: Vec<u32>,
    /// The logits that chose each of `tokens`.
    pub logits: Vec<Vec<f32>>,
    /// Wall seconds of everything but attention: the prefill, the decode steps.
    pub prefill_other_s: f64,
    pub decode_other_s: f64,
}

/// Prefill of `prompt`, then `steps` decode steps (each feeding the last greedy token),
/// with `attn` as every layer's attention. Returns the `steps + 1` tokens chosen.
pub fn generate(
    w: &Weights,
    prompt: &[u32],
    steps: usize,
    attn: &mut dyn Attention,
) -> Result<Generated> {
    let mut g = Generated {
        tokens: Vec::with_capacity(steps + 1),
        logits: Vec::with_capacity(steps + 1),
        prefill_other_s: 0.0,
        decode_other_s: 0.0,
    };
    let t0 = Instant::now();
    let mine = attn.prefill_tokens(prompt.len());
    if mine.is_empty() || mine.end > prompt.len() {
        return Err(Error::Usage(format!(
            "prefill tokens {mine:?} of a {}-token prompt: each device needs at least one",
            prompt.len()
        )));
    }
    let (logits, in_attn) = forward(w, &prompt[mine.clone()], mine.start, attn, true)?;
    let logits = attn.shared_logits(logits)?;
    g.prefill_other_s = t0.elapsed().as_secs_f64() - in_attn;
    g.tokens.push(argmax(&logits));
    g.logits.push(logits);
    for s in 0..steps {
        let t0 = Instant::now();
        let last = [*g.tokens.last().unwrap_or(&0)];
        let (logits, in_attn) = forward(w, &last, prompt.len() + s, attn, false)?;
        let logits = attn.shared_logits(logits)?;
        g.decode_other_s += t0.elapsed().as_secs_f64() - in_attn;
        g.tokens.push(argmax(&logits));
        g.logits.push(logits);
    }
    Ok(g)
}

/// The model over `tokens` at positions `pos0..`: the logits of the last token, and the
/// seconds spent in `attn`.
fn forward(
    w: &Weights,
    tokens: &[u32],
    pos0: usize,
    attn: &mut dyn Attention,
    prefill: bool,
) -> Result<(Vec<f32>, f64)> {
    let c = &w.cfg;
    let (n, h, d) = (tokens.len(), c.hidden, c.head_dim);
    let mut x: Vec<f32> = tokens
        .iter()
        .flat_map(|&t| {
            w.embed[t as usize * h..(t as usize + 1) * h]
                .iter()
                .copied()
        })
        .collect();
    let mut hn = vec![0.0f32; n * h];
    let (mut q, mut k, mut v) = (
        vec![0.0f32; n * c.q_width()],
        vec![0.0f32; n * c.kv_width()],
        vec![0.0f32; n * c.kv_width()],
    );
    let (mut gate, mut up) = (vec![0.0f32; n * c.ffn], vec![0.0f32; n * c.ffn]);
    let mut in_attn = 0.0;
    for (li, l) in w.layers.iter().enumerate() {
        rms_norm(&x, &l.attn_norm, &mut hn);
        matmul(&hn, n, h, &l.wq, c.q_width(), 0.0, &mut q);
        matmul(&hn, n, h, &l.wk, c.kv_width(), 0.0, &mut k);
        matmul(&hn, n, h, &l.wv, c.kv_width(), 0.0, &mut v);
        rope(&mut q, c.heads, d, pos0);
        rope(&mut k, c.kv_heads, d, pos0);
        let (qh, kh, vh) = (
            to_heads(&q, n, c.heads, d),
            to_heads(&k, n, c.kv_heads, d),
            to_heads(&v, n, c.kv_heads, d),
        );
        let mut oh = vec![0.0f32; n * c.q_width()];
        let t0 = Instant::now();
        if prefill {
            attn.prefill(li, &qh, &kh, &vh, n, &mut oh)?;
        } else {
            attn.decode(li, &qh, &kh, &vh, &mut oh)?;
        }
        in_attn += t0.elapsed().as_secs_f64();
        let o = from_heads(&oh, n, c.heads, d);
        // x += o Wo, x += (silu(hn Wg) * hn Wu) Wd.
        matmul(&o, n, c.q_width(), &l.wo, h, 1.0, &mut x);
        rms_norm(&x, &l.mlp_norm, &mut hn);
        matmul(&hn, n, h, &l.w_gate, c.ffn, 0.0, &mut gate);
        matmul(&hn, n, h, &l.w_up, c.ffn, 0.0, &mut up);
        for (g, u) in gate.iter_mut().zip(&up) {
            *g = *g / (1.0 + (-*g).exp()) * u;
        }
        matmul(&gate, n, c.ffn, &l.w_down, h, 1.0, &mut x);
    }
    let last = &x[(n - 1) * h..];
    let mut normed = vec![0.0f32; h];
    rms_norm(last, &w.final_norm, &mut normed);
    let mut logits = vec![0.0f32; c.vocab];
    matmul(&normed, 1, h, &w.lm_head, c.vocab, 0.0, &mut logits);
    Ok((logits, in_attn))
}

/// c = a (`m x k`) b (`k x n`) + beta c.
fn matmul(a: &[f32], m: usize, k: usize, b: &[f32], n: usize, beta: f32, c: &mut [f32]) {
    gemm(1.0, MatRef::new(a, m, k), MatRef::new(b, k, n), beta, c, n);
}

/// Row-wise RMSNorm of `x` (rows of `gain.len()`) into `out`.
fn rms_norm(x: &[f32], gain: &[f32], out: &mut [f32]) {
    let h = gain.len();
    for (xr, or) in x.chunks_exact(h).zip(out.chunks_exact_mut(h)) {
        let ms = xr.iter().map(|v| v * v).sum::<f32>() / h as f32;
        let inv = 1.0 / (ms + RMS_EPS).sqrt();
        for ((o, v), g) in or.iter_mut().zip(xr).zip(gain) {
            *o = v * inv * g;
        }
    }
}

/// Rotary embedding in place on `x` (`[n, heads · d]`, token i at position pos0 + i),
/// Llama's half-split pairs (j, j + d/2) rotated by pos · θ^(-2j/d).
fn rope(x: &mut [f32], heads: usize, d: usize, pos0: usize) {
    let half = d / 2;
    for (i, row) in x.chunks_exact_mut(heads * d).enumerate() {
        let pos = (pos0 + i) as f32;
        for j in 0..half {
            let angle = pos * ROPE_THETA.powf(-2.0 * j as f32 / d as f32);
            let (sin, cos) = angle.sin_cos();
            for hd in row.chunks_exact_mut(d) {
                let (a, b) = (hd[j], hd[j + half]);
                hd[j] = a * cos - b * sin;
                hd[j + half] = a * sin + b * cos;
            }
        }
    }
}

/// `[n, heads · d]` to `[heads, n, d]`.
fn to_heads(x: &[f32], n: usize, heads: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    for t in 0..n {
        for hh in 0..heads {
            let src = (t * heads + hh) * d;
            let dst = (hh * n + t) * d;
            out[dst..dst + d].copy_from_slice(&x[src..src + d]);
        }
    }
    out
}

/// `[heads, n, d]` to `[n, heads · d]`.
fn from_heads(x: &[f32], n: usize, heads: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    for hh in 0..heads {
        for t in 0..n {
            let src = (hh * n + t) * d;
            let dst = (t * heads + hh) * d;
            out[dst..dst + d].copy_from_slice(&x[src..src + d]);
        }
    }
    out
}

/// The index of the largest logit (the first on ties).
fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain causal GQA attention, f64 sums, one query row at a time.
    struct Plain {
        cfg: Config,
        cache: LayerCaches,
        /// The prompt tokens it runs, where not all of them.
        block: Option<Range<usize>>,
    }

    impl Plain {
        fn attend(&self, layer: usize, q: &[f32], rows: usize, first: usize, out: &mut [f32]) {
            let c = &self.cfg;
            let (d, g) = (c.head_dim, c.heads / c.kv_heads);
            for hq in 0..c.heads {
                let (k, v) = (
                    &self.cache.k[layer].rows[hq / g],
                    &self.cache.v[layer].rows[hq / g],
                );
                for r in 0..rows {
                    let qi = &q[(hq * rows + r) * d..][..d];
                    let keys = first + r + 1;
                    let s: Vec<f64> = (0..keys)
                        .map(|j| {
                            (0..d).map(|e| (qi[e] * k[j * d + e]) as f64).sum::<f64>()
                                / (d as f64).sqrt()
                        })
                        .collect();
                    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                    let l: f64 = p.iter().sum();
                    for e in 0..d {
                        let o: f64 = (0..keys).map(|j| p[j] * v[j * d + e] as f64).sum();
                        out[(hq * rows + r) * d + e] = (o / l) as f32;
                    }
                }
            }
        }
    }

    impl Attention for Plain {
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
            self.attend(layer, q, n, 0, out);
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
            let first = self.cache.k[layer].len() - 1;
            self.attend(layer, q, 1, first, out);
            Ok(())
        }

        fn prefill_tokens(&self, n: usize) -> Range<usize> {
            self.block.clone().unwrap_or(0..n)
        }
    }

    fn plain(cfg: Config) -> Plain {
        Plain {
            cfg,
            cache: LayerCaches::new(&cfg),
            block: None,
        }
    }

    /// A device given no prompt token (more devices than tokens) is refused with the
    /// reason, not a panic.
    #[test]
    fn a_device_without_prompt_tokens_is_refused() {
        let cfg = Config::TINY;
        let w = Weights::generate(cfg, 3);
        let mut attn = plain(cfg);
        attn.block = Some(3..3);
        let e = generate(&w, &prompt(&cfg, 3, 3), 1, &mut attn).unwrap_err();
        assert!(e.to_string().contains("needs at least one"), "{e}");
    }

    /// With a KV cache, decoding token by token gives the logits of running the whole
    /// sequence again (the cache and RoPE positions are right).
    #[test]
    fn decoding_with_the_cache_equals_prefilling_the_whole_sequence() {
        let cfg = Config {
            layers: 2,
            hidden: 32,
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
            ffn: 48,
            vocab: 40,
        };
        let w = Weights::generate(cfg, 3);
        let p = prompt(&cfg, 9, 3);
        let g = generate(&w, &p, 3, &mut plain(cfg)).unwrap();
        assert_eq!(g.tokens.len(), 4);
        let mut whole = p.clone();
        whole.extend_from_slice(&g.tokens[..3]);
        let again = generate(&w, &whole, 0, &mut plain(cfg)).unwrap();
        let (a, b) = (&g.logits[3], &again.logits[0]);
        let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-5 * scale, "{x} vs {y}");
        }
        assert_eq!(g.tokens[3], again.tokens[0]);
    }

    #[test]
    fn repeat_kv_repeats_each_head_in_place() {
        let mut c = KvCache::new(2, 2);
        c.append(&[1.0, 2.0, 3.0, 4.0], 1);
        assert_eq!(c.len(), 1);
        assert_eq!(c.repeated(2), vec![1.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 4.0]);
    }
}
