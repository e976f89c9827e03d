//! Multi-process start-up: rank 0 creates NCCL's unique id and hands it to the other ranks through a
//! file (written under a temporary name, then renamed, so readers never see half of it) or a
//! loopback TCP listener; every rank then joins with [`NcclCommunicator::from_unique_id`]. One
//! process per GPU is the path to several hosts (a TCP address any rank reaches).

use crate::comm::NcclCommunicator;
use crate::err;
use crate::nccl::{self, UniqueId};
use crate::stream::CudaBackend;
use ggml_core::Result;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Tags the id on the wire, so that a stray connection is refused rather than misread.
const MAGIC: &[u8; 8] = b"GGTPNCCL";
const POLL: Duration = Duration::from_millis(10);

/// Where the ranks of one job meet.
#[derive(Clone, Debug)]
pub enum Rendezvous {
    /// A file path all ranks see; it must not exist before the job (the launcher picks a fresh one).
    File(PathBuf),
    /// The address rank 0 listens on and the others connect to.
    Tcp(SocketAddr),
}

impl Rendezvous {
    /// The job's unique id: created and published by rank 0, fetched by the others (waiting up to
    /// `timeout` for rank 0).
    pub fn unique_id(&self, rank: usize, n_ranks: usize, timeout: Duration) -> Result<UniqueId> {
        if rank >= n_ranks {
            return Err(err(format!("rank {rank} of a job of {n_ranks}")));
        }
        let deadline = Instant::now() + timeout;
        if rank == 0 {
            let id = nccl::library().map_err(err)?.unique_id().map_err(err)?;
            match self {
                Rendezvous::File(p) => publish_file(p, &id)?,
                Rendezvous::Tcp(a) => serve_tcp(*a, &id, n_ranks - 1, deadline)?,
            }
            Ok(id)
        } else {
            match self {
                Rendezvous::File(p) => read_file(p, deadline),
                Rendezvous::Tcp(a) => fetch_tcp(*a, deadline),
            }
        }
    }

    /// Rank `rank` of `n_ranks` on `backend`'s stream: the id through this rendezvous, then NCCL.
    pub fn communicator(
        &self,
        rank: usize,
        n_ranks: usize,
        backend: Arc<CudaBackend>,
        timeout: Duration,
    ) -> Result<NcclCommunicator> {
        let id = self.unique_id(rank, n_ranks, timeout)?;
        NcclCommunicator::from_unique_id(rank, n_ranks, backend, id)
    }
}

fn io_err(what: &str, e: std::io::Error) -> ggml_core::Error {
    err(format!("rendezvous: {what}: {e}"))
}

fn publish_file(path: &PathBuf, id: &UniqueId) -> Result<()> {
    let tmp = path.with_extension("partial");
    std::fs::write(&tmp, id.0).map_err(|e| io_err(&format!("write {}", tmp.display()), e))?;
    std::fs::rename(&tmp, path).map_err(|e| io_err(&format!("rename to {}", path.display()), e))
}

fn read_file(path: &PathBuf, deadline: Instant) -> Result<UniqueId> {
    loop {
        match std::fs::read(path) {
            Ok(bytes) => {
                let raw: [u8; 128] = bytes.as_slice().try_into().map_err(|_| {
                    err(format!(
                        "rendezvous: {} holds {} bytes, not an NCCL id of 128",
                        path.display(),
                        bytes.len()
                    ))
                })?;
                return Ok(UniqueId(raw));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && Instant::now() < deadline => {
                std::thread::sleep(POLL)
            }
            Err(e) => return Err(io_err(&format!("read {}", path.display()), e)),
        }
    }
}

/// Accepts `clients` connections on `addr` and sends each the id.
fn serve_tcp(addr: SocketAddr, id: &UniqueId, clients: usize, deadline: Instant) -> Result<()> {
    let listener = TcpListener::bind(addr).map_err(|e| io_err(&format!("bind {addr}"), e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| io_err("listener", e))?;
    let mut served = 0;
    while served < clients {
        match listener.accept() {
            Ok((mut s, _)) => {
                s.set_nonblocking(false).map_err(|e| io_err("accept", e))?;
                s.write_all(MAGIC)
                    .and_then(|_| s.write_all(&id.0))
                    .map_err(|e| io_err("send id", e))?;
                served += 1;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(POLL)
            }
            Err(e) => {
                return Err(io_err(
                    &format!("waiting for {} more ranks on {addr}", clients - served),
                    e,
                ))
            }
        }
    }
    Ok(())
}

fn fetch_tcp(addr: SocketAddr, deadline: Instant) -> Result<UniqueId> {
    let mut s = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(POLL),
            Err(e) => return Err(io_err(&format!("connect to rank 0 at {addr}"), e)),
        }
    };
    let left = deadline.saturating_duration_since(Instant::now());
    s.set_read_timeout(Some(left.max(POLL)))
        .map_err(|e| io_err("socket", e))?;
    let mut buf = [0u8; 136];
    s.read_exact(&mut buf)
        .map_err(|e| io_err(&format!("read id from {addr}"), e))?;
    if &buf[..8] != MAGIC {
        return Err(err(format!("rendezvous: {addr} is not a ggml-tp rank 0")));
    }
    let mut raw = [0u8; 128];
    raw.copy_from_slice(&buf[8..]);
    Ok(UniqueId(raw))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh_id(seed: u8) -> UniqueId {
        UniqueId(std::array::from_fn(|i| (i as u8).wrapping_mul(7) ^ seed))
    }

    #[test]
    fn file_hands_the_id_over() {
        let dir = std::env::temp_dir().join(format!("ggml-tp-rdv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("id");
        let _ = std::fs::remove_file(&path);
        let id = fresh_id(3);
        let reader = {
            let path = path.clone();
            std::thread::spawn(move || read_file(&path, Instant::now() + Duration::from_secs(10)))
        };
        std::thread::sleep(Duration::from_millis(30));
        publish_file(&path, &id).unwrap();
        assert_eq!(reader.join().unwrap().unwrap(), id);
        std::fs::write(&path, b"short").unwrap();
        let e = read_file(&path, Instant::now()).unwrap_err().to_string();
        assert!(e.contains("5 bytes"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn file_times_out_when_rank_0_never_comes() {
        let path = std::env::temp_dir().join("ggml-tp-rdv-never-written");
        let e = read_file(&path, Instant::now() + Duration::from_millis(30)).unwrap_err();
        assert!(e.to_string().contains("ggml-tp-rdv-never-written"), "{e}");
    }

    #[test]
    fn tcp_hands_the_id_to_every_client() {
        let addr: SocketAddr = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let id = fresh_id(9);
        let deadline = Instant::now() + Duration::from_secs(10);
        let clients: Vec<_> = (0..2)
            .map(|_| std::thread::spawn(move || fetch_tcp(addr, deadline)))
            .collect();
        serve_tcp(addr, &id, 2, deadline).unwrap();
        for c in clients {
            assert_eq!(c.join().unwrap().unwrap(), id);
        }
    }

    #[test]
    fn tcp_refuses_a_stranger_and_times_out() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let stranger = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.write_all(&[0u8; 136]).unwrap();
        });
        let e = fetch_tcp(addr, Instant::now() + Duration::from_secs(5)).unwrap_err();
        assert!(e.to_string().contains("not a ggml-tp rank 0"), "{e}");
        stranger.join().unwrap();
        let e = serve_tcp(addr, &fresh_id(1), 1, Instant::now()).unwrap_err();
        assert!(e.to_string().contains("1 more ranks"), "{e}");
    }

    #[test]
    fn rank_must_be_in_the_job() {
        let r = Rendezvous::File(PathBuf::from("/nonexistent/id"));
        assert!(r.unique_id(2, 2, Duration::ZERO).is_err());
    }
}
