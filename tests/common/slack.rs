//! What a case's measured overhead may exceed its variant's prediction by, besides GEMM
//! packing: bytes per variant, measured on this build (x86-64, every kernel path) at the
//! shapes of `tests/memory.rs`, which asserts them; docs/methodology.md ("Memory overhead")
//! lists the same figures, which `tests/memory_formulas.rs` checks. Included as a module by
//! both binaries.

use attnbench::problem::VariantId;

/// rayon's injector queue allocates a block of 63 job slots (24 bytes each, and a link:
/// 1520 bytes) every 63 jobs injected into a pool from outside it; which checked call gets
/// one depends on the calls made before it (docs/methodology.md, "Memory gate").
pub const INJECTOR_BLOCK: u64 = 1520;

/// (variants, bytes) beyond the prediction. Common to the kernels: the workspace's
/// per-worker handles (a `Mutex<Scratch>`, 32 bytes a worker) and the parallel region's
/// own words (64 to 96 bytes); the rest, per variant:
pub const SLACK: &[(&[VariantId], u64)] = &[
    // + the hand-out flags of the output's and of S's row blocks (a word per 64 rows of a
    // head each: 2 x 256 bytes at n = 1000, 2 heads)
    (&[VariantId::Naive, VariantId::NaiveUnsafe], 640),
    // + the hand-out flags of the chunk buffer's panels and strips, and of the output's
    // windows
    (&[VariantId::RabeStaats], 1192),
    (&[VariantId::RabeStaatsSeq], 128),
    // + the hand-out flags of the output's items (a word per query block of a head, or on
    // the AMX path per group of them: at most 256 bytes at n = 1000, 2 heads)
    (&[VariantId::Flash], 384),
    // handles and region only (their hand-out flags are in the prediction)
    (&[VariantId::ChunkedPrefill, VariantId::FlashVarlen], 128),
    (
        &[
            VariantId::DecodeNaive,
            VariantId::DecodeOnline,
            VariantId::CascadeDecode,
        ],
        128,
    ),
    // + the combine's weights of the splits
    (&[VariantId::FlashDecoding, VariantId::PagedDecode], 160),
    // handles and region only (the combine folds the splits in place)
    (&[VariantId::MlaDecode], 128),
    // + the simulation's bookkeeping (devices' ledgers, links' counters, the schedules),
    // which `host_bytes` leaves out
    (&[VariantId::RingDecode], 7577),
    // it grows with the devices and the rounds: 5123 bytes on 3 devices (binomial), 6925 on
    // 4 (ring), 7831 on 5 (binomial), the most 9921 on 6 (two-level, nodes of 2)
    (&[VariantId::TreeDecode], 9921),
    // + each step's per-item lists (about 220 bytes an item, left out of `host_bytes`):
    // the most with 8-row blocks at n = 1024, 2 heads
    (&[VariantId::RingPrefill, VariantId::StripePrefill], 95350),
    // + the layer's own bookkeeping beside its buffers (not broken down further)
    (
        &[
            VariantId::LayerVanilla,
            VariantId::LayerMemEff,
            VariantId::LayerBpt,
        ],
        672,
    ),
];

/// `SLACK` of `v`; panics for a variant with none measured.
pub fn slack(v: VariantId) -> u64 {
    SLACK
        .iter()
        .find(|(vs, _)| vs.contains(&v))
        .map(|&(_, b)| b)
        .unwrap_or_else(|| panic!("{v}: no slack measured"))
}
