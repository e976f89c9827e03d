//! The kernels: their sources (`cu/*.cu`, one file per op family, vendor-neutral, shared with the
//! HIP backend), the vendor preludes (`cu/prelude_cuda.h`, `cu/prelude_hip.h`), and on CUDA the
//! program compiled with NVRTC for the device's compute capability and loaded per device
//! ([`Kernels`]); `runner` executes [`crate::dispatch`]'s launches and GEMMs on a CUDA stream.

mod runner;

use crate::dispatch::{kernel_names, GemvArgs, GemvGroupArgs, TDesc};

use crate::err;
use cudarc::driver::{CudaContext, CudaFunction, DeviceRepr};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};
use ggml_core::Result;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// The kernel sources, in compilation order (`common.cu` first, `decode.cu` before `gemv.cu`).
pub const SOURCES: [(&str, &str); 9] = [
    ("common.cu", include_str!("cu/common.cu")),
    ("elementwise.cu", include_str!("cu/elementwise.cu")),
    ("norm.cu", include_str!("cu/norm.cu")),
    ("rope.cu", include_str!("cu/rope.cu")),
    ("rows.cu", include_str!("cu/rows.cu")),
    ("sort.cu", include_str!("cu/sort.cu")),
    ("attention.cu", include_str!("cu/attention.cu")),
    ("decode.cu", include_str!("cu/decode.cu")),
    ("gemv.cu", include_str!("cu/gemv.cu")),
];

/// The vendor prelude of NVRTC: what the shared sources spell vendor-neutrally (`WARP_SHFL_XOR`,
/// `DOT4_I8`, `h2f`/`f2h`, ...) in CUDA terms.
pub const CUDA_PRELUDE: &str = include_str!("cu/prelude_cuda.h");

/// The vendor prelude of hiprtc (AMD GPUs), the same names in HIP terms; it leaves `WARP_SIZE` (the
/// device's wavefront size) to the HIP backend.
pub const HIP_PRELUDE: &str = include_str!("cu/prelude_hip.h");

/// The vendor-neutral sources as one translation unit (without a prelude).
pub fn shared_source() -> String {
    let mut s = String::new();
    for (_, src) in SOURCES {
        s.push_str(src);
        s.push('\n');
    }
    s
}

/// The whole CUDA program: [`CUDA_PRELUDE`], then the shared sources.
pub fn program_source() -> String {
    format!("{CUDA_PRELUDE}{}", shared_source())
}

/// PTX of the program per compute capability, compiled once per process (devices of one
/// architecture share it; the driver caches the machine code it makes from it).
static PTX: Mutex<Vec<((i32, i32), String)>> = Mutex::new(Vec::new());

fn ptx_for(cc: (i32, i32)) -> std::result::Result<String, String> {
    let mut cache = PTX.lock();
    if let Some((_, p)) = cache.iter().find(|(c, _)| *c == cc) {
        return Ok(p.clone());
    }
    let opts = CompileOptions {
        options: vec![format!("--gpu-architecture=compute_{}{}", cc.0, cc.1)],
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(program_source(), opts)
        .map_err(|e| format!("NVRTC compile failed: {e:?}"))?
        .to_src();
    cache.push((cc, ptx.clone()));
    Ok(ptx)
}

/// The loaded kernels of one device.
pub struct Kernels {
    funcs: HashMap<String, CudaFunction>,
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
            Ok(Kernels { funcs })
        })
    }

    pub fn get(&self, name: &str) -> Result<&CudaFunction> {
        self.funcs
            .get(name)
            .ok_or_else(|| err(format!("no kernel {name}")))
    }
}

// SAFETY: a plain `repr(C)` struct of integers with the layout of `struct TD` in common.cu.
unsafe impl DeviceRepr for TDesc {}

// SAFETY: a plain `repr(C)` struct of 8-byte integers with the layout of `struct GV` in gemv.cu.
unsafe impl DeviceRepr for GemvArgs {}

// SAFETY: a plain `repr(C)` struct of `GemvArgs` and 8-byte integers with the layout of
// `struct GVGroup` in gemv.cu.
unsafe impl DeviceRepr for GemvGroupArgs {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_names_every_kernel() {
        let src = program_source();
        for name in crate::dispatch::NAMED_KERNELS {
            assert!(
                src.contains(&format!("void {name}(")),
                "kernel {name} missing from the sources"
            );
        }
        // The GEMV and dequantizer families are instantiated by macros, one line per type.
        for t in crate::dispatch::WEIGHT_TYPES {
            let tn = crate::dispatch::type_name(t).unwrap();
            assert!(
                src.contains(&format!("GEMV_KERNELS({tn}, ")),
                "GEMV for {t}"
            );
            if t.is_quantized() {
                assert!(
                    src.contains(&format!("DEQUANT_KERNEL({tn}, ")),
                    "dequantizer for {t}"
                );
            }
        }
    }

    /// Constructs that only one vendor compiles (or that mean something else on the other), with
    /// what the shared sources use instead (defined by both vendor preludes).
    const VENDOR_CONSTRUCTS: [(&str, &str); 11] = [
        ("asm(", "inline assembly: move it into the vendor preludes"),
        (
            "asm volatile",
            "inline assembly: move it into the vendor preludes",
        ),
        ("__shfl", "WARP_SHFL_XOR / WARP_SHFL_DOWN"),
        ("__dp4a", "DOT4_I8"),
        ("__syncwarp", "WARP_SYNC()"),
        (
            "__ballot",
            "no prelude name yet: ballots are 64-bit on CDNA",
        ),
        (
            "__activemask",
            "no prelude name yet: masks are 64-bit on CDNA",
        ),
        ("warpSize", "WARP_SIZE (a compile-time constant)"),
        ("cuda_fp16", "h2f / f2h"),
        ("__half", "h2f / f2h on u16 bits"),
        ("__nv_bfloat16", "bf2f / f2bf on u16 bits"),
    ];

    #[test]
    fn the_shared_sources_hold_no_vendor_construct() {
        let mut found = Vec::new();
        for (name, text) in SOURCES {
            for (line_no, line) in text.lines().enumerate() {
                for (construct, instead) in VENDOR_CONSTRUCTS {
                    if line.contains(construct) {
                        found.push(format!("{name}:{}: {construct} -> {instead}", line_no + 1));
                    }
                }
            }
        }
        assert!(
            found.is_empty(),
            "vendor-specific constructs:\n{}",
            found.join("\n")
        );
        let program = program_source();
        assert!(program.starts_with(CUDA_PRELUDE));
        assert_eq!(
            program.matches("asm(").count(),
            2,
            "only the prelude's conversions"
        );
    }

    #[test]
    fn both_preludes_define_the_whole_contract() {
        let contract = [
            "#define WARP_SHFL_XOR(v, o) ",
            "#define WARP_SHFL_DOWN(v, o) ",
            "#define WARP_SYNC() ",
            "#define DOT4_I8(a, b, c) ",
            " h2f(unsigned short h) ",
            " f2h(float f) ",
        ];
        for (vendor, prelude) in [("CUDA", CUDA_PRELUDE), ("HIP", HIP_PRELUDE)] {
            for name in contract {
                assert!(prelude.contains(name), "{vendor} prelude: {name}");
            }
        }
        assert!(CUDA_PRELUDE.contains("#define WARP_SIZE 32\n"));
        assert!(
            !HIP_PRELUDE.contains("#define WARP_SIZE"),
            "the HIP backend defines it per device"
        );
    }

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
        let ptx = compile_ptx_with_opts(program_source(), opts);
        assert!(ptx.is_ok(), "{ptx:?}");
    }
}
