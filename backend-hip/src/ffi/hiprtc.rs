//! The HIP run-time compiler (`libhiprtc`, part of `libamdhip64` before ROCm 5.3): compiles the
//! kernel program to a code object for one gfx target.

use super::{api, c_text};
use std::ffi::c_char;

/// `hiprtcResult`.
pub type RtcResult = i32;
/// `hiprtcProgram`.
pub type Program = *mut std::ffi::c_void;

pub const SUCCESS: RtcResult = 0;

/// File names of the compiler, newest first; old runtimes export it from the HIP library itself.
pub const LIBRARY_NAMES: &[&str] = &[
    "libhiprtc.so",
    "libhiprtc.so.7",
    "libhiprtc.so.6",
    "libhiprtc.so.5",
    "libamdhip64.so",
];

api! {
    /// The hiprtc entry points used by the backend.
    pub struct RtcApi {
        fn hiprtcCreateProgram(
            program: *mut Program,
            source: *const c_char,
            name: *const c_char,
            num_headers: i32,
            headers: *const *const c_char,
            include_names: *const *const c_char,
        ) -> RtcResult;
        fn hiprtcCompileProgram(program: Program, num_options: i32, options: *const *const c_char) -> RtcResult;
        fn hiprtcGetProgramLogSize(program: Program, size: *mut usize) -> RtcResult;
        fn hiprtcGetProgramLog(program: Program, log: *mut c_char) -> RtcResult;
        fn hiprtcGetCodeSize(program: Program, size: *mut usize) -> RtcResult;
        fn hiprtcGetCode(program: Program, code: *mut c_char) -> RtcResult;
        fn hiprtcDestroyProgram(program: *mut Program) -> RtcResult;
        fn hiprtcGetErrorString(result: RtcResult) -> *const c_char;
    }
}

impl RtcApi {
    /// `Ok` for `HIPRTC_SUCCESS`, else `what: <message> (hiprtcResult <code>)`.
    pub fn check(&self, what: &str, code: RtcResult) -> Result<(), String> {
        if code == SUCCESS {
            return Ok(());
        }
        // SAFETY: hiprtcGetErrorString returns a static string for any code.
        let msg = unsafe { c_text((self.hiprtcGetErrorString)(code)) };
        Err(format!("{what}: {msg} (hiprtcResult {code})"))
    }
}
