//! The registry of attention variants. `VariantId` is the only `match` on variants: `list`,
//! config validation, the runner and the tests all iterate `VariantId::ALL`, so a new variant
//! is one file here plus one arm in `VariantId::get`.

mod flash;
mod naive;
mod rabe_staats;

use serde::{Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

use crate::backend::cpu::isa::Isa;
use crate::error::{Error, Result};
use crate::problem::{Case, Grads, Inputs, Mode};

/// Static description of a variant, shown by `attnbench list`.
pub struct VariantInfo {
    pub name: &'static str,
    pub description: &'static str,
    /// Where the algorithm comes from (seed file and section).
    pub source: &'static str,
    pub modes: &'static [Mode],
    /// Default query/key chunk (tile) sizes; `None` = the variant does not cut that loop.
    pub default_q_chunk: Option<usize>,
    pub default_kv_chunk: Option<usize>,
    /// `false` only for deliberately unsafe variants (no max subtraction): their failure on
    /// large logits is the point, and tests expect it.
    pub numerically_safe: bool,
}

/// One attention algorithm family member.
pub trait Variant: Sync {
    fn info(&self) -> &'static VariantInfo;

    /// Bytes the forward call allocates beyond inputs and output (its workspace), from the
    /// variant's own formula, for the kernels of instruction-set path `isa` (tile layouts
    /// may differ by path); the memory probe checks the measured overhead against it.
    fn predict_workspace_bytes(&self, case: &Case, isa: Isa) -> u64;

    /// Forward pass on the CPU into `out` (`[batch, heads, seq_q, head_dim]`, f32), with the
    /// kernels of `isa` (which must be available: `Isa::available`). The workspace is
    /// allocated fallibly up front: an allocation that fails or exceeds the memory budget
    /// is `Error::OutOfMemory`, never an abort.
    fn forward_cpu(&self, case: &Case, isa: Isa, inputs: &Inputs, out: &mut [f32]) -> Result<()>;

    /// Bytes a forward + backward allocates beyond inputs, dO, output and gradients: what
    /// the forward keeps for the backward plus the larger of the two passes' scratch.
    /// Only called for variants whose `modes` contain `fwd+bwd`.
    fn predict_train_workspace_bytes(&self, _case: &Case, _isa: Isa) -> u64 {
        0
    }

    /// The forward of a training step: writes `out` and returns what the backward needs.
    fn forward_train_cpu(
        &self,
        _case: &Case,
        _isa: Isa,
        _inputs: &Inputs,
        _out: &mut [f32],
    ) -> Result<Saved> {
        Err(no_backward(self.info()))
    }

    /// dQ, dK, dV for the upstream gradient `d_out`, overwriting `grads`.
    fn backward_cpu(
        &self,
        _case: &Case,
        _inputs: &Inputs,
        _out: &[f32],
        _saved: &Saved,
        _d_out: &[f32],
        _grads: &mut Grads,
    ) -> Result<()> {
        Err(no_backward(self.info()))
    }
}

/// What a forward keeps for its backward (beyond Q, K, V and O).
pub enum Saved {
    /// Nothing: the backward recomputes (Rabe–Staats checkpointing).
    Nothing,
    /// The softmax probabilities P, `[b, h, n_q, n_kv]` (standard attention).
    Probabilities(Vec<f32>),
    /// The row logsumexp L, `[b, h, n_q]` (FlashAttention).
    LogSumExp(Vec<f32>),
}

fn no_backward(info: &VariantInfo) -> Error {
    Error::Runtime(format!("variant {} has no backward pass", info.name))
}

/// The saved state a backward expects but was not given: a harness bug, reported as such.
pub fn wrong_saved(info: &VariantInfo) -> Error {
    Error::Runtime(format!(
        "variant {}: backward called with another variant's saved state",
        info.name
    ))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum VariantId {
    Naive,
    NaiveUnsafe,
    RabeStaats,
    RabeStaatsSeq,
    Flash,
}

impl VariantId {
    pub const ALL: [VariantId; 5] = [
        VariantId::Naive,
        VariantId::NaiveUnsafe,
        VariantId::RabeStaats,
        VariantId::RabeStaatsSeq,
        VariantId::Flash,
    ];

    pub fn get(self) -> &'static dyn Variant {
        match self {
            VariantId::Naive => &naive::NAIVE,
            VariantId::NaiveUnsafe => &naive::NAIVE_UNSAFE,
            VariantId::RabeStaats => &rabe_staats::RABE_STAATS,
            VariantId::RabeStaatsSeq => &rabe_staats::RABE_STAATS_SEQ,
            VariantId::Flash => &flash::FLASH,
        }
    }

    pub fn info(self) -> &'static VariantInfo {
        self.get().info()
    }

    pub fn name(self) -> &'static str {
        self.info().name
    }

    pub fn names() -> Vec<&'static str> {
        Self::ALL.iter().map(|v| v.name()).collect()
    }
}

impl fmt::Display for VariantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for VariantId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown variant `{s}` (expected one of: {})",
                    Self::names().join(", ")
                )
            })
    }
}

impl Serialize for VariantId {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for VariantId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests;
