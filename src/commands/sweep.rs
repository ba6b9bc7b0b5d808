//! `attnbench sweep`: config -> cases -> one row per case appended (and flushed) to
//! `DIR/runs.csv`, `DIR/meta.json` and `DIR/samples.csv` beside it, progress on stderr, a
//! summary on stdout. Interrupting (Ctrl-C) keeps every row already written; `--resume`
//! continues. At the end the report (tables.md, plots, checks) is written to `DIR/report/`
//! unless `--no-report`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::backend::cpu::decode_path::{self, DecodePath};
use crate::backend::cpu::isa::Isa;
use crate::config::Config;
use crate::dist;
use crate::error::{Error, Result};
use crate::measure::calibrate::calibrate;
use crate::measure::timer::StopRule;
use crate::problem::{Case, Device};
use crate::report::generate;
use crate::report::plot::Format;
use crate::report::terminal::summary_table;
use crate::results::durable::{self, DirLock, Tail};
use crate::results::meta::{Meta, Resumed};
use crate::results::record::{Record, Status};
use crate::results::runs::{done_case_ids, CsvSink};
use crate::results::samples::{self, SamplesSink};
use crate::run::extrapolate::Extrapolation;
use crate::run::interleave;
use crate::run::{run_case, GpuSettings, Settings, INTERRUPTED};
use crate::units;
use crate::variant::impossible::LeftOut;
use clap::Args;

use crate::results::{CSV_NAME, META_NAME, SAMPLES_NAME};

#[derive(Debug, Args)]
pub struct SweepArgs {
    /// The sweep config (TOML); see docs/reference/config.md.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: PathBuf,
    /// Output directory [default: results/<run name>].
    #[arg(long, short = 'o', value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Override a key of the config: an axis (`seq_len=1024,2048`, `seq_len=pow2:8:12`), or
    /// a `run.`, `report.` or `model.` key (`run.max_time_s=0.5`). Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUES")]
    pub sets: Vec<String>,
    /// Run every CPU case on this kernel path (amx-bf16, avx512-bf16, avx512, avx2, portable;
    /// one this CPU runs), as `--set run.kernel_path=PATH` [default: the config's, else this
    /// CPU's measured choice, `attnbench list`]. To compare paths in one sweep, give the
    /// `kernel_path` axis a list.
    #[arg(long, value_name = "PATH", value_parser = Isa::parse_available)]
    pub kernel_path: Option<Isa>,
    /// Print the number of cases and the grid, run nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Machine-readable output on stdout. With --dry-run: the resolved config, the columns
    /// of runs.csv and samples.csv and the combinations left out, then every case (with its
    /// case_id, flops and io_bytes), one JSON object per line: what the peer scripts
    /// (scripts/peers/) read. Without: the closing summary as one JSON object (rows per
    /// status, where they went, what was left out, the report's files, checks and summary);
    /// progress stays on stderr.
    #[arg(long)]
    pub json: bool,
    /// Continue an interrupted sweep: skip cases already in DIR/runs.csv.
    #[arg(long, conflicts_with = "force")]
    pub resume: bool,
    /// Replace the results already in DIR: what a sweep writes there (runs.csv, samples.csv,
    /// meta.json, the derived tables and report/) is deleted first; other files stay.
    #[arg(long)]
    pub force: bool,
    /// Do not write the report (DIR/report/) at the end; `attnbench report DIR` makes it later.
    #[arg(long)]
    pub no_report: bool,
    /// MPI variants: seconds one exchange or collective may take before every rank is
    /// aborted with a message (a rank died, hung or diverged).
    #[arg(long, value_name = "SECONDS", default_value_t = crate::dist::DEFAULT_TIMEOUT_S)]
    pub mpi_timeout: f64,
    /// Test hook: `stall:RANK` (the rank stops answering) or `die:RANK` (it exits) at its
    /// first exchange.
    #[arg(long, value_name = "FAULT", hide = true)]
    pub mpi_test_fault: Option<crate::dist::Fault>,
}

/// The `sweep` command: MPI settings, then the sweep.
pub fn command(a: &SweepArgs) -> Result<()> {
    // 0, NaN or inf would abort every exchange at once or never: refused, naming the flag.
    if !(a.mpi_timeout > 0.0 && a.mpi_timeout <= 1e6) {
        return Err(Error::Usage(format!(
            "--mpi-timeout: {} is not a number of seconds above 0, at most 1e6",
            a.mpi_timeout
        )));
    }
    crate::dist::set_timeout(a.mpi_timeout);
    if let Some(f) = a.mpi_test_fault {
        crate::dist::set_fault(f);
    }
    sweep(a)
}

pub fn sweep(args: &SweepArgs) -> Result<()> {
    let mut sets = args.sets.clone();
    if let Some(p) = args.kernel_path {
        sets.push(format!("run.kernel_path={p}"));
    }
    let config = Config::load(&args.config, &sets)?;
    let expansion = config.expansion();
    if expansion.cases.is_empty() && !expansion.left_out.is_empty() {
        return Err(Error::Usage(format!(
            "{}: the grid holds only combinations its variants do not have ({} left out):\n{}",
            args.config.display(),
            expansion.left_out_count(),
            left_out_lines(&expansion.left_out)
        )));
    }
    let cases = &expansion.cases;
    if args.dry_run {
        if args.json {
            return print_cases_json(&config, cases, &expansion.left_out);
        }
        print_plan(&config, cases);
        if !expansion.left_out.is_empty() {
            println!(
                "left out: {} combinations the variants do not have (not cases):\n{}",
                expansion.left_out_count(),
                left_out_lines(&expansion.left_out)
            );
        }
        return Ok(());
    }
    let dir = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("results").join(&config.run.name));
    // Under MPI every rank runs every case (each call is collective), but only rank 0
    // writes files, progress and summaries.
    let root = dist::is_root();
    if dist::size() > 1 && args.resume {
        return Err(Error::Usage(
            "--resume is not supported under mpirun: rerun the sweep with --force".into(),
        ));
    }
    let prepared = if root {
        prepare_dir(&dir, args.resume, args.force).map(Some)
    } else {
        Ok(None)
    };
    if !dist::all_ok(prepared.is_ok())? {
        prepared?;
        return Err(Error::Runtime(format!(
            "rank 0 could not prepare {}",
            dir.display()
        )));
    }
    // Held to the end: no second sweep writes into this directory meanwhile.
    let _lock = prepared?;
    if root && args.resume {
        same_run(&dir.join(META_NAME), &config.run.name)?;
        end_files_on_whole_rows(&dir)?;
    }
    let csv_path = dir.join(CSV_NAME);
    let done = if args.resume {
        done_case_ids(&csv_path)?
    } else {
        Default::default()
    };
    let todo: Vec<&Case> = cases.iter().filter(|c| !done.contains(&c.id())).collect();
    if root && !expansion.left_out.is_empty() {
        eprintln!(
            "{} cases; {} combinations the variants do not have left out (--dry-run lists them)",
            cases.len(),
            expansion.left_out_count()
        );
    }
    if args.resume {
        eprintln!(
            "resume: {} of {} cases already in {}, {} to run",
            cases.len() - todo.len(),
            cases.len(),
            csv_path.display(),
            todo.len()
        );
    }

    let threads: Vec<usize> = cases
        .iter()
        .map(|c| c.threads)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if root {
        if let Some(&most) = threads.last() {
            super::run::warn_oversubscribed(most);
        }
    }
    let meta_path = dir.join(META_NAME);
    let resolved = || {
        serde_json::to_value(&config)
            .map_err(|e| Error::Runtime(format!("serializing the config: {e}")))
    };
    // Decode's loop choice is measured before the first case (each rank runs its own
    // kernels); a resumed run keeps the choice its first rows ran with.
    let runs_cpu = todo.iter().any(|c| c.device == Device::Cpu);
    let measure_decode_path = || {
        runs_cpu.then(|| {
            let p = match config.run.decode_gemm_rows {
                Some(rows) => {
                    let p = DecodePath::pinned(rows);
                    p.install();
                    p
                }
                None => decode_path::measure_once().clone(),
            };
            if root {
                eprintln!("decode loop: {}", p.summary());
            }
            p
        })
    };
    let calibration = if !root {
        measure_decode_path();
        Vec::new()
    } else if args.resume && meta_path.exists() {
        let mut meta = Meta::read(&meta_path)?;
        if let Some(p) = &meta.cpu_decode_path {
            p.install();
        }
        // The default path is measured per process: a resume that measures another one
        // would mix paths in one run, where a case left to run takes the default.
        let now_path = Isa::detect().name();
        if meta
            .cpu_kernel_path
            .as_deref()
            .is_some_and(|p| p != now_path)
            && todo
                .iter()
                .any(|c| c.device == Device::Cpu && c.kernel_path.is_none())
        {
            eprintln!(
                "warning: --resume on kernel path {now_path}, but the run's first rows ran on {} (meta.json): set run.kernel_path to keep one path",
                meta.cpu_kernel_path.as_deref().unwrap_or("?")
            );
        }
        if !todo.is_empty() {
            let now = resolved()?;
            let keys = differing_keys(&meta.config, &now);
            if !keys.is_empty() {
                eprintln!(
                    "warning: --resume with a config that differs from the run's first in {}: the rows before and after this resume were made under different settings (meta.json's `resumed` records this config)",
                    keys.join(", ")
                );
            }
            meta.resumed.push(Resumed::now(now, &meta.config));
            meta.write(&meta_path)?;
        }
        meta.calibration
    } else {
        let calibration = if config.run.calibrate && !todo.is_empty() {
            let list: Vec<String> = threads.iter().map(usize::to_string).collect();
            eprintln!(
                "calibrating FMA peak, SGEMM and copy bandwidth on {} thread(s) ...",
                list.join(", ")
            );
            threads.iter().map(|&t| calibrate(t)).collect()
        } else {
            Vec::new()
        };
        let mut meta = Meta::collect(resolved()?, threads, calibration.clone());
        meta.cpu_decode_path = measure_decode_path();
        if todo.iter().any(|c| c.device == Device::Cuda) {
            meta.gpu = crate::backend::cuda::gpu_info();
        }
        meta.write(&meta_path)?;
        calibration
    };
    // Decode rows report their KV bandwidth against the copy bandwidth at their threads.
    let copy_bandwidth = |t: usize| {
        calibration
            .iter()
            .find(|c| c.threads == t)
            .map(|c| c.copy_gbytes_per_s)
    };

    // The other ranks wait here while rank 0 calibrates.
    dist::all_ok(true)?;
    let gpu_copy = if todo.iter().any(|c| c.device == Device::Cuda) {
        crate::backend::cuda::gpu_info().and_then(|g| g.copy_gbytes_per_s)
    } else {
        None
    };
    install_interrupt_handler();
    let settings = Settings {
        run_name: config.run.name.clone(),
        stop: StopRule {
            warmup: config.run.warmup,
            warmup_s: config.run.warmup_s,
            min_reps: config.run.min_reps,
            max_reps: config.run.max_reps,
            min_time_s: config.run.min_time_s,
            max_time_s: config.run.max_time_s,
            rel_spread: config.run.rel_spread,
        },
        memory_budget: config.run.memory_budget.map(|b| b.bytes()),
        error_rows: config.run.error_rows,
        extrapolate: config.run.extrapolate_above_s.map(|above_s| Extrapolation {
            above_s,
            q_chunks: config.run.extrapolate_q_chunks,
        }),
        diff_against: config.run.diff_against,
        model_layers: config.run.model_layers,
        gpu: GpuSettings {
            cold: config.run.cold,
            tf32: config.run.tf32,
        },
        externals: config.externals.clone(),
    };
    let mut sinks = if root {
        Some((
            CsvSink::open(&csv_path)?,
            SamplesSink::open(&dir.join(SAMPLES_NAME))?,
        ))
    } else {
        None
    };
    let mut progress = Progress::new(todo.len(), root);
    let mut records = Vec::new();
    let started = Instant::now();
    // With `run.interleave`, consecutive cases on the same inputs are timed together.
    let groups = if config.run.interleave {
        interleave::groups(&todo)
    } else {
        (0..todo.len()).map(|i| i..i + 1).collect()
    };
    for group in groups {
        if interrupted_on_any_rank()? {
            break;
        }
        let cases = &todo[group.clone()];
        progress.start(group.start, cases);
        let outcomes = match cases {
            [case] => vec![run_case(case, &settings, None)?],
            _ => interleave::run_group(cases, &settings)?,
        };
        for ((i, case), mut outcome) in group.zip(cases).zip(outcomes) {
            // CUDA rows: against the GPU's device-to-device copy (measured when it was opened).
            let copy = match case.device {
                Device::Cuda => gpu_copy,
                Device::Cpu => copy_bandwidth(case.threads),
            };
            outcome.record.set_bandwidth(copy);
            // A case cut short by Ctrl-C is not written: its numbers would be partial. (The
            // sweep stops at the top of the loop, where under MPI every rank agrees to.)
            if INTERRUPTED.load(Ordering::Relaxed) {
                break;
            }
            // Samples first: a case in runs.csv always has its samples (a crash in between
            // leaves samples that the rerun of the case replaces).
            if let Some((sink, samples_sink)) = &mut sinks {
                samples_sink.append(&outcome.record.case_id, &outcome.samples)?;
                sink.append(&outcome.record)?;
            }
            progress.finish(i, &outcome.record);
            records.push(outcome.record);
        }
    }
    progress.done();
    if !root {
        return Ok(());
    }
    // With --json, stdout carries the one JSON object: the lines for people go to stderr.
    let say = |line: String| {
        if args.json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    };
    if !records.is_empty() {
        say(summary_table(&records));
    }
    let skipped = records
        .iter()
        .filter(|r| r.status == Status::Skipped)
        .count();
    if skipped > 0 && skipped == records.len() {
        eprintln!(
            "note: all {skipped} cases were skipped, nothing was measured (the rows say why)"
        );
    }
    let seconds = started.elapsed().as_secs_f64();
    say(format!(
        "{} rows written to {} in {}{}",
        records.len(),
        csv_path.display(),
        units::seconds_3dp(seconds),
        match expansion.left_out_count() {
            0 => String::new(),
            n => format!(" ({n} combinations the variants do not have left out)"),
        }
    ));
    let mut derived = Vec::new();
    if !INTERRUPTED.load(Ordering::Relaxed) {
        let read_bandwidth = crate::results::meta::read_bandwidths(&calibration);
        derived = write_derived(&dir, &config, &csv_path, &read_bandwidth)?;
        for p in &derived {
            say(format!("wrote {}", p.display()));
        }
    }
    if INTERRUPTED.load(Ordering::Relaxed) {
        let next = if dist::size() > 1 {
            // See the refusal of --resume above.
            "a sweep under mpirun cannot resume: rerun it with --force".to_string()
        } else {
            format!("continue with `{}`", resume_command(args, &dir))
        };
        return Err(Error::Interrupted(format!(
            "interrupted: {} rows kept in {}; {next}",
            records.len() + done.len(),
            csv_path.display(),
        )));
    }
    let report = if args.no_report {
        None
    } else {
        Some(report_at_end(&dir, !args.json)?)
    };
    if args.json {
        let closing = Closing {
            run: &config.run.name,
            dir: &dir,
            rows: records.len(),
            statuses: statuses(&records),
            seconds,
            left_out: &expansion.left_out,
            derived: &derived,
            report: report.as_ref().map(|g| ClosingReport {
                dir: &g.out,
                files: &g.files,
                checks: g
                    .checks
                    .iter()
                    .map(|c| ClosingCheck {
                        name: &c.name,
                        verdict: c.verdict.to_string(),
                        ours: &c.ours,
                        paper: &c.paper,
                    })
                    .collect(),
                summary: g.summary.as_ref(),
            }),
        };
        let text = serde_json::to_string(&closing)
            .map_err(|e| Error::Runtime(format!("serializing the summary: {e}")))?;
        println!("{text}");
    }
    Ok(())
}

/// `sweep --json`'s closing summary: one object on stdout.
#[derive(serde::Serialize)]
struct Closing<'a> {
    run: &'a str,
    dir: &'a Path,
    /// Rows written by this invocation (a resumed sweep's earlier rows not counted).
    rows: usize,
    /// Rows per status, every status named.
    statuses: BTreeMap<&'static str, usize>,
    seconds: f64,
    left_out: &'a [LeftOut],
    derived: &'a [PathBuf],
    report: Option<ClosingReport<'a>>,
}

#[derive(serde::Serialize)]
struct ClosingReport<'a> {
    dir: &'a Path,
    files: &'a [String],
    checks: Vec<ClosingCheck<'a>>,
    summary: Option<&'a crate::report::summary::Summary>,
}

#[derive(serde::Serialize)]
struct ClosingCheck<'a> {
    name: &'a str,
    verdict: String,
    ours: &'a str,
    paper: &'a str,
}

/// How many rows have each status (0 for the statuses none has).
fn statuses(records: &[Record]) -> BTreeMap<&'static str, usize> {
    Status::ALL
        .into_iter()
        .map(|s| (s.name(), records.iter().filter(|r| r.status == s).count()))
        .collect()
}

/// What a finished sweep writes beside its CSV: for a config with `[model]`, the
/// Tree-vs-Ring measurements (`run::tree_vs_ring`, into `results::tree_vs_ring`), then the
/// derived files rendered from the rows and those (`report::derived`), decode's against
/// the sweep's calibrated read bandwidths. Returns the paths.
fn write_derived(
    dir: &Path,
    config: &Config,
    csv: &Path,
    read_bandwidth: &[(usize, f64)],
) -> Result<Vec<PathBuf>> {
    let records = crate::results::runs::read_if_present(csv)?;
    let mut paths = Vec::new();
    let measured = match &config.model {
        Some(model) => {
            let m = measure_model(model, config.run.threads)?;
            paths.extend(crate::results::tree_vs_ring::write(dir, &m)?);
            Some(m)
        }
        None => None,
    };
    paths.extend(crate::report::derived::write_renderings(
        dir,
        &crate::report::derived::Sources {
            records: &records,
            model_layers: config.run.model_layers,
            budget: config.run.memory_budget.map(|b| b.0),
            model: config.model.as_ref(),
            measured: measured.as_ref(),
            read_bandwidth,
        },
    )?);
    Ok(paths)
}

/// The device counts of the striped-vs-ring prefill balance.
const BALANCE_DEVICES: [usize; 3] = [2, 4, 8];

/// The Tree-vs-Ring measurements of `[model]`: each check shape simulated and counted, the
/// prefill balance, and the compute term when it is timed on this machine.
fn measure_model(
    model: &crate::config::ModelConfig,
    threads: usize,
) -> Result<crate::results::tree_vs_ring::Measured> {
    use crate::run::tree_vs_ring as tvr;
    let shape = |batch, heads, head_dim, tokens| crate::problem::Shape {
        batch,
        heads,
        kv_heads: heads,
        seq_q: 1,
        seq_kv: tokens,
        head_dim,
    };
    let counts = model
        .check
        .iter()
        .map(|c| {
            let s = shape(c.batch, c.heads, c.head_dim, c.tokens);
            tvr::count_shape(s, c.devices, model.dtype, model.allreduce, threads)
        })
        .collect::<Result<_>>()?;
    let compute = match model.compute {
        crate::config::ComputeSpec::Measured { probe_tokens } => {
            let s = shape(model.batch, model.heads, model.head_dim, probe_tokens);
            Some(crate::results::tree_vs_ring::ComputeRow {
                tokens: probe_tokens,
                threads,
                seconds_per_token: tvr::seconds_per_token(s, model.dtype, threads)?,
            })
        }
        crate::config::ComputeSpec::Roofline(_) => None,
    };
    Ok(crate::results::tree_vs_ring::Measured {
        counts,
        balance: tvr::balance(&BALANCE_DEVICES, threads)?,
        compute,
    })
}

/// Whether a signal asked the sweep to stop, on this process or, under MPI, on any rank:
/// every rank must stop before the same case, or the others would wait in its collectives.
fn interrupted_on_any_rank() -> Result<bool> {
    let any = !dist::all_ok(!INTERRUPTED.load(Ordering::Relaxed))?;
    if any {
        // Another rank's signal: this rank ends as interrupted too (no report, exit 130).
        INTERRUPTED.store(true, Ordering::Relaxed);
    }
    Ok(any)
}

/// The command that continues this sweep: its config, every `--set` (they shape the grid),
/// `--no-report` if given, quoted for a POSIX shell.
fn resume_command(args: &SweepArgs, dir: &Path) -> String {
    let quote = super::shell_quote;
    let mut words = vec![
        format!("{} sweep --config", super::this_program()),
        quote(&args.config.to_string_lossy()),
        "--out".into(),
        quote(&dir.to_string_lossy()),
    ];
    for set in &args.sets {
        words.push(format!("--set {}", quote(set)));
    }
    if let Some(p) = args.kernel_path {
        words.push(format!("--kernel-path {p}"));
    }
    if args.no_report {
        words.push("--no-report".into());
    }
    words.push("--resume".into());
    words.join(" ")
}

/// The report of a finished sweep, printed when `print` (not under --json). Its
/// failure is an error, but the rows are already safe in runs.csv, and the message says how
/// to make the report again.
fn report_at_end(dir: &Path, print: bool) -> Result<generate::Generated> {
    let formats = [Format::Png, Format::Svg];
    let made = generate::generate(dir, None, &formats, None).map_err(|e| {
        Error::Runtime(format!(
            "the sweep finished and its rows are in {}, but the report failed: {e}; \
             retry with `{} report {}`",
            dir.join(CSV_NAME).display(),
            super::this_program(),
            dir.display()
        ))
    })?;
    if print {
        generate::print(&made);
    }
    Ok(made)
}

/// The left-out combinations, one indented line per variant.
fn left_out_lines(left_out: &[LeftOut]) -> String {
    left_out
        .iter()
        .map(|l| format!("  {}", l.line()))
        .collect::<Vec<_>>()
        .join("\n")
}

fn print_plan(config: &Config, cases: &[Case]) {
    println!("run {}: {} cases", config.run.name, cases.len());
    for (axis, values) in config.grid_summary() {
        println!("  {axis:<12} {values}");
    }
}

/// The resolved config and the columns of the files a run writes (`{"config": ...,
/// "columns": {"runs.csv": [...], "samples.csv": [...]}}`: peers write rows in these
/// formats without keeping a copy), then one `{"case_id", "flops", "io_bytes", "case"}`
/// object per case, one per line.
fn print_cases_json(config: &Config, cases: &[Case], left_out: &[LeftOut]) -> Result<()> {
    use std::io::Write;
    let ser = |e: serde_json::Error| Error::Runtime(format!("serializing the cases: {e}"));
    let mut out = std::io::stdout().lock();
    let mut line = |v: serde_json::Value| -> Result<()> {
        let text = serde_json::to_string(&v).map_err(ser)?;
        writeln!(out, "{text}").map_err(|e| Error::Runtime(format!("writing to stdout: {e}")))
    };
    line(serde_json::json!({
        "config": serde_json::to_value(config).map_err(ser)?,
        "columns": {
            CSV_NAME: crate::results::record::header(),
            SAMPLES_NAME: crate::results::samples::HEADER,
        },
        "left_out": serde_json::to_value(left_out).map_err(ser)?,
    }))?;
    for c in cases {
        // A shape past 64-bit counts (its row is `skipped`) has no counts, not wrapped ones.
        let counted = crate::run::too_large_to_count(c).is_none();
        line(serde_json::json!({
            "case_id": c.id(),
            "flops": counted.then(|| c.flops()),
            "io_bytes": counted.then(|| c.io_bytes()),
            "case": serde_json::to_value(c).map_err(ser)?,
        }))?;
    }
    Ok(())
}

/// The `section.key` paths whose values differ between two resolved configs (keys of
/// either; a section that is not a table counts as one key).
fn differing_keys(a: &serde_json::Value, b: &serde_json::Value) -> Vec<String> {
    use serde_json::{Map, Value};
    let empty = Map::new();
    fn table(v: Option<&Value>) -> Option<&Map<String, Value>> {
        v.and_then(Value::as_object)
    }
    let (a, b) = (
        table(Some(a)).unwrap_or(&empty),
        table(Some(b)).unwrap_or(&empty),
    );
    let keys = |x: &Map<String, Value>, y: &Map<String, Value>| -> BTreeSet<String> {
        x.keys().chain(y.keys()).cloned().collect()
    };
    let mut out = Vec::new();
    for s in keys(a, b) {
        let (x, y) = (a.get(&s), b.get(&s));
        if x == y {
            continue;
        }
        match (table(x), table(y)) {
            (None, None) => out.push(s),
            (x, y) => {
                let (x, y) = (x.unwrap_or(&empty), y.unwrap_or(&empty));
                out.extend(
                    keys(x, y)
                        .into_iter()
                        .filter(|k| x.get(k) != y.get(k))
                        .map(|k| format!("{s}.{k}")),
                );
            }
        }
    }
    out
}

/// `--resume` continues the run in the directory: a config of another run name would
/// append its rows to that run's CSV, so it is refused (a `--set` that widens or narrows
/// the grid of the same run is recorded in `meta.json` instead).
fn same_run(meta_path: &Path, name: &str) -> Result<()> {
    if !meta_path.exists() {
        // The resume writes a new one, for this machine.
        return Ok(());
    }
    let meta = Meta::read(meta_path).map_err(|e| {
        Error::Usage(format!(
            "--resume: {e}: its machine, calibration and config cannot be read; repair it, or \
             move it away to have the resume write a new meta.json for this machine"
        ))
    })?;
    match meta.config["run"]["name"].as_str() {
        Some(old) if old != name => Err(Error::Usage(format!(
            "--resume: {} holds run `{old}` but the config is run `{name}`: resume it with the config that made it (a --set may change its grid), or sweep into another --out",
            meta_path.parent().unwrap_or(meta_path).display()
        ))),
        _ => Ok(()),
    }
}

/// Creates and locks the directory for this sweep (a second sweep into it is refused while
/// the lock is held). An existing non-empty directory is never overwritten silently;
/// `--force` deletes only the files a sweep writes (its CSVs, `meta.json`, and with them the
/// derived tables and `report/`), so nothing of the run it replaces is left to be read as
/// this one's.
fn prepare_dir(dir: &Path, resume: bool, force: bool) -> Result<DirLock> {
    if dir.exists() && !dir.is_dir() {
        return Err(Error::Usage(format!(
            "--out {}: is a file, not a directory",
            dir.display()
        )));
    }
    // The lock file (and a temporary a crash left) are not results.
    let non_empty = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .any(|e| !durable::is_bookkeeping(&e.file_name().to_string_lossy()))
        })
        .unwrap_or(false);
    if non_empty && !resume && !force {
        // Refused before the lock file is made: a directory we do not write stays as it was.
        return Err(Error::Usage(format!(
            "output directory {} exists and is not empty: pass --resume to continue it, \
             --force to replace its results, or --out for another directory",
            dir.display()
        )));
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("cannot create {}", dir.display()), e))?;
    let lock = DirLock::acquire(dir)?;
    if non_empty && !resume {
        // The derived files and report/ go only with the run they derive from: in a
        // directory that holds no run, a `report/` is the user's own.
        let holds_run = dir.join(CSV_NAME).is_file() || dir.join(META_NAME).is_file();
        let derived = crate::report::derived::DERIVED_FILES
            .iter()
            .chain(&crate::results::tree_vs_ring::FILES)
            .filter(|_| holds_run);
        for name in [CSV_NAME, META_NAME, SAMPLES_NAME].iter().chain(derived) {
            let p = dir.join(name);
            if p.is_file() {
                std::fs::remove_file(&p)
                    .map_err(|e| Error::io(format!("cannot remove {}", p.display()), e))?;
            }
        }
        let report = dir.join(generate::REPORT_DIR);
        if holds_run && report.is_dir() {
            std::fs::remove_dir_all(&report)
                .map_err(|e| Error::io(format!("cannot remove {}", report.display()), e))?;
        }
    }
    Ok(lock)
}

/// Before a resume appends: a file of another version is refused before anything in it
/// changes; then a last row that a crash, a full disk or an edit left unfinished (no newline,
/// or too few fields) is removed, and its case runs again.
fn end_files_on_whole_rows(dir: &Path) -> Result<()> {
    for name in [CSV_NAME, SAMPLES_NAME] {
        let path = dir.join(name);
        if durable::has_whole_first_line(&path) {
            match name {
                CSV_NAME => {
                    crate::results::runs::check_header(&path, &crate::results::record::header())?
                }
                _ => crate::results::runs::check_header(&path, &samples::HEADER)?,
            }
        }
        match durable::end_on_a_whole_row(&path)? {
            Tail::Whole => {}
            Tail::Removed { header: true, .. } => eprintln!(
                "resume: {} held only part of its header; it is written again",
                path.display()
            ),
            Tail::Removed { text, .. } => eprintln!(
                "resume: the last row of {} was unfinished (a crash, a full disk or an edit \
                 left it without its newline); removed it, its case runs again: `{}`",
                path.display(),
                text.trim_end()
            ),
        }
    }
    Ok(())
}

/// First Ctrl-C: finish cleanly after the current repetition. Second: exit at once (rows
/// already written are on disk either way, since every row is flushed). SIGTERM and SIGHUP
/// do the same (ctrlc's `termination`), except that a SIGHUP ignored when
/// the sweep started (`nohup`) stays ignored.
fn install_interrupt_handler() {
    #[cfg(unix)]
    let hangup_ignored = {
        // SAFETY: reads the current disposition only (no new action is installed).
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        let read = unsafe { libc::sigaction(libc::SIGHUP, std::ptr::null(), &mut old) };
        read == 0 && old.sa_sigaction == libc::SIG_IGN
    };
    let _ = ctrlc::set_handler(|| {
        if INTERRUPTED.swap(true, Ordering::SeqCst) {
            eprintln!("\ninterrupted again: exiting now");
            std::process::exit(130);
        }
        eprintln!(
            "\ninterrupt: stopping after the current repetition (press Ctrl-C again to quit now)"
        );
    });
    #[cfg(unix)]
    if hangup_ignored {
        // SAFETY: restores the ignore disposition nohup set; no handler code is involved.
        unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) };
    }
}

/// Progress on stderr: an indicatif bar (case i/N, current case, ETA) on a terminal, plain
/// lines otherwise (CI logs, pipes).
struct Progress {
    bar: Option<ProgressBar>,
    total: usize,
    /// False on MPI ranks other than 0: they print nothing.
    shown: bool,
}

impl Progress {
    fn new(total: usize, shown: bool) -> Progress {
        let bar = (shown && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::new(total as u64);
            let style = ProgressStyle::with_template(
                "{bar:30.cyan/blue} {pos}/{len} [{elapsed_precise} eta {eta}] {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Progress { bar, total, shown }
    }

    /// The cases about to run (more than one when they are timed interleaved).
    fn start(&mut self, _i: usize, cases: &[&Case]) {
        if let (Some(bar), Some(first)) = (&self.bar, cases.first()) {
            let more = match cases.len() {
                0 | 1 => String::new(),
                n => format!(" and {} more, interleaved", n - 1),
            };
            bar.set_message(format!("{}{more}", first.id()));
        }
    }

    fn finish(&mut self, i: usize, r: &Record) {
        if !self.shown {
            return;
        }
        let time = r.time_median_s.map_or(String::new(), units::seconds_3dp);
        match &self.bar {
            Some(bar) => {
                bar.inc(1);
                if r.status.name() != "ok" {
                    bar.println(format!("{}: {} ({})", r.case_id, r.status, r.reason));
                }
            }
            None => {
                let mut line = format!("[{}/{}] {} {}", i + 1, self.total, r.case_id, r.status);
                if !time.is_empty() {
                    line += &format!(" {time}");
                }
                if !r.reason.is_empty() {
                    line += &format!(" ({})", r.reason);
                }
                eprintln!("{line}");
            }
        }
    }

    fn done(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::differing_keys;
    use serde_json::json;

    #[test]
    fn differing_keys_name_each_changed_key_of_each_section() {
        let first =
            json!({"run": {"name": "r", "max_reps": 5}, "axes": {"seq_len": [1, 2]}, "zip": []});
        assert!(differing_keys(&first, &first).is_empty());
        let now = json!({"run": {"name": "r", "max_reps": 9, "interleave": true}, "axes": {"seq_len": [1, 2]}, "zip": [1]});
        assert_eq!(
            differing_keys(&first, &now),
            ["run.interleave", "run.max_reps", "zip"]
        );
    }
}
