//! Combinations a variant does not have, whatever the machine: a mode it does not implement,
//! several devices for a one-device variant, the GPU for a variant without CUDA kernels, a
//! ragged batch for a variant of equal lengths, zero devices, a forced kernel path for a
//! variant whose simulated devices run the default one. A sweep's expansion leaves
//! them out (they are not cases: no machine could run them), `run` refuses them, and the
//! runner's skip reason starts with the same words. Legal cases this machine cannot run
//! (no GPU, no mpirun, a page longer than the cache) are not among them: they stay
//! `skipped` rows. Cost: O(variants) for the lists in the messages.

use super::{Registry, VariantId};
use crate::problem::{Case, Device, Mode};

/// Why a case is a combination its variant does not have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Impossible {
    /// `devices = 0`.
    NoDevices,
    /// A mode the variant does not implement.
    Mode(Mode),
    /// `devices` > 1 for a variant that runs on one device.
    OneDevice(usize),
    /// `device = "cuda"` for a variant without CUDA kernels.
    NoCuda,
    /// A `batch_spec` (ragged batch) for a variant of sequences of one length.
    NotRagged,
    /// A forced `kernel_path` for a multi-device variant, whose simulated devices run this
    /// CPU's default path.
    DefaultPathOnly,
    /// An FP8 `kv_dtype` for a variant that reads K and V in the storage dtype only.
    NoFp8Kv,
    /// Attention `sinks` for a variant whose mask is the window alone.
    NoSinks,
}

impl Impossible {
    /// The kind, as the left-out summary groups it.
    pub fn kind(self) -> &'static str {
        match self {
            Impossible::NoDevices => "devices = 0",
            Impossible::Mode(_) => "mode",
            Impossible::OneDevice(_) => "devices",
            Impossible::NoCuda => "cuda",
            Impossible::NotRagged => "batch_spec",
            Impossible::DefaultPathOnly => "kernel_path",
            Impossible::NoFp8Kv => "kv_dtype",
            Impossible::NoSinks => "sinks",
        }
    }

    /// The message for a case of `variant`, in the words of the runner's skip reasons.
    pub fn message(self, variant: VariantId, name: &str) -> String {
        match self {
            Impossible::NoDevices => "devices must be at least 1".into(),
            Impossible::Mode(mode) => format!(
                "variant {name} does not implement mode {mode} (it has: {})",
                modes_of(variant)
            ),
            Impossible::OneDevice(devices) => {
                format!("variant {name} runs on one device (devices = {devices} requested)")
            }
            Impossible::NoCuda => format!(
                "variant {name} has no CUDA kernels (on the GPU: {})",
                names(|v| v.get().cuda().is_some())
            ),
            Impossible::NotRagged => format!(
                "variant {name} runs sequences of one length: a batch_spec (ragged batch) needs one of {}",
                names(|v| v.get().ragged())
            ),
            Impossible::DefaultPathOnly => format!(
                "variant {name} runs this CPU's default kernel path only: a kernel_path applies to {}",
                names(|v| !v.get().multi_device())
            ),
            Impossible::NoFp8Kv => format!(
                "variant {name} reads K and V as dtype: an FP8 kv_dtype applies to {}",
                names(|v| v.get().fp8_kv())
            ),
            Impossible::NoSinks => format!(
                "variant {name} has no attention sinks: sinks apply to {}",
                names(|v| v.get().sinks())
            ),
        }
    }
}

/// The modes `variant` implements, comma-separated.
pub fn modes_of(variant: VariantId) -> String {
    let modes: Vec<&str> = variant.info().modes.iter().map(|m| m.name()).collect();
    modes.join(", ")
}

/// The in-process variants `keep` accepts, comma-separated.
fn names(keep: impl Fn(VariantId) -> bool) -> String {
    let v: Vec<&str> = VariantId::in_process()
        .filter(|&v| keep(v))
        .map(VariantId::name)
        .collect();
    v.join(", ")
}

/// Whether `case` is a combination its variant does not have, and why (the first reason in
/// the order of `Impossible`'s variants).
pub fn impossible(case: &Case) -> Option<Impossible> {
    let v = case.variant.get();
    if case.devices == 0 {
        return Some(Impossible::NoDevices);
    }
    if !v.info().modes.contains(&case.mode) {
        return Some(Impossible::Mode(case.mode));
    }
    if case.devices > 1 && !v.multi_device() {
        return Some(Impossible::OneDevice(case.devices));
    }
    // An external implementation runs on the device its worker names.
    if case.device == Device::Cuda && case.variant != VariantId::External && v.cuda().is_none() {
        return Some(Impossible::NoCuda);
    }
    if case.batch_spec.is_some() && !v.ragged() {
        return Some(Impossible::NotRagged);
    }
    if case.kernel_path.is_some() && v.multi_device() {
        return Some(Impossible::DefaultPathOnly);
    }
    if case.kv_dtype.is_some() && !v.fp8_kv() {
        return Some(Impossible::NoFp8Kv);
    }
    if case.sinks.is_some() && !v.sinks() {
        return Some(Impossible::NoSinks);
    }
    None
}

/// What an expansion left out for one variant: how many combinations, and each reason kind
/// with the values it covered ("mode decode, layer-fwd").
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LeftOut {
    pub variant: String,
    pub count: usize,
    /// (kind, values in first-seen order), kinds in first-seen order.
    pub reasons: Vec<(String, Vec<String>)>,
    /// The modes the variant has, for the line (`modes_of`).
    #[serde(skip)]
    pub modes: String,
}

impl LeftOut {
    /// Nothing left out yet for the variant of `case`.
    pub fn of(case: &Case) -> LeftOut {
        LeftOut {
            variant: case.variant_name().to_string(),
            count: 0,
            reasons: Vec::new(),
            modes: modes_of(case.variant),
        }
    }

    /// Counts one left-out combination of this variant.
    pub fn add(&mut self, why: Impossible) {
        self.count += 1;
        let value = match why {
            Impossible::Mode(m) => m.name().to_string(),
            Impossible::OneDevice(d) => d.to_string(),
            Impossible::NoDevices
            | Impossible::NoCuda
            | Impossible::NotRagged
            | Impossible::DefaultPathOnly
            | Impossible::NoFp8Kv
            | Impossible::NoSinks => String::new(),
        };
        let kind = why.kind().to_string();
        match self.reasons.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, values)) => {
                if !value.is_empty() && !values.contains(&value) {
                    values.push(value);
                }
            }
            None => self.reasons.push((
                kind,
                Some(value).filter(|v| !v.is_empty()).into_iter().collect(),
            )),
        }
    }

    /// One line: "naive: 192 (no mode decode, layer-fwd (it has: fwd, fwd+bwd); one device
    /// only (devices = 2))".
    pub fn line(&self) -> String {
        let parts: Vec<String> = self
            .reasons
            .iter()
            .map(|(kind, values)| match kind.as_str() {
                "mode" => format!("no mode {} (it has: {})", values.join(", "), self.modes),
                "devices" => format!("one device only (devices = {})", values.join(", ")),
                "cuda" => "no CUDA kernels (device = cuda)".into(),
                "batch_spec" => "sequences of one length only (batch_spec)".into(),
                "kernel_path" => "the default kernel path only (kernel_path)".into(),
                "kv_dtype" => "K and V as dtype only (kv_dtype)".into(),
                other => other.to_string(),
            })
            .collect();
        format!("{}: {} ({})", self.variant, self.count, parts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{DType, Shape};
    use crate::variant::DefaultCase;

    fn base(v: VariantId) -> Case {
        let shape = Shape {
            batch: 1,
            heads: 2,
            kv_heads: 2,
            seq_q: 32,
            seq_kv: 32,
            head_dim: 16,
        };
        Case::cpu_fwd(v, shape, DType::F32, 1)
    }

    #[test]
    fn each_kind_is_found_and_the_possible_case_is_not() {
        let naive = base(VariantId::Naive);
        assert_eq!(impossible(&naive), None);
        let zero = Case {
            devices: 0,
            ..naive.clone()
        };
        assert_eq!(impossible(&zero), Some(Impossible::NoDevices));
        let decode = Case {
            mode: Mode::Decode,
            ..naive.clone()
        };
        assert_eq!(impossible(&decode), Some(Impossible::Mode(Mode::Decode)));
        let two = Case {
            devices: 2,
            ..naive.clone()
        };
        assert_eq!(impossible(&two), Some(Impossible::OneDevice(2)));
        let ring = Case {
            devices: 2,
            ..base(VariantId::RingPrefill)
        };
        assert_eq!(impossible(&ring), None, "ring runs on several devices");
        let gpu = Case {
            device: Device::Cuda,
            ..base(VariantId::RabeStaatsSeq)
        };
        assert_eq!(impossible(&gpu), Some(Impossible::NoCuda));
        let gpu_flash = Case {
            device: Device::Cuda,
            ..base(VariantId::Flash)
        };
        assert_eq!(impossible(&gpu_flash), None, "flash has CUDA kernels");
        let ragged = Case {
            batch_spec: Some(crate::problem::BatchSpec::uniform(2, 8, 8)),
            ..naive
        };
        assert_eq!(impossible(&ragged), Some(Impossible::NotRagged));
        let forced = |v| Case {
            kernel_path: Some(crate::problem::Isa::Portable),
            prefix_len: None,
            ..base(v)
        };
        assert_eq!(impossible(&forced(VariantId::Flash)), None);
        assert_eq!(
            impossible(&forced(VariantId::RingPrefill)),
            Some(Impossible::DefaultPathOnly)
        );
    }

    /// `multi_device` agrees with what each variant's own check says of two devices: a
    /// variant that claims one device refuses two in its `unsupported`, in the same words.
    #[test]
    fn multi_device_agrees_with_each_variants_own_check() {
        for v in VariantId::ALL {
            if v == VariantId::External {
                continue;
            }
            let mode = v.info().modes[0];
            let case = Case {
                mode,
                devices: 2,
                ..base(v)
            };
            let own = v.get().unsupported(&case).unwrap_or_default();
            let says_one = own.contains("runs on one device");
            assert_eq!(
                says_one,
                !v.get().multi_device(),
                "{v}: multi_device() = {} but its own check says {own:?}",
                v.get().multi_device()
            );
        }
    }

    #[test]
    fn the_messages_name_what_the_variant_has() {
        let m = Impossible::Mode(Mode::Decode).message(VariantId::Naive, "naive");
        assert_eq!(
            m,
            "variant naive does not implement mode decode (it has: fwd, fwd+bwd)"
        );
        let c = Impossible::NoCuda.message(VariantId::RabeStaatsSeq, "rabe-staats-seq");
        assert!(c.contains("flash") && c.contains("naive"), "{c}");
        assert!(!c.contains("rabe-staats-seq,"), "{c}");
    }

    #[test]
    fn a_left_out_line_groups_reasons_and_values() {
        let mut l = LeftOut::of(&base(VariantId::Naive));
        for why in [
            Impossible::Mode(Mode::Decode),
            Impossible::OneDevice(2),
            Impossible::Mode(Mode::LayerFwd),
            Impossible::Mode(Mode::Decode),
        ] {
            l.add(why);
        }
        assert_eq!(l.count, 4);
        assert_eq!(
            l.line(),
            "naive: 4 (no mode decode, layer-fwd (it has: fwd, fwd+bwd); one device only (devices = 2))"
        );
    }
}
