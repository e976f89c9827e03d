//! The kernels on HIP devices. The device code and the list of entry points are `ggml_gpu`'s
//! behind the HIP vendor prelude ([`ggml_gpu::kernels::program`]); what to launch is decided by
//! `ggml_gpu::dispatch`. This module compiles the program with hiprtc for one device's gfx
//! target, loads it as a module and queues the dispatch's launches on a stream ([`Kernels`]).

use crate::device::DeviceCtx;
use crate::ffi::hip::{Function, Module};
use crate::ffi::hiprtc::Program;
use crate::stream::HipStream;
use crate::{check, err};
use ggml_core::Result;
use ggml_gpu::dispatch::{kernel_names, KernelArg, Launch};
use ggml_gpu::kernels::{program, Vendor};
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};

/// Name of the program in hiprtc's messages.
const PROGRAM_NAME: &CStr = c"ggml_tp_kernels.hip";

/// A hiprtc program, destroyed on drop.
struct RtcProgram<'a> {
    ctx: &'a DeviceCtx,
    handle: Program,
}

impl Drop for RtcProgram<'_> {
    fn drop(&mut self) {
        let rtc = &self.ctx.runtime().rtc;
        // SAFETY: created by hiprtcCreateProgram, destroyed once.
        let _ = unsafe { (rtc.hiprtcDestroyProgram)(&mut self.handle) };
    }
}

impl RtcProgram<'_> {
    /// The compiler's log (empty when it has none).
    fn log(&self) -> String {
        let rtc = &self.ctx.runtime().rtc;
        let mut size = 0usize;
        // SAFETY: the program is live; writes one size.
        if unsafe { (rtc.hiprtcGetProgramLogSize)(self.handle, &mut size) } != 0 || size == 0 {
            return String::new();
        }
        let mut log = vec![0u8; size];
        // SAFETY: `log` has the size hiprtc asked for.
        if unsafe { (rtc.hiprtcGetProgramLog)(self.handle, log.as_mut_ptr() as *mut c_char) } != 0 {
            return String::new();
        }
        String::from_utf8_lossy(&log)
            .trim_end_matches('\0')
            .trim()
            .to_string()
    }
}

/// Compiles `source` for `arch` (e.g. `gfx90a:sramecc+:xnack-`; when `None`, hiprtc compiles for
/// the current device, which the caller binds) into a code object. The language level is C++17 as
/// in NVRTC and the clang syntax check.
fn compile(
    ctx: &DeviceCtx,
    source: &str,
    arch: Option<&str>,
) -> std::result::Result<Vec<u8>, String> {
    let rtc = &ctx.runtime().rtc;
    let src = CString::new(source).map_err(|_| "kernel source holds a NUL byte".to_string())?;
    let mut handle: Program = std::ptr::null_mut();
    // SAFETY: both strings are NUL-terminated; no headers are passed.
    let created = unsafe {
        (rtc.hiprtcCreateProgram)(
            &mut handle,
            src.as_ptr(),
            PROGRAM_NAME.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    rtc.check("hiprtcCreateProgram", created)?;
    let program = RtcProgram { ctx, handle };
    let mut options = vec![CString::from(c"-O3"), CString::from(c"-std=c++17")];
    if let Some(arch) = arch {
        let option = format!("--gpu-architecture={arch}");
        options.push(CString::new(option).map_err(|e| e.to_string())?);
    }
    let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: the program is live; `option_ptrs` holds that many NUL-terminated strings.
    let compiled = unsafe {
        (rtc.hiprtcCompileProgram)(handle, option_ptrs.len() as i32, option_ptrs.as_ptr())
    };
    if let Err(e) = rtc.check("hiprtc compile", compiled) {
        return Err(format!("{e}: {}", program.log()));
    }
    let mut size = 0usize;
    // SAFETY: the program compiled; writes one size.
    rtc.check("hiprtcGetCodeSize", unsafe {
        (rtc.hiprtcGetCodeSize)(handle, &mut size)
    })?;
    let mut code = vec![0u8; size];
    // SAFETY: `code` has the size hiprtc gave.
    rtc.check("hiprtcGetCode", unsafe {
        (rtc.hiprtcGetCode)(handle, code.as_mut_ptr() as *mut c_char)
    })?;
    Ok(code)
}

/// The loaded kernels of one device.
pub struct Kernels {
    ctx: DeviceCtx,
    module: Module,
    functions: HashMap<String, Function>,
}

// SAFETY: HIP modules and functions may be used from any thread; the map is not changed after
// loading.
unsafe impl Send for Kernels {}
unsafe impl Sync for Kernels {}

impl Drop for Kernels {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: loaded in `compile`, unloaded once; no backend holds these kernels any more.
            let _ = unsafe { (self.ctx.runtime().hip.hipModuleUnload)(self.module) };
        }
    }
}

impl Kernels {
    /// Compiles the program for the device of `ctx` (gfx target `arch`, wavefronts of `warp_size`
    /// lanes) and loads every kernel.
    pub fn compile(
        ctx: DeviceCtx,
        arch: Option<&str>,
        warp_size: u32,
    ) -> std::result::Result<Kernels, String> {
        let source = program(Vendor::Hip { warp_size });
        ctx.bind().map_err(|e| e.to_string())?;
        let code = compile(&ctx, &source, arch)?;
        let hip = &ctx.runtime().hip;
        let mut module: Module = std::ptr::null_mut();
        // SAFETY: `code` is a complete code object from hiprtc.
        hip.check("hipModuleLoadData", unsafe {
            (hip.hipModuleLoadData)(&mut module, code.as_ptr() as *const c_void)
        })?;
        let mut kernels = Kernels {
            ctx,
            module,
            functions: HashMap::new(),
        };
        for name in kernel_names() {
            let c_name = CString::new(name.as_str()).map_err(|e| e.to_string())?;
            let mut f: Function = std::ptr::null_mut();
            // SAFETY: the module is loaded; the name is NUL-terminated.
            hip.check(&format!("kernel {name}"), unsafe {
                (hip.hipModuleGetFunction)(&mut f, module, c_name.as_ptr())
            })?;
            kernels.functions.insert(name, f);
        }
        Ok(kernels)
    }

    /// Queues `launch` on `stream` (of this device, which is current on the calling thread).
    pub fn launch(&self, stream: &HipStream, launch: &Launch) -> Result<()> {
        let f = *self
            .functions
            .get(launch.kernel.as_ref())
            .ok_or_else(|| err(format!("no kernel {}", launch.kernel)))?;
        // HIP grids count work-items in 32 bits per axis.
        let [gx, gy, gz] = launch.grid;
        if u64::from(gx) * u64::from(launch.threads) >= 1 << 32 {
            return Err(err(format!(
                "{}: {gx} blocks of {} threads exceed a HIP grid",
                launch.kernel, launch.threads
            )));
        }
        let mut params: Vec<*mut c_void> = launch.args.iter().map(KernelArg::address).collect();
        let hip = &self.ctx.runtime().hip;
        // SAFETY: every argument matches the kernel's parameter list (a tested property of the
        // dispatch) and outlives the call, which copies them; tensor addresses lie in live buffers
        // of this device.
        check(hip.check(&launch.kernel, unsafe {
            (hip.hipModuleLaunchKernel)(
                f,
                gx,
                gy,
                gz,
                launch.threads,
                1,
                1,
                launch.shared_bytes,
                stream.raw(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }))
    }
}
