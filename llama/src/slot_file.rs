//! Saving a slot's sequence (its tokens and the K/V entries of their positions) to a file and
//! restoring it into a sequence of a batch session, so a restored slot continues exactly where the
//! saved one was.
//!
//! The cache tensors are `[head_dim, n_seq * n_ctx, n_head_kv]` per layer, so the first `n`
//! positions of one sequence and KV head are `n` contiguous rows ([`KvCache::span`]). They are read
//! and written with the buffers' offset `get`/`set`, which on a tensor-parallel (meta) device map
//! logical offsets onto the device that holds each head; files are therefore independent of the
//! placement and of the slot they were saved from.
//!
//! [`encode`] and [`decode_into`] work in memory (on the thread that owns the session);
//! [`write_file`] and [`read_file`] do the disk I/O, so a server can do that elsewhere.
//!
//! Format (little-endian): magic `GGTPSLOT`, version `u32`, dtype name (`u32` length + UTF-8),
//! `u32` n_layer, n_head_kv, K row bytes, V row bytes, n_tokens, the tokens (`u32` each), then per
//! layer K then V, per head the `n_tokens` rows.

use crate::kv::KvCache;
use crate::runtime::BatchSession;
use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

const MAGIC: &[u8; 8] = b"GGTPSLOT";
const VERSION: u32 = 1;

/// Makes the temporary names of concurrent writes in one process distinct.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Errors of saving and restoring slot files.
#[derive(Debug, thiserror::Error)]
pub enum SlotFileError {
    #[error("slot file I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("not a slot file of this model/cache: {0}")]
    Mismatch(String),
    #[error("slot file {0} exists already")]
    Exists(String),
    #[error("slot file of {len} bytes exceeds the limit of {max}")]
    TooLarge { len: u64, max: u64 },
    #[error(transparent)]
    Core(#[from] ggml_core::Error),
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
}

/// The shape facts a file must share with the cache it is restored into.
#[derive(Debug, PartialEq, Eq)]
struct Header {
    dtype: String,
    n_layer: u32,
    n_head_kv: u32,
    k_row: u32,
    v_row: u32,
}

impl Header {
    fn of(kv: &KvCache, n_layer: usize) -> Result<Header, SlotFileError> {
        let (k, v) = if n_layer > 0 {
            kv.layer(0)?
        } else {
            return Err(SlotFileError::Mismatch("a model without layers".into()));
        };
        Ok(Header {
            dtype: kv.dtype().to_string(),
            n_layer: n_layer as u32,
            n_head_kv: k.ne()[2] as u32,
            k_row: k.layout.nb[1] as u32,
            v_row: v.layout.nb[1] as u32,
        })
    }
}

/// Writes `tokens` (the positions `0..tokens.len()` of sequence `seq` of `session`'s cache) and
/// their K/V rows to `path`, replacing a file already there ([`encode`] then [`write_file`]);
/// returns the bytes written.
pub fn save(
    session: &BatchSession,
    seq: usize,
    tokens: &[u32],
    path: &Path,
) -> Result<u64, SlotFileError> {
    let bytes = encode(session, seq, tokens)?;
    write_file(path, &bytes, true)
}

/// Reads a file written by [`save`] into sequence `seq` of `session`'s cache and returns its
/// tokens ([`read_file`] then [`decode_into`]).
pub fn restore(
    session: &mut BatchSession,
    seq: usize,
    path: &Path,
) -> Result<Vec<u32>, SlotFileError> {
    let bytes = read_file(path, u64::MAX)?;
    decode_into(session, seq, &bytes)
}

/// The slot file of `tokens` (the positions `0..tokens.len()` of sequence `seq` of `session`'s
/// cache) and their K/V rows, in memory, so that the disk write can happen off the thread that owns
/// the session.
pub fn encode(
    session: &BatchSession,
    seq: usize,
    tokens: &[u32],
) -> Result<Vec<u8>, SlotFileError> {
    let n_past = session.n_past(seq)?;
    if tokens.len() != n_past {
        return Err(SlotFileError::Mismatch(format!(
            "{} tokens for {n_past} cached positions",
            tokens.len(),
        )));
    }
    let kv = session.kv();
    let n_layer = session.model().config.n_layer;
    let h = Header::of(kv, n_layer)?;
    let mut w = Vec::new();
    w.extend_from_slice(MAGIC);
    put(&mut w, VERSION);
    put(&mut w, h.dtype.len() as u32);
    w.extend_from_slice(h.dtype.as_bytes());
    for x in [
        h.n_layer,
        h.n_head_kv,
        h.k_row,
        h.v_row,
        tokens.len() as u32,
    ] {
        put(&mut w, x);
    }
    for &t in tokens {
        put(&mut w, t);
    }
    let mut buf = Vec::new();
    for l in 0..n_layer {
        let (k, v) = kv.layer(l)?;
        for t in [k, v] {
            for head in 0..t.ne()[2] {
                let (offset, len) = kv.span(t, seq, head, tokens.len());
                buf.resize(len, 0);
                t.data.buffer.get(offset, &mut buf)?;
                w.extend_from_slice(&buf);
            }
        }
    }
    Ok(w)
}

/// Writes `bytes` to `path` through a temporary file in the same directory (named with a leading
/// dot, synced, then moved into place), so a reader never sees a partial file and a failed write
/// leaves nothing behind. Without `overwrite` an existing `path` is kept and
/// [`SlotFileError::Exists`] returned (the move is a hard link, which fails atomically when the name
/// is taken). Returns the bytes written.
pub fn write_file(path: &Path, bytes: &[u8], overwrite: bool) -> Result<u64, SlotFileError> {
    let name = path
        .file_name()
        .ok_or_else(|| SlotFileError::Mismatch(format!("{} names no file", path.display())))?;
    let nonce = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = path.with_file_name(format!(
        ".{}.{}-{nonce}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = (|| -> Result<(), SlotFileError> {
        let mut f = File::create_new(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        if overwrite {
            std::fs::rename(&tmp, path)?;
        } else {
            match std::fs::hard_link(&tmp, path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    return Err(SlotFileError::Exists(path.display().to_string()))
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    })();
    // After a rename the temporary name is gone already; after a link or a failure it goes now.
    let _ = std::fs::remove_file(&tmp);
    written.map(|()| bytes.len() as u64)
}

/// Reads the file at `path` whole, refusing one over `max` bytes ([`SlotFileError::TooLarge`])
/// before reading it.
pub fn read_file(path: &Path, max: u64) -> Result<Vec<u8>, SlotFileError> {
    let f = File::open(path)?;
    let len = f.metadata()?.len();
    if len > max {
        return Err(SlotFileError::TooLarge { len, max });
    }
    let mut bytes = Vec::with_capacity(len as usize);
    f.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(SlotFileError::TooLarge {
            len: bytes.len() as u64,
            max,
        });
    }
    Ok(bytes)
}

/// Loads a slot file's `bytes` (from [`encode`]) into sequence `seq` of `session`'s cache and
/// returns its tokens; the sequence then holds exactly those positions. On an error after the cache
/// was touched the sequence is emptied.
pub fn decode_into(
    session: &mut BatchSession,
    seq: usize,
    bytes: &[u8],
) -> Result<Vec<u32>, SlotFileError> {
    let mut r = bytes;
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(SlotFileError::Mismatch("bad magic".into()));
    }
    let version = get(&mut r)?;
    if version != VERSION {
        return Err(SlotFileError::Mismatch(format!("version {version}")));
    }
    let name_len = get(&mut r)? as usize;
    if name_len > 64 {
        return Err(SlotFileError::Mismatch("dtype name too long".into()));
    }
    let mut name = vec![0u8; name_len];
    r.read_exact(&mut name)?;
    let mut fields = [0u32; 5];
    for f in &mut fields {
        *f = get(&mut r)?;
    }
    let [n_layer, n_head_kv, k_row, v_row, n_tokens] = fields;
    let found = Header {
        dtype: String::from_utf8_lossy(&name).into_owned(),
        n_layer,
        n_head_kv,
        k_row,
        v_row,
    };
    let want = Header::of(session.kv(), session.model().config.n_layer)?;
    if found != want {
        return Err(SlotFileError::Mismatch(format!(
            "file has {found:?}, the cache {want:?}"
        )));
    }
    let n = n_tokens as usize;
    if n > session.kv().n_ctx() {
        return Err(SlotFileError::Mismatch(format!(
            "{n} tokens exceed the context of {}",
            session.kv().n_ctx()
        )));
    }
    let mut tokens = Vec::with_capacity(n);
    for _ in 0..n {
        tokens.push(get(&mut r)?);
    }
    let n_vocab = session.model().config.n_vocab;
    if let Some(bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(SlotFileError::Mismatch(format!(
            "token {bad} outside the vocabulary"
        )));
    }
    session.truncate(seq, 0)?;
    let written = write_rows(session.kv(), seq, n_layer as usize, n, &mut r);
    match written {
        Ok(()) => {
            session.set_n_past(seq, n)?;
            Ok(tokens)
        }
        Err(e) => {
            session.truncate(seq, 0)?;
            Err(e)
        }
    }
}

/// Copies the K/V rows of `n` positions of every layer and head from `r` into sequence `seq` of
/// `kv`.
fn write_rows(
    kv: &KvCache,
    seq: usize,
    n_layer: usize,
    n: usize,
    r: &mut impl Read,
) -> Result<(), SlotFileError> {
    let mut buf = Vec::new();
    for l in 0..n_layer {
        let (k, v) = kv.layer(l)?;
        for t in [k, v] {
            for head in 0..t.ne()[2] {
                let (offset, len) = kv.span(t, seq, head, n);
                buf.resize(len, 0);
                r.read_exact(&mut buf)?;
                t.data.buffer.set(offset, &buf)?;
            }
        }
    }
    let mut extra = [0u8; 1];
    if r.read(&mut extra)? != 0 {
        return Err(SlotFileError::Mismatch("trailing bytes".into()));
    }
    Ok(())
}

fn put(w: &mut Vec<u8>, x: u32) {
    w.extend_from_slice(&x.to_le_bytes());
}

fn get(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}
