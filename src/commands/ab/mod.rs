//! `attnbench ab`: times two implementations of the same cases in the same run, alternating
//! between them, and says which kernels got slower. Each side is a worker process
//! (`crate::worker`): another build of attnbench (the CI time gate: the baseline build
//! against the current one) or anything that speaks the protocol. Each of `rounds` rounds
//! starts both workers afresh and, for every case, times a block of calls on both sides
//! back to back, in a seeded random order; the verdicts come from the rounds' paired ratios
//! (`paired`), grouped by kernel (variant, mode, dtype). The idea is Google Benchmark's
//! random interleaving, at the level of whole processes. Cost: 2 · rounds · (warm-up + block + one checked call and oracle check)
//! per case; O(cases · rounds) memory.

pub mod paired;
pub mod render;

use crate::variant::Registry;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::compare::time::{case_seed, classify, median, Interval, TimeVerdict};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::measure::timer::StopRule;
use crate::problem::Case;
use crate::run::skip_reason;
use crate::variant::Engine;
use crate::worker::client::{this_executable, Failure, Worker};
use crate::worker::protocol::RunReply;

/// Exit code when a kernel got slower or a case stopped working: `compare`'s.
pub use crate::compare::EXIT_REGRESSION as EXIT_SLOWER;

#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
pub struct AbArgs {
    /// The baseline: an attnbench binary of another build (run as `PATH worker`).
    #[arg(long, value_name = "PATH")]
    pub baseline: PathBuf,
    /// The build to judge [default: this executable].
    #[arg(long, value_name = "PATH")]
    pub current: Option<PathBuf>,
    /// The config whose cases are timed (its `[run]` warm-up, max_reps, memory budget and
    /// error_rows apply; its stopping rule is replaced by the rounds' blocks).
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// Override a key of the config, as `sweep --set`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// Rounds per case: each times one block on both sides.
    #[arg(long, default_value_t = 7, value_name = "N")]
    pub rounds: usize,
    /// Timed seconds of one block (at least 3 calls, however long they take).
    #[arg(long, default_value_t = 0.005, value_name = "S")]
    pub block_s: f64,
    /// Relative change that counts: a kernel is slower when the whole 95% interval of its
    /// ratio current/baseline is above 1 + T, faster when below 1 / (1 + T).
    #[arg(long, default_value_t = 0.10, value_name = "T")]
    pub time_threshold: f64,
    /// Write ab.md, ab_cases.csv and ab_groups.csv into this directory.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Seed of the rounds' order and of the bootstrap.
    #[arg(long, default_value_t = 0, value_name = "S")]
    pub seed: u64,
    /// Bootstrap resamples per kernel for the interval.
    #[arg(long, default_value_t = 2000, value_name = "N")]
    pub bootstrap: usize,
    /// A worker that has not answered a request after this many seconds is stopped.
    #[arg(long, default_value_t = 300.0, value_name = "S")]
    pub worker_timeout_s: f64,
}

/// Fewest timed calls of a block: its median needs more than one or two.
pub const BLOCK_MIN_REPS: usize = 3;

/// One case of the run.
#[derive(Clone, Debug, Serialize)]
pub struct CaseRow {
    pub case_id: String,
    /// The kernel it belongs to: `variant mode dtype`.
    pub kernel: String,
    /// `ok`, or why it was not judged (`baseline: ...`) or regressed (`current: ...`).
    pub status: String,
    pub rounds: usize,
    pub baseline_median_s: Option<f64>,
    pub current_median_s: Option<f64>,
    pub ratio: Option<f64>,
    pub baseline_mem_overhead_bytes: Option<u64>,
    pub current_mem_overhead_bytes: Option<u64>,
    pub baseline_max_abs_err: Option<f64>,
    pub current_max_abs_err: Option<f64>,
    #[serde(skip)]
    log_ratios: Vec<f64>,
}

/// One kernel's verdict.
#[derive(Clone, Debug, Serialize)]
pub struct GroupRow {
    pub kernel: String,
    pub verdict: TimeVerdict,
    pub cases: usize,
    pub ratio: f64,
    pub lo: f64,
    pub hi: f64,
}

/// What `ab` found.
pub struct Outcome {
    pub baseline: String,
    pub current: String,
    pub cases: Vec<CaseRow>,
    pub groups: Vec<GroupRow>,
    pub threshold: f64,
    pub rounds: usize,
    pub block_s: f64,
    pub seconds: f64,
}

impl Outcome {
    /// Cases the current build failed although the baseline ran them.
    pub fn broken(&self) -> impl Iterator<Item = &CaseRow> {
        self.cases
            .iter()
            .filter(|c| c.status.starts_with("current"))
    }

    pub fn slower(&self) -> impl Iterator<Item = &GroupRow> {
        self.groups
            .iter()
            .filter(|g| g.verdict == TimeVerdict::Slower)
    }

    pub fn exit_code(&self) -> i32 {
        if self.slower().next().is_some() || self.broken().next().is_some() {
            EXIT_SLOWER
        } else {
            0
        }
    }
}

/// Most rounds `ab` takes: far past where the interval stops narrowing.
const MAX_ROUNDS: usize = 10_000;
/// Longest block: an hour of timing per block is already no gate.
const MAX_BLOCK_S: f64 = 3600.0;

/// The command: runs, prints the Markdown summary, writes the files; returns the exit code.
pub fn command(args: &AbArgs) -> Result<i32> {
    if args.rounds < 2 {
        return Err(Error::Usage(format!(
            "--rounds: {} is too few; a paired interval needs at least 2 rounds",
            args.rounds
        )));
    }
    // Bounds a typo (1e12 rounds, 1e300 s blocks, 1e12 resamples) that would run for ever.
    if args.rounds > MAX_ROUNDS {
        return Err(Error::Usage(format!(
            "--rounds: {} is more than {MAX_ROUNDS}",
            args.rounds
        )));
    }
    let bootstrap = crate::compare::MIN_BOOTSTRAP..=crate::compare::MAX_BOOTSTRAP;
    if !bootstrap.contains(&args.bootstrap) {
        return Err(Error::Usage(format!(
            "--bootstrap: {} is not from {} to {} resamples",
            args.bootstrap,
            bootstrap.start(),
            bootstrap.end()
        )));
    }
    if !(args.block_s > 0.0 && args.block_s <= MAX_BLOCK_S) {
        return Err(Error::Usage(format!(
            "--block-s: {} is not a number of seconds above 0, at most {MAX_BLOCK_S}",
            args.block_s
        )));
    }
    if !(args.time_threshold > 0.0 && args.time_threshold.is_finite()) {
        return Err(Error::Usage(format!(
            "--time-threshold: {} is not a positive fraction",
            args.time_threshold
        )));
    }
    if !(args.worker_timeout_s >= 1.0 && args.worker_timeout_s <= 1e6) {
        return Err(Error::Usage(format!(
            "--worker-timeout-s: {} is not a number of seconds from 1 to 1e6",
            args.worker_timeout_s
        )));
    }
    let config = Config::load(&args.config, &args.sets)?;
    // A directory that cannot be written is said before minutes of measuring, not after.
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).map_err(|e| Error::Io {
            context: format!("--out: creating {}", dir.display()),
            source: e,
        })?;
    }
    let outcome = run(args, &config)?;
    let md = render::markdown(&outcome);
    print!("{md}");
    if let Some(dir) = &args.out {
        render::write(dir, &outcome, &md)?;
    }
    Ok(outcome.exit_code())
}

/// The cases `ab` times: those this build would run in process (skipped cases and MPI
/// variants, which need mpirun, are left out).
pub fn timed_cases(config: &Config) -> Vec<Case> {
    config
        .expand()
        .into_iter()
        .filter(|c| skip_reason(c).is_none() && c.variant.engine() == Engine::InProcess)
        .collect()
}

fn run(args: &AbArgs, config: &Config) -> Result<Outcome> {
    let cases = timed_cases(config);
    if cases.is_empty() {
        return Err(Error::Usage(format!(
            "{}: no case of this config runs in process here",
            args.config.display()
        )));
    }
    let programs = Programs {
        baseline: args.baseline.clone(),
        current: match &args.current {
            Some(p) => p.clone(),
            None => this_executable()?,
        },
        timeout: Duration::from_secs_f64(args.worker_timeout_s),
    };
    let stop = StopRule {
        warmup: config.run.warmup,
        warmup_s: config.run.warmup_s,
        min_reps: BLOCK_MIN_REPS,
        max_reps: config.run.max_reps.max(BLOCK_MIN_REPS),
        min_time_s: 0.0,
        max_time_s: args.block_s,
        // Never converges: a block is its time, or its minimum of calls.
        rel_spread: 0.0,
    };
    let block = Block {
        stop,
        error_rows: config.run.error_rows,
        budget: config.run.memory_budget.map(|b| b.bytes()),
        decode_gemm_rows: config.run.decode_gemm_rows,
    };
    let mut rows: Vec<CaseRun> = cases.iter().map(CaseRun::new).collect();
    let started = Instant::now();
    let mut last_note = Instant::now();
    let (mut baseline, mut current) = (String::new(), String::new());
    for round in 0..args.rounds {
        // Fresh processes every round: a process's physical pages (and so its cache-set
        // conflicts) stay the same for all its calls, which made one process of a build
        // run a case up to 1.2x slower than another process of the same build, for the
        // whole of a run. New processes each round make that a round-to-round noise,
        // which the median over rounds removes.
        let mut sides = programs.start()?;
        if round == 0 {
            [baseline, current] = [&sides[0], &sides[1]].map(describe);
            eprintln!(
                "ab: {} cases x {} rounds, blocks of {} s; baseline {baseline}; current {current}",
                cases.len(),
                args.rounds,
                args.block_s
            );
        }
        for (case, row) in cases.iter().zip(rows.iter_mut()) {
            if row.row.status == "ok" {
                row.round(&mut sides, &programs, case, &block, args.seed, round)?;
            }
        }
        if last_note.elapsed() > Duration::from_secs(10) || round + 1 == args.rounds {
            eprintln!(
                "ab: round {}/{} done, {:.0} s",
                round + 1,
                args.rounds,
                started.elapsed().as_secs_f64()
            );
            last_note = Instant::now();
        }
    }
    let rows: Vec<CaseRow> = rows.into_iter().map(CaseRun::finish).collect();
    let groups = judge(&rows, args);
    Ok(Outcome {
        baseline,
        current,
        cases: rows,
        groups,
        threshold: args.time_threshold,
        rounds: args.rounds,
        block_s: args.block_s,
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn describe(w: &Worker) -> String {
    let h = &w.hello;
    let rev = h
        .git_revision
        .as_deref()
        .map_or("revision unknown".to_string(), |r| {
            let short: String = r.chars().take(10).collect();
            let dirty = if h.git_dirty == Some(true) {
                " (dirty)"
            } else {
                ""
            };
            format!("git {short}{dirty}")
        });
    let decode = h
        .cpu_decode_loop
        .as_deref()
        .map_or(String::new(), |d| format!("; decode loop: {d}"));
    format!("`{}` ({}, {rev}{decode})", w.label, h.implementation)
}

/// The two worker programs.
struct Programs {
    baseline: PathBuf,
    current: PathBuf,
    timeout: Duration,
}

impl Programs {
    fn start(&self) -> Result<[Worker; 2]> {
        Ok([self.start_side(0)?, self.start_side(1)?])
    }

    fn start_side(&self, side: usize) -> Result<Worker> {
        let (label, path) = if side == 0 {
            ("baseline", &self.baseline)
        } else {
            ("current", &self.current)
        };
        Worker::start(label, path, &["worker"], self.timeout)
    }
}

/// What each block of a case is asked for.
struct Block {
    stop: StopRule,
    error_rows: usize,
    budget: Option<u64>,
    /// The config's pin of decode's loop choice, sent to both sides.
    decode_gemm_rows: Option<usize>,
}

/// A case while its rounds are timed.
struct CaseRun {
    row: CaseRow,
    /// (baseline median, current median) of each round.
    pairs: Vec<(f64, f64)>,
    /// Every timed call of each side.
    all: [Vec<f64>; 2],
}

impl CaseRun {
    fn new(case: &Case) -> CaseRun {
        CaseRun {
            row: CaseRow {
                case_id: case.id(),
                kernel: format!("{} {} {}", case.variant.name(), case.mode, case.dtype),
                status: "ok".into(),
                rounds: 0,
                baseline_median_s: None,
                current_median_s: None,
                ratio: None,
                baseline_mem_overhead_bytes: None,
                current_mem_overhead_bytes: None,
                baseline_max_abs_err: None,
                current_max_abs_err: None,
                log_ratios: Vec::new(),
            },
            pairs: Vec::new(),
            all: [Vec::new(), Vec::new()],
        }
    }

    /// One round: a block on each side, in an order drawn from the seed, the case and the
    /// round. A side that fails ends the case (not judged when it is the baseline, a
    /// regression when only the current build fails); a worker lost on the way is started
    /// again for the next case.
    fn round(
        &mut self,
        sides: &mut [Worker; 2],
        programs: &Programs,
        case: &Case,
        block: &Block,
        seed: u64,
        round: usize,
    ) -> Result<()> {
        let mut rng = ChaCha8Rng::seed_from_u64(case_seed(seed ^ round as u64, &self.row.case_id));
        let first = usize::from(rng.random::<bool>());
        let mut medians = [0.0; 2];
        let mut failure: [Option<String>; 2] = [None, None];
        for side in [first, 1 - first] {
            match sides[side].run(
                case,
                &block.stop,
                block.error_rows,
                block.budget,
                block.decode_gemm_rows,
            ) {
                Ok(reply) if reply.status == "ok" && !reply.samples.is_empty() => {
                    if self.pairs.is_empty() {
                        self.first_round_figures(side, &reply);
                    }
                    medians[side] = median(&mut reply.samples.clone());
                    self.all[side].extend(reply.samples);
                }
                Ok(reply) => failure[side] = Some(not_ok(&reply)),
                Err(Failure::Refused(e)) => failure[side] = Some(e),
                Err(Failure::Lost(e) | Failure::TimedOut(e)) => {
                    failure[side] = Some(e);
                    sides[side] = programs.start_side(side)?;
                }
            }
        }
        match failure {
            [None, None] => self.pairs.push((medians[0], medians[1])),
            [Some(a), _] => self.row.status = format!("baseline: {a}"),
            [None, Some(b)] => self.row.status = format!("current: {b}"),
        }
        Ok(())
    }

    fn first_round_figures(&mut self, side: usize, reply: &RunReply) {
        let row = &mut self.row;
        if side == 0 {
            row.baseline_mem_overhead_bytes = reply.mem_overhead_bytes;
            row.baseline_max_abs_err = reply.max_abs_err;
        } else {
            row.current_mem_overhead_bytes = reply.mem_overhead_bytes;
            row.current_max_abs_err = reply.max_abs_err;
        }
    }

    fn finish(mut self) -> CaseRow {
        let row = &mut self.row;
        row.rounds = self.pairs.len();
        row.log_ratios = paired::log_ratios(&self.pairs);
        row.ratio = paired::case_ratio(&row.log_ratios);
        let [a, b] = &mut self.all;
        row.baseline_median_s = (!a.is_empty()).then(|| median(a));
        row.current_median_s = (!b.is_empty()).then(|| median(b));
        self.row
    }
}

fn not_ok(reply: &RunReply) -> String {
    if reply.reason.is_empty() {
        reply.status.clone()
    } else {
        format!("{}: {}", reply.status, reply.reason)
    }
}

/// One verdict per kernel, slowest first.
fn judge(rows: &[CaseRow], args: &AbArgs) -> Vec<GroupRow> {
    let mut by_kernel: BTreeMap<&str, Vec<Vec<f64>>> = BTreeMap::new();
    for r in rows
        .iter()
        .filter(|r| r.status == "ok" && !r.log_ratios.is_empty())
    {
        by_kernel
            .entry(&r.kernel)
            .or_default()
            .push(r.log_ratios.clone());
    }
    let mut groups: Vec<GroupRow> = by_kernel
        .into_iter()
        .filter_map(|(kernel, cases)| {
            let iv: Interval =
                paired::group_interval(&cases, args.bootstrap, case_seed(args.seed, kernel))?;
            Some(GroupRow {
                kernel: kernel.to_string(),
                verdict: classify(&iv, args.time_threshold),
                cases: cases.len(),
                ratio: iv.ratio,
                lo: iv.lo,
                hi: iv.hi,
            })
        })
        .collect();
    groups.sort_by(|a, b| b.ratio.total_cmp(&a.ratio));
    groups
}
