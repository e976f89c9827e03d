//! The kernel program for one vendor: its prelude, then the shared sources. Both preludes and the
//! sources live in the CUDA backend (`backend-cuda/src/kernels/cu/`: `prelude_cuda.h`,
//! `prelude_hip.h`, `*.cu`); the shared sources use only these names for anything vendor-specific:
//!
//! - `WARP_SIZE`: lanes per warp (32 on NVIDIA and RDNA, 64 on CDNA/GCN); a compile-time constant,
//!   defined here for HIP from the device's wavefront size.
//! - `WARP_SHFL_XOR(v, o)`, `WARP_SHFL_DOWN(v, o)`: full-warp shuffles of an int, float or double.
//! - `WARP_SYNC()`: orders the lanes' shared-memory accesses within a warp.
//! - `DOT4_I8(a, b, c)`: `c` plus the dot product of the four signed bytes of `a` and `b` (CUDA's
//!   `__dp4a`; on AMD the dot instruction of the target, or four multiplies where it has none).
//! - `h2f(u16)`, `f2h(float)`: IEEE half bits to float and back (round to nearest even).
//!
//! Both vendors spell the rest the same (`__syncthreads`, `atomicAdd`, `__launch_bounds__`,
//! `threadIdx`, `__int_as_float`, the math functions, `extern __shared__`), so there are no macros
//! for them.

use backend_cuda::kernels::{shared_source, CUDA_PRELUDE, HIP_PRELUDE};

/// Which compiler the program is assembled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    /// NVRTC, for NVIDIA GPUs.
    Cuda,
    /// hiprtc, for AMD GPUs whose wavefronts have `warp_size` lanes.
    Hip { warp_size: u32 },
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

    #[test]
    fn the_cuda_program_is_the_cuda_backends() {
        assert_eq!(
            program(Vendor::Cuda),
            backend_cuda::kernels::program_source()
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
