//! Our own thin FFI over the ROCm libraries, loaded at run time with `libloading`: [`open_library`]
//! finds a library by its file names in `$ROCM_PATH/lib`, `/opt/rocm/lib` and the loader's search
//! path, and [`api!`] declares a table of C entry points resolved from it by name. Nothing here
//! needs ROCm at build time. One module per library: [`hip`] (runtime), [`hiprtc`] (run-time
//! compiler), [`hipblas`], [`rccl`].

pub mod hip;
pub mod hipblas;
pub mod hiprtc;
pub mod rccl;

use libloading::Library;
use std::path::PathBuf;

/// Directories searched before the loader's own path: `$ROCM_PATH/lib`, then `/opt/rocm/lib`.
fn rocm_lib_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(root) = std::env::var_os("ROCM_PATH") {
        dirs.push(PathBuf::from(root).join("lib"));
    }
    dirs.push(PathBuf::from("/opt/rocm/lib"));
    dirs
}

/// Opens the first of `names` (file names such as `libamdhip64.so`) that loads, trying the ROCm
/// directories first. The error names the first file, where it was looked for, and the loader's
/// message: for a file that exists but does not load (a missing dependency, say) if there is one,
/// else for the first name.
pub fn open_library(names: &[&str]) -> Result<Library, String> {
    let dirs = rocm_lib_dirs();
    let (mut first, mut present) = (None, None);
    for name in names {
        let in_dirs = dirs.iter().map(|d| d.join(name)).filter(|p| p.exists());
        for (path, exists) in in_dirs
            .map(|p| (p, true))
            .chain(std::iter::once((PathBuf::from(name), false)))
        {
            // SAFETY: loading a ROCm library runs its initializers, which is how it is meant to be
            // used; nothing else is called until its symbols are resolved.
            match unsafe { Library::new(&path) } {
                Ok(lib) => return Ok(lib),
                Err(e) if exists => present = present.or(Some(e.to_string())),
                Err(e) => first = first.or(Some(e.to_string())),
            }
        }
    }
    let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    Err(format!(
        "{} not found in {} or the loader path ({})",
        names.first().copied().unwrap_or("library"),
        dirs.join(", "),
        present.or(first).unwrap_or_default()
    ))
}

/// Declares a table of C entry points resolved from one library by their names:
/// `api! { pub struct Foo { fn fooInit(flags: u32) -> i32; } }` gives `Foo::load(library)` and a
/// field `fooInit` holding the function pointer. The table keeps the library loaded.
macro_rules! api {
    ($(#[$meta:meta])* pub struct $table:ident {
        $($(#[$fmeta:meta])* fn $func:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty;)*
    }) => {
        $(#[$meta])*
        #[allow(non_snake_case)]
        pub struct $table {
            $($(#[$fmeta])* pub $func: unsafe extern "C" fn($($ty),*) -> $ret,)*
            _library: ::libloading::Library,
        }

        impl $table {
            /// Resolves every entry point from `library`; the error names the first one missing.
            pub fn load(library: ::libloading::Library) -> Result<Self, String> {
                $(
                    // SAFETY: the symbol is declared with its C signature from the ROCm headers; the
                    // pointer stays valid because the table owns the library.
                    #[allow(non_snake_case)]
                    let $func = unsafe {
                        *library
                            .get::<unsafe extern "C" fn($($ty),*) -> $ret>(
                                concat!(stringify!($func), "\0").as_bytes(),
                            )
                            .map_err(|e| format!("symbol {}: {e}", stringify!($func)))?
                    };
                )*
                Ok($table { $($func,)* _library: library })
            }
        }
    };
}
pub(crate) use api;

/// Text of a C string returned by a library (`"?"` for null).
///
/// # Safety
/// `p` is null or points to a NUL-terminated string that lives for the call.
pub unsafe fn c_text(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return "?".into();
    }
    // SAFETY: non-null and NUL-terminated (caller's contract).
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_is_a_one_line_reason() {
        let e = open_library(&["libggml_tp_no_such_library.so"]).expect_err("no such library");
        assert!(
            e.starts_with("libggml_tp_no_such_library.so not found"),
            "{e}"
        );
        assert!(e.contains("/opt/rocm/lib"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }

    api! {
        /// Two C library functions, to exercise the table macro without ROCm.
        pub struct Libc {
            fn strlen(s: *const std::ffi::c_char) -> usize;
            fn abs(v: i32) -> i32;
        }
    }

    api! {
        #[allow(dead_code)] // only its loading is tested: it must fail
        pub struct Missing {
            fn ggml_tp_no_such_symbol() -> i32;
        }
    }

    fn libc() -> Library {
        open_library(&["libc.so.6"]).expect("the C library loads")
    }

    #[test]
    fn api_tables_resolve_symbols_by_name() {
        let c = Libc::load(libc()).unwrap();
        // SAFETY: strlen of a NUL-terminated literal; abs of an int.
        unsafe {
            assert_eq!((c.strlen)(c"hiprtc".as_ptr()), 6);
            assert_eq!((c.abs)(-7), 7);
        }
        let e = Missing::load(libc())
            .err()
            .expect("the symbol does not exist");
        assert!(e.starts_with("symbol ggml_tp_no_such_symbol:"), "{e}");
    }

    #[test]
    fn c_text_of_null_and_of_a_string() {
        // SAFETY: null, then a NUL-terminated literal.
        unsafe {
            assert_eq!(c_text(std::ptr::null()), "?");
            assert_eq!(c_text(c"hipSuccess".as_ptr()), "hipSuccess");
        }
    }
}
