//! The CPU backend through its public traits: devices, buffers, streams computing a small graph,
//! errors for missing data and unsupported ops, the registry entry and the communicator.

use backend_cpu::{cpu_devices, CpuCommunicator, CpuDevice};
use ggml_core::{Communicator, DType, DataRef, Device, Error, Graph, TensorId, UnaryOp};
use std::sync::Arc;

/// Gives every tensor without data (and not a view) its own buffer on `dev`.
fn alloc_all(g: &mut Graph, dev: &CpuDevice) {
    let bt = dev.buffer_type();
    for i in 0..g.len() {
        let id = TensorId(i as u32);
        let t = g.tensor(id);
        if t.data.is_none() && t.view.is_none() {
            let buf = bt.alloc(t.nbytes()).unwrap();
            g.tensor_mut(id).data = Some(DataRef::new(buf, 0));
        }
    }
}

#[test]
fn devices_split_threads_and_memory() {
    let devs = cpu_devices(3, 7).unwrap();
    let names: Vec<String> = devs.iter().map(|d| d.name()).collect();
    assert_eq!(names, ["cpu:0", "cpu:1", "cpu:2"]);
    assert_eq!(
        devs.iter().map(|d| d.threads()).collect::<Vec<_>>(),
        [3, 2, 2]
    );
    assert_eq!(devs[1].family(), "cpu");
    let total = devs[0].memory().total;
    assert!(total > 0 && total == devs[2].memory().total);
    let buf = devs[0].buffer_type().alloc(1 << 20).unwrap();
    assert_eq!(devs[0].memory().free, total - (1 << 20));
    assert!(devs[1].can_access(buf.as_ref()));
    drop(buf);
    assert_eq!(devs[0].memory().free, total);
    assert!(matches!(
        devs[0].buffer_type().alloc(total + 1),
        Err(Error::OutOfMemory { .. })
    ));
    assert_eq!(
        cpu_devices(4, 2)
            .unwrap()
            .iter()
            .map(|d| d.threads())
            .collect::<Vec<_>>(),
        [1, 1, 1, 1]
    );
}

#[test]
fn stream_computes_a_graph_with_views() {
    let dev = cpu_devices(2, 2).unwrap().remove(1);
    let mut g = Graph::new();
    let a = g.new_input(DType::F32, &[4, 3]).unwrap();
    let b = g.new_input(DType::F32, &[4, 1]).unwrap();
    let at = g.transpose(a).unwrap();
    let c = g.cont(at).unwrap();
    let ct = g.transpose(c).unwrap();
    let s = g.add(ct, b).unwrap();
    let out = g.unary(s, UnaryOp::Relu).unwrap();
    g.output(out);
    alloc_all(&mut g, &dev);
    let av: Vec<f32> = (0..12).map(|i| i as f32 - 6.0).collect();
    g.set_f32(a, &av).unwrap();
    g.set_f32(b, &[1.0, -1.0, 0.5, 0.0]).unwrap();
    assert!(dev.supports_op(&g, out));
    let be = dev.new_backend().unwrap();
    be.compute(&g, g.nodes()).unwrap();
    be.synchronize().unwrap();
    let got = g.get_f32(out).unwrap();
    let want: Vec<f32> = av
        .iter()
        .enumerate()
        .map(|(i, &x)| (x + [1.0, -1.0, 0.5, 0.0][i % 4]).max(0.0))
        .collect();
    assert_eq!(got, want);
    assert!(be.record_event().unwrap().is_done());
    be.set_threads(1);
    be.compute(&g, g.nodes()).unwrap();
    assert_eq!(g.get_f32(out).unwrap(), want);
}

#[test]
fn stream_reports_errors() {
    let dev = cpu_devices(1, 1).unwrap().remove(0);
    let be = dev.new_backend().unwrap();
    // Missing data.
    let mut g = Graph::new();
    let a = g.new_input(DType::F32, &[4]).unwrap();
    let s = g.sqr(a).unwrap();
    g.output(s);
    assert!(matches!(be.compute(&g, &[s]), Err(Error::NoData(_))));
    // An op/type combination the kernels do not handle: I32 into a quantized tensor.
    let mut g = Graph::new();
    let a = g.new_input(DType::I32, &[32]).unwrap();
    let q = g.new_tensor(DType::Q8_0, &[32]).unwrap();
    let c = g.cpy(a, q).unwrap();
    g.output(c);
    alloc_all(&mut g, &dev);
    assert!(!dev.supports_op(&g, c));
    assert!(matches!(
        be.compute(&g, &[c]),
        Err(Error::UnsupportedOp { .. })
    ));
}

#[test]
fn copy_async_and_communicator() {
    let devs = cpu_devices(2, 2).unwrap();
    let bufs: Vec<_> = devs
        .iter()
        .map(|d| d.buffer_type().alloc(64).unwrap())
        .collect();
    let refs: Vec<DataRef> = bufs.iter().map(|b| DataRef::new(b.clone(), 0)).collect();
    bufs[0]
        .set(0, bytemuck::cast_slice(&[1.0f32, 2.0, 3.0]))
        .unwrap();
    bufs[1]
        .set(0, bytemuck::cast_slice(&[10.0f32, 20.0, 30.0]))
        .unwrap();
    let comm = CpuCommunicator::new(2);
    comm.all_reduce(&refs, DType::F32, 3).unwrap();
    for b in &bufs {
        let mut out = [0u8; 12];
        b.get(0, &mut out).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&out), &[11.0, 22.0, 33.0]);
    }
    let be = devs[0].new_backend().unwrap();
    be.copy_async(&refs[0].advanced(4), &refs[1].advanced(32), 8)
        .unwrap();
    let mut out = [0u8; 8];
    bufs[1].get(32, &mut out).unwrap();
    assert_eq!(bytemuck::cast_slice::<u8, f32>(&out), &[22.0, 33.0]);
    assert!(be.copy_async(&refs[0], &refs[1].advanced(60), 8).is_err());
}

#[test]
fn registered_in_core_registry() {
    let reg = ggml_core::registry::backend("cpu").expect("cpu family registered");
    assert!(!reg.devices().is_empty());
    let dev: Arc<dyn Device> = ggml_core::registry::device("cpu:0").unwrap();
    assert_eq!(dev.family(), "cpu");
}
