//! The scheduler across two backends that cannot read each other's memory: a fake accelerator that
//! computes only `scale` in its own (non-host) memory, and the CPU backend for everything else. Inputs
//! and intermediate results must be copied both ways, and the result must equal the CPU-only result.
//! The same opaque memory checks `Graph::write_f32`'s path through a scratch buffer.

use ggml_core::backend::{
    check_range, Backend, Buffer, BufferType, Device, DeviceCaps, DeviceKind, Event, MemoryInfo,
};
use ggml_core::host_buffer::HostBuffer;
use ggml_core::sched::Scheduler;
use ggml_core::{DType, DataRef, Graph, Op, Result, TensorId};
use std::any::Any;
use std::sync::Arc;

/// Device memory the host cannot address.
struct OpaqueBuffer(HostBuffer);

impl Buffer for OpaqueBuffer {
    fn size(&self) -> usize {
        self.0.size()
    }
    fn name(&self) -> String {
        "accel".into()
    }
    fn host_ptr(&self) -> Option<*mut u8> {
        None
    }
    fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.0.set(offset, data)
    }
    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.0.get(offset, out)
    }
    fn fill(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        self.0.fill(offset, len, value)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

struct OpaqueType;
impl BufferType for OpaqueType {
    fn name(&self) -> String {
        "accel".into()
    }
    fn alignment(&self) -> usize {
        256
    }
    fn is_host(&self) -> bool {
        false
    }
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        Ok(Arc::new(OpaqueBuffer(HostBuffer::new(size)?)))
    }
}

struct Accel;
impl Device for Accel {
    fn name(&self) -> String {
        "accel:0".into()
    }
    fn description(&self) -> String {
        "test accelerator computing only scale".into()
    }
    fn kind(&self) -> DeviceKind {
        DeviceKind::Gpu
    }
    fn family(&self) -> &'static str {
        "accel"
    }
    fn memory(&self) -> MemoryInfo {
        MemoryInfo {
            free: 1 << 30,
            total: 1 << 30,
            allocated: None,
        }
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps::default()
    }
    fn supports_op(&self, graph: &Graph, node: TensorId) -> bool {
        let t = graph.tensor(node);
        matches!(t.op, Op::Scale { .. }) && t.dtype() == DType::F32 && t.is_contiguous()
    }
    fn can_access(&self, buffer: &dyn Buffer) -> bool {
        buffer.as_any().is::<OpaqueBuffer>()
    }
    fn buffer_type(&self) -> Arc<dyn BufferType> {
        Arc::new(OpaqueType)
    }
    fn new_backend(&self) -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(AccelStream))
    }
}

struct AccelStream;
impl Backend for AccelStream {
    fn name(&self) -> String {
        "accel:0".into()
    }
    fn device(&self) -> Arc<dyn Device> {
        Arc::new(Accel)
    }
    fn copy_async(&self, src: &DataRef, dst: &DataRef, len: usize) -> Result<()> {
        let mut tmp = vec![0u8; len];
        src.buffer.get(src.offset, &mut tmp)?;
        dst.buffer.set(dst.offset, &tmp)
    }
    fn compute(&self, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
        for &n in nodes {
            let t = graph.tensor(n);
            let Op::Scale { scale, bias } = t.op else {
                continue;
            };
            let src = graph.data(t.src[0])?;
            assert!(
                Accel.can_access(src.buffer.as_ref()),
                "the scheduler copied the source here"
            );
            let mut v = vec![0f32; t.nelements()];
            src.buffer
                .get(src.offset, bytemuck::cast_slice_mut(&mut v))?;
            v.iter_mut().for_each(|x| *x = *x * scale + bias);
            let dst = graph.data(n)?;
            check_range(dst.offset, v.len() * 4, dst.buffer.size())?;
            dst.buffer.set(dst.offset, bytemuck::cast_slice(&v))?;
        }
        Ok(())
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    fn record_event(&self) -> Result<Arc<dyn Event>> {
        Ok(Arc::new(ggml_core::CompletedEvent))
    }
    fn wait_event(&self, _e: &dyn Event) -> Result<()> {
        Ok(())
    }
}

fn graph() -> (Graph, TensorId, TensorId) {
    let mut g = Graph::new();
    let x = g.new_input(DType::F32, &[37, 3]).unwrap();
    let a = g.scale_bias(x, 2.0, 0.5).unwrap(); // accelerator
    let b = g.sqr(a).unwrap(); // CPU
    let c = g.scale(b, -3.0).unwrap(); // accelerator again
    let d = g.add(c, x).unwrap(); // CPU, reads the input and the accelerator's result
    g.output(d);
    (g, x, d)
}

fn run(backends: Vec<Arc<dyn Backend>>) -> (Vec<f32>, Scheduler) {
    let (mut g, x, d) = graph();
    let mut s = Scheduler::new(backends);
    s.alloc(&mut g).unwrap();
    let input: Vec<f32> = (0..37 * 3).map(|i| (i as f32 * 0.37).sin()).collect();
    g.set_f32(x, &input).unwrap();
    s.compute(&g).unwrap();
    (g.get_f32(d).unwrap(), s)
}

#[test]
fn nodes_run_where_supported_and_data_is_copied_between_backends() {
    let cpu: Arc<dyn Device> = backend_cpu::device::cpu_devices(1, 1).unwrap().remove(0);
    let (want, _) = run(vec![cpu.new_backend().unwrap()]);
    let (got, sched) = run(vec![
        Accel.new_backend().unwrap(),
        cpu.new_backend().unwrap(),
    ]);
    assert_eq!(got, want);
    let mem = sched.memory();
    assert_eq!(mem.len(), 2);
    assert!(
        mem.iter().all(|m| m.planned > 0),
        "both backends hold compute memory: {mem:?}"
    );
    // The CPU alone cannot be skipped: without it the add has nowhere to run.
    let (mut g, _, _) = graph();
    let err = Scheduler::new(vec![Accel.new_backend().unwrap()])
        .alloc(&mut g)
        .unwrap_err();
    assert!(err.to_string().contains("sqr"), "{err}");
}

#[test]
fn layers_run_on_the_device_that_holds_their_weights() {
    use ggml_core::Layout;
    let devs = backend_cpu::device::cpu_devices(2, 2).unwrap();
    let mut g = Graph::new();
    let x = g.new_input(DType::F32, &[16, 2]).unwrap();
    let mut cur = x;
    let mut values = Vec::new();
    for (l, dev) in [&devs[0], &devs[0], &devs[1], &devs[1]]
        .into_iter()
        .enumerate()
    {
        let layout = Layout::contiguous(DType::F32, [16, 16, 1, 1]);
        let buf = dev.buffer_type().alloc(layout.nbytes()).unwrap();
        let w: Vec<f32> = (0..256)
            .map(|i| ((i * 7 + l * 3) % 13) as f32 / 13.0 - 0.5)
            .collect();
        buf.set(0, bytemuck::cast_slice(&w)).unwrap();
        values.push(w);
        let wt = g.new_bound(layout, DataRef::new(buf, 0), &format!("w{l}"), true);
        cur = g.mul_mat(wt, cur).unwrap();
    }
    g.output(cur);
    let backends: Vec<Arc<dyn Backend>> = devs.iter().map(|d| d.new_backend().unwrap()).collect();
    let mut s = Scheduler::new(backends);
    s.alloc(&mut g).unwrap();
    let input: Vec<f32> = (0..32).map(|i| i as f32 / 32.0).collect();
    g.set_f32(x, &input).unwrap();
    s.compute(&g).unwrap();
    let splits: Vec<(usize, usize)> = s.splits().iter().map(|(b, n)| (*b, n.len())).collect();
    assert_eq!(splits, vec![(0, 2), (1, 2)]);
    // The same product computed directly.
    let mut v = input.clone();
    for w in &values {
        let mut out = vec![0f32; 32];
        for t in 0..2 {
            for m in 0..16 {
                out[t * 16 + m] = (0..16).map(|k| w[m * 16 + k] * v[t * 16 + k]).sum();
            }
        }
        v = out;
    }
    let got = g.get_f32(cur).unwrap();
    for (a, b) in got.iter().zip(&v) {
        assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "{a} vs {b}");
    }
}

#[test]
fn a_meta_device_over_mixed_families_is_refused() {
    let cpu: Arc<dyn Device> = backend_cpu::device::cpu_devices(1, 1).unwrap().remove(0);
    let err = backend_meta::MetaDevice::new(vec![cpu, Arc::new(Accel)], None)
        .err()
        .expect("refused");
    let msg = err.to_string();
    assert!(msg.contains("cpu") && msg.contains("accel"), "{msg}");
}

#[test]
fn write_f32_in_host_memory_and_through_the_scratch() {
    let host: Arc<dyn Buffer> = Arc::new(HostBuffer::new(64).unwrap());
    let opaque: Arc<dyn Buffer> = Arc::new(OpaqueBuffer(HostBuffer::new(64).unwrap()));
    for buffer in [host, opaque] {
        let mut g = Graph::new();
        let a = g.new_input(DType::F32, &[3, 2]).unwrap();
        let b = g.new_input(DType::I32, &[2]).unwrap();
        g.tensor_mut(a).data = Some(DataRef::new(buffer.clone(), 8));
        let mut scratch = vec![9.0; 10];
        let values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        g.write_f32(a, &mut scratch, |v| v.copy_from_slice(&values))
            .unwrap();
        assert_eq!(g.get_f32(a).unwrap(), values, "{}", buffer.name());
        assert!(
            g.write_f32(b, &mut scratch, |_| {}).is_err(),
            "an I32 tensor"
        );
        g.tensor_mut(a).data = Some(DataRef::new(buffer.clone(), 48));
        let past_the_end = g.write_f32(a, &mut scratch, |v| v.fill(0.0));
        assert!(past_the_end.is_err(), "{}", buffer.name());
    }
}
