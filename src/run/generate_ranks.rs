//! Tree Attention's Tables 1-2 on real MPI ranks (Shyam et al. Sec. 6.4 and App. C.3;
//! docs/papers.md, Shyam et al.): the tiny GQA decoder of `run::generate`, one rank per
//! device, as the paper's protocol runs it. The prefill is sequence-parallel: rank r runs
//! prompt block r (contiguous, N/p tokens) through the model and attends with ring
//! attention over MPI (`dist::ring`, causal); the rank holding the last token broadcasts
//! its logits. Each decode step runs the new token's projections and MLP on every rank,
//! appends its key and value to the last rank's shard (`Placement::Appended`), and
//! attends with ring decode or tree decode over MPI (`dist::ring`, `dist::tree` with the
//! binomial allreduce), the query broadcast from the last rank, K/V repeated to every
//! query head (`repeat_kv`). Times are rank 0's wall clock: every phase ends in a message
//! from the last rank, so it covers the critical path. Rank 0 checks each generation
//! against one device's. Cost per rank: O(L·N²·n_h·d_h / p) for the prefill, O(L·N·n_h·d_h)
//! for ring's and O(L·N·n_h·d_h / p) for tree's decode steps, plus the messages.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::generate::{
    interleaved, point_rows, reference, ring_spec, tokens, tree_spec, Clock, Method, SEED, STEPS,
};
use crate::dist;
use crate::error::{Error, Result};
use crate::layer::decoder::{self, Attention, Config, Generated, LayerCaches, Weights};
use crate::problem::{Inputs, Shape, Tensor};
use crate::results::generate::{GenerateRow, MPI_LINKS};
use crate::sim::shard::{Layout, Placement};

/// The attention of every layer on this rank: its prompt block of every layer's cache (and,
/// on the last rank, every decoded token's key and value).
struct Ranks {
    method: Method,
    cfg: Config,
    rank: usize,
    p: usize,
    /// Prompt tokens N.
    prompt: usize,
    /// This rank's keys and values per layer, from its first position on.
    cache: LayerCaches,
    /// The sequence's length per layer (the prompt and the decoded tokens), on every rank.
    len: Vec<usize>,
    /// This rank's seconds in the attention calls and their messages, and the bytes the
    /// schedules that ran send (every rank's). Assembling a call's inputs is harness work,
    /// outside the calls; the decoder counts it as attention, so it is in no time.
    clock: Clock,
}

impl Ranks {
    fn new(method: Method, cfg: Config, prompt: usize) -> Ranks {
        Ranks {
            method,
            cfg,
            rank: dist::rank(),
            p: dist::size(),
            prompt,
            cache: LayerCaches::new(&cfg),
            len: vec![0; cfg.layers],
            clock: Clock::default(),
        }
    }

    /// This rank's prompt block.
    fn block(&self) -> Range<usize> {
        let layout = Layout {
            placement: Placement::Contiguous,
            p: self.p,
            n: self.prompt,
        };
        let start = layout.positions(self.rank).start as usize;
        start..start + layout.len(self.rank)
    }

    /// The whole `[heads / group · group, len, d_h]` tensor with only this rank's rows
    /// filled, from its `[heads / group, rows, d_h]` rows, each head repeated `group` times:
    /// the MPI kernels address their shard inside the whole tensors, as the sweep's ranks do.
    fn spread(&self, mine: &[f32], group: usize, rows: usize, len: usize) -> Vec<f32> {
        let d = self.cfg.head_dim;
        let heads = mine.len() / (rows * d).max(1);
        let first = self.block().start;
        let mut out = vec![0.0f32; heads * group * len * d];
        for h in 0..heads * group {
            let src = &mine[(h / group) * rows * d..(h / group + 1) * rows * d];
            out[(h * len + first) * d..(h * len + first + rows) * d].copy_from_slice(src);
        }
        out
    }

    /// A call's inputs in `layer`: q `[heads, seq_q, d_h]`, K/V repeated to every query head
    /// and spread over the sequence.
    fn inputs(&self, layer: usize, q: Vec<f32>, seq_q: usize) -> Inputs {
        let c = &self.cfg;
        let group = c.heads / c.kv_heads;
        let (rows, len) = (self.cache.k[layer].len(), self.len[layer]);
        Inputs {
            shape: Shape {
                batch: 1,
                heads: c.heads,
                kv_heads: c.heads,
                seq_q,
                seq_kv: len,
                head_dim: c.head_dim,
            },
            q: Tensor::F32(q),
            k: Tensor::F32(self.spread(&self.cache.k[layer].repeated(1), group, rows, len)),
            v: Tensor::F32(self.spread(&self.cache.v[layer].repeated(1), group, rows, len)),
            paged: Vec::new(),
            fp8: Vec::new(),
            mla: None,
        }
    }

    /// One attention call over MPI: its wall and message seconds on this rank, and the
    /// bytes its schedules send (every rank's).
    fn call(&mut self, x: &Inputs, decode: bool, out: &mut [f32]) -> Result<(f64, f64)> {
        let t0 = Instant::now();
        let bytes = if decode && self.method == Method::Tree {
            let spec = tree_spec(self.p, self.prompt);
            dist::tree::run(&spec, false, x, out, false)?;
            spec.planned(&x.shape, x.dtype())?.bytes
        } else {
            let spec = ring_spec(self.p, self.prompt, decode);
            dist::ring::run(&spec, x, out, false)?;
            spec.planned(&x.shape, x.dtype()).bytes
        };
        let wall = t0.elapsed().as_secs_f64();
        self.clock.bytes += bytes;
        Ok((wall, dist::take_total_call_comm()))
    }
}

impl Attention for Ranks {
    fn prefill_tokens(&self, n: usize) -> Range<usize> {
        debug_assert_eq!(n, self.prompt);
        self.block()
    }

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
        self.len[layer] = self.prompt;
        let (heads, d) = (self.cfg.heads, self.cfg.head_dim);
        let x = self.inputs(layer, self.spread(q, 1, n, self.prompt), self.prompt);
        let mut whole = vec![0.0f32; heads * self.prompt * d];
        let (t, c) = self.call(&x, false, &mut whole)?;
        self.clock.prefill_s += t;
        self.clock.prefill_comm_s += c;
        // This rank's rows back out of the whole output.
        let first = self.block().start;
        for h in 0..heads {
            out[h * n * d..(h + 1) * n * d].copy_from_slice(
                &whole[(h * self.prompt + first) * d..(h * self.prompt + first + n) * d],
            );
        }
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
        // The new token's key and value join the last rank's shard.
        if self.rank + 1 == self.p {
            self.cache.append(layer, k, v, 1);
        }
        self.len[layer] += 1;
        let x = self.inputs(layer, q.to_vec(), 1);
        let (t, c) = self.call(&x, true, out)?;
        self.clock.decode_s += t;
        self.clock.decode_comm_s += c;
        Ok(())
    }

    fn shared_logits(&mut self, mut logits: Vec<f32>) -> Result<Vec<f32>> {
        dist::broadcast_f32(
            self.p - 1,
            &mut logits,
            "broadcasting the last token's logits",
        )?;
        Ok(logits)
    }
}

/// One generation of `n` prompt tokens on this run's ranks, with this rank's clock.
fn generation(w: &Weights, n: usize, method: Method) -> Result<(Generated, Clock)> {
    let prompt = decoder::prompt(&w.cfg, n, SEED);
    let mut attn = Ranks::new(method, w.cfg, n);
    let g = decoder::generate(w, &prompt, STEPS, &mut attn)?;
    Ok((g, attn.clock))
}

/// Every point on this run's ranks (p = the ranks mpirun started): per prompt length the
/// reference on rank 0, then ring and tree generations `interleaved` as
/// `run::generate::measure` runs them. Rank 0's rows (`point_rows`); none on the other
/// ranks. One thread per rank.
pub fn measure(quick: bool, stop: &AtomicBool) -> Result<Vec<GenerateRow>> {
    let p = dist::size();
    if let Some(why) = dist::unavailable(p) {
        return Err(Error::Usage(why));
    }
    let w = Weights::generate(Config::TINY, SEED);
    let pool = crate::measure::pool::pool(1)?;
    pool.install(|| {
        let mut rows = Vec::new();
        for &n in tokens(quick) {
            // Every rank stops together, or none does.
            if !dist::all_ok(!stop.load(Ordering::Relaxed))? {
                return Err(Error::Interrupted("generate: stopped by a signal".into()));
            }
            let one = if dist::is_root() {
                Some(reference(&w, n)?)
            } else {
                None
            };
            let runs = interleaved(quick, |m| generation(&w, n, m))?;
            if let Some(one) = one {
                // Each rank ran and timed its own prompt block.
                rows.extend(point_rows(
                    &runs,
                    (p, MPI_LINKS.into()),
                    n,
                    1,
                    &one,
                    &format!("generate on {p} MPI ranks:"),
                ));
            }
        }
        Ok(rows)
    })
}
