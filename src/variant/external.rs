//! `external`: the registry's entry for implementations attnbench does not ship
//! (`plugin:NAME`, `python:NAME`; `problem::ExternalKind`). Their kernels run in a worker
//! process (`run::external`); here is only what the registry must say about every variant:
//! forward and decode modes, no chunks of its own, nothing predicted (the worker reports
//! what it can). Cost: that of the foreign call.

use super::{Engine, Variant, VariantInfo};
use crate::backend::cpu::isa::Isa;
use crate::error::{Error, Result};
use crate::problem::{Case, Inputs, Mode};

pub struct External;

pub static EXTERNAL: External = External;

static INFO: VariantInfo = VariantInfo {
    name: "external",
    description: "an implementation attnbench does not ship, named plugin:NAME (C ABI, [plugins]) or python:NAME (a callable, [python]), run in a worker process",
    source: "the user's (docs/guide/your-kernel.md)",
    modes: &[Mode::Fwd, Mode::Decode],
    default_q_chunk: None,
    default_kv_chunk: None,
    numerically_safe: true,
};

impl Variant for External {
    fn info(&self) -> &'static VariantInfo {
        &INFO
    }

    fn engine(&self) -> Engine {
        Engine::Worker
    }

    /// Unknown before the worker is asked; its own figure, when it has one, is in the row.
    fn predict_workspace_bytes(&self, _case: &Case, _isa: Isa) -> u64 {
        0
    }

    fn forward_cpu(&self, case: &Case, _: Isa, _: &Inputs, _: &mut [f32]) -> Result<()> {
        Err(Error::Runtime(format!(
            "{} runs in a worker process, not in attnbench's own forward",
            case.variant_name()
        )))
    }

    /// One device; the implementation itself says which masks and dtypes it takes.
    fn unsupported(&self, case: &Case) -> Option<String> {
        if case.external.is_none() {
            return Some("external needs a name: plugin:NAME or python:NAME".into());
        }
        (case.devices != 1).then(|| {
            format!(
                "{} runs on one device (devices = {})",
                case.variant_name(),
                case.devices
            )
        })
    }
}
