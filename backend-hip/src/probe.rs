//! Run-time loading of ROCm: [`runtime`] opens the HIP runtime, hiprtc and hipBLAS (and RCCL when it
//! is there), resolves their entry points and initializes HIP, once per process. Any failure is kept
//! as a one-line reason, and the family then has zero devices; nothing here panics.

use crate::ffi::hip::{HipApi, PropsApi};
use crate::ffi::hipblas::BlasApi;
use crate::ffi::hiprtc::RtcApi;
use crate::ffi::rccl::RcclApi;
use crate::ffi::{hip, hipblas, hiprtc, open_library, rccl};
use std::sync::OnceLock;

/// The loaded ROCm libraries.
pub struct Runtime {
    pub hip: HipApi,
    /// The device-properties query, when the runtime has the ROCm 6 layout.
    pub props: Option<PropsApi>,
    pub rtc: RtcApi,
    pub blas: BlasApi,
    /// RCCL, when `librccl.so` loads.
    pub rccl: Option<RcclApi>,
    /// `hipRuntimeGetVersion`.
    pub version: i32,
}

fn load() -> Result<Runtime, String> {
    let library = open_library(hip::LIBRARY_NAMES).map_err(|e| format!("no HIP runtime: {e}"))?;
    let hip = HipApi::load(library).map_err(|e| format!("HIP runtime unusable: {e}"))?;
    // SAFETY: hipInit takes flags 0 and may be called more than once.
    hip.check("hipInit", unsafe { (hip.hipInit)(0) })?;
    let mut version = 0;
    // SAFETY: writes one int.
    hip.check("hipRuntimeGetVersion", unsafe {
        (hip.hipRuntimeGetVersion)(&mut version)
    })?;
    let props = open_library(hip::LIBRARY_NAMES)
        .and_then(PropsApi::load)
        .ok();
    let rtc = RtcApi::load(open_library(hiprtc::LIBRARY_NAMES)?).map_err(|e| {
        format!("hiprtc unusable (the run-time compiler is needed for the kernels): {e}")
    })?;
    let blas = BlasApi::load(open_library(hipblas::LIBRARY_NAMES)?)
        .map_err(|e| format!("hipBLAS unusable (needed for mul_mat): {e}"))?;
    let rccl = open_library(rccl::LIBRARY_NAMES)
        .and_then(RcclApi::load)
        .ok();
    Ok(Runtime {
        hip,
        props,
        rtc,
        blas,
        rccl,
        version,
    })
}

/// The loaded libraries, or why HIP cannot be used here (one line).
pub fn runtime() -> Result<&'static Runtime, String> {
    static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();
    RUNTIME.get_or_init(load).as_ref().map_err(Clone::clone)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_loads_or_gives_a_one_line_reason() {
        match runtime() {
            Ok(rt) => println!("HIP runtime {} present", rt.version),
            Err(r) => {
                assert!(!r.is_empty() && !r.contains('\n'), "{r:?}");
                println!("skipped: no HIP device ({r})");
            }
        }
    }
}
