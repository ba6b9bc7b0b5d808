//! `io.md` and the checks of the blog's FlashAttention IO claim (Transformers Inference
//! Optimization Toolset, "FlashAttention"; Dao et al. 2022, Theorem 2; REPRODUCTION.md 1.4
//! and 2.4), from the counted rows of `io.csv`, each PASS/FAIL: (1) standard attention moves
//! exactly 4L² + 4Ld elements, Θ(Ld + L²); (2) the blog's FlashAttention exactly
//! L(d+2) + 2Ld + ⌈L/B_KV⌉·L·(3d+4); (3) that is Θ(L²d²/M): count/(L²d²/M) within
//! [`THETA_BOUNDS`] wherever d ≤ M ≤ Ld; (4) it halves when M doubles (within
//! [`HALVING_TOL`]); (5) it moves fewer elements than the standard order exactly where
//! M > d(3d + 4); (6) the `flash` kernel's own schedule moves 2Ld + 2⌈L/B_r⌉·Ld. The
//! expressions are derived by hand from the loops (docs/papers.md); the counts come from
//! iterating them. A check without its rows says so (n/a). O(rows²) (each row finds its
//! partners by scanning).

use std::fmt::Write;

use crate::report::checks::Check;
use crate::report::claims::markdown;
use crate::report::series::distinct;
use crate::results::hbm_io::{IoRow, FLASH1, FLASH2, STANDARD};

pub const MARKDOWN: &str = "io.md";

/// Bounds on count / (L²d²/M) of the blog's FlashAttention where d ≤ M ≤ Ld. The leading
/// term is 12 = 4 (B_KV = M/4d, so ⌈L/B_KV⌉ ≈ 4Ld/M outer steps) × 3 (each inner step
/// reads Q_i and O_i and writes O_i, B_Q·d each); the lower-order terms (the L(3d+2) of the
/// initialization and the K, V reads, and ℓ, m: 4 per row and step) add at most
/// (3d+2)M/(Ld²) + 16/d + the ceiling's (3d+4)M/(Ld²), under 4 for M ≤ Ld and d ≥ 64.
pub const THETA_BOUNDS: (f64, f64) = (12.0, 16.0);
/// count(M) / count(2M) must be within this fraction of 2 ...
pub const HALVING_TOL: f64 = 0.05;
/// ... where the loop at 2M still makes at least this many outer (K/V) steps: below that,
/// the L(3d+2) elements that do not depend on M weigh more than the tolerance (with T outer
/// steps at 2M the ratio is about (1 + 2T)/(1 + T), 1.94 at T = 16).
pub const HALVING_MIN_STEPS: usize = 16;

fn of<'a>(rows: &'a [IoRow], order: &'a str) -> impl Iterator<Item = &'a IoRow> {
    rows.iter().filter(move |r| r.order == order)
}

fn standard_of(rows: &[IoRow], l: usize, d: usize) -> Option<&IoRow> {
    of(rows, STANDARD).find(|r| r.seq_len == l && r.head_dim == d)
}

/// 4L² + 4Ld: Algorithm 0 reads Q, K (2Ld), writes S (L²), reads S and writes P (2L²),
/// reads P and V (L² + Ld), writes O (Ld).
pub fn standard_expr(l: usize, d: usize) -> u64 {
    let (l, d) = (l as u64, d as u64);
    4 * l * l + 4 * l * d
}

/// L(d+2) + 2Ld + ⌈L/B_KV⌉·L·(3d+4): O, ℓ, m initialized; K and V read once; per outer
/// step every Q_i and O_i read and O_i written (3Ld), ℓ_i and m_i read and written (4L).
pub fn flash1_expr(l: usize, d: usize, b_kv: usize) -> u64 {
    let (t, l, d) = (l.div_ceil(b_kv) as u64, l as u64, d as u64);
    l * (d + 2) + 2 * l * d + t * l * (3 * d + 4)
}

/// 2Ld + 2⌈L/B_r⌉·Ld: Q read and O written once, K and V read once per query block.
pub fn flash2_expr(l: usize, d: usize, b_q: usize) -> u64 {
    let (t, l, d) = (l.div_ceil(b_q) as u64, l as u64, d as u64);
    2 * l * d + 2 * t * l * d
}

/// L²d²/M, the blog's bound without its constant.
fn theta(r: &IoRow, m: usize) -> f64 {
    let (l, d) = (r.seq_len as f64, r.head_dim as f64);
    l * l * d * d / m as f64
}

/// d ≤ M ≤ Ld, where the blog states the bound.
fn in_domain(r: &IoRow, m: usize) -> bool {
    r.head_dim <= m && m <= r.seq_len * r.head_dim
}

/// The blog's FlashAttention rows with their M.
fn flash1(rows: &[IoRow]) -> impl Iterator<Item = (&IoRow, usize)> {
    of(rows, FLASH1).filter_map(|r| r.sram_elements.map(|m| (r, m)))
}

/// M above which the tiled order moves fewer elements than the standard one as L grows:
/// ⌈L/B_KV⌉·L·(3d+4) < 4L² once B_KV = M/4d > (3d+4)/4.
pub fn crossing(d: usize) -> usize {
    d * (3 * d + 4)
}

fn check_standard(rows: &[IoRow]) -> Check {
    let c = Check::new(
        "standard attention's HBM accesses (Algorithm 0: S and P through HBM), counted",
        "Θ(Ld + L²); pass: counted = 4L² + 4Ld (derived from the loop) at every (L, d)",
    );
    let got: Vec<&IoRow> = of(rows, STANDARD).collect();
    let Some(last) = got.last() else {
        return c.missing("no standard rows".into());
    };
    let pass = got
        .iter()
        .all(|r| r.total() == standard_expr(r.seq_len, r.head_dim));
    let (lo, hi) = got.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), r| {
        let x = r.total() as f64 / (r.seq_len * (r.seq_len + r.head_dim)) as f64;
        (lo.min(x), hi.max(x))
    });
    c.judged(
        format!(
            "{} (L, d) of {}..{} × {:?}: counted / (Ld + L²) in [{lo:.3}, {hi:.3}]; L = {}, d = {}: {} (4L² + 4Ld = {})",
            got.len(),
            got.iter().map(|r| r.seq_len).min().unwrap_or(0),
            got.iter().map(|r| r.seq_len).max().unwrap_or(0),
            dims(rows),
            last.seq_len,
            last.head_dim,
            last.total(),
            standard_expr(last.seq_len, last.head_dim)
        ),
        pass,
    )
}

fn dims(rows: &[IoRow]) -> Vec<usize> {
    distinct(rows.iter().map(|r| r.head_dim))
}

fn check_flash1_exact(rows: &[IoRow]) -> Check {
    let c = Check::new(
        "the blog's FlashAttention (K/V blocks outside, Q blocks inside) HBM accesses, counted",
        "B_KV = ⌈M/4d⌉, B_Q = min(B_KV, d); pass: counted = L(d+2) + 2Ld + ⌈L/B_KV⌉·L·(3d+4) (derived from the loop) at every (L, d, M)",
    );
    let got: Vec<(&IoRow, usize)> = flash1(rows).collect();
    if got.is_empty() {
        return c.missing("no flash1 rows".into());
    }
    let bad: Vec<String> = got
        .iter()
        .filter(|(r, _)| r.total() != flash1_expr(r.seq_len, r.head_dim, r.b_kv))
        .map(|(r, m)| format!("L={} d={} M={m}: {}", r.seq_len, r.head_dim, r.total()))
        .collect();
    let ours = if bad.is_empty() {
        format!("equal at all {} (L, d, M)", got.len())
    } else {
        format!("{} of {} differ: {}", bad.len(), got.len(), bad.join("; "))
    };
    c.judged(ours, bad.is_empty())
}

fn check_theta(rows: &[IoRow]) -> Check {
    let (lo, hi) = THETA_BOUNDS;
    let c = Check::new(
        "the blog's FlashAttention HBM accesses are Θ(L²d²/M) for d ≤ M ≤ Ld",
        format!(
            "O(L²d²/M) against Θ(Ld + L²); pass: counted / (L²d²/M) within [{lo}, {hi}] at every (L, d, M) with d ≤ M ≤ Ld (12 = 4 outer steps per Ld/M × 3 accesses of B_Q·d per inner step)"
        ),
    );
    let got: Vec<(&IoRow, f64)> = flash1(rows)
        .filter(|(r, m)| in_domain(r, *m))
        .map(|(r, m)| (r, r.total() as f64 / theta(r, m)))
        .collect();
    if got.is_empty() {
        return c.missing("no flash1 rows with d ≤ M ≤ Ld".into());
    }
    let at = |f: fn(f64, f64) -> bool| {
        got.iter()
            .copied()
            .reduce(|a, b| if f(b.1, a.1) { b } else { a })
            .map(|(r, x)| {
                format!(
                    "{x:.2} (L={} d={} M={})",
                    r.seq_len,
                    r.head_dim,
                    r.sram_elements.unwrap_or(0)
                )
            })
            .unwrap_or_default()
    };
    let pass = got.iter().all(|(_, x)| (lo..=hi).contains(x));
    c.judged(
        format!(
            "{} points: min {}, max {}",
            got.len(),
            at(|a, b| a < b),
            at(|a, b| a > b)
        ),
        pass,
    )
}

fn check_halving(rows: &[IoRow]) -> Check {
    let c = Check::new(
        "the blog's FlashAttention HBM accesses halve when M doubles",
        format!(
            "∝ 1/M; pass: counted(M) / counted(2M) within {:.0}% of 2 wherever the loop at 2M makes ≥ {HALVING_MIN_STEPS} K/V steps",
            HALVING_TOL * 100.0
        ),
    );
    let mut ratios = Vec::new();
    for (r, m) in flash1(rows) {
        let Some((r2, _)) = flash1(rows)
            .find(|(x, m2)| x.seq_len == r.seq_len && x.head_dim == r.head_dim && *m2 == 2 * m)
        else {
            continue;
        };
        if r2.seq_len.div_ceil(r2.b_kv) < HALVING_MIN_STEPS {
            continue;
        }
        ratios.push((r.total() as f64 / r2.total() as f64, r, m));
    }
    if ratios.is_empty() {
        return c.missing("no (M, 2M) pairs with enough K/V steps".into());
    }
    let pass = ratios
        .iter()
        .all(|(x, _, _)| (x / 2.0 - 1.0).abs() <= HALVING_TOL);
    let show = |p: &(f64, &IoRow, usize)| {
        format!(
            "{:.3} (L={} d={} M={}→{})",
            p.0,
            p.1.seq_len,
            p.1.head_dim,
            p.2,
            2 * p.2
        )
    };
    let min = ratios.iter().min_by(|a, b| a.0.total_cmp(&b.0));
    let max = ratios.iter().max_by(|a, b| a.0.total_cmp(&b.0));
    c.judged(
        format!(
            "{} pairs: min {}, max {}",
            ratios.len(),
            min.map(show).unwrap_or_default(),
            max.map(show).unwrap_or_default()
        ),
        pass,
    )
}

fn check_crossing(rows: &[IoRow]) -> Check {
    let c = Check::new(
        "the tiled order moves fewer HBM elements than the standard one",
        "sub-quadratic in L against Θ(L²); counted: fewer exactly where M > d(3d+4) ≈ 3d² (⌈L/B_KV⌉·(3d+4) < 4L), not from M > d; pass: that at every (L, d, M)",
    );
    let mut pass = true;
    let mut n = 0;
    let mut parts = Vec::new();
    for d in dims(rows) {
        let (mut more_to, mut fewer_from) = (0usize, usize::MAX);
        for (r, m) in flash1(rows).filter(|(r, _)| r.head_dim == d) {
            let Some(s) = standard_of(rows, r.seq_len, d) else {
                continue;
            };
            n += 1;
            let fewer = r.total() < s.total();
            pass &= fewer == (m > crossing(d));
            if fewer {
                fewer_from = fewer_from.min(m);
            } else {
                more_to = more_to.max(m);
            }
        }
        parts.push(format!(
            "d={d}: more up to M = {}, fewer from M = {} (d(3d+4) = {})",
            more_to,
            if fewer_from == usize::MAX {
                "none".to_string()
            } else {
                fewer_from.to_string()
            },
            crossing(d)
        ));
    }
    if n == 0 {
        return c.missing("no flash1 rows with their standard row".into());
    }
    c.judged(format!("{n} points; {}", parts.join("; ")), pass)
}

fn check_kernel(rows: &[IoRow]) -> Check {
    let c = Check::new(
        "the flash kernel's FlashAttention-2 order (its own tiles) HBM accesses, counted",
        "Q read and O written once, K and V once per query block; pass: counted = 2Ld + 2⌈L/B_r⌉·Ld at every (L, d)",
    );
    let got: Vec<&IoRow> = of(rows, FLASH2).collect();
    if got.is_empty() {
        return c.missing("no flash2-kernel rows".into());
    }
    let pass = got
        .iter()
        .all(|r| r.total() == flash2_expr(r.seq_len, r.head_dim, r.b_q));
    let longest = got.iter().map(|r| r.seq_len).max().unwrap_or(0);
    let parts: Vec<String> = got
        .iter()
        .filter(|r| r.seq_len == longest)
        .filter_map(|r| {
            standard_of(rows, r.seq_len, r.head_dim).map(|s| {
                format!(
                    "d={}: {:.3} of standard (B_r = {}, B_c = {})",
                    r.head_dim,
                    r.total() as f64 / s.total() as f64,
                    r.b_q,
                    r.b_kv
                )
            })
        })
        .collect();
    c.judged(
        format!(
            "{} (L, d); at L = {longest}: {} (→ d/2B_r as L grows)",
            got.len(),
            parts.join(", ")
        ),
        pass,
    )
}

/// Every check of the IO claim, in the order of the module doc.
pub fn checks(rows: &[IoRow]) -> Vec<Check> {
    vec![
        check_standard(rows),
        check_flash1_exact(rows),
        check_theta(rows),
        check_halving(rows),
        check_crossing(rows),
        check_kernel(rows),
    ]
}

/// `io.md`: the counts beside their expressions and the blog's bounds, then the checks.
pub fn render(rows: &[IoRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# FlashAttention IO: elements moved between HBM and SRAM, counted (Transformers Inference Optimization Toolset)\n\n\
         The blog: FlashAttention makes O(L²d²/M) HBM accesses for d ≤ M ≤ Ld (M: SRAM in \
         elements), standard attention Θ(Ld + L²). Each loop order (`backend::cpu::hbm_io`) \
         iterates its tiles over one head of L queries and keys and counts the elements each \
         tile reads from and writes to HBM; the expressions beside the counts are derived by \
         hand from the same loops (docs/papers.md). Standard attention is the FlashAttention \
         paper's Algorithm 0, each product reading its operands once (its accounting; the \
         count does not depend on M). The blog's FlashAttention uses its block sizes \
         B_KV = ⌈M/4d⌉, B_Q = min(B_KV, d). `flash2-kernel` is the CPU `flash` kernel's \
         FlashAttention-2 schedule with its own tiles (B_r = 64 query rows, B_c = 256 keys, \
         not derived from M).\n"
    );
    let _ = writeln!(
        s,
        "## Standard attention and the flash kernel\n\n\
         | d | L | standard | 4L² + 4Ld | flash2-kernel | 2Ld + 2⌈L/B_r⌉Ld | kernel / standard |\n|---|---|---|---|---|---|---|"
    );
    for r in of(rows, STANDARD) {
        let (l, d) = (r.seq_len, r.head_dim);
        let k = of(rows, FLASH2).find(|k| k.seq_len == l && k.head_dim == d);
        let _ = writeln!(
            s,
            "| {d} | {l} | {} | {} | {} | {} | {} |",
            r.total(),
            standard_expr(l, d),
            k.map_or(String::new(), |k| k.total().to_string()),
            k.map_or(String::new(), |k| flash2_expr(l, d, k.b_q).to_string()),
            k.map_or(String::new(), |k| format!(
                "{:.3}",
                k.total() as f64 / r.total() as f64
            )),
        );
    }
    let _ = writeln!(
        s,
        "\n## The blog's FlashAttention against M\n\n\
         count / (L²d²/M) is the constant of the Θ bound (in bold where d ≤ M ≤ Ld, the \
         blog's range); the last column compares with the standard order at the same (L, d). \
         The tiled order moves fewer elements once M > d(3d+4): {}.\n\n\
         | d | M | B_Q | B_KV | L | counted | L(d+2) + 2Ld + ⌈L/B_KV⌉L(3d+4) | L²d²/M | count / (L²d²/M) | tiled / standard |\n|---|---|---|---|---|---|---|---|---|---|",
        dims(rows)
            .iter()
            .map(|&d| format!("{} at d = {d}", crossing(d)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut by_m: Vec<(&IoRow, usize)> = flash1(rows).collect();
    by_m.sort_by_key(|(r, m)| (r.head_dim, *m, r.seq_len));
    for (r, m) in by_m {
        let (l, d) = (r.seq_len, r.head_dim);
        let x = r.total() as f64 / theta(r, m);
        let x = if in_domain(r, m) {
            format!("**{x:.2}**")
        } else {
            format!("{x:.2}")
        };
        let _ = writeln!(
            s,
            "| {d} | {m} | {} | {} | {l} | {} | {} | {:.4e} | {x} | {} |",
            r.b_q,
            r.b_kv,
            r.total(),
            flash1_expr(l, d, r.b_kv),
            theta(r, m),
            standard_of(rows, l, d).map_or(String::new(), |st| format!(
                "{:.3}",
                r.total() as f64 / st.total() as f64
            )),
        );
    }
    let _ = writeln!(s, "\n## Checks\n\n{}", markdown(&checks(rows)));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::checks::Verdict;

    fn row(order: &str, l: usize, d: usize, m: Option<usize>, b: (usize, usize), t: u64) -> IoRow {
        IoRow {
            order: order.into(),
            seq_len: l,
            head_dim: d,
            sram_elements: m,
            b_q: b.0,
            b_kv: b.1,
            reads: t,
            writes: 0,
        }
    }

    #[test]
    fn expressions_by_hand() {
        // L = 5, d = 3: 100 + 60. L = 5, d = 2, B_KV = 3: 20 + 20 + 2·5·10 = 140.
        // L = 10, d = 4, B_r = 4: 80 + 2·3·40 = 320.
        assert_eq!(standard_expr(5, 3), 160);
        assert_eq!(flash1_expr(5, 2, 3), 140);
        assert_eq!(flash2_expr(10, 4, 4), 320);
        assert_eq!(crossing(64), 12544);
        assert_eq!(crossing(128), 49664);
    }

    #[test]
    fn without_rows_every_check_says_so() {
        let c = checks(&[]);
        assert!(
            c.iter().all(|k| k.verdict == Verdict::NotApplicable),
            "{c:?}"
        );
    }

    use crate::backend::cpu::hbm_io::{Moved, Tensor, Traffic};

    /// A loop order mutated from outside: each read of `on` also reads `extra`.
    struct Also {
        moved: Moved,
        on: Tensor,
        extra: Vec<(Tensor, usize)>,
    }

    impl Traffic for Also {
        fn read(&mut self, t: Tensor, n: usize) {
            self.moved.read(t, n);
            if t == self.on {
                for &(e, k) in &self.extra {
                    self.moved.read(e, k);
                }
            }
        }
        fn write(&mut self, t: Tensor, n: usize) {
            self.moved.write(t, n);
        }
    }

    #[test]
    fn the_counted_grid_passes_and_a_mutated_loop_fails() {
        use crate::backend::cpu::hbm_io::{flash1, standard};
        let rows = crate::run::hbm_io::count();
        let c = checks(&rows);
        for k in &c {
            assert_eq!(k.verdict, Verdict::Pass, "{k:?}");
        }
        // Standard attention that reads all of K again with every Q block.
        let mut mutated = rows.clone();
        for r in mutated.iter_mut().filter(|r| r.order == STANDARD) {
            let (l, d) = (r.seq_len, r.head_dim);
            let mut a = Also {
                moved: Moved::default(),
                on: Tensor::Q,
                extra: vec![(Tensor::K, l * d)],
            };
            standard(&mut a, l, d, r.b_q);
            r.reads = a.moved.reads;
        }
        let c = checks(&mutated);
        assert_eq!(c[0].verdict, Verdict::Fail, "{:?}", c[0]);
        // The blog's FlashAttention that reads K_j and V_j again with every Q_i: no longer
        // Θ(L²d²/M) (2L²d/B_Q more), nor its expression.
        let mut mutated = rows.clone();
        for r in mutated.iter_mut().filter(|r| r.order == FLASH1) {
            let (l, d) = (r.seq_len, r.head_dim);
            let mut a = Also {
                moved: Moved::default(),
                on: Tensor::Q,
                extra: vec![
                    (Tensor::K, r.b_kv.min(l) * d),
                    (Tensor::V, r.b_kv.min(l) * d),
                ],
            };
            flash1(&mut a, l, d, (r.b_q, r.b_kv));
            r.reads = a.moved.reads;
        }
        let c = checks(&mutated);
        assert_eq!(c[0].verdict, Verdict::Pass);
        assert_eq!(c[1].verdict, Verdict::Fail, "{:?}", c[1]);
        assert_eq!(c[2].verdict, Verdict::Fail, "{:?}", c[2]);
        eprintln!("{}", render(&rows));
    }

    #[test]
    fn a_count_that_is_not_theta_fails() {
        // Rows of a (wrong) tiled order whose traffic does not fall with M: 4L² at every
        // M. Θ, halving and the crossing fail; the exact check fails too.
        let mut rows = Vec::new();
        for l in [1usize << 12, 1 << 14] {
            rows.push(row(STANDARD, l, 64, None, (64, 64), standard_expr(l, 64)));
            for m in [1usize << 13, 1 << 14, 1 << 15] {
                let b = (64, m / 256);
                rows.push(row(FLASH1, l, 64, Some(m), b, 4 * (l * l) as u64));
            }
        }
        let c = checks(&rows);
        assert_eq!(c[0].verdict, Verdict::Pass, "{:?}", c[0]);
        for k in &c[1..5] {
            assert_eq!(k.verdict, Verdict::Fail, "{k:?}");
        }
        assert_eq!(c[5].verdict, Verdict::NotApplicable);
    }
}
