//! The kernel program: its sources (`cu/*.cu`, one file per op family, vendor-neutral), the vendor
//! preludes (`cu/prelude_cuda.h` for NVRTC, `cu/prelude_hip.h` for hiprtc) and the program of one
//! vendor assembled from them ([`program`]: its prelude, then the shared sources). The shared
//! sources use only these names for anything vendor-specific:
//!
//! - `WARP_SIZE`: lanes per warp (32 on NVIDIA and RDNA, 64 on CDNA/GCN); a compile-time constant,
//!   defined for HIP from the device's wavefront size ([`Vendor::Hip`]).
//! - `WARP_SHFL_XOR(v, o)`, `WARP_SHFL_DOWN(v, o)`: full-warp shuffles of an int, float or double.
//! - `MMA_F16_16816(c, a, b)` (optional; CUDA on compute capability 8.0 and later): a warp's
//!   tensor-core product of F16 tiles; where a prelude leaves it out, `attention_mma.cu` computes
//!   it through shared memory.
//! - `WARP_SYNC()`: orders the lanes' shared-memory accesses within a warp.
//! - `DOT4_I8(a, b, c)`: `c` plus the dot product of the four signed bytes of `a` and `b` (CUDA's
//!   `__dp4a`; on AMD the dot instruction of the target, or four multiplies where it has none).
//! - `h2f(u16)`, `f2h(float)`: IEEE half bits to float and back (round to nearest even).
//! - `GRID_DEPENDENCY_SYNC()`: the first statement of every kernel (or the end of the first,
//!   `L2_THEN_SYNC(prefetch)` of `common.cu`, in the decode attention kernels); on NVIDIA
//!   Hopper and later it waits for the kernel launched before (launches are programmatic
//!   dependents there), elsewhere nothing.
//! - `PREFETCH_L2(p)`: asks for the line at `p` in the L2 (CUDA's `prefetch.global.L2`), a hint
//!   that reads nothing into the kernel; elsewhere nothing.
//!
//! Both vendors spell the rest the same (`__syncthreads`, `atomicAdd`, `__launch_bounds__`,
//! `threadIdx`, `__int_as_float`, the math functions, `extern __shared__`), so there are no macros
//! for them.

/// The kernel sources, in compilation order (`common.cu` first, `attention.cu` before
/// `attention_vec.cu` and `attention_mma.cu`, `decode.cu` before `gemv.cu`, `gemv.cu` before
/// `moe.cu`).
pub const SOURCES: [(&str, &str); 13] = [
    ("common.cu", include_str!("cu/common.cu")),
    ("elementwise.cu", include_str!("cu/elementwise.cu")),
    ("norm.cu", include_str!("cu/norm.cu")),
    ("rope.cu", include_str!("cu/rope.cu")),
    ("rows.cu", include_str!("cu/rows.cu")),
    ("sort.cu", include_str!("cu/sort.cu")),
    ("attention.cu", include_str!("cu/attention.cu")),
    ("attention_vec.cu", include_str!("cu/attention_vec.cu")),
    ("attention_mma.cu", include_str!("cu/attention_mma.cu")),
    ("decode.cu", include_str!("cu/decode.cu")),
    ("gemv.cu", include_str!("cu/gemv.cu")),
    ("moe.cu", include_str!("cu/moe.cu")),
    ("delta_net.cu", include_str!("cu/delta_net.cu")),
];

/// The vendor prelude of NVRTC: what the shared sources spell vendor-neutrally (`WARP_SHFL_XOR`,
/// `DOT4_I8`, `h2f`/`f2h`, ...) in CUDA terms.
pub const CUDA_PRELUDE: &str = include_str!("cu/prelude_cuda.h");

/// The vendor prelude of hiprtc (AMD GPUs), the same names in HIP terms; it leaves `WARP_SIZE` (the
/// device's wavefront size) to [`prelude`].
pub const HIP_PRELUDE: &str = include_str!("cu/prelude_hip.h");

/// Which compiler the program is assembled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    /// NVRTC, for NVIDIA GPUs.
    Cuda,
    /// hiprtc, for AMD GPUs whose wavefronts have `warp_size` lanes.
    Hip { warp_size: u32 },
}

/// The vendor-neutral sources as one translation unit (without a prelude).
pub fn shared_source() -> String {
    let mut s = String::new();
    for (_, src) in SOURCES {
        s.push_str(src);
        s.push('\n');
    }
    s
}

/// The prelude of `vendor`.
pub fn prelude(vendor: Vendor) -> String {
    match vendor {
        Vendor::Cuda => CUDA_PRELUDE.to_string(),
        Vendor::Hip { warp_size } => format!("#define WARP_SIZE {warp_size}\n{HIP_PRELUDE}"),
    }
}

/// The whole kernel program for `vendor`: its prelude, then the shared sources.
pub fn program(vendor: Vendor) -> String {
    prelude(vendor) + &shared_source()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ggml_core::DType;

    #[test]
    fn program_names_every_kernel() {
        let src = program(Vendor::Cuda);
        for name in crate::dispatch::NAMED_KERNELS {
            // `void name(`, or `void __launch_bounds__(..) name(`.
            assert!(
                src.contains(&format!("void {name}(")) || src.contains(&format!(") {name}(")),
                "kernel {name} missing from the sources"
            );
        }
        // The decode attention family is instantiated by a macro, one line per body.
        for name in crate::dispatch::VEC_KERNELS {
            let body = name.trim_start_matches("k_flash_attn_vec_");
            assert!(
                src.contains(&format!("\nFAV_KERNEL({body}, ")),
                "kernel {name} missing from the sources"
            );
        }
        // The GEMV and dequantizer families are instantiated by macros, one line per type.
        for t in DType::WEIGHTS {
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

    #[test]
    fn every_kernel_starts_with_the_grid_dependency_sync() {
        // Launched as programmatic dependents on NVIDIA, a kernel that read memory before
        // GRID_DEPENDENCY_SYNC() could see the previous kernel's results half written; only L2
        // prefetches (`L2_THEN_SYNC` of the functions that call `rows_to_l2`) may come first.
        for (file, src) in SOURCES {
            for (at, _) in src.match_indices("__global__") {
                let body = at + src[at..].find('{').expect("a kernel has a body") + 1;
                let first = src[body..].trim_start();
                assert!(
                    first.starts_with("GRID_DEPENDENCY_SYNC();")
                        || first.starts_with("L2_THEN_SYNC("),
                    "{file}: the kernel at byte {at} does not start with GRID_DEPENDENCY_SYNC()"
                );
            }
        }
        let prefetches = ["fav_to_l2"];
        for (file, src) in SOURCES {
            for (at, _) in src.match_indices("L2_THEN_SYNC(") {
                let arg = &src[at + "L2_THEN_SYNC(".len()..];
                assert!(
                    file == "common.cu" || prefetches.iter().any(|p| arg.starts_with(p)),
                    "{file}: L2_THEN_SYNC at byte {at} runs an unknown prefetch"
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
        let program = program(Vendor::Cuda);
        assert!(program.starts_with(CUDA_PRELUDE));
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
            "the HIP prelude leaves it to the device"
        );
    }

    #[test]
    fn the_cuda_program_is_its_prelude_then_the_shared_sources() {
        assert_eq!(
            program(Vendor::Cuda),
            format!("{CUDA_PRELUDE}{}", shared_source())
        );
    }

    #[test]
    fn the_hip_program_has_no_inline_ptx_and_its_wavefront_size() {
        for warp_size in [32, 64] {
            let hip = program(Vendor::Hip { warp_size });
            assert!(!hip.contains("asm("));
            assert!(hip.starts_with(&format!("#define WARP_SIZE {warp_size}\n")));
            assert!(hip.contains("#define GGML_TP_HIP 1\n"));
        }
    }
}
