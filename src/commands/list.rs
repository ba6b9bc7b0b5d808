//! `attnbench list`: the variant registry, the devices found on this machine, the dtypes.

use clap::Args;

use crate::backend::cpu::cache;
use crate::backend::cpu::isa::{Isa, PathChoice};
use crate::backend::cpu::tiles::ReadPath;
use crate::problem::VariantId;
use crate::problem::{DType, Mode};
use crate::run::cuda_unavailable_reason;
use crate::variant::Registry;

#[derive(Args, Debug)]
pub struct ListArgs {
    /// Print only the CPU kernel path this machine runs by default (amx-bf16, avx512-bf16,
    /// avx512, avx2 or portable; measured, see `cpu kernel path choice`), e.g. to pick the CI
    /// baseline measured on the same path.
    #[arg(long)]
    pub kernel_path: bool,
    /// Print only this machine's key: CPU vendor, family, model and kernel path (e.g.
    /// intel-6-85-avx512), the name of its CI baseline directory.
    #[arg(long, conflicts_with = "kernel_path")]
    pub machine_key: bool,
}

pub fn command(a: &ListArgs) -> crate::error::Result<()> {
    // Under mpirun, rank 0 speaks for all.
    if crate::dist::is_root() {
        if a.kernel_path {
            println!("{}", Isa::detect().name());
        } else if a.machine_key {
            println!("{}", crate::results::meta::machine_key());
        } else {
            print!("{}", list());
        }
    }
    Ok(())
}

pub fn list() -> String {
    let mut s = String::from("variants:\n");
    let width = VariantId::ALL
        .iter()
        .map(|v| v.name().len())
        .max()
        .unwrap_or(0);
    for v in VariantId::ALL {
        let i = v.info();
        let chunk = |c: Option<usize>| c.map_or("-".to_string(), |c| c.to_string());
        let modes: Vec<&str> = i.modes.iter().map(|m| m.name()).collect();
        s += &format!(
            "  {:<width$}  {}\n  {:<width$}  modes: {}; default q_chunk {}, kv_chunk {}; source: {}\n",
            i.name,
            i.description,
            "",
            modes.join(", "),
            chunk(i.default_q_chunk),
            chunk(i.default_kv_chunk),
            i.source
        );
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    s += &format!("\ndevices:\n  cpu   available: {model}, {cpus} logical CPUs\n");
    s += &match (cuda_unavailable_reason(), crate::backend::cuda::gpu_info()) {
        (Some(why), _) => format!("  cuda  unavailable: {why}\n"),
        (None, Some(g)) => format!(
            "  cuda  available: {} (compute capability {}, driver {}, NVRTC {})\n",
            g.name,
            g.compute_capability,
            g.driver_version.as_deref().unwrap_or("?"),
            g.nvrtc_version.as_deref().unwrap_or("?")
        ),
        (None, None) => "  cuda  available\n".to_string(),
    };
    let gpu: Vec<&str> = VariantId::ALL
        .iter()
        .filter(|v| v.get().cuda().is_some())
        .map(|v| v.name())
        .collect();
    s += &format!(
        "  cuda variants: {} (mode fwd/decode; flash and flash-decoding: head_dim 64, 128)\n",
        gpu.join(", ")
    );
    let paths: Vec<String> = Isa::ALL
        .iter()
        .map(|i| {
            let state = if *i == Isa::detect() {
                "default"
            } else if i.available() {
                "available"
            } else {
                "not available"
            };
            format!("{} ({state})", i.name())
        })
        .collect();
    s += &format!(
        "  cpu kernel paths: {} (a case forces one with kernel_path / --kernel-path)\n",
        paths.join(", ")
    );
    s += &format!(
        "  cpu kernel path choice: {}\n",
        PathChoice::of_this_cpu().summary()
    );
    let known = if cache::sizes_known() {
        ""
    } else {
        ", assumed: not readable here"
    };
    s += &format!(
        "  cpu caches: L2 {} KiB per core, L3 {} MiB{known} (naive and rabe-staats, rows per pass over 4096 f32 keys: {} at d = 64, {} at d = 128)\n",
        cache::l2_bytes() >> 10,
        cache::l3_bytes() >> 20,
        cache::pass_rows(4096, ReadPath::F32.kv_bytes(64, false)),
        cache::pass_rows(4096, ReadPath::F32.kv_bytes(128, false)),
    );
    s += &format!(
        "  cpu decode loop (measured now, d = {}): {}\n",
        crate::backend::cpu::decode_path::PROBE_HEAD_DIM,
        crate::backend::cpu::decode_path::measure().summary()
    );
    s += &format!(
        "  mpi   {}\n",
        match (cfg!(feature = "mpi"), crate::dist::active()) {
            (_, true) => format!(
                "active: rank {} of {}",
                crate::dist::rank(),
                crate::dist::size()
            ),
            (true, false) => "built in; the -mpi variants run under `mpirun -np P` with devices = P (docs/guide/mpi.md)".to_string(),
            (false, false) => crate::dist::unavailable(1).unwrap_or_default(),
        }
    );
    s += "\ndtypes (storage of Q, K, V; compute accumulates in f32, output f32):\n";
    for d in DType::ALL {
        s += &format!(
            "  {:<5} {} bytes, error tolerance {:.0e}\n",
            d.name(),
            d.size_bytes(),
            d.tolerance()
        );
    }
    s += "precision of P for PV (`precision` / --precision): fast (default; bf16 P on the avx512-bf16 path, and in flash on amx-bf16), highest (P in f32)\n";
    let modes: Vec<&str> = Mode::ALL.iter().map(|m| m.name()).collect();
    s += &format!(
        "\nmodes: {} (a variant lacking a mode gives skipped rows; see each variant's modes)\n",
        modes.join(", ")
    );
    s
}
