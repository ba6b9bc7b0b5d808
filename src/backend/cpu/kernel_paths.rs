//! Test support: every path one CPU kernel can take on a shape (input dtype x the ISAs this
//! CPU has x causal mask x exact or fast exp), a pool of a given size to run it on, and
//! deterministic test values.

use std::collections::BTreeSet;

use super::isa::Isa;
use crate::problem::{DType, InputDist, Inputs, Shape};

/// The kernel paths expected to run on this CPU: `Isa::ALL` less those it lacks, each of
/// which is named once on stdout (not a skip: a path the CPU lacks is simply not expected).
/// Portable and the detected path are always among them.
pub fn expected_isas() -> Vec<Isa> {
    let (have, lack): (Vec<Isa>, Vec<Isa>) = Isa::ALL.into_iter().partition(|i| i.available());
    if !lack.is_empty() {
        println!("kernel paths not available on this CPU, so not expected: {lack:?}");
    }
    assert!(have.contains(&Isa::Portable) && have.contains(&Isa::detect()));
    have
}

/// The paths `for_each_path` must call `f` on: every dtype x [`expected_isas`] x causal or
/// not x exact or fast exp.
pub fn expected_paths() -> BTreeSet<(DType, Isa, bool, bool)> {
    let mut all = BTreeSet::new();
    for dtype in DType::ALL {
        for isa in expected_isas() {
            for causal in [false, true] {
                for exact in [false, true] {
                    all.insert((dtype, isa, causal, exact));
                }
            }
        }
    }
    all
}

/// One path of a kernel over one shape's inputs.
pub struct KernelPath<'a> {
    pub inputs: &'a Inputs,
    pub dtype: DType,
    pub isa: Isa,
    pub causal: bool,
    pub exact: bool,
}

impl KernelPath<'_> {
    /// Names the path in an assertion message.
    pub fn name(&self) -> String {
        let s = self.inputs.shape;
        format!(
            "{} {} causal {} exact {} {}x{}x{}",
            self.dtype, self.isa, self.causal, self.exact, s.seq_q, s.seq_kv, s.head_dim
        )
    }
}

/// Calls `f` once per path: f32, bf16 and f16 inputs (normal, drawn from `seed`), every ISA
/// this CPU runs, causal and not, exact and fast exp; then asserts that the paths `f` ran
/// to completion are exactly [`expected_paths`] (none dropped on the way).
pub fn for_each_path(shape: Shape, seed: u64, mut f: impl FnMut(&KernelPath)) {
    let mut ran = BTreeSet::new();
    for dtype in DType::ALL {
        let inputs = Inputs::generate(shape, dtype, InputDist::Normal, 1.0, seed);
        for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
            for causal in [false, true] {
                for exact in [false, true] {
                    f(&KernelPath {
                        inputs: &inputs,
                        dtype,
                        isa,
                        causal,
                        exact,
                    });
                    ran.insert((dtype, isa, causal, exact));
                }
            }
        }
    }
    assert_eq!(ran, expected_paths(), "kernel paths run on {shape:?}");
}

/// Runs `f` on a fresh rayon pool of `threads` workers.
pub fn on_pool<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a test thread pool")
        .install(f)
}

/// Deterministic values in [-1, 1) with a few exact zeros and repeats.
pub fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}
