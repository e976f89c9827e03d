//! Run-time probing of the CUDA libraries. cudarc panics when it calls into a library it cannot
//! load, so nothing touches cudarc before [`probe`] has checked that the driver and NVRTC (and
//! cuBLAS) can be opened; without them the family has zero devices and a one-line reason.

/// Why CUDA cannot be used here, or `Ok` when the driver, NVRTC and cuBLAS libraries load.
pub fn probe() -> Result<(), String> {
    // SAFETY: each check only tries to open the library with `libloading`.
    let (driver, nvrtc, cublas) = unsafe {
        (
            cudarc::driver::sys::is_culib_present(),
            cudarc::nvrtc::sys::is_culib_present(),
            cudarc::cublas::sys::is_culib_present(),
        )
    };
    if !driver {
        return Err("libcuda.so.1 not found: no NVIDIA driver on this machine".into());
    }
    if !nvrtc {
        return Err(
            "libnvrtc not found: the CUDA runtime compiler is needed for the kernels".into(),
        );
    }
    if !cublas {
        return Err("libcublas not found: cuBLAS is needed for mul_mat".into());
    }
    Ok(())
}

/// True when the NCCL library loads (see [`crate::nccl`]), so that a communicator can be offered.
pub fn nccl_present() -> bool {
    crate::nccl::library().is_ok()
}

/// Runs `f`, turning a panic inside a CUDA library wrapper into an error message.
pub fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(format!("{what}: {msg}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_gives_a_reason_or_ok() {
        match probe() {
            Ok(()) => println!("CUDA libraries present"),
            Err(r) => {
                assert!(r.contains("not found"), "{r}");
                println!("skipped: no CUDA device ({r})");
            }
        }
    }

    #[test]
    fn guarded_turns_panics_into_errors() {
        let r: Result<(), String> = guarded("x", || panic!("boom"));
        assert_eq!(r.unwrap_err(), "x: boom");
        assert_eq!(guarded("x", || Ok(3)), Ok(3));
    }
}
