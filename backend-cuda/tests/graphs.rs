//! CUDA graph replay on a real GPU: a small block (BF16 weight converted in scratch, cuBLAS, norm,
//! activation, add, softmax) computed repeatedly with fresh inputs gives bit-identical results with
//! graphs on and off, and the counters show one capture and the replays after it. Prints
//! `skipped: no CUDA device` without a GPU.
// The inputs change every round, so a stale output cannot match the eager result.

mod common;

use backend_cuda::CudaBackend;
use common::{devices, random};
use ggml_core::sched::Scheduler;
use ggml_core::{Backend, DType, Graph, TensorId};
use half::bf16;
use std::sync::Arc;

struct Block {
    graph: Graph,
    sched: Scheduler,
    x: TensorId,
    w: TensorId,
    out: TensorId,
}

fn block(backend: Arc<CudaBackend>) -> Block {
    let (k, m, n) = (64, 48, 5);
    let mut g = Graph::new();
    let w = g.new_input(DType::BF16, &[k, m]).unwrap();
    let x = g.new_input(DType::F32, &[k, n]).unwrap();
    let y = g.mul_mat(w, x).unwrap();
    let z = g.rms_norm(y, 1e-6).unwrap();
    let s = g.silu(z).unwrap();
    let a = g.add(s, y).unwrap();
    let out = g.soft_max(a, None, None, 0.5, 0.0).unwrap();
    g.output(out);
    let mut sched = Scheduler::new(vec![backend as Arc<dyn Backend>]);
    sched.alloc(&mut g).unwrap();
    Block {
        graph: g,
        sched,
        x,
        w,
        out,
    }
}

impl Block {
    /// Computes with fresh inputs. The output may share memory with an input (the allocator reuses
    /// dead tensors' memory), so it is not poisoned; a replay that launched nothing would leave the
    /// previous round's result, which the comparison with eager launches catches.
    fn run(&mut self, w: &[u8], x: &[f32]) -> Vec<f32> {
        self.graph.set_bytes(self.w, w).unwrap();
        self.graph.set_f32(self.x, x).unwrap();
        self.sched.compute(&self.graph).unwrap();
        self.graph.get_f32(self.out).unwrap()
    }
}

#[test]
fn graphs_replay_with_the_results_of_eager_launches() {
    let Some(devs) = devices(1) else { return };
    let with = devs[0].open_backend().unwrap();
    let without = devs[0].open_backend().unwrap();
    with.set_graphs(true);
    without.set_graphs(false);
    let (mut a, mut b) = (block(with.clone()), block(without.clone()));
    let rounds = 6;
    for round in 0..rounds {
        let w: Vec<bf16> = random(64 * 48).into_iter().map(bf16::from_f32).collect();
        let x = random(64 * 5);
        let ra = a.run(bytemuck::cast_slice(&w), &x);
        let rb = b.run(bytemuck::cast_slice(&w), &x);
        assert!(
            ra.iter().all(|v| v.is_finite()),
            "round {round}: output not written"
        );
        assert!(
            ra.iter().zip(&rb).all(|(p, q)| p.to_bits() == q.to_bits()),
            "round {round}: graphs on and off differ"
        );
    }
    let s = with.graph_stats();
    println!("graphs on: {s:?}; graphs off: {:?}", without.graph_stats());
    assert_eq!(s.captures, 1, "{s:?}");
    assert_eq!(s.failed_captures, 0, "{s:?}");
    assert_eq!(s.replays, rounds - 1, "{s:?}");
    assert_eq!(s.eager, 1, "{s:?}");
    assert_eq!(without.graph_stats().replays, 0);
}

/// Buffer traffic on another thread (allocation, upload, download, release: each a context-wide
/// wait) while this thread captures graphs: captures must not fail and results must not change.
#[test]
fn captures_survive_buffer_traffic_on_another_thread() {
    use ggml_core::Device as _;
    use std::sync::atomic::{AtomicBool, Ordering};
    let Some(devs) = devices(1) else { return };
    let done = Arc::new(AtomicBool::new(false));
    let traffic = {
        let (dev, done) = (devs[0].clone(), done.clone());
        std::thread::spawn(move || {
            let mut rounds = 0u64;
            while !done.load(Ordering::Relaxed) {
                let data = random(4096);
                let buf = dev.buffer_type().alloc(4096 * 4).unwrap();
                buf.set(0, bytemuck::cast_slice(&data)).unwrap();
                let mut back = vec![0f32; 4096];
                buf.get(0, bytemuck::cast_slice_mut(&mut back)).unwrap();
                assert_eq!(back, data);
                rounds += 1;
            }
            rounds
        })
    };
    let without = devs[0].open_backend().unwrap();
    without.set_graphs(false);
    let mut reference = block(without);
    let mut captures = 0;
    for _ in 0..40 {
        let with = devs[0].open_backend().unwrap();
        with.set_graphs(true);
        let mut b = block(with.clone());
        for _ in 0..3 {
            let w: Vec<bf16> = random(64 * 48).into_iter().map(bf16::from_f32).collect();
            let x = random(64 * 5);
            let got = b.run(bytemuck::cast_slice(&w), &x);
            let want = reference.run(bytemuck::cast_slice(&w), &x);
            assert!(got
                .iter()
                .zip(&want)
                .all(|(p, q)| p.to_bits() == q.to_bits()));
        }
        let s = with.graph_stats();
        assert_eq!(s.failed_captures, 0, "{s:?}");
        captures += s.captures;
    }
    done.store(true, Ordering::Relaxed);
    let rounds = traffic.join().expect("buffer traffic thread");
    println!("{captures} captures next to {rounds} rounds of buffer traffic");
    assert_eq!(captures, 40);
    assert!(rounds > 0);
}
