//! Writes the PTX of the kernel program (the built-in one, or the file `GGML_TP_CUDA_PROGRAM`
//! names) for one compute capability, with NVRTC and no GPU: `cargo xtask ptxas` feeds it to
//! `ptxas -v` for each kernel's registers, stack and spills.
//!
//! `cargo run --release -p backend-cuda --example ptx -- OUT.ptx [MAJOR.MINOR]` (default 9.0)

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(out) = args.first() else {
        eprintln!("usage: ptx OUT.ptx [MAJOR.MINOR]");
        return ExitCode::FAILURE;
    };
    let cc = match args.get(1).map(|v| v.split_once('.')) {
        None => (9, 0),
        Some(Some((a, b))) => match (a.parse(), b.parse()) {
            (Ok(a), Ok(b)) => (a, b),
            _ => {
                eprintln!("compute capability {:?}: expected MAJOR.MINOR", args[1]);
                return ExitCode::FAILURE;
            }
        },
        Some(None) => {
            eprintln!("compute capability {:?}: expected MAJOR.MINOR", args[1]);
            return ExitCode::FAILURE;
        }
    };
    // SAFETY: only opens the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        eprintln!("no NVRTC library found (set LD_LIBRARY_PATH to a folder with libnvrtc.so)");
        return ExitCode::FAILURE;
    }
    let ptx = match backend_cuda::kernels::ptx_for(cc) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = std::fs::write(out, ptx) {
        eprintln!("{out}: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
