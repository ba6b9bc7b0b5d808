//! Memory overhead from the counting allocator: deterministic, so asserted exactly against
//! the papers' claims and against each variant's own prediction.

use std::sync::Mutex;

use attnbench::error::Error;
use attnbench::measure::alloc;
use attnbench::measure::timer::StopRule;
use attnbench::problem::{Case, DType, Inputs, Mode, Shape};
use attnbench::report::record::{Record, Status};
use attnbench::runner::{forward, packing_bytes, run_case, Settings};
use attnbench::variant::VariantId;

/// Tests of one binary run on parallel threads and share the allocator: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn case(variant: VariantId, n: usize, heads: usize, dtype: DType, threads: usize) -> Case {
    let shape = Shape::self_attention(heads, n, 64);
    Case {
        seed: 1,
        ..Case::cpu_fwd(variant, shape, dtype, threads)
    }
}

fn train(variant: VariantId, n: usize, heads: usize, dtype: DType, threads: usize) -> Case {
    Case {
        mode: Mode::FwdBwd,
        ..case(variant, n, heads, dtype, threads)
    }
}

fn measure(c: &Case, budget: Option<u64>) -> Record {
    let settings = Settings {
        run_name: "test".into(),
        stop: StopRule {
            warmup: 0,
            warmup_s: 0.0,
            min_reps: 1,
            max_reps: 1,
            min_time_s: 0.0,
            max_time_s: 60.0,
            rel_spread: 1.0,
        },
        memory_budget: budget,
        error_rows: 16,
        extrapolate: None,
        diff_against: None,
        model_layers: None,
        gpu: Default::default(),
    };
    run_case(c, &settings, None).expect("harness runs").record
}

#[test]
fn naive_overhead_holds_the_full_score_matrix() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let n = 2048;
    let r = measure(&case(VariantId::Naive, n, 1, DType::F32, 2), None);
    assert_eq!(r.status, Status::Ok, "{}", r.reason);
    assert!(r.mem_overhead_bytes.unwrap() >= (n * n * 4) as u64);
}

#[test]
fn rabe_staats_overhead_is_over_30x_below_naive_at_16k() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // One head, d = 64, one stream of work: the paper's setting (Table 2).
    let naive = measure(&case(VariantId::Naive, 16384, 1, DType::F32, 1), None);
    let rs = measure(&case(VariantId::RabeStaats, 16384, 1, DType::F32, 1), None);
    assert_eq!(naive.status, Status::Ok, "{}", naive.reason);
    assert_eq!(rs.status, Status::Ok, "{}", rs.reason);
    let (a, b) = (
        naive.mem_overhead_bytes.unwrap(),
        rs.mem_overhead_bytes.unwrap(),
    );
    assert!(a >= 1 << 30, "naive overhead {a} below 1 GiB");
    assert!(b < 100_000_000, "rabe-staats overhead {b} not under 100 MB");
    assert!(a > 30 * b, "ratio {} not above 30", a as f64 / b as f64);
}

#[test]
fn memory_efficient_backwards_hold_no_quadratic_buffer_at_8k() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // One stream of work, as the paper measures (each worker holds its own chunk slabs).
    let n = 8192;
    let naive = measure(&train(VariantId::Naive, n, 1, DType::F32, 1), None);
    assert_eq!(naive.status, Status::Ok, "{}", naive.reason);
    let quadratic = 2 * (n * n * 4) as u64; // P and dS
    assert!(naive.mem_overhead_bytes.unwrap() >= quadratic);
    for v in [VariantId::RabeStaats, VariantId::Flash] {
        let r = measure(&train(v, n, 1, DType::F32, 1), None);
        assert_eq!(r.status, Status::Ok, "{}: {}", v.name(), r.reason);
        let got = r.mem_overhead_bytes.unwrap();
        // Far below: under a tenth of naive's, and under one n x n f32 matrix.
        assert!(
            got * 10 < naive.mem_overhead_bytes.unwrap(),
            "{}: {got}",
            v.name()
        );
        assert!(got < (n * n * 4) as u64, "{}: {got}", v.name());
    }
}

/// The measured overhead is the variant's prediction plus at most 64 KiB of bookkeeping
/// (rayon jobs, locks, block flags) and, for fwd+bwd only, the backward's GEMM packing
/// buffers of each worker (the forward kernels allocate nothing but their workspace).
#[test]
fn measured_overhead_matches_the_prediction() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // The MPI variants' per-rank predictions are checked under mpirun (tests/mpi.rs).
    for v in VariantId::in_process() {
        for (n, heads, dtype, threads) in [
            (1000, 2, DType::F32, 2),
            (1536, 1, DType::Bf16, 1),
            (300, 3, DType::F16, 2),
        ] {
            let c = native(case(v, n, heads, dtype, threads));
            if let Some(why) = v.get().unsupported(&c) {
                println!("{v} {dtype}: not applicable ({why})");
                continue;
            }
            check_prediction(&c, threads);
            if v.info().modes.contains(&Mode::LayerTrain) {
                // Training; and BPT with several query blocks, the last one short.
                check_prediction(
                    &Case {
                        mode: Mode::LayerTrain,
                        ..c
                    },
                    threads,
                );
                if v == VariantId::LayerBpt {
                    for mode in [Mode::LayerFwd, Mode::LayerTrain] {
                        let blocks = Case {
                            mode,
                            q_chunk: Some(384),
                            ..c
                        };
                        check_prediction(&blocks, threads);
                    }
                }
            }
            if v.info().modes.contains(&Mode::FwdBwd) {
                check_prediction(
                    &Case {
                        mode: Mode::FwdBwd,
                        ..c
                    },
                    threads,
                );
            }
        }
    }
}

/// The case in the variant's own first mode: decode variants get 3 new tokens against the
/// cache of n, multi-device variants 3 simulated devices.
fn native(mut c: Case) -> Case {
    c.mode = c.variant.info().modes[0];
    if c.mode == Mode::Decode {
        c.shape.seq_q = 3;
        c.q_chunk = c.q_chunk.map(|q| q.min(3));
    }
    let on_three = Case { devices: 3, ..c };
    if c.variant.get().unsupported(&on_three).is_none() {
        c.devices = 3;
    }
    c
}

fn check_prediction(c: &Case, threads: usize) {
    let (v, n, dtype) = (c.variant, c.shape.seq_q, c.dtype);
    {
        {
            let r = measure(c, None);
            assert_eq!(r.status, Status::Ok, "{}: {}", v.name(), r.reason);
            let (got, want) = (
                r.mem_overhead_bytes.unwrap(),
                r.mem_predicted_bytes.unwrap(),
            );
            let slack = packing_bytes(c) + 64 * 1024;
            assert!(
                got >= want && got <= want + slack,
                "{} {} n={n} {dtype} t={threads}: measured {got}, predicted {want} (+{slack} allowed)",
                v.name(),
                c.mode
            );
        }
    }
}

#[test]
fn budget_makes_naive_oom_by_prediction_without_running_it() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let budget = Some(8u64 << 30);
    let naive = measure(&case(VariantId::Naive, 65536, 1, DType::Bf16, 2), budget);
    assert_eq!(naive.status, Status::Oom);
    assert!(
        naive.reason.contains("exceeds the memory budget"),
        "{}",
        naive.reason
    );
    assert!(naive.time_median_s.is_none(), "an oom case must not run");
}

#[test]
fn an_allocation_over_the_budget_is_an_oom_error_not_an_abort() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = case(VariantId::Naive, 1024, 1, DType::F32, 1);
    let inputs = Inputs::generate(c.shape, c.dtype, c.input_dist, 1.0, 1);
    let mut out = vec![0.0f32; c.shape.out_len()];
    // Leave 1 MiB of room: the 4 MiB score matrix must be refused, fallibly.
    alloc::set_limit(Some(alloc::current_bytes() + (1 << 20)));
    let result = forward(&c, &inputs, &mut out);
    alloc::set_limit(None);
    assert!(matches!(result, Err(Error::OutOfMemory(_))), "{result:?}");
    // And with room, the same call succeeds.
    assert!(forward(&c, &inputs, &mut out).is_ok());
}
