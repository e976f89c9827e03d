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
    if let Some(root) = &crate::settings::settings().rocm_path {
        dirs.push(root.join("lib"));
    }
    dirs.push(PathBuf::from("/opt/rocm/lib"));
    dirs
}

/// Opens the first of `names` (file names such as `libamdhip64.so`) that loads, trying the ROCm
/// directories first. The error names the first file and where it was looked for, with the
/// loader's message when a file was there but did not load (a missing dependency, say).
pub fn open_library(names: &[&str]) -> Result<Library, String> {
    let dirs = rocm_lib_dirs();
    let mut failure = None;
    for name in names {
        let absent = format!("{name}: cannot open shared object file");
        let paths = dirs
            .iter()
            .map(|d| d.join(name))
            .filter(|p| p.exists())
            .chain(std::iter::once(PathBuf::from(name)));
        for path in paths {
            // SAFETY: loading a ROCm library runs its initializers, which is how it is meant to be
            // used; nothing else is called until its symbols are resolved.
            match unsafe { Library::new(&path) } {
                Ok(lib) => return Ok(lib),
                Err(e) if !e.to_string().starts_with(&absent) => {
                    failure = failure.or(Some(e.to_string()))
                }
                Err(_) => {}
            }
        }
    }
    let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    let first = names.first().copied().unwrap_or("library");
    let places = format!("{} or the loader path", dirs.join(", "));
    Err(match failure {
        Some(f) => format!("{first} does not load from {places} ({f})"),
        None => format!("{first} not found in {places}"),
    })
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
            e.starts_with("libggml_tp_no_such_library.so not found in "),
            "{e}"
        );
        assert!(e.ends_with("/opt/rocm/lib or the loader path"), "{e}");
    }

    #[test]
    fn a_library_that_is_there_but_does_not_load_says_why() {
        let dir = std::env::temp_dir().join(format!("ggml-tp-hip-ffi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bogus = dir.join("libggml_tp_bogus.so");
        std::fs::write(&bogus, b"not a shared library").unwrap();
        let name = bogus.display().to_string();
        let e = open_library(&[name.as_str()]).expect_err("a text file does not load");
        std::fs::remove_dir_all(&dir).ok();
        assert!(e.starts_with(&format!("{name} does not load from ")), "{e}");
        assert!(
            e.contains("libggml_tp_bogus.so:"),
            "the loader's message: {e}"
        );
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
