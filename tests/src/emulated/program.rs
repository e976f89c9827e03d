//! The shared kernel sources built for the host: the host prelude (`prelude_host.h`), the sources
//! of `ggml_gpu::kernels` (dynamic shared memory declarations rewritten as pointers), the fiber
//! scheduler (`fibers.cpp`) and a table of every kernel's entry point, compiled with a C++ compiler
//! into a shared library (cached in the temporary directory by a hash of its source) and loaded.

use super::Flavor;
use ggml_core::{Error, Result};
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;

const PRELUDE: &str = include_str!("prelude_host.h");
const FIBERS: &str = include_str!("fibers.cpp");

fn fail(msg: String) -> Error {
    Error::Backend {
        backend: "emulated".into(),
        msg,
    }
}

/// `emu_run` of `fibers.cpp`.
type RunFn = unsafe extern "C" fn(
    entry: *const c_void,
    args: *const *const c_void,
    grid: *const u32,
    threads: u32,
    shared_bytes: u32,
    error: *mut c_char,
    error_len: usize,
) -> i32;

/// One entry of the generated kernel table.
#[repr(C)]
struct KernelEntry {
    name: *const c_char,
    entry: *const c_void,
}

/// The kernels of one warp size, loaded.
pub struct HostProgram {
    run: RunFn,
    entries: HashMap<String, usize>,
    _library: libloading::Library,
}

// SAFETY: the library stays loaded while the program lives; its entry points are plain functions
// whose per-launch state is thread-local.
unsafe impl Send for HostProgram {}
unsafe impl Sync for HostProgram {}

/// The whole translation unit for `flavor`.
pub fn source(flavor: Flavor) -> String {
    let mut kernels = String::new();
    for line in ggml_gpu::kernels::shared_source().lines() {
        kernels.push_str(&dynamic_shared_as_pointer(line));
        kernels.push('\n');
    }
    let names = ggml_gpu::dispatch::kernel_names();
    let table: Vec<String> = names
        .iter()
        .map(|n| format!("    {{\"{n}\", &EmuEntry<&{n}>::call}},"))
        .collect();
    format!(
        "#define WARP_SIZE {}\n#define EMU_WAVES_SKIP_EXITED_LANES {}\n{PRELUDE}\nunsigned char* emu_dynamic_shared();\n{kernels}\n{FIBERS}\n\
         extern \"C\" const EmuKernel emu_kernels[] = {{\n{}\n}};\n\
         extern \"C\" const unsigned emu_kernel_count = {};\n",
        flavor.warp_size(),
        u8::from(flavor == Flavor::Hip),
        table.join("\n"),
        names.len()
    )
}

/// `extern __shared__ T name[];` as `T* name = (T*)emu_dynamic_shared();`; other lines unchanged.
fn dynamic_shared_as_pointer(line: &str) -> String {
    let t = line.trim();
    match t
        .strip_prefix("extern __shared__ ")
        .and_then(|rest| rest.strip_suffix("[];"))
        .and_then(|decl| decl.rsplit_once(' '))
    {
        Some((ty, name)) => {
            let indent = &line[..line.len() - line.trim_start().len()];
            format!("{indent}{ty}* {name} = ({ty}*)emu_dynamic_shared();")
        }
        None => line.to_string(),
    }
}

/// A C++ compiler: its command and whether it is clang (whose option for trapping checks differs
/// from GCC's).
struct Compiler {
    command: String,
    clang: bool,
}

/// The C++ compiler: `CXX`, else the first of clang++-16, clang++, g++ and c++ that runs.
fn compiler() -> Result<Compiler> {
    let candidates: Vec<String> = match std::env::var("CXX") {
        Ok(c) => vec![c],
        Err(_) => ["clang++-16", "clang++", "g++", "c++"]
            .map(String::from)
            .to_vec(),
    };
    candidates
        .into_iter()
        .find_map(|command| {
            let out = Command::new(&command).arg("--version").output().ok()?;
            let clang = String::from_utf8_lossy(&out.stdout).contains("clang");
            out.status.success().then_some(Compiler { command, clang })
        })
        .ok_or_else(|| {
            fail("no C++ compiler for the host kernels: install clang-16 or g++, or set CXX".into())
        })
}

/// Compiles `src` into a shared library under the temporary directory, unless one built from the
/// same source by the same compiler is there already.
fn build(src: &str, label: &str) -> Result<PathBuf> {
    let Compiler {
        command: cxx,
        clang,
    } = compiler()?;
    let mut h = DefaultHasher::new();
    (src, &cxx).hash(&mut h);
    let dir = std::env::temp_dir().join("ggml-tp-host-kernels");
    std::fs::create_dir_all(&dir).map_err(|e| fail(format!("creating {}: {e}", dir.display())))?;
    let lib = dir.join(format!("kernels-{label}-{:016x}.so", h.finish()));
    if lib.exists() {
        return Ok(lib);
    }
    let tag = format!("{}-{:?}", std::process::id(), std::thread::current().id());
    let cpp = dir.join(format!("kernels-{label}-{tag}.cpp"));
    let tmp = dir.join(format!("kernels-{label}-{tag}.so.part"));
    std::fs::write(&cpp, src).map_err(|e| fail(format!("writing {}: {e}", cpp.display())))?;
    // Misaligned accesses and indices outside arrays trap (see fibers.cpp), without a runtime.
    let traps: &[&str] = if clang {
        &[
            "-fsanitize=alignment,bounds",
            "-fsanitize-trap=alignment,bounds",
        ]
    } else {
        &[
            "-fsanitize=alignment,bounds",
            "-fsanitize-undefined-trap-on-error",
        ]
    };
    let out = Command::new(&cxx)
        .args([
            "-std=c++17",
            "-O2",
            "-fno-strict-aliasing",
            "-fPIC",
            "-shared",
            "-w",
        ])
        .args(traps)
        .arg("-o")
        .arg(&tmp)
        .arg(&cpp)
        .output()
        .map_err(|e| fail(format!("running {cxx}: {e}")))?;
    let _ = std::fs::remove_file(&cpp);
    if !out.status.success() {
        return Err(fail(format!(
            "{cxx} could not compile the host kernels:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    // A rename is atomic: a test process running beside this one sees the whole library or none.
    std::fs::rename(&tmp, &lib).map_err(|e| fail(format!("renaming {}: {e}", tmp.display())))?;
    Ok(lib)
}

impl HostProgram {
    /// Builds (or finds in the cache) and loads the kernels of `flavor`.
    pub fn load(flavor: Flavor) -> Result<HostProgram> {
        let path = build(&source(flavor), flavor.name())?;
        Self::open(&path)
    }

    fn open(path: &Path) -> Result<HostProgram> {
        let what = |e: libloading::Error| fail(format!("loading {}: {e}", path.display()));
        // SAFETY: the library is ours, built from the source above; loading runs no initializer
        // beyond the C++ runtime's.
        let library = unsafe { libloading::Library::new(path) }.map_err(what)?;
        // SAFETY: the symbols have the types declared in `fibers.cpp` and the generated table.
        let (run, entries) = unsafe {
            let run: RunFn = *library.get::<RunFn>(b"emu_run\0").map_err(what)?;
            let table = *library
                .get::<*const KernelEntry>(b"emu_kernels\0")
                .map_err(what)?;
            let count = **library
                .get::<*const u32>(b"emu_kernel_count\0")
                .map_err(what)?;
            let entries = std::slice::from_raw_parts(table, count as usize)
                .iter()
                .map(|e| {
                    let name = CStr::from_ptr(e.name).to_string_lossy().into_owned();
                    (name, e.entry as usize)
                })
                .collect();
            (run, entries)
        };
        Ok(HostProgram {
            run,
            entries,
            _library: library,
        })
    }

    /// Runs kernel `name` on `grid` blocks of `threads` threads; `args` point at each argument's
    /// value, in the kernel's parameter order.
    pub fn run(
        &self,
        name: &str,
        grid: [u32; 3],
        threads: u32,
        shared_bytes: u32,
        args: &[*const c_void],
    ) -> Result<()> {
        let entry = *self
            .entries
            .get(name)
            .ok_or_else(|| fail(format!("no kernel {name}")))?;
        let mut error = [0 as c_char; 512];
        // SAFETY: `entry` unpacks exactly the kernel's parameters from `args` (the dispatch passes
        // them in the kernel's order, a property checked by the HIP dispatch test); the addresses
        // inside them point into live host buffers or scratch.
        let rc = unsafe {
            (self.run)(
                entry as *const c_void,
                args.as_ptr(),
                grid.as_ptr(),
                threads,
                shared_bytes,
                error.as_mut_ptr(),
                error.len(),
            )
        };
        if rc != 0 {
            // SAFETY: `emu_run` wrote a NUL-terminated message into `error`.
            let msg = unsafe { CStr::from_ptr(error.as_ptr()) };
            return Err(fail(format!("{name}: {}", msg.to_string_lossy())));
        }
        Ok(())
    }
}
