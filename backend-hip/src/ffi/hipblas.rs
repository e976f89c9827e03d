//! hipBLAS (`libhipblas`): a handle bound to a stream and single-precision GEMM, the same column-major
//! interface as cuBLAS.

use super::api;
use super::hip::Stream;
use std::ffi::c_void;

/// `hipblasStatus_t`.
pub type BlasStatus = i32;
/// `hipblasHandle_t`.
pub type Handle = *mut c_void;
/// `hipblasOperation_t`.
pub type Operation = i32;

pub const SUCCESS: BlasStatus = 0;
/// `HIPBLAS_OP_N`.
pub const OP_N: Operation = 111;
/// `HIPBLAS_OP_T`.
pub const OP_T: Operation = 112;

/// File names of hipBLAS, newest first.
pub const LIBRARY_NAMES: &[&str] = &[
    "libhipblas.so",
    "libhipblas.so.3",
    "libhipblas.so.2",
    "libhipblas.so.1",
    "libhipblas.so.0",
];

api! {
    /// The hipBLAS entry points used by the backend.
    pub struct BlasApi {
        fn hipblasCreate(handle: *mut Handle) -> BlasStatus;
        fn hipblasDestroy(handle: Handle) -> BlasStatus;
        fn hipblasSetStream(handle: Handle, stream: Stream) -> BlasStatus;
        fn hipblasSgemm(
            handle: Handle,
            trans_a: Operation,
            trans_b: Operation,
            m: i32,
            n: i32,
            k: i32,
            alpha: *const f32,
            a: *const f32,
            lda: i32,
            b: *const f32,
            ldb: i32,
            beta: *const f32,
            c: *mut f32,
            ldc: i32,
        ) -> BlasStatus;
    }
}

impl BlasApi {
    /// `Ok` for `HIPBLAS_STATUS_SUCCESS`, else `what: hipblasStatus_t <code>`.
    pub fn check(&self, what: &str, code: BlasStatus) -> Result<(), String> {
        if code == SUCCESS {
            Ok(())
        } else {
            Err(format!("{what}: hipblasStatus_t {code}"))
        }
    }
}
