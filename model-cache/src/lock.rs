//! An exclusive lock on a file (`flock`), so that two clones fetching the same model into the shared
//! cache take turns: the kernel releases it when the holder ends, even if it is killed.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::CacheError;

/// A held lock; dropping it releases the lock.
pub struct FileLock {
    _file: File,
}

/// Applies `flock` with `operation` to `file`, retrying when a signal interrupts it.
fn flock(file: &File, operation: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: flock takes a file descriptor that `file` keeps open for the whole call.
        if unsafe { libc::flock(file.as_raw_fd(), operation) } == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

fn open(path: &Path) -> Result<File, CacheError> {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(CacheError::io(format!(
            "opening the lock file {}",
            path.display()
        )))
}

fn locking(path: &Path) -> impl FnOnce(io::Error) -> CacheError {
    CacheError::io(format!("locking {}", path.display()))
}

impl FileLock {
    /// The lock on `path` (created if missing) if no one holds it now, else `None`.
    pub fn try_acquire(path: &Path) -> Result<Option<FileLock>, CacheError> {
        let file = open(path)?;
        match flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
            Ok(()) => Ok(Some(FileLock { _file: file })),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(locking(path)(e)),
        }
    }

    /// The lock on `path`, waiting for its holder (after saying so on stderr) when there is one.
    pub fn acquire(path: &Path, what: &str) -> Result<FileLock, CacheError> {
        if let Some(lock) = FileLock::try_acquire(path)? {
            return Ok(lock);
        }
        eprintln!(
            "another process is fetching {what}; waiting for it ({})",
            path.display()
        );
        let file = open(path)?;
        flock(&file, libc::LOCK_EX).map_err(locking(path))?;
        Ok(FileLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::FileLock;

    #[test]
    fn a_held_lock_keeps_others_out_until_dropped() {
        let dir = std::env::temp_dir().join(format!("model-cache-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.lock");
        let first = FileLock::try_acquire(&path).unwrap().expect("a free lock");
        assert!(FileLock::try_acquire(&path).unwrap().is_none());
        drop(first);
        let again = FileLock::acquire(&path, "the test model").unwrap();
        assert!(FileLock::try_acquire(&path).unwrap().is_none());
        drop(again);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
