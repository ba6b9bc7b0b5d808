//! One compute step of every simulated device at once: each device's query rows against the
//! key/value shard it holds now, with the online softmax of `backend::cpu::decode::attend`
//! (the "local flash attention" of Tree Attention's Algorithm 3, and each Ring Attention
//! step, which carries the unnormalized state (acc, m, l) from step to step and divides
//! once at the end, so p steps round like one long pass). Work items are (device, batch, key/value
//! head, block of query rows) and run in parallel; masks come from absolute positions, so
//! causal blocks above the diagonal cost nothing. Time O(pairs * d); scratch per worker
//! `worker_floats`.

use rayon::prelude::*;

use crate::backend::cpu::blocks::{blocks_per_head, head_row_blocks};
use crate::backend::cpu::decode::{attend, scratch_len, span, Keys, Mask, Positions, RowState};
use crate::backend::cpu::decode_path;
use crate::backend::cpu::isa::Isa;
use crate::backend::cpu::vecops;
use crate::backend::cpu::workspace::{carve, Workspace};
use crate::problem::{DType, Shape, Tensor};

/// Where a device's keys and values are: key i of head (b, g) at element
/// `base0 + (b * kv_heads + g) * head_stride + i * d` of `k` and `v`.
#[derive(Clone, Copy)]
pub struct KvRef<'a> {
    pub k: &'a Tensor,
    pub v: &'a Tensor,
    pub base0: usize,
    pub head_stride: usize,
    pub len: usize,
    pub pos: Positions,
}

impl<'a> KvRef<'a> {
    /// A packed `[b, kv_heads, len, d]` shard.
    pub fn packed(k: &'a Tensor, v: &'a Tensor, len: usize, d: usize, pos: Positions) -> Self {
        KvRef {
            k,
            v,
            base0: 0,
            head_stride: len * d,
            len,
            pos,
        }
    }

    fn keys(&self, head: usize) -> Keys<'a> {
        Keys {
            k: self.k,
            v: self.v,
            base: self.base0 + head * self.head_stride,
            len: self.len,
            pages: None,
            // Simulated devices run this CPU's default path (`variant::impossible`), with
            // decode's measured bf16 loop as one device's decode does, P kept in f32 (their
            // partial results are merged exactly; the tile loop's rounded P is left out).
            isa: decode_path::loops_path(Isa::detect(), false, true),
            fp8: None,
        }
    }
}

/// The fixed parameters of a call's local steps.
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    pub shape: Shape,
    pub mask: Mask,
    /// Query rows per work item (a decode step takes a whole group: G * seq_q).
    pub bq: usize,
    pub bk: usize,
}

/// Where a step's result goes.
pub enum Carry<'a> {
    /// A whole local attention: o (`[b, h, tq, d]`) and its logsumexp lse (`[b, h, tq]`);
    /// the running max and sum live in the kernel's scratch (registers on a GPU).
    Once {
        o: &'a mut [f32],
        lse: &'a mut [f32],
    },
    /// One ring step: the unnormalized accumulator and the running max m and sum l, kept
    /// on the device between steps; `last` divides acc by l.
    Running {
        acc: &'a mut [f32],
        m: &'a mut [f32],
        l: &'a mut [f32],
        last: bool,
    },
}

/// What one device computes in a step: its queries (`[b, h, tq, d]`, at positions `qpos`)
/// against `kv`.
pub struct Work<'a> {
    pub device: usize,
    pub q: &'a Tensor,
    pub tq: usize,
    pub qpos: Positions,
    pub kv: KvRef<'a>,
    pub carry: Carry<'a>,
}

/// Work items of devices whose query counts are `tq`.
pub fn items(geo: &Geometry, tq: &[usize]) -> usize {
    let s = &geo.shape;
    tq.iter()
        .map(|&t| s.batch * s.kv_heads * blocks_per_head(s.group() * t, geo.bq.max(1)))
        .sum()
}

/// Scratch floats per worker for at most `rows` query rows per item; `once` items also
/// keep their running max and sum there.
pub fn worker_floats(geo: &Geometry, rows: usize, dtype: DType, once: bool) -> usize {
    let widen = dtype != DType::F32;
    let d = geo.shape.head_dim;
    (if widen { rows * d } else { 0 })
        + if once { 2 * rows } else { 0 }
        + scratch_len(rows, geo.bk, d, widen, false)
}

/// Runs every device's work of one step in parallel; returns the query-key pairs each of
/// `p` devices attended.
pub fn step(works: Vec<Work>, geo: &Geometry, ws: &Workspace, p: usize) -> Vec<u64> {
    let s = geo.shape;
    let (d, g) = (s.head_dim, s.group());
    let mut items = Vec::new();
    let bq = geo.bq.max(1);
    for w in works {
        let rows = g * w.tq;
        let per_group = blocks_per_head(rows, bq);
        let carries: Vec<ItemCarry> = match w.carry {
            Carry::Once { o, lse } => head_row_blocks(o, rows, d, bq)
                .into_iter()
                .zip(head_row_blocks(lse, rows, 1, bq))
                .map(|(o, lse)| ItemCarry::Once { o, lse })
                .collect(),
            Carry::Running { acc, m, l, last } => head_row_blocks(acc, rows, d, bq)
                .into_iter()
                .zip(head_row_blocks(m, rows, 1, bq))
                .zip(head_row_blocks(l, rows, 1, bq))
                .map(|((acc, m), l)| ItemCarry::Running { acc, m, l, last })
                .collect(),
        };
        for (i, carry) in carries.into_iter().enumerate() {
            let (group, block) = (i / per_group, i % per_group);
            items.push(Item {
                device: w.device,
                q: w.q,
                tq: w.tq,
                qpos: w.qpos,
                kv: w.kv,
                group,
                row0: block * bq,
                carry,
            });
        }
    }
    let done: Vec<(usize, u64)> = items
        .into_par_iter()
        .map(|it| (it.device, run_item(it, geo, ws)))
        .collect();
    let mut pairs = vec![0u64; p];
    for (dev, n) in done {
        pairs[dev] += n;
    }
    pairs
}

enum ItemCarry<'a> {
    Once {
        o: &'a mut [f32],
        lse: &'a mut [f32],
    },
    Running {
        acc: &'a mut [f32],
        m: &'a mut [f32],
        l: &'a mut [f32],
        last: bool,
    },
}

struct Item<'a> {
    device: usize,
    q: &'a Tensor,
    tq: usize,
    qpos: Positions,
    kv: KvRef<'a>,
    /// b * kv_heads + g.
    group: usize,
    /// First row of this block within the group's G * tq rows.
    row0: usize,
    carry: ItemCarry<'a>,
}

fn run_item(it: Item, geo: &Geometry, ws: &Workspace) -> u64 {
    let s = &geo.shape;
    let d = s.head_dim;
    let rows = match &it.carry {
        ItemCarry::Once { lse, .. } => lse.len(),
        ItemCarry::Running { m, .. } => m.len(),
    };
    let (b, g) = (it.group / s.kv_heads, it.group % s.kv_heads);
    let tq = it.tq;
    let range = |r: usize| {
        let a = (it.row0 + r) % tq;
        geo.mask.visible(it.qpos.at(a), it.kv.pos, it.kv.len)
    };
    let (_, pairs) = span(rows, &range);
    let last = matches!(it.carry, ItemCarry::Running { last: true, .. });
    if pairs == 0 && !last {
        return 0;
    }
    let mut guard = ws.acquire();
    let widen_q = it.q.dtype() != DType::F32;
    let widen_kv = it.kv.k.dtype() != DType::F32;
    let once = matches!(it.carry, ItemCarry::Once { .. });
    let [qs, m_s, l_s, scratch] = carve(
        &mut guard,
        [
            if widen_q { rows * d } else { 0 },
            if once { rows } else { 0 },
            if once { rows } else { 0 },
            scratch_len(rows, geo.bk, d, widen_kv, false),
        ],
    );
    let q_off = ((b * s.heads + g * s.group()) * tq + it.row0) * d;
    let q = vecops::widen(it.q, q_off, rows * d, qs);
    let keys = it.kv.keys(it.group);
    match it.carry {
        ItemCarry::Once { o, lse } => {
            let mut state = RowState {
                acc: o,
                m: m_s,
                l: l_s,
            };
            state.reset();
            attend(
                q,
                rows,
                &range,
                keys,
                d,
                s.scale(),
                geo.bk,
                &mut state,
                scratch,
            );
            state.finish(Some(lse));
        }
        ItemCarry::Running { acc, m, l, last } => {
            let mut state = RowState { acc, m, l };
            if pairs > 0 {
                attend(
                    q,
                    rows,
                    &range,
                    keys,
                    d,
                    s.scale(),
                    geo.bk,
                    &mut state,
                    scratch,
                );
            }
            if last {
                state.finish(None);
            }
        }
    }
    pairs
}
