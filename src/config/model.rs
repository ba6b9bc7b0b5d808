//! `[model]`: the Ring-vs-Tree decode model a sweep also writes (Shyam et al. Sec. 6;
//! docs/papers.md, Shyam et al., 2.8): the α–β topology (a preset, with any parameter overridden),
//! the compute term (a GPU roofline or a decode timed on this machine), the (devices, tokens) grid
//! of predictions, the decode shape, the allreduce of the tree, and the scaled-down shapes
//! whose simulated counts are checked against eqs. (8)-(14). Errors name `model.KEY`.

use serde::{Deserialize, Serialize};
use toml::Value;

use super::schema::RawModel;
use super::source::{Section, Source};
use crate::error::Result;
use crate::model::topology::{Gpu, Topology};
use crate::problem::DType;
use crate::sim::plan::Allreduce;

/// Where the model's compute term comes from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ComputeSpec {
    /// A named GPU's roofline (`model::topology::Gpu`).
    Roofline(String),
    /// This machine: one device's local decode timed at `probe_tokens` cached tokens and
    /// scaled linearly in t (decode is a stream over the cache).
    Measured { probe_tokens: usize },
}

/// A scaled-down shape whose simulated communication and memory are compared with the
/// paper's equations: b sequences, n_h heads of d_h, N tokens on p devices (N = t·p).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckShape {
    pub batch: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub tokens: usize,
    pub devices: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub topology: Topology,
    pub compute: ComputeSpec,
    pub devices: Vec<usize>,
    pub tokens: Vec<usize>,
    pub batch: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub dtype: DType,
    pub allreduce: Allreduce,
    /// Ring overlaps each step's transfer with its compute (the paper's best case for it).
    pub overlap: bool,
    pub check: Vec<CheckShape>,
}

/// The paper's Section 6.1 grid and shape: p = 8 ... 128, N = 80k·2^k, 16 heads of 128.
pub const DEFAULT_DEVICES: [usize; 5] = [8, 16, 32, 64, 128];
pub const DEFAULT_TOKENS: [usize; 7] = [
    80_000, 160_000, 320_000, 640_000, 1_280_000, 2_560_000, 5_120_000,
];
/// Cache length at which the measured compute term is timed.
pub const DEFAULT_PROBE_TOKENS: usize = 32_768;
/// Scaled-down versions of docs/papers.md's fixtures (640k on 8 and 5.12M on 128 devices,
/// t divided by 64 and 1000) and two ragged small shapes.
pub const DEFAULT_CHECK: [CheckShape; 4] = [
    CheckShape {
        batch: 1,
        heads: 16,
        head_dim: 128,
        tokens: 10_000,
        devices: 8,
    },
    CheckShape {
        batch: 1,
        heads: 16,
        head_dim: 128,
        tokens: 5_120,
        devices: 128,
    },
    CheckShape {
        batch: 2,
        heads: 4,
        head_dim: 32,
        tokens: 300,
        devices: 3,
    },
    CheckShape {
        batch: 3,
        heads: 2,
        head_dim: 8,
        tokens: 35,
        devices: 5,
    },
];

/// The keys of `[model]` (kept equal to `RawModel`'s fields by a test).
pub(super) const MODEL_KEYS: [&str; 17] = [
    "topology",
    "devices_per_node",
    "alpha_intra_us",
    "alpha_inter_us",
    "beta_intra_gbs",
    "beta_inter_gbs",
    "compute",
    "probe_tokens",
    "devices",
    "tokens",
    "batch",
    "heads",
    "head_dim",
    "dtype",
    "allreduce",
    "overlap",
    "check",
];

struct Fields<'a>(&'a Source<'a>);

impl Fields<'_> {
    fn err(&self, key: &str, msg: impl std::fmt::Display) -> crate::error::Error {
        self.0.err(Section::Model, key, msg)
    }

    fn positive(&self, key: &str, v: &Option<Value>, default: usize) -> Result<usize> {
        match v {
            None => Ok(default),
            Some(Value::Integer(n)) if *n > 0 => {
                usize::try_from(*n).map_err(|_| self.err(key, format!("{n} is too large")))
            }
            Some(v) => Err(self.err(key, format!("expected a positive integer, got {}", show(v)))),
        }
    }

    fn number(&self, key: &str, v: &Option<Value>, default: f64, positive: bool) -> Result<f64> {
        let x = match v {
            None => return Ok(default),
            Some(Value::Integer(n)) => *n as f64,
            Some(Value::Float(x)) => *x,
            Some(v) => return Err(self.err(key, format!("expected a number, got {}", show(v)))),
        };
        if x.is_finite() && (x > 0.0 || (!positive && x >= 0.0)) {
            Ok(x)
        } else {
            let want = if positive { "> 0" } else { ">= 0" };
            Err(self.err(key, format!("expected a finite number {want}, got {x}")))
        }
    }

    fn list(&self, key: &str, v: &Option<Value>, default: &[usize]) -> Result<Vec<usize>> {
        let Some(v) = v else {
            return Ok(default.to_vec());
        };
        let items = match v {
            Value::Array(a) if !a.is_empty() => a.clone(),
            Value::Integer(_) => vec![v.clone()],
            _ => {
                return Err(self.err(
                    key,
                    format!(
                        "expected a non-empty list of positive integers, got {}",
                        show(v)
                    ),
                ))
            }
        };
        items
            .iter()
            .enumerate()
            .map(|(i, x)| match x {
                Value::Integer(n) if *n > 0 => Ok(*n as usize),
                _ => Err(self.err(
                    key,
                    format!(
                        "item {} of the list: expected a positive integer, got {}",
                        i + 1,
                        show(x)
                    ),
                )),
            })
            .collect()
    }

    fn name(&self, key: &str, v: &Option<Value>) -> Result<Option<String>> {
        match v {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(self.err(key, format!("expected a string, got {}", show(v)))),
        }
    }
}

fn show(v: &Value) -> String {
    format!("{} {v}", v.type_str())
}

/// Check `[model]` and fill its defaults; `None` when the config has no `[model]`.
pub(super) fn resolve_model(raw: Option<RawModel>, src: &Source) -> Result<Option<ModelConfig>> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let f = Fields(src);
    let preset = f
        .name("topology", &raw.topology)?
        .unwrap_or_else(|| "dgx-h100".into());
    let mut topology = Topology::preset(&preset).ok_or_else(|| {
        f.err(
            "topology",
            format!(
                "unknown preset `{preset}` (expected one of: {})",
                Topology::PRESETS.join(", ")
            ),
        )
    })?;
    topology.per_node = f.positive("devices_per_node", &raw.devices_per_node, topology.per_node)?;
    topology.intra.alpha_s = f.number(
        "alpha_intra_us",
        &raw.alpha_intra_us,
        topology.intra.alpha_s * 1e6,
        false,
    )? * 1e-6;
    topology.inter.alpha_s = f.number(
        "alpha_inter_us",
        &raw.alpha_inter_us,
        topology.inter.alpha_s * 1e6,
        false,
    )? * 1e-6;
    topology.intra.beta_bytes_per_s = f.number(
        "beta_intra_gbs",
        &raw.beta_intra_gbs,
        topology.intra.beta_bytes_per_s / 1e9,
        true,
    )? * 1e9;
    topology.inter.beta_bytes_per_s = f.number(
        "beta_inter_gbs",
        &raw.beta_inter_gbs,
        topology.inter.beta_bytes_per_s / 1e9,
        true,
    )? * 1e9;

    let probe_tokens = f.positive("probe_tokens", &raw.probe_tokens, DEFAULT_PROBE_TOKENS)?;
    // The probe allocates and times a real cache of this length.
    if probe_tokens > MAX_PROBE_TOKENS {
        return Err(f.err(
            "probe_tokens",
            format!("{probe_tokens} is more than {MAX_PROBE_TOKENS} (a cache the probe allocates)"),
        ));
    }
    let compute = match f.name("compute", &raw.compute)?.as_deref() {
        None => ComputeSpec::Roofline("h100".into()),
        Some("measured") => ComputeSpec::Measured { probe_tokens },
        Some(g) if Gpu::named(g).is_some() => ComputeSpec::Roofline(g.into()),
        Some(g) => {
            let gpus: Vec<&str> = Gpu::ALL.iter().map(|g| g.name).collect();
            return Err(f.err(
                "compute",
                format!(
                    "unknown `{g}` (expected \"measured\" or a GPU roofline: {})",
                    gpus.join(", ")
                ),
            ));
        }
    };
    let dtype = match f.name("dtype", &raw.dtype)? {
        None => DType::Bf16,
        Some(s) => s.parse().map_err(|e: String| f.err("dtype", e))?,
    };
    let allreduce = match f.name("allreduce", &raw.allreduce)?.as_deref() {
        // Bare "two-level" follows the topology's node size.
        None | Some("two-level") => Allreduce::TwoLevel {
            per_node: topology.per_node,
        },
        Some(s) => s.parse().map_err(|e: String| f.err("allreduce", e))?,
    };
    let overlap = match &raw.overlap {
        None => true,
        Some(Value::Boolean(b)) => *b,
        Some(v) => {
            return Err(f.err(
                "overlap",
                format!("expected true or false, got {}", show(v)),
            ))
        }
    };
    let devices = f.list("devices", &raw.devices, &DEFAULT_DEVICES)?;
    let tokens = f.list("tokens", &raw.tokens, &DEFAULT_TOKENS)?;
    // The prediction is analytic but keeps per-device state: bounded so a typo is refused.
    if let Some(p) = devices.iter().find(|&&p| p > MAX_MODEL_DEVICES) {
        return Err(f.err(
            "devices",
            format!("{p} is more than {MAX_MODEL_DEVICES} devices"),
        ));
    }
    if let Some(n) = tokens.iter().find(|&&n| n > MAX_MODEL_TOKENS) {
        return Err(f.err(
            "tokens",
            format!("{n} is more than {MAX_MODEL_TOKENS} tokens (2^40)"),
        ));
    }
    for &p in &devices {
        if let Some(reason) = allreduce.unsupported(p) {
            return Err(f.err("allreduce", format!("{reason} (model.devices has {p})")));
        }
    }
    let check = match &raw.check {
        None => DEFAULT_CHECK.to_vec(),
        Some(v) => check_shapes(v).map_err(|m| f.err("check", m))?,
    };
    Ok(Some(ModelConfig {
        topology,
        compute,
        devices,
        tokens,
        batch: f.positive("batch", &raw.batch, 1)?,
        heads: f.positive("heads", &raw.heads, 16)?,
        head_dim: f.positive("head_dim", &raw.head_dim, 128)?,
        dtype,
        allreduce,
        overlap,
        check,
    }))
}

/// Most devices of a check shape (the defaults go to 128).
pub const MAX_CHECK_DEVICES: usize = 4096;
/// Most elements of one K or V of a check shape: 2^26, 3x the largest default.
pub const MAX_CHECK_ELEMENTS: usize = 1 << 26;
/// Most devices of a prediction (`model.devices`).
pub const MAX_MODEL_DEVICES: usize = 1 << 20;
/// Longest cache of a prediction (`model.tokens`), as the axes' `pow2` bound.
pub const MAX_MODEL_TOKENS: usize = 1 << 40;
/// Longest cache the `measured` probe times.
pub const MAX_PROBE_TOKENS: usize = 1 << 24;

/// `[[b, n_h, d_h, N, p], ...]` with N a multiple of p (t = N/p whole, as the equations
/// assume).
fn check_shapes(v: &Value) -> Result<Vec<CheckShape>, String> {
    let form =
        "expected a list of [batch, heads, head_dim, tokens, devices] lists of positive integers";
    let Value::Array(items) = v else {
        return Err(format!("{form}, got {}", show(v)));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let nums: Option<Vec<usize>> = item.as_array().and_then(|a| {
                a.iter()
                    .map(|x| x.as_integer().filter(|n| *n > 0).map(|n| n as usize))
                    .collect()
            });
            match nums.as_deref() {
                Some(&[batch, heads, head_dim, tokens, devices]) => {
                    // The check simulates with real tensors: bounded so that it neither
                    // fails to allocate nor runs for minutes.
                    let elements = [batch, heads, head_dim]
                        .iter()
                        .try_fold(tokens, |a, &x| a.checked_mul(x));
                    if devices > MAX_CHECK_DEVICES
                        || elements.is_none_or(|e| e > MAX_CHECK_ELEMENTS)
                    {
                        return Err(format!(
                            "item {}: too large to simulate: at most {MAX_CHECK_DEVICES} devices and {MAX_CHECK_ELEMENTS} elements (batch x heads x head_dim x tokens)",
                            i + 1
                        ));
                    }
                    if tokens % devices != 0 {
                        return Err(format!(
                            "item {}: tokens ({tokens}) must be a multiple of devices ({devices}) so that t = N/p is whole",
                            i + 1
                        ));
                    }
                    Ok(CheckShape {
                        batch,
                        heads,
                        head_dim,
                        tokens,
                        devices,
                    })
                }
                _ => Err(format!("item {}: {form}, got {}", i + 1, show(item))),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report reads `[model]` back from meta.json (`report::run_config`): every float,
    /// the α of each link among them, must come back bit for bit, or the regenerated
    /// latency tables differ in their last digits from the sweep's.
    #[test]
    fn the_model_reads_back_from_its_json_bit_for_bit() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/tree_vs_ring.toml");
        let model = crate::config::Config::load(&path, &[])
            .unwrap()
            .model
            .unwrap();
        let json = serde_json::to_string(&model).unwrap();
        let back: ModelConfig = serde_json::from_str(&json).unwrap();
        assert_eq!(back, model, "{json}");
        let measured = ModelConfig {
            compute: ComputeSpec::Measured { probe_tokens: 512 },
            ..model
        };
        let json = serde_json::to_string(&measured).unwrap();
        assert_eq!(
            serde_json::from_str::<ModelConfig>(&json).unwrap(),
            measured
        );
    }
}
