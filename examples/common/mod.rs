//! What the tuning examples (`kbench`, `pass_rows`, `scaling`) share: the case they time,
//! from the positional arguments `variant n heads d dtype causal threads`, and the
//! quantiles they print.

#![allow(dead_code)] // each example uses part of it

use attnbench::problem::VariantId;
use attnbench::problem::{Case, DType, Shape};
use attnbench::variant::DefaultCase;

/// Positional argument `i` (1-based, after the program name), or `default`.
pub fn arg(i: usize, default: &str) -> String {
    std::env::args()
        .nth(i)
        .unwrap_or_else(|| default.to_string())
}

/// Positional argument `i` parsed, or `default` parsed; exits with a message naming `what`
/// when it does not parse.
pub fn parse<T: std::str::FromStr>(i: usize, default: &str, what: &str) -> T {
    let s = arg(i, default);
    s.parse().unwrap_or_else(|_| {
        eprintln!("argument {i} ({what}): cannot read '{s}'");
        std::process::exit(2)
    })
}

/// The forward case of arguments 1 to 7 (`variant n heads d dtype causal threads`, causal
/// as 0 or 1), self-attention with batch 1, `defaults` where an argument is missing.
pub fn case(defaults: [&str; 7]) -> Case {
    let variant: VariantId = parse(1, defaults[0], "variant");
    let n: usize = parse(2, defaults[1], "n");
    let heads: usize = parse(3, defaults[2], "heads");
    let d: usize = parse(4, defaults[3], "head dim");
    let dtype: DType = parse(5, defaults[4], "dtype");
    let causal = arg(6, defaults[5]) == "1";
    let threads: usize = parse(7, defaults[6], "threads");
    let base = Case::cpu_fwd(variant, Shape::self_attention(heads, n, d), dtype, threads);
    Case { causal, ..base }
}

/// The `q` quantile of `v` (nearest rank; `v` not empty).
pub fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}
