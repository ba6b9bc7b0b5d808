//! The parameters of one GPT block (pre-LN, MHA, GELU FFN with n_inner = 4h), stored as one
//! flat f32 vector so that the gradient is one vector of the same layout. 12h^2 + 13h values.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use std::ops::Range;

/// The named tensors of the block, in storage order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    Ln1Gain,
    Ln1Bias,
    /// `[h, 3h]`: columns `0..h` give Q, `h..2h` K, `2h..3h` V (head `i` of each is the
    /// `d` columns from `i * d`).
    Wqkv,
    Bqkv,
    /// `[h, h]`: the output projection.
    Wo,
    Bo,
    Ln2Gain,
    Ln2Bias,
    /// `[h, 4h]`
    W1,
    B1,
    /// `[4h, h]`
    W2,
    B2,
}

impl Param {
    pub const ALL: [Param; 12] = [
        Param::Ln1Gain,
        Param::Ln1Bias,
        Param::Wqkv,
        Param::Bqkv,
        Param::Wo,
        Param::Bo,
        Param::Ln2Gain,
        Param::Ln2Bias,
        Param::W1,
        Param::B1,
        Param::W2,
        Param::B2,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Param::Ln1Gain => "ln1.gain",
            Param::Ln1Bias => "ln1.bias",
            Param::Wqkv => "attn.w_qkv",
            Param::Bqkv => "attn.b_qkv",
            Param::Wo => "attn.w_o",
            Param::Bo => "attn.b_o",
            Param::Ln2Gain => "ln2.gain",
            Param::Ln2Bias => "ln2.bias",
            Param::W1 => "ffn.w_in",
            Param::B1 => "ffn.b_in",
            Param::W2 => "ffn.w_out",
            Param::B2 => "ffn.b_out",
        }
    }

    /// Number of values for hidden size `h`.
    pub fn len(self, h: usize) -> usize {
        match self {
            Param::Ln1Gain | Param::Ln1Bias | Param::Bo | Param::Ln2Gain | Param::Ln2Bias => h,
            Param::B2 => h,
            Param::Wqkv => 3 * h * h,
            Param::Bqkv => 3 * h,
            Param::Wo => h * h,
            Param::W1 | Param::W2 => 4 * h * h,
            Param::B1 => 4 * h,
        }
    }

    /// Where the tensor lies in the flat vector.
    pub fn range(self, h: usize) -> Range<usize> {
        let start: usize = Param::ALL
            .iter()
            .take_while(|p| **p != self)
            .map(|p| p.len(h))
            .sum();
        start..start + self.len(h)
    }
}

/// Values in the flat vector for hidden size `h`: 12h^2 + 13h.
pub fn count(h: usize) -> usize {
    Param::ALL.iter().map(|p| p.len(h)).sum()
}

/// Borrowed views of the flat vector by name.
#[derive(Clone, Copy)]
pub struct View<'a> {
    pub h: usize,
    pub data: &'a [f32],
}

impl<'a> View<'a> {
    pub fn new(h: usize, data: &'a [f32]) -> Self {
        assert_eq!(data.len(), count(h), "parameter vector of the wrong length");
        View { h, data }
    }
    pub fn get(&self, p: Param) -> &'a [f32] {
        &self.data[p.range(self.h)]
    }
}

/// Seeded parameters: weights N(0, 1/fan_in) (so activations stay O(1)), biases N(0, 0.1^2),
/// layer-norm gains 1 + N(0, 0.1^2) and biases N(0, 0.1^2), so that every gradient is
/// non-trivial. The stream depends on (seed, h) only: all three designs get the same layer.
pub fn generate(h: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6c61_7965_7200);
    let mut out = Vec::with_capacity(count(h));
    for p in Param::ALL {
        let (offset, std) = match p {
            Param::Ln1Gain | Param::Ln2Gain => (1.0, 0.1),
            Param::Wqkv | Param::Wo | Param::W1 => (0.0, 1.0 / (h as f64).sqrt()),
            Param::W2 => (0.0, 1.0 / (4.0 * h as f64).sqrt()),
            _ => (0.0, 0.1),
        };
        for _ in 0..p.len(h) {
            let z: f64 = StandardNormal.sample(&mut rng);
            out.push((offset + std * z) as f32);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_tile_the_vector() {
        let h = 8;
        let mut end = 0;
        for p in Param::ALL {
            let r = p.range(h);
            assert_eq!(r.start, end, "{}", p.name());
            end = r.end;
        }
        assert_eq!(end, count(h));
        assert_eq!(count(h), crate::problem::layer_param_count(h));
    }

    #[test]
    fn generation_is_seeded() {
        assert_eq!(generate(4, 1), generate(4, 1));
        assert_ne!(generate(4, 1), generate(4, 2));
    }
}
