//! The Vulkan family in the static registry: with `GGML_TP_VULKAN_DEVICES=2` every physical device
//! appears twice (`vulkan:0`, `vulkan:1`, ...), and a stream of each runs a small graph; without a
//! device the family lists none and says why.

use backend_vulkan as _;
use ggml_core::sched::Scheduler;
use ggml_core::{DType, Graph};

#[test]
fn registry_opens_each_physical_device_twice() {
    // Set before the registry is first used (this test binary has no other test).
    std::env::set_var("GGML_TP_VULKAN_DEVICES", "2");
    let reg = ggml_core::registry::backend("vulkan").expect("vulkan family registered");
    let devices = reg.devices();
    if devices.is_empty() {
        let reason = reg
            .unavailable_reason()
            .expect("a reason when there is no device");
        println!("skipped: no vulkan device ({reason})");
        return;
    }
    assert_eq!(devices.len() % 2, 0, "each physical device opened twice");
    for (i, d) in devices.iter().enumerate() {
        assert_eq!(d.name(), format!("vulkan:{i}"));
        assert_eq!(d.family(), "vulkan");
        let mut g = Graph::new();
        let a = g.new_input(DType::F32, &[5, 3]).unwrap();
        let b = g.new_input(DType::F32, &[5, 1]).unwrap();
        let s = g.add(a, b).unwrap();
        let out = g.scale(s, 2.0).unwrap();
        g.output(out);
        let mut sched = Scheduler::new(vec![d.new_backend().unwrap()]);
        sched.alloc(&mut g).unwrap();
        let av: Vec<f32> = (0..15).map(|v| v as f32).collect();
        g.set_f32(a, &av).unwrap();
        g.set_f32(b, &[1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
        sched.compute(&g).unwrap();
        let want: Vec<f32> = (0..15)
            .map(|v| 2.0 * (v as f32 + (v % 5 + 1) as f32))
            .collect();
        assert_eq!(g.get_f32(out).unwrap(), want, "{}", d.name());
    }
}
