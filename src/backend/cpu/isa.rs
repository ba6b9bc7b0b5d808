//! Instruction-set paths of the CPU kernels, chosen at run time (`is_x86_feature_detected!`)
//! and passed down explicitly, so tests can run every path the machine has. Nothing but the
//! CPU decides the default: environment variables never change which path runs.

use std::fmt;
use std::sync::OnceLock;

/// One implementation of the microkernels and softmax pieces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
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
    /// Every path, fastest first.
    pub const ALL: [Isa; 4] = [Isa::Avx512Bf16, Isa::Avx512, Isa::Avx2, Isa::Portable];

    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512Bf16 => "avx512-bf16",
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Portable => "portable",
        }
    }

    /// Whether this CPU can run the path (asked of the CPU once; every kernel call checks
    /// its path, several times per row block).
    #[inline]
    pub fn available(self) -> bool {
        static AVAILABLE: OnceLock<[bool; Isa::ALL.len()]> = OnceLock::new();
        let by_discriminant = || {
            let mut a = [false; Isa::ALL.len()];
            for isa in Isa::ALL {
                a[isa as usize] = isa.has_features();
            }
            a
        };
        AVAILABLE.get_or_init(by_discriminant)[self as usize]
    }

    /// Whether this CPU can run the path, from the feature flags.
    fn has_features(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let avx512 = || {
                is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("f16c")
            };
            match self {
                Isa::Avx512Bf16 => avx512() && is_x86_feature_detected!("avx512bf16"),
                Isa::Avx512 => avx512(),
                Isa::Avx2 => {
                    is_x86_feature_detected!("avx2")
                        && is_x86_feature_detected!("fma")
                        && is_x86_feature_detected!("f16c")
                }
                Isa::Portable => true,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Isa::Portable
        }
    }

    /// The fastest available path (detected once).
    pub fn detect() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            Isa::ALL
                .into_iter()
                .find(|i| i.available())
                .unwrap_or(Isa::Portable)
        })
    }

    /// Whether bf16 inputs are multiplied as bf16 pairs (`vdpbf16ps`) on this path.
    pub fn bf16_dot(self) -> bool {
        self == Isa::Avx512Bf16
    }

    /// f32 lanes of one vector register: the granularity tiles are padded to.
    pub fn lanes(self) -> usize {
        match self {
            Isa::Avx512Bf16 | Isa::Avx512 => 16,
            Isa::Avx2 | Isa::Portable => 8,
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detected_path_is_available_and_portable_always_is() {
        assert!(Isa::detect().available());
        assert!(Isa::Portable.available());
        println!(
            "kernel paths here: {:?}",
            Isa::ALL.map(|i| (i, i.available()))
        );
    }
}
