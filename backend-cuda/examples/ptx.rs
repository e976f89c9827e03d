//! Writes the PTX of the kernel program (the built-in one, or the file `GGML_TP_CUDA_PROGRAM`
//! names) for one compute capability, with NVRTC and no GPU: `cargo xtask ptxas` feeds it to
//! `ptxas -v` for each kernel's registers, stack and spills.
//!
//! `cargo run --release -p backend-cuda --example ptx -- OUT.ptx [MAJOR.MINOR]` (default 9.0);
//! with an OUT ending in `.cu` it writes the program's text instead (a starting point for a kernel
//! experiment carried to a GPU machine and named by `GGML_TP_CUDA_PROGRAM` there).

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
    if out.ends_with(".cu") {
        return write(out, backend_cuda::kernels::program_text());
    }
    // SAFETY: only opens the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        eprintln!("no NVRTC library found (set LD_LIBRARY_PATH to a folder with libnvrtc.so)");
        return ExitCode::FAILURE;
    }
    write(out, backend_cuda::kernels::ptx_for(cc))
}

/// Writes `text` to `out`, or says why there is nothing to write.
fn write(out: &str, text: Result<String, String>) -> ExitCode {
    let text = match text {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = std::fs::write(out, text) {
        eprintln!("{out}: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
