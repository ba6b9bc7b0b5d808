//! Interleaved timing of the blog's three 1-D softmax algorithms (Transformers Inference
//! Optimization Toolset, "Online softmax"; docs/papers.md): on one input vector, one untimed
//! warm-up call each, then rounds in which every algorithm makes one timed call, in a seeded
//! random order per round (as `run::interleave` times cases; Google Benchmark's random
//! interleaving), until each has `min_time_s` of timed calls and `min_rounds` rounds, or
//! `max_rounds`, or an interrupt. A slow stretch of a shared machine thus falls on all three
//! alike, so their ratios compare calls made at one speed. Cost: the calls themselves, plus
//! one output vector of x's length (allocated before the first call).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::stats::Summary;
use crate::backend::cpu::softmax_passes::{Algorithm, Plain};

/// When the rounds stop.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rounds {
    pub min_time_s: f64,
    pub min_rounds: usize,
    pub max_rounds: usize,
    /// Seeds the order of each round.
    pub seed: u64,
}

/// One algorithm's timed calls.
#[derive(Clone, Debug, PartialEq)]
pub struct Timed {
    pub algorithm: Algorithm,
    pub samples: Vec<f64>,
    pub summary: Summary,
}

/// Times `Algorithm::ALL` on `x` in interleaved rounds (see the module doc); in
/// `Algorithm::ALL` order. `None` for an empty `x`.
pub fn time_interleaved(
    x: &[f32],
    rounds: &Rounds,
    interrupted: &AtomicBool,
) -> Option<Vec<Timed>> {
    if x.is_empty() {
        return None;
    }
    let mut y = vec![0.0f32; x.len()];
    let algs = Algorithm::ALL;
    for alg in algs {
        alg.run(&mut Plain, x, &mut y);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(rounds.seed);
    let mut order: Vec<usize> = (0..algs.len()).collect();
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); algs.len()];
    let mut totals = vec![0.0f64; algs.len()];
    let mut done = 0;
    while done < rounds.max_rounds.max(1) {
        order.shuffle(&mut rng);
        for &k in &order {
            let t0 = Instant::now();
            algs[k].run(&mut Plain, std::hint::black_box(x), &mut y);
            std::hint::black_box(&mut y);
            let t = t0.elapsed().as_secs_f64();
            samples[k].push(t);
            totals[k] += t;
        }
        done += 1;
        let enough = done >= rounds.min_rounds && totals.iter().all(|&t| t >= rounds.min_time_s);
        if enough || interrupted.load(Ordering::Relaxed) {
            break;
        }
    }
    algs.iter()
        .zip(samples)
        .map(|(&algorithm, samples)| {
            Summary::of(&samples).map(|summary| Timed {
                algorithm,
                samples,
                summary,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_algorithm_gets_one_call_per_round_until_the_rule_stops() {
        let x = vec![0.5f32; 1000];
        let flag = AtomicBool::new(false);
        let r = Rounds {
            min_time_s: 0.0,
            min_rounds: 7,
            max_rounds: 100,
            seed: 1,
        };
        let t = time_interleaved(&x, &r, &flag).unwrap();
        assert_eq!(t.len(), 3);
        assert!(t
            .iter()
            .all(|t| t.samples.len() == 7 && t.summary.median > 0.0));
        let capped = Rounds {
            min_time_s: 1e9,
            max_rounds: 4,
            ..r
        };
        let t = time_interleaved(&x, &capped, &flag).unwrap();
        assert!(t.iter().all(|t| t.samples.len() == 4));
        assert_eq!(time_interleaved(&[], &r, &flag), None);
    }
}
