//! NVRTC compilation of the embedded kernels (`plan::Kernel`): source = defines + common.cuh +
//! the kernel, compiled at run time for the device's architecture (libnvrtc loaded
//! dynamically) and cached per (kernel, defines, architecture). A compile costs tens to
//! hundreds of milliseconds once; a cache hit is a map lookup.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions, Ptx};

use super::plan::{Defines, Kernel};

/// Why NVRTC cannot be used here, if so (the library is opened lazily; cudarc panics when it
/// is missing, so callers check this first).
pub fn nvrtc_missing() -> Option<String> {
    // SAFETY: only tries to open the shared library by its candidate names.
    let present = unsafe { cudarc::nvrtc::sys::is_culib_present() };
    (!present).then(|| {
        "NVRTC not found (libnvrtc.so.13 / libnvrtc.so: add the CUDA toolkit's lib64 to LD_LIBRARY_PATH)"
            .to_string()
    })
}

/// NVRTC's version (major, minor).
pub fn version() -> Option<(i32, i32)> {
    if nvrtc_missing().is_some() {
        return None;
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present (checked above); the call writes two ints.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    (r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
}

/// Compiles `kernel` with `defines` to PTX for architecture flag `arch`
/// (`plan::arch_flag`). The error carries NVRTC's log.
pub fn compile(kernel: Kernel, defines: &Defines, arch: &str) -> Result<Ptx, String> {
    if let Some(why) = nvrtc_missing() {
        return Err(why);
    }
    let opts = CompileOptions {
        // Exact f32 semantics: the error columns compare against an f64 oracle.
        ftz: Some(false),
        prec_div: Some(true),
        prec_sqrt: Some(true),
        fmad: Some(true),
        options: vec![arch.to_string(), "--std=c++17".to_string()],
        name: Some(kernel.file().to_string()),
        ..Default::default()
    };
    compile_ptx_with_opts(kernel.program(defines), opts).map_err(|e| describe(kernel, defines, e))
}

fn describe(kernel: Kernel, defines: &Defines, e: CompileError) -> String {
    match e {
        CompileError::CompileError { log, options, .. } => format!(
            "NVRTC failed on {} [{}] with {:?}:\n{}",
            kernel.file(),
            defines.describe(),
            options,
            log.to_string_lossy()
        ),
        other => format!(
            "NVRTC failed on {} [{}]: {other:?}",
            kernel.file(),
            defines.describe()
        ),
    }
}

type Key = (Kernel, Defines, String);

/// PTX per (kernel, defines, architecture), compiled on first use.
pub fn cached(kernel: Kernel, defines: &Defines, arch: &str) -> Result<Ptx, String> {
    static CACHE: OnceLock<Mutex<HashMap<Key, String>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let key = (kernel, defines.clone(), arch.to_string());
    if let Some(src) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(Ptx::from_src(src.clone()));
    }
    let ptx = compile(kernel, defines, arch)?;
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, ptx.to_src());
    Ok(ptx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::plan::arch_flag;

    /// Every embedded kernel with every define set a launcher may request, for sm_80 and
    /// sm_90. Needs only libnvrtc (a CPU library: `pip install nvidia-cuda-nvrtc` and put its
    /// lib directory on LD_LIBRARY_PATH, see README "GPU"); skips with the reason otherwise.
    /// With `ATTNBENCH_PTXAS` naming a ptxas binary, each PTX is also assembled for its
    /// architecture, which catches register and shared-memory overruns.
    #[test]
    fn every_kernel_compiles_for_sm80_and_sm90() {
        if let Some(why) = nvrtc_missing() {
            eprintln!("skipped: {why}");
            return;
        }
        let ptxas = std::env::var("ATTNBENCH_PTXAS").ok();
        let mut compiled = 0;
        let mut failures = Vec::new();
        for (major, minor) in [(8, 0), (9, 0)] {
            let arch = arch_flag(major, minor);
            for kernel in Kernel::ALL {
                for defines in kernel.define_sets() {
                    match compile(kernel, &defines, &arch) {
                        Ok(ptx) => {
                            let src = ptx.to_src();
                            for entry in kernel.entry_points() {
                                assert!(
                                    src.contains(&format!(".entry {entry}(")),
                                    "{} [{}] lacks entry {entry}",
                                    kernel.file(),
                                    defines.describe()
                                );
                            }
                            if let Some(p) = &ptxas {
                                if let Err(e) = assemble(p, &src, major, minor) {
                                    failures.push(format!(
                                        "ptxas sm_{major}{minor} {} [{}]: {e}",
                                        kernel.file(),
                                        defines.describe()
                                    ));
                                }
                            }
                            compiled += 1;
                        }
                        Err(e) => failures.push(e),
                    }
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
        let per_arch: usize = Kernel::ALL.iter().map(|k| k.define_sets().len()).sum();
        assert_eq!(compiled, 2 * per_arch);
        eprintln!(
            "NVRTC {:?}: {compiled} programs compiled{}",
            version(),
            if ptxas.is_some() {
                " and assembled by ptxas"
            } else {
                ""
            }
        );
    }

    /// Assembles `ptx` with ptxas for sm_{major}{minor}, printing its resource usage.
    fn assemble(ptxas: &str, ptx: &str, major: i32, minor: i32) -> Result<(), String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let src = dir.path().join("k.ptx");
        std::fs::write(&src, ptx).map_err(|e| e.to_string())?;
        let out = std::process::Command::new(ptxas)
            .arg(format!("-arch=sm_{major}{minor}"))
            .arg("-v")
            .arg("--warn-on-spills")
            .arg(&src)
            .arg("-o")
            .arg(dir.path().join("k.cubin"))
            .output()
            .map_err(|e| format!("cannot run {ptxas}: {e}"))?;
        let log = String::from_utf8_lossy(&out.stderr).to_string();
        eprintln!("{log}");
        if !out.status.success() {
            return Err(log);
        }
        Ok(())
    }

    #[test]
    fn cache_returns_the_same_ptx() {
        if nvrtc_missing().is_some() {
            eprintln!("skipped: NVRTC not found");
            return;
        }
        let d = Kernel::Softmax.define_sets()[0].clone();
        let a = cached(Kernel::Softmax, &d, "--gpu-architecture=sm_90").unwrap();
        let b = cached(Kernel::Softmax, &d, "--gpu-architecture=sm_90").unwrap();
        assert_eq!(a.to_src(), b.to_src());
    }
}
