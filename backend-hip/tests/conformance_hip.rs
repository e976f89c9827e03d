//! The conformance suite on every HIP device and on a meta device over them (AllReduce through RCCL
//! when it loads), then a direct check of the RCCL communicator. Prints `skipped: no HIP device`
//! (with the reason) when there is none, as everywhere but on a ROCm machine.

use backend_hip as _;
use backend_meta::MetaDevice;
use ggml_core::{Backend, DType, DataRef, Device};
use ggml_tp_tests::{check_all_reduce_sum, family_devices, run_family, run_suite};
use std::sync::Arc;

/// The HIP devices, or `None` after printing why there are none.
fn hip_devices() -> Option<Vec<Arc<dyn Device>>> {
    family_devices("hip", "HIP")
}

#[test]
fn hip_devices_conform() {
    let Some(devs) = hip_devices() else { return };
    for d in &devs {
        println!("{}: {}, {:?}", d.name(), d.description(), d.memory());
    }
    for r in run_family("hip", devs) {
        r.assert_ok();
    }
}

#[test]
fn meta_over_hip_devices_conforms() {
    let Some(devs) = hip_devices() else { return };
    let m = MetaDevice::new(devs.clone(), None).unwrap();
    let report = run_suite(m.new_backend().unwrap());
    println!(
        "meta over {} HIP devices:\n{}",
        devs.len(),
        report.summary()
    );
    report.assert_ok();
}

#[test]
fn rccl_all_reduce_sums() {
    let Some(devs) = hip_devices() else { return };
    let reg = ggml_core::registry::backend("hip").unwrap();
    let count = 4096 + 3;
    let parts: Vec<(Arc<dyn Backend>, DataRef)> = devs
        .iter()
        .map(|d| {
            let buf = d.buffer_type().alloc(count * 4).unwrap();
            (d.new_backend().unwrap(), DataRef::new(buf, 0))
        })
        .collect();
    let backends: Vec<Arc<dyn Backend>> = parts.iter().map(|p| p.0.clone()).collect();
    let Some(comm) = reg.new_communicator(&backends) else {
        println!("skipped: no RCCL communicator (librccl.so missing)");
        return;
    };
    let comm = comm.unwrap();
    let data: Vec<DataRef> = parts.iter().map(|p| p.1.clone()).collect();
    check_all_reduce_sum(comm.as_ref(), &data, count);
    assert!(comm.all_reduce(&data, DType::Q8_0, 32).is_err());
}
