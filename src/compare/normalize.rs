//! Machine normalization of times for `compare`: each run's times are divided by its
//! calibrated SGEMM seconds per GFLOP (`meta.json`, `calibration[].sgemm_gflops` for the
//! case's thread count), i.e. expressed as "GFLOP of calibrated SGEMM the machine could have
//! done meanwhile". A ratio of normalized times is the raw ratio times
//! `gflops_current / gflops_baseline`. O(calibration entries) per case.
//!
//! `probe` does the same with each case's own machine-speed probe (`probe_gflops`, measured
//! on the case's threads just before and after its timed calls, `measure::probe`) instead of
//! the one calibration at the start of the sweep: a shared machine's slow stretches of
//! seconds are then divided out case by case.
//!
//! SGEMM rather than copy bandwidth: attention at the head dims benchmarked here spends its
//! time in GEMMs and the exp of the softmax, both compute-bound, so the SGEMM rate on the same
//! thread count tracks them across machines better than DRAM bandwidth does.

use serde::Serialize;

use crate::error::{Error, Result};
use crate::results::compared::RunMeta;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Normalize {
    /// Compare raw seconds.
    None,
    /// Divide by each run's calibrated SGEMM seconds per GFLOP (meta.json).
    Calibration,
    /// Divide by each case's machine-speed probe (`probe_gflops`, measured with the case).
    Probe,
}

impl Normalize {
    pub const ALL: [Normalize; 3] = [Normalize::None, Normalize::Calibration, Normalize::Probe];

    pub fn name(self) -> &'static str {
        match self {
            Normalize::None => "none",
            Normalize::Calibration => "calibration",
            Normalize::Probe => "probe",
        }
    }

    /// What the mode does, in words (`compare --help`).
    pub fn help(self) -> &'static str {
        match self {
            Normalize::None => "Compare raw seconds",
            Normalize::Calibration => {
                "Divide by each run's calibrated SGEMM seconds per GFLOP (meta.json)"
            }
            Normalize::Probe => {
                "Divide by each case's machine-speed probe (`probe_gflops`, measured with the case)"
            }
        }
    }
}

/// The mode in effect and why.
#[derive(Clone, Debug, Serialize)]
pub struct Decision {
    pub mode: Normalize,
    pub why: String,
}

/// The machine a run names in `meta.json`: CPU model, its vendor/family/model/stepping
/// (a VM's model name alone can be the same for two generations), the CPU kernel path (one
/// CPU model with AVX-512 hidden by its VM runs the AVX2 kernels) and logical CPUs. A run
/// that does not record the family is a different machine from one that does: nothing says
/// they are the same.
fn machine(m: &RunMeta) -> String {
    format!(
        "{} ({}), kernels {}, {} logical CPUs",
        m.cpu_model.as_deref().unwrap_or("unknown CPU"),
        m.cpu_id.as_deref().unwrap_or("family not recorded"),
        m.kernel_path().unwrap_or("not recorded"),
        m.logical_cpus
            .map_or_else(|| "?".to_string(), |n| n.to_string())
    )
}

/// Picks the mode: the user's, else `calibration` when the machines differ. Calibration needs
/// both runs' `meta.json` with calibration figures; without them it is a usage error that
/// says how to proceed.
pub fn decide(
    requested: Option<Normalize>,
    baseline: (Option<&RunMeta>, &str),
    current: (Option<&RunMeta>, &str),
) -> Result<Decision> {
    let decision = match (requested, baseline.0, current.0) {
        (Some(mode), _, _) => Decision {
            mode,
            why: "as requested".into(),
        },
        (None, Some(b), Some(c)) if machine(b) != machine(c) => Decision {
            mode: Normalize::Calibration,
            why: format!(
                "the machines differ: baseline {}, current {}",
                machine(b),
                machine(c)
            ),
        },
        (None, Some(b), Some(_)) => Decision {
            mode: Normalize::None,
            why: format!("the same machine on both sides ({})", machine(b)),
        },
        (None, _, _) => Decision {
            mode: Normalize::None,
            why: "a meta.json is missing, so the machines cannot be told apart".into(),
        },
    };
    if decision.mode == Normalize::Calibration {
        for (meta, path) in [baseline, current] {
            if meta.is_none_or(|m| m.calibration.is_empty()) {
                return Err(Error::Usage(format!(
                    "normalizing by calibration ({}) needs calibration figures, and {path} {}; \
                     rerun that sweep with run.calibrate = true, or pass --normalize none",
                    decision.why,
                    if meta.is_some() {
                        "has none"
                    } else {
                        "does not exist"
                    }
                )));
            }
        }
    }
    Ok(decision)
}

/// The factor `k` that turns a raw time ratio into a probe-normalized one for a case:
/// `probe_current / probe_baseline` (its two `probe_gflops`). `Err` says why there is none.
pub fn probe_factor(
    baseline: Option<f64>,
    current: Option<f64>,
) -> std::result::Result<f64, String> {
    let rate = |p: Option<f64>, side: &str| {
        p.filter(|g| g.is_finite() && *g > 0.0).ok_or_else(|| {
            format!(
                "no probe_gflops in the {side} (a run made before attnbench recorded it, or a \
                 GPU case); compare with --normalize calibration"
            )
        })
    };
    Ok(rate(current, "current run")? / rate(baseline, "baseline")?)
}

/// The factor `k` that turns a raw time ratio into a normalized one for a case on `threads`
/// threads: `gflops_current / gflops_baseline` of the runs' calibrations. `Err` says why
/// there is none.
pub fn factor(
    baseline: &RunMeta,
    current: &RunMeta,
    threads: usize,
) -> std::result::Result<f64, String> {
    let rate = |m: &RunMeta, side: &str| {
        m.calibration
            .iter()
            .find(|c| c.threads == threads)
            .map(|c| c.sgemm_gflops)
            .filter(|g| g.is_finite() && *g > 0.0)
            .ok_or_else(|| format!("no SGEMM calibration for {threads} threads in the {side}"))
    };
    Ok(rate(current, "current run")? / rate(baseline, "baseline")?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::compared::CalibrationEntry;

    fn meta(cpu: &str, cpus: usize, cal: &[(usize, f64)]) -> RunMeta {
        RunMeta {
            cpu_model: Some(cpu.into()),
            logical_cpus: Some(cpus),
            calibration: cal
                .iter()
                .map(|&(threads, sgemm_gflops)| CalibrationEntry {
                    threads,
                    sgemm_gflops,
                    kernel_isa: "avx2".into(),
                })
                .collect(),
            ..RunMeta::default()
        }
    }

    #[test]
    fn defaults_to_calibration_only_when_machines_differ() {
        let a = meta("AMD EPYC", 2, &[(1, 90.0)]);
        let b = meta("Intel Xeon", 8, &[(1, 120.0)]);
        let d = decide(None, (Some(&a), "a"), (Some(&a), "a")).unwrap();
        assert_eq!(d.mode, Normalize::None);
        let d = decide(None, (Some(&a), "a"), (Some(&b), "b")).unwrap();
        assert_eq!(d.mode, Normalize::Calibration);
        assert!(d.why.contains("Intel Xeon"), "{}", d.why);
        let d = decide(None, (None, "a"), (Some(&b), "b")).unwrap();
        assert_eq!(d.mode, Normalize::None);
        // One model name, two generations (a VM's "AMD EPYC" on Zen 4 and on Zen 5).
        let zen = |id: Option<&str>| RunMeta {
            cpu_id: id.map(String::from),
            ..a.clone()
        };
        let (zen4, zen5) = (
            zen(Some("AuthenticAMD family 25 model 17 stepping 1")),
            zen(Some("AuthenticAMD family 26 model 2 stepping 0")),
        );
        let d = decide(None, (Some(&zen4), "a"), (Some(&zen5), "b")).unwrap();
        assert_eq!(d.mode, Normalize::Calibration);
        assert!(d.why.contains("family 26"), "{}", d.why);
        let d = decide(None, (Some(&zen5), "a"), (Some(&zen5), "b")).unwrap();
        assert_eq!(d.mode, Normalize::None);
        // A run from before the family was recorded cannot be told to be the same machine.
        let d = decide(None, (Some(&a), "a"), (Some(&zen5), "b")).unwrap();
        assert_eq!(d.mode, Normalize::Calibration);
        assert!(d.why.contains("not recorded"), "{}", d.why);
        // One CPU, two kernel paths (a VM that hides AVX-512): `cpu_kernel_path`, or for
        // older runs the path of their calibration.
        let avx512 = RunMeta {
            cpu_kernel_path: Some("avx512-bf16".into()),
            ..zen4.clone()
        };
        assert_eq!(zen4.kernel_path(), Some("avx2"));
        let d = decide(None, (Some(&avx512), "a"), (Some(&zen4), "b")).unwrap();
        assert_eq!(d.mode, Normalize::Calibration);
        assert!(d.why.contains("kernels avx512-bf16"), "{}", d.why);
    }

    #[test]
    fn calibration_without_figures_is_a_usage_error() {
        let a = meta("AMD EPYC", 2, &[]);
        let e = decide(
            Some(Normalize::Calibration),
            (Some(&a), "base/meta.json"),
            (None, "x"),
        )
        .unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("base/meta.json"), "{e}");
    }

    #[test]
    fn mode_names_are_their_cli_and_json_spellings() {
        let names = Normalize::ALL.map(Normalize::name);
        assert_eq!(names, ["none", "calibration", "probe"]);
        for mode in Normalize::ALL {
            // `--normalize` takes `name()`, compare.json writes the serde spelling: one word.
            let json = serde_json::to_string(&mode).unwrap();
            assert_eq!(json, format!("\"{}\"", mode.name()));
        }
        // Each help line (`compare --help`) says what the mode divides by.
        assert_eq!(Normalize::None.help(), "Compare raw seconds");
        assert!(Normalize::Calibration.help().contains("SGEMM"));
        assert!(Normalize::Probe.help().contains("probe_gflops"));
    }

    #[test]
    fn probe_factor_is_the_probe_rate_ratio() {
        assert_eq!(probe_factor(Some(100.0), Some(50.0)), Ok(0.5));
        assert_eq!(probe_factor(Some(40.0), Some(100.0)), Ok(2.5));
        let e = probe_factor(None, Some(50.0)).unwrap_err();
        assert!(e.contains("in the baseline"), "{e}");
        let e = probe_factor(Some(50.0), None).unwrap_err();
        assert!(e.contains("in the current run"), "{e}");
    }

    #[test]
    fn a_zero_negative_or_non_finite_rate_gives_no_factor() {
        // Such a rate is a failed measurement, not a machine speed: no factor rather than
        // an infinite, negative or NaN one.
        let good = meta("A", 2, &[(1, 100.0)]);
        for bad in [0.0, -90.0, f64::INFINITY, f64::NAN] {
            assert!(probe_factor(Some(100.0), Some(bad)).is_err(), "{bad}");
            assert!(probe_factor(Some(bad), Some(100.0)).is_err(), "{bad}");
            let b = meta("B", 2, &[(1, bad)]);
            assert!(factor(&good, &b, 1).is_err(), "{bad}");
            assert!(factor(&b, &good, 1).is_err(), "{bad}");
        }
    }

    #[test]
    fn factor_is_the_rate_ratio_for_the_thread_count() {
        let a = meta("A", 2, &[(1, 100.0), (2, 190.0)]);
        let b = meta("B", 2, &[(1, 50.0)]);
        assert_eq!(factor(&a, &b, 1).unwrap(), 0.5);
        assert!(factor(&a, &b, 2).unwrap_err().contains("2 threads"));
    }
}
