//! SHA-256 helpers: of a file (streamed) and hex formatting.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

/// Lower-case hex of a digest.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The sha256 (hex) and size of a file, read in chunks.
pub fn sha256_file(path: &Path) -> Result<(String, u64)> {
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    let size = io::copy(&mut file, &mut HashWriter(&mut hasher))
        .with_context(|| format!("reading {}", path.display()))?;
    Ok((hex(&hasher.finalize()), size))
}

/// An `io::Write` that feeds a hasher, so `io::copy` can hash a reader.
pub struct HashWriter<'a>(pub &'a mut Sha256);

impl io::Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Copies `reader` to `writer` while hashing it; returns the byte count.
pub fn copy_hashed(
    reader: &mut impl Read,
    writer: &mut impl io::Write,
    hasher: &mut Sha256,
) -> io::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            return Ok(total);
        }
        hasher.update(&buf[..n]);
        writer.write_all(&buf[..n])?;
        total += n as u64;
    }
}
