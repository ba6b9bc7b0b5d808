//! FlashAttention-2 forward loop order (Dao 2023; seed 003 "FlashAttention"): per query block
//! Q_i, iterate key/value blocks keeping the running row max m, sum l and the unnormalized
//! output O; S = Q_i K_j^T, m' = max(m, rowmax S), P = exp(S - m'), l = e^(m-m') l + rowsum P,
//! O = e^(m-m') O + P V_j; one division O / l at the end. Causal: key blocks entirely above
//! the diagonal are skipped, the diagonal blocks are masked. Time O(n_q*n_kv*d); extra memory
//! per worker B_r*B_c + B_r*d + 2*B_r floats (+ widened tiles for bf16/f16): O(1) in n.

use rayon::prelude::*;

use super::blocks::{blocks_per_head, head_row_blocks, split_bytes};
use super::gemm::{sgemm, MatRef};
use super::softmax::{exp_sub_sum, mask_from, row_max, scale_row};
use super::workspace::{carve, Workspace};
use crate::problem::{Inputs, Shape};

/// Query rows per block (B_r): the outer, parallel loop. 64 rows keep the S tile and the O
/// accumulator (64 x d) in L1/L2 while a key/value block streams past.
pub const DEFAULT_Q_CHUNK: usize = 64;
/// Keys per block (B_c): the inner loop. 256 keys x d = 64 KiB of K (d = 64), L2-resident.
pub const DEFAULT_KV_CHUNK: usize = 256;

pub fn items(shape: &Shape, bq: usize) -> usize {
    shape.batch * shape.heads * shape.seq_q.div_ceil(bq)
}

/// Heap bytes of the forward's per-item output lists (output blocks and L blocks).
pub fn bookkeeping_bytes(shape: &Shape, bq: usize) -> u64 {
    2 * split_bytes(items(shape, bq))
}

/// Per-worker scratch floats, in the order they are carved.
pub fn worker_lens(shape: &Shape, bq: usize, bk: usize, widen: bool) -> [usize; 7] {
    let d = shape.head_dim;
    let (q, kv) = if widen { (bq * d, bk * d) } else { (0, 0) };
    [q, kv, kv, bq * bk, bq * d, bq, bq]
}

/// Forward into `out`; with `lse`, also the row logsumexp L = m + ln(l) of the scaled
/// scores (`[b, h, n_q]`, -inf for a row that sees no key), which the backward needs.
pub fn forward(
    inputs: &Inputs,
    causal: bool,
    bq: usize,
    bk: usize,
    ws: &Workspace,
    out: &mut [f32],
    lse: Option<&mut [f32]>,
) {
    let s = inputs.shape;
    let (d, nq, nkv) = (s.head_dim, s.seq_q, s.seq_kv);
    let widen = inputs.dtype().size_bytes() != 4;
    let scale = s.scale();
    let nqb = blocks_per_head(nq, bq);
    let outs = head_row_blocks(out, nq, d, bq);
    let lses: Vec<Option<&mut [f32]>> = match lse {
        Some(l) => head_row_blocks(l, nq, 1, bq)
            .into_iter()
            .map(Some)
            .collect(),
        None => (0..outs.len()).map(|_| None).collect(),
    };
    outs.into_par_iter()
        .zip(lses)
        .enumerate()
        .for_each(|(item, (o, lse_i))| {
            let (head, qi) = (item / nqb, item % nqb);
            let (b, h) = (head / s.heads, head % s.heads);
            let (q_off, kv_off) = (s.q_head_offset(b, h), s.kv_head_offset(b, h));
            let row0 = qi * bq;
            let rows = o.len() / d;
            let mut guard = ws.acquire();
            let [qs, ks, vs, sc, acc, m, l] = carve(&mut guard, worker_lens(&s, bq, bk, widen));
            let q = inputs.q.rows_f32(q_off + row0 * d, rows * d, qs);
            let acc = &mut acc[..rows * d];
            acc.fill(0.0);
            m.fill(f32::NEG_INFINITY);
            l.fill(0.0);
            // Keys past the last row's visible range are masked for the whole block.
            let kv_end = s.visible_keys(causal, row0 + rows - 1);
            for k0 in (0..kv_end).step_by(bk) {
                let kn = bk.min(nkv - k0);
                let k = inputs.k.rows_f32(kv_off + k0 * d, kn * d, ks);
                let v = inputs.v.rows_f32(kv_off + k0 * d, kn * d, vs);
                let p = &mut sc[..rows * kn];
                sgemm(
                    scale,
                    MatRef::new(q, rows, d),
                    MatRef::new(k, kn, d).t(),
                    0.0,
                    p,
                    kn,
                );
                for (r, row) in p.chunks_mut(kn).enumerate() {
                    if causal {
                        mask_from(row, s.visible_keys(true, row0 + r).saturating_sub(k0));
                    }
                    let m_new = m[r].max(row_max(row));
                    if m_new == f32::NEG_INFINITY {
                        row.fill(0.0); // nothing visible yet for this row
                        continue;
                    }
                    let correction = (m[r] - m_new).exp();
                    l[r] = l[r] * correction + exp_sub_sum(row, m_new);
                    scale_row(&mut acc[r * d..(r + 1) * d], correction);
                    m[r] = m_new;
                }
                sgemm(
                    1.0,
                    MatRef::new(p, rows, kn),
                    MatRef::new(v, kn, d),
                    1.0,
                    acc,
                    d,
                );
            }
            for r in 0..rows {
                let inv = if l[r] > 0.0 { 1.0 / l[r] } else { 0.0 };
                for (y, x) in o[r * d..(r + 1) * d]
                    .iter_mut()
                    .zip(&acc[r * d..(r + 1) * d])
                {
                    *y = x * inv;
                }
            }
            if let Some(lse_i) = lse_i {
                for (r, x) in lse_i.iter_mut().enumerate() {
                    *x = if l[r] > 0.0 {
                        m[r] + l[r].ln()
                    } else {
                        f32::NEG_INFINITY
                    };
                }
            }
        });
}
