//! The three 1-D softmax algorithms of the blog's "Online softmax" (Transformers Inference
//! Optimization Toolset; docs/papers.md): naive (sum of exp(x), then exp(x)/sum), safe (max,
//! sum of exp(x - m), write) and online (one pass keeping (m, l) with the rescale of Milakov &
//! Gimelshein 2018, then the write pass), plus the unfused and fused L×L softmax of the
//! blog's kernel-fusion paragraph. Each is written once, generic over [`Access`]: [`Plain`]
//! is ordinary slice access (what is timed), [`Counter`] counts every load and store of
//! memory (what the blog counts). Costs: O(n) time, 2 (naive, safe) or 3 (online) exp per
//! element; no allocation (the fused L×L form takes two row buffers from its caller).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// How an algorithm reads and writes the vectors it is given ("HBM" in the blog's terms).
/// Registers and the caller's row buffers ("SRAM") are not memory accesses.
pub trait Access {
    fn load(&mut self, x: &[f32], i: usize) -> f32;
    fn store(&mut self, y: &mut [f32], i: usize, v: f32);
}

/// Ordinary slice access: compiles to `x[i]` and `y[i] = v`, so the timed code is the counted
/// code.
#[derive(Clone, Copy, Debug, Default)]
pub struct Plain;

impl Access for Plain {
    #[inline(always)]
    fn load(&mut self, x: &[f32], i: usize) -> f32 {
        x[i]
    }
    #[inline(always)]
    fn store(&mut self, y: &mut [f32], i: usize, v: f32) {
        y[i] = v;
    }
}

/// Counts loads and stores (one per element read or written).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counter {
    pub loads: u64,
    pub stores: u64,
}

impl Access for Counter {
    #[inline]
    fn load(&mut self, x: &[f32], i: usize) -> f32 {
        self.loads += 1;
        x[i]
    }
    #[inline]
    fn store(&mut self, y: &mut [f32], i: usize, v: f32) {
        self.stores += 1;
        y[i] = v;
    }
}

/// Terms per f32 partial sum; the partial sums (and the online pass's block states) are
/// combined in f64. Why: one sequential f32 sum of 64M terms near 1 stalls once it passes
/// 2^25 (each term is under half an ulp), so the 64M timing would not be a softmax.
pub const BLOCK: usize = 256;

/// The three 1-D algorithms, in the blog's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    Naive,
    Safe,
    Online,
}

impl Algorithm {
    pub const ALL: [Algorithm; 3] = [Algorithm::Naive, Algorithm::Safe, Algorithm::Online];

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Naive => "naive",
            Algorithm::Safe => "safe",
            Algorithm::Online => "online",
        }
    }

    /// Loads per element of the algorithm's passes over x (the store is one per element).
    pub fn loads_per_element(self) -> u64 {
        match self {
            Algorithm::Naive | Algorithm::Online => 2,
            Algorithm::Safe => 3,
        }
    }

    /// Runs the algorithm: y = softmax(x) (`y.len() == x.len()`).
    #[inline]
    pub fn run<A: Access>(self, a: &mut A, x: &[f32], y: &mut [f32]) {
        match self {
            Algorithm::Naive => naive(a, x, y),
            Algorithm::Safe => safe(a, x, y),
            Algorithm::Online => online(a, x, y),
        }
    }
}

/// The write pass shared by all three: y_i = exp(x_i - m) / l.
#[inline(always)]
fn write<A: Access>(a: &mut A, x: &[f32], y: &mut [f32], m: f32, l: f32) {
    for i in 0..x.len().min(y.len()) {
        let v = (a.load(x, i) - m).exp() / l;
        a.store(y, i, v);
    }
}

/// sum_i exp(x_i - m), in f32 partial sums of [`BLOCK`] terms added in f64.
#[inline(always)]
fn sum_exp<A: Access>(a: &mut A, x: &[f32], m: f32) -> f32 {
    let mut total = 0.0f64;
    let mut start = 0;
    while start < x.len() {
        let end = (start + BLOCK).min(x.len());
        let mut s = 0.0f32;
        for i in start..end {
            s += (a.load(x, i) - m).exp();
        }
        total += f64::from(s);
        start = end;
    }
    total as f32
}

/// Naive softmax: exp(x) / sum exp(x), two passes; exp(x) overflows to inf once x >= 89.
pub fn naive<A: Access>(a: &mut A, x: &[f32], y: &mut [f32]) {
    let l = sum_exp(a, x, 0.0);
    write(a, x, y, 0.0, l);
}

/// Safe softmax: m = max x, then exp(x - m) / sum exp(x - m), three passes.
pub fn safe<A: Access>(a: &mut A, x: &[f32], y: &mut [f32]) {
    let mut m = f32::NEG_INFINITY;
    for i in 0..x.len() {
        m = m.max(a.load(x, i));
    }
    let l = sum_exp(a, x, m);
    write(a, x, y, m, l);
}

/// Online softmax: one pass keeping (m, l), m_i = max(m_{i-1}, x_i),
/// l_i = l_{i-1} exp(m_{i-1} - m_i) + exp(x_i - m_i) (Milakov & Gimelshein), then the
/// write pass. Blocks of [`BLOCK`] elements each keep their own f32 (m, l), combined with
/// the same rule (the blog's ⊕) into an f64 l, for the reason [`BLOCK`] gives.
pub fn online<A: Access>(a: &mut A, x: &[f32], y: &mut [f32]) {
    let mut m = f32::NEG_INFINITY;
    let mut l = 0.0f64;
    let mut start = 0;
    while start < x.len() {
        let end = (start + BLOCK).min(x.len());
        let (mut mb, mut lb) = (f32::NEG_INFINITY, 0.0f32);
        for i in start..end {
            let v = a.load(x, i);
            let mn = mb.max(v);
            lb = lb * (mb - mn).exp() + (v - mn).exp();
            mb = mn;
        }
        let mn = m.max(mb);
        l = l * f64::from(m - mn).exp() + f64::from(lb) * f64::from(mb - mn).exp();
        m = mn;
        start = end;
    }
    write(a, x, y, m, l as f32);
}

/// The blog's unfused softmax of an L×L score matrix `s` (row-major), step by step with the
/// exp buffer `e` (L²) and the row sums `sums` (L) materialized: read S, write exp(S); read
/// exp(S), write the L sums; read exp(S) and each row's sum once, write P. Moves 5L² + 2L
/// floats (the blog's own total, 5L² + L, leaves out one of the two L terms).
pub fn unfused_rows<A: Access>(
    a: &mut A,
    l: usize,
    s: &[f32],
    e: &mut [f32],
    sums: &mut [f32],
    p: &mut [f32],
) {
    for i in 0..l * l {
        let v = a.load(s, i).exp();
        a.store(e, i, v);
    }
    for r in 0..l {
        let mut sum = 0.0f32;
        for c in 0..l {
            sum += a.load(e, r * l + c);
        }
        a.store(sums, r, sum);
    }
    for r in 0..l {
        let sum = a.load(sums, r);
        for c in 0..l {
            let v = a.load(e, r * l + c) / sum;
            a.store(p, r * l + c, v);
        }
    }
}

/// The fused L×L softmax: each row of S read once into `row` (on-chip), its safe softmax
/// computed there into `out`, written once to P: 2L² floats moved.
pub fn fused_rows<A: Access>(
    a: &mut A,
    l: usize,
    s: &[f32],
    row: &mut [f32],
    out: &mut [f32],
    p: &mut [f32],
) {
    for r in 0..l {
        for (c, v) in row[..l].iter_mut().enumerate() {
            *v = a.load(s, r * l + c);
        }
        safe(&mut Plain, &row[..l], &mut out[..l]);
        for (c, &v) in out[..l].iter().enumerate() {
            a.store(p, r * l + c, v);
        }
    }
}

/// `n` values drawn uniformly from [0, 1) with `seed` (the blog's inputs).
pub fn uniform(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random::<f32>()).collect()
}

/// The softmax of `x` in f64, max subtracted: the reference of the overflow claim.
pub fn softmax_f64(x: &[f32]) -> Vec<f64> {
    let m = x
        .iter()
        .map(|&v| f64::from(v))
        .fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = x.iter().map(|&v| (f64::from(v) - m).exp()).collect();
    let l: f64 = e.iter().sum();
    e.iter().map(|v| v / l).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_exact_per_element() {
        for n in [1usize, 2, 7, 255, 256, 257, 1001, 4096] {
            let x = uniform(n, n as u64);
            let mut y = vec![0.0; n];
            for alg in Algorithm::ALL {
                let mut c = Counter::default();
                alg.run(&mut c, &x, &mut y);
                let want = (alg.loads_per_element() * n as u64, n as u64);
                assert_eq!((c.loads, c.stores), want, "{} n={n}", alg.name());
            }
        }
        // The blog's figures: safe 3 loads + 1 store, naive and online 2 + 1.
        assert_eq!(Algorithm::Safe.loads_per_element() + 1, 4);
        assert_eq!(Algorithm::Naive.loads_per_element() + 1, 3);
        assert_eq!(Algorithm::Online.loads_per_element() + 1, 3);
    }

    #[test]
    fn the_three_agree_with_an_f64_softmax() {
        for (n, shift) in [(1usize, 0.0f32), (3, 5.0), (1000, -3.0), (100_003, 0.0)] {
            let x: Vec<f32> = uniform(n, 7 + n as u64)
                .iter()
                .map(|v| v * 8.0 + shift)
                .collect();
            let want = softmax_f64(&x);
            for alg in Algorithm::ALL {
                let mut y = vec![f32::NAN; n];
                alg.run(&mut Plain, &x, &mut y);
                let worst = y
                    .iter()
                    .zip(&want)
                    .map(|(&g, &w)| (f64::from(g) - w).abs() / w)
                    .fold(0.0, f64::max);
                assert!(
                    worst <= 1e-5,
                    "{} n={n}: relative error {worst:e}",
                    alg.name()
                );
            }
        }
    }

    #[test]
    fn naive_overflows_at_89_and_safe_and_online_do_not() {
        assert!(88.0f32.exp().is_finite() && 89.0f32.exp().is_infinite());
        let mut x = uniform(1000, 3);
        for (big, naive_finite) in [(88.0f32, true), (89.0, false), (100.0, false)] {
            x[17] = big;
            let want = softmax_f64(&x);
            for alg in Algorithm::ALL {
                let mut y = vec![0.0; x.len()];
                alg.run(&mut Plain, &x, &mut y);
                let finite = y.iter().all(|v| v.is_finite());
                let expect = alg != Algorithm::Naive || naive_finite;
                assert_eq!(finite, expect, "{} at {big}", alg.name());
                if expect {
                    let err = y
                        .iter()
                        .zip(&want)
                        .map(|(&g, &w)| (f64::from(g) - w).abs())
                        .fold(0.0, f64::max);
                    assert!(err <= 1e-6, "{} at {big}: {err:e}", alg.name());
                }
            }
        }
    }

    #[test]
    fn unfused_moves_5l2_plus_2l_and_fused_2l2() {
        for l in [1usize, 2, 3, 16, 33] {
            let s = uniform(l * l, l as u64);
            let (mut e, mut sums, mut p) = (vec![0.0; l * l], vec![0.0; l], vec![0.0; l * l]);
            let mut c = Counter::default();
            unfused_rows(&mut c, l, &s, &mut e, &mut sums, &mut p);
            let l2 = (l * l) as u64;
            assert_eq!((c.loads, c.stores), (3 * l2 + l as u64, 2 * l2 + l as u64));
            assert_eq!(c.loads + c.stores, 5 * l2 + 2 * l as u64, "L={l}");
            let (mut row, mut out, mut q) = (vec![0.0; l], vec![0.0; l], vec![0.0; l * l]);
            let mut f = Counter::default();
            fused_rows(&mut f, l, &s, &mut row, &mut out, &mut q);
            assert_eq!((f.loads, f.stores), (l2, l2), "L={l}");
            // Both are the softmax of each row.
            for r in 0..l {
                let want = softmax_f64(&s[r * l..(r + 1) * l]);
                for c in 0..l {
                    for got in [p[r * l + c], q[r * l + c]] {
                        assert!(
                            (f64::from(got) - want[c]).abs() <= 1e-6 * want[c].max(1e-30) + 1e-7
                        );
                    }
                }
            }
        }
    }
}
