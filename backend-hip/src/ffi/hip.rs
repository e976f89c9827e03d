//! The HIP runtime (`libamdhip64`): the entry points the backend calls, with the constants it passes,
//! as declared in ROCm 6's `hip_runtime_api.h` (the same values in ROCm 5 and 7).

use super::{api, c_text};
use std::ffi::{c_char, c_void};

/// `hipError_t`.
pub type HipError = i32;
/// `hipStream_t`.
pub type Stream = *mut c_void;
/// `hipEvent_t`.
pub type Event = *mut c_void;
/// `hipModule_t`.
pub type Module = *mut c_void;
/// `hipFunction_t`.
pub type Function = *mut c_void;

pub const SUCCESS: HipError = 0;
/// `hipErrorOutOfMemory`.
pub const ERROR_OUT_OF_MEMORY: HipError = 2;
/// `hipErrorNotReady`: queued work has not completed yet.
pub const ERROR_NOT_READY: HipError = 600;

/// `hipMemcpyKind` values.
pub const MEMCPY_HOST_TO_DEVICE: i32 = 1;
pub const MEMCPY_DEVICE_TO_HOST: i32 = 2;
pub const MEMCPY_DEVICE_TO_DEVICE: i32 = 3;

/// `hipStreamNonBlocking`: no implicit synchronization with the null stream.
pub const STREAM_NON_BLOCKING: u32 = 0x1;
/// `hipEventDisableTiming`.
pub const EVENT_DISABLE_TIMING: u32 = 0x2;
/// `hipHostAllocPortable`: pinned memory usable from every device.
pub const HOST_ALLOC_PORTABLE: u32 = 0x1;
/// `hipDeviceAttributeWarpSize` (`hipDeviceAttribute_t`, ROCm 5.0 and later).
pub const ATTRIBUTE_WARP_SIZE: i32 = 87;

/// Size of `hipDeviceProp_tR0600` and the offsets of the fields read from it.
pub const DEVICE_PROP_SIZE: usize = 1472;
pub const DEVICE_PROP_TOTAL_GLOBAL_MEM: usize = 288;
pub const DEVICE_PROP_WARP_SIZE: usize = 308;
pub const DEVICE_PROP_GCN_ARCH_NAME: usize = 1160;
/// Length of `gcnArchName`.
pub const GCN_ARCH_NAME_LEN: usize = 256;

/// File names of the HIP runtime, newest first.
pub const LIBRARY_NAMES: &[&str] = &[
    "libamdhip64.so",
    "libamdhip64.so.7",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
];

api! {
    /// The HIP runtime entry points used by the backend.
    pub struct HipApi {
        fn hipInit(flags: u32) -> HipError;
        fn hipGetDeviceCount(count: *mut i32) -> HipError;
        fn hipRuntimeGetVersion(version: *mut i32) -> HipError;
        fn hipSetDevice(device: i32) -> HipError;
        fn hipDeviceGetName(name: *mut c_char, len: i32, device: i32) -> HipError;
        fn hipDeviceGetAttribute(value: *mut i32, attribute: i32, device: i32) -> HipError;
        fn hipDeviceTotalMem(bytes: *mut usize, device: i32) -> HipError;
        fn hipMemGetInfo(free: *mut usize, total: *mut usize) -> HipError;
        fn hipDeviceSynchronize() -> HipError;
        fn hipMalloc(ptr: *mut *mut c_void, size: usize) -> HipError;
        fn hipFree(ptr: *mut c_void) -> HipError;
        fn hipHostAlloc(ptr: *mut *mut c_void, size: usize, flags: u32) -> HipError;
        fn hipFreeHost(ptr: *mut c_void) -> HipError;
        fn hipMemcpy(dst: *mut c_void, src: *const c_void, size: usize, kind: i32) -> HipError;
        fn hipMemcpyAsync(
            dst: *mut c_void,
            src: *const c_void,
            size: usize,
            kind: i32,
            stream: Stream,
        ) -> HipError;
        fn hipMemcpyPeerAsync(
            dst: *mut c_void,
            dst_device: i32,
            src: *const c_void,
            src_device: i32,
            size: usize,
            stream: Stream,
        ) -> HipError;
        fn hipMemset(dst: *mut c_void, value: i32, size: usize) -> HipError;
        fn hipStreamCreateWithFlags(stream: *mut Stream, flags: u32) -> HipError;
        fn hipStreamDestroy(stream: Stream) -> HipError;
        fn hipStreamSynchronize(stream: Stream) -> HipError;
        fn hipEventCreateWithFlags(event: *mut Event, flags: u32) -> HipError;
        fn hipEventRecord(event: Event, stream: Stream) -> HipError;
        fn hipEventSynchronize(event: Event) -> HipError;
        fn hipEventQuery(event: Event) -> HipError;
        fn hipEventDestroy(event: Event) -> HipError;
        fn hipModuleLoadData(module: *mut Module, image: *const c_void) -> HipError;
        fn hipModuleUnload(module: Module) -> HipError;
        fn hipModuleGetFunction(function: *mut Function, module: Module, name: *const c_char) -> HipError;
        fn hipModuleLaunchKernel(
            function: Function,
            grid_x: u32,
            grid_y: u32,
            grid_z: u32,
            block_x: u32,
            block_y: u32,
            block_z: u32,
            shared_bytes: u32,
            stream: Stream,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> HipError;
        fn hipGetErrorString(error: HipError) -> *const c_char;
    }
}

api! {
    /// The versioned device-properties query of ROCm 6 and later (absent from older runtimes).
    pub struct PropsApi {
        fn hipGetDevicePropertiesR0600(props: *mut u8, device: i32) -> HipError;
    }
}

impl HipApi {
    /// `Ok` for `hipSuccess`, else `what: <message> (hipError_t <code>)`.
    pub fn check(&self, what: &str, code: HipError) -> Result<(), String> {
        if code == SUCCESS {
            return Ok(());
        }
        // SAFETY: hipGetErrorString returns a static string for any code.
        let msg = unsafe { c_text((self.hipGetErrorString)(code)) };
        Err(format!("{what}: {msg} (hipError_t {code})"))
    }
}
