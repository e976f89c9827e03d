//! What one join costs: a chain of `layers` tiny residual FFN layers at the hidden size of
//! SmolLM2-135M (576 floats, one token), each ending in one AllReduce of its partial sum, computed on
//! one CPU device with 2 threads (A) and on a meta device over 2 CPU devices of 1 thread each (B),
//! alternating rounds so that load from other processes hits both alike. The compute is so small that
//! the difference per join, (B - A) / joins, is the executor's cost of a join.
//! `cargo run --release -p backend-meta --example join_cost -- [layers] [rounds]`

use backend_cpu::device::cpu_devices;
use backend_meta::{MetaBackend, MetaDevice, WeightSplit};
use ggml_core::backend::{Backend, Buffer, Device};
use ggml_core::sched::Scheduler;
use ggml_core::{DType, DataRef, Graph, Layout, TensorId};
use std::sync::Arc;
use std::time::Instant;

const HIDDEN: usize = 576;
const FFN: usize = 64;

/// Where the weights live.
enum Place {
    Single(Arc<dyn Device>),
    Meta(Arc<MetaDevice>),
}

/// The weights of every layer, allocated once, bound into each step's graph.
struct Chain {
    layers: Vec<(Arc<dyn Buffer>, Arc<dyn Buffer>)>,
}

fn weight(place: &Place, ne: [usize; 4], split: WeightSplit, layer: usize) -> Arc<dyn Buffer> {
    let layout = Layout::contiguous(DType::F32, ne);
    let b: Arc<dyn Buffer> = match place {
        Place::Single(d) => d.buffer_type().alloc(layout.nbytes()).unwrap(),
        Place::Meta(m) => m.alloc_tensor(layout, &split, layer, "w").unwrap(),
    };
    let n: usize = ne.iter().product();
    let vals: Vec<f32> = (0..n)
        .map(|i| ((i * 7 + layer) % 13) as f32 * 0.01)
        .collect();
    b.set(0, bytemuck::cast_slice(&vals)).unwrap();
    b
}

impl Chain {
    fn new(place: &Place, layers: usize) -> Chain {
        Chain {
            layers: (0..layers)
                .map(|l| {
                    let up = weight(place, [HIDDEN, FFN, 1, 1], WeightSplit::axis(1, FFN, 1), l);
                    let down = weight(place, [FFN, HIDDEN, 1, 1], WeightSplit::axis(0, FFN, 1), l);
                    (up, down)
                })
                .collect(),
        }
    }

    /// x → for each layer: x + down(silu(up(rms_norm(x)))) → rms_norm.
    fn graph(&self) -> (Graph, TensorId, TensorId) {
        let mut g = Graph::new();
        let x0 = g.new_input(DType::F32, &[HIDDEN]).unwrap();
        let mut x = x0;
        for (up, down) in &self.layers {
            let up = g.new_bound(
                Layout::contiguous(DType::F32, [HIDDEN, FFN, 1, 1]),
                DataRef::new(up.clone(), 0),
                "up",
                true,
            );
            let down = g.new_bound(
                Layout::contiguous(DType::F32, [FFN, HIDDEN, 1, 1]),
                DataRef::new(down.clone(), 0),
                "down",
                true,
            );
            let h = g.rms_norm(x, 1e-5).unwrap();
            let u = g.mul_mat(up, h).unwrap();
            let u = g.silu(u).unwrap();
            let y = g.mul_mat(down, u).unwrap();
            x = g.add(y, x).unwrap();
        }
        let out = g.rms_norm(x, 1e-5).unwrap();
        g.output(out);
        (g, x0, out)
    }
}

/// Runs the chain step after step through one scheduler.
struct Runner {
    chain: Chain,
    sched: Scheduler,
}

impl Runner {
    fn step(&mut self) -> Vec<f32> {
        let (mut g, x, out) = self.chain.graph();
        self.sched.alloc(&mut g).unwrap();
        let input: Vec<f32> = (0..HIDDEN).map(|i| (i % 5) as f32 - 2.0).collect();
        g.set_f32(x, &input).unwrap();
        self.sched.compute(&g).unwrap();
        g.get_f32(out).unwrap()
    }

    /// Mean seconds per step over `steps` steps.
    fn time(&mut self, steps: usize) -> f64 {
        let t = Instant::now();
        (0..steps).for_each(|_| drop(self.step()));
        t.elapsed().as_secs_f64() / steps as f64
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let layers: usize = args.next().and_then(|v| v.parse().ok()).unwrap_or(30);
    let rounds: usize = args.next().and_then(|v| v.parse().ok()).unwrap_or(11);
    let single: Arc<dyn Device> = cpu_devices(1, 2).unwrap().remove(0);
    let place = Place::Single(single.clone());
    let mut a = Runner {
        chain: Chain::new(&place, layers),
        sched: Scheduler::new(vec![single.new_backend().unwrap()]),
    };
    let devs: Vec<Arc<dyn Device>> = cpu_devices(2, 2)
        .unwrap()
        .into_iter()
        .map(|d| d as Arc<dyn Device>)
        .collect();
    let meta = MetaDevice::new(devs, None).unwrap();
    let backend: Arc<MetaBackend> = meta.new_meta_backend().unwrap();
    let place = Place::Meta(meta);
    let mut b = Runner {
        chain: Chain::new(&place, layers),
        sched: Scheduler::new(vec![backend.clone() as Arc<dyn Backend>]),
    };
    let (wa, wb) = (a.step(), b.step());
    let worst = wa
        .iter()
        .zip(&wb)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-3, "meta and single device differ by {worst}");
    let before = backend.stats().reductions;
    b.step();
    let joins = (backend.stats().reductions - before) as f64;
    let steps = 200;
    let mut per_join = Vec::new();
    for round in 0..rounds {
        let ta = a.time(steps);
        let tb = b.time(steps);
        per_join.push((tb - ta) / joins);
        println!(
            "round {round:2}: cpu(2 threads) {:8.1} us  meta(cpu x2) {:8.1} us  per join {:6.2} us",
            ta * 1e6,
            tb * 1e6,
            per_join[round] * 1e6
        );
    }
    per_join.sort_by(f64::total_cmp);
    println!(
        "{layers} layers, {joins} joins per step: median extra cost per join {:.2} us over {rounds} rounds",
        per_join[rounds / 2] * 1e6
    );
}
