//! The vendor preludes: the few lines of device code that differ between CUDA (NVRTC) and HIP
//! (hiprtc), put in front of the shared kernel sources. The shared sources use only these names for
//! anything vendor-specific:
//!
//! - `WARP_SIZE`: lanes per warp (32 on NVIDIA and RDNA, 64 on CDNA/GCN); a compile-time constant.
//! - `WARP_SHFL_XOR(v, o)`, `WARP_SHFL_DOWN(v, o)`: full-warp shuffles of an int, float or double.
//! - `WARP_SYNC()`: orders the lanes' shared-memory accesses within a warp.
//! - `DOT4_I8(a, b, c)`: `c` plus the dot product of the four signed bytes of `a` and `b` (CUDA's
//!   `__dp4a`; on AMD the dot instruction of the target, or four multiplies where it has none).
//! - `h2f(u16)`, `f2h(float)`: IEEE half bits to float and back (round to nearest even).
//!
//! Both vendors spell the rest the same (`__syncthreads`, `atomicAdd`, `__launch_bounds__`,
//! `threadIdx`, `__int_as_float`, the math functions, `extern __shared__`), so there are no macros
//! for them. [`program`] assembles prelude and shared sources for one vendor.

use super::sources::portable_sources;

/// Which compiler the program is assembled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    /// NVRTC, for NVIDIA GPUs.
    Cuda,
    /// hiprtc, for AMD GPUs whose wavefronts have `warp_size` lanes.
    Hip { warp_size: u32 },
}

/// The CUDA prelude (NVRTC provides the rest without headers).
pub const CUDA_PRELUDE: &str = r#"// Vendor prelude: CUDA (NVRTC).
#define GGML_TP_CUDA 1
#define WARP_SIZE 32
#define WARP_SHFL_XOR(v, o) __shfl_xor_sync(0xffffffffu, (v), (o))
#define WARP_SHFL_DOWN(v, o) __shfl_down_sync(0xffffffffu, (v), (o))
#define WARP_SYNC() __syncwarp()
#define DOT4_I8(a, b, c) __dp4a((int)(a), (int)(b), (int)(c))
__device__ __forceinline__ float h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned short f2h(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
"#;

/// The HIP prelude for wavefronts of `warp_size` lanes (hiprtc provides the rest without headers).
pub fn hip_prelude(warp_size: u32) -> String {
    format!(
        r#"// Vendor prelude: HIP (hiprtc).
#define GGML_TP_HIP 1
#define WARP_SIZE {warp_size}
#define WARP_SHFL_XOR(v, o) __shfl_xor((v), (o))
#define WARP_SHFL_DOWN(v, o) __shfl_down((v), (o))
#define WARP_SYNC() do {{ __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront"); \
    __builtin_amdgcn_wave_barrier(); __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront"); }} while (0)
#if defined(__GFX11__) || defined(__GFX12__)
#define DOT4_I8(a, b, c) __builtin_amdgcn_sudot4(true, (int)(a), true, (int)(b), (int)(c), false)
#elif defined(__gfx906__) || defined(__gfx908__) || defined(__gfx90a__) || defined(__gfx940__) || \
    defined(__gfx941__) || defined(__gfx942__) || defined(__gfx950__) || defined(__gfx1011__) || \
    defined(__gfx1012__) || defined(__gfx1030__) || defined(__gfx1031__) || defined(__gfx1032__) || \
    defined(__gfx1033__) || defined(__gfx1034__) || defined(__gfx1035__) || defined(__gfx1036__)
#define DOT4_I8(a, b, c) __builtin_amdgcn_sdot4((int)(a), (int)(b), (int)(c), false)
#else
__device__ __forceinline__ int vendor_dot4_i8(int a, int b, int c) {{
    for (int i = 0; i < 32; i += 8) c += (int)(signed char)(a >> i) * (int)(signed char)(b >> i);
    return c;
}}
#define DOT4_I8(a, b, c) vendor_dot4_i8((int)(a), (int)(b), (int)(c))
#endif
__device__ __forceinline__ float h2f(unsigned short h) {{ return (float)__builtin_bit_cast(_Float16, h); }}
__device__ __forceinline__ unsigned short f2h(float f) {{
    return __builtin_bit_cast(unsigned short, (_Float16)f);
}}
"#
    )
}

/// The prelude of `vendor`.
pub fn prelude(vendor: Vendor) -> String {
    match vendor {
        Vendor::Cuda => CUDA_PRELUDE.to_string(),
        Vendor::Hip { warp_size } => hip_prelude(warp_size),
    }
}

/// The whole kernel program for `vendor`: its prelude, then the portable shared sources.
pub fn program(vendor: Vendor) -> String {
    let mut s = prelude(vendor);
    for (_, text) in portable_sources() {
        s.push_str(&text);
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names every prelude must define.
    const CONTRACT: [&str; 7] = [
        "#define WARP_SIZE ",
        "#define WARP_SHFL_XOR(v, o) ",
        "#define WARP_SHFL_DOWN(v, o) ",
        "#define WARP_SYNC() ",
        "#define DOT4_I8(a, b, c) ",
        " h2f(unsigned short h) ",
        " f2h(float f) ",
    ];

    #[test]
    fn both_preludes_define_the_whole_contract() {
        for vendor in [Vendor::Cuda, Vendor::Hip { warp_size: 64 }] {
            let p = prelude(vendor);
            for name in CONTRACT {
                assert!(p.contains(name), "{vendor:?} prelude: {name}");
            }
        }
        assert!(hip_prelude(32).contains("#define WARP_SIZE 32\n"));
        assert!(hip_prelude(64).contains("#define WARP_SIZE 64\n"));
    }

    #[test]
    fn the_hip_program_has_no_inline_ptx() {
        let hip = program(Vendor::Hip { warp_size: 64 });
        assert!(!hip.contains("asm("));
        assert!(hip.starts_with("// Vendor prelude: HIP"));
        let cuda = program(Vendor::Cuda);
        assert_eq!(
            cuda.matches("asm(").count(),
            2,
            "only the prelude's conversions"
        );
    }
}
