//! Interleaved timing (`run.interleave`): the CPU cases of a group that runs on the same
//! inputs and the same thread count are timed in alternation instead of one after the
//! other. After each case's warm-up come rounds in which every case still running makes one
//! timed call, in a seeded random order per round; a case leaves the rounds when its own
//! stopping rule stops it, so it makes the calls it would make alone. Then each case's
//! checked call and error check, as alone. The idea is Google Benchmark's random
//! interleaving. Why: on a shared machine the same build runs stretches of seconds 1.3x to
//! 2x slower (docs/methodology.md, "Comparing runs"); timed in alternation, such a stretch falls on all
//! the group's cases alike, so their ratios (one algorithm against another) compare calls
//! made at one machine speed. Cases on different thread counts are not interleaved: on the
//! 2-core VM a vCPU that idled through 1-thread calls often did not run for a whole
//! 2-thread call after them (docs/methodology.md). Cost: the cases' own calls,
//! and the machine-speed probe once before and once after the group (`measure::probe`);
//! each case keeps its own warm scratch buffers, so the group holds the sum of its cases'
//! workspaces (a group predicted over the memory budget runs one case after the other).

use crate::variant::Registry;
use std::ops::Range;
use std::sync::atomic::Ordering;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::backend::cpu::workspace::{WarmCalls, WarmStash};
use crate::error::{Error, Result};
use crate::measure::alloc;
use crate::measure::probe::probe_pool;
use crate::measure::timer::{warm_up, StopReason, StopRule, Timing};
use crate::problem::{Case, Device, Inputs, Mode};
use crate::results::record::Status;
use crate::run::{
    after_timing, backend_for, fail, finish_outcome, packing_bytes, pool, predicted_bytes,
    run_case, skip_reason, stop_rule, would_extrapolate, Outcome, Settings, Step, INTERRUPTED,
};
use crate::variant::Engine;

/// Whether a case can be timed in a group: a CPU forward or decode case on its own
/// process (not MPI) that is not skipped. (Under `run.extrapolate_above_s`, `run_group`
/// also asks whether each member runs in full.)
pub fn interleavable(case: &Case) -> bool {
    case.device == Device::Cpu
        && matches!(case.mode, Mode::Fwd | Mode::Decode)
        && case.variant.engine() != Engine::Mpi
        && skip_reason(case).is_none()
}

/// Whether two cases run on the same Q, K and V (what `Inputs::generate` reads) and in the
/// same thread pool.
fn same_inputs_and_threads(a: &Case, b: &Case) -> bool {
    a.threads == b.threads
        && a.shape == b.shape
        && a.dtype == b.dtype
        && a.input_dist == b.input_dist
        && a.input_scale == b.input_scale
        && a.seed == b.seed
        && a.prefix_len == b.prefix_len
}

/// Whether two cases can share one set of inputs as far as MLA goes: the inputs hold one
/// MLA cache (`Inputs::mla`) beside the Q, K, V of the shape, so MLA cases of a group must
/// have the same latent and RoPE dimensions (a standard case on the same shape may join).
fn same_mla(a: &Case, b: &Case) -> bool {
    a.mla.is_none() || b.mla.is_none() || a.mla == b.mla
}

/// The groups of `cases`, in order: each maximal run of consecutive interleavable cases on
/// the same inputs and thread count is one group; every other case is a group of its own.
/// (`run.innermost` makes the cases to compare consecutive.)
pub fn groups(cases: &[&Case]) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let joins = interleavable(case)
            && out.last().is_some_and(|g| {
                let first = cases[g.start];
                interleavable(first)
                    && same_inputs_and_threads(first, case)
                    && cases[g.clone()].iter().all(|c| same_mla(c, case))
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
pub fn group_bytes(cases: &[&Case]) -> u64 {
    cases
        .iter()
        .map(|c| predicted_bytes(c) + packing_bytes(c) + c.io_bytes())
        .sum()
}

/// One case of a group while it is timed.
struct Member<'a> {
    case: &'a Case,
    stop: StopRule,
    /// Its forward and output; `None` when they could not be allocated (`error`).
    step: Option<Box<dyn Step + 'a>>,
    /// Its warm scratch buffers while other cases run.
    stash: WarmStash,
    samples: Vec<f64>,
    /// The sum of `samples`.
    total_s: f64,
    /// The stopping rule's verdict after its latest call.
    decision: Option<StopReason>,
    error: Option<Error>,
}

impl Member<'_> {
    /// Still making timed calls: not failed, and its stopping rule has not stopped it.
    fn calling(&self) -> bool {
        self.error.is_none() && self.decision.is_none()
    }

    /// Its untimed warm-up calls, warm as its timed ones will be (on a worker of its pool).
    fn warm_up(&mut self) {
        let Some(step) = &mut self.step else { return };
        let warm = WarmCalls::resume(std::mem::take(&mut self.stash));
        let result = warm_up(&self.stop, &INTERRUPTED, || step.call());
        self.stash = warm.suspend();
        if let Err(e) = result {
            self.error = Some(e);
        }
    }

    /// One timed call, warm with its own buffers (on a worker of its pool, so the call
    /// starts there), and the stopping rule's verdict after it.
    fn timed_call(&mut self) {
        let Some(step) = &mut self.step else { return };
        let warm = WarmCalls::resume(std::mem::take(&mut self.stash));
        let result = step.timed_call();
        self.stash = warm.suspend();
        match result {
            Ok(seconds) => {
                self.samples.push(seconds);
                self.total_s += seconds;
                self.decision = self.stop.decide(
                    &self.samples,
                    self.total_s,
                    INTERRUPTED.load(Ordering::Relaxed),
                );
            }
            Err(e) => self.error = Some(e),
        }
    }
}

/// Times `cases` (one group of [`groups`]) in alternation and returns one outcome per case,
/// in order. A group of one case, one whose cases do not fit the memory budget together, or
/// cases that [`groups`] would not put together run case by case (`run_case`).
pub fn run_group(cases: &[&Case], settings: &Settings) -> Result<Vec<Outcome>> {
    let fits = settings
        .memory_budget
        .is_none_or(|budget| group_bytes(cases) <= budget);
    let one_group = groups(cases).len() == 1;
    // A member timed on its first query chunks and scaled cannot alternate with whole
    // calls: then every member runs alone, and extrapolates there as it would.
    let part_timed = || {
        settings
            .extrapolate
            .is_some_and(|x| cases.iter().any(|c| would_extrapolate(c, settings, x)))
    };
    if cases.len() < 2 || !fits || !one_group || part_timed() {
        return cases.iter().map(|c| run_case(c, settings, None)).collect();
    }
    alloc::set_limit(settings.memory_budget);
    let result = time_group(cases, settings);
    alloc::set_limit(None);
    result
}

fn time_group(cases: &[&Case], settings: &Settings) -> Result<Vec<Outcome>> {
    let first = cases[0];
    // One logical cache for all, and the pool of each paging its members use.
    // Inputs that do not fit: each case alone, which makes its row `oom`.
    let inputs = Inputs::try_for_case(first)
        .and_then(|x| cases.iter().try_fold(x, |x, c| x.try_prepared_for(c)));
    let inputs = match inputs {
        Ok(x) => x,
        Err(_) => return cases.iter().map(|c| run_case(c, settings, None)).collect(),
    };
    let mut members: Vec<Member> = cases
        .iter()
        .map(|&case| {
            let (step, error) = match backend_for(case).step(case, settings, Some(&inputs)) {
                Ok(s) => (Some(s), None),
                Err(e) => (None, Some(e)),
            };
            Member {
                case,
                stop: stop_rule(case, &settings.stop),
                step,
                stash: WarmStash::default(),
                samples: Vec::new(),
                total_s: 0.0,
                decision: None,
                error,
            }
        })
        .collect();

    // Everything runs on a worker of the group's pool (as a case alone is timed): the
    // probe, every warm-up, the rounds, the probe again.
    let seed = first.seed ^ ROUND_ORDER_SEED;
    let probe = match pool(first.threads) {
        Ok(pool) => Some(pool.install(|| {
            let before = probe_pool();
            for m in members.iter_mut().filter(|m| m.error.is_none()) {
                m.warm_up();
            }
            rounds(&mut members, seed);
            (before + probe_pool()) / 2.0
        })),
        Err(e) => {
            for m in &mut members {
                m.error.get_or_insert(Error::Runtime(e.to_string()));
            }
            None
        }
    };
    let interrupted = INTERRUPTED.load(Ordering::Relaxed);
    // The checked calls run cold, with nothing kept.
    for m in &mut members {
        m.stash = WarmStash::default();
    }
    Ok(members
        .into_iter()
        .map(|m| finish(m, settings, &inputs, probe, interrupted))
        .collect())
}

/// Seeds the order of the rounds (with the run's seed), apart from the inputs' stream.
const ROUND_ORDER_SEED: u64 = 0x1A7E_41EA_5EED;

/// The timed rounds: every member still calling makes one call per round, in a random order
/// drawn from `seed`, until none is.
fn rounds(members: &mut [Member], seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
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
            members[i].timed_call();
        }
    }
}

/// The outcome of a timed member: the rest of the measuring sequence after its timed calls
/// (`run::after_timing`), as for a case timed alone.
fn finish(
    mut m: Member,
    settings: &Settings,
    inputs: &Inputs,
    probe: Option<f64>,
    interrupted: bool,
) -> Outcome {
    let case = m.case;
    let backend = backend_for(case);
    let mut record = crate::run::record_for(&settings.run_name, case, Status::Ok, "");
    record.mem_predicted_bytes = Some(backend.predicted_bytes(case));
    let stopped_by = match (m.error.take(), m.decision) {
        (Some(e), _) => Err(e),
        (None, Some(reason)) => Ok(reason),
        (None, None) if interrupted => Ok(StopReason::Interrupted),
        (None, None) => Err(Error::Runtime(
            "interleaved timing ended before its stopping rule".into(),
        )),
    };
    let measured = stopped_by.and_then(|stopped_by| {
        let step = m
            .step
            .take()
            .ok_or_else(|| Error::Runtime("no step".into()))?;
        let timing = Timing::of(std::mem::take(&mut m.samples), stopped_by)?;
        after_timing(backend, case, settings, &mut record, step, timing, probe)
    });
    let mut outcome = Outcome {
        record,
        output: None,
        inputs: None,
        samples: Vec::new(),
    };
    match measured {
        Ok((out, samples)) => {
            outcome.output = Some(out);
            outcome.samples = samples;
        }
        Err(e) => fail(&mut outcome.record, e),
    }
    let o = &mut outcome;
    finish_outcome(
        backend,
        case,
        settings,
        Some(inputs),
        &mut o.record,
        o.output.as_deref(),
    );
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::VariantId;
    use crate::problem::{DType, Shape};
    use crate::variant::DefaultCase;

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
            externals: Default::default(),
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
    fn groups_are_runs_of_consecutive_cases_on_the_same_inputs_and_threads() {
        let a = case(VariantId::Naive, 64, 1);
        let b = Case {
            causal: true,
            ..case(VariantId::Flash, 64, 1)
        };
        let c = case(VariantId::RabeStaats, 64, 1);
        let two = case(VariantId::Naive, 64, 2);
        let two_flash = case(VariantId::Flash, 64, 2);
        let longer = case(VariantId::Naive, 96, 2);
        let other_seed = Case {
            seed: 7,
            ..case(VariantId::Flash, 96, 2)
        };
        let bf16 = Case {
            dtype: DType::Bf16,
            ..case(VariantId::Naive, 96, 2)
        };
        let train = Case {
            mode: Mode::FwdBwd,
            ..case(VariantId::Naive, 96, 2)
        };
        let after = Case {
            dtype: DType::Bf16,
            ..case(VariantId::Flash, 96, 2)
        };
        let again = case(VariantId::Flash, 64, 1);
        let cases = [
            &a,
            &b,
            &c,
            &two,
            &two_flash,
            &longer,
            &other_seed,
            &bf16,
            &train,
            &after,
            &again,
        ];
        // a, b and c differ in variant and mask only: one group; the same at 2 threads
        // another. `train` is not interleavable, so `after` starts a new group although it
        // runs on `bf16`'s inputs; `again` has a's inputs and threads but is not next to it.
        assert_eq!(
            groups(&cases),
            vec![0..3, 3..5, 5..6, 6..7, 7..8, 8..9, 9..10, 10..11]
        );
    }

    #[test]
    fn a_group_whose_member_would_be_timed_on_a_part_runs_each_case_alone() {
        let _g = crate::measure::alloc::test_lock();
        let chunked = Case {
            q_chunk: Some(16),
            ..case(VariantId::RabeStaats, 64, 1)
        };
        let cases = [chunked, case(VariantId::Flash, 64, 1)];
        let refs: Vec<&Case> = cases.iter().collect();
        let extrapolated = |above_s: f64| -> Vec<bool> {
            let s = Settings {
                extrapolate: Some(crate::run::extrapolate::Extrapolation {
                    above_s,
                    q_chunks: 1,
                }),
                ..settings(3)
            };
            run_group(&refs, &s)
                .unwrap()
                .iter()
                .map(|o| o.record.extrapolated)
                .collect()
        };
        // Any call is above a cap of 0 s: the chunked case is timed on its first chunk,
        // alone; flash cannot be split and runs in full.
        assert_eq!(extrapolated(0.0), [true, false]);
        // Under a cap no call reaches, the group alternates whole calls.
        assert_eq!(extrapolated(1e9), [false, false]);
    }

    #[test]
    fn a_group_measures_each_case_as_alone_in_case_order() {
        // run_group sets (and clears) the process-wide memory limit and resets the peak.
        let _g = crate::measure::alloc::test_lock();
        let s = settings(3);
        let cases = [
            case(VariantId::Naive, 40, 2),
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
            let alone = crate::run::output(c, &inputs).unwrap();
            assert_eq!(o.output.as_deref(), Some(&alone[..]), "{}", c.id());
        }
    }
}
