//! The kernels on CUDA devices: [`ggml_gpu::kernels`]'s program behind the CUDA prelude, compiled
//! with NVRTC for the device's compute capability and loaded per device ([`Kernels`]); `runner`
//! executes [`ggml_gpu::dispatch`]'s launches and GEMMs on a CUDA stream.

mod runner;

use crate::err;
use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};
use ggml_core::Result;
use ggml_gpu::dispatch::kernel_names;
use ggml_gpu::kernels::{program, Vendor};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// PTX of the program per compute capability, compiled once per process (devices of one
/// architecture share it; the driver caches the machine code it makes from it).
static PTX: Mutex<Vec<((i32, i32), String)>> = Mutex::new(Vec::new());

/// The PTX NVRTC makes of the program (the built-in one, or `GGML_TP_CUDA_PROGRAM`'s) for compute
/// capability `cc`; needs the NVRTC library, not a GPU (`cargo xtask ptxas` reads it).
pub fn ptx_for(cc: (i32, i32)) -> std::result::Result<String, String> {
    let mut cache = PTX.lock();
    if let Some((_, p)) = cache.iter().find(|(c, _)| *c == cc) {
        return Ok(p.clone());
    }
    let opts = CompileOptions {
        options: vec![format!("--gpu-architecture=compute_{}{}", cc.0, cc.1)],
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(program_text()?, opts)
        .map_err(|e| format!("NVRTC compile failed: {e:?}"))?
        .to_src();
    cache.push((cc, ptx.clone()));
    Ok(ptx)
}

/// The program NVRTC compiles: the built-in one, or the text of the file `GGML_TP_CUDA_PROGRAM`
/// names.
pub fn program_text() -> std::result::Result<String, String> {
    match &crate::settings::settings().program {
        None => Ok(program(Vendor::Cuda)),
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("GGML_TP_CUDA_PROGRAM {}: {e}", path.display())),
    }
}

/// The loaded kernels of one device.
pub struct Kernels {
    funcs: HashMap<String, CudaFunction>,
    /// Whether launches are programmatic dependents of the launch before them (compute capability
    /// 9.0 and later, where the program's kernels start with `griddepcontrol.wait`;
    /// `GGML_TP_CUDA_PDL`).
    pub dependent_launch: bool,
}

impl Kernels {
    /// Compiles the program with NVRTC for compute capability `cc` (once per process) and loads it
    /// into `ctx`.
    pub fn compile(ctx: &Arc<CudaContext>, cc: (i32, i32)) -> std::result::Result<Self, String> {
        crate::probe::guarded("NVRTC", || {
            let ptx = Ptx::from_src(ptx_for(cc)?);
            let module = ctx
                .load_module(ptx)
                .map_err(|e| format!("loading the compiled kernels: {e:?}"))?;
            let mut funcs = HashMap::new();
            for name in kernel_names() {
                let f = module
                    .load_function(&name)
                    .map_err(|e| format!("kernel {name}: {e:?}"))?;
                funcs.insert(name, f);
            }
            let dependent_launch = cc.0 >= 9 && crate::settings::settings().dependent_launch;
            Ok(Kernels {
                funcs,
                dependent_launch,
            })
        })
    }

    pub fn get(&self, name: &str) -> Result<&CudaFunction> {
        self.funcs
            .get(name)
            .ok_or_else(|| err(format!("no kernel {name}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvrtc_compiles_the_program_when_present() {
        // SAFETY: only opens the library.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            println!("skipped: no NVRTC library");
            return;
        }
        let opts = CompileOptions {
            options: vec!["--gpu-architecture=compute_90".into()],
            ..Default::default()
        };
        let ptx = compile_ptx_with_opts(program(Vendor::Cuda), opts);
        assert!(ptx.is_ok(), "{ptx:?}");
    }
}
