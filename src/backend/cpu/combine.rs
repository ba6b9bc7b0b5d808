//! Exact combination of attention over disjoint key sets from each set's (output,
//! logsumexp): M = max_s lse_s, lse = M + ln sum_s e^(lse_s - M), O = sum_s e^(lse_s - lse) O_s
//! (flash-decoding's `combine_attn_seqk_parallel`, docs/papers.md, Other sources (Flash-Decoding)), and the pairwise
//! form out -= sigmoid(lse_b - lse) (out - out_b), lse -= log sigmoid(lse - lse_b)
//! (`llama_flash_sp.py`). A set with no visible key has lse = -inf and weight 0.
//! O(parts * d) per row, no allocation.

/// Combines `parts` (each an output row and its logsumexp) into `out`; returns the
/// combined logsumexp (-inf, with `out` = 0, when no part saw a key).
pub fn combine<'a>(parts: impl Iterator<Item = (&'a [f32], f32)> + Clone, out: &mut [f32]) -> f32 {
    let m = parts
        .clone()
        .map(|(_, l)| l)
        .fold(f32::NEG_INFINITY, f32::max);
    out.fill(0.0);
    if m == f32::NEG_INFINITY {
        return m;
    }
    let sum: f32 = parts.clone().map(|(_, l)| (l - m).exp()).sum();
    let lse = m + sum.ln();
    for (o, l) in parts {
        let w = (l - lse).exp();
        if w > 0.0 {
            for (y, x) in out.iter_mut().zip(o) {
                *y += w * x;
            }
        }
    }
    lse
}

/// Folds (o_b, lse_b) into (out, lse) with the pairwise sigmoid form.
pub fn merge_pair(out: &mut [f32], lse: &mut f32, o_b: &[f32], lse_b: f32) {
    if lse_b == f32::NEG_INFINITY {
        return;
    }
    if *lse == f32::NEG_INFINITY {
        out.copy_from_slice(o_b);
        *lse = lse_b;
        return;
    }
    let w = sigmoid(lse_b - *lse);
    for (y, x) in out.iter_mut().zip(o_b) {
        *y -= w * (*y - x);
    }
    // log sigmoid(x) = -ln(1 + e^-x), computed without overflow for either sign.
    let x = *lse - lse_b;
    let log_sig = if x >= 0.0 {
        -(-x).exp().ln_1p()
    } else {
        x - x.exp().ln_1p()
    };
    *lse -= log_sig;
}

fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attention of one query over scores `s` and scalar values `v`: (o, lse).
    fn attend(s: &[f32], v: &[f32]) -> (f32, f32) {
        let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let w: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
        let sum: f32 = w.iter().sum();
        let o = w.iter().zip(v).map(|(a, b)| a * b).sum::<f32>() / sum;
        (o, m + sum.ln())
    }

    #[test]
    fn both_forms_equal_attention_over_the_union() {
        let s = [0.3f32, 2.0, -1.0, 5.0, 0.0, 1.5, -40.0];
        let v = [1.0f32, -2.0, 0.5, 3.0, 4.0, -1.0, 9.0];
        let (want, want_lse) = attend(&s, &v);
        let cuts = [(0, 2), (2, 3), (3, 3), (3, 7)];
        let parts: Vec<([f32; 1], f32)> = cuts
            .iter()
            .map(|&(a, b)| {
                if a == b {
                    ([0.0], f32::NEG_INFINITY)
                } else {
                    let (o, l) = attend(&s[a..b], &v[a..b]);
                    ([o], l)
                }
            })
            .collect();
        let mut out = [0.0f32];
        let lse = combine(parts.iter().map(|(o, l)| (&o[..], *l)), &mut out);
        assert!((out[0] - want).abs() < 1e-5 && (lse - want_lse).abs() < 1e-5);
        let (mut o, mut l) = ([0.0f32], f32::NEG_INFINITY);
        for (ob, lb) in &parts {
            merge_pair(&mut o, &mut l, ob, *lb);
        }
        assert!((o[0] - want).abs() < 1e-5 && (l - want_lse).abs() < 1e-5);
    }

    #[test]
    fn nothing_visible_gives_zero() {
        let mut out = [5.0f32; 2];
        let lse = combine(
            std::iter::once((&[1.0f32, 1.0][..], f32::NEG_INFINITY)),
            &mut out,
        );
        assert_eq!((out, lse), ([0.0; 2], f32::NEG_INFINITY));
    }
}
