//! `softmax.md` and the checks of the blog's softmax claims (Transformers Inference
//! Optimization Toolset, "Online softmax"; REPRODUCTION.md 1.4), from the rows of
//! `softmax.csv`: (1) unfused L×L softmax moves 5L²+2L floats (the blog says 5L²+L) against
//! 2L² fused, (2) safe softmax 4 accesses per element, naive and online 3, (3) naive
//! overflows at x = 89 in f32 and bf16 where safe and online stay finite and correct, each
//! PASS/FAIL; (4) the TPU-v3 timings as a TREND (our ratios beside theirs). A check without
//! its rows says so (n/a). O(rows).

use std::fmt::Write;

use crate::report::checks::Check;
use crate::report::series::distinct;
use crate::results::softmax::{SoftmaxRow, MATRIX, OVERFLOW, VECTOR};

pub const MARKDOWN: &str = "softmax.md";

/// The blog's TPU-v3 %timeit figures, 1M uniform f32: (algorithm, mean µs, std µs).
pub const PAPER_US: [(&str, f64, f64); 3] = [
    ("naive", 194.0, 15.4),
    ("safe", 254.0, 17.8),
    ("online", 199.0, 22.3),
];
/// Accesses per element the blog states: (algorithm, loads, stores).
pub const PAPER_ACCESSES: [(&str, u64, u64); 3] =
    [("naive", 2, 1), ("safe", 3, 1), ("online", 2, 1)];
/// Largest relative error |y - w| / w (w = softmax_f64(x)) of a finite output that counts as
/// correct: 256 · 2^-23 ≈ 3.1e-5, the worst case of one 256-term f32 partial sum
/// (`backend::cpu::softmax_passes::BLOCK`), the largest error source. Why that bound: beside
/// an output of 1, terms of e^-17 are under half an ulp, so the partial sum holding the
/// largest input drops them (measured: 4.5e-6 at x = 88).
pub const OVERFLOW_TOL: f64 = 256.0 * f32::EPSILON as f64;

fn paper_us(alg: &str) -> Option<(f64, f64)> {
    PAPER_US.iter().find(|p| p.0 == alg).map(|p| (p.1, p.2))
}

fn of_kind<'a>(rows: &'a [SoftmaxRow], kind: &'a str) -> impl Iterator<Item = &'a SoftmaxRow> {
    rows.iter().filter(move |r| r.kind == kind)
}

fn find<'a>(
    rows: &'a [SoftmaxRow],
    kind: &str,
    alg: &str,
    length: usize,
) -> Option<&'a SoftmaxRow> {
    rows.iter()
        .find(|r| r.kind == kind && r.algorithm == alg && r.length == length)
}

/// The timed lengths, ascending.
fn lengths(rows: &[SoftmaxRow]) -> Vec<usize> {
    distinct(of_kind(rows, VECTOR).map(|r| r.length))
}

fn claim1(rows: &[SoftmaxRow]) -> Check {
    let c = Check::new(
        "unfused L×L softmax traffic against fused (counted floats moved)",
        "5L²+L unfused (its itemised steps sum to 5L²+2L) vs 2L² fused; pass: counted = 5L²+2L and 2L²",
    );
    let sides = distinct(of_kind(rows, MATRIX).map(|r| r.length));
    let mut parts = Vec::new();
    let mut pass = !sides.is_empty();
    for l in sides {
        let (l2, l1) = ((l * l) as u64, l as u64);
        let moved = |a: &str| find(rows, MATRIX, a, l).map(|r| r.loads + r.stores);
        let (u, f) = (moved("unfused"), moved("fused"));
        pass &= u == Some(5 * l2 + 2 * l1) && f == Some(2 * l2);
        let show = |v: Option<u64>| v.map_or("missing".into(), |v| v.to_string());
        parts.push(format!(
            "L={l}: unfused {} (5L²+2L = {}, blog's 5L²+L = {}), fused {} (2L² = {})",
            show(u),
            5 * l2 + 2 * l1,
            5 * l2 + l1,
            show(f),
            2 * l2
        ));
    }
    if parts.is_empty() {
        return c.missing("no matrix rows".into());
    }
    c.judged(parts.join("; "), pass)
}

fn claim2(rows: &[SoftmaxRow]) -> Vec<Check> {
    PAPER_ACCESSES
        .iter()
        .map(|&(alg, loads, stores)| {
            let c = Check::new(
                format!("{alg} softmax memory accesses per element"),
                format!("{} ({loads} loads, {stores} store)", loads + stores),
            );
            let got: Vec<&SoftmaxRow> = of_kind(rows, VECTOR)
                .filter(|r| r.algorithm == alg)
                .collect();
            if got.is_empty() {
                return c.missing(format!("no {alg} vector rows"));
            }
            let pass = got
                .iter()
                .all(|r| r.loads == loads * r.elements && r.stores == stores * r.elements);
            let ours = got
                .iter()
                .map(|r| format!("n={}: {} loads, {} stores", r.length, r.loads, r.stores))
                .collect::<Vec<_>>()
                .join("; ");
            c.judged(ours, pass)
        })
        .collect()
}

fn claim3(rows: &[SoftmaxRow]) -> Vec<Check> {
    ["f32", "bf16"]
        .iter()
        .map(|&dtype| {
            let c = Check::new(
                format!("naive softmax overflows for x ≥ 89, {dtype} inputs (computed in f32)"),
                format!(
                    "naive inf/NaN at 89, finite at 88; safe and online finite and within {OVERFLOW_TOL:.1e} relative of f64 at both"
                ),
            );
            let got: Vec<&SoftmaxRow> = of_kind(rows, OVERFLOW).filter(|r| r.dtype == dtype).collect();
            if got.is_empty() {
                return c.missing(format!("no {dtype} overflow rows"));
            }
            let mut pass = ["naive", "safe", "online"]
                .iter()
                .all(|a| got.iter().filter(|r| r.algorithm == *a).count() >= 2);
            let mut parts = Vec::new();
            for r in &got {
                let x = r.x_max.unwrap_or(f64::NAN);
                let finite = r.finite == Some(true);
                let want_finite = r.algorithm != "naive" || x < 89.0;
                let correct = r.max_rel_err.is_some_and(|e| e <= OVERFLOW_TOL);
                pass &= finite == want_finite && (!want_finite || correct);
                parts.push(format!(
                    "{} at {x}: {}",
                    r.algorithm,
                    match r.max_rel_err {
                        Some(e) if finite => format!("finite, rel err {e:.1e}"),
                        _ => "inf/NaN".into(),
                    }
                ));
            }
            c.judged(parts.join("; "), pass)
        })
        .collect()
}

/// (safe/naive, online/naive) of the medians at `n`.
pub fn ratios(rows: &[SoftmaxRow], n: usize) -> Option<(f64, f64)> {
    let t = |a: &str| find(rows, VECTOR, a, n).and_then(|r| r.median_s);
    let (naive, safe, online) = (t("naive")?, t("safe")?, t("online")?);
    Some((safe / naive, online / naive))
}

fn claim4(rows: &[SoftmaxRow]) -> Check {
    let c = Check::new(
        "time of safe and online softmax against naive (1M uniform f32)",
        "TPU-v3: naive 194 ± 15.4 µs, safe 254 ± 17.8 µs, online 199 ± 22.3 µs: safe/naive 1.31 (≈ 4/3 accesses), online/naive 1.03",
    );
    let parts: Vec<String> = lengths(rows)
        .into_iter()
        .filter_map(|n| {
            ratios(rows, n).map(|(s, o)| format!("n={n}: safe/naive {s:.2}, online/naive {o:.2}"))
        })
        .collect();
    if parts.is_empty() {
        return c.missing("no timed vector rows".into());
    }
    c.trend(format!("{} (CPU, one thread)", parts.join("; ")))
}

/// Every check of the blog's softmax claims, in the order of the blog.
pub fn checks(rows: &[SoftmaxRow]) -> Vec<Check> {
    let mut v = vec![claim1(rows)];
    v.extend(claim2(rows));
    v.extend(claim3(rows));
    v.push(claim4(rows));
    v
}

/// `softmax.md`: the timings and counts beside the blog's figures, then the checks.
pub fn render(rows: &[SoftmaxRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Softmax: naive, safe, online (Transformers Inference Optimization Toolset)\n\n\
         One uniform [0, 1) f32 vector per length, the three algorithms timed in interleaved \
         rounds (seeded random order per round) on one thread; median per algorithm. Loads and \
         stores are counted by the same code that is timed. The blog's figures are TPU-v3 \
         %timeit means at n = 1,000,000. Here each exp is a scalar libm call (naive and safe \
         make 2 per element, online 3: the rescale), so the times follow the exp count more \
         than the memory accesses; a trend only.\n"
    );
    let _ = writeln!(
        s,
        "| n | algorithm | loads/elem | stores/elem | median | calls | GB/s | blog (TPU-v3) |\n|---|---|---|---|---|---|---|---|"
    );
    for n in lengths(rows) {
        for r in of_kind(rows, VECTOR).filter(|r| r.length == n) {
            let per = |v: u64| v as f64 / r.elements.max(1) as f64;
            let blog = match paper_us(&r.algorithm) {
                Some((m, sd)) if n == 1_000_000 => format!("{m} ± {sd} µs"),
                _ => String::new(),
            };
            let _ = writeln!(
                s,
                "| {n} | {} | {} | {} | {} | {} | {} | {blog} |",
                r.algorithm,
                per(r.loads),
                per(r.stores),
                r.median_s
                    .map_or(String::new(), |t| format!("{:.1} µs", t * 1e6)),
                r.calls.map_or(String::new(), |c| c.to_string()),
                r.gb_per_s.map_or(String::new(), |g| format!("{g:.2}")),
            );
        }
    }
    let _ = writeln!(
        s,
        "\n| n | safe/naive | online/naive |\n|---|---|---|\n| blog, 1M (TPU-v3) | {:.2} | {:.2} |",
        254.0 / 194.0,
        199.0 / 194.0
    );
    for n in lengths(rows) {
        if let Some((a, b)) = ratios(rows, n) {
            let _ = writeln!(s, "| {n} | {a:.2} | {b:.2} |");
        }
    }
    let _ = writeln!(
        s,
        "\n## Unfused and fused L×L softmax (counted floats)\n\n| L | algorithm | loads | stores | total | formula |\n|---|---|---|---|---|---|"
    );
    for r in of_kind(rows, MATRIX) {
        let formula = if r.algorithm == "fused" {
            "2L²"
        } else {
            "5L²+2L (blog: 5L²+L)"
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {formula} |",
            r.length,
            r.algorithm,
            r.loads,
            r.stores,
            r.loads + r.stores
        );
    }
    let _ = writeln!(
        s,
        "\n## Overflow (one input at x_max, the rest 70 + uniform [0, 1); bf16 = inputs rounded to bf16, computed in f32)\n\n| dtype | x_max | algorithm | finite | max rel err vs f64 |\n|---|---|---|---|---|"
    );
    for r in of_kind(rows, OVERFLOW) {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} |",
            r.dtype,
            r.x_max.map_or(String::new(), |x| x.to_string()),
            r.algorithm,
            r.finite.map_or(String::new(), |f| f.to_string()),
            r.max_rel_err.map_or(String::new(), |e| format!("{e:.1e}")),
        );
    }
    let _ = writeln!(
        s,
        "\n## Checks\n\n| check | blog | ours | verdict |\n|---|---|---|---|"
    );
    for c in checks(rows) {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            c.name, c.paper, c.ours, c.verdict
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::checks::Verdict;

    fn counted(
        kind: &str,
        alg: &str,
        dtype: &str,
        length: usize,
        elements: u64,
        loads: u64,
        stores: u64,
    ) -> SoftmaxRow {
        let mut r = SoftmaxRow::counted(kind, alg, dtype, length, elements);
        r.loads = loads;
        r.stores = stores;
        r
    }

    /// Rows as a correct measurement would give them.
    fn good() -> Vec<SoftmaxRow> {
        let mut rows = Vec::new();
        for l in [1usize, 7] {
            let (l2, l1) = ((l * l) as u64, l as u64);
            rows.push(counted(
                MATRIX,
                "unfused",
                "f32",
                l,
                l2,
                3 * l2 + l1,
                2 * l2 + l1,
            ));
            rows.push(counted(MATRIX, "fused", "f32", l, l2, l2, l2));
        }
        for dtype in ["f32", "bf16"] {
            for x in [88.0, 89.0] {
                for alg in ["naive", "safe", "online"] {
                    let mut r = counted(OVERFLOW, alg, dtype, 4096, 4096, 0, 0);
                    let finite = alg != "naive" || x < 89.0;
                    r.x_max = Some(x);
                    r.finite = Some(finite);
                    r.max_rel_err = finite.then_some(3e-8);
                    rows.push(r);
                }
            }
        }
        for n in [1000usize, 1001] {
            for (alg, loads, t) in [("naive", 2, 1.0), ("safe", 3, 1.4), ("online", 2, 1.5)] {
                let mut r = counted(VECTOR, alg, "f32", n, n as u64, loads * n as u64, n as u64);
                r.median_s = Some(t * 1e-3);
                rows.push(r);
            }
        }
        rows
    }

    #[test]
    fn correct_rows_pass_and_a_doctored_row_fails() {
        let rows = good();
        let c = checks(&rows);
        assert_eq!(c.len(), 1 + 3 + 2 + 1);
        for k in &c[..6] {
            assert_eq!(k.verdict, Verdict::Pass, "{k:?}");
        }
        assert_eq!(c[6].verdict, Verdict::Trend);
        assert!(c[6].ours.contains("safe/naive 1.40"), "{}", c[6].ours);
        // Each doctored figure fails its own check only.
        let doctor = |i: usize, f: &dyn Fn(&mut SoftmaxRow), failing: usize| {
            let mut rows = good();
            f(&mut rows[i]);
            let c = checks(&rows);
            for (j, k) in c.iter().enumerate().take(6) {
                let want = if j == failing {
                    Verdict::Fail
                } else {
                    Verdict::Pass
                };
                assert_eq!(k.verdict, want, "row {i}, check {j}: {k:?}");
            }
        };
        doctor(0, &|r| r.loads -= 1, 0); // unfused L=1 one float short (the blog's 5L²+L)
        doctor(3, &|r| r.stores += 1, 0); // fused L=7
        let safe_1001 = rows
            .iter()
            .position(|r| r.kind == VECTOR && r.algorithm == "safe" && r.length == 1001)
            .unwrap();
        doctor(safe_1001, &|r| r.loads -= 1, 2);
        let naive_89 = rows
            .iter()
            .position(|r| {
                r.kind == OVERFLOW
                    && r.dtype == "bf16"
                    && r.algorithm == "naive"
                    && r.x_max == Some(89.0)
            })
            .unwrap();
        doctor(
            naive_89,
            &|r| {
                r.finite = Some(true);
                r.max_rel_err = Some(0.0)
            },
            5,
        );
        let online_88 = rows
            .iter()
            .position(|r| {
                r.kind == OVERFLOW
                    && r.dtype == "f32"
                    && r.algorithm == "online"
                    && r.x_max == Some(88.0)
            })
            .unwrap();
        doctor(online_88, &|r| r.max_rel_err = Some(1e-3), 4);
    }

    #[test]
    fn without_rows_every_check_says_so() {
        let c = checks(&[]);
        assert!(
            c.iter().all(|k| k.verdict == Verdict::NotApplicable),
            "{c:?}"
        );
        assert!(render(&good()).contains("| 1000 | 1.40 | 1.50 |"));
    }
}
