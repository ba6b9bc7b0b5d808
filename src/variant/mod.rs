//! The registry of attention variants. `VariantId` is the only `match` on variants: `list`,
//! config validation, the runner and the tests all iterate `VariantId::ALL`, so a new variant
//! is one file here plus one arm in `VariantId::get`.

mod cascade;
mod chunked_prefill;
mod decode;
mod external;
mod flash;
mod flash_varlen;
pub mod impossible;
mod layer;
mod mla;
mod mpi;
mod naive;
mod rabe_staats;
mod ring;
mod split_kv;
mod tree;

pub use crate::algorithm::{
    single_device_full_attention, single_device_windowed, wrong_saved, Engine, Saved, Variant,
    VariantInfo,
};
pub use crate::problem::VariantId;
use crate::problem::{BatchSpec, Case, DType, Device, InputDist, Mode, Shape, UpstreamGrad};
/// The `flash` kernel's tile sizes (B_r, B_c) for a case.
pub use flash::chunks as flash_chunks;

/// The registry's view of a `VariantId` (its implementation and what follows from it) and
/// of a `Case` (a variant's default case). Traits rather than inherent methods, so every
/// module that asks the registry imports `crate::variant` and the layer test sees the edge.
pub trait Registry: Sized {
    /// The variant's implementation: the only match on variants' behaviour.
    fn get(self) -> &'static dyn Variant;

    fn info(self) -> &'static VariantInfo {
        self.get().info()
    }

    fn engine(self) -> Engine {
        self.get().engine()
    }

    /// The (q_chunk, kv_chunk) a case of this variant runs with on `device` where a kernel
    /// fixes them (the GPU's flash tiles); `None`: the case's own.
    fn fixed_chunks(
        self,
        device: Device,
        dtype: DType,
        seq_q: usize,
        seq_kv: usize,
    ) -> Option<(Option<usize>, Option<usize>)> {
        match (device, self.get().cuda()) {
            (Device::Cuda, Some(algo)) => {
                crate::backend::cuda::plan::fixed_chunks(algo, dtype, seq_q, seq_kv)
            }
            _ => None,
        }
    }

    /// The split count a case of this variant gets on `device` when the config names none;
    /// `None`: the variant does not cut the cache into splits (the `splits` axis does not
    /// apply). flash-decoding's fills the CPU threads, or on the GPU the device.
    fn default_splits(self, device: Device, shape: &Shape, threads: usize) -> Option<usize> {
        let v = self.get();
        let own = v.default_splits(shape, threads);
        match (device, v.cuda()) {
            (Device::Cuda, Some(algo)) => {
                crate::backend::cuda::plan::default_splits(algo, shape, own)
            }
            _ => own,
        }
    }

    /// The variants this process runs itself (no MPI launcher needed).
    fn in_process() -> impl Iterator<Item = VariantId> {
        VariantId::ALL
            .into_iter()
            .filter(|v| v.engine() == Engine::InProcess)
    }
}

impl Registry for VariantId {
    fn get(self) -> &'static dyn Variant {
        match self {
            VariantId::Naive => &naive::NAIVE,
            VariantId::NaiveUnsafe => &naive::NAIVE_UNSAFE,
            VariantId::RabeStaats => &rabe_staats::RABE_STAATS,
            VariantId::RabeStaatsSeq => &rabe_staats::RABE_STAATS_SEQ,
            VariantId::Flash => &flash::FLASH,
            VariantId::ChunkedPrefill => &chunked_prefill::CHUNKED_PREFILL,
            VariantId::FlashVarlen => &flash_varlen::FLASH_VARLEN,
            VariantId::DecodeNaive => &decode::DECODE_NAIVE,
            VariantId::DecodeOnline => &decode::DECODE_ONLINE,
            VariantId::FlashDecoding => &decode::FLASH_DECODING,
            VariantId::PagedDecode => &decode::PAGED_DECODE,
            VariantId::CascadeDecode => &cascade::CASCADE_DECODE,
            VariantId::MlaDecode => &mla::MLA_DECODE,
            VariantId::RingDecode => &ring::RING_DECODE,
            VariantId::TreeDecode => &tree::TREE_DECODE,
            VariantId::RingPrefill => &ring::RING_PREFILL,
            VariantId::StripePrefill => &ring::STRIPE_PREFILL,
            VariantId::LayerVanilla => &layer::LAYER_VANILLA,
            VariantId::LayerMemEff => &layer::LAYER_MEMEFF,
            VariantId::LayerBpt => &layer::LAYER_BPT,
            VariantId::RingDecodeMpi => &mpi::RING_DECODE_MPI,
            VariantId::RingPrefillMpi => &mpi::RING_PREFILL_MPI,
            VariantId::TreeDecodeMpi => &mpi::TREE_DECODE_MPI,
            VariantId::TreeDecodeMpiExplicit => &mpi::TREE_DECODE_MPI_EXPLICIT,
            VariantId::External => &external::EXTERNAL,
        }
    }
}

/// The layer plan of a layer case: its variant's design, attention through the registry.
pub fn layer_plan(case: &Case) -> crate::error::Result<crate::layer::plan::Plan> {
    let design = case.variant.get().layer_design().ok_or_else(|| {
        crate::error::Error::Runtime(format!("{} is not a layer variant", case.variant))
    })?;
    let attention = crate::layer::plan::attention_of(design).get();
    Ok(crate::layer::plan::Plan::new(design, case, attention))
}

/// Cases built from a variant's defaults.
pub trait DefaultCase {
    fn cpu_fwd(variant: VariantId, shape: Shape, dtype: DType, threads: usize) -> Case;
}

impl DefaultCase for Case {
    /// A forward case on the CPU with the variant's defaults: its default chunks clamped to
    /// the sequence (as the sweep's expansion does), its default split count and allreduce,
    /// no mask or window, one device, normal inputs at scale 1, seed 0. Tests, examples and
    /// tools start from it and set what they vary (`Case { causal: true, ..base }`).
    fn cpu_fwd(variant: VariantId, shape: Shape, dtype: DType, threads: usize) -> Case {
        let info = variant.info();
        let v = variant.get();
        // A variant of packed batches only takes the batch as one of equal lengths, packed.
        let batch_spec = v
            .packed_only()
            .then(|| BatchSpec::uniform(shape.batch, shape.seq_q, shape.seq_kv));
        let shape = batch_spec.as_ref().map_or(shape, |b| b.packed(&shape));
        Case {
            variant,
            mode: Mode::Fwd,
            device: Device::Cpu,
            dtype,
            shape,
            q_chunk: info.default_q_chunk.map(|c| c.min(shape.seq_q)),
            kv_chunk: info.default_kv_chunk.map(|c| c.min(shape.seq_kv)),
            causal: false,
            window: None,
            devices: 1,
            splits: v.default_splits(&shape, threads),
            allreduce: v.default_allreduce(),
            threads,
            input_dist: InputDist::Normal,
            input_scale: 1.0,
            seed: 0,
            d_out: UpstreamGrad::Random,
            external: None,
            paging: v.default_paging(),
            prefill_chunk: v.default_prefill_chunk().map(|c| c.min(shape.seq_q)),
            batch_spec,
            kernel_path: None,
            prefix_len: None,
            kv_dtype: None,
            // A variant of an MLA cache gets DeepSeek-V2's dimensions.
            mla: v.reads_mla().then_some(crate::problem::Mla::DEEPSEEK_V2),
            sinks: None,
            precision: None,
        }
    }
}

#[cfg(test)]
mod tests;
