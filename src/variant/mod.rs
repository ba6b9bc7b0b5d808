//! The registry of attention variants. `VariantId` is the only `match` on variants: `list`,
//! config validation, the runner and the tests all iterate `VariantId::ALL`, so a new variant
//! is one file here plus one arm in `VariantId::get`.

mod flash;
mod naive;
mod rabe_staats;

use serde::{Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

use crate::error::Result;
use crate::problem::{Case, Inputs, Mode};

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
    /// variant's own formula; the memory probe checks the measured overhead against it.
    fn predict_workspace_bytes(&self, case: &Case) -> u64;

    /// Forward pass on the CPU into `out` (`[batch, heads, seq_q, head_dim]`, f32). The
    /// workspace is allocated fallibly up front: an allocation that fails or exceeds the
    /// memory budget is `Error::OutOfMemory`, never an abort.
    fn forward_cpu(&self, case: &Case, inputs: &Inputs, out: &mut [f32]) -> Result<()>;
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
