//! `attnbench reproduce [PAPER ...] [--quick]`: regenerates every reproduced paper table
//! from its config (`TABLES`, the one registry of them), its cases timed interleaved,
//! into `results/papers/<paper>/<table>/`, then prints every claim of docs/papers.md with
//! the paper's figure, ours and a verdict, and writes them to `<paper>/claims.md`.
//! `--quick` judges the same claims with one timed call per case and the smaller sizes
//! they need (CI runs it). A table that needs a GPU or MPI ranks (`Needs`) is skipped with
//! the reason where this process cannot run it; under `mpirun`, only the tables on ranks
//! run. `--table` measures only the tables named and judges the rest from their rows. Exit
//! 3 when a claim fails or lacks its rows. Cost: the sweeps.

use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};

use super::generate::{
    gather_generate_ranks, measure_generate_ranks, report_generate, reproduce_generate,
};
use super::softmax::{report_softmax, reproduce_softmax};
use super::sweep::{sweep, SweepArgs};
use crate::backend::cpu::isa::Isa;
use crate::error::{Error, Result};
use crate::report::checks::{Check, Verdict};
use crate::report::claims::{claims, markdown};
use crate::report::generate::generate;
use crate::report::plot::Format;
use crate::results::durable::write_atomic;
use crate::results::meta::Meta;
use crate::results::softmax;
use crate::results::{CSV_NAME, META_NAME};

/// A paper whose tables attnbench reproduces (docs/papers.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum Paper {
    /// Rabe & Staats, Tables 2 and 3.
    RabeStaats,
    /// Liu & Abbeel (Blockwise Parallel Transformer), Tables 2, 3 and 4.
    Bpt,
    /// Shyam et al. (Tree Attention), Sec. 6, Tables 1-2, and the striped-vs-ring claim.
    TreeAttention,
    /// The blog "Transformers Inference Optimization Toolset": its softmax claims.
    Blog,
}

impl Paper {
    pub fn name(self) -> &'static str {
        match self {
            Paper::RabeStaats => "rabe-staats",
            Paper::Bpt => "bpt",
            Paper::TreeAttention => "tree-attention",
            Paper::Blog => "blog",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Paper::RabeStaats => "Rabe & Staats, \"Self-attention does not need O(n²) memory\"",
            Paper::Bpt => {
                "Liu & Abbeel, \"Blockwise Parallel Transformer for Large Context Models\""
            }
            Paper::TreeAttention => {
                "Shyam et al., \"Tree Attention\" (and the blog's striped-vs-ring claim)"
            }
            Paper::Blog => {
                "\"Transformers Inference Optimization Toolset\" (blog): online softmax and FlashAttention IO"
            }
        }
    }
}

/// One reproduced table: where it goes and what measures it.
pub struct Table {
    pub paper: Paper,
    /// The directory under `<out>/<paper>/`.
    pub name: &'static str,
    pub title: &'static str,
    pub source: Source,
    /// What it needs beyond this CPU; without it the table is skipped, with the reason.
    pub needs: Needs,
}

/// What a table needs beyond this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    Cpu,
    /// An NVIDIA GPU and a build with the `cuda` feature.
    Gpu,
    /// A build with the `mpi` feature and `mpirun` on the PATH.
    Mpi,
}

impl Needs {
    /// What a table with these needs runs on, in words.
    fn describe(self) -> &'static str {
        match self {
            Needs::Cpu => "this CPU only",
            Needs::Gpu => "an NVIDIA GPU and a build with `--features cuda` (docs/guide/gpu.md)",
            Needs::Mpi => "`mpirun` and a build with `--features mpi` (docs/guide/mpi.md)",
        }
    }

    /// Why this process cannot run such a table, if it cannot.
    pub fn unavailable(self) -> Option<String> {
        match self {
            Needs::Cpu => None,
            Needs::Gpu => crate::run::cuda_unavailable_reason(),
            Needs::Mpi if !cfg!(feature = "mpi") => Some(
                "this attnbench was built without the `mpi` feature (cargo build --release --features mpi; docs/guide/mpi.md)".into(),
            ),
            Needs::Mpi => (!on_path(MPIRUN)).then(|| {
                format!("no `{MPIRUN}` on the PATH (Open MPI or MPICH; docs/guide/mpi.md)")
            }),
        }
    }
}

/// The launcher of the tables on MPI ranks.
const MPIRUN: &str = "mpirun";

/// Whether an executable `name` is in a directory of the PATH.
fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(name).is_file()))
}

/// What measures a table.
pub enum Source {
    /// A sweep of a config.
    Sweep {
        config: &'static str,
        /// `--set` overrides of the full run besides `run.interleave = true`.
        full: &'static [&'static str],
        /// `--set` overrides with `--quick`: the same claims, fewer calls, smaller sizes.
        quick: &'static [&'static str],
    },
    /// The blog's softmax passes, counted and timed (`commands::softmax`): 1M and 64M
    /// elements, 1M and 4M with `--quick`; and its FlashAttention IO claim, the HBM
    /// traffic of each loop order counted (`run::hbm_io`, the same grid either way).
    SoftmaxPasses,
    /// Tree Attention's Tables 1-2: prefill plus 10 decode steps of a tiny GQA model, ring
    /// against tree on simulated devices (`commands::generate`): prompts of 1K-8K, 1K and
    /// 2K with `--quick`.
    Generate,
    /// The same generations on real MPI ranks, one `mpirun` per p of `RANKS`
    /// (`run::generate_ranks`), each into `p<p>/`, then judged together.
    GenerateRanks,
}

/// The rank counts of the generations on MPI ranks: Table 2's two devices and Table 1's
/// four (ranks beyond the cores share them).
pub const RANKS: [usize; 2] = [2, 4];

/// One timed call per case, no calibration (no claim reads it) and 16 rows against the
/// f64 oracle (the error claims compare every value with `naive`'s).
const QUICK_RUN: [&str; 5] = [
    "run.warmup=0",
    "run.min_reps=1",
    "run.max_reps=1",
    "run.calibrate=false",
    "run.error_rows=16",
];

/// Every table `reproduce` regenerates, in the order of docs/papers.md.
pub const TABLES: [Table; 10] = [
    Table {
        paper: Paper::RabeStaats,
        name: "table2",
        title: "Table 2, inference",
        source: Source::Sweep {
            config: "configs/rabe_staats_table2.toml",
            // naive and rabe-staats of one n in turn, so their relative speed is interleaved.
            full: &["run.innermost=variant"],
            // Every n of the paper: n >= 2^16 timed on one query chunk and scaled (their
            // memory is counted in full), the 2^14 claims timed whole.
            quick: &[
                "run.innermost=variant",
                "run.extrapolate_above_s=8",
                "run.extrapolate_q_chunks=1",
            ],
        },
        needs: Needs::Cpu,
    },
    Table {
        paper: Paper::RabeStaats,
        name: "table2_gpu",
        title: "Table 2, inference, on an NVIDIA GPU",
        source: Source::Sweep {
            config: "configs/rabe_staats_table2_gpu.toml",
            full: &["run.innermost=variant"],
            quick: &["run.innermost=variant"],
        },
        needs: Needs::Gpu,
    },
    Table {
        paper: Paper::RabeStaats,
        name: "table3",
        title: "Table 3, differentiation",
        source: Source::Sweep {
            config: "configs/rabe_staats_table3.toml",
            full: &["run.innermost=variant"],
            quick: &[
                "run.innermost=variant",
                "seq_len=256,1024,4096,16384,65536",
                "run.extrapolate_above_s=8",
                "run.extrapolate_q_chunks=1",
            ],
        },
        needs: Needs::Cpu,
    },
    Table {
        paper: Paper::Bpt,
        name: "max_context",
        title: "Table 2, largest context under a budget",
        source: Source::Sweep {
            config: "configs/bpt_max_context.toml",
            full: &[],
            // The rule's limits (memory-efficient 512, BPT 1024) and the sweep to 4x it.
            quick: &["seq_len=256,512,1024,2048,4096,8192", "q_chunk=64,256"],
        },
        needs: Needs::Cpu,
    },
    Table {
        paper: Paper::Bpt,
        name: "memory",
        title: "Table 3, activation memory against context",
        source: Source::Sweep {
            config: "configs/bpt_memory.toml",
            full: &[],
            quick: &["seq_len=1024,2048,4096,8192"],
        },
        needs: Needs::Cpu,
    },
    Table {
        paper: Paper::Bpt,
        name: "throughput",
        title: "Table 4, throughput",
        source: Source::Sweep {
            config: "configs/bpt_throughput.toml",
            full: &[],
            quick: &["seq_len=1024,2048,4096", "q_chunk=512"],
        },
        needs: Needs::Cpu,
    },
    Table {
        paper: Paper::TreeAttention,
        name: "tree_vs_ring",
        title: "Sec. 6, tree against ring decoding",
        source: Source::Sweep {
            config: "configs/tree_vs_ring.toml",
            full: &[],
            quick: &["seq_kv=16000"],
        },
        needs: Needs::Cpu,
    },
    Table {
        paper: Paper::TreeAttention,
        name: "generate",
        title: "Tables 1-2, prefill plus a 10-token decode, ring against tree",
        source: Source::Generate,
        needs: Needs::Cpu,
    },
    Table {
        paper: Paper::TreeAttention,
        name: "generate_ranks",
        title: "Tables 1-2 on MPI ranks, prefill plus a 10-token decode, ring against tree",
        source: Source::GenerateRanks,
        needs: Needs::Mpi,
    },
    Table {
        paper: Paper::Blog,
        name: "softmax",
        title: "online softmax and FlashAttention IO: memory accesses, overflow, timings",
        source: Source::SoftmaxPasses,
        needs: Needs::Cpu,
    },
];

#[derive(Clone, Debug, Args)]
pub struct ReproduceArgs {
    /// The papers to reproduce [default: all of them].
    #[arg(value_enum, value_name = "PAPER")]
    pub papers: Vec<Paper>,
    /// Judge the same claims in a few minutes: one timed call per case, no calibration, and
    /// only the sizes the claims need (the CI runs this).
    #[arg(long)]
    pub quick: bool,
    /// Output directory, one subdirectory per paper and table [default: results/papers,
    /// with --quick results/papers-quick].
    #[arg(long, short = 'o', value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Replace the results already there (each table as `sweep --force`).
    #[arg(long, conflicts_with_all = ["resume", "report_only"])]
    pub force: bool,
    /// Continue an interrupted reproduction: finished tables keep their rows, the
    /// interrupted one resumes, the rest run.
    #[arg(long, conflicts_with = "report_only")]
    pub resume: bool,
    /// Measure nothing: rebuild each table's report and the claims from the rows already
    /// there.
    #[arg(long)]
    pub report_only: bool,
    /// Measure only this table of the chosen papers (its directory name, e.g. table2_gpu;
    /// repeatable); the others are judged from the rows already there, as --report-only.
    #[arg(long = "table", value_name = "TABLE")]
    pub tables: Vec<String>,
    /// Run every CPU case on this kernel path (one this CPU runs, `attnbench list`), as
    /// `sweep --kernel-path` [default: this CPU's measured choice].
    #[arg(long, value_name = "PATH", value_parser = Isa::parse_available)]
    pub kernel_path: Option<Isa>,
    /// Print the tables, their configs and the sweep each would run, run nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// The claims of one table after its run, or why it did not run.
struct Judged<'a> {
    table: &'a Table,
    dir: PathBuf,
    checks: Vec<Check>,
    skipped: Option<String>,
}

/// The `reproduce` command: 0 when every claim holds (PASS or TREND), 3 otherwise.
pub fn command(a: &ReproduceArgs) -> Result<i32> {
    let out = a.out.clone().unwrap_or_else(|| {
        PathBuf::from(if a.quick {
            "results/papers-quick"
        } else {
            "results/papers"
        })
    });
    let tables: Vec<&Table> = TABLES
        .iter()
        .filter(|t| a.papers.is_empty() || a.papers.contains(&t.paper))
        .collect();
    if crate::dist::active() {
        return on_ranks(a, &out, &tables);
    }
    if let Some(bad) = a
        .tables
        .iter()
        .find(|n| !tables.iter().any(|t| t.name == n.as_str()))
    {
        return Err(Error::Usage(format!(
            "--table {bad}: not a table of {}; they are: {}",
            if a.papers.is_empty() {
                "any paper".to_string()
            } else {
                "the papers named".to_string()
            },
            tables
                .iter()
                .map(|t| format!("{} ({})", t.name, t.paper.name()))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    // Tables left out by --table are judged from their rows.
    let judge_only = ReproduceArgs {
        report_only: true,
        force: false,
        resume: false,
        ..a.clone()
    };
    let args_of = |t: &Table| -> &ReproduceArgs {
        if a.tables.is_empty() || a.tables.iter().any(|n| n == t.name) {
            a
        } else {
            &judge_only
        }
    };
    for t in &tables {
        if let Source::Sweep { config, .. } = t.source {
            if !Path::new(config).is_file() {
                return Err(Error::Usage(format!(
                    "{config}: not found; run `reproduce` from the attnbench checkout (its configs/ hold the papers' tables)"
                )));
            }
        }
    }
    if a.dry_run {
        for t in tables.iter().filter(|t| !args_of(t).report_only) {
            let dir = table_dir(&out, t);
            match t.source {
                Source::Sweep { config, .. } => println!(
                    "{} {}: {} sweep --config {config} --out {} {}",
                    t.paper.name(),
                    t.name,
                    super::this_program(),
                    dir.display(),
                    sets(t, a.quick)
                        .iter()
                        .map(|s| format!("--set {s}"))
                        .chain(a.kernel_path.map(|p| format!("--kernel-path {p}")))
                        .collect::<Vec<_>>()
                        .join(" ")
                ),
                Source::SoftmaxPasses => println!(
                    "{} {}: naive, safe and online softmax counted and timed ({} elements), FlashAttention loop orders' HBM traffic counted, into {}",
                    t.paper.name(),
                    t.name,
                    crate::run::softmax::lengths(a.quick)
                        .map(|n| format!("{}M", n / 1_000_000))
                        .join(" and "),
                    dir.display()
                ),
                Source::Generate => println!(
                    "{} {}: a tiny GQA model's prefill and {} decode steps, ring against tree on {:?} simulated devices, N = {:?}, into {}",
                    t.paper.name(),
                    t.name,
                    crate::run::generate::STEPS,
                    crate::run::generate::DEVICES,
                    crate::run::generate::tokens(a.quick),
                    dir.display()
                ),
                Source::GenerateRanks => {
                    for p in RANKS {
                        println!(
                            "{} {}: {}",
                            t.paper.name(),
                            t.name,
                            rank_command(a, p, &out)
                                .iter()
                                .map(|w| super::shell_quote(w))
                                .collect::<Vec<_>>()
                                .join(" ")
                        );
                    }
                }
            }
            if let Some(why) = t.needs.unavailable() {
                println!("  (skipped here: {why})");
            }
        }
        return Ok(0);
    }
    let mut judged = Vec::new();
    for (i, t) in tables.iter().enumerate() {
        let a = args_of(t);
        let dir = table_dir(&out, t);
        eprintln!(
            "[{}/{}] {} {} ({}) -> {}",
            i + 1,
            tables.len(),
            t.paper.name(),
            t.name,
            t.title,
            dir.display()
        );
        let skipped = if a.report_only {
            (!has_rows(t, &dir) && (t.needs != Needs::Cpu || !a.tables.is_empty()))
                .then(|| format!("no rows in {}", dir.display()))
        } else {
            t.needs.unavailable()
        };
        if let Some(why) = skipped {
            eprintln!("  skipped: {why}");
            judged.push(Judged {
                table: t,
                checks: Vec::new(),
                dir,
                skipped: Some(why),
            });
            continue;
        }
        let checks = match t.source {
            Source::Sweep { config, .. } => {
                sweep_table(a, t, config, &dir, &out)?;
                claims(&dir)?
            }
            Source::SoftmaxPasses => softmax_table(a, &dir)?,
            Source::Generate => generate_table(a, &dir)?,
            Source::GenerateRanks => generate_ranks_table(a, &dir, &out)?,
        };
        judged.push(Judged {
            table: t,
            checks,
            dir,
            skipped: None,
        });
    }
    let mut papers: Vec<Paper> = tables.iter().map(|t| t.paper).collect();
    papers.dedup();
    for p in papers {
        let of: Vec<&Judged> = judged.iter().filter(|j| j.table.paper == p).collect();
        let path = out.join(p.name()).join(CLAIMS_MD);
        write_atomic(&path, claims_md(p, &of, &out)?.as_bytes())?;
        eprintln!("wrote {}", path.display());
    }
    print!("{}", summary(&judged));
    let broken = judged
        .iter()
        .flat_map(|j| &j.checks)
        .filter(|c| matches!(c.verdict, Verdict::Fail | Verdict::NotApplicable))
        .count();
    if broken > 0 {
        eprintln!("{broken} claim(s) failed or lacked the rows they need (FAIL, n/a above)");
        return Ok(3);
    }
    Ok(0)
}

/// One sweep table: its sweep (or, with `--report-only`, its report again).
fn sweep_table(a: &ReproduceArgs, t: &Table, config: &str, dir: &Path, out: &Path) -> Result<()> {
    if a.report_only {
        generate(dir, None, &[Format::Png, Format::Svg], None)?;
        return Ok(());
    }
    let resume = a.resume && dir.join(CSV_NAME).is_file();
    sweep(&SweepArgs {
        config: PathBuf::from(config),
        out: Some(dir.to_path_buf()),
        sets: sets(t, a.quick),
        kernel_path: a.kernel_path,
        dry_run: false,
        json: false,
        resume,
        force: a.force,
        no_report: false,
        mpi_timeout: crate::dist::DEFAULT_TIMEOUT_S,
        mpi_test_fault: None,
    })
    .map_err(|e| match e {
        // The sweep names its own resume; this one continues every table.
        Error::Interrupted(msg) => Error::Interrupted(format!(
            "{msg}; or continue the reproduction with `{}`",
            resume_command(a, out)
        )),
        e => e,
    })
}

/// The softmax table: measured into `dir`, or with `--report-only` (and `--resume` where
/// it finished) `softmax.md` again from `softmax.csv`; its checks.
fn softmax_table(a: &ReproduceArgs, dir: &Path) -> Result<Vec<Check>> {
    if keeps_rows(a, dir, softmax::CSV)? {
        return report_softmax(dir);
    }
    reproduce_softmax(dir, a.quick)
}

/// The generation table: measured into `dir`, or with `--report-only` (and `--resume`
/// where it finished) `generate.md` again from `generate.csv`; its checks.
fn generate_table(a: &ReproduceArgs, dir: &Path) -> Result<Vec<Check>> {
    if keeps_rows(a, dir, crate::results::generate::CSV)? {
        return report_generate(dir);
    }
    reproduce_generate(dir, a.quick)
}

/// Whether a table's rows are in `dir` (for `--report-only`).
fn has_rows(t: &Table, dir: &Path) -> bool {
    let name = match t.source {
        Source::Sweep { .. } => CSV_NAME,
        Source::SoftmaxPasses => softmax::CSV,
        Source::Generate | Source::GenerateRanks => crate::results::generate::CSV,
    };
    dir.join(name).is_file()
}

/// Open MPI's settings for the ranks `reproduce` starts, unless the user set them: more
/// ranks than cores (4 on a 2-core machine), and running as root (containers). MPICH
/// ignores them.
const OPEN_MPI_ENV: [(&str, &str); 3] = [
    ("OMPI_MCA_rmaps_base_oversubscribe", "1"),
    ("OMPI_ALLOW_RUN_AS_ROOT", "1"),
    ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
];

/// The `mpirun` command line of the generations on `p` ranks: this program's
/// `reproduce tree-attention` under it, with `a`'s flags.
fn rank_command(a: &ReproduceArgs, p: usize, out: &Path) -> Vec<String> {
    let exe = std::env::current_exe()
        .map_or_else(|_| "attnbench".into(), |e| e.to_string_lossy().into_owned());
    let mut v: Vec<String> = [MPIRUN, "-np", &p.to_string(), &exe, "reproduce"]
        .map(String::from)
        .into();
    v.push(Paper::TreeAttention.name().into());
    v.extend(["--out".into(), out.to_string_lossy().into_owned()]);
    for (on, flag) in [
        (a.quick, "--quick"),
        (a.force, "--force"),
        (a.resume, "--resume"),
    ] {
        if on {
            v.push(flag.into());
        }
    }
    if let Some(k) = a.kernel_path {
        v.extend(["--kernel-path".into(), k.to_string()]);
    }
    v
}

/// The generations on MPI ranks: one `mpirun` per p of `RANKS` (its rank 0 writes
/// `p<p>/generate.csv`), then every p's rows in `generate.csv` and `generate.md`; with
/// `--report-only` (or `--resume` where it finished) the report again from the rows.
fn generate_ranks_table(a: &ReproduceArgs, dir: &Path, out: &Path) -> Result<Vec<Check>> {
    if keeps_rows(a, dir, crate::results::generate::CSV)? {
        return report_generate(dir);
    }
    for p in RANKS {
        if a.resume
            && dir
                .join(format!("p{p}"))
                .join(crate::results::generate::CSV)
                .is_file()
        {
            continue;
        }
        let cmd = rank_command(a, p, out);
        let shown = cmd
            .iter()
            .map(|w| super::shell_quote(w))
            .collect::<Vec<_>>()
            .join(" ");
        eprintln!("  {shown}");
        let mut c = std::process::Command::new(&cmd[0]);
        c.args(&cmd[1..]);
        for (k, v) in OPEN_MPI_ENV {
            if std::env::var_os(k).is_none() {
                c.env(k, v);
            }
        }
        let status = c
            .status()
            .map_err(|e| Error::io(format!("starting `{shown}`"), e))?;
        if crate::run::INTERRUPTED.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Error::Interrupted(format!(
                "`{shown}` stopped by a signal; continue with `{}`",
                resume_command(a, out)
            )));
        }
        if !status.success() {
            return Err(Error::Runtime(format!("`{shown}` failed ({status})")));
        }
    }
    gather_generate_ranks(dir, &RANKS)
}

/// Under `mpirun`: this rank's part of the tables on MPI ranks among `tables` (rank 0
/// writes them into `p<ranks>/`); the others run without `mpirun`.
fn on_ranks(a: &ReproduceArgs, out: &Path, tables: &[&Table]) -> Result<i32> {
    let mine: Vec<&Table> = tables
        .iter()
        .copied()
        .filter(|t| t.needs == Needs::Mpi)
        .collect();
    if mine.is_empty() || a.report_only || a.dry_run {
        return Err(Error::Usage(format!(
            "under {MPIRUN}, `reproduce` measures only the tables on MPI ranks ({}): name that paper, and run --report-only, --dry-run and the other tables without {MPIRUN}",
            TABLES
                .iter()
                .filter(|t| t.needs == Needs::Mpi)
                .map(|t| format!("{} {}", t.paper.name(), t.name))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    for t in mine {
        let dir = table_dir(out, t).join(format!("p{}", crate::dist::size()));
        // `--report-only` was refused above: rows kept means a finished p to skip.
        if !keeps_rows(a, &dir, crate::results::generate::CSV)? {
            measure_generate_ranks(&dir, a.quick)?;
        }
    }
    Ok(0)
}

/// Whether a table measured by its own code (not a sweep) keeps the rows `csv` in `dir`
/// and is judged from them: with `--report-only`, or `--resume` where they are there.
/// Otherwise it is measured, unless rows are there without `--force` (refused, as
/// `sweep` refuses them).
fn keeps_rows(a: &ReproduceArgs, dir: &Path, csv: &str) -> Result<bool> {
    let held = dir.join(csv).is_file();
    if a.report_only || (a.resume && held) {
        return Ok(true);
    }
    if held && !a.force {
        return Err(Error::Usage(format!(
            "output directory {} holds results: pass --resume to keep them, --force to replace them, or --out for another directory",
            dir.display()
        )));
    }
    Ok(false)
}

/// The command line that continues `a` where it stopped.
fn resume_command(a: &ReproduceArgs, out: &Path) -> String {
    let mut v = vec![super::this_program(), "reproduce".to_string()];
    v.extend(a.papers.iter().map(|p| p.name().to_string()));
    if a.quick {
        v.push("--quick".into());
    }
    if let Some(p) = a.kernel_path {
        v.push(format!("--kernel-path {p}"));
    }
    v.extend(a.tables.iter().map(|t| format!("--table {t}")));
    v.push(format!(
        "--out {} --resume",
        super::shell_quote(&out.to_string_lossy())
    ));
    v.join(" ")
}

/// Each paper's claims file.
pub const CLAIMS_MD: &str = "claims.md";

fn table_dir(out: &Path, t: &Table) -> PathBuf {
    out.join(t.paper.name()).join(t.name)
}

/// The `--set` overrides of a table's run.
fn sets(t: &Table, quick: bool) -> Vec<String> {
    let Source::Sweep {
        full, quick: fast, ..
    } = t.source
    else {
        return Vec::new();
    };
    let mut v = vec!["run.interleave=true".to_string()];
    if quick {
        v.extend(QUICK_RUN.iter().chain(fast).map(|s| s.to_string()));
    } else {
        v.extend(full.iter().map(|s| s.to_string()));
    }
    v
}

/// The terminal summary: one line per claim, table by table.
fn summary(judged: &[Judged]) -> String {
    let mut s = String::from("\nclaims:\n");
    for j in judged {
        s += &format!(
            "{} {} ({}):\n",
            j.table.paper.name(),
            j.table.name,
            j.table.title
        );
        if let Some(why) = &j.skipped {
            s += &format!("  skipped: {why}\n");
        }
        for c in &j.checks {
            s += &format!(
                "  {:<5}  {}: {} (paper: {})\n",
                c.verdict.to_string(),
                c.name,
                c.ours,
                c.paper
            );
        }
    }
    let count = |v: Verdict| {
        judged
            .iter()
            .flat_map(|j| &j.checks)
            .filter(|c| c.verdict == v)
            .count()
    };
    s += &format!(
        "{} PASS, {} FAIL, {} TREND, {} n/a",
        count(Verdict::Pass),
        count(Verdict::Fail),
        count(Verdict::Trend),
        count(Verdict::NotApplicable)
    );
    let skipped = judged.iter().filter(|j| j.skipped.is_some()).count();
    if skipped > 0 {
        s += &format!("; {skipped} table(s) skipped (not run here, see above)");
    }
    s + "\n"
}

/// `<paper>/claims.md`: per table, where its rows are, the build and machine that made
/// them, and its claims.
fn claims_md(paper: Paper, of: &[&Judged], out: &Path) -> Result<String> {
    let mut s = format!(
        "# {}: claims\n\nWritten by `attnbench reproduce` (module `src/commands/reproduce.rs`) \
         from each table's `runs.csv`. PASS and FAIL are judged exactly by the rule in the \
         paper column; TREND sets our figure beside one the paper measured on other \
         hardware, for its direction only; n/a means the run lacks the rows the claim \
         needs. How each claim is reproduced: docs/papers.md.\n",
        paper.title()
    );
    for j in of {
        let rel = j.dir.strip_prefix(out.join(paper.name())).unwrap_or(&j.dir);
        if j.skipped.is_some() {
            // The same words on every machine that lacks it (the reason is the terminal's).
            s += &format!(
                "\n## {} (`{}/`)\n\nNot run: no rows.{}\n",
                j.table.title,
                rel.display(),
                match j.table.needs {
                    Needs::Cpu => String::new(),
                    n => format!(" It needs {}.", n.describe()),
                }
            );
            continue;
        }
        let meta = Meta::read(&j.dir.join(META_NAME)).ok();
        let meta = meta.as_ref();
        s += &format!(
            "\n## {} (`{}/`)\n\n{}; built at {}{}, on {}.\n\n",
            j.table.title,
            rel.display(),
            match j.table.source {
                Source::Sweep { config, .. } => format!("Config `{config}`"),
                Source::SoftmaxPasses => {
                    "The softmax passes and the FlashAttention loop orders' counted IO (`src/commands/softmax.rs`)".into()
                }
                Source::Generate => "The generations (`src/commands/generate.rs`)".into(),
                Source::GenerateRanks => format!(
                    "The generations on {} MPI ranks (`src/commands/generate.rs`, `{MPIRUN} -np P attnbench reproduce tree-attention`)",
                    RANKS.map(|p| p.to_string()).join(" and ")
                ),
            },
            meta.and_then(|m| m.git_revision.as_deref()).map_or(
                "an unknown revision".to_string(),
                |r| format!("`{}`", &r[..r.len().min(12)])
            ),
            if meta.and_then(|m| m.git_dirty) == Some(true) {
                " (with uncommitted changes)"
            } else {
                ""
            },
            meta.and_then(|m| m.cpu_model.as_deref())
                .unwrap_or("an unknown CPU"),
        );
        s += &markdown(&j.checks);
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(papers: Vec<Paper>, quick: bool) -> ReproduceArgs {
        ReproduceArgs {
            papers,
            quick,
            out: None,
            force: false,
            resume: false,
            report_only: false,
            tables: Vec::new(),
            kernel_path: None,
            dry_run: false,
        }
    }

    #[test]
    fn every_table_interleaves_and_quick_adds_one_call_per_case() {
        for t in TABLES
            .iter()
            .filter(|t| matches!(t.source, Source::Sweep { .. }))
        {
            let Source::Sweep { quick: fast, .. } = t.source else {
                continue;
            };
            let full = sets(t, false);
            let quick = sets(t, true);
            assert_eq!(full[0], "run.interleave=true");
            assert_eq!(quick[0], "run.interleave=true");
            assert!(!full.iter().any(|s| s == "run.max_reps=1"), "{}", t.name);
            for s in QUICK_RUN.iter().chain(fast) {
                assert!(quick.contains(&s.to_string()), "{}: {s}", t.name);
            }
        }
        // Each paper has a table, and the table directories are distinct.
        for p in [
            Paper::RabeStaats,
            Paper::Bpt,
            Paper::TreeAttention,
            Paper::Blog,
        ] {
            assert!(TABLES.iter().any(|t| t.paper == p), "{p:?}");
        }
        let out = Path::new("o");
        let dirs: std::collections::BTreeSet<PathBuf> =
            TABLES.iter().map(|t| table_dir(out, t)).collect();
        assert_eq!(dirs.len(), TABLES.len());
    }

    /// A table this process cannot run is skipped with its reason on the terminal and the
    /// same words on every machine in `claims.md`; it is not a failed claim.
    #[test]
    fn a_table_this_machine_cannot_run_is_skipped_and_named() {
        assert_eq!(Needs::Cpu.unavailable(), None);
        if !cfg!(feature = "mpi") {
            let why = Needs::Mpi.unavailable().unwrap();
            assert!(why.contains("`mpi` feature"), "{why}");
        }
        if !cfg!(feature = "cuda") {
            assert!(Needs::Gpu.unavailable().is_some());
        }
        let t = TABLES.iter().find(|t| t.needs == Needs::Mpi).unwrap();
        let out = Path::new("o");
        let skipped = Judged {
            table: t,
            dir: table_dir(out, t),
            checks: Vec::new(),
            skipped: Some("no mpirun here".into()),
        };
        let s = summary(std::slice::from_ref(&skipped));
        assert!(s.contains("  skipped: no mpirun here\n"), "{s}");
        assert!(
            s.ends_with("0 n/a; 1 table(s) skipped (not run here, see above)\n"),
            "{s}"
        );
        let md = claims_md(t.paper, &[&skipped], out).unwrap();
        assert!(
            md.contains("(`generate_ranks/`)\n\nNot run: no rows. It needs `mpirun` and a build with `--features mpi`"),
            "{md}"
        );
        assert!(!md.contains("no mpirun here"), "{md}");
        // Every table a GPU or MPI ranks measure says so; the rest run on this CPU alone.
        for t in &TABLES {
            let expected = match t.source {
                Source::GenerateRanks => Needs::Mpi,
                Source::Sweep { config, .. } if config.ends_with("_gpu.toml") => Needs::Gpu,
                _ => Needs::Cpu,
            };
            assert_eq!(t.needs, expected, "{}", t.name);
        }
    }

    /// Each p of the ranks is this program's `reproduce tree-attention` under `mpirun`,
    /// with the head's output and flags.
    #[test]
    fn the_ranks_run_this_program_under_mpirun_with_the_same_flags() {
        let mut a = args(vec![Paper::TreeAttention], true);
        a.force = true;
        let c = rank_command(&a, 4, Path::new("my out"));
        assert_eq!(c[..3], ["mpirun", "-np", "4"]);
        assert_eq!(
            std::path::PathBuf::from(&c[3]),
            std::env::current_exe().unwrap()
        );
        assert_eq!(
            c[4..],
            [
                "reproduce",
                "tree-attention",
                "--out",
                "my out",
                "--quick",
                "--force"
            ]
        );
        a.force = false;
        a.resume = true;
        a.quick = false;
        let c = rank_command(&a, 2, Path::new("o"));
        assert_eq!(c[c.len() - 1], "--resume");
        assert!(!c.contains(&"--quick".to_string()));
    }

    #[test]
    fn an_interrupted_reproduction_names_the_command_that_continues_it() {
        let c = resume_command(&args(vec![Paper::Bpt], true), Path::new("my out"));
        assert!(
            c.ends_with(" reproduce bpt --quick --out 'my out' --resume"),
            "{c}"
        );
        let mut one = args(vec![Paper::RabeStaats], false);
        one.tables = vec!["table3".into()];
        let c = resume_command(&one, Path::new("o"));
        assert!(
            c.ends_with(" reproduce rabe-staats --table table3 --out o --resume"),
            "{c}"
        );
        let c = resume_command(&args(vec![], false), Path::new("results/papers"));
        assert!(
            c.ends_with(" reproduce --out results/papers --resume"),
            "{c}"
        );
    }
}
