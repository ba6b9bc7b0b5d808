//! Every registered variant against the f64 oracle: ragged shapes, GQA/MQA, causal masks
//! with seq_q != seq_kv, every dtype, random shapes (proptest), and large logits; each on
//! every kernel path (`Isa`) this CPU has. Each test asserts that the (variant, dtype, path)
//! combinations that ran are exactly those expected here (written out from the registry's
//! declared support; a path the CPU lacks is not expected, and named on stdout).

use std::collections::BTreeSet;

use super::{DefaultCase, Registry};
use proptest::prelude::*;

use super::VariantId;
use crate::backend::cpu::isa::Isa;
use crate::backend::cpu::tiles::ReadPath;
use crate::problem::{
    Case, DType, Device, Grads, InputDist, Inputs, Mode, PageOrder, Paging, Precision, Shape,
    Tensor, UpstreamGrad,
};
use crate::reference::grad;
use crate::reference::{check, rows_to_check, ErrorStats};
use crate::run::{output, output_with, train_step_with};

#[derive(Clone, Copy)]
struct Setup {
    shape: Shape,
    dtype: DType,
    causal: bool,
    /// Sliding window (`Shape::key_range`).
    window: Option<usize>,
    chunks: Option<(usize, usize)>,
    threads: usize,
    scale: f64,
    /// Attention sinks beside the window (`Shape::sink_range`).
    sinks: Option<usize>,
}

fn setup(seq_q: usize, seq_kv: usize, head_dim: usize) -> Setup {
    Setup {
        shape: Shape {
            batch: 1,
            heads: 2,
            kv_heads: 2,
            seq_q,
            seq_kv,
            head_dim,
        },
        dtype: DType::F32,
        causal: false,
        window: None,
        chunks: None,
        threads: 2,
        scale: 1.0,
        sinks: None,
    }
}

fn case(v: VariantId, s: &Setup) -> Case {
    let info = v.info();
    let pick = |want: Option<usize>, default: Option<usize>, n: usize| {
        default.map(|d| want.unwrap_or(d).min(n))
    };
    Case {
        q_chunk: pick(s.chunks.map(|c| c.0), info.default_q_chunk, s.shape.seq_q),
        kv_chunk: pick(s.chunks.map(|c| c.1), info.default_kv_chunk, s.shape.seq_kv),
        causal: s.causal,
        window: s.window,
        sinks: s.sinks,
        input_scale: s.scale,
        seed: 42,
        ..Case::cpu_fwd(v, s.shape, s.dtype, s.threads)
    }
}

/// The kernel paths expected here: `Isa::ALL` less those this CPU lacks (named on stdout).
fn paths() -> Vec<Isa> {
    crate::backend::cpu::kernel_paths::expected_isas()
}

fn error_of(v: VariantId, s: &Setup, isa: Isa) -> ErrorStats {
    let c = case(v, s);
    let inputs = Inputs::generate(c.shape, c.dtype, c.input_dist, c.input_scale, c.seed);
    let out = output_with(&c, isa, &inputs).expect("forward runs");
    crate::reference::check_case(&c, &inputs, &out, &rows_to_check(&c.shape, usize::MAX))
}

/// The variants a full-attention `fwd` setup must run, written out from what each declares
/// it supports (not asked of `Variant::unsupported`, so a variant that declines a case it
/// should run fails the test instead of dropping out of it): every single-device forward
/// variant (flash-varlen on the batch packed as sequences of equal length); those that shard
/// queries and keys alike (ring and stripe prefill) and the prompt prefill in steps
/// (chunked-prefill, causal only) where seq_q = seq_kv. With a sliding window, those that
/// take one: all but flash-varlen and chunked-prefill; with attention sinks, flash alone.
/// Not here: ring-prefill-mpi (runs under mpirun, tests/mpi.rs) and external (needs a
/// plugin name).
fn expected_fwd(s: &Setup) -> BTreeSet<VariantId> {
    use VariantId::*;
    if s.sinks.is_some() {
        return BTreeSet::from([Flash]);
    }
    let mut v = BTreeSet::from([Naive, NaiveUnsafe, RabeStaats, RabeStaatsSeq, Flash]);
    let full = s.window.is_none();
    if full {
        v.insert(FlashVarlen);
    }
    if s.shape.seq_q == s.shape.seq_kv {
        v.extend([RingPrefill, StripePrefill]);
        if s.causal && full {
            v.insert(ChunkedPrefill);
        }
    }
    v
}

/// The variants with a `fwd` mode that take the setup's case (declining nothing).
fn fwd_variants(s: &Setup) -> Vec<VariantId> {
    VariantId::ALL
        .into_iter()
        .filter(|v| v.info().modes.contains(&Mode::Fwd))
        .filter(|v| super::impossible::impossible(&case(*v, s)).is_none())
        .filter(|v| v.get().unsupported(&case(*v, s)).is_none())
        .collect()
}

/// Asserts that the (variant, dtype, kernel path) combinations in `ran` are exactly the
/// expected variants on every expected kernel path.
fn assert_ran(
    ran: &BTreeSet<(VariantId, DType, Isa)>,
    variants: &BTreeSet<VariantId>,
    dtype: DType,
    what: &str,
) {
    let want: BTreeSet<_> = variants
        .iter()
        .flat_map(|&v| paths().into_iter().map(move |i| (v, dtype, i)))
        .collect();
    let missing: Vec<_> = want.difference(ran).collect();
    let extra: Vec<_> = ran.difference(&want).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{what}: did not run {missing:?}; ran unexpectedly {extra:?}"
    );
}

/// Every numerically safe variant matches the oracle within the dtype's tolerance, on
/// every kernel path; and exactly the expected variants ran on every expected path.
fn assert_all_variants(s: &Setup) {
    let mut ran = BTreeSet::new();
    for isa in paths() {
        for v in fwd_variants(s) {
            let e = error_of(v, s, isa);
            let tol = s.dtype.tolerance();
            if v.info().numerically_safe || s.scale <= 1.0 {
                assert!(
                    e.non_finite == 0 && e.max_abs <= tol,
                    "{} [{isa}] {:?} dtype {} causal {} window {:?} chunks {:?} threads {}: max_abs_err {:e} > {tol:e}",
                    v.name(),
                    s.shape,
                    s.dtype,
                    s.causal,
                    s.window,
                    s.chunks,
                    s.threads,
                    e.max_abs
                );
            }
            ran.insert((v, s.dtype, isa));
        }
    }
    let what = format!(
        "{:?} {} causal {} window {:?} chunks {:?}",
        s.shape, s.dtype, s.causal, s.window, s.chunks
    );
    assert_ran(&ran, &expected_fwd(s), s.dtype, &what);
}

#[test]
fn single_token() {
    assert_all_variants(&setup(1, 1, 64));
}

#[test]
fn sequence_not_a_multiple_of_any_chunk() {
    let mut s = setup(77, 77, 64);
    for chunks in [
        None,
        Some((16, 24)),
        Some((7, 5)),
        Some((1, 1)),
        Some((100, 100)),
    ] {
        s.chunks = chunks;
        assert_all_variants(&s);
        s.causal = true;
        assert_all_variants(&s);
        s.causal = false;
    }
}

#[test]
fn head_dims() {
    for d in [1, 3, 64, 80, 128] {
        let mut s = setup(33, 45, d);
        s.chunks = Some((8, 16));
        assert_all_variants(&s);
    }
}

#[test]
fn grouped_and_multi_query_heads() {
    for (heads, kv_heads) in [(3, 1), (4, 2), (6, 3)] {
        let mut s = setup(29, 41, 16);
        s.shape.heads = heads;
        s.shape.kv_heads = kv_heads;
        s.shape.batch = 2;
        s.chunks = Some((8, 16));
        s.causal = true;
        assert_all_variants(&s);
    }
}

#[test]
fn causal_with_unequal_lengths_is_bottom_right_aligned() {
    for (nq, nkv) in [(5, 17), (17, 5), (1, 40), (40, 1), (64, 64)] {
        let mut s = setup(nq, nkv, 8);
        s.causal = true;
        s.chunks = Some((4, 8));
        assert_all_variants(&s);
    }
}

#[test]
fn every_dtype_on_every_thread_count() {
    for dtype in DType::ALL {
        for threads in [1, 2, 3] {
            let mut s = setup(50, 70, 24);
            s.dtype = dtype;
            s.threads = threads;
            s.chunks = Some((16, 32));
            s.causal = threads == 2;
            assert_all_variants(&s);
        }
    }
}

/// bf16 with a head dim of whole vectors takes the pair path for PV too (P rounded to bf16)
/// in `naive`, `rabe-staats` and `flash` on AVX512_BF16: odd key counts (a zero-padded last
/// pair), causal masks that cut the panels, ragged chunks, one and two threads.
#[test]
fn bf16_pair_products_on_ragged_shapes() {
    for (nq, nkv, d) in [(37, 53, 16), (50, 65, 64), (1, 9, 32)] {
        for (causal, threads) in [(false, 1), (true, 2)] {
            let mut s = setup(nq, nkv, d);
            s.dtype = DType::Bf16;
            s.threads = threads;
            s.causal = causal;
            for chunks in [None, Some((16, 23))] {
                s.chunks = chunks;
                assert_all_variants(&s);
            }
        }
    }
}

#[test]
fn large_logits_stay_finite_in_safe_variants_and_overflow_in_naive_unsafe() {
    // q, k ~ N(0, 12^2): scores q.k/sqrt(d) have standard deviation 144, far above 89.
    let mut s = setup(40, 40, 16);
    s.scale = 12.0;
    s.chunks = Some((8, 16));
    let mut ran = BTreeSet::new();
    for isa in paths() {
        for v in fwd_variants(&s) {
            ran.insert((v, s.dtype, isa));
            let e = error_of(v, &s, isa);
            if v.info().numerically_safe {
                assert_eq!(
                    e.non_finite,
                    0,
                    "{} [{isa}] produced non-finite values",
                    v.name()
                );
                // Near one-hot softmax: rounding of scores ~1e2 in f32 moves weights by ~1e-5.
                assert!(
                    e.max_abs <= 1e-3,
                    "{} [{isa}]: max_abs_err {:e}",
                    v.name(),
                    e.max_abs
                );
            } else {
                assert!(
                    e.non_finite > 0,
                    "{} [{isa}] did not overflow on scores >= 89",
                    v.name()
                );
            }
        }
    }
    assert_ran(&ran, &expected_fwd(&s), s.dtype, "large logits");
}

/// Gradient error relative to the largest exact gradient entry, of one variant.
fn grad_error_of(
    v: VariantId,
    s: &Setup,
    d_out_kind: UpstreamGrad,
    isa: Isa,
) -> grad::GradErrorStats {
    let mut c = case(v, s);
    c.mode = Mode::FwdBwd;
    c.d_out = d_out_kind;
    let inputs = Inputs::generate(c.shape, c.dtype, c.input_dist, c.input_scale, c.seed);
    let d_out = c.d_out.make(&c.shape, c.seed);
    let mut out = vec![f32::NAN; c.shape.out_len()];
    let mut g = Grads {
        dq: vec![f32::NAN; c.shape.q_len()],
        dk: vec![f32::NAN; c.shape.kv_len()],
        dv: vec![f32::NAN; c.shape.kv_len()],
    };
    train_step_with(&c, isa, &inputs, &d_out, &mut out, &mut g).expect("training step runs");
    let fwd = crate::reference::check_case(&c, &inputs, &out, &rows_to_check(&c.shape, usize::MAX));
    assert!(
        fwd.max_abs <= s.dtype.tolerance(),
        "{} [{isa}]: forward error {:e}",
        v.name(),
        fwd.max_abs
    );
    grad::check(
        &inputs,
        (c.causal, c.window, c.sinks.unwrap_or(0)),
        &d_out,
        &g,
        usize::MAX,
    )
}

/// The bound: gradients within 1e-4 of the largest gradient entry. Compute is f32
/// whatever the storage dtype, so the bound holds for bf16 and f16 inputs too.
const GRAD_REL_TOL: f64 = 1e-4;

/// The variants with a training step, written out (as `expected_fwd`): each must take
/// every full-attention setup; with a sliding window, those whose backward takes one.
const EXPECTED_FWD_BWD: [VariantId; 3] =
    [VariantId::Naive, VariantId::RabeStaats, VariantId::Flash];
const EXPECTED_FWD_BWD_WINDOWED: [VariantId; 2] = [VariantId::Naive, VariantId::Flash];

fn assert_all_gradients(s: &Setup) {
    let mut ran = BTreeSet::new();
    for v in VariantId::ALL
        .into_iter()
        .filter(|v| v.info().modes.contains(&Mode::FwdBwd))
    {
        let c = Case {
            mode: Mode::FwdBwd,
            ..case(v, s)
        };
        if super::impossible::impossible(&c).is_some() {
            continue; // a combination the variant does not have (sinks)
        }
        if let Some(why) = v.get().unsupported(&c) {
            println!("{} declines {:?}: {why}", v.name(), s.shape);
            continue;
        }
        for (kind, isa) in [UpstreamGrad::Random, UpstreamGrad::Ones]
            .into_iter()
            .flat_map(|k| paths().into_iter().map(move |i| (k, i)))
        {
            ran.insert((v, s.dtype, isa));
            let e = grad_error_of(v, s, kind, isa);
            assert!(
                e.full && e.non_finite == 0 && e.max_rel <= GRAD_REL_TOL,
                "{} [{isa}] {:?} {} causal {} window {:?} chunks {:?} dO {}: grad rel err {:e} (abs {:e})",
                v.name(),
                s.shape,
                s.dtype,
                s.causal,
                s.window,
                s.chunks,
                kind.name(),
                e.max_rel,
                e.max_abs
            );
        }
    }
    let what = format!(
        "gradients {:?} {} causal {} window {:?}",
        s.shape, s.dtype, s.causal, s.window
    );
    let want = match (s.window, s.sinks) {
        (_, Some(_)) => BTreeSet::from([VariantId::Flash]),
        (None, _) => BTreeSet::from(EXPECTED_FWD_BWD),
        (Some(_), _) => BTreeSet::from(EXPECTED_FWD_BWD_WINDOWED),
    };
    assert_ran(&ran, &want, s.dtype, &what);
}

#[test]
fn gradients_on_ragged_shapes() {
    for (nq, nkv, d, chunks) in [
        (1, 1, 64, None),
        (77, 77, 64, Some((16, 24))),
        (77, 77, 3, Some((7, 5))),
        (33, 45, 80, Some((8, 16))),
        (20, 20, 128, None),
        // flash's default key block of 256 (rows of K^T, P and dS skewed to 272 floats),
        // a ragged last one; and a head dim above the tiles' one block (dP apart from P).
        (70, 300, 64, None),
        (20, 37, 264, Some((8, 16))),
        // Query chunks of several 64-row strips (rabe-staats' causal strips see growing key
        // prefixes) and several of naive's 64-row blocks, fewer and more queries than keys.
        (150, 170, 32, Some((130, 100))),
        (170, 150, 16, Some((130, 100))),
        (200, 200, 16, None),
    ] {
        for causal in [false, true] {
            let mut s = setup(nq, nkv, d);
            s.chunks = chunks;
            s.causal = causal;
            assert_all_gradients(&s);
        }
    }
}

/// Runs `call` twice in a warm timing loop on a worker of the `threads` pool (whose thread
/// keeps the freed buffers; the call's own `install` then runs inline, as in the timing
/// loop), every buffer the loop kept poisoned with NaN in between; the second call's result.
fn second_call_on_poisoned_scratch<T: Send>(threads: usize, call: impl Fn() -> T + Sync) -> T {
    use crate::backend::cpu::workspace::{poison_freed, WarmCalls};
    crate::run::pool(threads).unwrap().install(|| {
        let _warm = WarmCalls::start();
        call();
        poison_freed(f32::NAN);
        call()
    })
}

/// In a warm timing loop a training step's scratch is what the previous step left: every
/// training step must write each scratch value it reads. Here a first step fills the loop's
/// buffers, they are poisoned with NaN, and the second step must still be right; causal
/// rows see growing key prefixes, fewer and more queries than keys.
#[test]
fn gradients_from_poisoned_scratch() {
    for (nq, nkv) in [(150, 170), (170, 150), (130, 130)] {
        for causal in [false, true] {
            let mut s = setup(nq, nkv, 16);
            s.causal = causal;
            for v in EXPECTED_FWD_BWD {
                for isa in paths() {
                    let e = second_call_on_poisoned_scratch(s.threads, || {
                        grad_error_of(v, &s, UpstreamGrad::Random, isa)
                    });
                    assert!(
                        e.full && e.non_finite == 0 && e.max_rel <= GRAD_REL_TOL,
                        "{} [{isa}] {nq}x{nkv} causal {causal}: grad rel err {:e}",
                        v.name(),
                        e.max_rel
                    );
                }
            }
        }
    }
}

/// The forwards likewise: a first call fills the warm loop's buffers, they are poisoned
/// with NaN, and the second call must still match the oracle; every dtype.
#[test]
fn forwards_from_poisoned_scratch() {
    for (nq, nkv, causal) in [(150, 170, true), (170, 150, true), (130, 130, false)] {
        for dtype in DType::ALL {
            let mut s = setup(nq, nkv, 16);
            s.causal = causal;
            s.dtype = dtype;
            for v in fwd_variants(&s) {
                for isa in paths() {
                    let e = second_call_on_poisoned_scratch(s.threads, || error_of(v, &s, isa));
                    assert!(
                        e.max_abs <= dtype.tolerance(),
                        "{} [{isa}] {dtype} {nq}x{nkv} causal {causal}: max abs err {:e}",
                        v.name(),
                        e.max_abs
                    );
                }
            }
        }
    }
}

#[test]
fn gradients_with_grouped_heads_causal_and_every_dtype() {
    for (heads, kv_heads) in [(3, 1), (4, 2)] {
        for dtype in DType::ALL {
            for (nq, nkv) in [(29, 41), (41, 29), (5, 17)] {
                let mut s = setup(nq, nkv, 16);
                s.shape.heads = heads;
                s.shape.kv_heads = kv_heads;
                s.shape.batch = 2;
                s.dtype = dtype;
                s.chunks = Some((8, 16));
                s.causal = true;
                s.threads = 3;
                assert_all_gradients(&s);
            }
        }
    }
}

/// Sliding windows in prefill: of one key, small ones that are no multiple of any block or
/// chunk (nor of naive's 64-key panel), one that cuts mid-sequence, and ones at or past
/// the sequence; causal or not, seq_q below, equal to and above seq_kv, every dtype; with
/// several key blocks and chunks so that whole ones are skipped.
#[test]
fn sliding_windows_in_prefill_match_the_oracle() {
    for (nq, nkv, chunks) in [
        (77, 77, Some((16, 24))),
        (150, 150, Some((32, 40))),
        (40, 130, Some((7, 5))),
        (130, 40, None),
        (200, 200, None),
    ] {
        for window in [1, 3, 29, 70, 130, 500] {
            for (causal, dtype) in [
                (true, DType::F32),
                (false, DType::F32),
                (true, DType::Bf16),
                (false, DType::F16),
            ] {
                let mut s = setup(nq, nkv, 32);
                s.window = Some(window);
                s.causal = causal;
                s.dtype = dtype;
                s.chunks = chunks;
                assert_all_variants(&s);
            }
        }
    }
}

/// Gradients of flash and naive with a sliding window against the f64 oracle (rabe-staats
/// declines: its backward has no window), on ragged blocks, GQA and every dtype.
#[test]
fn gradients_with_sliding_windows() {
    for (nq, nkv, chunks) in [
        (77, 77, Some((16, 24))),
        (40, 70, Some((8, 16))),
        (70, 40, None),
    ] {
        for window in [1, 10, 33, 100] {
            for (causal, dtype) in [
                (true, DType::F32),
                (false, DType::F32),
                (true, DType::Bf16),
                (true, DType::F16),
            ] {
                let mut s = setup(nq, nkv, 16);
                s.shape.heads = 4;
                s.shape.kv_heads = 2;
                s.window = Some(window);
                s.causal = causal;
                s.dtype = dtype;
                s.chunks = chunks;
                assert_all_gradients(&s);
            }
        }
    }
}

/// Attention sinks in prefill (flash, the one prefill variant that takes them): sinks of
/// one key, a few, more than the window and the whole context, beside windows of one key,
/// mid-sequence and past it; causal or not, seq_q below, equal to and above seq_kv, several
/// key blocks (so whole blocks are sinks, skipped or masked), every dtype and kernel path.
/// The sinks change the output (a kernel that ignored them would fail against the oracle).
#[test]
fn attention_sinks_in_prefill_match_the_oracle() {
    let mut moved = 0.0f64;
    for (nq, nkv, chunks) in [
        (77, 77, Some((16, 24))),
        (40, 130, Some((7, 5))),
        (130, 40, None),
        (200, 200, Some((32, 16))),
    ] {
        for window in [1, 29, 500] {
            for sinks in [1, 4, 30, nkv] {
                for (causal, dtype) in [
                    (true, DType::F32),
                    (false, DType::F32),
                    (true, DType::Bf16),
                    (false, DType::F16),
                ] {
                    let mut s = setup(nq, nkv, 32);
                    s.window = Some(window);
                    s.sinks = Some(sinks);
                    s.causal = causal;
                    s.dtype = dtype;
                    s.chunks = chunks;
                    assert_all_variants(&s);
                    let with = case(VariantId::Flash, &s);
                    let x = Inputs::for_case(&with);
                    let alone = Case {
                        sinks: None,
                        ..with.clone()
                    };
                    let (a, b) = (output(&with, &x), output(&alone, &x));
                    let (a, b) = (a.expect("flash runs"), b.expect("flash runs"));
                    moved = moved.max(crate::run::max_abs_diff(&a, &b));
                }
            }
        }
    }
    assert!(moved > 0.1, "sinks never changed an output: {moved:e}");
}

/// Gradients of flash with attention sinks against the f64 oracle, on ragged blocks, GQA
/// and every dtype.
#[test]
fn gradients_with_attention_sinks() {
    for (nq, nkv, chunks) in [
        (77, 77, Some((16, 24))),
        (40, 70, Some((8, 16))),
        (70, 40, None),
    ] {
        for (window, sinks) in [(1, 1), (10, 3), (10, 40), (33, 70)] {
            for (causal, dtype) in [(true, DType::F32), (false, DType::F32), (true, DType::Bf16)] {
                let mut s = setup(nq, nkv, 16);
                s.shape.heads = 4;
                s.shape.kv_heads = 2;
                s.window = Some(window);
                s.sinks = Some(sinks.min(nkv));
                s.causal = causal;
                s.dtype = dtype;
                s.chunks = chunks;
                assert_all_gradients(&s);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn random_shapes_match_the_oracle(
        batch in 1usize..3,
        (heads, kv_heads) in prop_oneof![Just((1, 1)), Just((2, 1)), Just((4, 2)), Just((3, 3))],
        seq_q in 1usize..70,
        seq_kv in 1usize..70,
        head_dim in 1usize..20,
        qc in 1usize..32,
        kc in 1usize..32,
        causal in any::<bool>(),
        window in prop_oneof![Just(None), (1usize..80).prop_map(Some)],
        dtype in prop_oneof![Just(DType::F32), Just(DType::Bf16), Just(DType::F16)],
        threads in 1usize..4,
    ) {
        let s = Setup {
            shape: Shape { batch, heads, kv_heads, seq_q, seq_kv, head_dim },
            dtype,
            causal,
            window,
            chunks: Some((qc, kc)),
            threads,
            scale: 1.0,
            sinks: None,
        };
        assert_all_variants(&s);
    }

    #[test]
    fn random_shapes_gradients_match_the_oracle(
        (heads, kv_heads) in prop_oneof![Just((1, 1)), Just((2, 1)), Just((4, 2))],
        seq_q in 1usize..40,
        seq_kv in 1usize..40,
        head_dim in 1usize..12,
        qc in 1usize..20,
        kc in 1usize..20,
        causal in any::<bool>(),
        window in prop_oneof![Just(None), (1usize..50).prop_map(Some)],
        threads in 1usize..4,
    ) {
        let s = Setup {
            shape: Shape { batch: 1, heads, kv_heads, seq_q, seq_kv, head_dim },
            dtype: DType::F32,
            causal,
            window,
            chunks: Some((qc, kc)),
            threads,
            scale: 1.0,
            sinks: None,
        };
        assert_all_gradients(&s);
    }
}

/// A decode case: `seq_q` new tokens against a cache of `seq_kv`.
#[allow(clippy::too_many_arguments)]
fn decode_case(
    v: VariantId,
    shape: Shape,
    dtype: DType,
    causal: bool,
    window: Option<usize>,
    devices: usize,
    splits: usize,
    kv_chunk: usize,
) -> Case {
    let info = v.info();
    Case {
        variant: v,
        mode: Mode::Decode,
        device: Device::Cpu,
        dtype,
        shape,
        q_chunk: None,
        kv_chunk: info.default_kv_chunk.map(|_| kv_chunk.min(shape.seq_kv)),
        causal,
        window,
        devices,
        splits: v.get().default_splits(&shape, 2).map(|_| splits),
        allreduce: v.get().default_allreduce(),
        threads: 2,
        input_dist: InputDist::Normal,
        input_scale: 1.0,
        seed: 5,
        d_out: UpstreamGrad::Random,
        external: None,
        // paged-decode: pages of 16 tokens, or one page where the cache is shorter.
        paging: v.get().default_paging().map(|p| Paging {
            page_size: p.page_size.min(shape.seq_kv),
            ..p
        }),
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

/// The in-process ones: the MPI variants run under mpirun (tests/mpi.rs). Not the
/// variants of an MLA cache, which read no Q, K, V (`mla_decode_matches_the_unabsorbed_oracle`).
fn decode_variants() -> Vec<VariantId> {
    VariantId::in_process()
        .filter(|v| v.info().modes.contains(&Mode::Decode))
        .filter(|v| !v.get().reads_mla())
        .collect()
}

/// The variants of an MLA cache, written out (no silent drop: a new one must be added
/// here and to the MLA test's expectations).
fn mla_variants() -> Vec<VariantId> {
    let readers: Vec<VariantId> = VariantId::ALL
        .into_iter()
        .filter(|v| v.get().reads_mla())
        .collect();
    assert_eq!(
        readers,
        [VariantId::MlaDecode],
        "the variants of an MLA cache"
    );
    readers
}

/// An MLA decode case: `seq_q` new tokens against a latent cache of `seq_kv`.
#[allow(clippy::too_many_arguments)]
fn mla_case(
    v: VariantId,
    shape: Shape,
    mla: crate::problem::Mla,
    dtype: DType,
    causal: bool,
    splits: usize,
    kv_chunk: usize,
    scale: f64,
) -> Case {
    Case {
        mla: Some(mla),
        input_scale: scale,
        ..decode_case(v, shape, dtype, causal, None, 1, splits, kv_chunk)
    }
}

/// mla-decode (absorbed: W_UK into the query, W_UV into the output, the latent cache read
/// once for all heads) against the f64 oracle of the UNABSORBED form from the same weights:
/// caches not a multiple of the key block or the split count, one to five heads, several
/// new tokens causal (bottom-right) and not, latent and RoPE dimensions off every SIMD
/// width, every dtype and kernel path, within the dtype's tolerance; and exactly the
/// expected (variant, dtype, path) combinations ran.
#[test]
fn mla_decode_matches_the_unabsorbed_oracle_on_ragged_shapes() {
    use crate::problem::Mla;
    for dtype in DType::ALL {
        let mut ran = BTreeSet::new();
        for isa in paths() {
            for (heads, seq_q, causal) in [(1, 1, false), (3, 4, true), (5, 2, false)] {
                for seq_kv in [1, 37, 301] {
                    // (64, 32): whole 32s, so bf16 on amx-bf16 runs on the tiles.
                    for (latent_dim, rope_dim, head_dim) in [(24, 8, 16), (37, 3, 5), (64, 32, 16)]
                    {
                        for (splits, kv_chunk) in [(1, 256), (3, 5), (64, 16)] {
                            let shape = Shape {
                                batch: 2,
                                heads,
                                kv_heads: heads,
                                seq_q,
                                seq_kv,
                                head_dim,
                            };
                            let mla = Mla {
                                latent_dim,
                                rope_dim,
                            };
                            for v in mla_variants() {
                                let c =
                                    mla_case(v, shape, mla, dtype, causal, splits, kv_chunk, 1.0);
                                assert_eq!(v.get().unsupported(&c), None);
                                let inputs = Inputs::for_case(&c);
                                assert!(inputs.k.is_empty(), "an MLA case draws no K");
                                let out = output_with(&c, isa, &inputs).expect("mla-decode runs");
                                let rows = crate::reference::rows_to_check_case(&c, usize::MAX);
                                assert_eq!(rows.len(), 2 * heads * seq_q);
                                let e = crate::reference::check_case(&c, &inputs, &out, &rows);
                                assert!(
                                    e.non_finite == 0 && e.max_abs <= dtype.tolerance(),
                                    "{} {shape:?} {mla:?} {dtype} {isa:?} c{causal} sp{splits} kc{kv_chunk}: {:e}",
                                    v.name(),
                                    e.max_abs
                                );
                                ran.insert((v, dtype, isa));
                            }
                        }
                    }
                }
            }
        }
        let want: BTreeSet<VariantId> = mla_variants().into_iter().collect();
        assert_ran(&ran, &want, dtype, "mla-decode");
    }
}

/// Large logits (queries x 16, scores x 16): the online softmax over the latent cache stays
/// finite and within the large-logit bound of the other decode variants.
#[test]
fn mla_decode_on_large_logits_stays_finite() {
    use crate::problem::Mla;
    let shape = Shape {
        batch: 1,
        heads: 2,
        kv_heads: 2,
        seq_q: 1,
        seq_kv: 200,
        head_dim: 16,
    };
    let mla = Mla {
        latent_dim: 32,
        rope_dim: 8,
    };
    for v in mla_variants() {
        let c = mla_case(v, shape, mla, DType::F32, false, 4, 32, 4.0);
        let inputs = Inputs::for_case(&c);
        let out = output(&c, &inputs).expect("mla-decode runs");
        let rows = crate::reference::rows_to_check_case(&c, usize::MAX);
        let e = crate::reference::check_case(&c, &inputs, &out, &rows);
        assert!(
            e.non_finite == 0 && e.max_abs <= 1e-3,
            "{}: {:e}",
            v.name(),
            e.max_abs
        );
    }
}

/// The cache bytes mla-decode counts: b n (d_c + d_r) x dtype bytes, exactly, whatever the
/// heads, new tokens, mask or split; and skipped rows, never a panic, where the case and
/// the variant disagree about the MLA cache.
#[test]
fn mla_decode_reads_the_latent_cache_once_and_refuses_mismatched_cases() {
    use crate::problem::Mla;
    let mla = Mla {
        latent_dim: 512,
        rope_dim: 64,
    };
    for (dtype, heads, seq_q, causal, splits) in [
        (DType::Bf16, 32, 1, false, 1),
        (DType::F32, 128, 4, true, 7),
        (DType::F16, 3, 2, true, 2),
    ] {
        let shape = Shape {
            batch: 3,
            heads,
            kv_heads: heads,
            seq_q,
            seq_kv: 1000,
            head_dim: 128,
        };
        let c = mla_case(
            VariantId::MlaDecode,
            shape,
            mla,
            dtype,
            causal,
            splits,
            256,
            1.0,
        );
        let want = 3 * 1000 * (512 + 64) * dtype.size_bytes() as u64;
        assert_eq!(VariantId::MlaDecode.get().kv_read_bytes(&c), Some(want));
        // Inputs: the cache, both queries and both up-projections, and the f32 output.
        let io = (3 * 1000 * 576 + 3 * heads * seq_q * (128 + 64) + 2 * heads * 512 * 128)
            * dtype.size_bytes()
            + 4 * 3 * heads * seq_q * 128;
        assert_eq!(c.io_bytes(), io as u64);
    }
    let shape = Shape {
        batch: 1,
        heads: 2,
        kv_heads: 2,
        seq_q: 1,
        seq_kv: 8,
        head_dim: 4,
    };
    let mla_case = mla_case(
        VariantId::MlaDecode,
        shape,
        mla,
        DType::F32,
        false,
        1,
        8,
        1.0,
    );
    let without = Case {
        mla: None,
        ..mla_case.clone()
    };
    let why = crate::run::skip_reason(&without).expect("mla-decode without its dimensions");
    assert!(why.contains("latent_dim and rope_dim"), "{why}");
    let on_flash = Case {
        mla: Some(mla),
        ..decode_case(
            VariantId::FlashDecoding,
            shape,
            DType::F32,
            false,
            None,
            1,
            1,
            8,
        )
    };
    let why = crate::run::skip_reason(&on_flash).expect("flash-decoding with MLA dimensions");
    assert!(why.contains("mla-decode only"), "{why}");
    for (latent_dim, rope_dim, key) in [(0, 64, "latent_dim"), (512, 0, "rope_dim")] {
        let zero = Case {
            mla: Some(Mla {
                latent_dim,
                rope_dim,
            }),
            ..mla_case.clone()
        };
        let why = crate::run::skip_reason(&zero).expect("a zero MLA dimension");
        assert!(why.contains(key), "{why}");
    }
}

/// Every decode variant (and the multi-device ones on 1 and 3 devices) against the oracle:
/// caches not a multiple of the split size or key block, kv_heads 1 and 2, windows
/// shorter and longer than the cache, several new tokens with a causal mask, bf16.
#[test]
fn decode_variants_match_the_oracle_on_ragged_shapes() {
    for (heads, kv_heads) in [(4, 1), (4, 2)] {
        for (seq_q, causal) in [(1, false), (4, true)] {
            for seq_kv in [1, 37, 301] {
                for window in [None, Some(1), Some(10), Some(5000)] {
                    for (splits, kv_chunk) in [(1, 256), (3, 5), (64, 16)] {
                        for dtype in [DType::F32, DType::Bf16] {
                            let shape = Shape {
                                batch: 2,
                                heads,
                                kv_heads,
                                seq_q,
                                seq_kv,
                                head_dim: 24,
                            };
                            for v in decode_variants() {
                                let many = v.get().unsupported(&decode_case(
                                    v, shape, dtype, causal, window, 3, splits, kv_chunk,
                                ));
                                for devices in [1, 3] {
                                    if devices == 3 && many.is_some() {
                                        continue;
                                    }
                                    let c = decode_case(
                                        v, shape, dtype, causal, window, devices, splits, kv_chunk,
                                    );
                                    let inputs = Inputs::for_case(&c);
                                    let out = output(&c, &inputs).expect("decode runs");
                                    let e = crate::reference::check_masked(
                                        &inputs,
                                        causal,
                                        window,
                                        &out,
                                        &rows_to_check(&c.shape, usize::MAX),
                                    );
                                    assert!(
                                        e.non_finite == 0 && e.max_abs <= dtype.tolerance(),
                                        "{} {shape:?} {dtype} c{causal} w{window:?} p{devices} sp{splits} kc{kv_chunk}: {:e}",
                                        v.name(),
                                        e.max_abs
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Attention sinks in decode: decode-online and flash-decoding (the decode variants that
/// take them: written out, and every other variant leaves such cases out) against the
/// oracle with sinks of one key, a few, past the window and the whole cache, windows of
/// one key, short and past the cache, one and several causal new tokens, split sizes that
/// put the sinks in the first part or leave it without them, a ragged batch, every dtype
/// and kernel path; kv_read_bytes counts each attended key once. No silent drop.
#[test]
fn attention_sinks_in_decode_match_the_oracle() {
    use VariantId::*;
    let takes: BTreeSet<_> = VariantId::ALL
        .into_iter()
        .filter(|v| v.get().sinks())
        .collect();
    assert_eq!(takes, BTreeSet::from([Flash, DecodeOnline, FlashDecoding]));
    let mut ran = BTreeSet::new();
    let spec: crate::problem::BatchSpec = "q1kv300+2xq1kv9+q3kv40".parse().unwrap();
    for (heads, kv_heads) in [(4, 1), (4, 2)] {
        for (seq_q, causal) in [(1, false), (4, true)] {
            for seq_kv in [37, 301] {
                for window in [1, 10, 5000] {
                    for sinks in [1, 5, 20, seq_kv] {
                        for (splits, kv_chunk) in [(1, 256), (3, 5), (64, 16)] {
                            for dtype in DType::ALL {
                                let shape = Shape {
                                    batch: 2,
                                    heads,
                                    kv_heads,
                                    seq_q,
                                    seq_kv,
                                    head_dim: 24,
                                };
                                for v in [DecodeOnline, FlashDecoding] {
                                    let dense = decode_case(
                                        v,
                                        shape,
                                        dtype,
                                        causal,
                                        Some(window),
                                        1,
                                        splits,
                                        kv_chunk,
                                    );
                                    let ragged = Case {
                                        shape: spec.packed(&Shape { batch: 1, ..shape }),
                                        batch_spec: Some(spec.clone()),
                                        ..dense.clone()
                                    };
                                    let mut cases = vec![dense];
                                    if v == FlashDecoding && seq_q == 1 {
                                        cases.push(ragged);
                                    }
                                    for c in cases {
                                        let c = Case {
                                            sinks: Some(sinks),
                                            ..c
                                        };
                                        assert_eq!(v.get().unsupported(&c), None);
                                        assert_eq!(super::impossible::impossible(&c), None);
                                        let x = Inputs::for_case(&c);
                                        let rows = rows_to_check(&c.shape, usize::MAX);
                                        for isa in paths() {
                                            let out = output_with(&c, isa, &x).expect("runs");
                                            let e =
                                                crate::reference::check_case(&c, &x, &out, &rows);
                                            assert!(
                                                e.non_finite == 0 && e.max_abs <= dtype.tolerance(),
                                                "{} {:?} {dtype} {isa} c{causal} w{window} \
                                                 sk{sinks} sp{splits} kc{kv_chunk}: {:e}",
                                                v.name(),
                                                c.shape,
                                                e.max_abs
                                            );
                                            ran.insert((v, dtype, isa));
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    let want: BTreeSet<_> = [DecodeOnline, FlashDecoding]
        .into_iter()
        .flat_map(|v| {
            DType::ALL
                .into_iter()
                .flat_map(move |d| paths().into_iter().map(move |i| (v, d, i)))
        })
        .collect();
    assert_eq!(ran, want);
    // One new token over 100 keys, window 10, 4 sinks: 14 keys of K and V per KV head.
    let shape = Shape {
        batch: 1,
        heads: 2,
        kv_heads: 1,
        seq_q: 1,
        seq_kv: 100,
        head_dim: 8,
    };
    let c = Case {
        sinks: Some(4),
        ..decode_case(FlashDecoding, shape, DType::F32, true, Some(10), 1, 2, 16)
    };
    assert_eq!(super::decode::kv_read_bytes(&c), 2 * 14 * 8 * 4);
    // Four new tokens: windows start at 87..=90, sinks 0..4: 4 + 13 keys.
    let c = Case {
        shape: Shape { seq_q: 4, ..shape },
        ..c
    };
    assert_eq!(super::decode::kv_read_bytes(&c), 2 * 17 * 8 * 4);
    // No CUDA kernel keeps sinks: a skipped row naming the variant, for every variant.
    for v in [Flash, FlashDecoding] {
        let gpu = Case {
            variant: v,
            device: Device::Cuda,
            ..c.clone()
        };
        let why = gpu.sinks_problem().expect("sinks on the GPU");
        assert!(
            why.contains(&format!(
                "variant {} has no CUDA kernel for attention sinks",
                v.name()
            )),
            "{why}"
        );
    }
}

/// cascade-decode against the oracle on batches sharing a prefix of 0, 1, about half,
/// seq_kv - 1 and seq_kv cached tokens (and none): odd cache lengths, MQA and GQA groups,
/// one and several new tokens under a causal mask, a sliding window, key blocks longer and
/// shorter than the parts, every dtype on every kernel path (phase 1's rows on both sides
/// of the SGEMM crossover: 2 to 48 rows per KV head; on AMX tiles at d 32). Each output also equals
/// flash-decoding's on the same caches within the dtype's tolerance, and the inputs share
/// the prefix (request 2's first keys are request 0's) while the rest differs. No silent
/// drop: every (dtype, path) expected ran.
#[test]
fn cascade_decode_matches_the_oracle_with_shared_prefixes() {
    let cd = VariantId::CascadeDecode;
    let mut ran = BTreeSet::new();
    for (batch, heads, kv_heads) in [(2, 4, 4), (3, 4, 1), (4, 6, 2)] {
        for (seq_q, causal, window) in [(1, false, None), (4, true, None), (3, true, Some(9))] {
            for seq_kv in [1, 37, 301] {
                let mut prefixes = vec![None, Some(0), Some(1), Some(seq_kv / 2)];
                prefixes.extend([Some(seq_kv - 1), Some(seq_kv)]);
                for prefix_len in prefixes {
                    for kv_chunk in [256, 16] {
                        // d 32: bf16 phase 1 on AMX tiles on amx-bf16.
                        for (dtype, head_dim) in
                            DType::ALL.into_iter().flat_map(|t| [(t, 24), (t, 32)])
                        {
                            let shape = Shape {
                                batch,
                                heads,
                                kv_heads,
                                seq_q,
                                seq_kv,
                                head_dim,
                            };
                            let c = Case {
                                prefix_len,
                                ..decode_case(cd, shape, dtype, causal, window, 1, 1, kv_chunk)
                            };
                            assert_eq!(cd.get().unsupported(&c), None);
                            let inputs = Inputs::for_case(&c);
                            if let (Some(p), Tensor::F32(k)) = (prefix_len, &inputs.k) {
                                let (row, n) = (seq_kv * head_dim, p * head_dim);
                                let last = (batch - 1) * kv_heads * row;
                                assert_eq!(k[..n], k[last..last + n]);
                                assert!(p == seq_kv || k[n..row] != k[last + n..last + row]);
                            }
                            let fd = Case {
                                prefix_len,
                                ..decode_case(
                                    VariantId::FlashDecoding,
                                    shape,
                                    dtype,
                                    causal,
                                    window,
                                    1,
                                    3,
                                    kv_chunk,
                                )
                            };
                            let want = output(&fd, &inputs).expect("flash-decoding runs");
                            for isa in paths() {
                                let out = output_with(&c, isa, &inputs).expect("cascade runs");
                                let e = crate::reference::check_masked(
                                    &inputs,
                                    causal,
                                    window,
                                    &out,
                                    &rows_to_check(&c.shape, usize::MAX),
                                );
                                let diff = crate::run::max_abs_diff(&out, &want);
                                assert!(
                                    e.non_finite == 0
                                        && e.max_abs <= dtype.tolerance()
                                        && diff <= dtype.tolerance(),
                                    "{shape:?} {dtype} {isa} px{prefix_len:?} c{causal} \
                                     w{window:?} kc{kv_chunk}: oracle {:e}, flash-decoding {diff:e}",
                                    e.max_abs
                                );
                                ran.insert((cd, dtype, isa));
                            }
                        }
                    }
                }
            }
        }
    }
    for dtype in DType::ALL {
        let of_dtype = ran.iter().copied().filter(|r| r.1 == dtype).collect();
        assert_ran(&of_dtype, &BTreeSet::from([cd]), dtype, "cascade-decode");
    }
}

/// The variants that read an FP8 cache, written out rather than asked of
/// `Variant::fp8_kv`, so a variant that stops reading one fails here instead of dropping out.
const FP8_READERS: [VariantId; 3] = [
    VariantId::DecodeNaive,
    VariantId::DecodeOnline,
    VariantId::FlashDecoding,
];

/// Every FP8 format under every Q dtype, on caches not a multiple of the key block or the
/// split, GQA, several new tokens with a causal mask: each reader's output against the f64
/// oracle on the cache as stored (codes times scales) within f32's tolerance, the kernels
/// computing in f32 on the widened values; and at least 100 times closer to it than to the
/// oracle on the unquantized K and V, so the FP8 codes are what was read.
#[test]
fn fp8_caches_are_read_as_stored() {
    use crate::problem::Fp8Format;
    let mut ran = BTreeSet::new();
    for format in Fp8Format::ALL {
        for dtype in DType::ALL {
            for (seq_q, causal, seq_kv) in [(1, false, 1), (1, false, 37), (4, true, 301)] {
                for (splits, kv_chunk) in [(1, 256), (3, 5)] {
                    let shape = Shape {
                        batch: 2,
                        heads: 4,
                        kv_heads: 2,
                        seq_q,
                        seq_kv,
                        head_dim: 24,
                    };
                    for v in decode_variants() {
                        let c = Case {
                            kv_dtype: Some(format),
                            ..decode_case(v, shape, dtype, causal, None, 1, splits, kv_chunk)
                        };
                        if !FP8_READERS.contains(&v) {
                            assert!(
                                super::impossible::impossible(&c).is_some(),
                                "{} takes an FP8 cache",
                                v.name()
                            );
                            continue;
                        }
                        ran.insert(v);
                        let inputs = Inputs::for_case(&c);
                        let out = output(&c, &inputs).expect("decode runs");
                        let rows = rows_to_check(&c.shape, usize::MAX);
                        let stored = inputs.try_dequantized(format).expect("fits");
                        let e = crate::reference::check_case(&c, &stored, &out, &rows);
                        let raw = crate::reference::check_case(&c, &inputs, &out, &rows);
                        let what = format!(
                            "{} {format} {dtype} {shape:?} sp{splits} kc{kv_chunk}",
                            v.name()
                        );
                        assert!(
                            e.non_finite == 0 && e.max_abs <= DType::F32.tolerance(),
                            "{what}: {:e} against the stored cache",
                            e.max_abs
                        );
                        assert!(
                            100.0 * e.max_abs < raw.max_abs,
                            "{what}: {:e} against the stored cache, {:e} against the unquantized",
                            e.max_abs,
                            raw.max_abs
                        );
                    }
                }
            }
        }
    }
    assert_eq!(ran, FP8_READERS.into_iter().collect());
}

#[test]
fn decode_on_large_logits_stays_finite() {
    let shape = Shape {
        batch: 1,
        heads: 2,
        kv_heads: 1,
        seq_q: 1,
        seq_kv: 200,
        head_dim: 16,
    };
    for v in decode_variants() {
        let mut c = decode_case(v, shape, DType::F32, false, None, 1, 4, 32);
        c.input_scale = 12.0;
        let inputs = Inputs::for_case(&c);
        let out = output(&c, &inputs).expect("decode runs");
        let e = check(&inputs, false, &out, &rows_to_check(&c.shape, usize::MAX));
        assert!(
            e.non_finite == 0 && e.max_abs <= 1e-3,
            "{}: {:e}",
            v.name(),
            e.max_abs
        );
    }
}

/// paged-decode reads the same logical cache through any page size and page order: its
/// output is flash-decoding's up to the summation order of the value rows (pages cut the
/// key chunks), and identical between the shuffled and the contiguous pool (the same
/// arithmetic at other addresses). The pool's unfilled slots are NaN, so a read past a
/// sequence's end would show.
#[test]
fn paged_decode_reads_the_logical_cache_through_every_page_size_and_order() {
    let fd = VariantId::FlashDecoding;
    let pd = VariantId::PagedDecode;
    for (heads, kv_heads, seq_q, causal) in [(4, 1, 1, false), (6, 2, 3, true), (2, 2, 18, true)] {
        for seq_kv in [37, 300] {
            for dtype in [DType::F32, DType::Bf16] {
                let shape = Shape {
                    batch: 3,
                    heads,
                    kv_heads,
                    seq_q,
                    seq_kv,
                    head_dim: 20,
                };
                for (splits, kv_chunk, window) in [(1, 1024, None), (3, 24, Some(50))] {
                    let base = decode_case(fd, shape, dtype, causal, window, 1, splits, kv_chunk);
                    let inputs = Inputs::for_case(&base);
                    let want = output(&base, &inputs).expect("flash-decoding runs");
                    for page_size in [1, 5, 16, 37] {
                        let mut outs = Vec::new();
                        for order in PageOrder::ALL {
                            let c = Case {
                                paging: Some(Paging { page_size, order }),
                                ..decode_case(pd, shape, dtype, causal, window, 1, splits, kv_chunk)
                            };
                            let x = inputs.clone().paged_for(&c);
                            let out = output(&c, &x).expect("paged-decode runs");
                            let diff = crate::run::max_abs_diff(&out, &want);
                            assert!(
                                diff <= 1e-6,
                                "{shape:?} {dtype} page {page_size} {order} sp{splits}: {diff:e}"
                            );
                            outs.push(out);
                        }
                        assert_eq!(outs[0], outs[1], "{shape:?} {dtype} page {page_size}");
                    }
                }
            }
        }
    }
}

/// chunked-prefill computes every row as one causal flash call does (each step's rows see
/// the cache up to themselves): with chunks that are whole query blocks of flash's, the
/// same arithmetic bit for bit; with other chunks (smaller blocks) within rounding. Each
/// step's time is written, and non-causal or oversized chunks are declined by name.
#[test]
fn chunked_prefill_is_causal_flash_in_steps() {
    let shape = Shape {
        batch: 2,
        heads: 4,
        kv_heads: 2,
        seq_q: 300,
        seq_kv: 300,
        head_dim: 32,
    };
    for dtype in [DType::F32, DType::Bf16] {
        let flash = Case {
            causal: true,
            ..Case::cpu_fwd(VariantId::Flash, shape, dtype, 2)
        };
        let inputs = Inputs::for_case(&flash);
        let want = output(&flash, &inputs).expect("flash runs");
        for (chunk, exact) in [
            (64, true),
            (128, true),
            (300, true),
            (48, false),
            (7, false),
        ] {
            let c = Case {
                prefill_chunk: Some(chunk),
                ..Case {
                    variant: VariantId::ChunkedPrefill,
                    ..flash.clone()
                }
            };
            assert_eq!(c.variant.get().unsupported(&c), None);
            let steps = c.variant.get().steps(&c);
            assert_eq!(steps, 300usize.div_ceil(chunk));
            let mut step_s = vec![-1.0; steps];
            let mut out = vec![f32::NAN; shape.out_len()];
            crate::run::cpu::forward_steps(&c, &inputs, &mut out, &mut step_s).unwrap();
            assert!(step_s.iter().all(|&t| t >= 0.0), "{step_s:?}");
            let diff = crate::run::max_abs_diff(&out, &want);
            if exact {
                assert_eq!(diff, 0.0, "{dtype} chunk {chunk}");
            } else {
                assert!(diff <= 1e-6, "{dtype} chunk {chunk}: {diff:e}");
            }
        }
        let base = Case {
            variant: VariantId::ChunkedPrefill,
            prefill_chunk: Some(64),
            ..flash.clone()
        };
        let why = |c: &Case| c.variant.get().unsupported(c).unwrap_or_default();
        assert!(why(&Case {
            causal: false,
            ..base.clone()
        })
        .contains("causal"));
        let long = Case {
            prefill_chunk: Some(301),
            ..base.clone()
        };
        assert!(why(&long).contains("prefill_chunk 301"), "{}", why(&long));
        let cross = Case {
            shape: Shape {
                seq_kv: 400,
                ..shape
            },
            ..base.clone()
        };
        assert!(why(&cross).contains("seq_kv"), "{}", why(&cross));
    }
}

/// One sequence of a packed ragged batch as dense inputs of its own (`[1, heads, len, d]`).
fn sequence_inputs(x: &Inputs, spec: &crate::problem::BatchSpec, i: usize) -> Inputs {
    let s = x.shape;
    let (cu_q, cu_kv) = (spec.offsets(false), spec.offsets(true));
    let (q, kv) = (cu_q[i + 1] - cu_q[i], cu_kv[i + 1] - cu_kv[i]);
    let take = |t: &crate::problem::Tensor, heads: usize, total: usize, cu: &[usize], n: usize| {
        let values = (0..heads).flat_map(|h| {
            let at = (h * total + cu[i]) * s.head_dim;
            (at..at + n * s.head_dim).map(move |e| t.get_f64(e) as f32)
        });
        crate::problem::Tensor::from_f32(values.collect(), t.dtype())
    };
    Inputs {
        shape: Shape {
            batch: 1,
            seq_q: q,
            seq_kv: kv,
            ..s
        },
        q: take(&x.q, s.heads, s.seq_q, &cu_q, q),
        k: take(&x.k, s.kv_heads, s.seq_kv, &cu_kv, kv),
        v: take(&x.v, s.kv_heads, s.seq_kv, &cu_kv, kv),
        paged: Vec::new(),
        fp8: Vec::new(),
        mla: None,
    }
}

/// How far apart two kernels that cut the same problem into blocks differently may be.
/// Where the path rounds P to bf16 for PV (bf16 pairs, `ReadPath::Bf16Dot`, or AMX tiles),
/// each output row is the average of V under weights rounded to bf16 (relative step 2^-8)
/// and divided by the sum of the unrounded ones: within 2^-8 max|V| of the f32 result, so
/// two kernels, each rounding its own block's P, lie within 2^-7 max|V| of each other
/// (plus `f32_tol` for the exp polynomial and the summation order). Elsewhere both compute
/// in f32 and agree to `f32_tol`.
fn blocking_tolerance(dtype: DType, head_dim: usize, v: &Tensor, f32_tol: f64) -> f64 {
    if rounds_p(VariantId::Flash, dtype, Isa::detect(), head_dim, false) {
        let mut max_v = 0.0f64;
        v.for_each_f32(|x| max_v = max_v.max(f64::from(x.abs())));
        2f64.powi(-7) * max_v + f32_tol
    } else {
        f32_tol
    }
}

/// Whether variant `v` may round P to bf16 for PV on `isa` (the bound's 2^-8 A term):
/// flash's forwards (flash, flash-varlen, chunked-prefill) by `flash::path`, which puts
/// bf16 on AMX tiles on amx-bf16; the others where their tiles multiply bf16 pairs
/// (naive and rabe-staats only where V's rows are whole vectors, `ReadPath::bf16_pv`; the
/// bound allows the rounding wherever the path may do it). With `highest`, none may.
fn rounds_p(v: VariantId, dtype: DType, isa: Isa, d: usize, highest: bool) -> bool {
    match v {
        VariantId::Flash | VariantId::FlashVarlen | VariantId::ChunkedPrefill => {
            crate::backend::cpu::flash::path(dtype, isa, d, highest).rounds_p()
        }
        _ => !highest && ReadPath::of(dtype, isa, d) == ReadPath::Bf16Dot,
    }
}

/// flash-varlen computes each sequence of a ragged batch as flash computes that sequence
/// alone (the same query blocks from its first row; to rounding, 1e-6, or where P is
/// rounded to bf16, `blocking_tolerance`), and the ragged oracle agrees; prefills, decodes
/// over long caches and a short odd sequence in one batch.
#[test]
fn flash_varlen_is_flash_on_each_sequence_alone() {
    let spec: crate::problem::BatchSpec = "2xq70+3xq1kv130+q5kv9+q200kv260".parse().unwrap();
    for (heads, kv_heads) in [(4, 4), (6, 2)] {
        for dtype in [DType::F32, DType::Bf16] {
            for causal in [false, true] {
                let dense = Shape {
                    batch: 1,
                    heads,
                    kv_heads,
                    seq_q: 1,
                    seq_kv: 1,
                    head_dim: 32,
                };
                let c = Case {
                    causal,
                    batch_spec: Some(spec.clone()),
                    shape: spec.packed(&dense),
                    ..Case::cpu_fwd(VariantId::FlashVarlen, dense, dtype, 2)
                };
                let x = Inputs::for_case(&c);
                let out = output(&c, &x).expect("flash-varlen runs");
                let e = crate::reference::check_ragged(
                    &x,
                    &spec,
                    causal,
                    (None, 0),
                    &out,
                    &rows_to_check(&c.shape, usize::MAX),
                );
                assert!(e.non_finite == 0 && e.max_abs <= dtype.tolerance(), "{e:?}");
                let cu = spec.offsets(false);
                let mut worst = 0.0f64;
                for i in 0..spec.len() {
                    let xi = sequence_inputs(&x, &spec, i);
                    let flash = Case {
                        causal,
                        ..Case::cpu_fwd(VariantId::Flash, xi.shape, dtype, 2)
                    };
                    let want = output(&flash, &xi).expect("flash runs");
                    let d = dense.head_dim;
                    let tol = blocking_tolerance(dtype, d, &xi.v, 1e-6);
                    for h in 0..heads {
                        let got = &out
                            [(h * c.shape.seq_q + cu[i]) * d..(h * c.shape.seq_q + cu[i + 1]) * d];
                        let n = xi.shape.seq_q * d;
                        let diff = crate::run::max_abs_diff(got, &want[h * n..(h + 1) * n]);
                        worst = worst.max(diff);
                        assert!(
                            diff <= tol,
                            "{dtype} c{causal} seq {i} head {h}: {diff:e} > {tol:e}"
                        );
                    }
                }
                println!(
                    "{heads}/{kv_heads} {dtype} causal {causal}: max |varlen - flash| {worst:e}"
                );
            }
        }
    }
}

/// flash-decoding and paged-decode run a ragged batch of decodes over caches of their own
/// lengths mixed with prefill chunks (a continuous-batching step): each row within the
/// dtype's tolerance of the ragged oracle, each sequence as flash-decoding computes it alone
/// (to the rounding of other split points), paged-decode as flash-decoding on the same
/// batch through any page size, and flash-varlen's prefill order on the same batch agrees.
#[test]
fn split_kv_variants_run_ragged_and_mixed_batches() {
    let spec: crate::problem::BatchSpec = "q1kv700+3xq1kv40+q50kv100+q3kv9+q1".parse().unwrap();
    let (fd, pd) = (VariantId::FlashDecoding, VariantId::PagedDecode);
    for (heads, kv_heads) in [(4, 4), (6, 2)] {
        let dense = Shape {
            batch: 1,
            heads,
            kv_heads,
            seq_q: 1,
            seq_kv: 1,
            head_dim: 24,
        };
        let shape = spec.packed(&dense);
        for dtype in [DType::F32, DType::Bf16] {
            for (causal, window) in [(false, None), (true, None), (true, Some(30))] {
                for splits in [1, 5] {
                    let ragged = |v| Case {
                        batch_spec: Some(spec.clone()),
                        ..decode_case(v, shape, dtype, causal, window, 1, splits, 64)
                    };
                    let base = ragged(fd);
                    let x = Inputs::for_case(&base);
                    let want = output(&base, &x).expect("flash-decoding runs a ragged batch");
                    let rows = rows_to_check(&shape, usize::MAX);
                    let e = crate::reference::check_case(&base, &x, &want, &rows);
                    let tag =
                        format!("{heads}/{kv_heads} {dtype} c{causal} w{window:?} sp{splits}");
                    assert!(
                        e.non_finite == 0 && e.max_abs <= dtype.tolerance(),
                        "{tag}: {e:?}"
                    );
                    for (i, first) in spec.offsets(false).into_iter().take(spec.len()).enumerate() {
                        let xi = sequence_inputs(&x, &spec, i);
                        let alone = decode_case(fd, xi.shape, dtype, causal, window, 1, 2, 64);
                        let got = output(&alone, &xi).expect("flash-decoding runs");
                        let n = xi.shape.seq_q * dense.head_dim;
                        for h in 0..heads {
                            let at = (h * shape.seq_q + first) * dense.head_dim;
                            let diff = crate::run::max_abs_diff(
                                &want[at..at + n],
                                &got[h * n..(h + 1) * n],
                            );
                            assert!(diff <= 1e-6, "{tag} seq {i} head {h}: {diff:e}");
                        }
                    }
                    for page_size in [1, 16] {
                        let c = Case {
                            paging: Some(Paging {
                                page_size,
                                order: PageOrder::Shuffled,
                            }),
                            ..ragged(pd)
                        };
                        let out = output(&c, &x.clone().paged_for(&c)).expect("paged-decode runs");
                        let diff = crate::run::max_abs_diff(&out, &want);
                        assert!(diff <= 1e-6, "{tag} page {page_size}: {diff:e}");
                    }
                    if window.is_none() {
                        let varlen = Case {
                            batch_spec: Some(spec.clone()),
                            causal,
                            ..Case::cpu_fwd(VariantId::FlashVarlen, shape, dtype, 2)
                        };
                        let out = output(&varlen, &x).expect("flash-varlen runs");
                        let diff = crate::run::max_abs_diff(&out, &want);
                        let tol = blocking_tolerance(dtype, dense.head_dim, &x.v, 1e-5);
                        assert!(diff <= tol, "{tag} flash-varlen: {diff:e} > {tol:e}");
                    }
                }
            }
        }
    }
}

#[test]
fn registry_names_match_the_ids() {
    for v in VariantId::ALL {
        assert_eq!(v.info().name, v.name(), "{v:?}");
    }
}

/// f32's unit roundoff, 2^-24.
const U32: f64 = 1.0 / (1u64 << 24) as f64;
/// bf16's unit roundoff, 2^-8 (8 significant bits, rounded to nearest): the relative error
/// of each probability that a path rounds to bf16 for PV.
const U_BF16: f64 = 1.0 / 256.0;
/// The relative error of the least exact exp the kernels use (the degree-4 polynomial of
/// `simd/avx512.rs`, 2.7e-6; the others are within 2e-7).
const EXP_REL: f64 = 2.7e-6;

/// gamma_n = n u / (1 - n u): the relative bound of an f32 sum or dot product of n terms.
fn gamma(n: usize) -> f64 {
    let x = n as f64 * U32;
    x / (1.0 - x)
}

/// The f64 oracle of a forward on the inputs as stored (bf16 and f16 values are exact in
/// f64, so the inputs' own rounding is no error), with what bounds each element's error.
struct Bounded {
    out: Vec<f64>,
    /// Per output element, A = sum_j p_j |v_j| (p the exact softmax): each error term below
    /// is relative to it.
    mass: Vec<f64>,
    /// Per output row, the relative error of a computation in f32 (`bounded_oracle`).
    f32_rel: Vec<f64>,
}

/// [`Bounded`] of `x`. The f32 bound of a row: each score q.k_j is a dot product of d terms
/// (error <= gamma_d sum_k |q_k k_jk|, times the scale), the scale and the exponent's
/// argument (x - m) c are rounded (a few u of |s_j| and |s_j - m|), and exp is within
/// `EXP_REL`: each unnormalized p_j is off by a factor within 1 +- eta, eta = E + EXP_REL
/// with E the row's largest score error, which moves sum p_j v_j / sum p_j by at most
/// 2 eta A; the sums over n keys (and the online rescales, at most one per key) add
/// 2 gamma_(n+d) A each side, the reciprocal and its product a few u.
fn bounded_oracle(x: &Inputs, causal: bool) -> Bounded {
    let s = x.shape;
    let d = s.head_dim;
    let widen = |t: &Tensor| {
        let mut v = Vec::with_capacity(t.len());
        t.for_each_f32(|x| v.push(f64::from(x)));
        v
    };
    let (q, k, v) = (widen(&x.q), widen(&x.k), widen(&x.v));
    let scale = 1.0 / (d as f64).sqrt();
    let n_out = s.batch * s.heads * s.seq_q;
    let (mut out, mut mass) = (vec![0.0; n_out * d], vec![0.0; n_out * d]);
    let mut f32_rel = vec![0.0; n_out];
    for b in 0..s.batch {
        for h in 0..s.heads {
            let (qo, ko) = (s.q_head_offset(b, h), s.kv_head_offset(b, h));
            for i in 0..s.seq_q {
                let n = s.visible_keys(causal, i);
                if n == 0 {
                    continue; // no visible key: output 0, as every variant writes
                }
                let qi = &q[qo + i * d..][..d];
                let (mut sc, mut err) = (Vec::with_capacity(n), Vec::with_capacity(n));
                for j in 0..n {
                    let kj = &k[ko + j * d..][..d];
                    let dot: f64 = qi.iter().zip(kj).map(|(a, b)| a * b).sum();
                    let abs: f64 = qi.iter().zip(kj).map(|(a, b)| (a * b).abs()).sum();
                    sc.push(dot * scale);
                    err.push(scale * gamma(d) * abs);
                }
                let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e = sc
                    .iter()
                    .zip(&err)
                    .map(|(s, e)| e + 4.0 * U32 * (s.abs() + (s - m).abs()))
                    .fold(0.0, f64::max);
                let p: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = p.iter().sum();
                let row = qo + i * d;
                for c in 0..d {
                    let (mut o, mut a) = (0.0, 0.0);
                    for (j, pj) in p.iter().enumerate() {
                        let vj = v[ko + j * d + c];
                        o += pj * vj;
                        a += pj * vj.abs();
                    }
                    out[row + c] = o / z;
                    mass[row + c] = a / z;
                }
                f32_rel[row / d] = 2.0 * (e + EXP_REL) + 4.0 * gamma(n + d) + 4.0 * U32;
            }
        }
    }
    Bounded { out, mass, f32_rel }
}

/// Asserts every element of `got` within its bound of `want`: A times the row's f32 bound,
/// plus 2^-8 A where the path rounds P to bf16 for PV (each p_j within 2^-8 of itself, the
/// normalizing sum unrounded: |sum p_j v_j - sum bf16(p_j) v_j| <= 2^-8 sum p_j |v_j|).
/// Returns the largest error / bound.
fn assert_within_bound(got: &[f32], want: &Bounded, p_rounded: bool, what: &str) -> f64 {
    let d = want.out.len() / want.f32_rel.len();
    let mut worst = 0.0f64;
    for (e, (&g, &w)) in got.iter().zip(&want.out).enumerate() {
        let rel = want.f32_rel[e / d] + if p_rounded { U_BF16 } else { 0.0 };
        let tol = rel * want.mass[e];
        let err = (f64::from(g) - w).abs();
        assert!(
            err <= tol,
            "{what}: element {e} (row {}, col {}) = {g}, oracle {w}: error {err:e} > bound {tol:e} ({rel:e} of A = {:e})",
            e / d,
            e % d,
            want.mass[e]
        );
        worst = worst.max(if tol > 0.0 { err / tol } else { 0.0 });
    }
    worst
}

/// Normal inputs, V shifted by +2 (then rounded to the dtype): each output element is then
/// near its A = sum_j p_j |v_j| (few negative values to cancel), so the bound is a fraction
/// of the output itself and an output off by 0.5% exceeds it on every path (the bf16 bound
/// 2^-8 A is 0.39%).
fn bounded_inputs(shape: Shape, dtype: DType, seed: u64) -> Inputs {
    let mut x = Inputs::generate(shape, dtype, InputDist::Normal, 1.0, seed);
    let mut v = Vec::with_capacity(x.v.len());
    x.v.for_each_f32(|y| v.push(y + 2.0));
    x.v = Tensor::from_f32(v, dtype);
    x
}

/// Every expected forward variant of `s` on every expected kernel path, each element within
/// its derived bound of the f64 oracle on the bf16/f16-rounded inputs; the set that ran is
/// asserted as in `assert_all_variants`. Returns the largest error / bound per read path.
fn assert_all_within_bound(s: &Setup) -> Vec<(ReadPath, f64)> {
    assert_all_within_bound_at(s, None)
}

/// [`assert_all_within_bound`] with the cases' `precision` set: with `highest` no path may
/// round P, so the bound has no 2^-8 A term anywhere.
fn assert_all_within_bound_at(s: &Setup, precision: Option<Precision>) -> Vec<(ReadPath, f64)> {
    let x = bounded_inputs(s.shape, s.dtype, 7);
    let want = bounded_oracle(&x, s.causal);
    let mut ran = BTreeSet::new();
    let mut worst: Vec<(ReadPath, f64)> = Vec::new();
    for isa in paths() {
        let path = ReadPath::of(s.dtype, isa, s.shape.head_dim);
        let highest = precision == Some(Precision::Highest);
        for v in fwd_variants(s) {
            let p_rounded = rounds_p(v, s.dtype, isa, s.shape.head_dim, highest);
            let c = Case {
                precision,
                ..case(v, s)
            };
            let out = output_with(&c, isa, &x).expect("forward runs");
            let what = format!(
                "{} [{isa}, {path:?}, precision {}] {:?} {} causal {} chunks {:?}",
                v.name(),
                c.precision(),
                s.shape,
                s.dtype,
                s.causal,
                s.chunks
            );
            let r = assert_within_bound(&out, &want, p_rounded, &what);
            match worst.iter_mut().find(|(p, _)| *p == path) {
                Some(w) => w.1 = w.1.max(r),
                None => worst.push((path, r)),
            }
            ran.insert((v, s.dtype, isa));
        }
    }
    let what = format!("{:?} {} causal {}", s.shape, s.dtype, s.causal);
    assert_ran(&ran, &expected_fwd(s), s.dtype, &what);
    println!("{what}: largest error / bound {worst:?}");
    worst
}

/// Both bf16 read paths must have run where the CPU has them: the pair path
/// (`ReadPath::Bf16Dot`: `vdpbf16ps`, and AMX tiles on amx-bf16) only with AVX512_BF16, the
/// widening path on the others.
fn assert_bf16_paths(worst: &[(ReadPath, f64)], d: usize) {
    let has = |p| worst.iter().any(|(q, _)| *q == p);
    assert!(
        has(ReadPath::Widen),
        "bf16 d {d}: the widening path did not run"
    );
    let dot = Isa::Avx512Bf16.available() && d.is_multiple_of(2);
    assert_eq!(has(ReadPath::Bf16Dot), dot, "bf16 d {d}: the pair path");
}

/// Every dtype within the derived bound at ragged shapes: rows and keys no multiple of any
/// block (77, 130) and head dims no multiple of a vector (40, 72: the bf16 pair path then
/// keeps P in f32), causal and not, self- and cross-attention, GQA.
#[test]
fn every_dtype_within_the_derived_bound_on_ragged_shapes() {
    for (nq, nkv, d, causal) in [
        (77, 77, 40, true),
        (130, 130, 72, false),
        (77, 130, 40, false),
        (130, 77, 72, true),
    ] {
        for dtype in DType::ALL {
            let mut s = setup(nq, nkv, d);
            s.shape.kv_heads = 1;
            s.dtype = dtype;
            s.causal = causal;
            let worst = assert_all_within_bound(&s);
            if dtype == DType::Bf16 {
                assert_bf16_paths(&worst, d);
            }
        }
    }
}

/// flash on AMX tiles (amx-bf16: bf16, head dims of whole 32s) within the derived bound
/// where no block is whole: rows and keys no multiple of a tile (77, 130), chunks that pad
/// both tile sides (48 rows, 40 keys), causal and not, self- and cross-attention, GQA
/// (4 query heads on 2); on one thread with 32-row blocks, a head's blocks share each key
/// block (up to 5, the last of 2 or 13 rows). Where the CPU or OS offers no AMX, the other
/// paths run and a line says so.
#[test]
fn amx_tiles_within_the_derived_bound_on_ragged_shapes() {
    if !Isa::AmxBf16.available() {
        println!("AMX tiles not usable here: amx-bf16 not among the paths");
    }
    for (nq, nkv, d, causal) in [
        (77, 130, 64, true),
        (130, 77, 96, false),
        (130, 130, 64, true),
    ] {
        for (chunks, threads) in [(None, 2), (Some((48, 40)), 2), (Some((32, 40)), 1)] {
            let mut s = setup(nq, nkv, d);
            if causal {
                s.shape.heads = 4;
                s.shape.kv_heads = 2;
            }
            s.dtype = DType::Bf16;
            s.causal = causal;
            s.chunks = chunks;
            s.threads = threads;
            let worst = assert_all_within_bound(&s);
            assert!(!worst.is_empty());
            let amx = crate::backend::cpu::flash::path(DType::Bf16, Isa::AmxBf16, d, false);
            assert!(amx.rounds_p() && amx == crate::backend::cpu::flash::FlashPath::Amx);
        }
    }
}

/// Every dtype within the derived bound at aligned shapes with the defaults (head dims of
/// whole vectors: bf16 P rounded for PV on AVX512_BF16), where rabe-staats takes its
/// one-phase path (one key chunk, query chunks of whole strips; asserted).
#[test]
fn every_dtype_within_the_derived_bound_on_aligned_shapes() {
    use crate::backend::cpu::chunked::{phases, Phases};
    for (n, d, causal) in [(256, 128, true), (256, 64, false), (1024, 64, false)] {
        for dtype in DType::ALL {
            let mut s = setup(n, n, d);
            s.dtype = dtype;
            s.causal = causal;
            let c = case(VariantId::RabeStaats, &s);
            let chunks = (c.q_chunk.unwrap(), c.kv_chunk.unwrap());
            assert_eq!(phases(&s.shape, chunks, s.threads), Phases::OnePerHead);
            let worst = assert_all_within_bound(&s);
            if dtype == DType::Bf16 {
                assert_bf16_paths(&worst, d);
            }
        }
    }
}

/// `precision = highest` keeps P in f32 on every path: every forward variant within the
/// f32 bound alone (no 2^-8 A term for a rounded P), bf16 at head dims of whole vectors,
/// where `fast` rounds P on the pair path; several key chunks for rabe-staats too. And the
/// bound tells the two apart: on the pair path (where the CPU has it) `fast` flash, naive
/// and rabe-staats exceed it.
#[test]
fn highest_keeps_p_in_f32_on_every_path_within_the_f32_bound() {
    for (n, d, causal, chunks) in [
        (256, 64, false, None),
        (256, 128, true, None),
        (256, 64, true, Some((128, 96))),
    ] {
        let mut s = setup(n, n, d);
        s.dtype = DType::Bf16;
        s.causal = causal;
        s.chunks = chunks;
        let worst = assert_all_within_bound_at(&s, Some(Precision::Highest));
        assert_bf16_paths(&worst, d);
        if !Isa::Avx512Bf16.available() {
            println!("avx512-bf16 not on this CPU: the fast pair path is not compared");
            continue;
        }
        let x = bounded_inputs(s.shape, s.dtype, 7);
        let want = bounded_oracle(&x, s.causal);
        let d = s.shape.head_dim;
        for v in [VariantId::Flash, VariantId::Naive, VariantId::RabeStaats] {
            let fast = case(v, &s);
            let out = output_with(&fast, Isa::Avx512Bf16, &x).expect("forward runs");
            let over = got_over_f32_bound(&out, &want);
            assert!(
                over > 1.0,
                "{v} fast on avx512-bf16 within the f32 bound ({over}): P was not rounded, so this test would not see a rounded P under highest"
            );
            println!("{v} fast on avx512-bf16, d {d}: error / f32 bound {over:.1}");
        }
    }
}

/// The largest error / f32 bound (no term for a rounded P) of `got`.
fn got_over_f32_bound(got: &[f32], want: &Bounded) -> f64 {
    let d = want.out.len() / want.f32_rel.len();
    got.iter()
        .zip(&want.out)
        .enumerate()
        .map(|(e, (&g, &w))| {
            let tol = want.f32_rel[e / d] * want.mass[e];
            let err = (f64::from(g) - w).abs();
            if tol > 0.0 {
                err / tol
            } else {
                0.0
            }
        })
        .fold(0.0, f64::max)
}

/// rabe-staats' per-chunk phases against the same bound: several key chunks (one ragged),
/// and one key chunk with more workers than the query chunk has strips (no slot of their
/// own), each asserted to take that plan.
#[test]
fn rabe_staats_per_chunk_phases_within_the_derived_bound() {
    use crate::backend::cpu::chunked::{phases, Phases};
    for (n, d, chunks, threads, causal) in [
        (256, 64, (128, 96), 2, true),
        (256, 64, (128, 256), 3, false),
        (192, 32, (64, 64), 2, false),
    ] {
        for dtype in DType::ALL {
            let mut s = setup(n, n, d);
            s.dtype = dtype;
            s.causal = causal;
            s.chunks = Some(chunks);
            s.threads = threads;
            assert_eq!(phases(&s.shape, chunks, threads), Phases::PerChunk);
            assert_all_within_bound(&s);
        }
    }
}

/// Every rule of the rows per pass (`cache::pass_rule`) decides on some case, asserted, and
/// naive and rabe-staats stay within the derived bound there, on every dtype and kernel
/// path: the cache sizes are set (`cache::with_cache_sizes`) so that small shapes land in
/// each rule whatever this machine's caches are. 150 query rows are strips of 64, 64 and 22
/// rows, cut by 30-row passes into 30, 30, 4 and 22; 192 rows take rabe-staats' one phase.
#[test]
fn every_pass_size_rule_against_the_oracle() {
    use crate::backend::cpu::cache::{self, PassRule};
    use crate::backend::cpu::chunked::{phases, Phases};
    use crate::backend::cpu::kernel_paths::on_pool;
    const BIG: usize = 1 << 40;
    for (nq, nkv, plan) in [(150, 200, Phases::PerChunk), (192, 192, Phases::OnePerHead)] {
        // (L2, L3) per rule over nkv keys: an L3 whose share (1/8) no K and V fit; both
        // unbounded; an L2 whose 3/4 hold the scores of 30 rows (4 bytes a key); of 3 rows.
        let rules = [
            (PassRule::KvOutgrowsL3, (BIG, 8), 64),
            (PassRule::StripFitsL2, (BIG, BIG), 64),
            (PassRule::RowsFitL2, (160 * nkv, BIG), 30),
            (PassRule::MinRows, (16 * nkv, BIG), cache::MIN_PASS_ROWS),
        ];
        for dtype in DType::ALL {
            for causal in [false, true] {
                let mut s = setup(nq, nkv, 32);
                s.shape.kv_heads = 1;
                s.dtype = dtype;
                s.causal = causal;
                let x = bounded_inputs(s.shape, dtype, 11);
                let want = bounded_oracle(&x, causal);
                let mut ran = BTreeSet::new();
                for (rule, (l2, l3), rows) in rules {
                    for isa in paths() {
                        let path = ReadPath::of(dtype, isa, 32);
                        let kv = path.kv_bytes(32, path.bf16_pv(32, false));
                        let (got_rule, got_rows) = cache::with_cache_sizes(l2, l3, || {
                            (cache::pass_rule(nkv, kv), cache::pass_rows(nkv, kv))
                        });
                        assert_eq!((got_rule, got_rows), (rule, rows), "{dtype} [{isa}]");
                        for v in [
                            VariantId::Naive,
                            VariantId::NaiveUnsafe,
                            VariantId::RabeStaats,
                        ] {
                            let c = case(v, &s);
                            if v == VariantId::RabeStaats {
                                let chunks = (c.q_chunk.unwrap(), c.kv_chunk.unwrap());
                                assert_eq!(phases(&s.shape, chunks, s.threads), plan);
                            }
                            assert_eq!(v.get().unsupported(&c), None);
                            let mut out = vec![f32::NAN; s.shape.out_len()];
                            // The kernels ask for the rows on the pool's thread.
                            on_pool(s.threads, || {
                                cache::with_cache_sizes(l2, l3, || {
                                    v.get().forward_cpu(&c, isa, &x, &mut out)
                                })
                            })
                            .expect("forward runs");
                            let what = format!(
                                "{} [{isa}] {rule:?} ({rows} rows) {dtype} {nq}x{nkv} causal {causal}",
                                v.name()
                            );
                            let p_rounded = rounds_p(v, dtype, isa, 32, false);
                            assert_within_bound(&out, &want, p_rounded, &what);
                            ran.insert((v, rule, isa));
                        }
                    }
                }
                assert_eq!(ran.len(), 3 * rules.len() * paths().len());
            }
        }
    }
}
