//! Interleaved timing (`run.interleave`): the CPU cases of a group that runs on the same
//! inputs are timed in alternation instead of one after the other. After each case's
//! warm-up come rounds in which every case still running makes one timed call, in a seeded
//! random order per round; a case leaves the rounds when its own stopping rule stops it,
//! so it makes the calls it would make alone. Then each case's memory probe pass and error
//! check, as alone.
//! The idea is Google Benchmark's random interleaving. Why: on a shared machine the same
//! build runs stretches of seconds 1.3x to 2x slower (README, "Comparing runs"); timed in
//! alternation, such a stretch falls on all the group's cases alike, so their ratios (two
//! threads against one, one algorithm against another) compare calls made at one machine
//! speed. Cost: the cases' own calls, plus one machine-speed probe on the case's threads
//! (`measure::probe`, about 0.7 ms) before every timed call, which also wakes an idle core;
//! each case keeps its own warm scratch buffers, so the group holds the sum of its cases'
//! workspaces (a group predicted over the memory budget runs one case after the other).

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::time::Instant;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::backend::cpu::workspace::{try_zeroed, WarmCalls, WarmStash};
use crate::error::{Error, Result};
use crate::measure::alloc;
use crate::measure::probe::probe_pool;
use crate::measure::timer::{warm_up, StopReason, StopRule, Timing};
use crate::problem::{Case, Device, Inputs, Mode};
use crate::report::record::{Record, Status};
use crate::runner::{
    failed, finish_outcome, forward, memory_and_error, oom_or_error, packing_bytes, pool,
    predicted_bytes, record_timing, run_case, skip_reason, stop_rule, Outcome, Settings,
    INTERRUPTED,
};
use crate::variant::Engine;

/// Whether a case can be timed in a group: a CPU forward or decode case that runs in
/// full (no extrapolation), on its own process (not MPI), and is not skipped.
pub fn interleavable(case: &Case, settings: &Settings) -> bool {
    case.device == Device::Cpu
        && matches!(case.mode, Mode::Fwd | Mode::Decode)
        && case.variant.engine() != Engine::Mpi
        && settings.extrapolate.is_none()
        && skip_reason(case).is_none()
}

/// What decides a case's inputs (`Inputs::generate`): cases equal in it run on the same
/// Q, K and V.
fn same_inputs(a: &Case, b: &Case) -> bool {
    a.shape == b.shape
        && a.dtype == b.dtype
        && a.input_dist == b.input_dist
        && a.input_scale == b.input_scale
        && a.seed == b.seed
}

/// The groups of `cases`, in order: each maximal run of consecutive interleavable cases on
/// the same inputs is one group; every other case is a group of its own. (`run.innermost`
/// makes the cases to compare consecutive.)
pub fn groups(cases: &[&Case], settings: &Settings) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let joins = interleavable(case, settings)
            && out.last().is_some_and(|g| {
                let first = cases[g.start];
                interleavable(first, settings) && same_inputs(first, case)
            });
        match out.last_mut() {
            Some(g) if joins => g.end = i + 1,
            _ => out.push(i..i + 1),
        }
    }
    out
}

/// Bytes the group holds at once while it is timed: every case's workspace, GEMM packing,
/// inputs and output (the inputs are shared; counting them per case keeps this an upper
/// bound).
fn group_bytes(cases: &[&Case]) -> u64 {
    cases
        .iter()
        .map(|c| predicted_bytes(c) + packing_bytes(c) + c.io_bytes())
        .sum()
}

/// One case of a group while it is timed.
struct Member<'a> {
    case: &'a Case,
    stop: StopRule,
    out: Vec<f32>,
    /// Its warm scratch buffers while other cases run.
    stash: WarmStash,
    samples: Vec<f64>,
    /// The machine-speed probe before each timed call.
    probes: Vec<f64>,
    /// The stopping rule's verdict after its latest call.
    decision: Option<StopReason>,
    error: Option<Error>,
}

impl Member<'_> {
    /// Still making timed calls: not failed, and its stopping rule has not stopped it.
    fn calling(&self) -> bool {
        self.error.is_none() && self.decision.is_none()
    }

    /// Its untimed warm-up calls, warm as its timed ones will be.
    fn warm_up(&mut self, inputs: &Inputs) {
        let pool = match pool(self.case.threads) {
            Ok(p) => p,
            Err(e) => {
                self.error = Some(e);
                return;
            }
        };
        let (case, stop, out) = (self.case, &self.stop, &mut self.out);
        let stash = std::mem::take(&mut self.stash);
        let (result, stash) = pool.install(|| {
            let warm = WarmCalls::resume(stash);
            let result = warm_up(stop, &INTERRUPTED, || forward(case, inputs, out));
            (result, warm.suspend())
        });
        self.stash = stash;
        if let Err(e) = result {
            self.error = Some(e);
        }
    }
}

/// Times `cases` (one group of [`groups`], all interleavable, on the same inputs) in
/// alternation and returns one outcome per case, in order. A group of one case, or one
/// whose cases do not fit the memory budget together, runs case by case (`run_case`).
pub fn run_group(cases: &[&Case], settings: &Settings) -> Result<Vec<Outcome>> {
    let fits = settings
        .memory_budget
        .is_none_or(|budget| group_bytes(cases) <= budget);
    if cases.len() < 2 || !fits {
        return cases.iter().map(|c| run_case(c, settings, None)).collect();
    }
    alloc::set_limit(settings.memory_budget);
    let result = time_group(cases, settings);
    alloc::set_limit(None);
    result
}

fn time_group(cases: &[&Case], settings: &Settings) -> Result<Vec<Outcome>> {
    let first = cases[0];
    let inputs = Inputs::generate(
        first.shape,
        first.dtype,
        first.input_dist,
        first.input_scale,
        first.seed,
    );
    let mut members: Vec<Member> = cases
        .iter()
        .map(|&case| {
            let (out, error) = match try_zeroed(case.shape.out_len(), "output") {
                Ok(o) => (o, None),
                Err(e) => (Vec::new(), Some(e)),
            };
            Member {
                case,
                stop: stop_rule(case, &settings.stop),
                out,
                stash: WarmStash::default(),
                samples: Vec::new(),
                probes: Vec::new(),
                decision: None,
                error,
            }
        })
        .collect();

    for m in members.iter_mut().filter(|m| m.error.is_none()) {
        m.warm_up(&inputs);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(first.seed ^ ROUND_ORDER_SEED);
    let mut order: Vec<usize> = Vec::with_capacity(members.len());
    while !INTERRUPTED.load(Ordering::Relaxed) {
        order.clear();
        order.extend((0..members.len()).filter(|&i| members[i].calling()));
        if order.is_empty() {
            break;
        }
        order.shuffle(&mut rng);
        for &i in &order {
            if INTERRUPTED.load(Ordering::Relaxed) {
                break;
            }
            timed_call(&mut members[i], &inputs);
        }
    }
    let interrupted = INTERRUPTED.load(Ordering::Relaxed);
    // The memory probe passes run cold, with nothing kept.
    for m in &mut members {
        m.stash = WarmStash::default();
    }
    Ok(members
        .into_iter()
        .map(|m| finish(m, settings, &inputs, interrupted))
        .collect())
}

/// Seeds the order of the rounds (with the run's seed), apart from the inputs' stream.
const ROUND_ORDER_SEED: u64 = 0x1A7E_41EA_5EED;

/// One timed call of `m`, on a worker of its pool: the probe on every thread of the pool,
/// then the call, warm with its own buffers.
fn timed_call(m: &mut Member, inputs: &Inputs) {
    let (case, out) = (m.case, &mut m.out);
    let stash = std::mem::take(&mut m.stash);
    let pool = match pool(case.threads) {
        Ok(p) => p,
        Err(e) => {
            m.error = Some(e);
            return;
        }
    };
    let (probe, result, stash) = pool.install(|| {
        let probe = probe_pool();
        let warm = WarmCalls::resume(stash);
        let start = Instant::now();
        let result = forward(case, inputs, out).map(|_| start.elapsed().as_secs_f64());
        (probe, result, warm.suspend())
    });
    m.stash = stash;
    match result {
        Ok(seconds) => {
            m.samples.push(seconds);
            m.probes.push(probe);
            m.decision = m
                .stop
                .decide(&m.samples, INTERRUPTED.load(Ordering::Relaxed));
        }
        Err(e) => m.error = Some(e),
    }
}

/// The record of a timed member: its timing, then its memory probe pass and error check.
fn finish(mut m: Member, settings: &Settings, inputs: &Inputs, interrupted: bool) -> Outcome {
    let case = m.case;
    let mut record = Record::for_case(&settings.run_name, case, Status::Ok, "");
    record.mem_predicted_bytes = Some(predicted_bytes(case));
    if let Some(e) = m.error.take() {
        return failed(record, oom_or_error(&e), e, None);
    }
    let stopped_by = match m.decision {
        Some(reason) => reason,
        None if interrupted => StopReason::Interrupted,
        None => {
            let e = Error::Runtime("interleaved timing ended before its stopping rule".into());
            return failed(record, Status::Error, e, None);
        }
    };
    let timing = match Timing::of(std::mem::take(&mut m.samples), stopped_by) {
        Ok(t) => t,
        Err(e) => return failed(record, Status::Error, e, None),
    };
    let probe = m.probes.iter().sum::<f64>() / m.probes.len().max(1) as f64;
    record_timing(&mut record, case, &timing, Some(probe));
    if let Err(e) = memory_and_error(&mut record, case, settings, inputs, &mut m.out) {
        return failed(record, oom_or_error(&e), e, None);
    }
    finish_outcome(case, settings, inputs, &mut record, Some(&m.out));
    Outcome {
        record,
        output: Some(m.out),
        inputs: None,
        samples: timing.samples,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{DType, Shape};
    use crate::variant::VariantId;

    fn settings(max_reps: usize) -> Settings {
        Settings {
            run_name: "test".into(),
            stop: StopRule {
                warmup: 1,
                warmup_s: 0.0,
                min_reps: 2,
                max_reps,
                min_time_s: 0.0,
                max_time_s: 60.0,
                rel_spread: 0.0,
            },
            memory_budget: None,
            error_rows: 16,
            extrapolate: None,
            diff_against: None,
            model_layers: None,
            gpu: Default::default(),
        }
    }

    fn case(variant: VariantId, n: usize, threads: usize) -> Case {
        Case::cpu_fwd(
            variant,
            Shape::self_attention(2, n, 16),
            DType::F32,
            threads,
        )
    }

    #[test]
    fn groups_are_runs_of_consecutive_cases_on_the_same_inputs() {
        let s = settings(3);
        let a = case(VariantId::Naive, 64, 1);
        let b = Case {
            threads: 2,
            ..case(VariantId::Flash, 64, 1)
        };
        let c = Case {
            causal: true,
            ..case(VariantId::RabeStaats, 64, 1)
        };
        let longer = case(VariantId::Naive, 96, 1);
        let other_seed = Case {
            seed: 7,
            ..case(VariantId::Naive, 96, 1)
        };
        let bf16 = Case {
            dtype: DType::Bf16,
            ..case(VariantId::Naive, 96, 1)
        };
        let train = Case {
            mode: Mode::FwdBwd,
            ..case(VariantId::Naive, 96, 1)
        };
        let after = case(VariantId::Flash, 96, 1);
        let again = case(VariantId::Naive, 64, 1);
        let cases = [
            &a,
            &b,
            &c,
            &longer,
            &other_seed,
            &bf16,
            &train,
            &after,
            &again,
        ];
        // a, b and c differ in variant, threads and mask only: one group. `train` is not
        // interleavable, so `after` starts a new group although its inputs are `bf16`'s
        // shape; `again` has a's inputs but is not next to it.
        assert_eq!(
            groups(&cases, &s),
            vec![0..3, 3..4, 4..5, 5..6, 6..7, 7..8, 8..9]
        );
        let extrapolating = Settings {
            extrapolate: Some(crate::extrapolate::Extrapolation {
                above_s: 1.0,
                q_chunks: 1,
            }),
            ..settings(3)
        };
        assert!(groups(&cases[..3], &extrapolating)
            .iter()
            .all(|g| g.len() == 1));
    }

    #[test]
    fn a_group_measures_each_case_as_alone_in_case_order() {
        let s = settings(3);
        let cases = [
            case(VariantId::Naive, 40, 1),
            case(VariantId::RabeStaats, 40, 2),
            Case {
                causal: true,
                ..case(VariantId::Flash, 40, 2)
            },
        ];
        let refs: Vec<&Case> = cases.iter().collect();
        let outcomes = run_group(&refs, &s).unwrap();
        assert_eq!(outcomes.len(), 3);
        let inputs = Inputs::generate(cases[0].shape, DType::F32, cases[0].input_dist, 1.0, 0);
        for (c, o) in cases.iter().zip(&outcomes) {
            let r = &o.record;
            assert_eq!(r.case_id, c.id());
            assert_eq!(r.status, Status::Ok, "{}", r.reason);
            // rel_spread 0 never converges: every case makes exactly max_reps timed calls.
            assert_eq!(r.reps, 3);
            assert_eq!(o.samples.len(), 3);
            assert_eq!(r.stopped_by, "max_reps");
            assert!(r.probe_gflops.is_some_and(|p| p > 0.0));
            assert!(r.mem_overhead_bytes.is_some());
            assert!(
                r.max_abs_err.is_some_and(|e| e < 1e-5),
                "{:?}",
                r.max_abs_err
            );
            // Its output is the case's own, computed alone on the same inputs.
            let alone = crate::runner::output(c, &inputs).unwrap();
            assert_eq!(o.output.as_deref(), Some(&alone[..]), "{}", c.id());
        }
    }

    #[test]
    fn a_group_over_the_memory_budget_runs_case_by_case_with_the_same_rows() {
        let cases = [case(VariantId::Naive, 48, 1), case(VariantId::Flash, 48, 1)];
        let refs: Vec<&Case> = cases.iter().collect();
        let one = group_bytes(&refs[..1]);
        assert!(group_bytes(&refs) > one);
        // Each case fits alone, the two together do not.
        let s = Settings {
            memory_budget: Some(group_bytes(&refs) - 1),
            ..settings(2)
        };
        let outcomes = run_group(&refs, &s).unwrap();
        for (c, o) in cases.iter().zip(&outcomes) {
            assert_eq!(o.record.case_id, c.id());
            assert_eq!(o.record.status, Status::Ok, "{}", o.record.reason);
            assert_eq!(o.record.reps, 2);
            // run_case keeps the inputs; the interleaved path shares one copy and keeps none.
            assert!(o.inputs.is_some());
        }
    }
}
