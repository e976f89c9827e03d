//! SHA-256 helpers: hashing while copying, of a whole file, and hex formatting.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::CacheError;

/// Lower-case hex of a digest.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The sha256 (hex) and size of a file.
pub fn sha256_file(path: &Path) -> Result<(String, u64), CacheError> {
    let mut file =
        File::open(path).map_err(CacheError::io(format!("opening {}", path.display())))?;
    let mut hasher = Sha256::new();
    let size = copy_hashed(&mut file, &mut io::sink(), &mut hasher)
        .map_err(CacheError::io(format!("reading {}", path.display())))?;
    Ok((hex(&hasher.finalize()), size))
}

/// Copies `reader` to `writer` while hashing it; returns the byte count.
pub fn copy_hashed(
    reader: &mut impl Read,
    writer: &mut impl Write,
    hasher: &mut Sha256,
) -> io::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        writer.write_all(&buf[..n])?;
        total += n as u64;
    }
}
