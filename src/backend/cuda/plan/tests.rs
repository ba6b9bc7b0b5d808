//! Tests of the CUDA launch planning: no device, no NVRTC.

use super::*;
use crate::problem::VariantId;
use crate::problem::{Case, Device, InputDist, Shape, UpstreamGrad};
use crate::variant::Registry;

fn case(variant: VariantId, dtype: DType, seq_q: usize, seq_kv: usize, d: usize) -> Case {
    let info = variant.info();
    Case {
        variant,
        mode: info.modes[0],
        device: Device::Cuda,
        dtype,
        shape: Shape {
            batch: 2,
            heads: 4,
            kv_heads: 2,
            seq_q,
            seq_kv,
            head_dim: d,
        },
        q_chunk: info.default_q_chunk.map(|c| c.min(seq_q)),
        kv_chunk: info.default_kv_chunk.map(|c| c.min(seq_kv)),
        causal: false,
        window: None,
        devices: 1,
        splits: None,
        allreduce: None,
        threads: 1,
        input_dist: InputDist::Normal,
        input_scale: 1.0,
        seed: 0,
        d_out: UpstreamGrad::Random,
        external: None,
        paging: None,
        prefill_chunk: None,
        batch_spec: None,
        kernel_path: None,
        prefix_len: None,
        kv_dtype: None,
        mla: None,
        sinks: None,
        precision: None,
    }
}

#[test]
fn arch_flag_names_the_real_architecture() {
    assert_eq!(arch_flag(9, 0), "--gpu-architecture=sm_90");
    assert_eq!(arch_flag(8, 6), "--gpu-architecture=sm_86");
    assert_eq!(arch_flag(12, 0), "--gpu-architecture=sm_120");
    assert!(unsupported_device(7, 5).is_some());
    assert!(unsupported_device(8, 0).is_none());
    assert!(unsupported_device(9, 0).is_none());
}

#[test]
fn define_sets_cover_every_launch_and_programs_define_them_first() {
    // Every define set a launcher builds is in its kernel's list (the NVRTC check compiles
    // exactly that list).
    for d in DType::ALL {
        assert!(Kernel::Softmax
            .define_sets()
            .contains(&softmax_defines(d, true)));
        assert!(Kernel::Softmax
            .define_sets()
            .contains(&softmax_defines(d, false)));
        assert!(Kernel::Chunked.define_sets().contains(&chunked_defines(d)));
        for hd in HEAD_DIMS {
            assert!(flash_kernel(d)
                .define_sets()
                .contains(&flash_defines(d, hd)));
            for rows in DECODE_ROWS_CHOICES {
                assert!(Kernel::Decode
                    .define_sets()
                    .contains(&decode_defines(d, hd, rows)));
            }
        }
    }
    assert_eq!(flash_kernel(DType::F32), Kernel::FlashF32);
    assert_eq!(flash_kernel(DType::Bf16), Kernel::Flash);
    let total: usize = Kernel::ALL.iter().map(|k| k.define_sets().len()).sum();
    assert_eq!(total, 6 + 3 + 4 + 2 + 24);
    let p = Kernel::Flash.program(&flash_defines(DType::Bf16, 128));
    assert!(p.starts_with("#define ELEM_KIND 1\n#define HEAD_DIM 128\n"));
    for k in Kernel::ALL {
        for e in k.entry_points() {
            assert!(
                k.source().contains(&format!("void {e}(")) || k.source().contains(&format!("{e}(")),
                "{} lacks {e}",
                k.file()
            );
        }
    }
}

#[test]
fn fused_kernels_reject_other_head_dims_with_a_reason() {
    let c = case(VariantId::Flash, DType::Bf16, 100, 100, 96);
    let why = unsupported(GpuAlgo::Flash, &c).unwrap();
    assert!(
        why.contains("head_dim 64 and 128") && why.contains("96"),
        "{why}"
    );
    assert!(unsupported(
        GpuAlgo::Flash,
        &case(VariantId::Flash, DType::Bf16, 100, 100, 64)
    )
    .is_none());
    // cuBLAS-based variants take any head dim.
    let c = case(VariantId::Naive, DType::F16, 7, 9, 24);
    assert!(unsupported(GpuAlgo::Naive { safe: true }, &c).is_none());
    let mut c = case(VariantId::Naive, DType::F32, 7, 9, 24);
    c.mode = Mode::FwdBwd;
    assert!(unsupported(GpuAlgo::Naive { safe: true }, &c)
        .unwrap()
        .contains("no backward on the GPU"));
    let mut c = case(VariantId::Flash, DType::F32, 7, 9, 64);
    c.window = Some(4);
    assert!(unsupported(GpuAlgo::Flash, &c)
        .unwrap()
        .contains("sliding-window"));
    let mut c = case(VariantId::FlashDecoding, DType::F32, 1, 9, 64);
    c.window = Some(4);
    assert!(unsupported(GpuAlgo::FlashDecoding, &c).is_none());
    c.devices = 2;
    assert!(unsupported(GpuAlgo::FlashDecoding, &c).is_some());
}

#[test]
fn flash_grid_covers_ragged_rows_and_shared_memory_fits() {
    let c = case(VariantId::Flash, DType::Bf16, 130, 77, 128);
    let (grid, block, smem) = flash_launch(&c);
    assert_eq!(grid, (3, 8, 1));
    assert_eq!(block, (128, 1, 1));
    // (64 Q rows + 2 x 64 K + 2 x 64 V) x (128 + 8) x 2 bytes, above the 48 KiB default
    // (the launcher raises the limit) and under sm_80/sm_90's 163/227 KiB.
    assert_eq!(smem, 87_040);
    let c64 = case(VariantId::Flash, DType::F16, 130, 77, 64);
    assert_eq!(flash_launch(&c64).2, 46_080);
    let f = case(VariantId::Flash, DType::F32, 130, 77, 64);
    assert_eq!(flash_launch(&f).0, (5, 8, 1));
}

#[test]
fn causal_flash_blocks_skip_tiles_above_the_diagonal() {
    let mut c = case(VariantId::Flash, DType::Bf16, 256, 256, 64);
    c.causal = true;
    // Block i (rows 64i..64i+63) sees keys up to 64i+63: i+1 tiles of 64.
    for b in 0..4 {
        assert_eq!(flash_tiles_visited(&c, b), b + 1);
    }
    // Bottom-right alignment: 64 queries over 1000 keys see keys up to 999 (16 tiles); a
    // block whose rows see no key visits none.
    let mut c = case(VariantId::Flash, DType::Bf16, 64, 1000, 64);
    c.causal = true;
    assert_eq!(flash_tiles_visited(&c, 0), 16);
    let mut c = case(VariantId::Flash, DType::Bf16, 200, 10, 64);
    c.causal = true;
    assert_eq!(flash_tiles_visited(&c, 0), 0);
    assert_eq!(flash_tiles_visited(&c, 3), 1);
    c.causal = false;
    assert_eq!(flash_tiles_visited(&c, 0), 1);
}

#[test]
fn chunk_plan_clamps_and_skips_causal_chunks() {
    let mut c = case(VariantId::RabeStaats, DType::F32, 1000, 1000, 16);
    c.q_chunk = Some(300);
    c.kv_chunk = Some(256);
    let p = chunk_plan(&c);
    assert_eq!(
        (p.q_chunk, p.k_chunk, p.n_q_chunks, p.n_k_chunks),
        (300, 256, 4, 4)
    );
    assert_eq!(p.used_k_chunks(&c, 0), 4);
    c.causal = true;
    // Rows 0..299 see keys up to 299: chunks 0 and 1.
    assert_eq!(p.used_k_chunks(&c, 0), 2);
    assert_eq!(p.used_k_chunks(&c, 3), 4);
    // A query chunk whose rows see no key still gets one (all-masked) summary.
    let mut c = case(VariantId::RabeStaats, DType::F32, 100, 10, 16);
    c.causal = true;
    c.q_chunk = Some(10);
    c.kv_chunk = Some(4);
    let p = chunk_plan(&c);
    assert_eq!(p.used_k_chunks(&c, 0), 1);
    assert_eq!(p.used_k_chunks(&c, 9), 3);
}

#[test]
fn workspace_formulas() {
    let c = case(VariantId::Naive, DType::Bf16, 10, 20, 8);
    assert_eq!(
        workspace_bytes(GpuAlgo::Naive { safe: true }, &c),
        4 * 2 * 4 * 10 * 20
    );
    assert_eq!(workspace_bytes(GpuAlgo::Flash, &c), 0);
    let mut c = case(VariantId::RabeStaats, DType::F32, 10, 20, 8);
    c.q_chunk = Some(4);
    c.kv_chunk = Some(8);
    // S chunk 4 x 8, 3 key chunks of summaries 4 x (8 + 2), per (b, h) = 8.
    assert_eq!(
        workspace_bytes(GpuAlgo::Chunked, &c),
        4 * 8 * (4 * 8 + 3 * 4 * 10)
    );
    let mut c = case(VariantId::FlashDecoding, DType::F16, 1, 1000, 64);
    c.splits = Some(4);
    assert_eq!(workspace_bytes(GpuAlgo::FlashDecoding, &c), 4 * 4 * 8 * 65);
}

#[test]
fn decode_splits_fill_the_device_but_not_below_the_minimum_split() {
    let c = case(VariantId::FlashDecoding, DType::Bf16, 1, 1 << 17, 128);
    // b 2 x kv 2 x ceil(2 rows / 2 per block) = 4 blocks per split: 396 splits for 1584 blocks.
    assert_eq!(decode_rows(&c.shape), 2);
    assert_eq!(decode_default_splits(&c.shape), 396);
    let c = case(VariantId::FlashDecoding, DType::Bf16, 1, 600, 128);
    assert_eq!(decode_default_splits(&c.shape), 3);
    let c = case(VariantId::FlashDecoding, DType::Bf16, 1, 1, 128);
    assert_eq!(decode_default_splits(&c.shape), 1);
    let (grid, block, per, _) = decode_launch(&c, 5);
    assert_eq!((grid, block, per), ((1, 4, 1), (128, 1, 1), 1));
    let c = case(VariantId::FlashDecoding, DType::Bf16, 5, 1000, 64);
    let (grid, _, per, _) = decode_launch(&c, 3);
    // group 2 x 5 queries = 10 rows: 8 per block, 2 row blocks; 334 keys per split.
    assert_eq!(decode_rows(&c.shape), 8);
    assert_eq!((grid, per), ((3, 4, 2), 334));
    // The default never overshoots the target (a partial extra wave).
    for n in [4096, 1 << 17] {
        let c = case(VariantId::FlashDecoding, DType::Bf16, 1, n, 128);
        let (grid, ..) = decode_launch(&c, decode_default_splits(&c.shape));
        assert!((grid.0 * grid.1 * grid.2) as usize <= DECODE_TARGET_BLOCKS);
    }
    assert_eq!(l2_flush_bytes(50 << 20), 100 << 20);
}

#[test]
fn decode_rows_round_up_to_a_build_and_shared_memory_fits() {
    let rows = |group: usize, seq_q: usize| {
        let mut c = case(VariantId::FlashDecoding, DType::Bf16, seq_q, 4096, 128);
        c.shape.heads = 8 * group;
        c.shape.kv_heads = 8;
        decode_rows(&c.shape)
    };
    assert_eq!(rows(1, 1), 1);
    assert_eq!(rows(3, 1), 4);
    assert_eq!(rows(4, 1), 4);
    assert_eq!(rows(2, 3), 8);
    assert_eq!(rows(32, 1), 8);
    // decode.cu's layout: bf16 d 128, 4 rows: 2 KiB of queries, 2 stages of K (64 x 136 x 2)
    // and V (64 x 128 x 2) bytes.
    assert_eq!(
        decode_shared_bytes(DType::Bf16, 128, 4),
        4 * 128 * 4 + 2 * (64 * 136 * 2 + 64 * 128 * 2)
    );
    // Every build fits an SM's opt-in limit (227 KiB on sm_80/sm_90); bf16 d 128 fits three
    // blocks in an SM's 228 KiB.
    for d in DType::ALL {
        for hd in HEAD_DIMS {
            for r in DECODE_ROWS_CHOICES {
                assert!(
                    decode_shared_bytes(d, hd, r) <= 227 * 1024,
                    "{d:?} {hd} {r}"
                );
            }
        }
    }
    assert!(3 * (decode_shared_bytes(DType::Bf16, 128, 8) + 1024) <= 228 * 1024);
}
