//! Multi-process mode on real GPUs: the test starts itself twice as rank 0 and rank 1, each process
//! seeing only its own GPU (`CUDA_VISIBLE_DEVICES`); the ranks meet through a file and then through
//! loopback TCP, build an NCCL communicator from the unique id and all-reduce data whose sum both
//! know, at a small and a large size. Prints `skipped: ...` without two GPUs or NCCL.

mod common;

use backend_cuda::{NcclCommunicator, Rendezvous};
use common::{devices, nccl_or_skip, nmse};
use ggml_core::{Communicator, DType, DataRef, Device as _};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RANK_VAR: &str = "GGML_TP_TEST_RANK";
const RDV_VAR: &str = "GGML_TP_TEST_RENDEZVOUS";
const TEST_NAME: &str = "two_processes_all_reduce";

/// Rank `rank`'s value at `i`, known to both ranks.
fn value(rank: usize, i: usize) -> f32 {
    ((i * 7 + rank * 13) % 101) as f32 / 32.0 - 1.5
}

fn rendezvous(spec: &str) -> Rendezvous {
    match spec.split_once(':') {
        Some(("file", p)) => Rendezvous::File(p.into()),
        Some(("tcp", a)) => Rendezvous::Tcp(a.parse().expect("a socket address")),
        _ => panic!("bad rendezvous {spec}"),
    }
}

/// One rank: join, all-reduce, check.
fn child(rank: usize, spec: &str) {
    let dev = devices(1).expect("the child sees its GPU").remove(0);
    let backend = dev.open_backend().unwrap();
    let comm: NcclCommunicator = rendezvous(spec)
        .communicator(rank, 2, backend, Duration::from_secs(60))
        .unwrap();
    assert_eq!((comm.size(), comm.world_size()), (1, 2));
    for count in [4099usize, 3 << 20] {
        let mine: Vec<f32> = (0..count).map(|i| value(rank, i)).collect();
        let buf = dev.buffer_type().alloc(count * 4).unwrap();
        buf.set(0, bytemuck::cast_slice(&mine)).unwrap();
        let data = [DataRef::new(buf.clone(), 0)];
        comm.all_reduce(&data, DType::F32, count).unwrap();
        let mut got = vec![0f32; count];
        buf.get(0, bytemuck::cast_slice_mut(&mut got)).unwrap();
        let want: Vec<f64> = (0..count)
            .map(|i| value(0, i) as f64 + value(1, i) as f64)
            .collect();
        let e = nmse(&got, &want);
        let path = comm.path_for(DType::F32, count);
        println!("rank {rank}: {count} elements through {path:?}, NMSE {e:e}");
        assert!(e < 1e-4, "rank {rank}: NMSE {e:e}");
    }
    println!("rank {rank} ok");
}

/// Starts both ranks with `spec` and waits for them (two minutes at most).
fn launch(spec: &str) {
    let exe = std::env::current_exe().unwrap();
    let mut kids: Vec<_> = (0..2)
        .map(|rank| {
            Command::new(&exe)
                .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
                .env(RANK_VAR, rank.to_string())
                .env(RDV_VAR, spec)
                .env("CUDA_VISIBLE_DEVICES", rank.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    while kids.iter_mut().any(|k| k.try_wait().unwrap().is_none()) {
        if Instant::now() > deadline {
            for k in &mut kids {
                let _ = k.kill();
            }
            panic!("{spec}: the ranks did not finish in time");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for (rank, k) in kids.into_iter().enumerate() {
        let out = k.wait_with_output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        println!("--- {spec} rank {rank}:\n{text}");
        assert!(out.status.success(), "{spec}: rank {rank} failed");
        assert!(
            text.contains(&format!("rank {rank} ok")),
            "{spec}: rank {rank}"
        );
    }
}

#[test]
fn two_processes_all_reduce() {
    if let Ok(rank) = std::env::var(RANK_VAR) {
        let spec = std::env::var(RDV_VAR).expect("the launcher sets the rendezvous");
        return child(rank.parse().unwrap(), &spec);
    }
    if devices(2).is_none() || !nccl_or_skip() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ggml-tp-mp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("nccl-id");
    let _ = std::fs::remove_file(&file);
    launch(&format!("file:{}", file.display()));
    std::fs::remove_dir_all(&dir).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    launch(&format!("tcp:127.0.0.1:{port}"));
}
