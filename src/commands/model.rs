//! `attnbench model`: the papers' analytic models, no measurement (`crate::model`).

use clap::{Args, Subcommand};
use std::path::PathBuf;

use crate::config;

#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// BPT Sec. 3.1: activation memory per layer for vanilla, memory-efficient and BPT
    /// layers, a whole-model estimate, and the largest context that fits a device.
    BptMemory(BptMemoryArgs),
    /// Fit the α–β link model (latency α, bandwidth β) to measured MPI runs: reads the
    /// runs.csv of each DIR, prints predicted vs measured communication, writes fit.md and
    /// fit.json to --out.
    Fit(FitArgs),
}

#[derive(Debug, Args)]
pub struct FitArgs {
    /// Results directories of MPI sweeps (each holding runs.csv).
    #[arg(required = true, value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
    /// Write fit.md and fit.json here.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct BptMemoryArgs {
    /// A model of BPT's Table 1: gpt-1b, gpt-3b, gpt-7b, gpt-13b, gpt-30b, gpt-70b.
    #[arg(long)]
    pub model: String,
    /// Sequence lengths to tabulate (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "8192,16384,32768,65536,131072"
    )]
    pub seq_len: Vec<usize>,
    /// Memory of the device, e.g. 80GB (the paper's A100).
    #[arg(long, default_value = "80GB")]
    pub device_memory: String,
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Block size c of BPT (and of its blockwise loss).
    #[arg(long, default_value_t = 2048)]
    pub block: usize,
    /// Bytes per activation: 2 as Sec. 3.1 assumes, 4 for fp32 (the paper's GPU runs).
    #[arg(long, default_value_t = 4)]
    pub activation_bytes: usize,
}

pub fn command(m: &ModelCommand) -> crate::error::Result<()> {
    match m {
        ModelCommand::BptMemory(a) => bpt_memory(a),
        ModelCommand::Fit(a) => {
            print!("{}", crate::model::fit::run(&a.dirs, a.out.as_deref())?);
            Ok(())
        }
    }
}

fn bpt_memory(a: &BptMemoryArgs) -> crate::error::Result<()> {
    use crate::error::Error;
    use crate::model::bpt_memory::{GptShape, TABLE1};
    let model = GptShape::by_name(&a.model).ok_or_else(|| {
        let names: Vec<&str> = TABLE1.iter().map(|m| m.name).collect();
        Error::Usage(format!(
            "--model: unknown model `{}` (expected one of: {})",
            a.model,
            names.join(", ")
        ))
    })?;
    let device_bytes = a
        .device_memory
        .parse::<config::ByteSize>()
        .map_err(|e| Error::Usage(format!("--device-memory: {e}")))?
        .bytes();
    if device_bytes == 0 {
        return Err(Error::Usage(
            "--device-memory must be more than 0 bytes".into(),
        ));
    }
    if a.batch == 0
        || a.block == 0
        || a.seq_len.contains(&0)
        || !(a.activation_bytes == 2 || a.activation_bytes == 4)
    {
        return Err(Error::Usage(
            "--batch, --block and --seq-len must be at least 1; --activation-bytes is 2 or 4"
                .into(),
        ));
    }
    // A table cell holds whole bytes: a size past 2^64 would print saturated as a value.
    for &s in &a.seq_len {
        let most = crate::problem::Design::ALL
            .iter()
            .map(|&d| {
                crate::model::bpt_memory::model_memory(
                    &model,
                    d,
                    a.batch as f64,
                    s as f64,
                    a.block as f64,
                    a.activation_bytes as f64,
                )
                .total()
            })
            .fold(0.0, f64::max);
        if most >= u64::MAX as f64 {
            return Err(Error::Usage(format!(
                "--seq-len {s} with --batch {}: the model's memory at that length ({most:.3e} bytes) is past what 64-bit byte counts hold; give lengths whose memory is below 16 EiB",
                a.batch
            )));
        }
    }
    print!(
        "{}",
        crate::model::bpt_calculator::render(&crate::model::bpt_calculator::Query {
            model: &model,
            seq_lens: &a.seq_len,
            batch: a.batch,
            block: a.block,
            act_bytes: a.activation_bytes,
            device_bytes,
        })
    );
    Ok(())
}
