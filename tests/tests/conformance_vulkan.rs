//! The conformance suite on Vulkan: every device of the Vulkan backend with both shader variants
//! (16-bit storage/subgroups where offered, and the base fallback), then meta devices over two
//! Vulkan devices (even and uneven ratios, inputs whole or split): the first two physical devices,
//! or the first one opened twice as two logical devices where there is only one. Prints `skipped: no vulkan device` (and the reason) only when no device can be opened.

use backend_meta::MetaDevice;
use backend_vulkan::{open_devices_with, Variant, VulkanDevice};
use ggml_core::Device;
use ggml_tp_tests::{run_suite, Report};
use std::sync::Arc;

fn vulkan_devices(copies: usize, variant: Variant) -> Option<Vec<Arc<VulkanDevice>>> {
    match open_devices_with(copies, variant) {
        Ok(d) => Some(d),
        Err(reason) => {
            println!("skipped: no vulkan device ({reason})");
            None
        }
    }
}

/// Prints the report; ops the shaders do not implement are skipped, everything that ran must pass.
fn check(report: &Report) {
    println!("{}", report.summary());
    for s in report.skipped.iter().take(8) {
        println!("{s}");
    }
    report.assert_ok();
}

fn every_device(variant: Variant) {
    let Some(devices) = vulkan_devices(1, variant) else {
        return;
    };
    for d in devices {
        println!("{}: {}", d.name(), d.description());
        check(&run_suite(d.new_backend().expect("new_backend")));
    }
}

#[test]
fn vulkan_devices_conform() {
    every_device(Variant::Auto);
}

#[test]
fn vulkan_base_shaders_conform() {
    every_device(Variant::Base);
}

/// Two Vulkan devices: two physical devices where there are several, else two logical devices of
/// the only one.
fn two_devices() -> Option<Vec<Arc<dyn Device>>> {
    let mut devices = vulkan_devices(1, Variant::Auto)?;
    if devices.len() < 2 {
        devices = vulkan_devices(2, Variant::Auto)?;
    }
    let devs: Vec<Arc<dyn Device>> = devices
        .into_iter()
        .take(2)
        .map(|d| d as Arc<dyn Device>)
        .collect();
    for d in &devs {
        println!("{}: {}", d.name(), d.description());
    }
    Some(devs)
}

/// The suite on a meta device over two Vulkan devices. With split inputs, an in-place write into a
/// destination split along the written axis has no split rule and must say so (the only failure
/// allowed, as in `conformance_meta`).
fn meta(ratios: Option<Vec<f32>>, input_axis: Option<usize>) {
    let Some(devs) = two_devices() else {
        return;
    };
    let m = MetaDevice::new(devs, ratios.clone()).expect("meta device");
    m.set_input_split(input_axis);
    let mut report = run_suite(m.new_backend().expect("meta backend"));
    println!("meta over 2 vulkan devices, ratios {ratios:?}, inputs split on {input_axis:?}:");
    let (no_rule, failures): (Vec<String>, Vec<String>) = report
        .failures
        .drain(..)
        .partition(|f| f.contains("meta: no split rule for"));
    report.failures = failures;
    if input_axis.is_none() {
        assert!(no_rule.is_empty(), "whole inputs always have a rule");
    }
    println!("  cases without a split rule: {}", no_rule.len());
    assert!(
        no_rule.len() * 10 < report.ran(),
        "most cases must have a rule"
    );
    check(&report);
}

#[test]
fn meta_two_vulkan_even() {
    meta(None, None);
}

#[test]
fn meta_two_vulkan_uneven() {
    meta(Some(vec![3.0, 1.0]), None);
}

/// Split host inputs on devices that cannot read host memory take the meta backend's copy-then-slice
/// path: slices of quantized weights need the same-type block `cont` (K-quants, odd-sized MXFP4
/// blocks), and views the split cannot follow are gathered into whole tensors between stages.
#[test]
fn meta_two_vulkan_uneven_inputs_split_on_axis_1() {
    meta(Some(vec![3.0, 1.0]), Some(1));
}
