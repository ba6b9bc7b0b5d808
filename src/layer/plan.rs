//! How a layer design runs a case: query blocks, the attention kernel, every buffer it
//! allocates, and from those the exact memory prediction. Vanilla and memory-efficient run
//! one block of the whole sequence (their activations are full-sequence); BPT runs blocks of
//! `q_chunk` rows of one sequence (Liu & Abbeel Algorithm 1). O(blocks) arithmetic.

use crate::algorithm::{Saved, Variant};
use crate::backend::cpu::isa::Isa;
use crate::problem::{Case, DType, Design, Mode, Shape, VariantId};

// The layer's buffers (`Plan::buffers`).
pub const K: &str = "K (all tokens)";
pub const V: &str = "V (all tokens)";
pub const U: &str = "LN1 output";
pub const ST1: &str = "LN1 statistics";
pub const Q: &str = "Q (block, by head)";
pub const O: &str = "attention output (block, by head)";
pub const Y: &str = "residual y (block)";
pub const VN: &str = "LN2 output";
pub const ST2: &str = "LN2 statistics";
pub const Z: &str = "FFN pre-activation";
pub const PROJ: &str = "one head's projection";
pub const G: &str = "GELU output";
pub const DK: &str = "dK (all tokens)";
pub const DV: &str = "dV (all tokens)";
pub const DZ: &str = "dZ";
pub const DVN: &str = "d LN2 output";
pub const DY: &str = "dy";
pub const DO: &str = "d attention output (by head)";
pub const DQ: &str = "dQ (by head)";
pub const DU: &str = "d LN1 output";
pub const Q_H: &str = "Q of one head";
pub const O_H: &str = "O of one head";
pub const K_H: &str = "K prefix of one head";
pub const V_H: &str = "V prefix of one head";
pub const DO_H: &str = "dO of one head";
pub const DQ_H: &str = "dQ of one head";
pub const DK_H: &str = "dK prefix of one head";
pub const DV_H: &str = "dV prefix of one head";

/// BPT's default query block (`blockwise_parallel_v1`'s `q_chunk_size`).
pub const DEFAULT_Q_BLOCK: usize = 1024;

/// Layer dimensions: `b` sequences of `s` tokens, hidden `h = a * d`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub b: usize,
    pub s: usize,
    pub a: usize,
    pub d: usize,
    pub h: usize,
}

impl Dims {
    pub fn of(shape: &Shape) -> Dims {
        Dims {
            b: shape.batch,
            s: shape.seq_q,
            a: shape.heads,
            d: shape.head_dim,
            h: shape.heads * shape.head_dim,
        }
    }
    /// Elements of one full-sequence activation, `b * s * h`.
    pub fn full(&self) -> usize {
        self.b * self.s * self.h
    }
}

/// One query block: tokens `q0..q0 + c` of sequences `bb0..bb0 + nb`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub bb0: usize,
    pub nb: usize,
    pub q0: usize,
    pub c: usize,
}

impl Block {
    pub fn rows(&self) -> usize {
        self.nb * self.c
    }
    /// Offset of sequence `bbl` (local) of the block in a `[b, s, h]` activation.
    pub fn row_offset(&self, dims: &Dims, bbl: usize) -> usize {
        ((self.bb0 + bbl) * dims.s + self.q0) * dims.h
    }
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub design: Design,
    pub dims: Dims,
    /// Rows per query block within one sequence (`s` for the whole-sequence designs).
    pub c: usize,
    pub causal: bool,
    pub train: bool,
    /// Storage of the attention operands Q, K, V (and their per-head copies).
    pub dtype: DType,
    /// The attention kernel's case for the whole sequence (its kv_chunk, threads).
    base: Case,
    /// The attention variant's implementation (`attention_of(design)`, from the registry).
    pub attention: &'static dyn Variant,
}

/// The attention variant a design runs: materialized (naive) for vanilla, flash otherwise.
pub fn attention_of(design: Design) -> VariantId {
    match design {
        Design::Vanilla => VariantId::Naive,
        Design::MemEff | Design::Bpt => VariantId::Flash,
    }
}

impl Plan {
    /// The plan of `case` under `design`, its attention run by `attention` (the registry's
    /// implementation of `attention_of(design)`).
    pub fn new(design: Design, case: &Case, attention: &'static dyn Variant) -> Plan {
        let dims = Dims::of(&case.shape);
        let c = match design {
            Design::Bpt => case.q_chunk.unwrap_or(DEFAULT_Q_BLOCK).clamp(1, dims.s),
            Design::Vanilla | Design::MemEff => dims.s,
        };
        Plan {
            design,
            dims,
            c,
            causal: case.causal,
            train: case.mode == Mode::LayerTrain,
            dtype: case.dtype,
            base: case.clone(),
            attention,
        }
    }

    /// Whole-sequence designs run one attention call over all heads and sequences.
    pub fn whole(&self) -> bool {
        self.design != Design::Bpt
    }

    pub fn attention_variant(&self) -> VariantId {
        attention_of(self.design)
    }

    /// Rows of the largest block.
    pub fn rows(&self) -> usize {
        if self.whole() {
            self.dims.b * self.dims.s
        } else {
            self.c
        }
    }

    pub fn blocks(&self) -> Vec<Block> {
        let Dims { b, s, .. } = self.dims;
        if self.whole() {
            return vec![Block {
                bb0: 0,
                nb: b,
                q0: 0,
                c: s,
            }];
        }
        let mut out = Vec::new();
        for bb in 0..b {
            for q0 in (0..s).step_by(self.c) {
                out.push(Block {
                    bb0: bb,
                    nb: 1,
                    q0,
                    c: self.c.min(s - q0),
                });
            }
        }
        out
    }

    /// Keys a block's queries see: its causal prefix, or the whole sequence.
    pub fn kv_len(&self, blk: &Block) -> usize {
        if self.causal {
            blk.q0 + blk.c
        } else {
            self.dims.s
        }
    }

    /// The attention case of one call: all heads of the whole sequence, or (BPT) one head
    /// of one block against its keys.
    pub fn attention_case(&self, blk: &Block) -> Case {
        let Dims { a, d, .. } = self.dims;
        let (heads, batch) = if self.whole() { (a, blk.nb) } else { (1, 1) };
        let mut case = self.base.clone();
        case.variant = self.attention_variant();
        case.mode = if self.train { Mode::FwdBwd } else { Mode::Fwd };
        case.shape = Shape {
            batch,
            heads,
            kv_heads: heads,
            seq_q: blk.c,
            seq_kv: self.kv_len(blk),
            head_dim: d,
        };
        case.q_chunk = None;
        case.window = None;
        case.devices = 1;
        case.splits = None;
        case.allreduce = None;
        case
    }

    /// Elements of buffer `what` (one of the names below; 0 for a name this plan does not
    /// allocate).
    pub fn floats(&self, what: &str) -> usize {
        self.buffers()
            .iter()
            .find(|(w, _, _)| *w == what)
            .map_or(0, |(_, n, _)| *n)
    }

    /// Every buffer the layer allocates: (what, elements, bytes per element).
    pub fn buffers(&self) -> Vec<(&'static str, usize, usize)> {
        let Dims { d, h, s, .. } = self.dims;
        let full = self.dims.full();
        let r = self.rows();
        let st = self.dtype.size_bytes();
        let mut v = vec![
            (K, full, st),
            (V, full, st),
            (U, r * h, 4),
            (ST1, 2 * r, 4),
            (Q, r * h, st),
            (O, r * h, 4),
            (Y, r * h, 4),
            (VN, r * h, 4),
            (ST2, 2 * r, 4),
            (Z, 4 * r * h, 4),
            (PROJ, self.c * d, 4),
        ];
        if self.train {
            v.extend([
                (G, 4 * r * h, 4),
                (DK, full, 4),
                (DV, full, 4),
                (DZ, 4 * r * h, 4),
                (DVN, r * h, 4),
                (DY, r * h, 4),
                (DO, r * h, 4),
                (DQ, r * h, 4),
                (DU, r * h, 4),
            ]);
        }
        if !self.whole() {
            let c = self.c;
            v.extend([
                (Q_H, c * d, st),
                (O_H, c * d, 4),
                (K_H, s * d, st),
                (V_H, s * d, st),
            ]);
            if self.train {
                v.extend([
                    (DO_H, c * d, 4),
                    (DQ_H, c * d, 4),
                    (DK_H, s * d, 4),
                    (DV_H, s * d, 4),
                ]);
            }
        }
        v
    }

    /// Bytes the attention kernels allocate at their peak, beyond the buffers above: the
    /// largest over blocks of the kernel's own prediction; BPT training keeps every head's
    /// logsumexp of a block (and the list holding them) until the block's backward.
    pub fn attention_peak_bytes(&self, isa: Isa) -> u64 {
        let variant = self.attention;
        let a = self.dims.a as u64;
        self.blocks()
            .iter()
            .map(|blk| {
                let case = self.attention_case(blk);
                if !self.train {
                    return variant.predict_workspace_bytes(&case, isa);
                }
                let one = variant.predict_train_workspace_bytes(&case, isa);
                if self.whole() {
                    one
                } else {
                    one + (a - 1) * 4 * blk.c as u64 + a * std::mem::size_of::<Saved>() as u64
                }
            })
            .max()
            .unwrap_or(0)
    }

    /// The layer call's exact activation bytes (GEMM packing buffers aside).
    pub fn predict_bytes(&self, isa: Isa) -> u64 {
        let bytes: usize = self.buffers().iter().map(|(_, n, b)| n * b).sum();
        bytes as u64 + self.attention_peak_bytes(isa)
    }
}
