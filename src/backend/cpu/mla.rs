//! Multi-head latent attention decode in the ABSORBED form (DeepSeek-V2 Sec. 2.1.2: W_UK
//! absorbed into the query side, W_UV into the output side; the loop FlashMLA runs): per
//! head q_lat = W_UK^h q_nope (d_c values), scores s_t = (q_lat . c_t + q_rope . k_r,t) *
//! scale over the latent cache, online softmax (FA2's, `decode::fold_scores`) giving
//! o_lat = sum_t p_t c_t, then o = W_UV^h^T o_lat. Every query head and new token shares
//! every cached token, so one batch element's h x seq_q rows are one block of rows against
//! keys of d_c + d_r and values of d_c (the latent itself): MQA, the cache read once per
//! split, each key block through two SGEMMs. The cache is cut into `splits` parts per
//! batch element, combined exactly by log-sum-exp (`combine`).
//! Time O(b h seq_q (n (2 d_c + d_r) + 2 d_c d_h)); extra memory (floats) `mla_floats`.

use rayon::prelude::*;

use super::combine::combine;
use super::decode::{fold_scores, RowState};
use super::flash_amx;
use super::gemm::{sgemm, MatRef};
use super::isa::Isa;
use super::mla_amx;
use super::vecops;
use super::workspace::{carve, Workspace};
use crate::problem::{MlaInputs, Tensor};

/// The dimensions and cut of one MLA decode call.
#[derive(Clone, Copy, Debug)]
pub struct MlaPlan {
    pub batch: usize,
    pub heads: usize,
    pub seq_q: usize,
    pub seq_kv: usize,
    pub head_dim: usize,
    pub latent_dim: usize,
    pub rope_dim: usize,
    pub causal: bool,
    /// Parts of each batch element's cache (at least 1).
    pub splits: usize,
    /// Keys per block (B_c).
    pub bk: usize,
    /// Whether the storage dtype is narrower than f32 (tiles are widened into scratch).
    pub widen: bool,
    /// Whether the attention runs on AMX tiles (`amx_fits`): bf16 cache, `amx-bf16` path.
    pub amx: bool,
    pub threads: usize,
}

/// Whether a bf16 MLA cache of these widths runs on AMX tiles (`mla_amx`): whole 32s of
/// latent and RoPE values (A tiles of 32 bf16 per step, 32 value columns per pair of C
/// tiles).
pub fn amx_fits(latent_dim: usize, rope_dim: usize) -> bool {
    flash_amx::fits(latent_dim) && flash_amx::fits(rope_dim)
}

impl MlaPlan {
    /// Rows of one batch element: every head's new tokens.
    pub fn rows(&self) -> usize {
        self.heads * self.seq_q
    }

    /// Attention work items: (part, batch element).
    pub fn items(&self) -> usize {
        self.splits * self.batch
    }

    /// Scratch buffers: enough for the attention items and for the per-head projections.
    pub fn workers(&self) -> usize {
        self.threads.min(self.items().max(self.heads)).max(1)
    }

    /// Floats of one worker's scratch: the larger of an attention item's (its rows' q_lat,
    /// widened q_rope, m, l, the block's scores and widened latent and RoPE keys) and a
    /// head's projection (its widened W and query or latent rows).
    pub fn worker_floats(&self) -> usize {
        let (r, dc, dr, dh, bk) = (
            self.rows(),
            self.latent_dim,
            self.rope_dim,
            self.head_dim,
            self.bk,
        );
        let w = usize::from(self.widen);
        let attend = if self.amx {
            self.amx_lens().iter().sum()
        } else {
            r * dc + w * r * dr + 2 * r + r * bk + w * bk * (dc + dr)
        };
        let project = w * (dc * dh + self.seq_q * dh);
        attend.max(project)
    }

    /// An attention item's scratch floats on AMX tiles: its rows' [q_lat | q_rope] as bf16,
    /// then `mla_amx::lens`; O accumulates in the partial output.
    fn amx_lens(&self) -> [usize; 2] {
        let (r, dc, dr) = (self.rows(), self.latent_dim, self.rope_dim);
        let tiles = mla_amx::lens(r, self.bk, dc, dr).iter().sum();
        [r * (dc + dr) / 2, tiles]
    }

    /// Floats of the call's shared buffers: q_lat by head, the partial outputs and
    /// logsumexps, o_lat, and the outputs by head.
    pub fn buffer_floats(&self) -> usize {
        let rows = self.batch * self.rows();
        let dc = self.latent_dim;
        rows * dc + self.splits * rows * (dc + 1) + rows * dc + rows * self.head_dim
    }

    /// Keys of part `p` (even cut of `0..seq_kv`).
    fn part(&self, p: usize) -> std::ops::Range<usize> {
        let n = self.seq_kv;
        (p * n / self.splits)..((p + 1) * n / self.splits)
    }

    /// Keys row `r` (head-major, token r mod seq_q) sees: bottom-right causal.
    fn visible(&self, r: usize) -> std::ops::Range<usize> {
        if !self.causal {
            return 0..self.seq_kv;
        }
        let i = r % self.seq_q.max(1);
        let hi = (self.seq_kv + i + 1).saturating_sub(self.seq_q);
        0..hi.min(self.seq_kv)
    }
}

/// The call's shared buffers, carved from one allocation by the caller.
pub struct MlaBuffers<'a> {
    /// q_lat `[h][b * seq_q][d_c]`.
    pub q_lat: &'a mut [f32],
    /// Partial o_lat `[splits][b][h * seq_q][d_c]` and their logsumexps.
    pub part_o: &'a mut [f32],
    pub part_lse: &'a mut [f32],
    /// Combined o_lat `[b][h][seq_q][d_c]`.
    pub o_lat: &'a mut [f32],
    /// Outputs by head `[h][b * seq_q][d_h]`.
    pub o_head: &'a mut [f32],
}

/// Runs one MLA decode call into `out` (`[b, h, seq_q, d_h]`).
pub fn mla_decode(p: &MlaPlan, x: &MlaInputs, bufs: MlaBuffers, ws: &Workspace, out: &mut [f32]) {
    let MlaBuffers {
        q_lat,
        part_o,
        part_lse,
        o_lat,
        o_head,
    } = bufs;
    absorb_queries(p, x, q_lat, ws);
    attend_parts(p, x, q_lat, part_o, part_lse, ws);
    combine_parts(p, part_o, part_lse, o_lat);
    project_out(p, x, o_lat, o_head, ws);
    // Outputs by head back to `[b, h, seq_q, d_h]`.
    let blk = p.seq_q * p.head_dim;
    out.par_chunks_mut(blk).enumerate().for_each(|(bh, o)| {
        let (b, h) = (bh / p.heads, bh % p.heads);
        let at = (h * p.batch + b) * blk;
        o.copy_from_slice(&o_head[at..at + blk]);
    });
}

/// q_lat^h = W_UK^h q_nope^h for every row, head by head (W_UK^h widened once a call).
fn absorb_queries(p: &MlaPlan, x: &MlaInputs, q_lat: &mut [f32], ws: &Workspace) {
    let (dc, dh, sq) = (p.latent_dim, p.head_dim, p.seq_q);
    q_lat
        .par_chunks_mut((p.batch * sq * dc).max(1))
        .enumerate()
        .for_each(|(h, qh)| {
            let mut guard = ws.acquire();
            let w = usize::from(p.widen);
            let [wsc, qsc] = carve(&mut guard, [w * dc * dh, w * sq * dh]);
            let wk = vecops::widen(&x.w_uk, h * dc * dh, dc * dh, wsc);
            for b in 0..p.batch {
                let q = vecops::widen(&x.q_nope, (b * p.heads + h) * sq * dh, sq * dh, qsc);
                // (seq_q x d_h) . (d_h x d_c): W_UK^h is d_c x d_h, read transposed.
                sgemm(
                    1.0,
                    MatRef::new(q, sq, dh),
                    MatRef::new(wk, dc, dh).t(),
                    0.0,
                    &mut qh[b * sq * dc..],
                    dc,
                );
            }
        });
}

/// Each (part, batch element): its rows' online softmax over the part's key blocks, into
/// normalized partial o_lat and logsumexps.
fn attend_parts(
    p: &MlaPlan,
    x: &MlaInputs,
    q_lat: &[f32],
    part_o: &mut [f32],
    part_lse: &mut [f32],
    ws: &Workspace,
) {
    let (r, dc, dr, sq) = (p.rows(), p.latent_dim, p.rope_dim, p.seq_q);
    part_o
        .par_chunks_mut((r * dc).max(1))
        .zip(part_lse.par_chunks_mut(r.max(1)))
        .enumerate()
        .for_each(|(item, (acc, lse))| {
            let (part, b) = (item / p.batch, item % p.batch);
            let mut guard = ws.acquire();
            if p.amx {
                return attend_amx(p, x, q_lat, (part, b), acc, lse, &mut guard);
            }
            let w = usize::from(p.widen);
            let [q, qr_sc, m, l, sc, c_sc, kr_sc] = carve(
                &mut guard,
                [
                    r * dc,
                    w * r * dr,
                    r,
                    r,
                    r * p.bk,
                    w * p.bk * dc,
                    w * p.bk * dr,
                ],
            );
            // This batch element's q_lat rows, head-major as the partials lie.
            for h in 0..p.heads {
                let from = (h * p.batch + b) * sq * dc;
                q[h * sq * dc..(h + 1) * sq * dc].copy_from_slice(&q_lat[from..from + sq * dc]);
            }
            let qr = vecops::widen(&x.q_rope, b * r * dr, r * dr, qr_sc);
            let mut state = RowState { acc, m, l };
            state.reset();
            let keys = p.part(part);
            let range = |row: usize| p.visible(row);
            let mut k0 = keys.start;
            while k0 < keys.end {
                let kn = p.bk.min(keys.end - k0);
                let tok = b * p.seq_kv + k0;
                let c = block(&x.c, tok * dc, kn * dc, c_sc);
                let kr = block(&x.k_rope, tok * dr, kn * dr, kr_sc);
                let s = &mut sc[..r * kn];
                let scale = p.scale();
                sgemm(
                    scale,
                    MatRef::new(q, r, dc),
                    MatRef::new(c, kn, dc).t(),
                    0.0,
                    s,
                    kn,
                );
                sgemm(
                    scale,
                    MatRef::new(qr, r, dr),
                    MatRef::new(kr, kn, dr).t(),
                    1.0,
                    s,
                    kn,
                );
                fold_scores(s, kn, k0, &range, &mut state, dc);
                sgemm(
                    1.0,
                    MatRef::new(s, r, kn),
                    MatRef::new(c, kn, dc),
                    1.0,
                    state.acc,
                    dc,
                );
                k0 += kn;
            }
            state.finish(Some(lse));
        });
}

/// One attention item, (part, batch element), on AMX tiles (`mla_amx`): the rows'
/// [q_lat | q_rope] rounded to bf16, the element's latent cache and RoPE keys read in place,
/// O normalized into `acc`, the rows' logsumexps into `lse`.
fn attend_amx(
    p: &MlaPlan,
    x: &MlaInputs,
    q_lat: &[f32],
    (part, b): (usize, usize),
    acc: &mut [f32],
    lse: &mut [f32],
    scratch: &mut [f32],
) {
    use super::tiles::{as_u16, bf16_bits};

    assert!(
        p.amx && Isa::AmxBf16.available() && amx_fits(p.latent_dim, p.rope_dim),
        "mla-decode: the AMX tiles do not run this case"
    );
    let (r, dc, dr, sq) = (p.rows(), p.latent_dim, p.rope_dim, p.seq_q);
    let dk = dc + dr;
    let [qb, tiles] = carve(scratch, p.amx_lens());
    let (Some(c16), Some(kr16), Some(qr16)) =
        (bf16_bits(&x.c), bf16_bits(&x.k_rope), bf16_bits(&x.q_rope))
    else {
        panic!("mla-decode: the AMX path takes a bf16 cache and queries");
    };
    // Row h * seq_q + i: head h's q_lat of token i (rounded to bf16), then its q_rope.
    let qb = &mut as_u16(qb)[..r * dk];
    for (row, q) in qb.chunks_exact_mut(dk).enumerate() {
        let (h, i) = (row / sq, row % sq);
        let from = ((h * p.batch + b) * sq + i) * dc;
        for (y, v) in q[..dc].iter_mut().zip(&q_lat[from..from + dc]) {
            *y = half::bf16::from_f32(*v).to_bits();
        }
        q[dc..].copy_from_slice(&qr16[(b * r + row) * dr..][..dr]);
    }
    let keys = p.part(part);
    let n = p.seq_kv;
    let cache = (
        &c16[b * n * dc..(b + 1) * n * dc],
        &kr16[b * n * dr..(b + 1) * n * dr],
    );
    let hi = |row: usize| p.visible(row).end;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the tiles are usable and the widths fit (asserted); the scratch is carved by
    // `amx_lens` for these rows and blocks.
    unsafe {
        mla_amx::attend(
            qb,
            cache,
            (r, dc, dr),
            (keys.start, keys.end, p.bk),
            p.scale(),
            &hi,
            acc,
            lse,
            tiles,
        );
    }
}

/// `len` elements of `t` from `offset` as f32: in place for f32, widened into `scratch`.
fn block<'a>(t: &'a Tensor, offset: usize, len: usize, scratch: &'a mut [f32]) -> &'a [f32] {
    vecops::widen(t, offset, len, scratch)
}

/// o_lat of every row from its parts' (partial, logsumexp), exactly.
fn combine_parts(p: &MlaPlan, part_o: &[f32], part_lse: &[f32], o_lat: &mut [f32]) {
    let dc = p.latent_dim;
    let rows = p.batch * p.rows();
    o_lat
        .par_chunks_mut(dc.max(1))
        .enumerate()
        .for_each(|(row, o)| {
            let parts = (0..p.splits).map(|s| {
                let at = s * rows + row;
                (&part_o[at * dc..(at + 1) * dc], part_lse[at])
            });
            combine(parts, o);
        });
}

/// o^h = W_UV^h^T o_lat^h for every row, head by head (W_UV^h widened once a call), into
/// `o_head` `[h][b * seq_q][d_h]`.
fn project_out(p: &MlaPlan, x: &MlaInputs, o_lat: &[f32], o_head: &mut [f32], ws: &Workspace) {
    let (dc, dh, sq) = (p.latent_dim, p.head_dim, p.seq_q);
    o_head
        .par_chunks_mut((p.batch * sq * dh).max(1))
        .enumerate()
        .for_each(|(h, oh)| {
            let mut guard = ws.acquire();
            let w = usize::from(p.widen);
            let [wsc] = carve(&mut guard, [w * dc * dh]);
            let wv = vecops::widen(&x.w_uv, h * dc * dh, dc * dh, wsc);
            for b in 0..p.batch {
                let from = (b * p.heads + h) * sq * dc;
                // (seq_q x d_c) . (d_c x d_h).
                sgemm(
                    1.0,
                    MatRef::new(&o_lat[from..from + sq * dc], sq, dc),
                    MatRef::new(wv, dc, dh),
                    0.0,
                    &mut oh[b * sq * dh..],
                    dh,
                );
            }
        });
}

impl MlaPlan {
    /// Softmax scale 1/sqrt(d_h + d_r).
    pub fn scale(&self) -> f32 {
        1.0 / ((self.head_dim + self.rope_dim) as f32).sqrt()
    }
}
