//! The simulated Ring, Striped and Tree Attention: outputs equal the single-device output
//! (1e-6 relative, f32) and the f64 oracle on ragged shapes; counted communication and
//! per-device memory equal the paper's eqs. (8)-(14) exactly; a dropped or duplicated
//! message is an error; striping balances causal work.

use super::comm::Fault;
use super::plan::Allreduce;
use super::shard::Placement;
use super::stats::SimStats;
use super::{ring, tree};
use crate::model::formulas::{self, Dims};
use crate::problem::VariantId;
use crate::problem::{Case, DType, Device, InputDist, Inputs, Mode, Shape, UpstreamGrad};
use crate::reference::{check_masked, rows_to_check};
use crate::run::output;

fn shape(heads: usize, kv_heads: usize, seq_q: usize, seq_kv: usize, d: usize) -> Shape {
    Shape {
        batch: 2,
        heads,
        kv_heads,
        seq_q,
        seq_kv,
        head_dim: d,
    }
}

fn inputs(s: Shape) -> Inputs {
    Inputs::generate(s, DType::F32, InputDist::Normal, 1.0, 11)
}

/// The single-device flash-decoding output of the same problem.
fn single_device(s: Shape, causal: bool, window: Option<usize>, x: &Inputs) -> Vec<f32> {
    let case = Case {
        variant: VariantId::FlashDecoding,
        mode: Mode::Decode,
        device: Device::Cpu,
        dtype: DType::F32,
        shape: s,
        q_chunk: None,
        kv_chunk: Some(8),
        causal,
        window,
        devices: 1,
        splits: Some(3),
        allreduce: None,
        threads: 2,
        input_dist: InputDist::Normal,
        input_scale: 1.0,
        seed: 11,
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
    };
    output(&case, x).expect("flash-decoding runs")
}

/// max |a - b| / max |b| (normwise relative difference).
fn rel(a: &[f32], b: &[f32]) -> f64 {
    let diff = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() as f64)
        .fold(0.0, f64::max);
    let norm = b.iter().map(|y| y.abs() as f64).fold(0.0, f64::max);
    if norm > 0.0 {
        diff / norm
    } else {
        diff
    }
}

fn oracle_err(x: &Inputs, causal: bool, window: Option<usize>, out: &[f32]) -> f64 {
    check_masked(x, causal, window, out, &rows_to_check(&x.shape, usize::MAX)).max_abs
}

fn ring_spec(
    placement: Placement,
    decode: bool,
    causal: bool,
    window: Option<usize>,
    p: usize,
) -> ring::Spec {
    ring::Spec {
        placement,
        decode,
        causal,
        window,
        devices: p,
        bq: 5,
        bk: 7,
        threads: 2,
    }
}

fn tree_spec(causal: bool, window: Option<usize>, p: usize, allreduce: Allreduce) -> tree::Spec {
    tree::Spec {
        placement: Placement::Contiguous,
        causal,
        window,
        devices: p,
        allreduce,
        bk: 7,
        threads: 2,
    }
}

fn run_ring(
    spec: &ring::Spec,
    x: &Inputs,
    fault: Option<Fault>,
) -> (Vec<f32>, crate::error::Result<SimStats>) {
    let mut out = vec![f32::NAN; x.shape.out_len()];
    let r = ring::run(spec, x, &mut out, fault);
    (out, r)
}

fn run_tree(
    spec: &tree::Spec,
    x: &Inputs,
    fault: Option<Fault>,
) -> (Vec<f32>, crate::error::Result<SimStats>) {
    let mut out = vec![f32::NAN; x.shape.out_len()];
    let r = tree::run(spec, x, &mut out, fault);
    (out, r)
}

const ALLREDUCES: [Allreduce; 3] = [
    Allreduce::Ring,
    Allreduce::Tree,
    Allreduce::TwoLevel { per_node: 2 },
];

#[test]
fn ring_and_tree_decode_equal_the_single_device_output_on_ragged_shapes() {
    // N not a multiple of p (nor of the key block 7), kv_heads 1 and 2, windows shorter
    // and longer than N, one and several new tokens (causal within them).
    for (heads, kv_heads) in [(4, 1), (4, 2)] {
        for (seq_q, causal) in [(1, false), (3, true), (3, false)] {
            for seq_kv in [1, 23, 101] {
                for window in [None, Some(6), Some(500)] {
                    for p in [1, 2, 3, 8] {
                        let s = shape(heads, kv_heads, seq_q, seq_kv, 16);
                        let x = inputs(s);
                        let want = single_device(s, causal, window, &x);
                        let tag = format!(
                            "h{heads}/{kv_heads} q{seq_q} c{causal} n{seq_kv} w{window:?} p{p}"
                        );
                        let (out, r) = run_ring(
                            &ring_spec(Placement::Contiguous, true, causal, window, p),
                            &x,
                            None,
                        );
                        r.unwrap_or_else(|e| panic!("ring {tag}: {e}"));
                        assert!(rel(&out, &want) <= 1e-6, "ring {tag}: {}", rel(&out, &want));
                        assert!(oracle_err(&x, causal, window, &out) <= 1e-5, "ring {tag}");
                        for alg in ALLREDUCES {
                            if alg.unsupported(p).is_some() {
                                continue;
                            }
                            let (out, r) = run_tree(&tree_spec(causal, window, p, alg), &x, None);
                            r.unwrap_or_else(|e| panic!("tree {alg} {tag}: {e}"));
                            assert!(
                                rel(&out, &want) <= 1e-6,
                                "tree {alg} {tag}: {}",
                                rel(&out, &want)
                            );
                            assert!(
                                oracle_err(&x, causal, window, &out) <= 1e-5,
                                "tree {alg} {tag}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn ring_and_stripe_prefill_match_the_oracle_on_ragged_shapes() {
    for (heads, kv_heads) in [(2, 2), (4, 1)] {
        for n in [1, 13, 50] {
            for p in [1, 3, 4, 7] {
                for causal in [false, true] {
                    for window in [None, Some(9)] {
                        let s = shape(heads, kv_heads, n, n, 8);
                        let x = inputs(s);
                        for placement in [Placement::Contiguous, Placement::Striped] {
                            let mut spec = ring_spec(placement, false, causal, window, p);
                            for bq in [5, 32] {
                                // 32-row blocks take the SGEMM path of the kernel.
                                spec.bq = bq;
                                let (out, r) = run_ring(&spec, &x, None);
                                let tag = format!("{placement:?} h{heads}/{kv_heads} n{n} p{p} c{causal} w{window:?} bq{bq}");
                                r.unwrap_or_else(|e| panic!("{tag}: {e}"));
                                let e = oracle_err(&x, causal, window, &out);
                                assert!(e <= 1e-5, "{tag}: {e}");
                            }
                        }
                    }
                }
            }
        }
    }
}

/// (b, t, n_h, d_h, p) for the counts: MHA, one decode query, N = t·p.
const COUNT_SHAPES: [(usize, usize, usize, usize, usize); 5] = [
    (1, 10, 16, 128, 8),
    (2, 5, 3, 8, 3),
    (3, 7, 2, 16, 5),
    (1, 3, 4, 32, 16),
    (2, 1, 1, 4, 2),
];

fn count_case(b: usize, t: usize, n_h: usize, d_h: usize, p: usize) -> (Inputs, Dims) {
    let s = Shape {
        batch: b,
        heads: n_h,
        kv_heads: n_h,
        seq_q: 1,
        seq_kv: t * p,
        head_dim: d_h,
    };
    let dims = Dims {
        b: b as u64,
        t: t as u64,
        n_h: n_h as u64,
        d_h: d_h as u64,
        p: p as u64,
    };
    (inputs(s), dims)
}

#[test]
fn counted_ring_communication_and_memory_equal_eqs_8_10() {
    for (b, t, n_h, d_h, p) in COUNT_SHAPES {
        let (x, dims) = count_case(b, t, n_h, d_h, p);
        let (_, r) = run_ring(
            &ring_spec(Placement::Contiguous, true, false, None, p),
            &x,
            None,
        );
        let st = r.unwrap();
        let rot = st.collective(ring::ROTATION).unwrap();
        assert_eq!(rot.steps, p as u64 - 1);
        // Eq. (10) is per iteration summed over the devices.
        assert_eq!(rot.elements(), (p as u64 - 1) * formulas::v_ring(&dims));
        for dev in &rot.sent {
            assert_eq!(dev.elements, (p as u64 - 1) * formulas::numel_kv(&dims));
        }
        let bd = (b * n_h * d_h) as u64;
        let bcast = st.collective(ring::BROADCAST_Q).unwrap();
        assert_eq!(bcast.elements(), (p as u64 - 1) * bd);
        // Eq. (8) plus the running max and sum (2·b·n_h), which the paper leaves out.
        for m in &st.memory {
            assert_eq!(
                m.peak_elements,
                formulas::mem_ring(&dims) + 2 * (b * n_h) as u64
            );
            assert_eq!(m.peak_of("visiting kv"), formulas::numel_kv(&dims));
        }
    }
}

#[test]
fn counted_tree_communication_and_memory_equal_eqs_9_and_12_14() {
    for (b, t, n_h, d_h, p) in COUNT_SHAPES {
        let (x, dims) = count_case(b, t, n_h, d_h, p);
        for alg in [
            Allreduce::Ring,
            Allreduce::Tree,
            Allreduce::TwoLevel { per_node: 2 },
            Allreduce::TwoLevel { per_node: 8 },
        ] {
            if alg.unsupported(p).is_some() {
                continue;
            }
            let (_, r) = run_tree(&tree_spec(false, None, p, alg), &x, None);
            let st = r.unwrap();
            let rows = (b * n_h) as u64;
            let (max, num, den) = (
                st.collective(tree::ALLREDUCE_MAX).unwrap(),
                st.collective(tree::ALLREDUCE_NUM).unwrap(),
                st.collective(tree::ALLREDUCE_DEN).unwrap(),
            );
            // Eq. (12) for each allreduce, summed over the devices: 2(p-1)·numel.
            let pm = 2 * (p as u64 - 1);
            assert_eq!(max.elements(), pm * rows, "{alg} {dims:?}");
            assert_eq!(num.elements(), pm * rows * d_h as u64, "{alg} {dims:?}");
            assert_eq!(den.elements(), pm * rows, "{alg} {dims:?}");
            // Eq. (14): the per-device mean of the three.
            let total = max.elements() + num.elements() + den.elements();
            assert_eq!(total, formulas::v_tree_total(&dims));
            assert_eq!(total as f64 / p as f64, formulas::v_tree(&dims));
            // Eq. (9), exactly, on every device.
            for m in &st.memory {
                assert_eq!(m.peak_elements, formulas::mem_tree(&dims), "{alg} {dims:?}");
            }
        }
    }
}

fn messages(st: &SimStats) -> u64 {
    st.collectives
        .iter()
        .flat_map(|c| c.sent.iter().map(|t| t.messages))
        .sum()
}

#[test]
fn every_dropped_or_duplicated_message_fails_the_call() {
    let (x, _) = count_case(1, 4, 2, 8, 4);
    let ring = ring_spec(Placement::Contiguous, true, false, None, 4);
    let total = messages(&run_ring(&ring, &x, None).1.unwrap());
    assert_eq!(total, 3 + 3 * 4); // broadcast, then three rotation rounds
    for nth in 0..total {
        for fault in [Fault::Drop { nth }, Fault::Duplicate { nth }] {
            let (_, r) = run_ring(&ring, &x, Some(fault));
            assert!(r.is_err(), "ring: {fault:?} went unnoticed");
        }
    }
    for alg in ALLREDUCES {
        let spec = tree_spec(false, None, 4, alg);
        let total = messages(&run_tree(&spec, &x, None).1.unwrap());
        for nth in 0..total {
            for fault in [Fault::Drop { nth }, Fault::Duplicate { nth }] {
                let (_, r) = run_tree(&spec, &x, Some(fault));
                assert!(r.is_err(), "tree {alg}: {fault:?} went unnoticed");
            }
        }
        // Past the last message nothing changes.
        let (_, r) = run_tree(&spec, &x, Some(Fault::Drop { nth: total }));
        assert!(r.is_ok());
    }
}

#[test]
fn striped_placement_balances_causal_work() {
    let n = 256;
    let s = shape(1, 1, n, n, 4);
    let x = inputs(s);
    let p = 8;
    let run = |placement| {
        let (_, r) = run_ring(&ring_spec(placement, false, true, None, p), &x, None);
        r.unwrap()
    };
    let (ring, stripe) = (run(Placement::Contiguous), run(Placement::Striped));
    // Same work in all: the causal pairs, b·h·n(n+1)/2.
    let pairs = 2 * n as u64 * (n as u64 + 1) / 2;
    assert_eq!(ring.pairs_total(), pairs);
    assert_eq!(stripe.pairs_total(), pairs);
    // Ring: the device past the diagonal does a full block at every step; stripe halves it.
    let t = (n / p) as u64;
    assert_eq!(
        ring.pairs_critical(),
        2 * ((p as u64 - 1) * t * t + t * (t + 1) / 2)
    );
    let gain = ring.pairs_critical() as f64 / stripe.pairs_critical() as f64;
    assert!(gain > 1.7, "balance gain {gain}");
}

/// The schedules alone (`Spec::planned`, what the MPI rows set beside their counts) give
/// exactly what the simulated comm layer counts, on ragged shapes.
#[test]
fn planned_traffic_equals_the_counted_traffic() {
    for (p, n) in [(2, 37), (3, 301), (4, 64)] {
        let s = shape(4, 2, 1, n, 8);
        let x = inputs(s);
        let mut out = vec![0.0; s.out_len()];
        for decode in [true, false] {
            let s = if decode { s } else { shape(4, 2, n, n, 8) };
            let x = if decode { x.clone() } else { inputs(s) };
            let mut out = vec![0.0; s.out_len()];
            let spec = ring::Spec {
                placement: Placement::Contiguous,
                decode,
                causal: false,
                window: None,
                devices: p,
                bq: 16,
                bk: 16,
                threads: 1,
            };
            let stats = ring::run(&spec, &x, &mut out, None).unwrap();
            let planned = spec.planned(&s, DType::F32);
            assert_eq!(
                (planned.bytes, planned.max_device_bytes, planned.steps),
                (stats.bytes(), stats.max_device_bytes(), stats.steps()),
                "ring p {p} n {n} decode {decode}"
            );
        }
        for alg in [
            Allreduce::Ring,
            Allreduce::Tree,
            Allreduce::TwoLevel { per_node: 2 },
        ] {
            if alg.unsupported(p).is_some() {
                continue;
            }
            let spec = tree::Spec {
                placement: Placement::Contiguous,
                causal: false,
                window: None,
                devices: p,
                allreduce: alg,
                bk: 16,
                threads: 1,
            };
            let stats = tree::run(&spec, &x, &mut out, None).unwrap();
            let planned = spec.planned(&s, DType::F32).unwrap();
            assert_eq!(
                (planned.bytes, planned.max_device_bytes, planned.steps),
                (stats.bytes(), stats.max_device_bytes(), stats.steps()),
                "tree {alg} p {p} n {n}"
            );
        }
    }
}
