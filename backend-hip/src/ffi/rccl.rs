//! RCCL (`librccl`): NCCL's C API on HIP streams — communicators over a device list, AllReduce and
//! group calls.

use super::hip::Stream;
use super::{api, c_text};
use std::ffi::{c_char, c_void};

/// `ncclResult_t`.
pub type NcclResult = i32;
/// `ncclComm_t`.
pub type Comm = *mut c_void;
/// `ncclDataType_t`.
pub type DataType = i32;
/// `ncclRedOp_t`.
pub type RedOp = i32;

pub const SUCCESS: NcclResult = 0;
/// `ncclFloat16`.
pub const FLOAT16: DataType = 6;
/// `ncclFloat32`.
pub const FLOAT32: DataType = 7;
/// `ncclBfloat16`.
pub const BFLOAT16: DataType = 9;
/// `ncclSum`.
pub const SUM: RedOp = 0;

/// File names of RCCL.
pub const LIBRARY_NAMES: &[&str] = &["librccl.so", "librccl.so.1"];

api! {
    /// The RCCL entry points used by the communicator.
    pub struct RcclApi {
        fn ncclCommInitAll(comms: *mut Comm, ndev: i32, devices: *const i32) -> NcclResult;
        fn ncclCommDestroy(comm: Comm) -> NcclResult;
        fn ncclAllReduce(
            send: *const c_void,
            recv: *mut c_void,
            count: usize,
            data_type: DataType,
            op: RedOp,
            comm: Comm,
            stream: Stream,
        ) -> NcclResult;
        fn ncclGroupStart() -> NcclResult;
        fn ncclGroupEnd() -> NcclResult;
        fn ncclGetErrorString(result: NcclResult) -> *const c_char;
    }
}

impl RcclApi {
    /// `Ok` for `ncclSuccess`, else `what: <message> (ncclResult_t <code>)`.
    pub fn check(&self, what: &str, code: NcclResult) -> Result<(), String> {
        if code == SUCCESS {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static string for any code.
        let msg = unsafe { c_text((self.ncclGetErrorString)(code)) };
        Err(format!("{what}: {msg} (ncclResult_t {code})"))
    }
}
