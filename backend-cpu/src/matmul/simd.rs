//! SIMD level selection for the matmul kernels (and the row primitives of `kernels::vector`): detected once at run time (`OnceLock`), and
//! overridable with `GGML_TP_SIMD=scalar|avx2|avx512|neon` ([`crate::settings`], read once, at the
//! first detection). Forcing a level the CPU lacks falls back to the best available one with a
//! warning on stderr. AMX is never used, whatever CPUID advertises.
//!
//! Levels:
//! - `Scalar`: portable Rust, always compiled and tested.
//! - `Avx2`: x86-64 with AVX2 + FMA + F16C.
//! - `Avx512`: `Avx2` plus AVX-512 F, BW, VL and VNNI (512-bit F32 GEMM micro-kernel, VNNI
//!   integer dot products for the quantized kernels).
//! - `Neon`: aarch64 NEON for the float kernels (row dot products and GEMM micro-kernel); the
//!   quantized kernels use the portable code there (no hand-written `sdot` kernels yet).
//!
//! The quantized kernels of both x86 levels share everything but the 8-bit dot product and the
//! prompt kernels: K-quant super-blocks are unpacked with AVX2 at both; Q4_0 / Q5_0 and the K-quants
//! take eight-row kernels at both (rows in the lanes of a vector; AVX-512 VNNI `vpdpbusd` or AVX2
//! `vpmaddubsw` sums); the other legacy prompt products multiply two weight rows by four activation
//! columns per block load, at AVX-512 with two blocks per 512-bit vector.

use std::sync::OnceLock;

/// An instruction-set level of the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimdLevel {
    Scalar,
    Avx2,
    Avx512,
    Neon,
}

impl SimdLevel {
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
            SimdLevel::Neon => "neon",
        }
    }

    /// True when the running CPU can execute kernels of this level.
    pub fn is_available(self) -> bool {
        match self {
            SimdLevel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => {
                SimdLevel::Avx2.is_available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "aarch64")]
            SimdLevel::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Every level the running CPU supports, lowest first (always starts with `Scalar`).
    pub fn available() -> Vec<SimdLevel> {
        [
            SimdLevel::Scalar,
            SimdLevel::Avx2,
            SimdLevel::Avx512,
            SimdLevel::Neon,
        ]
        .into_iter()
        .filter(|l| l.is_available())
        .collect()
    }

    /// The best level of the running CPU.
    pub fn best() -> SimdLevel {
        *SimdLevel::available().last().unwrap_or(&SimdLevel::Scalar)
    }
}

/// The level used by `mul_mat` / `mul_mat_id`: detected once, honouring `GGML_TP_SIMD`.
pub fn level() -> SimdLevel {
    static LEVEL: OnceLock<SimdLevel> = OnceLock::new();
    *LEVEL.get_or_init(|| resolve(crate::settings::settings().simd.as_deref()))
}

/// The level for a `GGML_TP_SIMD` value: the best available one when unset or unknown (with a
/// warning), the forced one when available, else the best available level below it (with a warning).
pub fn resolve(want: Option<&str>) -> SimdLevel {
    let best = SimdLevel::best();
    let Some(want) = want else {
        return best;
    };
    let forced = match want.to_ascii_lowercase().as_str() {
        "scalar" => SimdLevel::Scalar,
        "avx2" => SimdLevel::Avx2,
        "avx512" => SimdLevel::Avx512,
        "neon" => SimdLevel::Neon,
        other => {
            eprintln!(
                "ggml-tp: GGML_TP_SIMD={other} is not one of scalar, avx2, avx512, neon; using {}",
                best.name()
            );
            return best;
        }
    };
    if forced.is_available() {
        return forced;
    }
    let fallback = SimdLevel::available()
        .into_iter()
        .rfind(|l| *l <= forced)
        .unwrap_or(SimdLevel::Scalar);
    eprintln!(
        "ggml-tp: GGML_TP_SIMD={} is not supported by this CPU; using {}",
        forced.name(),
        fallback.name()
    );
    fallback
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_simd_override_and_fallback() {
        assert_eq!(resolve(None), SimdLevel::best());
        assert_eq!(resolve(Some("SCALAR")), SimdLevel::Scalar);
        assert_eq!(resolve(Some("bogus")), SimdLevel::best());
        for l in [SimdLevel::Avx2, SimdLevel::Avx512] {
            let got = resolve(Some(l.name()));
            assert!(got.is_available() && got <= l);
            assert_eq!(got == l, l.is_available());
        }
        assert_eq!(SimdLevel::available()[0], SimdLevel::Scalar);
    }
}
