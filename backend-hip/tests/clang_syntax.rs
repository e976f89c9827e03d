//! Compiles the kernel program with clang's device compilers, without ROCm or CUDA installed: for
//! HIP (`-x hip`, a CDNA wave64 and an RDNA wave32 target) and for CUDA (`-x cuda`, sm_90), each
//! after its vendor prelude, with a stand-in for what hiprtc / NVRTC provide (`clang_shim/`). Clang
//! parses, type-checks and generates device code, so a typo or a construct one vendor lacks fails
//! here even where no GPU exists. Prints `skipped: no clang` without clang (CI installs clang-16;
//! `GGML_TP_CLANG` names another binary).

use ggml_gpu::kernels::{prelude, program, Vendor};
use std::path::{Path, PathBuf};
use std::process::Command;

fn shim_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clang_shim")
}

/// A clang++ that runs, or `None` after printing why the checks are skipped.
fn clang() -> Option<String> {
    let candidates: Vec<String> = match std::env::var("GGML_TP_CLANG") {
        Ok(c) => vec![c],
        Err(_) => vec!["clang++-16".into(), "clang++".into()],
    };
    let found = candidates.into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if found.is_none() {
        println!("skipped: no clang (install clang-16, or set GGML_TP_CLANG)");
    }
    found
}

/// A device target of one vendor.
#[derive(Clone, Copy, Debug)]
enum Target {
    /// An AMD gfx target and its wavefront size.
    Hip(&'static str, u32),
    /// An NVIDIA sm target.
    Cuda(&'static str),
}

impl Target {
    fn vendor(self) -> Vendor {
        match self {
            Target::Hip(_, warp_size) => Vendor::Hip { warp_size },
            Target::Cuda(_) => Vendor::Cuda,
        }
    }

    fn args(self) -> Vec<String> {
        let shim = shim_dir();
        let mut args: Vec<String> = match self {
            Target::Hip(arch, _) => vec![
                "-x".into(),
                "hip".into(),
                format!("--offload-arch={arch}"),
                "-nogpuinc".into(),
                "-nogpulib".into(),
                "-D__HIPCC_RTC__".into(),
                "-include".into(),
                "__clang_hip_runtime_wrapper.h".into(),
                "-include".into(),
                shim.join("hiprtc_builtins.h").display().to_string(),
            ],
            Target::Cuda(arch) => vec![
                "-x".into(),
                "cuda".into(),
                format!("--cuda-gpu-arch={arch}"),
                "-nocudainc".into(),
                "-nocudalib".into(),
                "-Xclang".into(),
                "-target-feature".into(),
                "-Xclang".into(),
                "+ptx78".into(),
                "-include".into(),
                shim.join("nvrtc_builtins.h").display().to_string(),
            ],
        };
        args.extend(
            ["--cuda-device-only", "-std=c++17", "-S", "-o", "/dev/null"].map(String::from),
        );
        args
    }
}

/// Compiles `source` for `target`; `Err` holds clang's diagnostics.
fn compile(clang: &str, target: Target, label: &str, source: &str) -> Result<(), String> {
    let ext = match target {
        Target::Hip(..) => "hip",
        Target::Cuda(_) => "cu",
    };
    let dir = std::env::temp_dir().join(format!("ggml-tp-clang-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let file = dir.join(format!("{label}.{ext}"));
    std::fs::write(&file, source).map_err(|e| e.to_string())?;
    let out = Command::new(clang)
        .args(target.args())
        .arg(&file)
        .output()
        .map_err(|e| format!("running {clang}: {e}"))?;
    let diagnostics = String::from_utf8_lossy(&out.stderr).into_owned();
    std::fs::remove_file(&file).ok();
    if out.status.success() && !diagnostics.contains("error:") {
        if !diagnostics.is_empty() {
            println!("{label} ({target:?}) warnings:\n{diagnostics}");
        }
        Ok(())
    } else {
        Err(diagnostics)
    }
}

/// CDNA2 (wave64), RDNA3 (wave32) and Hopper.
const TARGETS: [Target; 3] = [
    Target::Hip("gfx90a", 64),
    Target::Hip("gfx1100", 32),
    Target::Cuda("sm_90"),
];

/// [`TARGETS`] and the other branches of the HIP prelude: RDNA2 (sdot4 on wave32) and Vega 10 (no
/// dot instruction).
const PRELUDE_TARGETS: [Target; 5] = [
    TARGETS[0],
    TARGETS[1],
    TARGETS[2],
    Target::Hip("gfx1030", 32),
    Target::Hip("gfx900", 64),
];

#[test]
fn the_kernel_program_compiles_for_every_vendor() {
    let Some(clang) = clang() else { return };
    for target in TARGETS {
        let source = program(target.vendor());
        if let Err(d) = compile(&clang, target, "program", &source) {
            panic!("the kernel program does not compile for {target:?}:\n{d}");
        }
    }
}

#[test]
fn every_prelude_name_compiles_for_every_vendor() {
    let Some(clang) = clang() else { return };
    let probe = std::fs::read_to_string(shim_dir().join("prelude_probe.cu")).unwrap();
    for target in PRELUDE_TARGETS {
        let source = prelude(target.vendor()) + &probe;
        if let Err(d) = compile(&clang, target, "prelude_probe", &source) {
            panic!("the prelude probe does not compile for {target:?}:\n{d}");
        }
    }
}

#[test]
fn a_typo_or_a_foreign_construct_fails_the_check() {
    let Some(clang) = clang() else { return };
    let typo = "extern \"C\" __global__ void k(float* p) { p[threadIdx.x] = h2f(p_typo[0]); }\n";
    for target in TARGETS {
        let source = prelude(target.vendor()) + typo;
        let d = compile(&clang, target, "typo", &source).expect_err("a typo must fail");
        assert!(d.contains("p_typo"), "{target:?}: {d}");
    }
    // Inline PTX, as the unedited shared sources have it, is refused for AMD targets.
    let ptx = "extern \"C\" __global__ void k(float* p) { float f; \
               asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"((unsigned short)1)); p[0] = f; }\n";
    let d = compile(&clang, TARGETS[0], "ptx", ptx).expect_err("PTX on gfx90a must fail");
    assert!(d.contains("constraint"), "{d}");
}
