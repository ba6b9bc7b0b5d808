//! The interface every attention variant implements (`Variant`: workspace prediction, CPU
//! forward, optional training pass, CUDA plan) and what a forward keeps for its backward
//! (`Saved`). Below the kernels' composites (`crate::layer` runs attention through it) and
//! the registry (`crate::variant`, which maps each `VariantId` to its implementation).
//! Declarations only; no cost of its own.

use crate::backend::cpu::isa::Isa;
use crate::backend::cpu::workspace::Scratch;
use crate::backend::cuda::plan::GpuAlgo;
use crate::error::{Error, Result};
use crate::problem::{Allreduce, Case, Design, Grads, Inputs, Mode, Shape};
use crate::sim::stats::SimStats;

/// Static description of a variant, shown by `attnbench list`.
pub struct VariantInfo {
    pub name: &'static str,
    pub description: &'static str,
    /// Where the algorithm comes from (seed file and section).
    pub source: &'static str,
    pub modes: &'static [Mode],
    /// Default query/key chunk (tile) sizes; `None` = the variant does not cut that loop.
    pub default_q_chunk: Option<usize>,
    pub default_kv_chunk: Option<usize>,
    /// `false` only for deliberately unsafe variants (no max subtraction): their failure on
    /// large logits is the point, and tests expect it.
    pub numerically_safe: bool,
}

/// Where a variant's devices live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// This process: one device, or simulated devices with counted links (`sim`).
    InProcess,
    /// One MPI rank per device (`dist`): needs the `mpi` feature and `mpirun -np devices`.
    Mpi,
    /// A worker process running an implementation attnbench does not ship (`run::external`).
    Worker,
}

/// One attention algorithm family member.
pub trait Variant: Sync {
    fn info(&self) -> &'static VariantInfo;

    /// Where its devices live; tests and CI's in-process sweeps take the `InProcess` ones,
    /// the MPI smoke test the others.
    fn engine(&self) -> Engine {
        Engine::InProcess
    }

    /// Bytes the forward call allocates beyond inputs and output (its workspace), from the
    /// variant's own formula, for the kernels of instruction-set path `isa` (tile layouts
    /// may differ by path); the memory counter checks the measured overhead against it.
    fn predict_workspace_bytes(&self, case: &Case, isa: Isa) -> u64;

    /// Forward pass on the CPU into `out` (`[batch, heads, seq_q, head_dim]`, f32), with the
    /// kernels of `isa` (which must be available: `Isa::available`). The workspace is
    /// allocated fallibly up front: an allocation that fails or exceeds the memory budget
    /// is `Error::OutOfMemory`, never an abort.
    fn forward_cpu(&self, case: &Case, isa: Isa, inputs: &Inputs, out: &mut [f32]) -> Result<()>;

    /// The layer design of the transformer-layer variants (modes `layer-fwd`,
    /// `layer-train`, run by `crate::layer`); `None` for attention variants.
    fn layer_design(&self) -> Option<Design> {
        None
    }

    /// Why this variant cannot run `case`, beyond mode, device and head grouping (which the
    /// runner checks for every variant). By default a variant runs on one device without a
    /// sliding window.
    fn unsupported(&self, case: &Case) -> Option<String> {
        single_device_full_attention(self.info(), case)
    }

    /// Whether the variant runs on several devices (`devices` > 1: ring, tree and their MPI
    /// forms); a case of several devices for any other variant is a combination it does not
    /// have (`variant::impossible`), left out of a sweep.
    fn multi_device(&self) -> bool {
        false
    }

    /// The default number of split-KV parts for this shape and thread count, for variants
    /// that split the cache (flash-decoding); `None` means the `splits` axis does not apply.
    fn default_splits(&self, _shape: &Shape, _threads: usize) -> Option<usize> {
        None
    }

    /// `default_splits` for a ragged batch packed as `shape` (`Case::batch_spec`).
    fn default_splits_ragged(&self, shape: &Shape, threads: usize) -> Option<usize> {
        self.default_splits(shape, threads)
    }

    /// The allreduce a case uses when the config names none, for variants that run
    /// simulated allreduces; `None` means the `allreduce` axis does not apply.
    fn default_allreduce(&self) -> Option<Allreduce> {
        None
    }

    /// Whether the variant runs a ragged batch (`Case::batch_spec`, packed sequences of
    /// their own lengths); the others decline such cases.
    fn ragged(&self) -> bool {
        false
    }

    /// Whether the variant runs packed batches only: a batch of equal lengths is run as a
    /// ragged one (`BatchSpec::uniform`) when the config gives no batch_spec.
    fn packed_only(&self) -> bool {
        false
    }

    /// The prompt chunk a case gets when the config names none, for variants that prefill
    /// in chunks (`chunked-prefill`); `None` means the `prefill_chunk` axis does not apply.
    fn default_prefill_chunk(&self) -> Option<usize> {
        None
    }

    /// Serving steps one call runs one after another (chunked prefill's chunks), which
    /// `forward_cpu_steps` times one by one; 1 for a call that is one step.
    fn steps(&self, _case: &Case) -> usize {
        1
    }

    /// `forward_cpu`, also writing the seconds of each of its `steps` into `step_s`
    /// (untouched by variants whose call is one step).
    fn forward_cpu_steps(
        &self,
        case: &Case,
        isa: Isa,
        inputs: &Inputs,
        out: &mut [f32],
        _step_s: &mut [f64],
    ) -> Result<()> {
        self.forward_cpu(case, isa, inputs, out)
    }

    /// The paging a case gets when the config names none, for variants that read a paged
    /// KV cache (`paged-decode`); `None` means the `page_size` and `page_order` axes do not
    /// apply.
    fn default_paging(&self) -> Option<crate::problem::Paging> {
        None
    }

    /// Whether the case's kernels call the `matrixmultiply` SGEMM (`backend::cpu::gemm`),
    /// whose packing buffers (up to `gemm::PACK_BYTES_MAX` per thread) are allocated
    /// infallibly and left out of the predictions. The attention kernels' register tiles,
    /// forward and backward, do not.
    fn uses_packing_gemm(&self, _case: &Case) -> bool {
        false
    }

    /// Whether the variant reads an FP8 KV cache (`Case::kv_dtype`); the others leave such
    /// cases out (`variant::impossible`).
    fn fp8_kv(&self) -> bool {
        false
    }

    /// Whether the variant keeps attention sinks (`Case::sinks`) visible beside its sliding
    /// window on the CPU; the others leave such cases out (`variant::impossible`).
    fn sinks(&self) -> bool {
        false
    }

    /// Whether the variant reads a multi-head latent attention cache (`Case::mla`,
    /// `Inputs::mla`) instead of Q, K and V: `mla-decode`. The runner skips a case whose
    /// `mla` disagrees with it.
    fn reads_mla(&self) -> bool {
        false
    }

    /// Bytes of K and V the call must read, for the memory-bound decode variants (the
    /// denominator of their achieved bandwidth); `None` for the others.
    fn kv_read_bytes(&self, _case: &Case) -> Option<u64> {
        None
    }

    /// How this variant runs on a GPU (`device = "cuda"`), or `None` when it has no CUDA
    /// kernels (its CUDA cases are skipped rows saying so).
    fn cuda(&self) -> Option<GpuAlgo> {
        None
    }

    /// `forward_cpu` that also returns the counters of its simulated devices (multi-device
    /// variants); the runner calls it for the untimed checked call.
    fn forward_counted(
        &self,
        case: &Case,
        isa: Isa,
        inputs: &Inputs,
        out: &mut [f32],
    ) -> Result<Option<SimStats>> {
        self.forward_cpu(case, isa, inputs, out).map(|()| None)
    }

    /// Bytes a forward + backward allocates beyond inputs, dO, output and gradients: what
    /// the forward keeps for the backward plus the larger of the two passes' scratch.
    /// Only called for variants whose `modes` contain `fwd+bwd`.
    fn predict_train_workspace_bytes(&self, _case: &Case, _isa: Isa) -> u64 {
        0
    }

    /// The forward of a training step: writes `out` and returns what the backward needs.
    fn forward_train_cpu(
        &self,
        _case: &Case,
        _isa: Isa,
        _inputs: &Inputs,
        _out: &mut [f32],
    ) -> Result<Saved> {
        Err(no_backward(self.info()))
    }

    /// dQ, dK, dV for the upstream gradient `d_out`, overwriting `grads`, on kernel path
    /// `isa` (the forward's).
    #[allow(clippy::too_many_arguments)]
    fn backward_cpu(
        &self,
        _case: &Case,
        _isa: Isa,
        _inputs: &Inputs,
        _out: &[f32],
        _saved: &Saved,
        _d_out: &[f32],
        _grads: &mut Grads,
    ) -> Result<()> {
        Err(no_backward(self.info()))
    }
}

/// What a forward keeps for its backward (beyond Q, K, V and O).
pub enum Saved {
    /// Nothing: the backward recomputes (Rabe–Staats checkpointing).
    Nothing,
    /// The softmax probabilities P, `[b, h, n_q, n_kv]` (standard attention).
    Probabilities(Scratch),
    /// The row logsumexp L, `[b, h, n_q]` (FlashAttention).
    LogSumExp(Vec<f32>),
}

fn no_backward(info: &VariantInfo) -> Error {
    Error::Runtime(format!("variant {} has no backward pass", info.name))
}

/// The default support check: one device, full attention.
pub fn single_device_full_attention(info: &VariantInfo, case: &Case) -> Option<String> {
    if case.window.is_some() {
        return Some(format!(
            "variant {} has no sliding-window support (window = {})",
            info.name,
            case.window.unwrap_or(0)
        ));
    }
    if case.devices != 1 {
        return Some(format!(
            "variant {} runs on one device (devices = {} requested)",
            info.name, case.devices
        ));
    }
    None
}

/// The support check of the single-device kernels that take a sliding window (`flash`,
/// `naive`, `rabe-staats`, `rabe-staats-seq`): one device; a window in `fwd+bwd` only where
/// the backward honours it (`window_backward`).
pub fn single_device_windowed(
    info: &VariantInfo,
    case: &Case,
    window_backward: bool,
) -> Option<String> {
    if let (Some(w), Mode::FwdBwd, false) = (case.window, case.mode, window_backward) {
        return Some(format!(
            "variant {} has no sliding-window backward (window = {w}): run mode fwd, or flash or naive for fwd+bwd",
            info.name
        ));
    }
    if case.devices != 1 {
        return Some(format!(
            "variant {} runs on one device (devices = {} requested)",
            info.name, case.devices
        ));
    }
    None
}

/// The saved state a backward expects but was not given: a harness bug, reported as such.
pub fn wrong_saved(info: &VariantInfo) -> Error {
    Error::Runtime(format!(
        "variant {}: backward called with another variant's saved state",
        info.name
    ))
}

impl std::fmt::Debug for dyn Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.info().name)
    }
}
