//! `meta.json` beside `runs.csv`: what produced the numbers (resolved config, git revision
//! and dirty flag, command line, compiler, CPU, threads) and the machine calibration that
//! reports use as the roofline.

use serde::{Deserialize, Serialize};
use std::path::Path;

use crate::backend::cpu::cache;
use crate::backend::cpu::decode_path::DecodePath;
use crate::backend::cpu::isa::{Isa, PathChoice};
use crate::backend::cuda::plan::GpuInfo;
use crate::error::{Error, Result};
use crate::measure::calibrate::Calibration;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Meta {
    pub attnbench_version: String,
    pub command_line: Vec<String>,
    /// HEAD of the attnbench checkout the binary was built from (wherever it is run from);
    /// None for a binary outside a checkout.
    pub git_revision: Option<String>,
    /// Whether tracked files outside `results/` differ from `git_revision` (committed
    /// results being re-measured in place do not make the build dirty).
    pub git_dirty: Option<bool>,
    pub rustc: String,
    pub profile: String,
    pub os: String,
    pub cpu_model: Option<String>,
    /// Vendor, family, model and stepping (`AuthenticAMD family 26 model 2 stepping 0`): a
    /// virtual machine's model name can hide the generation ("AMD EPYC" for Zen 4 and Zen 5
    /// alike), these numbers do not. Absent in runs made before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_id: Option<String>,
    /// The CPU kernels' instruction-set path (`attnbench list`: avx512-bf16, avx512, avx2,
    /// portable). Speed and the workspace of bf16/f16 cases depend on it, and one CPU model
    /// can run different paths (a VM may hide AVX-512). Absent in runs made before it was
    /// recorded (their `calibration[].kernel_isa` says it when they calibrated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_kernel_path: Option<String>,
    /// How `cpu_kernel_path` was chosen: the widest path the instructions allow and the
    /// one-core FMA and bf16 pair rates behind the choice (`backend::cpu::isa::PathChoice`).
    /// Cases that force a path (`kernel_path`, in their case id) ran on that one instead.
    /// Absent in runs made before the choice was measured (the widest path ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_kernel_path_choice: Option<PathChoice>,
    /// The per-core L2 and the L3 sizes the CPU kernels blocked for (`backend::cpu::cache`:
    /// naive's and Rabe–Staats' rows per pass), bytes; `cpu_cache_sizes_read` false when
    /// they could not be read and were assumed. Absent in runs made before they were
    /// recorded (those kernels computed whole 64-row strips).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_l2_bytes: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_l3_bytes: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_cache_sizes_read: Option<bool>,
    /// The measured crossover of decode's two loops (dot products or SGEMM) per storage
    /// dtype and the probe behind it (`backend::cpu::decode_path`); a `--resume` runs with
    /// it again. Absent in runs made before it was measured (16 rows took the SGEMM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_decode_path: Option<DecodePath>,
    pub logical_cpus: usize,
    pub threads: Vec<usize>,
    pub started_unix_s: u64,
    pub calibration: Vec<Calibration>,
    pub config: serde_json::Value,
    /// The GPU CUDA cases ran on (name, compute capability, clocks, driver, NVRTC, copy
    /// bandwidth); absent for CPU-only runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuInfo>,
    /// Every `--resume` that added rows to this run, in order: the rows it wrote may come
    /// from another build or another resolved config than the first command's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resumed: Vec<Resumed>,
}

/// One `--resume` of a run (`Meta::resumed`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Resumed {
    pub command_line: Vec<String>,
    pub started_unix_s: u64,
    pub git_revision: Option<String>,
    pub git_dirty: Option<bool>,
    /// The resolved config when it differs from `Meta::config` (a `--set` narrowed or
    /// widened the grid); absent when the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<serde_json::Value>,
}

impl Resumed {
    /// This process's resume of a run whose first config was `first`.
    pub fn now(config: serde_json::Value, first: &serde_json::Value) -> Resumed {
        let (git_revision, git_dirty) = git_state();
        Resumed {
            command_line: std::env::args().collect(),
            started_unix_s: unix_now(),
            git_revision,
            git_dirty,
            config: (&config != first).then_some(config),
        }
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The read bandwidth of each calibration that measured it: (threads, 10⁹ B/s), the
/// roofline `decode.md` sets decode rows against.
pub fn read_bandwidths(calibration: &[Calibration]) -> Vec<(usize, f64)> {
    calibration
        .iter()
        .filter_map(|c| Some((c.threads, c.read_gbytes_per_s?)))
        .collect()
}

impl Meta {
    pub fn collect(
        config: serde_json::Value,
        threads: Vec<usize>,
        calibration: Vec<Calibration>,
    ) -> Meta {
        let (git_revision, git_dirty) = git_state();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok();
        Meta {
            attnbench_version: env!("CARGO_PKG_VERSION").to_string(),
            command_line: std::env::args().collect(),
            git_revision,
            git_dirty,
            rustc: env!("ATTNBENCH_RUSTC_VERSION").to_string(),
            profile: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            }
            .to_string(),
            os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
            cpu_model: cpuinfo
                .as_deref()
                .and_then(|t| cpuinfo_field(t, "model name")),
            cpu_id: cpuinfo.as_deref().and_then(cpu_id),
            cpu_kernel_path: Some(Isa::detect().name().to_string()),
            cpu_kernel_path_choice: Some(PathChoice::of_this_cpu().clone()),
            cpu_l2_bytes: Some(cache::l2_bytes()),
            cpu_l3_bytes: Some(cache::l3_bytes()),
            cpu_cache_sizes_read: Some(cache::sizes_known()),
            cpu_decode_path: None,
            logical_cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            threads,
            started_unix_s: unix_now(),
            calibration,
            config,
            gpu: None,
            resumed: Vec::new(),
        }
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| Error::Runtime(format!("serializing meta.json: {e}")))?;
        // Replaced at once: a full disk during a resume's rewrite keeps the old file.
        super::durable::write_atomic(path, (text + "\n").as_bytes())
    }

    pub fn read(path: &Path) -> Result<Meta> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io(format!("cannot read {}", path.display()), e))?;
        serde_json::from_str(&text).map_err(|e| Error::Runtime(format!("{}: {e}", path.display())))
    }
}

/// The git revision this binary was built from and whether its inputs had uncommitted
/// changes then (`build.rs`); None for a build outside a checkout. Recorded at build time:
/// read at run time from the checkout, it named whatever the tree held when a sweep started,
/// which a long run outlives.
pub(crate) fn git_state() -> (Option<String>, Option<bool>) {
    (
        option_env!("ATTNBENCH_GIT_REVISION").map(str::to_string),
        option_env!("ATTNBENCH_GIT_DIRTY").map(|d| d == "true"),
    )
}

/// The value of field `name` of the first processor in the text of `/proc/cpuinfo`.
fn cpuinfo_field(cpuinfo: &str, name: &str) -> Option<String> {
    cpuinfo
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_once(':'))
        .find(|(key, _)| key.trim() == name)
        .map(|(_, value)| value.trim().to_string())
}

/// This machine's key (`attnbench list --machine-key`): [`machine_key_of`] this CPU's id
/// and kernel path.
pub fn machine_key() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok();
    machine_key_of(
        cpuinfo.as_deref().and_then(cpu_id).as_deref(),
        Isa::detect().name(),
    )
}

/// The key of a machine as far as speed goes: CPU vendor, family and model (a
/// `cpu_id`, stepping left out: steppings of one model are one core design) and the kernel
/// path, as `intel-6-85-avx512` or `amd-26-2-avx512-bf16`; `unknown-PATH` without an id.
/// A kernel path alone is not a machine: Zen 5 and Sapphire Rapids both run `avx512-bf16`,
/// at bf16 rates 2x apart.
pub fn machine_key_of(cpu_id: Option<&str>, kernel_path: &str) -> String {
    let parsed = cpu_id.and_then(|id| {
        let words: Vec<&str> = id.split_whitespace().collect();
        match words.as_slice() {
            [vendor, "family", family, "model", model, ..] => Some((*vendor, *family, *model)),
            _ => None,
        }
    });
    match parsed {
        Some((vendor, family, model)) => {
            let vendor = match vendor {
                "GenuineIntel" => "intel".to_string(),
                "AuthenticAMD" => "amd".to_string(),
                v => v
                    .chars()
                    .filter(char::is_ascii_alphanumeric)
                    .collect::<String>()
                    .to_ascii_lowercase(),
            };
            format!("{vendor}-{family}-{model}-{kernel_path}")
        }
        None => format!("unknown-{kernel_path}"),
    }
}

/// `cpu_id` from the text of `/proc/cpuinfo` (its first processor); None when a field is
/// missing (other architectures name them differently).
fn cpu_id(cpuinfo: &str) -> Option<String> {
    let field = |name| cpuinfo_field(cpuinfo, name);
    Some(format!(
        "{} family {} model {} stepping {}",
        field("vendor_id")?,
        field("cpu family")?,
        field("model")?,
        field("stepping")?
    ))
}

#[cfg(test)]
mod tests {
    use super::{cpu_id, cpuinfo_field, machine_key_of, read_bandwidths, Calibration};

    #[test]
    fn read_bandwidths_keep_only_the_calibrations_that_measured_one() {
        let cal = |threads, read| Calibration {
            threads,
            sgemm_gflops: 100.0,
            sgemm_n: 1024,
            copy_gbytes_per_s: 15.0,
            copy_bytes: 256 << 20,
            read_gbytes_per_s: read,
            seconds: 1.0,
            kernel_isa: "avx512".into(),
            fma_peak_gflops: 160.0,
            bf16_peak_gflops: None,
        };
        let got = read_bandwidths(&[cal(1, Some(10.0)), cal(2, None), cal(4, Some(19.5))]);
        assert_eq!(got, vec![(1, 10.0), (4, 19.5)]);
        assert!(read_bandwidths(&[]).is_empty());
    }

    #[test]
    fn machine_keys_name_vendor_family_model_and_path() {
        let intel = Some("GenuineIntel family 6 model 85 stepping 7");
        assert_eq!(machine_key_of(intel, "avx512"), "intel-6-85-avx512");
        let zen5 = Some("AuthenticAMD family 26 model 2 stepping 1");
        assert_eq!(machine_key_of(zen5, "avx512-bf16"), "amd-26-2-avx512-bf16");
        // Another stepping of the same model is the same machine; another path is not.
        let other = Some("AuthenticAMD family 26 model 2 stepping 0");
        assert_eq!(machine_key_of(other, "avx512-bf16"), "amd-26-2-avx512-bf16");
        assert_ne!(
            machine_key_of(zen5, "avx2"),
            machine_key_of(zen5, "avx512-bf16")
        );
        assert_eq!(
            machine_key_of(Some("Hygon Genuine family 24 model 1"), "avx2"),
            "unknown-avx2"
        );
        assert_eq!(
            machine_key_of(Some("HygonGenuine family 24 model 1 stepping 2"), "avx2"),
            "hygongenuine-24-1-avx2"
        );
        assert_eq!(machine_key_of(None, "portable"), "unknown-portable");
    }

    #[test]
    fn cpu_id_names_the_generation_of_the_first_processor() {
        let text = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\n\
                    model\t\t: 2\nmodel name\t: AMD EPYC\nstepping\t: 0\n\n\
                    processor\t: 1\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n\
                    model\t\t: 17\nstepping\t: 1\n";
        assert_eq!(
            cpu_id(text).as_deref(),
            Some("AuthenticAMD family 26 model 2 stepping 0")
        );
        assert_eq!(
            cpuinfo_field(text, "model name").as_deref(),
            Some("AMD EPYC")
        );
        // aarch64 names its fields otherwise: nothing rather than a wrong id.
        assert_eq!(cpu_id("processor\t: 0\nCPU implementer\t: 0x41\n"), None);
    }
}
