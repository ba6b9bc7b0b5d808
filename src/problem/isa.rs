//! The CPU kernels' instruction-set paths as names: what a case may force
//! (`kernel_path`), what `meta.json` records. Which paths a CPU runs and which one it
//! runs by default is the backend's to say (`backend::cpu::isa`).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// One implementation of the microkernels and softmax pieces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Isa {
    /// The `avx512` path, with `flash`'s bf16 forward on AMX tiles (`tdpbf16ps`, Intel
    /// Sapphire Rapids and later, where Linux grants the tile state).
    AmxBf16,
    /// AVX-512 (F, BW, VL) f32 kernels, and `vdpbf16ps` (AVX512_BF16) for bf16 inputs: bf16
    /// pairs multiplied exactly and accumulated in f32.
    Avx512Bf16,
    /// AVX-512 (F, BW, VL) f32 kernels; bf16/f16 inputs widened to f32 tile by tile.
    Avx512,
    /// AVX2 + FMA (and F16C for f16 inputs) f32 kernels, 8 lanes.
    Avx2,
    /// Plain Rust (no intrinsics), the same tiles and loop order: the reference path and
    /// the fallback on any other CPU.
    Portable,
}

impl Isa {
    /// Every path, widest instructions first.
    pub const ALL: [Isa; 5] = [
        Isa::AmxBf16,
        Isa::Avx512Bf16,
        Isa::Avx512,
        Isa::Avx2,
        Isa::Portable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Isa::AmxBf16 => "amx-bf16",
            Isa::Avx512Bf16 => "avx512-bf16",
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Portable => "portable",
        }
    }

    pub fn names() -> Vec<&'static str> {
        Isa::ALL.iter().map(|i| i.name()).collect()
    }

    /// Whether bf16 inputs are multiplied as bf16 pairs (`vdpbf16ps`) on this path.
    pub fn bf16_dot(self) -> bool {
        self == Isa::Avx512Bf16
    }

    /// Whether the path has AVX512_BF16's conversions and pair layouts: the `vdpbf16ps`
    /// path, and the amx-bf16 path, whose tiles read the same pairs.
    pub fn bf16_pairs(self) -> bool {
        matches!(self, Isa::Avx512Bf16 | Isa::AmxBf16)
    }

    /// Whether the path runs the AVX-512 loops (16 f32 lanes).
    pub fn avx512(self) -> bool {
        matches!(self, Isa::AmxBf16 | Isa::Avx512Bf16 | Isa::Avx512)
    }

    /// f32 lanes of one vector register: the granularity tiles are padded to.
    pub fn lanes(self) -> usize {
        if self.avx512() {
            16
        } else {
            8
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Isa {
    type Err = String;

    fn from_str(s: &str) -> Result<Isa, String> {
        Isa::ALL.into_iter().find(|i| i.name() == s).ok_or_else(|| {
            format!(
                "unknown kernel path '{s}' (one of {})",
                Isa::names().join(", ")
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_serialize_as_themselves() {
        for i in Isa::ALL {
            assert_eq!(i.name().parse::<Isa>(), Ok(i));
            assert_eq!(serde_json::to_string(&i).unwrap(), format!("\"{i}\""));
        }
        assert!("avx-512"
            .parse::<Isa>()
            .unwrap_err()
            .contains("avx512-bf16, avx512"));
    }
}
