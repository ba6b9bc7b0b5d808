//! The problem being measured: shapes, dtypes, modes, one benchmark `Case`, and the seeded
//! input tensors (`Inputs`) in their storage dtype. Layout is always
//! `[batch, heads, seq, head_dim]`, row-major, as NumPy and PyTorch store it.

use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize, Serializer};
use std::fmt;
use std::ops::Range;
use std::str::FromStr;

pub mod batch_spec;
pub mod fp8;
pub mod isa;
pub mod layout;
pub mod mla;
pub mod paged;
pub use batch_spec::BatchSpec;
pub use fp8::{Fp8Format, Fp8Kv, Fp8Tensor};
pub use isa::Isa;
pub use layout::SeqLayout;
pub use mla::{Mla, MlaInputs};
pub use paged::{PageOrder, PagedKv, Paging};

/// Storage precision of Q, K and V. Compute always accumulates in f32 (f64 in the oracle);
/// the output is always f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    Bf16,
    F16,
}

impl DType {
    pub const ALL: [DType; 3] = [DType::F32, DType::Bf16, DType::F16];

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
        }
    }

    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::Bf16 | DType::F16 => 2,
        }
    }

    /// Accepted max-abs error of an exact variant's f32-accumulated output against the f64
    /// oracle, for inputs of O(1) magnitude. The oracle sees the same rounded inputs, so the
    /// storage dtype enters only through the precision later kernels may use for
    /// intermediates (e.g. P rounded to the storage dtype before PV): the bound is the
    /// dtype's unit roundoff times a small factor, and f32's is the core issue's 1e-5.
    pub fn tolerance(self) -> f64 {
        match self {
            DType::F32 => 1e-5,
            DType::F16 => 2e-3,
            DType::Bf16 => 1.6e-2,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        DType::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| match s.parse::<Fp8Format>() {
                Ok(_) => format!(
                    "dtype `{s}` is for K and V only (expected one of: f32, bf16, f16; an FP8 cache is kv_dtype = \"{s}\")"
                ),
                Err(_) => format!("unknown dtype `{s}` (expected one of: f32, bf16, f16)"),
            })
    }
}

/// What is measured. Only `fwd` has kernels in the core; the others are planned modes that
/// the case and record types already carry (a variant that lacks a mode makes a `skipped` row).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub enum Mode {
    #[serde(rename = "fwd")]
    Fwd,
    #[serde(rename = "fwd+bwd")]
    FwdBwd,
    #[serde(rename = "decode")]
    Decode,
    #[serde(rename = "layer-fwd")]
    LayerFwd,
    #[serde(rename = "layer-train")]
    LayerTrain,
}

impl Mode {
    pub const ALL: [Mode; 5] = [
        Mode::Fwd,
        Mode::FwdBwd,
        Mode::Decode,
        Mode::LayerFwd,
        Mode::LayerTrain,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Fwd => "fwd",
            Mode::FwdBwd => "fwd+bwd",
            Mode::Decode => "decode",
            Mode::LayerFwd => "layer-fwd",
            Mode::LayerTrain => "layer-train",
        }
    }

    /// Whether the mode runs a whole transformer layer (`crate::layer`), not attention alone.
    pub fn is_layer(self) -> bool {
        matches!(self, Mode::LayerFwd | Mode::LayerTrain)
    }
}

/// Values of one GPT layer's parameters for hidden size `h`: 12h^2 + 13h (QKV projection
/// 3h^2 + 3h, output projection h^2 + h, FFN 8h^2 + 5h, two layer norms 4h; Liu & Abbeel,
/// Blockwise Parallel Transformer, Section 3).
pub fn layer_param_count(h: usize) -> usize {
    12 * h * h + 13 * h
}

/// Bytes of the training state of `layers` GPT layers of hidden `h`: 16 per parameter (f32
/// weights, gradients and two Adam moments; BPT's inferred floor, REPRODUCTION.md 1.2:
/// 2.7B x 16 B = 43.2 GB, Table 3's 43 GB at 8K).
pub fn layer_state_bytes(h: usize, layers: usize) -> u64 {
    16 * layers as u64 * layer_param_count(h) as u64
}

/// Bytes of the rest of a `layers`-deep model beside one measured layer whose input has
/// `tokens` values: every layer's training state (`layer_state_bytes`) but the measured
/// layer's f32 weights and, when `train`, their gradient (the case's own inputs and
/// outputs, `Case::io_bytes`, so counted once), and the other layers' checkpointed inputs,
/// 4 bytes per value. They are not allocated but count against the memory budget.
pub fn model_rest_bytes(h: usize, tokens: usize, layers: usize, train: bool) -> u64 {
    let held = 4 * layer_param_count(h) as u64 * if train { 2 } else { 1 };
    layer_state_bytes(h, layers.max(1)) - held + layers.saturating_sub(1) as u64 * 4 * tokens as u64
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Mode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                format!("unknown mode `{s}` (expected one of: fwd, fwd+bwd, decode, layer-fwd, layer-train)")
            })
    }
}

/// Where a case runs. `Cuda` exists so configs and records are stable before the GPU
/// backend lands; without it such cases are `skipped` rows with the reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    Cpu,
    Cuda,
}

impl Device {
    pub const ALL: [Device; 2] = [Device::Cpu, Device::Cuda];

    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Device::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| format!("unknown device `{s}` (expected one of: cpu, cuda)"))
    }
}

/// Distribution of the generated inputs. `uniform` is U[0, 1): Rabe–Staats give no range,
/// and this is the choice recorded in docs/papers.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum InputDist {
    Normal,
    Uniform,
}

impl InputDist {
    /// One value of the distribution from `rng` (every seeded input stream draws so).
    pub fn draw(self, rng: &mut ChaCha8Rng) -> f32 {
        match self {
            InputDist::Normal => StandardNormal.sample(rng),
            InputDist::Uniform => rng.random::<f32>(),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            InputDist::Normal => "normal",
            InputDist::Uniform => "uniform",
        }
    }
}

/// Compute precision of the attention weights P for the PV product (names after JAX's
/// `jax.lax.Precision`): `highest` keeps P in f32, as Rabe & Staats compute
/// (`precision=HIGHEST`, 001 L225); `fast` rounds P to the storage dtype where that is
/// faster (bf16 inputs on the AVX512_BF16 pair path: `vdpbf16ps` for PV too). A case
/// without the axis is `fast`, which is what every kernel did before the axis existed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Fast,
    Highest,
}

impl Precision {
    pub const ALL: [Precision; 2] = [Precision::Fast, Precision::Highest];

    pub fn name(self) -> &'static str {
        match self {
            Precision::Fast => "fast",
            Precision::Highest => "highest",
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fast" => Ok(Precision::Fast),
            "highest" => Ok(Precision::Highest),
            _ => Err(format!(
                "unknown precision `{s}` (expected one of: fast, highest)"
            )),
        }
    }
}

impl fmt::Display for InputDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for InputDist {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "normal" => Ok(InputDist::Normal),
            "uniform" => Ok(InputDist::Uniform),
            _ => Err(format!(
                "unknown input_dist `{s}` (expected one of: normal, uniform)"
            )),
        }
    }
}

/// The upstream gradient dO of a `fwd+bwd` case: seeded N(0, 1), or all ones, which is
/// `jax.grad` of `sum(out)` as Rabe–Staats measure it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamGrad {
    Random,
    Ones,
}

impl UpstreamGrad {
    pub fn name(self) -> &'static str {
        match self {
            UpstreamGrad::Random => "random",
            UpstreamGrad::Ones => "ones",
        }
    }

    /// dO for `shape` (f32, like the output). The random stream is seeded apart from the
    /// inputs' (`seed` with its bits flipped), so Q, K, V do not change with it.
    pub fn make(self, shape: &Shape, seed: u64) -> Vec<f32> {
        match self {
            UpstreamGrad::Ones => vec![1.0; shape.out_len()],
            UpstreamGrad::Random => {
                let mut rng = ChaCha8Rng::seed_from_u64(!seed);
                (0..shape.out_len())
                    .map(|_| StandardNormal.sample(&mut rng))
                    .collect()
            }
        }
    }
}

impl fmt::Display for UpstreamGrad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for UpstreamGrad {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "random" => Ok(UpstreamGrad::Random),
            "ones" => Ok(UpstreamGrad::Ones),
            _ => Err(format!(
                "unknown d_out `{s}` (expected one of: random, ones)"
            )),
        }
    }
}

/// Tensor dimensions of one attention problem. Q is `[batch, heads, seq_q, head_dim]`,
/// K and V are `[batch, kv_heads, seq_kv, head_dim]`, O is like Q.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shape {
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub seq_q: usize,
    pub seq_kv: usize,
    pub head_dim: usize,
}

impl Shape {
    /// Multi-head self-attention over one sequence: batch 1, `heads` query and key/value
    /// heads, `n` queries and keys of `head_dim`.
    pub fn self_attention(heads: usize, n: usize, head_dim: usize) -> Shape {
        Shape {
            batch: 1,
            heads,
            kv_heads: heads,
            seq_q: n,
            seq_kv: n,
            head_dim,
        }
    }

    pub fn q_len(&self) -> usize {
        self.batch * self.heads * self.seq_q * self.head_dim
    }
    pub fn kv_len(&self) -> usize {
        self.batch * self.kv_heads * self.seq_kv * self.head_dim
    }
    pub fn out_len(&self) -> usize {
        self.q_len()
    }
    /// Query heads per key/value head (GQA group size; 1 for MHA, `heads` for MQA).
    pub fn group(&self) -> usize {
        self.heads / self.kv_heads
    }
    /// Offset (in elements) of query head `(b, h)` in Q or O.
    pub fn q_head_offset(&self, b: usize, h: usize) -> usize {
        (b * self.heads + h) * self.seq_q * self.head_dim
    }
    /// Offset (in elements) of the key/value head that query head `(b, h)` reads.
    pub fn kv_head_offset(&self, b: usize, h: usize) -> usize {
        (b * self.kv_heads + h / self.group()) * self.seq_kv * self.head_dim
    }
    /// Softmax scale 1/sqrt(d).
    pub fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }
    /// Bottom-right aligned causal mask (as in decoding, and FlashAttention's convention for
    /// seq_q != seq_kv): query row `i` sees keys `0..visible_keys(i)`. Rows that see no key
    /// (possible when seq_q > seq_kv) have output 0 in every variant.
    pub fn visible_keys(&self, causal: bool, row: usize) -> usize {
        if !causal {
            return self.seq_kv;
        }
        let v = row as i64 + self.seq_kv as i64 - self.seq_q as i64 + 1;
        v.clamp(0, self.seq_kv as i64) as usize
    }
    /// The first query row whose causal bound admits `key`: `visible_keys(causal, r) > key`
    /// exactly for the rows `r` from it on (`seq_q` when no row sees `key`).
    pub fn first_row_seeing(&self, causal: bool, key: usize) -> usize {
        if key >= self.seq_kv {
            return self.seq_q;
        }
        if !causal {
            return 0;
        }
        let r = key as i64 + self.seq_q as i64 - self.seq_kv as i64;
        r.clamp(0, self.seq_q as i64) as usize
    }
    /// Keys `lo..hi` that query row `row` attends to: the causal bound of `visible_keys`,
    /// and with a sliding window only the last `window` of those (Transformers Inference Optimization Toolset, "Sliding window
    /// attention"; for a non-causal row, the last `window` keys of the sequence).
    pub fn key_range(&self, causal: bool, window: Option<usize>, row: usize) -> Range<usize> {
        let hi = self.visible_keys(causal, row);
        hi.saturating_sub(window.unwrap_or(hi))..hi
    }
    /// Number of (query, key) pairs attended, per (batch, head), with a sliding window: the
    /// sum over rows of `key_range(..).len()`, in closed form (O(1) at any length).
    pub fn attended_pairs_per_head(&self, causal: bool, window: Option<usize>) -> u64 {
        // Row i sees min(visible_keys(i), window) keys; visible_keys(i) is the clamp of
        // i + c to 0..=n_kv (c = n_kv - n_q + 1 when causal).
        let cap = window.map_or(self.seq_kv, |w| w.min(self.seq_kv)) as i128;
        let nq = self.seq_q as i128;
        if !causal {
            return u64::try_from(nq * cap).unwrap_or(u64::MAX);
        }
        // F(x) = sum of min(max(t, 0), cap) over t = 0..x.
        let f = |x: i128| -> i128 {
            let x = x.max(0);
            if x <= cap + 1 {
                x * (x - 1) / 2
            } else {
                cap * (cap + 1) / 2 + (x - 1 - cap) * cap
            }
        };
        let c = self.seq_kv as i128 - nq + 1;
        u64::try_from(f(c + nq) - f(c)).unwrap_or(u64::MAX)
    }
    /// Attention sinks (Xiao et al., "Efficient Streaming Language Models with Attention
    /// Sinks", as the Transformers Inference Optimization Toolset cites it): the first `sinks`
    /// keys stay visible to every row beside its sliding window. Row `row`'s sink keys are
    /// `0..min(sinks, window start)`: those before its window (the window's own are in
    /// `key_range`), so the two ranges never overlap; empty without a window, where every key
    /// up to the causal bound is visible already.
    pub fn sink_range(
        &self,
        causal: bool,
        window: Option<usize>,
        sinks: usize,
        row: usize,
    ) -> Range<usize> {
        match window {
            Some(_) => 0..sinks.min(self.key_range(causal, window, row).start),
            None => 0..0,
        }
    }
    /// Number of sink (query, key) pairs per (batch, head): the sum over rows of
    /// `sink_range(..).len()`, in closed form (O(1) at any length).
    pub fn sink_pairs_per_head(&self, causal: bool, window: Option<usize>, sinks: usize) -> u64 {
        let Some(w) = window else { return 0 };
        // Row i's window starts at max(hi - w, 0), hi its causal bound, so it sees
        // clamp(hi - w, 0, sinks) sink keys.
        let (w, s, nq) = (w as i128, sinks as i128, self.seq_q as i128);
        let nkv = self.seq_kv as i128;
        if !causal {
            return u64::try_from(nq * (nkv - w).clamp(0, s)).unwrap_or(u64::MAX);
        }
        // G(x) = sum of clamp(y - w, 0, s) over y = 0..x; causal rows have hi = i + c
        // (c = n_kv - n_q + 1, never above n_kv; rows with i + c <= 0 see nothing).
        let g = |x: i128| -> i128 {
            let u = x - 1 - w;
            if u <= 0 {
                0
            } else if u <= s {
                u * (u + 1) / 2
            } else {
                s * (s + 1) / 2 + (u - s) * s
            }
        };
        let c = nkv - nq + 1;
        u64::try_from(g(c + nq) - g(c)).unwrap_or(u64::MAX)
    }
    /// (query, key) pairs per head that `case`'s mask attends: its window's and its sinks'.
    fn pairs(&self, case: &Case) -> u64 {
        let sinks = case.sinks.unwrap_or(0);
        self.attended_pairs_per_head(case.causal, case.window)
            .saturating_add(self.sink_pairs_per_head(case.causal, case.window, sinks))
    }
    /// Number of (query, key) pairs that are not masked, per (batch, head).
    pub fn unmasked_pairs_per_head(&self, causal: bool) -> u64 {
        self.attended_pairs_per_head(causal, None)
    }
    /// Forward FLOPs by the FlashAttention convention: 4 * b * h * (unmasked pairs) * d
    /// (two matmuls of 2 FLOPs per multiply-add; softmax not counted).
    pub fn fwd_flops(&self, causal: bool) -> f64 {
        4.0 * self.batch as f64
            * self.heads as f64
            * self.unmasked_pairs_per_head(causal) as f64
            * self.head_dim as f64
    }
}

/// The attention variants by name: the plain identifiers every layer may hold. What each
/// one does is the registry's (`crate::variant`: `VariantId::get`, the only match on
/// behaviour); a new member is one line here, its file and one registry arm there.
macro_rules! variant_ids {
    ($($id:ident = $name:literal,)*) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum VariantId {
            $($id,)*
        }

        impl VariantId {
            pub const ALL: [VariantId; [$(VariantId::$id,)*].len()] = [$(VariantId::$id,)*];

            /// The name configs, CSV rows and the CLI use.
            pub const fn name(self) -> &'static str {
                match self {
                    $(VariantId::$id => $name,)*
                }
            }
        }
    };
}

variant_ids! {
    Naive = "naive",
    NaiveUnsafe = "naive-unsafe",
    RabeStaats = "rabe-staats",
    RabeStaatsSeq = "rabe-staats-seq",
    Flash = "flash",
    ChunkedPrefill = "chunked-prefill",
    FlashVarlen = "flash-varlen",
    DecodeNaive = "decode-naive",
    DecodeOnline = "decode-online",
    FlashDecoding = "flash-decoding",
    PagedDecode = "paged-decode",
    CascadeDecode = "cascade-decode",
    MlaDecode = "mla-decode",
    RingDecode = "ring-decode",
    TreeDecode = "tree-decode",
    RingPrefill = "ring-prefill",
    StripePrefill = "stripe-prefill",
    LayerVanilla = "layer-vanilla",
    LayerMemEff = "layer-memeff",
    LayerBpt = "layer-bpt",
    RingDecodeMpi = "ring-decode-mpi",
    RingPrefillMpi = "ring-prefill-mpi",
    TreeDecodeMpi = "tree-decode-mpi",
    TreeDecodeMpiExplicit = "tree-decode-mpi-explicit",
    External = "external",
}

impl VariantId {
    /// The names a config may give as they are (`external` is not one: an external
    /// implementation is named `plugin:NAME` or `python:NAME`).
    pub fn names() -> Vec<&'static str> {
        Self::ALL
            .iter()
            .filter(|v| **v != VariantId::External)
            .map(|v| v.name())
            .collect()
    }
}

/// How to start the worker of one external implementation (the config's `[plugins]` and
/// `[python]` tables), keyed in [`Externals`] by its variant name (`plugin:NAME`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ExternalSpec {
    /// A shared library with attnbench's C ABI, served by `attnbench worker --plugin`.
    Plugin {
        library: std::path::PathBuf,
        /// Seconds one request may take before the worker counts as hung.
        timeout_s: f64,
    },
    /// A Python callable `module:function`, served by `python -m attnbench_peer`.
    Python {
        call: String,
        /// The array kind the callable takes: `numpy`, `torch` or `lists`.
        arrays: String,
        /// The interpreter.
        python: String,
        /// Directories put in front of `PYTHONPATH`.
        path: Vec<std::path::PathBuf>,
        timeout_s: f64,
    },
}

impl ExternalSpec {
    pub fn timeout_s(&self) -> f64 {
        match self {
            ExternalSpec::Plugin { timeout_s, .. } | ExternalSpec::Python { timeout_s, .. } => {
                *timeout_s
            }
        }
    }
}

/// The external implementations a config defines, by variant name.
pub type Externals = std::collections::BTreeMap<String, ExternalSpec>;

/// What runs an external implementation: `plugin:NAME`, a library with attnbench's C ABI
/// (`include/attnbench.h`, the config's `[plugins]` table), or `python:NAME`, a Python
/// callable served by `attnbench-peer` (`[python]`). Either runs in a worker process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExternalKind {
    Plugin,
    Python,
}

impl ExternalKind {
    pub const ALL: [ExternalKind; 2] = [ExternalKind::Plugin, ExternalKind::Python];

    /// The prefix of its variant names.
    pub fn prefix(self) -> &'static str {
        match self {
            ExternalKind::Plugin => "plugin",
            ExternalKind::Python => "python",
        }
    }

    /// The config table that defines them.
    pub fn table(self) -> &'static str {
        match self {
            ExternalKind::Plugin => "plugins",
            ExternalKind::Python => "python",
        }
    }

    /// `plugin:NAME` or `python:NAME` split into the kind and the name; `None` for any
    /// other string (an attnbench variant's name, say).
    pub fn split(variant: &str) -> Option<(ExternalKind, &str)> {
        let (prefix, name) = variant.split_once(':')?;
        let kind = Self::ALL.into_iter().find(|k| k.prefix() == prefix)?;
        Some((kind, name))
    }
}

impl fmt::Display for VariantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for VariantId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown variant `{s}` (expected one of: {})",
                    Self::names().join(", ")
                )
            })
    }
}

impl Serialize for VariantId {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for VariantId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Devices per node of the two-level allreduce when the axis value does not say (a DGX
/// H100 node, the paper's cluster).
pub const DEFAULT_PER_NODE: usize = 8;

/// The allreduce algorithm of the simulated collectives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Allreduce {
    Ring,
    Tree,
    /// Ring inside nodes of `per_node` devices, binomial tree across nodes.
    TwoLevel {
        per_node: usize,
    },
}

impl Allreduce {
    /// Why this algorithm cannot run on `p` devices, if so.
    pub fn unsupported(self, p: usize) -> Option<String> {
        match self {
            Allreduce::TwoLevel { per_node: 0 } => {
                Some("two-level allreduce needs at least 1 device per node".into())
            }
            Allreduce::TwoLevel { per_node } if p > per_node && !p.is_multiple_of(per_node) => Some(
                format!(
                    "two-level allreduce needs whole nodes: {p} devices is not a multiple of {per_node} per node"
                ),
            ),
            _ => None,
        }
    }
}

impl fmt::Display for Allreduce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Allreduce::Ring => f.write_str("ring"),
            Allreduce::Tree => f.write_str("tree"),
            Allreduce::TwoLevel { per_node } => write!(f, "two-level:{per_node}"),
        }
    }
}

impl FromStr for Allreduce {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let expected = "expected ring, tree, two-level (8 devices per node) or two-level:N";
        match s {
            "ring" => Ok(Allreduce::Ring),
            "tree" => Ok(Allreduce::Tree),
            "two-level" => Ok(Allreduce::TwoLevel {
                per_node: DEFAULT_PER_NODE,
            }),
            _ => {
                let n = s
                    .strip_prefix("two-level:")
                    .ok_or_else(|| format!("unknown allreduce `{s}` ({expected})"))?;
                match n.parse::<usize>() {
                    Ok(per_node) if per_node > 0 => Ok(Allreduce::TwoLevel { per_node }),
                    _ => Err(format!(
                        "unknown allreduce `{s}`: devices per node must be a positive integer ({expected})"
                    )),
                }
            }
        }
    }
}

impl Serialize for Allreduce {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> serde::Deserialize<'de> for Allreduce {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The three transformer-layer designs Liu & Abbeel compare (Blockwise Parallel
/// Transformer, Section 3): materialized attention, memory-efficient attention, BPT.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Design {
    Vanilla,
    MemEff,
    Bpt,
}

impl Design {
    pub const ALL: [Design; 3] = [Design::Vanilla, Design::MemEff, Design::Bpt];

    pub fn name(self) -> &'static str {
        match self {
            Design::Vanilla => "vanilla",
            Design::MemEff => "memeff",
            Design::Bpt => "bpt",
        }
    }
}

/// One point of the sweep grid: everything that determines a measurement. Its JSON form
/// (serde) is what the worker protocol sends (`crate::worker`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Case {
    pub variant: VariantId,
    pub mode: Mode,
    pub device: Device,
    pub dtype: DType,
    pub shape: Shape,
    /// Effective chunk sizes (already clamped to the sequence, `min(chunk, n)` as in the
    /// paper); `None` for variants that do not chunk that loop.
    pub q_chunk: Option<usize>,
    pub kv_chunk: Option<usize>,
    pub causal: bool,
    /// Sliding-window length: each query attends to the last `window` keys up to its causal
    /// bound (`Shape::key_range`); `None` = full attention.
    pub window: Option<usize>,
    /// Simulated devices across which the sequence is sharded (`src/sim/`); 1 = no sharding.
    pub devices: usize,
    /// Split-KV parts of flash-decoding; `None` for variants that do not split the cache.
    pub splits: Option<usize>,
    /// The allreduce algorithm of the simulated collectives; `None` for variants that use
    /// none.
    pub allreduce: Option<Allreduce>,
    pub threads: usize,
    pub input_dist: InputDist,
    /// Multiplies the generated Q and K (so scores scale by its square): large values show
    /// the overflow that max subtraction prevents.
    pub input_scale: f64,
    pub seed: u64,
    /// Upstream gradient of `fwd+bwd` cases (ignored by other modes).
    pub d_out: UpstreamGrad,
    /// The external implementation of a `VariantId::External` case (`plugin:NAME`,
    /// `python:NAME`), which is its variant name in rows; `None` for attnbench's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<String>,
    /// A paged KV cache (`paged-decode`): page size and page order; `None` for a
    /// contiguous cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paging: Option<Paging>,
    /// Prompt tokens per step of a chunked prefill (`chunked-prefill`); `None` for the
    /// others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_chunk: Option<usize>,
    /// A ragged batch (`flash-varlen`): its sequences' lengths. The shape is then the packed
    /// one, batch 1 and `seq_q`, `seq_kv` the totals (`[1, heads, total, d]`, each sequence's
    /// rows consecutive in every head); `None` for a batch of equal lengths.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_spec: Option<BatchSpec>,
    /// The CPU kernel path the case forces (the `kernel_path` axis); `None`: this CPU's
    /// default (`backend::cpu::isa`, measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_path: Option<Isa>,
    /// A decode batch whose requests share their first `prefix_len` cached tokens (the
    /// `prefix_len` axis: parallel sampling, RadixAttention's shared prompt): the inputs
    /// copy batch item 0's first `prefix_len` keys and values into every other item
    /// (`Inputs::share_prefix`); `None`: every request's cache its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_len: Option<usize>,
    /// K and V stored as FP8 in this format, with one scale per (sequence, KV head)
    /// (`problem::fp8`); Q stays in `dtype`. `None`: K and V in `dtype`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_dtype: Option<Fp8Format>,
    /// Multi-head latent attention's cache (`mla-decode`): latent and RoPE dimensions;
    /// `None` for the standard Q, K, V of every other variant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mla: Option<Mla>,
    /// Attention sinks: the first `sinks` keys stay visible to every query beside its
    /// sliding window (`Shape::sink_range`); `None`: the window alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sinks: Option<usize>,
    /// P's precision for PV (the `precision` axis); `None`: `fast`, the kernels' default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<Precision>,
}

impl Case {
    /// P's precision for PV: the case's, else `fast`.
    pub fn precision(&self) -> Precision {
        self.precision.unwrap_or(Precision::Fast)
    }

    /// Whether the case keeps P in f32 for PV (`precision = highest`).
    pub fn highest(&self) -> bool {
        self.precision() == Precision::Highest
    }

    /// The variant's name as rows, ids and messages give it: an external implementation's
    /// `plugin:NAME` or `python:NAME`, else the registry's name.
    pub fn variant_name(&self) -> &str {
        match &self.external {
            Some(name) if self.variant == VariantId::External => name,
            _ => self.variant.name(),
        }
    }

    /// A stable, readable key: every field that distinguishes two cases. `--resume` and
    /// `compare` match rows by it.
    pub fn id(&self) -> String {
        let chunk = |c: Option<usize>| c.map_or_else(|| "-".to_string(), |c| c.to_string());
        let s = &self.shape;
        format!(
            "{}|{}|{}|{}|b{}h{}kv{}|q{}k{}|d{}|qc{}kc{}|c{}|w{}|p{}|t{}|{}x{}|s{}",
            self.variant_name(),
            self.mode,
            self.device,
            self.dtype,
            s.batch,
            s.heads,
            s.kv_heads,
            s.seq_q,
            s.seq_kv,
            s.head_dim,
            chunk(self.q_chunk),
            chunk(self.kv_chunk),
            u8::from(self.causal),
            chunk(self.window),
            self.devices,
            self.threads,
            self.input_dist,
            self.input_scale,
            self.seed
        ) + &match self.mode {
            Mode::FwdBwd => format!("|dO{}", self.d_out),
            _ => String::new(),
        } + &self.splits.map_or(String::new(), |n| format!("|sp{n}"))
            + &self.allreduce.map_or(String::new(), |a| format!("|ar{a}"))
            + &self
                .paging
                .map_or(String::new(), |p| format!("|pg{}{}", p.page_size, p.order))
            + &self
                .prefill_chunk
                .map_or(String::new(), |c| format!("|pc{c}"))
            + &self
                .batch_spec
                .as_ref()
                .map_or(String::new(), |b| format!("|bs{b}"))
            + &self
                .kernel_path
                .map_or(String::new(), |p| format!("|kp{p}"))
            + &self.prefix_len.map_or(String::new(), |n| format!("|px{n}"))
            + &self.kv_dtype.map_or(String::new(), |f| format!("|kv{f}"))
            + &self.mla.map_or(String::new(), |m| {
                format!("|mla{}r{}", m.latent_dim, m.rope_dim)
            })
            + &self.sinks.map_or(String::new(), |n| format!("|sk{n}"))
            + &self.precision.map_or(String::new(), |p| format!("|pr{p}"))
    }

    /// Why the case's `sinks` cannot be made (a `skipped` row, `run`'s exit 2): sinks are
    /// the keys a sliding window keeps visible, at most the whole context, and only the CPU
    /// kernels keep them (for every variant with sinks, `Variant::sinks`).
    pub fn sinks_problem(&self) -> Option<String> {
        let n = self.sinks?;
        if self.device == Device::Cuda {
            return Some(format!(
                "variant {} has no CUDA kernel for attention sinks yet",
                self.variant_name()
            ));
        }
        if self.window.is_none() {
            return Some(format!(
                "sinks ({n}) are the first keys a sliding window keeps visible: set window (without one every key is visible already)"
            ));
        }
        (n > self.shape.seq_kv).then(|| {
            format!(
                "sinks ({n}) are more than the context's tokens (seq_kv = {})",
                self.shape.seq_kv
            )
        })
    }

    /// Why the case's `prefix_len` cannot be made (a `skipped` row, `run`'s exit 2): a
    /// shared prefix is a decode batch's cache of equal lengths, at most the whole cache.
    pub fn prefix_problem(&self) -> Option<String> {
        let n = self.prefix_len?;
        if self.mode != Mode::Decode {
            return Some(format!(
                "prefix_len ({n}) is a decode batch's shared cached prefix: mode decode only (this case is mode {})",
                self.mode
            ));
        }
        if self.batch_spec.is_some() {
            return Some(format!(
                "prefix_len ({n}) needs a batch of equal lengths, not a ragged batch_spec"
            ));
        }
        (n > self.shape.seq_kv).then(|| {
            format!(
                "prefix_len ({n}) is longer than the context (seq_kv = {})",
                self.shape.seq_kv
            )
        })
    }

    /// Where each sequence sits in Q, K, V and O (packed for a ragged batch).
    pub fn seq_layout(&self) -> SeqLayout {
        SeqLayout::of(&self.shape, self.batch_spec.as_ref())
    }

    /// Effective (query, key/value) chunk sizes: the case's, else the given defaults, each
    /// clamped to `1..=n` (the paper's `min(chunk, n)`).
    pub fn chunks_or(&self, q_default: usize, kv_default: usize) -> (usize, usize) {
        let s = &self.shape;
        let q = self.q_chunk.unwrap_or(q_default).min(s.seq_q).max(1);
        let kv = self.kv_chunk.unwrap_or(kv_default).min(s.seq_kv).max(1);
        (q, kv)
    }

    /// FLOPs by the FlashAttention convention: the forward's, and 3.5x that for forward +
    /// backward (the backward counted as 2.5 forwards).
    pub fn flops(&self) -> f64 {
        if self.mode.is_layer() {
            return self.layer_flops();
        }
        let s = &self.shape;
        // MLA (absorbed, as mla-decode computes it): per attended pair 2 (d_c + d_r) FLOPs
        // of score and 2 d_c of value; per row 2 d_c d_h each to absorb W_UK and W_UV.
        if let Some(m) = self.mla {
            let rows = (s.batch * s.heads * s.seq_q) as f64;
            let pairs = (s.batch * s.heads) as f64 * self.attended_pairs_per_head() as f64;
            let per_pair = 2.0 * (2 * m.latent_dim + m.rope_dim) as f64;
            return pairs * per_pair + rows * 4.0 * (m.latent_dim * s.head_dim) as f64;
        }
        let fwd = 4.0
            * s.batch as f64
            * s.heads as f64
            * self.attended_pairs_per_head() as f64
            * s.head_dim as f64;
        match self.mode {
            Mode::FwdBwd => 3.5 * fwd,
            _ => fwd,
        }
    }

    /// (query, key) pairs attended per head: summed over the sequences of a ragged batch
    /// (each against its own keys), else the shape's.
    pub fn attended_pairs_per_head(&self) -> u64 {
        let s = &self.shape;
        match &self.batch_spec {
            Some(spec) => spec
                .sequences()
                .map(|(q, kv)| {
                    Shape {
                        seq_q: q,
                        seq_kv: kv,
                        ..*s
                    }
                    .pairs(self)
                })
                .sum(),
            None => s.pairs(self),
        }
    }

    /// Bytes of Q, K, V (storage dtype) and O (f32); for `fwd+bwd` also dO, dQ, dK and dV
    /// (f32). These are live before the call and excluded from the memory overhead.
    pub fn io_bytes(&self) -> u64 {
        if self.mode.is_layer() {
            return self.layer_io_bytes();
        }
        let s = &self.shape;
        // An MLA case's inputs are its latent cache, queries and up-projections only.
        if let Some(m) = self.mla {
            return m.input_bytes(s, self.dtype) + 4 * s.out_len() as u64;
        }
        // A paged cache is its pool of whole pages and the block table instead.
        let (kv, table) = match self.paging {
            Some(p) => {
                let seqs = self.seq_layout();
                (p.pool_len(s, &seqs), 4 * p.table_len(&seqs))
            }
            None => (s.kv_len(), 0),
        };
        // An FP8 cache is its codes and one f32 scale per (sequence, KV head) of K and of V.
        let kv_bytes = match self.kv_dtype {
            Some(_) => 2 * (kv + 4 * s.batch * s.kv_heads),
            None => 2 * kv * self.dtype.size_bytes(),
        };
        let fwd = s.q_len() * self.dtype.size_bytes() + kv_bytes + s.out_len() * 4 + table;
        let train = match self.mode {
            Mode::FwdBwd => (s.out_len() + s.q_len() + 2 * s.kv_len()) * 4,
            _ => 0,
        };
        (fwd + train) as u64
    }

    /// Hidden size of a layer case (`heads * head_dim`).
    pub fn hidden(&self) -> usize {
        self.shape.heads * self.shape.head_dim
    }

    /// Elements of a layer case's input (and output): `b * s * h`.
    pub fn tokens_len(&self) -> usize {
        self.shape.batch * self.shape.seq_q * self.hidden()
    }

    /// FLOPs of one layer call: the forward's GEMMs (QKV 6h^2, output 2h^2, FFN 16h^2 per
    /// token) plus the attention's (FlashAttention convention); a training step counts the
    /// forward, its recomputation and a backward of twice the GEMMs and 2.5x the attention.
    fn layer_flops(&self) -> f64 {
        let s = &self.shape;
        let h = self.hidden() as f64;
        let tokens = (s.batch * s.seq_q) as f64;
        let gemm = 24.0 * tokens * h * h;
        let attn = s.fwd_flops(self.causal);
        match self.mode {
            Mode::LayerTrain => 4.0 * gemm + 4.5 * attn,
            _ => gemm + attn,
        }
    }

    /// Bytes live before a layer call and excluded from its activation memory: x and out,
    /// the parameters; for training also dout, dx and the parameter gradient.
    fn layer_io_bytes(&self) -> u64 {
        let io = 2 * self.tokens_len() + layer_param_count(self.hidden());
        let train = match self.mode {
            Mode::LayerTrain => 2 * self.tokens_len() + layer_param_count(self.hidden()),
            _ => 0,
        };
        4 * (io + train) as u64
    }
}

/// One tensor in its storage dtype.
#[derive(Clone, Debug, PartialEq)]
pub enum Tensor {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
}

impl Tensor {
    pub fn dtype(&self) -> DType {
        match self {
            Tensor::F32(_) => DType::F32,
            Tensor::Bf16(_) => DType::Bf16,
            Tensor::F16(_) => DType::F16,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Tensor::F32(v) => v.len(),
            Tensor::Bf16(v) => v.len(),
            Tensor::F16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Round f32 values into `dtype` storage.
    pub fn from_f32(values: Vec<f32>, dtype: DType) -> Tensor {
        Tensor::collect_f32(values.into_iter(), dtype)
    }

    /// `collect_f32` of `len` values into storage reserved fallibly: `OutOfMemory` naming
    /// `what` where the allocator refuses (a case's inputs are a row's `oom`, not an abort).
    pub fn try_collect_f32(
        len: usize,
        values: impl Iterator<Item = f32>,
        dtype: DType,
        what: &str,
    ) -> crate::error::Result<Tensor> {
        Ok(match dtype {
            DType::F32 => Tensor::F32(try_collect(len, values, what)?),
            DType::Bf16 => Tensor::Bf16(try_collect(len, values.map(bf16::from_f32), what)?),
            DType::F16 => Tensor::F16(try_collect(len, values.map(f16::from_f32), what)?),
        })
    }

    /// Round f32 values into `dtype` storage as they come (no f32 buffer of the whole
    /// tensor unless the storage is f32; a `Vec`'s own iterator is collected in place).
    pub fn collect_f32(values: impl Iterator<Item = f32>, dtype: DType) -> Tensor {
        match dtype {
            DType::F32 => Tensor::F32(values.collect()),
            DType::Bf16 => Tensor::Bf16(values.map(bf16::from_f32).collect()),
            DType::F16 => Tensor::F16(values.map(f16::from_f32).collect()),
        }
    }

    /// Element `i` widened to f64 (exact for every storage dtype).
    #[inline]
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            Tensor::F32(v) => v[i] as f64,
            Tensor::Bf16(v) => v[i].to_f64(),
            Tensor::F16(v) => v[i].to_f64(),
        }
    }

    /// Calls `f` with every element widened to f32 (exact for every storage dtype), in order.
    pub fn for_each_f32(&self, mut f: impl FnMut(f32)) {
        match self {
            Tensor::F32(v) => v.iter().for_each(|&x| f(x)),
            Tensor::Bf16(v) => v.iter().for_each(|x| f(x.to_f32())),
            Tensor::F16(v) => v.iter().for_each(|x| f(x.to_f32())),
        }
    }

    /// The f32 slice itself when stored as f32 (kernels then read it in place, no copy).
    #[inline]
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self {
            Tensor::F32(v) => Some(v),
            _ => None,
        }
    }
}

/// Gradients of the attention inputs, f32 whatever the storage dtype: dQ like Q,
/// dK and dV like K and V (summed over the query heads that share a key/value head).
#[derive(Clone, Debug, PartialEq)]
pub struct Grads {
    pub dq: Vec<f32>,
    pub dk: Vec<f32>,
    pub dv: Vec<f32>,
}

/// Q, K, V of one case.
#[derive(Clone, Debug, PartialEq)]
pub struct Inputs {
    pub shape: Shape,
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    /// The same K and V in pools of pages, one per paging the cases on these inputs use
    /// (`Case::paging`); `k` and `v` stay the logical cache the oracle and the other
    /// variants read.
    pub paged: Vec<PagedKv>,
    /// The same K and V in FP8, one per format the cases on these inputs use
    /// (`Case::kv_dtype`); `k` and `v` stay the cache in the storage dtype.
    pub fp8: Vec<Fp8Kv>,
    /// Multi-head latent attention's inputs, for the cases on these inputs that read them
    /// (`Case::mla`); `None` otherwise.
    pub mla: Option<Box<MlaInputs>>,
}

impl Inputs {
    /// Seeded inputs. The stream depends on (seed, shape, dtype, dist, scale) only, never on
    /// the variant, so every variant of a sweep sees the same Q, K, V.
    pub fn generate(shape: Shape, dtype: DType, dist: InputDist, scale: f64, seed: u64) -> Inputs {
        Inputs::try_generate(shape, dtype, dist, scale, seed).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `generate`, with `OutOfMemory` where a tensor cannot be allocated.
    pub fn try_generate(
        shape: Shape,
        dtype: DType,
        dist: InputDist,
        scale: f64,
        seed: u64,
    ) -> crate::error::Result<Inputs> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // Each value is rounded into the storage dtype as it is drawn (`collect_f32`: a
        // 2 GiB bf16 cache does not pass through 4 GiB of f32).
        let mut gen = |n: usize, scaled: bool, what: &str| {
            let f = if scaled { scale as f32 } else { 1.0 };
            let values = (0..n).map(|_| dist.draw(&mut rng) * f);
            Tensor::try_collect_f32(n, values, dtype, what)
        };
        let q = gen(shape.q_len(), true, "input Q")?;
        let k = gen(shape.kv_len(), true, "input K")?;
        let v = gen(shape.kv_len(), false, "input V")?;
        Ok(Inputs {
            shape,
            q,
            k,
            v,
            paged: Vec::new(),
            fp8: Vec::new(),
            mla: None,
        })
    }

    /// The inputs of `case`: generated from its seed, with the page pool its paging needs.
    pub fn for_case(case: &Case) -> Inputs {
        Inputs::try_for_case(case).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `for_case`, with `OutOfMemory` where a tensor or the pool cannot be allocated (what
    /// a measured case's row reports as `oom`).
    pub fn try_for_case(case: &Case) -> crate::error::Result<Inputs> {
        // An MLA case reads its latent cache only: no Q, K, V of the shape are drawn.
        let shape = match case.mla {
            Some(_) => Shape {
                batch: 0,
                ..case.shape
            },
            None => case.shape,
        };
        let mut x = Inputs::try_generate(
            shape,
            case.dtype,
            case.input_dist,
            case.input_scale,
            case.seed,
        )?;
        x.shape = case.shape;
        x.share_prefix(case).try_prepared_for(case)
    }

    /// These inputs with what `case` reads beside the logical cache: its page pool
    /// (`try_paged_for`) and its FP8 cache (`try_fp8_for`).
    pub fn try_prepared_for(self, case: &Case) -> crate::error::Result<Inputs> {
        self.try_paged_for(case)?.try_fp8_for(case)
    }

    /// These inputs with the FP8 cache of `case`'s `kv_dtype` (quantized from `k` and `v`
    /// unless they have it already); unchanged for a case without one.
    pub fn try_fp8_for(mut self, case: &Case) -> crate::error::Result<Inputs> {
        if let Some(f) = case.kv_dtype {
            if self.fp8_kv(f).is_none() {
                let head = self.shape.seq_kv * self.shape.head_dim;
                self.fp8.push(Fp8Kv::try_build(&self.k, &self.v, head, f)?);
            }
        }
        Ok(self)
    }

    /// The FP8 cache in format `f`, if these inputs hold it.
    pub fn fp8_kv(&self, f: Fp8Format) -> Option<&Fp8Kv> {
        self.fp8.iter().find(|x| x.format() == f)
    }

    /// The inputs the oracle checks an FP8 case against: K and V as that case's kernels
    /// read them (`Fp8Tensor::try_dequantized`, f32), Q unchanged; allocated fallibly, and an
    /// error where these inputs hold no such cache.
    pub fn try_dequantized(&self, f: Fp8Format) -> crate::error::Result<Inputs> {
        let kv = self
            .fp8_kv(f)
            .ok_or_else(|| crate::error::Error::Runtime(format!("the inputs hold no {f} cache")))?;
        Ok(Inputs {
            shape: self.shape,
            q: self.q.clone(),
            k: Tensor::F32(kv.k.try_dequantized("the oracle's dequantized K")?),
            v: Tensor::F32(kv.v.try_dequantized("the oracle's dequantized V")?),
            paged: Vec::new(),
            fp8: Vec::new(),
            mla: None,
        })
    }

    /// These inputs with `case.prefix_len` cached tokens shared by the batch: batch item
    /// 0's first `prefix_len` keys and values (every KV head) copied into every other item,
    /// so each request's logical cache is [shared prefix | private suffix] and every
    /// variant and the oracle read the same caches. Before any page pool is built (the pool
    /// copies K and V). Unchanged without a prefix, for a ragged batch (a skipped case) or
    /// a prefix longer than the cache (likewise); idempotent. O(batch x prefix x d) time.
    pub fn share_prefix(mut self, case: &Case) -> Inputs {
        let s = self.shape;
        let n = match case.prefix_len {
            Some(n) if n > 0 && n <= s.seq_kv && case.batch_spec.is_none() => n,
            _ => return self,
        };
        let (row, len) = (s.seq_kv * s.head_dim, n * s.head_dim);
        fn copy<T: Copy>(x: &mut [T], kv_heads: usize, batch: usize, row: usize, len: usize) {
            for b in 1..batch {
                for g in 0..kv_heads {
                    let (src, dst) = (g * row, (b * kv_heads + g) * row);
                    x.copy_within(src..src + len, dst);
                }
            }
        }
        for t in [&mut self.k, &mut self.v] {
            match t {
                Tensor::F32(x) => copy(x, s.kv_heads, s.batch, row, len),
                Tensor::Bf16(x) => copy(x, s.kv_heads, s.batch, row, len),
                Tensor::F16(x) => copy(x, s.kv_heads, s.batch, row, len),
            }
        }
        self
    }

    /// These inputs with the page pool `case` reads (built from `k` and `v` unless they
    /// have it already); unchanged for a case of a contiguous cache.
    pub fn paged_for(self, case: &Case) -> Inputs {
        self.try_paged_for(case).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `paged_for`, with `OutOfMemory` where the pool cannot be allocated. Also what else
    /// `case` reads that these inputs lack (inputs shared by an interleave group): the MLA
    /// inputs of an MLA case, the Q, K, V of another case where only MLA ones are held.
    pub fn try_paged_for(mut self, case: &Case) -> crate::error::Result<Inputs> {
        match case.mla {
            Some(m) if self.mla.as_ref().is_none_or(|x| x.mla != m) => {
                self.mla = Some(Box::new(MlaInputs::try_generate(
                    &case.shape,
                    m,
                    case.dtype,
                    case.input_dist,
                    case.input_scale,
                    case.seed,
                )?));
            }
            None if self.k.len() != case.shape.kv_len() => {
                let mla = self.mla.take();
                self = Inputs::try_generate(
                    case.shape,
                    case.dtype,
                    case.input_dist,
                    case.input_scale,
                    case.seed,
                )?;
                self.mla = mla;
            }
            _ => {}
        }
        if let Some(p) = case.paging {
            if self.pool(p).is_none() {
                let seqs = case.seq_layout();
                let pool = PagedKv::build(&self.shape, &seqs, &self.k, &self.v, p, case.seed)?;
                self.paged.push(pool);
            }
        }
        Ok(self)
    }

    /// The pool of paging `p`, if these inputs hold it.
    pub fn pool(&self, p: Paging) -> Option<&PagedKv> {
        self.paged.iter().find(|x| x.paging == p)
    }

    pub fn dtype(&self) -> DType {
        self.q.dtype()
    }
}

/// `len` values of `values` in a vector reserved fallibly (`OutOfMemory` naming `what`).
pub fn try_collect<T>(
    len: usize,
    values: impl Iterator<Item = T>,
    what: &str,
) -> crate::error::Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| {
        crate::error::Error::OutOfMemory(format!(
            "{what}: {} bytes could not be allocated",
            len as u128 * std::mem::size_of::<T>() as u128
        ))
    })?;
    v.extend(values.take(len));
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(seq_q: usize, seq_kv: usize) -> Shape {
        Shape {
            batch: 1,
            heads: 2,
            kv_heads: 1,
            seq_q,
            seq_kv,
            head_dim: 4,
        }
    }

    #[test]
    fn the_rest_of_a_model_counts_the_measured_layers_weights_once() {
        // h = 256: 12 x 256^2 + 13 x 256 = 789,760 parameters, 16 B each per layer.
        assert_eq!(layer_state_bytes(256, 2), 25_272_320);
        // Training, 2 layers, 1024 tokens: 25,272,320 - 8 x 789,760 (weights and gradient
        // of the measured layer) + 4 x 1024 x 256 (the other layer's checkpointed input).
        assert_eq!(model_rest_bytes(256, 1024 * 256, 2, true), 20_002_816);
        // Forward: only the weights are the case's own.
        assert_eq!(model_rest_bytes(256, 1024 * 256, 2, false), 23_161_856);
        // One layer: its two Adam moments alone.
        assert_eq!(model_rest_bytes(256, 1024 * 256, 1, true), 6_318_080);
    }

    #[test]
    fn attended_pairs_in_closed_form_equal_the_sum_over_rows() {
        for nq in [0, 1, 2, 5, 17, 64] {
            for nkv in [0, 1, 3, 5, 17, 64, 100] {
                let s = shape(nq, nkv);
                for causal in [false, true] {
                    for window in [None, Some(0), Some(1), Some(4), Some(16), Some(200)] {
                        let rows: u64 = (0..nq)
                            .map(|i| s.key_range(causal, window, i).len() as u64)
                            .sum();
                        let got = s.attended_pairs_per_head(causal, window);
                        assert_eq!(got, rows, "{nq}x{nkv} causal {causal} window {window:?}");
                    }
                }
            }
        }
        // And at a length no loop over rows would finish: n(n+1)/2.
        let n = 1usize << 31;
        let expect = (n as u64) * (n as u64 + 1) / 2;
        assert_eq!(shape(n, n).unmasked_pairs_per_head(true), expect);
    }

    #[test]
    fn sink_pairs_in_closed_form_equal_the_sum_over_rows() {
        for nq in [0, 1, 2, 5, 17, 64] {
            for nkv in [0, 1, 3, 5, 17, 64, 100] {
                let s = shape(nq, nkv);
                for causal in [false, true] {
                    for window in [None, Some(0), Some(1), Some(4), Some(16), Some(200)] {
                        for sinks in [0, 1, 3, 4, 20, 100] {
                            let rows: u64 = (0..nq)
                                .map(|i| {
                                    let (a, b) = (
                                        s.sink_range(causal, window, sinks, i),
                                        s.key_range(causal, window, i),
                                    );
                                    assert!(a.end <= b.start || a.is_empty(), "overlap");
                                    assert!(a.len() <= sinks);
                                    a.len() as u64
                                })
                                .sum();
                            let got = s.sink_pairs_per_head(causal, window, sinks);
                            assert_eq!(
                                got, rows,
                                "{nq}x{nkv} causal {causal} window {window:?} sinks {sinks}"
                            );
                        }
                    }
                }
            }
        }
        // A row of 10 keys, window 3, 2 sinks: keys 0, 1 and 7, 8, 9.
        let s = shape(1, 10);
        assert_eq!(s.sink_range(true, Some(3), 2, 0), 0..2);
        assert_eq!(s.key_range(true, Some(3), 0), 7..10);
        // Sinks reaching into the window are the window's keys, counted once.
        assert_eq!(s.sink_range(true, Some(3), 9, 0), 0..7);
        assert_eq!(s.sink_range(true, None, 2, 0), 0..0);
    }

    #[test]
    fn causal_mask_is_bottom_right_aligned() {
        let s = shape(2, 5);
        assert_eq!(s.visible_keys(true, 0), 4);
        assert_eq!(s.visible_keys(true, 1), 5);
        let s = shape(5, 2);
        assert_eq!(s.visible_keys(true, 0), 0);
        assert_eq!(s.visible_keys(true, 3), 1);
        assert_eq!(s.visible_keys(true, 4), 2);
        assert_eq!(s.visible_keys(false, 0), 2);
    }

    /// `first_row_seeing` is the inverse of `visible_keys`: the rows from it on, and only
    /// they, see the key (more queries than keys, fewer, equal; keys past the end).
    #[test]
    fn first_row_seeing_inverts_visible_keys() {
        for (nq, nkv) in [(5, 2), (2, 5), (4, 4), (1, 7), (7, 1)] {
            let s = shape(nq, nkv);
            for causal in [false, true] {
                for key in 0..nkv + 2 {
                    let first = s.first_row_seeing(causal, key);
                    for r in 0..nq {
                        let sees = s.visible_keys(causal, r) > key;
                        assert_eq!(sees, r >= first, "{nq}x{nkv} causal {causal} key {key}");
                    }
                    assert!(first <= nq);
                }
            }
        }
    }

    #[test]
    fn causal_flops_count_unmasked_pairs_exactly() {
        let s = shape(4, 4);
        assert_eq!(s.unmasked_pairs_per_head(true), 1 + 2 + 3 + 4);
        assert_eq!(s.fwd_flops(false), 4.0 * 2.0 * 16.0 * 4.0);
    }

    #[test]
    fn generation_is_deterministic_and_dtype_rounded() {
        let s = shape(3, 3);
        let a = Inputs::generate(s, DType::Bf16, InputDist::Normal, 1.0, 7);
        let b = Inputs::generate(s, DType::Bf16, InputDist::Normal, 1.0, 7);
        assert_eq!(a, b);
        let c = Inputs::generate(s, DType::Bf16, InputDist::Normal, 1.0, 8);
        assert_ne!(a, c);
        let u = Inputs::generate(s, DType::F32, InputDist::Uniform, 1.0, 7);
        let Tensor::F32(v) = &u.v else { panic!() };
        assert!(v.iter().all(|x| (0.0..1.0).contains(x)));
    }
}
