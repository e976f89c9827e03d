//! Times prompt processing and single-token decode of a model on one CPU device, on meta(cpu x2)
//! and with layers over two CPU devices (a quick profile aid; the CLI's `bench` is the benchmark).
//! `cargo run --release -p llama --example decode_profile -- MODEL [threads]`

use backend_cpu::device::cpu_devices;
use backend_meta::MetaDevice;
use ggml_core::Device;
use llama::{Model, Outputs, Placement, Session, SessionOptions};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("model path");
    let threads: usize = args.next().and_then(|v| v.parse().ok()).unwrap_or(2);
    let single: Arc<dyn Device> = cpu_devices(1, threads).unwrap().remove(0);
    let two: Vec<Arc<dyn Device>> = cpu_devices(2, threads)
        .unwrap()
        .into_iter()
        .map(|d| d as Arc<dyn Device>)
        .collect();
    let placements = [
        ("none", Placement::Single(single)),
        (
            "tensor x2",
            Placement::Tensor(MetaDevice::new(two.clone(), None).unwrap()),
        ),
        (
            "layer x2",
            Placement::Layers {
                devices: two,
                ratios: vec![1.0, 1.0],
            },
        ),
    ];
    for (name, p) in placements {
        let model = Arc::new(Model::load(&path, &p).unwrap());
        let mut s = Session::new(model, SessionOptions::default()).unwrap();
        let prompt: Vec<u32> = (0..128u32).map(|i| 100 + i).collect();
        let t = Instant::now();
        let logits = s.eval(&prompt, Outputs::Last).unwrap();
        let pp = t.elapsed();
        let mut next = argmax(logits.last());
        let t = Instant::now();
        let n = 32;
        for _ in 0..n {
            next = argmax(s.eval(&[next], Outputs::Last).unwrap().last());
        }
        let tg = t.elapsed();
        println!(
            "{name:10} pp{}: {:7.1} t/s   tg{n}: {:6.1} t/s",
            prompt.len(),
            prompt.len() as f64 / pp.as_secs_f64(),
            n as f64 / tg.as_secs_f64()
        );
    }
}

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
        .0 as u32
}
