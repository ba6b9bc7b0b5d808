//! NVRTC compilation of the embedded kernels (`plan::Kernel`): source = defines + common.cuh +
//! the kernel, compiled at run time for the device's real architecture (libnvrtc loaded
//! dynamically) to a CUBIN, so the driver loads machine code and never JIT-compiles PTX (a
//! toolkit newer than the driver would otherwise fail with an unsupported PTX version);
//! cached per (kernel, defines, architecture). A compile costs tens to hundreds of
//! milliseconds once; a cache hit is a map lookup.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::sync::{Mutex, OnceLock};

use cudarc::nvrtc::sys::{self as nv, nvrtcResult};
use cudarc::nvrtc::{compile_ptx_with_opts, result, CompileError, CompileOptions, Ptx};

use super::plan::{Defines, Kernel};

/// Why NVRTC cannot be used here, if so (the library is opened lazily; cudarc panics when it
/// is missing, so callers check this first).
pub fn nvrtc_missing() -> Option<String> {
    // SAFETY: only tries to open the shared library by its candidate names.
    let present = unsafe { nv::is_culib_present() };
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
    let r = unsafe { nv::nvrtcVersion(&mut major, &mut minor) };
    (r == nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
}

/// The options of every compile: exact f32 semantics (the error columns compare against an
/// f64 oracle), C++17, the architecture flag (`plan::arch_flag`).
fn options(arch: &str) -> Vec<String> {
    vec![
        "--ftz=false".into(),
        "--prec-div=true".into(),
        "--prec-sqrt=true".into(),
        "--fmad=true".into(),
        "--std=c++17".into(),
        arch.to_string(),
    ]
}

/// Compiles `kernel` with `defines` to PTX for architecture flag `arch` (the NVRTC check and
/// ptxas read it). The error carries NVRTC's log.
pub fn compile(kernel: Kernel, defines: &Defines, arch: &str) -> Result<Ptx, String> {
    if let Some(why) = nvrtc_missing() {
        return Err(why);
    }
    let opts = CompileOptions {
        options: options(arch),
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

/// Compiles `kernel` with `defines` to a CUBIN for the real architecture `arch`
/// (`--gpu-architecture=sm_XY`): NVRTC runs its own ptxas, so register and shared-memory
/// limits are checked here too.
pub fn compile_cubin(kernel: Kernel, defines: &Defines, arch: &str) -> Result<Vec<u8>, String> {
    if let Some(why) = nvrtc_missing() {
        return Err(why);
    }
    let fail = |what: &str| {
        format!(
            "NVRTC {what} for {} [{}]",
            kernel.file(),
            defines.describe()
        )
    };
    let src = CString::new(kernel.program(defines)).map_err(|_| fail("source has a NUL"))?;
    let name = CString::new(kernel.file()).map_err(|_| fail("name has a NUL"))?;
    let prog = result::create_program(&src, Some(&name))
        .map_err(|e| format!("{}: {e:?}", fail("create")))?;
    // SAFETY: `prog` is live until destroyed below; `src` and `name` outlive it.
    let out = unsafe {
        match result::compile_program(prog, &options(arch)) {
            Err(e) => {
                let log = result::get_program_log(prog)
                    .map(|l| CStr::from_ptr(l.as_ptr()).to_string_lossy().into_owned())
                    .unwrap_or_default();
                Err(format!(
                    "{} failed ({e:?}) with {arch}:\n{log}",
                    fail("compile")
                ))
            }
            Ok(()) => {
                let mut size = 0usize;
                if nv::nvrtcGetCUBINSize(prog, &mut size) != nvrtcResult::NVRTC_SUCCESS || size == 0
                {
                    Err(format!(
                        "{}: no CUBIN ({arch} must name a real architecture)",
                        fail("output")
                    ))
                } else {
                    let mut buf = vec![0u8; size];
                    if nv::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast())
                        == nvrtcResult::NVRTC_SUCCESS
                    {
                        Ok(buf)
                    } else {
                        Err(fail("nvrtcGetCUBIN"))
                    }
                }
            }
        }
    };
    // SAFETY: created above, destroyed once.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

type Key = (Kernel, Defines, String);

/// CUBIN per (kernel, defines, architecture), compiled on first use.
pub fn cached(kernel: Kernel, defines: &Defines, arch: &str) -> Result<Vec<u8>, String> {
    static CACHE: OnceLock<Mutex<HashMap<Key, Vec<u8>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let key = (kernel, defines.clone(), arch.to_string());
    if let Some(bin) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(bin.clone());
    }
    let bin = compile_cubin(kernel, defines, arch)?;
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, bin.clone());
    Ok(bin)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::plan::arch_flag;

    /// Every embedded kernel with every define set a launcher may request, for sm_80 and
    /// sm_90, to PTX and to CUBIN (NVRTC's own ptxas: resource limits are checked). Needs only libnvrtc (a CPU library: `pip install nvidia-cuda-nvrtc` and put its
    /// lib directory on LD_LIBRARY_PATH, see docs/internals/cuda-kernels.md); skips with the reason otherwise.
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
                    if let Err(e) = compile_cubin(kernel, &defines, &arch) {
                        failures.push(e);
                    }
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
            "NVRTC {:?}: {compiled} programs compiled to PTX and CUBIN{}",
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
    fn cache_returns_the_same_cubin() {
        if nvrtc_missing().is_some() {
            eprintln!("skipped: NVRTC not found");
            return;
        }
        let d = Kernel::Softmax.define_sets()[0].clone();
        let a = cached(Kernel::Softmax, &d, "--gpu-architecture=sm_90").unwrap();
        let b = cached(Kernel::Softmax, &d, "--gpu-architecture=sm_90").unwrap();
        // An ELF image (CUBIN), the same bytes from the cache.
        assert_eq!(&a[..4], b"\x7fELF");
        assert_eq!(a, b);
    }
}
