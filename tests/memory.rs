//! Memory overhead from the counting allocator: deterministic, so asserted exactly against
//! the papers' claims and against each variant's own prediction.
//!
//! One `#[test]` in its own binary, the checks in sequence: the allocator's counters and its
//! budget are process-wide, and with a second test on another thread (or the harness freeing
//! a finished test's thread and output) an allocation or free inside a meter would shift a
//! figure, and a budget of a few KiB would refuse another test's large block.

use attnbench::error::Error;
use attnbench::measure::alloc;
use attnbench::measure::timer::StopRule;
use attnbench::problem::VariantId;
use attnbench::problem::{Case, DType, Inputs, Mode, Shape};
use attnbench::results::record::{Record, Status};
use attnbench::run::interleave::{group_bytes, run_group};
use attnbench::run::{forward, packing_bytes, run_case, Settings};
use attnbench::variant::{DefaultCase, Registry};

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

#[test]
fn memory_accounting() {
    naive_overhead_holds_the_full_score_matrix();
    rabe_staats_overhead_is_over_30x_below_naive_at_16k();
    memory_efficient_backwards_hold_no_quadratic_buffer_at_8k();
    measured_overhead_matches_the_prediction();
    budget_makes_naive_oom_by_prediction_without_running_it();
    an_allocation_over_the_budget_is_an_oom_error_not_an_abort();
    a_group_over_the_memory_budget_runs_case_by_case_with_the_same_rows();
}

/// One call per case, no warm-up: the memory figures need no timing.
fn settings(budget: Option<u64>) -> Settings {
    Settings {
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
        externals: Default::default(),
    }
}

fn measure(c: &Case, budget: Option<u64>) -> Record {
    run_case(c, &settings(budget), None)
        .expect("harness runs")
        .record
}

fn naive_overhead_holds_the_full_score_matrix() {
    let n = 2048;
    let r = measure(&case(VariantId::Naive, n, 1, DType::F32, 2), None);
    assert_eq!(r.status, Status::Ok, "{}", r.reason);
    assert!(r.mem_overhead_bytes.unwrap() >= (n * n * 4) as u64);
}

fn rabe_staats_overhead_is_over_30x_below_naive_at_16k() {
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

fn memory_efficient_backwards_hold_no_quadratic_buffer_at_8k() {
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
fn measured_overhead_matches_the_prediction() {
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
            if v.get().ragged() && c.mode == Mode::Decode {
                // A continuous-batching step: decodes over caches of their own lengths and
                // a prefill chunk, packed.
                let spec: attnbench::problem::BatchSpec =
                    format!("q3kv{n}+2xq1kv{}+q{}kv{}", n / 3, n / 8, n / 2)
                        .parse()
                        .unwrap();
                let dense = Shape::self_attention(heads, n, 64);
                check_prediction(
                    &Case {
                        shape: spec.packed(&dense),
                        batch_spec: Some(spec),
                        ..c.clone()
                    },
                    threads,
                );
            }
            if v.info().modes.contains(&Mode::LayerTrain) {
                // Training; and BPT with several query blocks, the last one short.
                check_prediction(
                    &Case {
                        mode: Mode::LayerTrain,
                        ..c.clone()
                    },
                    threads,
                );
                if v == VariantId::LayerBpt {
                    for mode in [Mode::LayerFwd, Mode::LayerTrain] {
                        let blocks = Case {
                            mode,
                            q_chunk: Some(384),
                            ..c.clone()
                        };
                        check_prediction(&blocks, threads);
                    }
                }
            }
            if v.info().modes.contains(&Mode::FwdBwd) {
                check_prediction(
                    &Case {
                        mode: Mode::FwdBwd,
                        ..c.clone()
                    },
                    threads,
                );
            }
        }
    }
}

/// The case in the variant's own first mode: decode variants get 3 new tokens against the
/// cache of n, multi-device variants 3 simulated devices, causal-only variants (chunked
/// prefill) a causal mask.
fn native(mut c: Case) -> Case {
    c.mode = c.variant.info().modes[0];
    let causal = Case {
        causal: true,
        ..c.clone()
    };
    if c.variant.get().unsupported(&c).is_some() && c.variant.get().unsupported(&causal).is_none() {
        c.causal = true;
    }
    // A ragged batch: a prefill of n, two shorter prefills and a decode over n keys.
    if c.variant.get().ragged() && c.mode == Mode::Fwd {
        let n = c.shape.seq_q;
        let spec: attnbench::problem::BatchSpec =
            format!("q{n}+2xq{}+q1kv{n}", n / 3).parse().unwrap();
        c.shape = spec.packed(&c.shape);
        c.batch_spec = Some(spec);
    }
    if c.mode == Mode::Decode {
        c.shape.seq_q = 3;
        c.q_chunk = c.q_chunk.map(|q| q.min(3));
    }
    let on_three = Case {
        devices: 3,
        ..c.clone()
    };
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

fn budget_makes_naive_oom_by_prediction_without_running_it() {
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

fn an_allocation_over_the_budget_is_an_oom_error_not_an_abort() {
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

/// `run.interleave`: a group whose cases fit the budget one at a time but not together runs
/// case by case, with the rows it would have had (the budget here is a few KiB, which is why
/// this runs in this binary and not beside other tests).
fn a_group_over_the_memory_budget_runs_case_by_case_with_the_same_rows() {
    let small = |variant, threads| {
        Case::cpu_fwd(
            variant,
            Shape::self_attention(2, 48, 16),
            DType::F32,
            threads,
        )
    };
    let timed = |budget| Settings {
        stop: StopRule {
            warmup: 1,
            min_reps: 2,
            max_reps: 2,
            rel_spread: 0.0,
            ..settings(None).stop
        },
        ..settings(budget)
    };
    let cases = [small(VariantId::Naive, 1), small(VariantId::Flash, 1)];
    let refs: Vec<&Case> = cases.iter().collect();
    let one = group_bytes(&refs[..1]);
    assert!(group_bytes(&refs) > one);
    // Each case fits alone, the two together do not.
    let outcomes = run_group(&refs, &timed(Some(group_bytes(&refs) - 1))).unwrap();
    assert_eq!(outcomes.len(), 2);
    for (c, o) in cases.iter().zip(&outcomes) {
        assert_eq!(o.record.case_id, c.id());
        assert_eq!(o.record.status, Status::Ok, "{}", o.record.reason);
        assert_eq!(o.record.reps, 2);
        // run_case keeps the inputs; the interleaved path shares one copy and keeps none.
        assert!(o.inputs.is_some());
    }
    // Cases on different thread counts are never timed together either.
    let mixed = [small(VariantId::Naive, 1), small(VariantId::Naive, 2)];
    let refs: Vec<&Case> = mixed.iter().collect();
    let outcomes = run_group(&refs, &timed(None)).unwrap();
    assert!(outcomes.iter().all(|o| o.inputs.is_some()));
    assert_eq!(outcomes[1].record.case_id, mixed[1].id());
}
