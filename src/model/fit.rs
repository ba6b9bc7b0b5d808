//! `attnbench model fit`: calibrates the α–β link model (docs/papers.md, Shyam et al.; `topology::Link`)
//! from measured MPI runs. Each counted row gives one rank's communication: `comm_steps`
//! rounds (α each, latency) and `comm_max_device_bytes` bytes (1/β each, bandwidth), against
//! its measured `comm_time_min_s` (the rank that waited least for its peers, so closest to
//! the transfers alone). α and 1/β come from least squares on relative residuals,
//! minimising Σ((α·s + b/β − t)/t)², so that microsecond allreduces and second-long shard
//! rotations weigh alike. Rows moved by the MPI library itself (uncounted) are shown, not
//! fitted. Time O(rows).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::markdown::seconds;
use crate::error::{Error, Result};
use crate::results::record::{Record, Status};

/// One measured row used by the fit.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Point {
    pub variant: String,
    pub allreduce: String,
    pub devices: usize,
    pub seq_kv: usize,
    /// Rounds of the rank's collectives.
    pub steps: u64,
    /// Bytes sent by the busiest rank.
    pub bytes: u64,
    /// Measured communication seconds per call: fastest and slowest rank.
    pub comm_min_s: f64,
    pub comm_max_s: f64,
    /// Measured seconds per call (one decode step).
    pub step_s: f64,
}

/// The fitted link.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Fit {
    pub alpha_s: f64,
    pub beta_bytes_per_s: f64,
    pub points: usize,
    /// Root mean square of (predicted - measured) / measured over the fitted rows.
    pub rms_rel_err: f64,
}

impl Fit {
    pub fn predict(&self, steps: u64, bytes: u64) -> f64 {
        self.alpha_s * steps as f64 + bytes as f64 / self.beta_bytes_per_s
    }
}

/// The counted, measured rows of `records`.
pub fn points(records: &[Record]) -> Vec<Point> {
    records
        .iter()
        .filter(|r| r.status == Status::Ok)
        .filter_map(|r| {
            Some(Point {
                variant: r.variant.clone(),
                allreduce: r.allreduce.clone(),
                devices: r.devices,
                seq_kv: r.seq_kv,
                steps: r.comm_steps?,
                bytes: r.comm_max_device_bytes?,
                comm_min_s: r.comm_time_min_s?,
                comm_max_s: r.comm_time_s?,
                step_s: r.time_median_s?,
            })
        })
        .filter(|p| p.comm_min_s > 0.0)
        .collect()
}

/// Least squares of t ≈ α·s + γ·b on relative residuals; β = 1/γ.
pub fn fit(points: &[Point]) -> Result<Fit> {
    // Normal equations of min Σ w² (α s + γ b − t)², w = 1/t.
    let (mut ss, mut sb, mut bb, mut st, mut bt) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for p in points {
        let w2 = 1.0 / (p.comm_min_s * p.comm_min_s);
        let (s, b, t) = (p.steps as f64, p.bytes as f64, p.comm_min_s);
        ss += w2 * s * s;
        sb += w2 * s * b;
        bb += w2 * b * b;
        st += w2 * s * t;
        bt += w2 * b * t;
    }
    let det = ss * bb - sb * sb;
    if points.len() < 2 || det.abs() <= f64::EPSILON * ss * bb {
        return Err(Error::Runtime(format!(
            "model fit: {} counted rows do not determine both latency and bandwidth (need rows with different steps/bytes ratios, e.g. tree and ring rows)",
            points.len()
        )));
    }
    let alpha = (st * bb - bt * sb) / det;
    let gamma = (ss * bt - sb * st) / det;
    let mut fit = Fit {
        alpha_s: alpha,
        beta_bytes_per_s: 1.0 / gamma,
        points: points.len(),
        rms_rel_err: 0.0,
    };
    let sq: f64 = points
        .iter()
        .map(|p| ((fit.predict(p.steps, p.bytes) - p.comm_min_s) / p.comm_min_s).powi(2))
        .sum();
    fit.rms_rel_err = (sq / points.len() as f64).sqrt();
    Ok(fit)
}

/// Reads the `runs.csv` of every directory, fits, writes `fit.md` and `fit.json` to `out`
/// (when given) and returns the Markdown.
pub fn run(dirs: &[PathBuf], out: Option<&Path>) -> Result<String> {
    let mut records = Vec::new();
    for d in dirs {
        let csv = d.join(crate::results::load::CSV_NAME);
        if !csv.exists() {
            return Err(Error::Input {
                path: csv,
                msg: "no runs.csv here (expected a sweep's results directory)".into(),
            });
        }
        records.extend(crate::results::runs::read(&csv)?);
    }
    let pts = points(&records);
    let f = fit(&pts)?;
    // The same fit on each p alone (oversubscribed ranks share cores, which slows copies).
    let mut ps: Vec<usize> = pts.iter().map(|p| p.devices).collect();
    ps.sort_unstable();
    ps.dedup();
    let per_p: Vec<(usize, Option<Fit>)> = ps
        .iter()
        .map(|&p| {
            let sub: Vec<Point> = pts.iter().filter(|x| x.devices == p).cloned().collect();
            (p, fit(&sub).ok())
        })
        .collect();
    let md = render(&f, &per_p, &pts, &records, dirs);
    if let Some(out) = out {
        std::fs::create_dir_all(out).map_err(|e| Error::Io {
            context: format!("creating {}", out.display()),
            source: e,
        })?;
        let write = |name: &str, text: String| {
            let path = out.join(name);
            std::fs::write(&path, text).map_err(|e| Error::Io {
                context: format!("writing {}", path.display()),
                source: e,
            })
        };
        write("fit.md", md.clone())?;
        let by_p: Vec<_> = per_p
            .iter()
            .map(|(p, f)| serde_json::json!({ "devices": p, "fit": f }))
            .collect();
        let json = serde_json::json!({ "fit": f, "by_devices": by_p, "points": pts });
        write(
            "fit.json",
            serde_json::to_string_pretty(&json).unwrap_or_default() + "\n",
        )?;
    }
    Ok(md)
}

fn render(
    f: &Fit,
    per_p: &[(usize, Option<Fit>)],
    pts: &[Point],
    records: &[Record],
    dirs: &[PathBuf],
) -> String {
    let mut s = String::new();
    let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    let _ = writeln!(s, "# α–β link model fitted to measured MPI runs\n");
    let _ = writeln!(
        s,
        "From `{}` (`attnbench model fit`). Model: T_comm = α · steps + bytes / β per rank \
         (steps = rounds of the rank's collectives, bytes = bytes sent by the busiest rank), \
         fitted to the fastest rank's measured communication time by least squares on \
         relative residuals.\n",
        dirs.join("`, `")
    );
    let _ = writeln!(
        s,
        "| parameter | fitted |\n|---|---|\n| α (latency per round) | {:.2} µs |\n| β (bandwidth) | {:.3} GB/s |\n| rows fitted | {} |\n| rms relative error | {:.1} % |\n",
        f.alpha_s * 1e6,
        f.beta_bytes_per_s / 1e9,
        f.points,
        f.rms_rel_err * 100.0
    );
    let _ = writeln!(
        s,
        "The same fit on each p alone:\n\n| p | α | β | rows | rms relative error |\n|---|---|---|---|---|"
    );
    for (p, fp) in per_p {
        match fp {
            Some(x) => {
                let _ = writeln!(
                    s,
                    "| {p} | {:.2} µs | {:.3} GB/s | {} | {:.1} % |",
                    x.alpha_s * 1e6,
                    x.beta_bytes_per_s / 1e9,
                    x.points,
                    x.rms_rel_err * 100.0
                );
            }
            None => {
                let _ = writeln!(s, "| {p} | - | - | - | too few distinct rows |");
            }
        }
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "## Predicted vs measured communication per decode step\n"
    );
    let _ = writeln!(
        s,
        "| variant | allreduce | p | N | steps | bytes/rank | measured (fastest rank) | measured (slowest) | predicted | predicted/measured |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    for p in pts {
        let pred = f.predict(p.steps, p.bytes);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} |",
            p.variant,
            if p.allreduce.is_empty() {
                "-"
            } else {
                &p.allreduce
            },
            p.devices,
            p.seq_kv,
            p.steps,
            p.bytes,
            seconds(p.comm_min_s),
            seconds(p.comm_max_s),
            seconds(pred),
            pred / p.comm_min_s
        );
    }
    let _ = writeln!(s, "\n## Time per decode step (measured)\n");
    let _ = writeln!(
        s,
        "| variant | allreduce | p | N | time per step (median) | communication (slowest rank) | max rel err |\n|---|---|---|---|---|---|---|"
    );
    for r in records.iter().filter(|r| r.status == Status::Ok) {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.variant,
            if r.allreduce.is_empty() {
                "-"
            } else {
                &r.allreduce
            },
            r.devices,
            r.seq_kv,
            r.time_median_s.map_or("-".into(), seconds),
            r.comm_time_s.map_or("-".into(), seconds),
            r.max_rel_err.map_or("-".into(), |e| format!("{e:.1e}"))
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(steps: u64, bytes: u64, t: f64) -> Point {
        Point {
            variant: "x".into(),
            allreduce: String::new(),
            devices: 2,
            seq_kv: 1,
            steps,
            bytes,
            comm_min_s: t,
            comm_max_s: t,
            step_s: t,
        }
    }

    #[test]
    fn recovers_alpha_and_beta_from_exact_points() {
        let (alpha, beta) = (3e-6, 5e9);
        let pts: Vec<Point> = [(2, 1_000), (7, 50_000), (3, 500_000_000), (1, 64)]
            .iter()
            .map(|&(s, b)| point(s, b, alpha * s as f64 + b as f64 / beta))
            .collect();
        let f = fit(&pts).unwrap();
        assert!((f.alpha_s / alpha - 1.0).abs() < 1e-9, "{f:?}");
        assert!((f.beta_bytes_per_s / beta - 1.0).abs() < 1e-9, "{f:?}");
        assert!(f.rms_rel_err < 1e-9);
    }

    #[test]
    fn one_kind_of_row_cannot_separate_latency_from_bandwidth() {
        let pts = vec![point(2, 100, 1.0), point(4, 200, 2.0)];
        assert!(fit(&pts).is_err());
    }
}
