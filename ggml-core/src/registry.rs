//! The backend registry. Statically linked backends register a [`StaticBackend`] through `inventory`;
//! backends built as `cdylib` plugins are loaded at run time with `libloading` from a plugin directory
//! (`GGML_TP_PLUGIN_DIR`, else the executable's directory) through a C-ABI entry point whose
//! declaration carries an ABI version and a build id; a mismatch is refused with a clear error.

use crate::backend::{Backend, Communicator, Device};
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// A backend family (cpu, cuda, ...): its devices and, optionally, a communicator over its streams.
pub trait BackendReg: Send + Sync {
    /// Family name, e.g. `cpu`.
    fn name(&self) -> &str;
    /// Devices found; empty when the runtime or hardware is missing.
    fn devices(&self) -> Vec<Arc<dyn Device>>;
    /// Why there are no devices, when there are none.
    fn unavailable_reason(&self) -> Option<String> {
        None
    }
    /// An AllReduce communicator over streams of this family, if the family offers one.
    fn new_communicator(
        &self,
        _backends: &[Arc<dyn Backend>],
    ) -> Option<Result<Arc<dyn Communicator>>> {
        None
    }
}

/// A statically linked backend, submitted with `inventory::submit!`.
pub struct StaticBackend {
    pub name: &'static str,
    pub create: fn() -> Box<dyn BackendReg>,
}

inventory::collect!(StaticBackend);

/// Version of the plugin declaration layout and of the trait objects it hands over.
pub const PLUGIN_ABI_VERSION: u32 = 1;
const BUILD_ID_LEN: usize = 128;

/// The identity of this core build: crate version and compiler version.
pub const fn build_id() -> &'static str {
    concat!(
        "ggml-core ",
        env!("CARGO_PKG_VERSION"),
        "; ",
        env!("GGML_TP_RUSTC_VERSION")
    )
}

/// The C-ABI declaration a plugin exports (see [`export_plugin!`](crate::export_plugin)).
#[repr(C)]
pub struct PluginDecl {
    pub abi_version: u32,
    /// [`build_id`] of the core the plugin was built against, NUL-padded.
    pub build_id: [u8; BUILD_ID_LEN],
    /// Returns a `Box<Box<dyn BackendReg>>` as a raw pointer.
    pub create: unsafe extern "C" fn() -> *mut c_void,
}

impl PluginDecl {
    /// Declaration for a plugin whose registration is made by `create`.
    pub const fn new(create: unsafe extern "C" fn() -> *mut c_void) -> Self {
        let id = build_id().as_bytes();
        let mut build_id = [0u8; BUILD_ID_LEN];
        let mut i = 0;
        while i < id.len() && i < BUILD_ID_LEN {
            build_id[i] = id[i];
            i += 1;
        }
        PluginDecl {
            abi_version: PLUGIN_ABI_VERSION,
            build_id,
            create,
        }
    }
}

/// Boxes a registration for the plugin boundary (used by [`export_plugin!`](crate::export_plugin)).
pub fn into_plugin_ptr(reg: Box<dyn BackendReg>) -> *mut c_void {
    Box::into_raw(Box::new(reg)) as *mut c_void
}

/// Exports the plugin entry point of a cdylib backend. The symbol must be `ggml_tp_plugin_<family>`
/// for a library file named `libbackend_<family>.so` (`.dylib`, `backend_<family>.dll`):
/// `export_plugin!(ggml_tp_plugin_cpu, || Box::new(CpuReg::new()))`.
#[macro_export]
macro_rules! export_plugin {
    ($sym:ident, $create:expr) => {
        $crate::__plugin_fn!($sym, $create);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __plugin_fn {
    ($sym:ident, $create:expr) => {
        /// Plugin entry point: the declaration checked by the loader.
        #[no_mangle]
        pub extern "C" fn $sym() -> *const $crate::registry::PluginDecl {
            unsafe extern "C" fn create() -> *mut ::std::ffi::c_void {
                let make: fn() -> Box<dyn $crate::registry::BackendReg> = $create;
                $crate::registry::into_plugin_ptr(make())
            }
            static DECL: $crate::registry::PluginDecl = $crate::registry::PluginDecl::new(create);
            &DECL
        }
    };
}

struct Registry {
    backends: Vec<Arc<dyn BackendReg>>,
    plugin_errors: Vec<String>,
}

static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
// Loaded libraries are never unloaded: trait objects from them may live until exit.
static LIBRARIES: Mutex<Vec<libloading::Library>> = Mutex::new(Vec::new());

fn registry() -> &'static Mutex<Registry> {
    REGISTRY.get_or_init(|| {
        let mut backends: Vec<Arc<dyn BackendReg>> = Vec::new();
        for s in inventory::iter::<StaticBackend> {
            if !backends.iter().any(|b| b.name() == s.name) {
                backends.push(Arc::from((s.create)()));
            }
        }
        let mut reg = Registry {
            backends,
            plugin_errors: Vec::new(),
        };
        if let Some(dir) = plugin_dir() {
            for path in plugin_candidates(&dir) {
                match open_plugin(&path) {
                    Ok(b) if reg.backends.iter().any(|x| x.name() == b.name()) => {}
                    Ok(b) => reg.backends.push(b),
                    Err(e) => reg.plugin_errors.push(e.to_string()),
                }
            }
        }
        Mutex::new(reg)
    })
}

/// The plugin directory: `GGML_TP_PLUGIN_DIR` if set, else the executable's directory.
pub fn plugin_dir() -> Option<PathBuf> {
    if let Some(d) = &crate::settings::settings().plugin_dir {
        return Some(d.clone());
    }
    std::env::current_exe()
        .ok()?
        .parent()
        .map(Path::to_path_buf)
}

/// Files in `dir` that look like backend plugins (`libbackend_<family>.so`, `backend_<family>.dll`, ...).
pub fn plugin_candidates(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| plugin_family(p).is_some())
        .collect();
    out.sort();
    out
}

fn plugin_family(path: &Path) -> Option<String> {
    let ext = path.extension()?.to_str()?;
    if !matches!(ext, "so" | "dylib" | "dll") {
        return None;
    }
    let stem = path.file_stem()?.to_str()?;
    let stem = stem.strip_prefix("lib").unwrap_or(stem);
    let family = stem.strip_prefix("backend_")?;
    (!family.is_empty() && family.chars().all(|c| c.is_ascii_alphanumeric()))
        .then(|| family.to_string())
}

fn plugin_err(path: &Path, msg: impl Into<String>) -> Error {
    Error::Plugin {
        path: path.display().to_string(),
        msg: msg.into(),
    }
}

fn check_abi(abi: u32) -> std::result::Result<(), String> {
    if abi == PLUGIN_ABI_VERSION {
        Ok(())
    } else {
        Err(format!("plugin ABI version {abi}, this program expects {PLUGIN_ABI_VERSION}: rebuild the plugin"))
    }
}

fn check_build_id(id: &[u8; BUILD_ID_LEN]) -> std::result::Result<(), String> {
    let theirs = String::from_utf8_lossy(id)
        .trim_end_matches('\0')
        .to_string();
    if theirs == build_id() {
        Ok(())
    } else {
        Err(format!(
            "plugin built for \"{theirs}\", this program is \"{}\": rebuild the plugin",
            build_id()
        ))
    }
}

fn open_plugin(path: &Path) -> Result<Arc<dyn BackendReg>> {
    let family = plugin_family(path)
        .ok_or_else(|| plugin_err(path, "file name is not backend_<family>.<so|dylib|dll>"))?;
    // SAFETY: loading a library runs its initializers; plugins are trusted code from the plugin dir.
    let lib =
        unsafe { libloading::Library::new(path) }.map_err(|e| plugin_err(path, e.to_string()))?;
    let symbol = format!("ggml_tp_plugin_{family}\0");
    // SAFETY: the symbol, if present, has the signature declared by `export_plugin!`.
    let decl_fn = unsafe { lib.get::<extern "C" fn() -> *const PluginDecl>(symbol.as_bytes()) }
        .map_err(|e| plugin_err(path, format!("no entry point ggml_tp_plugin_{family}: {e}")))?;
    let decl_ptr = decl_fn();
    if decl_ptr.is_null() {
        return Err(plugin_err(path, "entry point returned null"));
    }
    // SAFETY: the ABI version is the first field and is checked before anything else is read.
    let abi = unsafe { std::ptr::addr_of!((*decl_ptr).abi_version).read() };
    check_abi(abi).map_err(|m| plugin_err(path, m))?;
    // SAFETY: same ABI version, so the declaration has this layout.
    let decl = unsafe { &*decl_ptr };
    check_build_id(&decl.build_id).map_err(|m| plugin_err(path, m))?;
    // SAFETY: `create` returns a `Box<Box<dyn BackendReg>>` made by `into_plugin_ptr` in a build with the
    // same core and compiler (checked above).
    let reg = unsafe { Box::from_raw((decl.create)() as *mut Box<dyn BackendReg>) };
    LIBRARIES.lock().push(lib);
    Ok(Arc::from(*reg))
}

/// Loads one plugin file. The family is added to the registry unless a family of that name is already
/// registered; the registration is returned either way.
pub fn load_plugin(path: &Path) -> Result<Arc<dyn BackendReg>> {
    let b = open_plugin(path)?;
    let mut reg = registry().lock();
    if !reg.backends.iter().any(|x| x.name() == b.name()) {
        reg.backends.push(b.clone());
    }
    Ok(b)
}

/// Every registered backend family.
pub fn backends() -> Vec<Arc<dyn BackendReg>> {
    registry().lock().backends.clone()
}

/// The family named `name`.
pub fn backend(name: &str) -> Option<Arc<dyn BackendReg>> {
    backends().into_iter().find(|b| b.name() == name)
}

/// Errors met while loading plugins from the plugin directory.
pub fn plugin_errors() -> Vec<String> {
    registry().lock().plugin_errors.clone()
}

/// Every device of every registered family.
pub fn devices() -> Vec<Arc<dyn Device>> {
    backends().iter().flat_map(|b| b.devices()).collect()
}

/// The device called `name` (e.g. `cpu:0`).
pub fn device(name: &str) -> Result<Arc<dyn Device>> {
    devices()
        .into_iter()
        .find(|d| d.name() == name)
        .ok_or_else(|| Error::NoDevice(name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_file_names() {
        assert_eq!(
            plugin_family(Path::new("/x/libbackend_cpu.so")).as_deref(),
            Some("cpu")
        );
        assert_eq!(
            plugin_family(Path::new("backend_cuda.dll")).as_deref(),
            Some("cuda")
        );
        assert_eq!(plugin_family(Path::new("/x/libbackend_cpu.rlib")), None);
        assert_eq!(plugin_family(Path::new("/x/libfoo.so")), None);
        assert_eq!(plugin_family(Path::new("/x/libbackend_.so")), None);
    }

    unsafe extern "C" fn null_create() -> *mut c_void {
        std::ptr::null_mut()
    }

    #[test]
    fn declaration_checks_refuse_mismatches() {
        let decl = PluginDecl::new(null_create);
        assert!(check_abi(decl.abi_version).is_ok());
        assert!(check_build_id(&decl.build_id).is_ok());
        let err = check_abi(PLUGIN_ABI_VERSION + 1).unwrap_err();
        assert!(err.contains("ABI version"), "{err}");
        let mut other = decl.build_id;
        other[0] ^= 1;
        assert!(check_build_id(&other).unwrap_err().contains("rebuild"));
    }

    #[test]
    fn missing_or_bad_plugin_is_an_error() {
        let dir = std::env::temp_dir().join(format!("ggml-tp-plugin-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fake = dir.join("libbackend_fake.so");
        std::fs::write(&fake, b"not a shared library").unwrap();
        let err = load_plugin(&fake)
            .err()
            .expect("a text file is not a plugin");
        assert!(err.to_string().contains("libbackend_fake.so"), "{err}");
        assert!(load_plugin(&dir.join("libbackend_none.so")).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}
