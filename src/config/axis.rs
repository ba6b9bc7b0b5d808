//! The sweep axes as data: names in expansion order, value kinds, defaults, and the parsing
//! of one axis value (scalar, non-empty list, or `{pow2 = [lo, hi]}`) from TOML.

use serde::{Serialize, Serializer};
use std::fmt;
use toml::Value;

use crate::backend::cpu::isa::Isa;
use crate::problem::UpstreamGrad;
use crate::problem::{BatchSpec, DType, Device, Fp8Format, InputDist, Mode, PageOrder, Precision};
use crate::problem::{ExternalKind, VariantId};
use crate::sim::plan::Allreduce;

/// One sweep axis. Declaration order is the expansion order, outermost first: a sweep over
/// `seq_len` for one setting of everything else is consecutive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Axis {
    Variant,
    Mode,
    Device,
    DType,
    KvDtype,
    InputDist,
    InputScale,
    DOut,
    Causal,
    Threads,
    KernelPath,
    Precision,
    Devices,
    Allreduce,
    Batch,
    Heads,
    KvHeads,
    HeadDim,
    QChunk,
    KvChunk,
    Splits,
    PageOrder,
    PageSize,
    PrefillChunk,
    BatchSpec,
    LatentDim,
    RopeDim,
    Window,
    Sinks,
    PrefixLen,
    SeqKv,
    SeqLen,
}

/// The type an axis's values have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Variant,
    Mode,
    Device,
    DType,
    InputDist,
    DOut,
    Allreduce,
    PageOrder,
    BatchSpec,
    /// A CPU kernel path this CPU runs.
    KernelPath,
    /// P's precision for PV: `fast` or `highest`.
    Precision,
    /// How K and V are stored: `same` as Q, or an FP8 format.
    Fp8,
    /// Finite, >= 0.
    Scale,
    Bool,
    /// Integer > 0; also accepts the pow2 form.
    Size,
    /// `"none"` or an integer > 0: a setting a case may go without (a window, sinks, a
    /// shared prefix), so one list compares with and without it in the same rounds.
    OptSize,
}

/// What an axis that the config does not mention means.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum AxisDefault {
    Required,
    Fixed(AxisValue),
    /// Follows another axis or the variant per case; the text says how.
    Derived(&'static str),
}

pub const DEFAULT_MODE: Mode = Mode::Fwd;
pub const DEFAULT_DEVICE: Device = Device::Cpu;
pub const DEFAULT_DTYPE: DType = DType::F32;
pub const DEFAULT_INPUT_DIST: InputDist = InputDist::Normal;
pub const DEFAULT_INPUT_SCALE: f64 = 1.0;
pub const DEFAULT_D_OUT: UpstreamGrad = UpstreamGrad::Random;
pub const DEFAULT_BATCH: usize = 1;
pub const DEFAULT_HEADS: usize = 1;
pub const DEFAULT_HEAD_DIM: usize = 64;
pub const DEFAULT_DEVICES: usize = 1;
/// Largest exponent of the pow2 form (2^40 elements is already far past any memory).
pub const POW2_MAX_EXP: i64 = 40;

impl Axis {
    pub const ALL: [Axis; 32] = [
        Axis::Variant,
        Axis::Mode,
        Axis::Device,
        Axis::DType,
        Axis::KvDtype,
        Axis::InputDist,
        Axis::InputScale,
        Axis::DOut,
        Axis::Causal,
        Axis::Threads,
        Axis::KernelPath,
        Axis::Precision,
        Axis::Devices,
        Axis::Allreduce,
        Axis::Batch,
        Axis::Heads,
        Axis::KvHeads,
        Axis::HeadDim,
        Axis::QChunk,
        Axis::KvChunk,
        Axis::Splits,
        Axis::PageOrder,
        Axis::PageSize,
        Axis::PrefillChunk,
        Axis::BatchSpec,
        Axis::LatentDim,
        Axis::RopeDim,
        Axis::Window,
        Axis::Sinks,
        Axis::PrefixLen,
        Axis::SeqKv,
        Axis::SeqLen,
    ];

    /// The key in `[axes]`, `[[zip]]` and `--set`.
    pub fn name(self) -> &'static str {
        match self {
            Axis::Variant => "variant",
            Axis::Mode => "mode",
            Axis::Device => "device",
            Axis::DType => "dtype",
            Axis::KvDtype => "kv_dtype",
            Axis::InputDist => "input_dist",
            Axis::InputScale => "input_scale",
            Axis::DOut => "d_out",
            Axis::Causal => "causal",
            Axis::Threads => "threads",
            Axis::KernelPath => "kernel_path",
            Axis::Precision => "precision",
            Axis::Devices => "devices",
            Axis::Allreduce => "allreduce",
            Axis::Batch => "batch",
            Axis::Heads => "heads",
            Axis::KvHeads => "kv_heads",
            Axis::HeadDim => "head_dim",
            Axis::QChunk => "q_chunk",
            Axis::KvChunk => "kv_chunk",
            Axis::Splits => "splits",
            Axis::PageOrder => "page_order",
            Axis::PageSize => "page_size",
            Axis::PrefillChunk => "prefill_chunk",
            Axis::BatchSpec => "batch_spec",
            Axis::LatentDim => "latent_dim",
            Axis::RopeDim => "rope_dim",
            Axis::Window => "window",
            Axis::Sinks => "sinks",
            Axis::PrefixLen => "prefix_len",
            Axis::SeqKv => "seq_kv",
            Axis::SeqLen => "seq_len",
        }
    }

    pub fn from_name(s: &str) -> Option<Axis> {
        Axis::ALL.into_iter().find(|a| a.name() == s)
    }

    pub fn names() -> Vec<&'static str> {
        Axis::ALL.iter().map(|a| a.name()).collect()
    }

    fn kind(self) -> Kind {
        match self {
            Axis::Variant => Kind::Variant,
            Axis::Mode => Kind::Mode,
            Axis::Device => Kind::Device,
            Axis::DType => Kind::DType,
            Axis::KvDtype => Kind::Fp8,
            Axis::InputDist => Kind::InputDist,
            Axis::InputScale => Kind::Scale,
            Axis::DOut => Kind::DOut,
            Axis::Allreduce => Kind::Allreduce,
            Axis::PageOrder => Kind::PageOrder,
            Axis::BatchSpec => Kind::BatchSpec,
            Axis::KernelPath => Kind::KernelPath,
            Axis::Precision => Kind::Precision,
            Axis::Causal => Kind::Bool,
            Axis::Threads
            | Axis::Devices
            | Axis::Splits
            | Axis::PageSize
            | Axis::PrefillChunk
            | Axis::LatentDim
            | Axis::RopeDim
            | Axis::Batch
            | Axis::Heads
            | Axis::KvHeads
            | Axis::HeadDim
            | Axis::QChunk
            | Axis::KvChunk
            | Axis::SeqKv
            | Axis::SeqLen => Kind::Size,
            Axis::Window | Axis::Sinks | Axis::PrefixLen => Kind::OptSize,
        }
    }

    /// Whether values are names (so `--set` keeps every item a string).
    pub(super) fn takes_names(self) -> bool {
        matches!(
            self.kind(),
            Kind::Variant
                | Kind::Mode
                | Kind::Device
                | Kind::DType
                | Kind::InputDist
                | Kind::DOut
                | Kind::Allreduce
                | Kind::PageOrder
                | Kind::BatchSpec
                | Kind::KernelPath
                | Kind::Precision
                | Kind::Fp8
        )
    }

    /// `[run]` gives the defaults of the `threads` and `kernel_path` axes.
    pub(super) fn default(self, run: &super::RunConfig) -> AxisDefault {
        use AxisDefault::{Derived, Fixed, Required};
        match self {
            Axis::Variant | Axis::SeqLen => Required,
            Axis::Mode => Fixed(AxisValue::Mode(DEFAULT_MODE)),
            Axis::Device => Fixed(AxisValue::Device(DEFAULT_DEVICE)),
            Axis::DType => Fixed(AxisValue::DType(DEFAULT_DTYPE)),
            Axis::InputDist => Fixed(AxisValue::InputDist(DEFAULT_INPUT_DIST)),
            Axis::InputScale => Fixed(AxisValue::Scale(DEFAULT_INPUT_SCALE)),
            Axis::DOut => Fixed(AxisValue::DOut(DEFAULT_D_OUT)),
            Axis::Causal => Fixed(AxisValue::Bool(false)),
            Axis::Threads => Fixed(AxisValue::Size(run.threads)),
            Axis::Batch => Fixed(AxisValue::Size(DEFAULT_BATCH)),
            Axis::Heads => Fixed(AxisValue::Size(DEFAULT_HEADS)),
            Axis::HeadDim => Fixed(AxisValue::Size(DEFAULT_HEAD_DIM)),
            Axis::Devices => Fixed(AxisValue::Size(DEFAULT_DEVICES)),
            Axis::Splits => {
                Derived("variant default (flash-decoding: enough parts for the threads)")
            }
            Axis::Allreduce => Derived("variant default (tree-decode: tree)"),
            Axis::PageSize => Derived("variant default (paged-decode: 16 tokens)"),
            Axis::PageOrder => Derived("variant default (paged-decode: shuffled)"),
            Axis::BatchSpec => Derived("none (sequences of equal lengths: batch, seq_len, seq_kv)"),
            Axis::PrefillChunk => {
                Derived("variant default (chunked-prefill: 512 tokens, at most the prompt)")
            }
            Axis::LatentDim | Axis::RopeDim => {
                Derived("none (mla-decode needs both; other variants read neither)")
            }
            Axis::KvHeads => Derived("= heads"),
            Axis::SeqKv => Derived("= seq_len"),
            Axis::QChunk | Axis::KvChunk => Derived("variant default"),
            Axis::Window => Derived("none"),
            Axis::Sinks => Derived("none (the window alone)"),
            Axis::PrefixLen => Derived("none (every request's cache its own)"),
            Axis::KvDtype => Derived("= dtype (K and V stored like Q)"),
            Axis::Precision => {
                Derived("fast (P rounded to the storage dtype for PV where that is faster)")
            }
            Axis::KernelPath => match run.kernel_path {
                Some(isa) => Fixed(AxisValue::KernelPath(isa)),
                None => Derived("this CPU's measured choice (attnbench list)"),
            },
        }
    }

    fn expected(self) -> String {
        let names = |v: Vec<String>| v.join(", ");
        match self.kind() {
            Kind::Variant => format!(
                "a variant name ({}), or plugin:NAME / python:NAME",
                VariantId::names().join(", ")
            ),
            Kind::Mode => format!(
                "a mode name ({})",
                names(Mode::ALL.iter().map(|m| m.to_string()).collect())
            ),
            Kind::Device => format!(
                "a device name ({})",
                names(Device::ALL.iter().map(|d| d.to_string()).collect())
            ),
            Kind::DType => format!(
                "a dtype name ({})",
                names(DType::ALL.iter().map(|d| d.to_string()).collect())
            ),
            Kind::InputDist => "an input distribution name (normal, uniform)".into(),
            Kind::DOut => "an upstream gradient kind (random, ones)".into(),
            Kind::Allreduce => "an allreduce algorithm (ring, tree, two-level, two-level:N)".into(),
            Kind::PageOrder => "a page order (shuffled, contiguous)".into(),
            Kind::BatchSpec => {
                "a batch spec such as 2xq2k+32xq1kv1k ([COUNTx]qLEN[kvLEN], + between groups)"
                    .into()
            }
            Kind::KernelPath => format!(
                "\"all\" or a CPU kernel path this CPU runs ({})",
                names(
                    Isa::available_paths()
                        .iter()
                        .map(|i| i.to_string())
                        .collect()
                )
            ),
            Kind::Precision => "a precision of P for PV (fast, highest)".into(),
            Kind::Fp8 => {
                "how K and V are stored: same (as dtype) or an FP8 format (fp8e4m3, fp8e5m2)".into()
            }
            Kind::Scale => "a finite number >= 0".into(),
            Kind::Bool => "true or false".into(),
            Kind::Size => "a positive integer".into(),
            Kind::OptSize => "\"none\" or a positive integer".into(),
        }
    }
}

impl fmt::Display for Axis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Axis {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// A `kv_dtype` value: K and V stored like Q (`same`), or in an FP8 format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvDtype(pub Option<Fp8Format>);

impl KvDtype {
    /// The name a config gives for K and V stored like Q.
    pub const SAME: &'static str = "same";

    fn parse(s: &str) -> Result<KvDtype, String> {
        if s == Self::SAME {
            return Ok(KvDtype(None));
        }
        if s.parse::<DType>().is_ok() {
            return Err(format!(
                "`{s}` is a dtype: K and V are stored as dtype unless kv_dtype names an FP8 format (write `same` for that)"
            ));
        }
        s.parse()
            .map(|f| KvDtype(Some(f)))
            .map_err(|e: String| format!("{e}, or `same` for K and V stored as dtype"))
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(x) => x.fmt(f),
            None => f.write_str(Self::SAME),
        }
    }
}

impl Serialize for KvDtype {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// One value of one axis, already checked. Serializes as the plain value (a name, a
/// number, a bool), so the resolved grid reads naturally in `meta.json`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum AxisValue {
    Variant(VariantId),
    /// `plugin:NAME` or `python:NAME` (`problem::ExternalKind`); the name lives as long as
    /// the process, like the config it came from.
    External(&'static str),
    Mode(Mode),
    Device(Device),
    DType(DType),
    InputDist(InputDist),
    DOut(UpstreamGrad),
    Allreduce(Allreduce),
    PageOrder(PageOrder),
    /// A ragged batch; lives as long as the process, like the config it came from.
    BatchSpec(&'static BatchSpec),
    KernelPath(Isa),
    Precision(Precision),
    Fp8(KvDtype),
    Bool(bool),
    Size(usize),
    /// A `Kind::OptSize` value: `None` is "none".
    OptSize(Option<usize>),
    Scale(f64),
}

impl fmt::Display for AxisValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AxisValue::Variant(v) => v.fmt(f),
            AxisValue::External(v) => v.fmt(f),
            AxisValue::Mode(v) => v.fmt(f),
            AxisValue::Device(v) => v.fmt(f),
            AxisValue::DType(v) => v.fmt(f),
            AxisValue::InputDist(v) => v.fmt(f),
            AxisValue::DOut(v) => v.fmt(f),
            AxisValue::Allreduce(v) => v.fmt(f),
            AxisValue::PageOrder(v) => v.fmt(f),
            AxisValue::BatchSpec(v) => v.fmt(f),
            AxisValue::KernelPath(v) => v.fmt(f),
            AxisValue::Precision(v) => v.fmt(f),
            AxisValue::Fp8(v) => v.fmt(f),
            AxisValue::Bool(v) => v.fmt(f),
            AxisValue::Size(v) => v.fmt(f),
            AxisValue::OptSize(Some(v)) => v.fmt(f),
            AxisValue::OptSize(None) => f.write_str("none"),
            AxisValue::Scale(v) => write!(f, "{v:?}"),
        }
    }
}

/// Parse an axis's TOML value into its list of values; the error text says what was
/// expected (the caller adds the key and line).
pub(super) fn parse_axis(axis: Axis, value: &Value) -> Result<Vec<AxisValue>, String> {
    // `kernel_path = "all"`: every path this CPU runs, so one config compares the paths
    // on any machine.
    if axis.kind() == Kind::KernelPath && value.as_str() == Some("all") {
        return Ok(Isa::available_paths()
            .into_iter()
            .map(AxisValue::KernelPath)
            .collect());
    }
    match value {
        Value::Table(t) => {
            if axis.kind() != Kind::Size {
                return Err(format!(
                    "expected {} or a non-empty list of them; a table is only the {{pow2 = [lo, hi]}} form of integer axes",
                    axis.expected()
                ));
            }
            let (lo, hi) = pow2_range(t)?;
            (lo..=hi)
                .map(|e| usize::try_from(1u64 << e).map(AxisValue::Size))
                .collect::<Result<_, _>>()
                .map_err(|_| format!("2^{hi} does not fit in this machine's usize"))
        }
        Value::Array(items) if items.is_empty() => Err(format!(
            "empty list; expected {} or a non-empty list of them",
            axis.expected()
        )),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                parse_item(axis, v).map_err(|e| format!("item {} of the list: {e}", i + 1))
            })
            .collect(),
        v => parse_item(axis, v).map(|x| vec![x]),
    }
}

/// `{pow2 = [lo, hi]}`: the exponents, checked.
fn pow2_range(t: &toml::Table) -> Result<(u32, u32), String> {
    let form = "expected {pow2 = [lo, hi]} with integers 0 <= lo <= hi <= 40, meaning 2^lo..=2^hi";
    let pair = match (t.len(), t.get("pow2")) {
        (1, Some(Value::Array(a))) if a.len() == 2 => (a[0].as_integer(), a[1].as_integer()),
        _ => return Err(form.into()),
    };
    let (Some(lo), Some(hi)) = pair else {
        return Err(form.into());
    };
    if lo < 0 || hi > POW2_MAX_EXP || lo > hi {
        return Err(format!("bad pow2 range [{lo}, {hi}]: {form}"));
    }
    // Both in 0..=40 here, so the casts are exact.
    Ok((lo as u32, hi as u32))
}

/// How many values `value` stands for (list length, pow2 count, 1 for a scalar), or None
/// when it is malformed (validation reports it later).
pub(super) fn value_len(value: &Value) -> Option<usize> {
    match value {
        Value::Array(a) => Some(a.len()),
        Value::Table(t) => pow2_range(t).ok().map(|(lo, hi)| (hi - lo + 1) as usize),
        _ => Some(1),
    }
}

/// A variant axis value: attnbench's own by name, or an external implementation.
fn variant(name: &str) -> Result<AxisValue, String> {
    if let Some((kind, short)) = ExternalKind::split(name) {
        if short.is_empty() {
            return Err(format!(
                "`{name}` names no implementation: {}:NAME, NAME from [{}]",
                kind.prefix(),
                kind.table()
            ));
        }
        return Ok(AxisValue::External(Box::leak(
            name.to_string().into_boxed_str(),
        )));
    }
    match name.parse::<VariantId>()? {
        VariantId::External => Err(
            "`external` is not a variant by itself: name one as plugin:NAME ([plugins]) or python:NAME ([python])"
                .into(),
        ),
        v => Ok(AxisValue::Variant(v)),
    }
}

/// An integer > 0.
fn positive(v: &Value, wrong: impl Fn() -> String) -> Result<usize, String> {
    let n = v.as_integer().ok_or_else(&wrong)?;
    if n <= 0 {
        return Err(format!("expected a positive integer, got {n}"));
    }
    usize::try_from(n).map_err(|_| wrong())
}

fn parse_item(axis: Axis, v: &Value) -> Result<AxisValue, String> {
    let wrong = || format!("expected {}, got {} {v}", axis.expected(), v.type_str());
    let name = || v.as_str().ok_or_else(wrong);
    Ok(match axis.kind() {
        Kind::Variant => variant(name()?)?,
        Kind::Mode => AxisValue::Mode(name()?.parse()?),
        Kind::Device => AxisValue::Device(name()?.parse()?),
        Kind::DType => AxisValue::DType(name()?.parse()?),
        Kind::InputDist => AxisValue::InputDist(name()?.parse()?),
        Kind::DOut => AxisValue::DOut(name()?.parse()?),
        Kind::Allreduce => AxisValue::Allreduce(name()?.parse()?),
        Kind::PageOrder => AxisValue::PageOrder(name()?.parse()?),
        Kind::BatchSpec => AxisValue::BatchSpec(Box::leak(Box::new(name()?.parse()?))),
        Kind::KernelPath => AxisValue::KernelPath(Isa::parse_available(name()?)?),
        Kind::Precision => AxisValue::Precision(name()?.parse()?),
        Kind::Fp8 => AxisValue::Fp8(KvDtype::parse(name()?)?),
        Kind::Bool => AxisValue::Bool(v.as_bool().ok_or_else(wrong)?),
        Kind::Size => AxisValue::Size(positive(v, wrong)?),
        Kind::OptSize => AxisValue::OptSize(match v.as_str() {
            Some("none") => None,
            Some(_) => return Err(wrong()),
            None => Some(positive(v, wrong)?),
        }),
        Kind::Scale => {
            let x = match v {
                Value::Integer(i) => *i as f64,
                Value::Float(x) => *x,
                _ => return Err(wrong()),
            };
            if !x.is_finite() || x < 0.0 {
                return Err(format!("expected a finite number >= 0, got {x}"));
            }
            AxisValue::Scale(x)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn val(s: &str) -> Value {
        toml::from_str::<toml::Table>(&format!("v = {s}")).unwrap()["v"].clone()
    }

    #[test]
    fn names_round_trip_and_order_is_expansion_order() {
        for a in Axis::ALL {
            assert_eq!(Axis::from_name(a.name()), Some(a));
        }
        assert_eq!(Axis::ALL.first(), Some(&Axis::Variant));
        assert_eq!(Axis::ALL.last(), Some(&Axis::SeqLen));
        assert!(Axis::ALL.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn pow2_form_expands_inclusive() {
        let v = parse_axis(Axis::SeqLen, &val("{pow2 = [8, 10]}")).unwrap();
        assert_eq!(v, [256, 512, 1024].map(AxisValue::Size));
        assert_eq!(value_len(&val("{pow2 = [8, 10]}")), Some(3));
        for bad in [
            "{pow2 = [5, 4]}",
            "{pow2 = [0, 41]}",
            "{pow2 = [-1, 2]}",
            "{pow2 = [1]}",
            "{pow3 = [1, 2]}",
        ] {
            let e = parse_axis(Axis::SeqLen, &val(bad)).unwrap_err();
            assert!(e.contains("pow2"), "{bad}: {e}");
        }
        assert!(parse_axis(Axis::Causal, &val("{pow2 = [1, 2]}")).is_err());
    }

    #[test]
    fn items_are_checked_by_kind() {
        assert_eq!(
            parse_axis(Axis::Causal, &val("true")).unwrap(),
            [AxisValue::Bool(true)]
        );
        assert_eq!(
            parse_axis(Axis::InputScale, &val("[2, 0.5]")).unwrap(),
            [AxisValue::Scale(2.0), AxisValue::Scale(0.5)]
        );
        assert!(parse_axis(Axis::InputScale, &val("-1.0"))
            .unwrap_err()
            .contains(">= 0"));
        assert!(parse_axis(Axis::InputScale, &val("inf")).is_err());
        assert!(parse_axis(Axis::Batch, &val("0"))
            .unwrap_err()
            .contains("positive"));
        assert!(parse_axis(Axis::Batch, &val("[]"))
            .unwrap_err()
            .contains("empty list"));
        assert!(parse_axis(Axis::Batch, &val("\"8\""))
            .unwrap_err()
            .contains("got string"));
        let e = parse_axis(Axis::Variant, &val("[\"flash\", \"flsh\"]")).unwrap_err();
        assert!(
            e.contains("item 2 of the list") && e.contains("unknown variant `flsh`"),
            "{e}"
        );
        assert!(parse_axis(Axis::DType, &val("\"f8\""))
            .unwrap_err()
            .contains("bf16"));
    }
}
