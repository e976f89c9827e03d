//! The conformance suite on Vulkan: every device of the statically linked Vulkan backend, then meta
//! devices over two logical devices opened on the first physical device (even and uneven ratios).
//! Prints `skipped: no vulkan device` (and the reason) only when no device can be opened.

use backend_meta::MetaDevice;
use backend_vulkan::{open_devices, VulkanDevice};
use ggml_core::Device;
use ggml_tp_tests::{run_family, run_suite, Report};
use std::sync::Arc;

fn vulkan_devices(copies: usize) -> Option<Vec<Arc<VulkanDevice>>> {
    match open_devices(copies) {
        Ok(d) => Some(d),
        Err(reason) => {
            println!("skipped: no vulkan device ({reason})");
            None
        }
    }
}

/// Ops the Vulkan shaders do not implement yet are skipped; everything that runs must pass.
fn check(report: &Report) {
    println!("{}", report.summary());
    for s in report.skipped.iter().take(20) {
        println!("{s}");
    }
    report.assert_ok();
}

#[test]
fn vulkan_devices_conform() {
    let devices: Vec<Arc<dyn Device>> = match vulkan_devices(1) {
        Some(d) => d.into_iter().map(|d| d as Arc<dyn Device>).collect(),
        None => return,
    };
    for r in run_family("vulkan", devices) {
        r.assert_ok();
    }
}

fn meta(ratios: Option<Vec<f32>>) {
    let Some(devices) = vulkan_devices(2) else {
        return;
    };
    // Two logical devices on the first physical device.
    let devs: Vec<Arc<dyn Device>> = devices
        .into_iter()
        .take(2)
        .map(|d| d as Arc<dyn Device>)
        .collect();
    if devs.len() < 2 {
        println!("skipped: fewer than two vulkan devices");
        return;
    }
    let m = MetaDevice::new(devs, ratios.clone()).expect("meta device");
    let report = run_suite(m.new_backend().expect("meta backend"));
    println!("meta over 2 vulkan devices, ratios {ratios:?}:");
    check(&report);
}

#[test]
fn meta_two_vulkan_even() {
    meta(None);
}

#[test]
fn meta_two_vulkan_uneven() {
    meta(Some(vec![3.0, 1.0]));
}
