//! Memory overhead from the counting allocator: deterministic, so asserted exactly against
//! the papers' claims and against each variant's own prediction.
//!
//! One `#[test]` in its own binary, the checks in sequence: the allocator's counters and its
//! budget are process-wide, and with a second test on another thread (or the harness freeing
//! a finished test's thread and output) an allocation or free inside a meter would shift a
//! figure, and a budget of a few KiB would refuse another test's large block.

use std::collections::BTreeSet;

#[path = "common/slack.rs"]
mod slack;
use slack::{slack, INJECTOR_BLOCK};

use attnbench::backend::cpu::isa::Isa;
use attnbench::backend::cpu::workspace::{try_scratch, WarmCalls};
use attnbench::error::Error;
use attnbench::layer;
use attnbench::measure::alloc::{self, OverheadMeter};
use attnbench::measure::timer::StopRule;
use attnbench::problem::VariantId;
use attnbench::problem::{Allreduce, Case, DType, Grads, Inputs, Mode, Shape};
use attnbench::results::record::{Record, Status};
use attnbench::run::interleave::{group_bytes, run_group};
use attnbench::run::{
    forward, forward_with, packing_bytes, pool, run_case, train_step_with, Settings,
};
use attnbench::variant::{layer_plan, DefaultCase, Registry};

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
    a_warm_loop_frees_its_kept_buffers_before_refusing_a_request();
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

/// The measured overhead is the variant's prediction plus its variant's `slack` (the few
/// bytes it allocates beside its workspace, tests/common/slack.rs) and rayon's
/// `INJECTOR_BLOCK`, and, only where the case's kernels call the packing SGEMM
/// (`Variant::uses_packing_gemm`), one packing buffer per thread. Every (variant, mode,
/// dtype, kernel path) the machine has must be measured: a variant declining a case it
/// should run fails here rather than being skipped.
fn measured_overhead_matches_the_prediction() {
    let detected = Isa::detect();
    // bf16 also on the widening AVX-512 path where the pair path is the default.
    let also = (detected == Isa::Avx512Bf16 && Isa::Avx512.available()).then_some(Isa::Avx512);
    let mut measured = BTreeSet::new();
    let mut fp8_measured = BTreeSet::new();
    // The MPI variants' per-rank predictions are checked under mpirun (tests/mpi.rs).
    for v in VariantId::in_process() {
        for (n, heads, dtype, threads) in [
            (1000, 2, DType::F32, 2),
            (1536, 1, DType::Bf16, 1),
            (1024, 2, DType::Bf16, 2),
            (300, 3, DType::F16, 2),
        ] {
            let c = native(case(v, n, heads, dtype, threads));
            let mut cases = vec![c.clone()];
            if v.get().ragged() && c.mode == Mode::Decode {
                // A continuous-batching step: decodes over caches of their own lengths and
                // a prefill chunk, packed.
                let spec: attnbench::problem::BatchSpec =
                    format!("q3kv{n}+2xq1kv{}+q{}kv{}", n / 3, n / 8, n / 2)
                        .parse()
                        .unwrap();
                let dense = Shape::self_attention(heads, n, 64);
                cases.push(Case {
                    shape: spec.packed(&dense),
                    batch_spec: Some(spec),
                    ..c.clone()
                });
            }
            if v == VariantId::CascadeDecode {
                // Six requests sharing half the cache, one KV head: phase 1's 6 x heads x 3
                // rows reach the SGEMM (its packing allowed).
                cases.push(Case {
                    shape: Shape {
                        batch: 6,
                        kv_heads: 1,
                        ..c.shape
                    },
                    prefix_len: Some(c.shape.seq_kv / 2),
                    ..c.clone()
                });
            }
            for &mode in &v.info().modes[1..] {
                cases.push(Case { mode, ..c.clone() });
            }
            // The readers of an FP8 cache: the same decodes with K and V in FP8 (widened
            // into scratch whatever the dtype).
            if v.get().fp8_kv() {
                let fp8: Vec<Case> = cases
                    .iter()
                    .map(|c| Case {
                        kv_dtype: Some(attnbench::problem::Fp8Format::Fp8e5m2),
                        ..c.clone()
                    })
                    .collect();
                cases.extend(fp8);
            }
            // The variants with attention sinks: a causal window with sinks reaching into
            // it, in every mode (the sink blocks use the window's workspace).
            if v.get().sinks() {
                let base: Vec<Case> = cases
                    .iter()
                    .filter(|c| c.kv_dtype.is_none() && c.batch_spec.is_none())
                    .map(|c| Case {
                        causal: true,
                        window: Some(c.shape.seq_kv / 3 + 1),
                        sinks: Some(c.shape.seq_kv / 2),
                        ..c.clone()
                    })
                    .collect();
                cases.extend(base);
            }
            if matches!(v, VariantId::RingPrefill | VariantId::StripePrefill) {
                // Blocks of 8 query rows: under GEMM_MIN_ROWS, no SGEMM and so no packing.
                cases.push(Case {
                    q_chunk: Some(8),
                    ..c.clone()
                });
            }
            if matches!(
                v,
                VariantId::Flash
                    | VariantId::Naive
                    | VariantId::NaiveUnsafe
                    | VariantId::RabeStaats
                    | VariantId::RabeStaatsSeq
            ) {
                // A causal sliding window in prefill (no multiple of any block or chunk):
                // blocks skipped, the workspace the same.
                let windowed = Case {
                    causal: true,
                    window: Some(n / 3 + 1),
                    ..c.clone()
                };
                for &mode in v.info().modes {
                    let w = Case {
                        mode,
                        ..windowed.clone()
                    };
                    if v.get().unsupported(&w).is_none() {
                        cases.push(w);
                    }
                }
            }
            if dtype == DType::Bf16
                && matches!(
                    v,
                    VariantId::Flash
                        | VariantId::Naive
                        | VariantId::RabeStaats
                        | VariantId::ChunkedPrefill
                        | VariantId::FlashVarlen
                )
            {
                // `precision = highest`: P kept in f32, so on the pair path flash widens
                // K and V and naive holds no bf16 P (a workspace of its own).
                let highest = Case {
                    precision: Some(attnbench::problem::Precision::Highest),
                    ..c.clone()
                };
                if Isa::Avx512Bf16.available() && detected != Isa::Avx512Bf16 {
                    check_prediction(&highest, Isa::Avx512Bf16);
                }
                cases.push(highest);
            }
            if v == VariantId::TreeDecode {
                // Each allreduce's largest round in flight: the binomial tree on 5 devices
                // (not a power of two), nodes of 2 on 6 devices, the ring on 4.
                for (devices, allreduce) in [
                    (5, Allreduce::Tree),
                    (6, Allreduce::TwoLevel { per_node: 2 }),
                    (4, Allreduce::Ring),
                ] {
                    cases.push(Case {
                        devices,
                        allreduce: Some(allreduce),
                        ..c.clone()
                    });
                }
            }
            if v == VariantId::LayerBpt {
                // BPT with several query blocks, the last one short.
                for mode in [Mode::LayerFwd, Mode::LayerTrain] {
                    cases.push(Case {
                        mode,
                        q_chunk: Some(384),
                        ..c.clone()
                    });
                }
            }
            for c in &cases {
                if let Some(why) = v.get().unsupported(c) {
                    panic!("{v} {} {dtype}: declined ({why})", c.mode);
                }
                check_prediction(c, detected);
                measured.insert((v.name(), c.mode, dtype, detected));
                if c.kv_dtype.is_some() {
                    fp8_measured.insert(v.name());
                }
                if let Some(isa) = also.filter(|_| dtype == DType::Bf16) {
                    check_prediction(c, isa);
                    measured.insert((v.name(), c.mode, dtype, isa));
                }
            }
        }
    }
    // No silent drops: every variant in every one of its modes and every dtype, bf16 on
    // each of its paths this CPU has.
    let mut expected = BTreeSet::new();
    for v in VariantId::in_process() {
        for &mode in v.info().modes {
            for dtype in [DType::F32, DType::Bf16, DType::F16] {
                expected.insert((v.name(), mode, dtype, detected));
                if let Some(isa) = also.filter(|_| dtype == DType::Bf16) {
                    expected.insert((v.name(), mode, dtype, isa));
                }
            }
        }
    }
    assert_eq!(measured, expected);
    // The FP8 readers, written out (a variant that stops reading one fails here).
    let fp8_expected = BTreeSet::from(["decode-naive", "decode-online", "flash-decoding"]);
    assert_eq!(fp8_measured, fp8_expected);
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

/// The case's overhead on kernel path `isa`, measured and against its prediction there:
/// through the harness (`run_case`) on the detected path, by a direct call on another.
fn check_prediction(c: &Case, isa: Isa) {
    let (v, n, dtype, threads) = (c.variant, c.shape.seq_q, c.dtype, c.threads);
    let (got, want) = if isa == Isa::detect() {
        let r = measure(c, None);
        assert_eq!(r.status, Status::Ok, "{}: {}", v.name(), r.reason);
        (
            r.mem_overhead_bytes.unwrap(),
            r.mem_predicted_bytes.unwrap(),
        )
    } else {
        let want = match c.mode {
            Mode::FwdBwd => v.get().predict_train_workspace_bytes(c, isa),
            _ => v.get().predict_workspace_bytes(c, isa),
        };
        (overhead_on(c, isa), want)
    };
    let (slack, packing) = (slack(v) + INJECTOR_BLOCK, packing_bytes(c));
    println!(
        "{} {} {dtype} {isa} n={n} t={threads} rows={}: measured {got}, predicted {want}, excess {}",
        v.name(),
        c.mode,
        c.shape.seq_q,
        got as i64 - want as i64
    );
    assert!(
        got >= want && got <= want + slack + packing,
        "{} {} n={n} {dtype} {isa} t={threads}: measured {got}, predicted {want} \
         (+{slack} slack, +{packing} GEMM packing allowed)",
        v.name(),
        c.mode
    );
}

/// The overhead of one call of `c` on kernel path `isa` (after an unmeasured call, as the
/// harness measures after its timed calls: the thread pool and rayon's queues are set up).
fn overhead_on(c: &Case, isa: Isa) -> u64 {
    let call = |meter: bool| -> u64 {
        match c.mode {
            Mode::Fwd | Mode::Decode => {
                let inputs = Inputs::for_case(c);
                let mut out = vec![0.0f32; c.shape.out_len()];
                let m = meter.then(OverheadMeter::start);
                forward_with(c, isa, &inputs, &mut out).expect("forward runs");
                m.map_or(0, |m| m.finish())
            }
            Mode::FwdBwd => {
                let inputs = Inputs::for_case(c);
                let s = &c.shape;
                let d_out = c.d_out.make(s, c.seed);
                let mut out = vec![0.0f32; s.out_len()];
                let mut grads = Grads {
                    dq: vec![0.0; s.q_len()],
                    dk: vec![0.0; s.kv_len()],
                    dv: vec![0.0; s.kv_len()],
                };
                let m = meter.then(OverheadMeter::start);
                train_step_with(c, isa, &inputs, &d_out, &mut out, &mut grads)
                    .expect("training step runs");
                m.map_or(0, |m| m.finish())
            }
            Mode::LayerFwd | Mode::LayerTrain => {
                let plan = layer_plan(c).expect("a layer plan");
                let (params, x) = layer::generate(c);
                let train = c.mode == Mode::LayerTrain;
                let d_out = if train {
                    c.d_out.make(&c.shape, c.seed)
                } else {
                    Vec::new()
                };
                let n = c.tokens_len();
                let mut out = vec![0.0f32; n];
                let (mut dx, mut dp) = if train {
                    (vec![0.0f32; n], vec![0.0f32; params.len()])
                } else {
                    (Vec::new(), Vec::new())
                };
                let threads = pool(c.threads).expect("a pool");
                let m = meter.then(OverheadMeter::start);
                threads
                    .install(|| {
                        layer::run_once(&plan, isa, &params, &x, &d_out, &mut out, &mut dx, &mut dp)
                    })
                    .expect("layer runs");
                m.map_or(0, |m| m.finish())
            }
        }
    };
    call(false);
    call(true)
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

/// A warm timing loop keeps the buffers its previous call freed; a request that the budget
/// refuses while they are kept gets its buffer once they are freed, not an OOM.
fn a_warm_loop_frees_its_kept_buffers_before_refusing_a_request() {
    let _warm = WarmCalls::start();
    let len = 1 << 20; // 4 MiB
    drop(try_scratch(len, "kept").unwrap());
    // 2 MiB of room beyond what is live, the kept 4 MiB included.
    alloc::set_limit(Some(alloc::current_bytes() + (2 << 20)));
    let fresh = try_scratch(len + 16, "fresh").map(|b| b.len());
    alloc::set_limit(None);
    assert_eq!(
        fresh.ok(),
        Some(len + 16),
        "refused with the kept buffer still held"
    );
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
