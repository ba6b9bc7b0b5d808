//! CUDA cases through the runner. The skip tests run everywhere (they check the reasons a
//! machine without a GPU, or a build without the `cuda` feature, gives); the GPU tests are
//! `#[ignore]`d and run on the GPU machine with `--include-ignored` (GPU.md,
//! scripts/gpu_batch.sh): every CUDA variant against the f64 oracle on ragged shapes in
//! every dtype, the allocator's peak against each algorithm's workspace formula and against
//! the driver's free-memory figure, cold timing, TF32, the budget.

use std::sync::Mutex;

use attnbench::backend::cuda;
use attnbench::measure::timer::StopRule;
use attnbench::problem::{Case, DType, Device, InputDist, Mode, Shape, UpstreamGrad};
use attnbench::results::record::{Record, Status};
use attnbench::run::{run_case, GpuSettings, Settings};
use attnbench::variant::{Registry, VariantId};

/// The GPU and its allocator counts are shared by the tests of this binary: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

#[allow(clippy::too_many_arguments)]
fn case(
    variant: VariantId,
    dtype: DType,
    batch: usize,
    heads: usize,
    kv_heads: usize,
    seq_q: usize,
    seq_kv: usize,
    head_dim: usize,
    causal: bool,
) -> Case {
    let info = variant.info();
    let mode = if info.modes.contains(&Mode::Decode) {
        Mode::Decode
    } else {
        Mode::Fwd
    };
    let shape = Shape {
        batch,
        heads,
        kv_heads,
        seq_q,
        seq_kv,
        head_dim,
    };
    Case {
        variant,
        mode,
        device: Device::Cuda,
        dtype,
        shape,
        q_chunk: info.default_q_chunk.map(|c| c.min(seq_q)),
        kv_chunk: info.default_kv_chunk.map(|c| c.min(seq_kv)),
        causal,
        window: None,
        devices: 1,
        splits: variant
            .get()
            .default_splits(&shape, 1)
            .map(|_| cuda::plan::decode_default_splits(&shape)),
        allreduce: None,
        threads: 1,
        input_dist: InputDist::Normal,
        input_scale: 1.0,
        seed: 7,
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

fn settings(budget: Option<u64>, gpu: GpuSettings) -> Settings {
    Settings {
        model_layers: None,
        run_name: "gpu-test".into(),
        stop: StopRule {
            warmup: 1,
            warmup_s: 0.0,
            min_reps: 2,
            max_reps: 3,
            min_time_s: 0.0,
            max_time_s: 5.0,
            rel_spread: 1.0,
        },
        memory_budget: budget,
        // All rows of the small shapes, a deterministic sample of the larger ones (the f64
        // oracle runs on the host, and the batch has a time budget).
        error_rows: 512,
        extrapolate: None,
        diff_against: None,
        gpu,
        externals: Default::default(),
    }
}

fn run(c: &Case, budget: Option<u64>, gpu: GpuSettings) -> Record {
    run_case(c, &settings(budget, gpu), None)
        .expect("harness runs")
        .record
}

/// Why a row fails the oracle check (not `ok`, or an error beyond its dtype's tolerance).
fn oracle_failure(c: &Case, r: &Record) -> Option<String> {
    let err = r.max_abs_err.unwrap_or(f64::INFINITY);
    (r.status != Status::Ok || err > c.dtype.tolerance()).then(|| {
        format!(
            "{}: {} {} err {err:e} (tolerance {:e})",
            c.id(),
            r.status.name(),
            r.reason,
            c.dtype.tolerance()
        )
    })
}

fn gpu_variants() -> Vec<VariantId> {
    VariantId::ALL
        .into_iter()
        .filter(|v| v.get().cuda().is_some())
        .collect()
}

/// Panics with the reason when there is no usable GPU (an ignored test run on purpose).
fn require_gpu() {
    if let Some(why) = cuda::unavailable_reason() {
        panic!("this test needs a CUDA GPU: {why}");
    }
}

// ---- everywhere ----

#[test]
fn cuda_cases_without_a_gpu_are_skipped_rows_with_the_reason() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(why) = cuda::unavailable_reason() else {
        eprintln!("a GPU is usable here: the skip path is not exercised");
        return;
    };
    for v in gpu_variants() {
        let c = case(v, DType::Bf16, 1, 2, 1, 5, 9, 64, false);
        let r = run(&c, None, GpuSettings::default());
        assert_eq!(r.status, Status::Skipped, "{v}");
        assert_eq!(r.reason, why, "{v}");
        assert_eq!(r.reps, 0);
    }
    if cfg!(feature = "cuda") {
        assert!(!why.contains("without the `cuda` feature"), "{why}");
    } else {
        assert!(why.contains("without the `cuda` feature"), "{why}");
    }
}

#[test]
fn cuda_case_reasons_come_before_the_machine_and_name_the_limit() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let r = run(
        &case(VariantId::Flash, DType::Bf16, 1, 2, 2, 33, 33, 96, false),
        None,
        GpuSettings::default(),
    );
    assert_eq!(r.status, Status::Skipped);
    assert!(r.reason.contains("head_dim 64 and 128"), "{}", r.reason);
    let r = run(
        &case(
            VariantId::DecodeOnline,
            DType::F32,
            1,
            2,
            2,
            1,
            33,
            64,
            false,
        ),
        None,
        GpuSettings::default(),
    );
    assert_eq!(r.status, Status::Skipped);
    assert!(r.reason.contains("has no CUDA kernels"), "{}", r.reason);
    assert!(r.reason.contains("flash-decoding"), "{}", r.reason);
    let mut c = case(VariantId::Flash, DType::F16, 1, 2, 2, 33, 33, 64, false);
    c.mode = Mode::FwdBwd;
    let r = run(&c, None, GpuSettings::default());
    assert!(r.reason.contains("no backward on the GPU"), "{}", r.reason);
}

// ---- on a GPU ----

/// Ragged shapes: lengths that are no multiple of any tile (64, 32, chunk sizes), queries
/// longer and shorter than keys (bottom-right causal: rows that see no key are 0), GQA.
const SHAPES: [(usize, usize, usize, usize, usize); 5] = [
    // (batch, heads, kv_heads, seq_q, seq_kv)
    (1, 1, 1, 1, 1),
    (2, 4, 2, 77, 131),
    (1, 3, 1, 130, 65),
    (1, 2, 2, 200, 10),
    (2, 8, 8, 513, 1000),
];

#[test]
#[ignore = "needs a CUDA GPU: cargo test --features cuda -- --include-ignored"]
fn every_cuda_variant_matches_the_oracle_on_ragged_shapes() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_gpu();
    let mut failures = Vec::new();
    let mut ran = 0;
    for v in gpu_variants() {
        for dtype in DType::ALL {
            for d in [64, 128, 40] {
                for (b, h, kv, nq, nkv) in SHAPES {
                    for causal in [false, true] {
                        // Decode: few new tokens over the cache.
                        let nq = if v == VariantId::FlashDecoding {
                            nq.min(9)
                        } else {
                            nq
                        };
                        let c = case(v, dtype, b, h, kv, nq, nkv, d, causal);
                        let r = run(&c, None, GpuSettings::default());
                        if r.status == Status::Skipped {
                            // head_dim 40 on the fused kernels: the documented limit.
                            assert!(r.reason.contains("head_dim"), "{}: {}", c.id(), r.reason);
                            continue;
                        }
                        ran += 1;
                        failures.extend(oracle_failure(&c, &r));
                    }
                }
            }
        }
    }
    assert!(ran > 0);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// (batch, heads, kv_heads, seq_q, seq_kv, splits, window)
type DecodeShape = (
    usize,
    usize,
    usize,
    usize,
    usize,
    Option<usize>,
    Option<usize>,
);

/// flash-decoding's split pass is built per rows-per-block (1, 2, 4, 8): one case per build
/// (MHA, GQA 2 and 4, a partial block of 3 rows, MQA over several row blocks), caches that
/// are no multiple of the 64-key tile, split boundaries inside a tile, sliding windows.
#[test]
#[ignore = "needs a CUDA GPU: cargo test --features cuda -- --include-ignored"]
fn flash_decoding_matches_the_oracle_for_every_row_build() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_gpu();
    let shapes: [DecodeShape; 8] = [
        (1, 4, 4, 1, 5000, None, None),
        (2, 4, 2, 1, 777, Some(7), None),
        (1, 8, 2, 1, 4097, None, None),
        (1, 3, 1, 1, 300, Some(2), None),
        (1, 2, 2, 3, 1234, Some(5), None),
        (1, 32, 1, 1, 2000, None, None),
        (2, 8, 2, 2, 3001, Some(3), Some(100)),
        (1, 4, 1, 1, 70, Some(70), None),
    ];
    let mut failures = Vec::new();
    let mut builds = std::collections::BTreeSet::new();
    for dtype in DType::ALL {
        for d in [64, 128] {
            for (b, h, kv, nq, nkv, splits, window) in shapes {
                for causal in [false, true] {
                    let mut c = case(
                        VariantId::FlashDecoding,
                        dtype,
                        b,
                        h,
                        kv,
                        nq,
                        nkv,
                        d,
                        causal,
                    );
                    if splits.is_some() {
                        c.splits = splits;
                    }
                    c.window = window;
                    builds.insert(cuda::plan::decode_rows(&c.shape));
                    let r = run(&c, None, GpuSettings::default());
                    failures.extend(oracle_failure(&c, &r));
                }
            }
        }
    }
    assert_eq!(
        builds.into_iter().collect::<Vec<_>>(),
        cuda::plan::DECODE_ROWS_CHOICES.to_vec()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test --features cuda -- --include-ignored"]
fn device_overhead_is_each_algorithms_workspace_formula() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_gpu();
    for v in gpu_variants() {
        for dtype in [DType::F32, DType::Bf16] {
            let c = case(v, dtype, 2, 4, 2, 300, 700, 64, true);
            let r = run(&c, None, GpuSettings::default());
            assert_eq!(r.status, Status::Ok, "{}: {}", c.id(), r.reason);
            assert_eq!(
                r.mem_overhead_bytes,
                r.mem_predicted_bytes,
                "{}: measured vs predicted",
                c.id()
            );
        }
    }
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: cargo test --features cuda -- --include-ignored"]
fn the_allocator_agrees_with_the_driver() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_gpu();
    let gpu = cuda::device::gpu().expect("GPU");
    gpu.bind().unwrap();
    let (free0, _) = gpu.mem_info().unwrap();
    let (live0, _, n0) = gpu.counted();
    let bufs: Vec<_> = [64 << 20, (3 << 20) + 5, 1 << 30]
        .into_iter()
        .map(|b| gpu.alloc(b, "test").unwrap())
        .collect();
    let (free1, _) = gpu.mem_info().unwrap();
    let (live1, peak, n1) = gpu.counted();
    let counted = live1 - live0;
    assert_eq!(counted, (64 << 20) + (3 << 20) + 5 + (1 << 30));
    assert!(peak >= live1);
    let delta = (free0 - free1) as u64;
    assert!(
        cuda::accounting::agrees(counted, delta, n1 - n0, 2 << 20),
        "counted {counted} B, driver {delta} B"
    );
    drop(bufs);
    assert_eq!(gpu.counted().0, live0);
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test --features cuda -- --include-ignored"]
fn budget_cold_timing_and_tf32() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_gpu();
    // Over the budget by prediction: an oom row, nothing launched.
    let c = case(VariantId::Naive, DType::F32, 1, 1, 1, 4096, 4096, 64, false);
    let r = run(&c, Some(32 << 20), GpuSettings::default());
    assert_eq!(r.status, Status::Oom, "{}", r.reason);
    assert_eq!(r.reps, 0);
    // Cold: the L2 flush happens outside the timed events, the row is ok.
    let c = case(
        VariantId::Flash,
        DType::Bf16,
        1,
        4,
        4,
        1024,
        1024,
        128,
        false,
    );
    let r = run(
        &c,
        None,
        GpuSettings {
            cold: true,
            tf32: false,
        },
    );
    assert_eq!(r.status, Status::Ok, "{}", r.reason);
    assert!(r.time_median_s.unwrap() > 0.0);
    // TF32 GEMMs: 10-bit mantissas, so a looser error than f32's tolerance, but bounded.
    for v in [VariantId::Naive, VariantId::RabeStaats] {
        let c = case(v, DType::F32, 1, 2, 2, 300, 300, 64, false);
        let r = run(
            &c,
            None,
            GpuSettings {
                cold: false,
                tf32: true,
            },
        );
        assert_eq!(r.status, Status::Ok, "{}", r.reason);
        assert!(r.max_abs_err.unwrap() < 1e-2, "{v}: {:?}", r.max_abs_err);
    }
}
