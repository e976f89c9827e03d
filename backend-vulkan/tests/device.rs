//! Device-level tests of backend-vulkan on whatever Vulkan device is present (lavapipe in CI):
//! every shader becomes a pipeline in both variants, and buffers move bytes correctly (set, get,
//! fill with unaligned edges, device copies, bounds errors). Each test returns early, printing
//! `skipped: no vulkan device`, when there is none.

use backend_vulkan::{open_devices_with, Variant, VulkanDevice};
use ggml_core::{DataRef, Device};
use std::sync::Arc;
use std::time::Instant;

fn device(variant: Variant) -> Option<Arc<VulkanDevice>> {
    match open_devices_with(1, variant) {
        Ok(mut d) => Some(d.remove(0)),
        Err(reason) => {
            println!("skipped: no vulkan device ({reason})");
            None
        }
    }
}

#[test]
fn every_shader_builds_a_pipeline() {
    for variant in [Variant::Auto, Variant::Base] {
        let Some(dev) = device(variant) else { return };
        for (name, _, _) in backend_vulkan::pipeline::SHADERS {
            let start = Instant::now();
            dev.ctx()
                .pipelines
                .get(&dev.ctx().device, name)
                .unwrap_or_else(|e| panic!("{name} ({variant:?}): {e}"));
            println!(
                "{name} ({variant:?}): {:.2} s",
                start.elapsed().as_secs_f64()
            );
        }
    }
}

#[test]
fn buffers_move_bytes() {
    let Some(dev) = device(Variant::Auto) else {
        return;
    };
    let bt = dev.buffer_type();
    let a = bt.alloc(1000).unwrap();
    assert!(a.host_ptr().is_none());
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
    a.set(0, &data).unwrap();
    a.fill(3, 10, 0xAB).unwrap();
    let mut want = data.clone();
    want[3..13].fill(0xAB);
    let mut got = vec![0u8; 1000];
    a.get(0, &mut got).unwrap();
    assert_eq!(got, want);
    assert!(a.set(999, &[1, 2]).is_err());
    assert!(a.get(usize::MAX, &mut [0u8; 2]).is_err());
    assert!(a.fill(990, 11, 0).is_err());

    let b = bt.alloc(1000).unwrap();
    let backend = dev.new_backend().unwrap();
    let (src, dst) = (DataRef::new(a.clone(), 1), DataRef::new(b.clone(), 5));
    backend.copy_async(&src, &dst, 500).unwrap();
    backend.synchronize().unwrap();
    let mut out = vec![0u8; 500];
    b.get(5, &mut out).unwrap();
    assert_eq!(out, want[1..501]);
    assert!(backend.copy_async(&src, &dst, 999).is_err());
    assert!(dev.owns(a.as_ref()) && dev.can_access(b.as_ref()));
    assert!(matches!(
        bt.alloc(usize::MAX / 2),
        Err(ggml_core::Error::OutOfMemory { .. })
    ));
}
