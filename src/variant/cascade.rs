//! Cascade decoding of a batch whose requests share a cached prefix (`cascade-decode`; the
//! shared prompt of parallel sampling and of RadixAttention's radix tree, Transformers
//! Inference Optimization Toolset, "RadixAttention"; the two-level split of FlashInfer's
//! cascade inference and Hydragen). Phase 1 reads the shared prefix once for the whole
//! batch: per KV head, the queries of every request and every query head of its group
//! (batch x group x seq_q rows) against the prefix's keys as one multi-row pass (`attend`,
//! which takes the SGEMM from this machine's measured row count; bf16 on the `amx-bf16`
//! path, flash's AMX tiles, `flash_amx::Block`), the prefix cut into key parts over the
//! threads, each giving (partial output, logsumexp). Phase 2 is
//! flash-decoding over each request's private suffix. The partials of both are combined
//! exactly by their logsumexp (`combine`). Causal masks (bottom-right aligned) and sliding
//! windows cut both phases' key ranges as in the other decode variants. Without a prefix
//! (`prefix_len` absent or 0) phase 1 is empty: per-request flash-decoding.
//! Cost: the prefix's K and V read once per call, each suffix once per request: time
//! O(batch x heads x seq_q x seq_kv x d); extra memory the partials, (prefix parts + suffix
//! parts) x batch x heads x seq_q x (d + 1) floats, and per worker the gathered query rows
//! of a phase-1 item (batch x group x seq_q x d floats) and `attend`'s scratch.

use std::ops::Range;

use rayon::prelude::*;

use super::decode::{attended, Geometry};
use super::{Variant, VariantInfo};
use crate::backend::cpu::combine::combine;
use crate::backend::cpu::decode::{attend, scratch_len, Keys, RowState, KV_BLOCK};
use crate::backend::cpu::decode_path;
use crate::backend::cpu::flash_amx;
use crate::backend::cpu::isa::Isa;
use crate::backend::cpu::vecops;
use crate::backend::cpu::workspace::{carve, try_zeroed, Workspace};
use crate::error::Result;
use crate::problem::{Case, DType, Inputs, Mode};

pub struct Cascade {
    info: &'static VariantInfo,
}

pub static CASCADE_DECODE: Cascade = Cascade {
    info: &VariantInfo {
        name: "cascade-decode",
        description: "decode of a batch sharing a cached prefix (prefix_len): the prefix read once for all requests' queries batched per KV head, each private suffix split-KV, partials merged exactly by logsumexp",
        source: "RadixAttention's shared prefixes (Transformers Inference Optimization Toolset, 2024) with a two-level cascade (FlashInfer cascade inference, Hydragen, 2024) and Flash-Decoding's log-sum-exp combine",
        modes: &[Mode::Decode],
        default_q_chunk: None,
        default_kv_chunk: Some(KV_BLOCK),
        numerically_safe: true,
    },
};

/// The two phases' key ranges and how each is cut. Parts follow by arithmetic (no table is
/// allocated): part i of n of a range is `even_part`.
struct Plan {
    /// The prefix keys some row attends (shared by every request), and its parts.
    prefix: Range<usize>,
    prefix_parts: usize,
    /// Each request's private keys some row attends, and their parts.
    suffix: Range<usize>,
    suffix_parts: usize,
    batch: usize,
    kv_heads: usize,
    group: usize,
    seq_q: usize,
    d: usize,
}

/// Part `i` of `n` (near-equal lengths, the longer ones first) of `r`, as
/// `sim::plan::even_chunks` cuts it.
fn even_part(r: &Range<usize>, n: usize, i: usize) -> Range<usize> {
    let n = n.max(1);
    let (base, extra) = (r.len() / n, r.len() % n);
    let start = r.start + i * base + i.min(extra);
    start..start + base + usize::from(i < extra)
}

/// Parts of a span of `keys` keys for `units` independent items per part, by
/// flash-decoding's rule (`decode::parts_for`, key blocks of `KV_BLOCK`); none for no keys.
fn parts_for(keys: usize, units: usize, threads: usize) -> usize {
    if keys == 0 {
        return 0;
    }
    super::decode::parts_for(keys, units, threads, KV_BLOCK)
}

impl Plan {
    fn of(case: &Case) -> Plan {
        let s = &case.shape;
        let seen = attended(case, &case.seq_layout(), 0);
        let p = case.prefix_len.unwrap_or(0).min(s.seq_kv);
        let prefix = seen.start.min(p)..seen.end.min(p);
        let suffix = seen.start.max(p)..seen.end.max(p);
        Plan {
            prefix_parts: parts_for(prefix.len(), s.kv_heads, case.threads),
            suffix_parts: parts_for(suffix.len(), s.batch * s.kv_heads, case.threads),
            prefix,
            suffix,
            batch: s.batch,
            kv_heads: s.kv_heads,
            group: s.group(),
            seq_q: s.seq_q,
            d: s.head_dim,
        }
    }

    /// Query rows of a phase-1 item: every request's rows of one KV head's group.
    fn prefix_rows(&self) -> usize {
        self.batch * self.group * self.seq_q
    }

    /// Query rows of a phase-2 item: one request's rows of one KV head's group.
    fn suffix_rows(&self) -> usize {
        self.group * self.seq_q
    }

    /// Output rows (batch x heads x seq_q): the partial rows of one part.
    fn out_rows(&self) -> usize {
        self.batch * self.kv_heads * self.suffix_rows()
    }

    fn items(&self) -> (usize, usize) {
        (
            self.prefix_parts * self.kv_heads,
            self.suffix_parts * self.batch * self.kv_heads,
        )
    }

    /// Partial rows of both phases, (d + 1) floats each.
    fn partial_rows(&self) -> usize {
        (self.prefix_parts + self.suffix_parts) * self.out_rows()
    }

    /// Floats of one worker's workspace: the larger of the two phases' items. A phase-1
    /// item always gathers its rows (they lie in `batch` runs of Q); a phase-2 item's rows
    /// are one run, copied only to widen them.
    fn worker_floats(&self, case: &Case, isa: Isa) -> usize {
        let (d, bk) = (self.d, bk(case));
        let widen = case.dtype != DType::F32;
        let item = |rows: usize, gathers: bool| {
            (if gathers { rows * d } else { 0 }) + 2 * rows + scratch_len(rows, bk, d, widen, false)
        };
        let first = if self.prefix_parts == 0 {
            0
        } else if prefix_on_tiles(case, isa) {
            flash_amx::block_lens(self.prefix_rows(), bk, d, d)
                .iter()
                .sum()
        } else {
            item(self.prefix_rows(), true)
        };
        let second = if self.suffix_parts > 0 {
            item(self.suffix_rows(), widen)
        } else {
            0
        };
        first.max(second)
    }

    fn workers(&self, threads: usize) -> usize {
        let (a, b) = self.items();
        threads.min(a + b).max(1)
    }
}

fn bk(case: &Case) -> usize {
    case.kv_chunk.unwrap_or(KV_BLOCK).max(1)
}

/// Whether phase 1 runs on AMX tiles (`flash_amx::Block`, the prefix's keys in blocks
/// against every request's rows of a group): bf16 K and V (no FP8 cache) on the
/// `amx-bf16` path, head dims of whole 32s.
fn prefix_on_tiles(case: &Case, isa: Isa) -> bool {
    isa == Isa::AmxBf16
        && case.dtype == DType::Bf16
        && case.kv_dtype.is_none()
        && flash_amx::fits(case.shape.head_dim)
}

impl Variant for Cascade {
    fn info(&self) -> &'static VariantInfo {
        self.info
    }

    /// The partials of both phases and the workers' scratch.
    fn predict_workspace_bytes(&self, case: &Case, isa: Isa) -> u64 {
        let plan = Plan::of(case);
        4 * (plan.partial_rows() * (plan.d + 1)) as u64
            + Workspace::bytes(plan.workers(case.threads), plan.worker_floats(case, isa))
    }

    /// One device; causal masks and sliding windows cut both phases' keys.
    fn unsupported(&self, case: &Case) -> Option<String> {
        (case.devices != 1).then(|| {
            format!(
                "variant {} runs on one device (devices = {} requested)",
                self.info.name, case.devices
            )
        })
    }

    /// The shared prefix's attended keys once, plus each request's attended suffix.
    fn kv_read_bytes(&self, case: &Case) -> Option<u64> {
        let plan = Plan::of(case);
        let s = &case.shape;
        let keys = plan.prefix.len() + s.batch * plan.suffix.len();
        Some((2 * s.kv_heads * keys * s.head_dim * case.dtype.size_bytes()) as u64)
    }

    fn forward_cpu(&self, case: &Case, isa: Isa, inputs: &Inputs, out: &mut [f32]) -> Result<()> {
        let (tiles, plan) = (prefix_on_tiles(case, isa), Plan::of(case));
        let floats = plan.worker_floats(case, isa);
        let isa = decode_path::loops_path(isa, case.kernel_path.is_some(), case.highest());
        let name = self.info.name;
        let (d, rows) = (plan.d, plan.partial_rows());
        let mut part_o = try_zeroed(rows * d, name)?;
        let mut part_lse = try_zeroed(rows, name)?;
        let ws = Workspace::new(plan.workers(case.threads), floats, name)?;
        let split = plan.prefix_parts * plan.out_rows();
        let (o1, o2) = part_o.split_at_mut(split * d);
        let (l1, l2) = part_lse.split_at_mut(split);
        let ctx = Ctx {
            case,
            isa,
            tiles,
            inputs,
            plan: &plan,
            ws: &ws,
        };
        rayon::join(|| ctx.prefix_pass(o1, l1), || ctx.suffix_pass(o2, l2));
        ctx.combine(&part_o, &part_lse, out);
        Ok(())
    }
}

/// What every item reads.
struct Ctx<'a> {
    case: &'a Case,
    isa: Isa,
    /// Phase 1 on AMX tiles (`prefix_on_tiles`).
    tiles: bool,
    inputs: &'a Inputs,
    plan: &'a Plan,
    ws: &'a Workspace,
}

impl Ctx<'_> {
    /// Phase 1: item (part p, KV head g) is every request's rows of group g (by request,
    /// then head, then token) against part p of the prefix in request 0's cache (every
    /// request's holds the same keys), into partial rows `(p x kv_heads + g) x rows`.
    fn prefix_pass(&self, o: &mut [f32], lse: &mut [f32]) {
        let p = self.plan;
        let rows = p.prefix_rows();
        if rows == 0 {
            return;
        }
        o.par_chunks_mut(rows * p.d)
            .zip(lse.par_chunks_mut(rows))
            .enumerate()
            .for_each(|(i, (o, lse))| {
                let (part, g) = (i / p.kv_heads, i % p.kv_heads);
                let keys = even_part(&p.prefix, p.prefix_parts, part);
                let mut guard = self.ws.acquire();
                if self.tiles {
                    return self.prefix_item_on_tiles(g, keys, o, lse, &mut guard);
                }
                let [qs, m, l, scratch] = carve(&mut guard, self.scratch(rows, true));
                // Request b's rows of group g: one run of Q, widened into place.
                let run = p.suffix_rows() * p.d;
                for b in 0..p.batch {
                    let at = self.q_offset(b, g);
                    vecops::widen_into(&self.inputs.q, at, &mut qs[b * run..(b + 1) * run]);
                }
                self.attend_item(qs, rows, 0, g, keys, o, m, l, lse, scratch);
            });
    }

    /// A phase-1 item on AMX tiles: every request's bf16 rows of group g as A tiles, each
    /// key block of the prefix part `keys` (request 0's cache) transposed into pairs and
    /// its values interleaved, `flash_amx::Block`'s online softmax, O in `o`.
    fn prefix_item_on_tiles(
        &self,
        g: usize,
        keys: Range<usize>,
        o: &mut [f32],
        lse: &mut [f32],
        scratch: &mut [f32],
    ) {
        use crate::backend::cpu::tiles::bf16_bits;

        let (case, p) = (self.case, self.plan);
        let (rows, d, bk) = (p.prefix_rows(), p.d, bk(case));
        assert!(
            Isa::AmxBf16.available() && flash_amx::fits(d),
            "cascade-decode: the AMX tiles do not run this case"
        );
        let (Some(q16), Some(k16), Some(v16)) = (
            bf16_bits(&self.inputs.q),
            bf16_bits(&self.inputs.k),
            bf16_bits(&self.inputs.v),
        ) else {
            panic!("cascade-decode: the AMX path takes bf16 inputs");
        };
        // Request b's rows of group g: one run of Q each.
        let run = p.suffix_rows() * d;
        let mut t = flash_amx::Block::carve(scratch, rows, bk, (d, d), o, |qb| {
            for b in 0..p.batch {
                qb[b * run..(b + 1) * run].copy_from_slice(&q16[self.q_offset(b, g)..][..run]);
            }
        });
        let geo = Geometry::of(case);
        let seq_q = p.seq_q.max(1);
        // Row r's keys, as indices into the part.
        let seen = |r: usize| {
            let x = geo.token_range(r % seq_q, keys.start, keys.len());
            (x.start as i32, x.end as i32, 0)
        };
        let c = case.shape.scale() * std::f32::consts::LOG2_E;
        let base = case.seq_layout().kv_base(0, g) + keys.start * d;
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the tiles are usable and d fits (asserted); the buffers are carved by
        // `block_lens` for these rows and blocks of at most `kb` keys.
        unsafe {
            let _tiles = crate::backend::cpu::amx::Tiles::configure();
            let mut k0 = 0;
            while k0 < keys.len() {
                let kn = bk.min(keys.len() - k0);
                let at = base + k0 * d;
                let kv = (&k16[at..][..kn * d], &v16[at..][..kn * d]);
                t.key_block((k0, kn), c, &seen, kv);
                k0 += kn;
            }
        }
        t.finish(Some(lse));
    }

    /// Phase 2: item (part p, request b, KV head g) is flash-decoding's item over part p of
    /// b's private suffix, into partial rows `((p x batch + b) x kv_heads + g) x rows`.
    fn suffix_pass(&self, o: &mut [f32], lse: &mut [f32]) {
        let p = self.plan;
        let rows = p.suffix_rows();
        if rows == 0 {
            return;
        }
        let widen = self.inputs.q.dtype() != DType::F32;
        o.par_chunks_mut(rows * p.d)
            .zip(lse.par_chunks_mut(rows))
            .enumerate()
            .for_each(|(i, (o, lse))| {
                let (part, b, g) = (
                    i / (p.batch * p.kv_heads),
                    i / p.kv_heads % p.batch,
                    i % p.kv_heads,
                );
                let keys = even_part(&p.suffix, p.suffix_parts, part);
                let mut guard = self.ws.acquire();
                let [qs, m, l, scratch] = carve(&mut guard, self.scratch(rows, widen));
                let q = vecops::widen(&self.inputs.q, self.q_offset(b, g), rows * p.d, qs);
                self.attend_item(q, rows, b, g, keys, o, m, l, lse, scratch);
            });
    }

    /// An item's scratch: its query rows where copied, m and l per row, `attend`'s.
    fn scratch(&self, rows: usize, copies_q: bool) -> [usize; 4] {
        let (d, widen) = (self.plan.d, self.case.dtype != DType::F32);
        [
            if copies_q { rows * d } else { 0 },
            rows,
            rows,
            scratch_len(rows, bk(self.case), d, widen, false),
        ]
    }

    /// First element of request b's query rows of KV head g's group (tokens innermost).
    fn q_offset(&self, b: usize, g: usize) -> usize {
        let p = self.plan;
        self.case.shape.q_head_offset(b, g * p.group)
    }

    /// The online softmax of `rows` rows (token of row r: r mod seq_q) over `keys` of
    /// request b's cache, KV head g, into (o, lse).
    #[allow(clippy::too_many_arguments)]
    fn attend_item(
        &self,
        q: &[f32],
        rows: usize,
        b: usize,
        g: usize,
        keys: Range<usize>,
        o: &mut [f32],
        m: &mut [f32],
        l: &mut [f32],
        lse: &mut [f32],
        scratch: &mut [f32],
    ) {
        let (case, p) = (self.case, self.plan);
        let geo = Geometry::of(case);
        let seq_q = p.seq_q.max(1);
        let range = |r: usize| geo.token_range(r % seq_q, keys.start, keys.len());
        let kv = Keys {
            k: &self.inputs.k,
            v: &self.inputs.v,
            base: case.seq_layout().kv_base(b, g) + keys.start * p.d,
            len: keys.len(),
            pages: None,
            isa: self.isa,
            fp8: None,
        };
        let mut state = RowState { acc: o, m, l };
        state.reset();
        let scale = case.shape.scale();
        attend(
            q,
            rows,
            &range,
            kv,
            p.d,
            scale,
            bk(case),
            &mut state,
            scratch,
        );
        state.finish(Some(lse));
    }

    /// out[row] = the exact combination of the row's prefix partials and suffix partials.
    /// Output row (b, h, t) is phase-1 row ((g x batch + b) x group + h mod group) x seq_q
    /// + t of each prefix part (g = h / group), and the same row of each suffix part.
    fn combine(&self, part_o: &[f32], part_lse: &[f32], out: &mut [f32]) {
        let p = self.plan;
        let (d, n) = (p.d, p.out_rows());
        let (heads, seq_q) = (p.kv_heads * p.group, p.seq_q.max(1));
        let first = p.prefix_parts * n;
        out.par_chunks_mut(d.max(1)).enumerate().for_each(|(r, o)| {
            let (bh, t) = (r / seq_q, r % seq_q);
            let (b, h) = (bh / heads, bh % heads);
            let (g, hi) = (h / p.group, h % p.group);
            let shared = ((g * p.batch + b) * p.group + hi) * seq_q + t;
            let at = |row: usize| (&part_o[row * d..(row + 1) * d], part_lse[row]);
            let parts = (0..p.prefix_parts)
                .map(move |i| at(i * n + shared))
                .chain((0..p.suffix_parts).map(move |i| at(first + i * n + r)));
            combine(parts, o);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counted bytes: the attended prefix once for the batch, each request's attended
    /// suffix once (flash-decoding: every request's whole attended cache); a window that
    /// ends inside the suffix leaves the prefix unread.
    #[test]
    fn kv_read_bytes_count_the_prefix_once() {
        use crate::problem::{Shape, VariantId};
        use crate::variant::{DefaultCase, Registry};
        let shape = Shape {
            batch: 4,
            heads: 4,
            kv_heads: 2,
            seq_q: 1,
            seq_kv: 100,
            head_dim: 8,
        };
        let of = |v: VariantId, prefix: Option<usize>, window: Option<usize>| {
            let c = Case {
                mode: Mode::Decode,
                prefix_len: prefix,
                window,
                ..Case::cpu_fwd(v, shape, DType::F32, 2)
            };
            v.get().kv_read_bytes(&c)
        };
        let (cd, fd) = (VariantId::CascadeDecode, VariantId::FlashDecoding);
        // 2 (K and V) x 2 KV heads x keys x 8 floats x 4 bytes.
        let bytes = |keys: u64| Some(2 * 2 * keys * 8 * 4);
        assert_eq!(of(cd, Some(60), None), bytes(60 + 4 * 40));
        assert_eq!(of(fd, Some(60), None), bytes(4 * 100));
        assert_eq!(of(cd, None, None), bytes(4 * 100));
        assert_eq!(of(cd, Some(100), None), bytes(100));
        assert_eq!(of(cd, Some(60), Some(10)), bytes(4 * 10));
        assert_eq!(of(cd, Some(95), Some(10)), bytes(5 + 4 * 5));
    }

    /// The arithmetic parts are `even_chunks`' parts, in order, covering the range.
    #[test]
    fn parts_are_the_even_chunks() {
        for (r, n) in [(0..0, 1), (3..10, 3), (5..6, 4), (0..1000, 7)] {
            let want = crate::sim::plan::even_chunks(r.clone(), n);
            let got: Vec<_> = (0..n).map(|i| even_part(&r, n, i)).collect();
            assert_eq!(got, want);
        }
    }
}
