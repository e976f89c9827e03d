//! The NCCL library, loaded at run time: `$GGML_TP_NCCL_LIB` when set, else `libnccl.so`, else
//! `libnccl.so.2` (what NVIDIA's packages install without a development link). Only the few entry
//! points the communicator uses are resolved; every call returns NCCL's error string on failure.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

/// An opaque NCCL communicator handle.
pub type RawComm = *mut c_void;

/// NCCL's `ncclUniqueId`: the 128 bytes rank 0 creates and every rank passes to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub [u8; 128]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId({:02x?}..)", &self.0[..8])
    }
}

/// `ncclDataType_t` codes.
pub const NCCL_FLOAT16: c_int = 6;
pub const NCCL_FLOAT32: c_int = 7;
pub const NCCL_BFLOAT16: c_int = 9;
/// `ncclSum`.
const NCCL_SUM: c_int = 0;

type GetUniqueId = unsafe extern "C" fn(*mut UniqueId) -> c_int;
type CommInitRank = unsafe extern "C" fn(*mut RawComm, c_int, UniqueId, c_int) -> c_int;
type CommInitAll = unsafe extern "C" fn(*mut RawComm, c_int, *const c_int) -> c_int;
type CommDestroy = unsafe extern "C" fn(RawComm) -> c_int;
type AllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    RawComm,
    *mut c_void,
) -> c_int;
type Group = unsafe extern "C" fn() -> c_int;
type ErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
type GetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;

/// The resolved entry points (the library stays loaded for the life of the process).
pub struct Nccl {
    _lib: libloading::Library,
    /// Which file was opened.
    pub path: String,
    get_unique_id: GetUniqueId,
    comm_init_rank: CommInitRank,
    comm_init_all: CommInitAll,
    comm_destroy: CommDestroy,
    all_reduce: AllReduce,
    group_start: Group,
    group_end: Group,
    error_string: ErrorString,
    get_version: GetVersion,
}

/// The library names tried, in order.
fn candidates() -> Vec<String> {
    let configured = crate::settings::settings().nccl_lib.as_ref();
    let mut c: Vec<String> = configured
        .map(|p| p.display().to_string())
        .into_iter()
        .collect();
    c.extend(["libnccl.so".to_string(), "libnccl.so.2".to_string()]);
    c
}

fn open() -> Result<Nccl, String> {
    let mut tried = Vec::new();
    for name in candidates() {
        // SAFETY: NCCL's initializers have no preconditions.
        match unsafe { libloading::Library::new(&name) } {
            Ok(lib) => return resolve(lib, name),
            Err(e) => tried.push(format!("{name}: {e}")),
        }
    }
    Err(format!("NCCL not found ({})", tried.join("; ")))
}

fn resolve(lib: libloading::Library, path: String) -> Result<Nccl, String> {
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol has the C signature of the field it is stored in (nccl.h).
            *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("{path}: no {}: {e}", $name))?
        };
    }
    Ok(Nccl {
        get_unique_id: sym!("ncclGetUniqueId"),
        comm_init_rank: sym!("ncclCommInitRank"),
        comm_init_all: sym!("ncclCommInitAll"),
        comm_destroy: sym!("ncclCommDestroy"),
        all_reduce: sym!("ncclAllReduce"),
        group_start: sym!("ncclGroupStart"),
        group_end: sym!("ncclGroupEnd"),
        error_string: sym!("ncclGetErrorString"),
        get_version: sym!("ncclGetVersion"),
        _lib: lib,
        path,
    })
}

/// The NCCL library, or why it cannot be used (opened once).
pub fn library() -> Result<&'static Nccl, String> {
    static LIB: OnceLock<Result<Nccl, String>> = OnceLock::new();
    LIB.get_or_init(open).as_ref().map_err(Clone::clone)
}

impl Nccl {
    fn check(&self, what: &str, code: c_int) -> Result<(), String> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: NCCL returns a static string for every code.
        let msg = unsafe { CStr::from_ptr((self.error_string)(code)) };
        Err(format!("{what}: {} (code {code})", msg.to_string_lossy()))
    }

    /// NCCL's version code (e.g. 22803 for 2.28.3).
    pub fn version(&self) -> Result<i32, String> {
        let mut v = 0;
        // SAFETY: `v` is a valid out-pointer.
        self.check("ncclGetVersion", unsafe { (self.get_version)(&mut v) })?;
        Ok(v)
    }

    pub fn unique_id(&self) -> Result<UniqueId, String> {
        let mut id = UniqueId([0; 128]);
        // SAFETY: `id` is a valid out-pointer of NCCL's layout.
        self.check("ncclGetUniqueId", unsafe { (self.get_unique_id)(&mut id) })?;
        Ok(id)
    }

    /// One communicator per device of `devices` (CUDA ordinals), all in this process.
    pub fn init_all(&self, devices: &[c_int]) -> Result<Vec<RawComm>, String> {
        let mut raw = vec![std::ptr::null_mut(); devices.len()];
        // SAFETY: `raw` has room for one communicator per device.
        let code =
            unsafe { (self.comm_init_all)(raw.as_mut_ptr(), raw.len() as c_int, devices.as_ptr()) };
        self.check(&format!("ncclCommInitAll over {devices:?}"), code)?;
        Ok(raw)
    }

    /// Rank `rank` of `n_ranks` joining the job of `id`, on the device whose context is current.
    pub fn init_rank(&self, n_ranks: usize, id: UniqueId, rank: usize) -> Result<RawComm, String> {
        let mut comm = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; NCCL blocks until every rank joined.
        let code = unsafe { (self.comm_init_rank)(&mut comm, n_ranks as c_int, id, rank as c_int) };
        self.check(&format!("ncclCommInitRank {rank} of {n_ranks}"), code)?;
        Ok(comm)
    }

    /// # Safety
    /// `comm` came from [`Nccl::init_all`] or [`Nccl::init_rank`] and is destroyed once.
    pub unsafe fn destroy(&self, comm: RawComm) {
        // SAFETY: the caller's contract.
        let _ = unsafe { (self.comm_destroy)(comm) };
    }

    /// Queues an in-place sum of `count` elements of NCCL type `dtype` at `ptr` on `stream`.
    ///
    /// # Safety
    /// `ptr` addresses `count` elements on the communicator's device and `stream` is a live stream of
    /// that device.
    pub unsafe fn all_reduce_in_place(
        &self,
        ptr: u64,
        count: usize,
        dtype: c_int,
        comm: RawComm,
        stream: *mut c_void,
    ) -> Result<(), String> {
        let p = ptr as *mut c_void;
        // SAFETY: the caller's contract.
        let code = unsafe { (self.all_reduce)(p, p, count, dtype, NCCL_SUM, comm, stream) };
        self.check("ncclAllReduce", code)
    }

    pub fn group_start(&self) -> Result<(), String> {
        // SAFETY: no arguments.
        self.check("ncclGroupStart", unsafe { (self.group_start)() })
    }

    pub fn group_end(&self) -> Result<(), String> {
        // SAFETY: no arguments.
        self.check("ncclGroupEnd", unsafe { (self.group_end)() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_or_says_why() {
        match library() {
            Ok(n) => println!("NCCL {} from {}", n.version().unwrap(), n.path),
            Err(e) => {
                assert!(e.contains("libnccl.so.2"), "{e}");
                println!("skipped: no NCCL ({e})");
            }
        }
    }
}
