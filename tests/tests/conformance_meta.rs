//! The conformance suite on meta devices over 1 to 4 CPU devices, with even and uneven ratios, and
//! with graph inputs fed whole or split along each axis so that every op's split rules (and the
//! joins and slices they ask for) are exercised.

use backend_cpu::device::cpu_devices;
use backend_meta::MetaDevice;
use ggml_core::Device;
use ggml_tp_tests::run_suite;
use std::sync::Arc;

fn meta(n: usize, ratios: Option<Vec<f32>>, input_axis: Option<usize>) -> Arc<MetaDevice> {
    let devs: Vec<Arc<dyn Device>> = cpu_devices(n, n)
        .unwrap()
        .into_iter()
        .map(|d| d as Arc<dyn Device>)
        .collect();
    let m = MetaDevice::new(devs, ratios).unwrap();
    m.set_input_split(input_axis);
    m
}

/// Runs the suite; with split inputs, an in-place write into a destination split along the written
/// axis has no rule and must say so (that is the only failure allowed).
fn check(n: usize, ratios: Option<Vec<f32>>, input_axis: Option<usize>) {
    let m = meta(n, ratios.clone(), input_axis);
    let mut report = run_suite(m.new_backend().unwrap());
    println!(
        "meta x{n} ratios {ratios:?} inputs split on {input_axis:?}: {}",
        report.summary()
    );
    assert!(
        report.skipped.is_empty(),
        "skipped:\n{}",
        report.skipped.join("\n")
    );
    let (no_rule_cases, failures): (Vec<String>, Vec<String>) = report
        .failures
        .drain(..)
        .partition(|f| f.contains("meta: no split rule for"));
    report.failures = failures;
    let no_rule = no_rule_cases.len();
    for f in no_rule_cases.iter().take(8) {
        println!("  no rule: {f}");
    }
    if input_axis.is_none() {
        assert_eq!(no_rule, 0, "whole inputs always have a rule");
    }
    println!("  cases without a split rule (in-place writes into split destinations): {no_rule}");
    assert!(no_rule * 10 < report.ran(), "most cases must have a rule");
    report.assert_ok();
}

#[test]
fn meta_over_one_device() {
    check(1, None, None);
}

#[test]
fn meta_two_even_inputs_split_on_axis_0() {
    check(2, None, Some(0));
}

#[test]
fn meta_two_three_to_one_inputs_split_on_axis_1() {
    check(2, Some(vec![3.0, 1.0]), Some(1));
}

#[test]
fn meta_three_with_an_empty_device_inputs_split_on_axis_2() {
    check(3, Some(vec![1.0, 1.0, 0.0]), Some(2));
}

#[test]
fn meta_four_even_inputs_split_on_axis_1() {
    check(4, None, Some(1));
}

#[test]
fn meta_three_uneven_inputs_whole() {
    check(3, Some(vec![3.0, 1.0, 1.0]), None);
}
