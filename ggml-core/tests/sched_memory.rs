//! Scheduler checks that need no real backend: compute memory of a transformer layer against the
//! liveness lower bound, and plan reuse for a graph computed again (the last few shapes kept).

use ggml_core::backend::{
    Backend, Buffer, BufferType, Device, DeviceCaps, DeviceKind, Event, MemoryInfo,
};
use ggml_core::host_buffer::HostBufferType;
use ggml_core::sched::Scheduler;
use ggml_core::{DType, DataRef, GluOp, Graph, Layout, Result, RopeMode, RopeParams, TensorId};
use std::sync::Arc;

/// A device that only plans; with `fuse`, it reports each product pair followed by its gated unit
/// as one launch, as the GPU devices do.
#[derive(Clone, Copy, Default)]
struct PlanOnlyDevice {
    fuse: bool,
}
impl Device for PlanOnlyDevice {
    fn name(&self) -> String {
        "plan:0".into()
    }
    fn description(&self) -> String {
        "planning-only test device".into()
    }
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cpu
    }
    fn family(&self) -> &'static str {
        "plan"
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
    fn supports_op(&self, _graph: &Graph, _node: TensorId) -> bool {
        true
    }
    fn can_access(&self, buffer: &dyn Buffer) -> bool {
        buffer.host_ptr().is_some()
    }
    fn buffer_type(&self) -> Arc<dyn BufferType> {
        Arc::new(HostBufferType)
    }
    fn new_backend(&self) -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(PlanOnlyBackend(*self)))
    }
    fn launch_groups(&self, graph: &Graph, nodes: &[TensorId]) -> Vec<Vec<TensorId>> {
        if !self.fuse {
            return Vec::new();
        }
        nodes
            .windows(3)
            .filter(|w| matches!(graph.tensor(w[2]).op, ggml_core::Op::Glu { .. }))
            .map(|w| w.to_vec())
            .collect()
    }
}

struct PlanOnlyBackend(PlanOnlyDevice);
impl Backend for PlanOnlyBackend {
    fn name(&self) -> String {
        "plan".into()
    }
    fn device(&self) -> Arc<dyn Device> {
        Arc::new(self.0)
    }
    fn copy_async(&self, _src: &DataRef, _dst: &DataRef, _len: usize) -> Result<()> {
        Ok(())
    }
    fn compute(&self, _graph: &Graph, _nodes: &[TensorId]) -> Result<()> {
        Ok(())
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    fn record_event(&self) -> Result<Arc<dyn Event>> {
        Ok(Arc::new(ggml_core::CompletedEvent))
    }
    fn wait_event(&self, _event: &dyn Event) -> Result<()> {
        Ok(())
    }
}

struct Weights {
    buffer: Arc<dyn Buffer>,
    next: usize,
}

impl Weights {
    fn bind(&mut self, g: &mut Graph, dtype: DType, ne: [usize; 4], name: &str) -> TensorId {
        let layout = Layout::contiguous(dtype, ne);
        let id = g.new_bound(
            layout,
            DataRef::new(self.buffer.clone(), self.next),
            name,
            true,
        );
        self.next += layout.nbytes().div_ceil(64) * 64;
        id
    }
}

/// One Llama-style layer over `n_tokens` tokens with a KV cache view, like the model runtime builds.
fn transformer_layer(w: &mut Weights, n_tokens: usize) -> Graph {
    let (d, heads, head_dim, ffn, ctx) = (512usize, 8usize, 64usize, 1408usize, 256usize);
    let mut g = Graph::new();
    let x = g.new_input(DType::F32, &[d, n_tokens]).unwrap();
    let pos = g.new_input(DType::I32, &[n_tokens]).unwrap();
    let mask = g.new_input(DType::F32, &[ctx, n_tokens]).unwrap();
    let attn_norm = w.bind(&mut g, DType::F32, [d, 1, 1, 1], "attn_norm");
    let wq = w.bind(&mut g, DType::Q8_0, [d, d, 1, 1], "wq");
    let wk = w.bind(&mut g, DType::Q8_0, [d, d, 1, 1], "wk");
    let wv = w.bind(&mut g, DType::Q8_0, [d, d, 1, 1], "wv");
    let wo = w.bind(&mut g, DType::Q8_0, [d, d, 1, 1], "wo");
    let kc = w.bind(&mut g, DType::F16, [head_dim, heads, ctx, 1], "k_cache");
    let vc = w.bind(&mut g, DType::F16, [head_dim, heads, ctx, 1], "v_cache");
    let ffn_norm = w.bind(&mut g, DType::F32, [d, 1, 1, 1], "ffn_norm");
    let gate = w.bind(&mut g, DType::Q4_0, [d, ffn, 1, 1], "gate");
    let up = w.bind(&mut g, DType::Q4_0, [d, ffn, 1, 1], "up");
    let down = w.bind(&mut g, DType::Q4_0, [ffn, d, 1, 1], "down");

    let h = g.rms_norm(x, 1e-5).unwrap();
    let h = g.mul(h, attn_norm).unwrap();
    let rope = RopeParams::simple(RopeMode::Normal, head_dim, 10000.0);
    let q = g.mul_mat(wq, h).unwrap();
    let q = g.reshape(q, &[head_dim, heads, n_tokens]).unwrap();
    let q = g.rope(q, pos, None, rope).unwrap();
    let k = g.mul_mat(wk, h).unwrap();
    let k = g.reshape(k, &[head_dim, heads, n_tokens]).unwrap();
    let k = g.rope(k, pos, None, rope).unwrap();
    let v = g.mul_mat(wv, h).unwrap();
    let v = g.reshape(v, &[head_dim, heads, n_tokens]).unwrap();
    let row = head_dim * heads * 2;
    let kdst = g
        .view(kc, &[head_dim, heads, n_tokens], &[head_dim * 2, row], 0)
        .unwrap();
    let kw = g.cpy(k, kdst).unwrap();
    g.expand(kw);
    let vdst = g
        .view(vc, &[head_dim, heads, n_tokens], &[head_dim * 2, row], 0)
        .unwrap();
    let vw = g.cpy(v, vdst).unwrap();
    g.expand(vw);
    let kall = g.permute(kc, [0, 2, 1, 3]).unwrap();
    let vall = g.permute(vc, [0, 2, 1, 3]).unwrap();
    let qp = g.permute(q, [0, 2, 1, 3]).unwrap();
    let att = g
        .flash_attn_ext(qp, kall, vall, Some(mask), None, 0.125, 0.0, 0.0)
        .unwrap();
    let att = g.reshape(att, &[d, n_tokens]).unwrap();
    let o = g.mul_mat(wo, att).unwrap();
    let x2 = g.add(o, x).unwrap();
    let h2 = g.rms_norm(x2, 1e-5).unwrap();
    let h2 = g.mul(h2, ffn_norm).unwrap();
    let gt = g.mul_mat(gate, h2).unwrap();
    let u = g.mul_mat(up, h2).unwrap();
    let act = g.glu(GluOp::Swiglu, gt, u).unwrap();
    let dn = g.mul_mat(down, act).unwrap();
    let out = g.add(dn, x2).unwrap();
    g.output(out);
    g
}

fn weights() -> Weights {
    Weights {
        buffer: HostBufferType.alloc(64 << 20).unwrap(),
        next: 0,
    }
}

#[test]
fn transformer_layer_compute_memory_is_near_the_liveness_bound() {
    for n_tokens in [1usize, 7, 32, 128] {
        let mut w = weights();
        let mut g = transformer_layer(&mut w, n_tokens);
        let mut sched = Scheduler::new(vec![PlanOnlyDevice::default().new_backend().unwrap()]);
        sched.alloc(&mut g).unwrap();
        let m = &sched.memory()[0];
        assert!(m.lower_bound > 0);
        let ratio = m.planned as f64 / m.lower_bound as f64;
        println!(
            "n_tokens {n_tokens}: planned {} lower bound {} ratio {ratio:.3}",
            m.planned, m.lower_bound
        );
        assert!(
            ratio <= 1.25,
            "planned {} > 1.25 x lower bound {}",
            m.planned,
            m.lower_bound
        );
        // Every unbound tensor got memory; views resolve into it.
        for &n in g.nodes() {
            g.data(n).unwrap();
        }
    }
}

#[test]
fn same_graph_again_reuses_the_plan() {
    let mut w = weights();
    let mut sched = Scheduler::new(vec![PlanOnlyDevice::default().new_backend().unwrap()]);
    let mut g1 = transformer_layer(&mut w, 4);
    sched.alloc(&mut g1).unwrap();
    let out1 = *g1.nodes().last().unwrap();
    let d1 = g1.data(out1).unwrap().offset;
    w.next = 0;
    let mut g2 = transformer_layer(&mut w, 4);
    sched.alloc(&mut g2).unwrap();
    assert_eq!(sched.stats().plans, 1);
    assert_eq!(sched.stats().reuses, 1);
    assert_eq!(g2.data(out1).unwrap().offset, d1);
    w.next = 0;
    let mut g3 = transformer_layer(&mut w, 5);
    sched.alloc(&mut g3).unwrap();
    assert_eq!(sched.stats().plans, 2, "a different shape is planned again");
}

#[test]
fn shapes_seen_before_reuse_their_kept_plans() {
    let mut w = weights();
    let mut sched = Scheduler::new(vec![PlanOnlyDevice::default().new_backend().unwrap()]);
    let mut alloc = |n_tokens: usize| {
        w.next = 0;
        let mut g = transformer_layer(&mut w, n_tokens);
        sched.alloc(&mut g).unwrap();
        let out = *g.nodes().last().unwrap();
        (g.data(out).unwrap().offset, sched.memory(), sched.stats())
    };
    let sizes: Vec<usize> = (1..=ggml_core::sched::KEPT_PLANS).collect();
    let first: Vec<_> = sizes.iter().map(|&n| alloc(n)).collect();
    // Every shape again, in the same order (micro-batches of another prompt): no planning.
    for (&n, (offset, memory, _)) in sizes.iter().zip(&first) {
        let (again, again_memory, _) = alloc(n);
        assert_eq!((again, &again_memory), (*offset, memory), "{n} tokens");
    }
    let stats = alloc(1).2;
    assert_eq!(
        (stats.plans, stats.reuses),
        (sizes.len() as u64, sizes.len() as u64 + 1)
    );
    // One more shape pushes out the least recently used (2 tokens; 1 was used last but one).
    alloc(sizes.len() + 1);
    let stats = alloc(1).2;
    assert_eq!(stats.reuses, sizes.len() as u64 + 2, "1 token stayed");
    let stats = alloc(2).2;
    assert_eq!(stats.plans, sizes.len() as u64 + 2, "2 tokens was dropped");
}

#[test]
fn inputs_no_node_reads_still_get_memory() {
    let mut g = Graph::new();
    let x = g.new_input(DType::F32, &[8]).unwrap();
    let unused = g.new_input(DType::F32, &[5]).unwrap();
    let y = g.scale(x, 2.0).unwrap();
    g.output(y);
    let mut sched = Scheduler::new(vec![PlanOnlyDevice::default().new_backend().unwrap()]);
    sched.alloc(&mut g).unwrap();
    g.set_f32(unused, &[1.0; 5]).unwrap();
    assert_eq!(g.get_f32(unused).unwrap(), vec![1.0; 5]);
}

/// The byte range of `id`'s memory.
fn extent(g: &Graph, id: TensorId) -> (usize, usize) {
    let d = g.data(id).unwrap();
    let start = d.buffer.host_ptr().unwrap() as usize + d.offset;
    (start, start + g.layout(id).nbytes())
}

/// Whether any two of `ids` share a byte.
fn any_overlap(g: &Graph, ids: &[TensorId]) -> bool {
    let spans: Vec<_> = ids.iter().map(|&i| extent(g, i)).collect();
    (0..spans.len())
        .any(|a| (a + 1..spans.len()).any(|b| spans[a].0 < spans[b].1 && spans[b].0 < spans[a].1))
}

#[test]
fn a_launch_group_keeps_its_tensors_apart() {
    // Without groups the planner puts the gated unit over the products' activation (no longer
    // needed in node order); a device that launches gate, up and glu as one kernel must not see that.
    let mut overlapped = false;
    for fuse in [false, true] {
        for n_tokens in [1usize, 3] {
            let mut w = weights();
            let mut g = transformer_layer(&mut w, n_tokens);
            let mut sched = Scheduler::new(vec![PlanOnlyDevice { fuse }.new_backend().unwrap()]);
            sched.alloc(&mut g).unwrap();
            let glu = g
                .nodes()
                .iter()
                .copied()
                .find(|&n| matches!(g.tensor(n).op, ggml_core::Op::Glu { .. }))
                .unwrap();
            let [gate, up] = [g.tensor(glu).src[0], g.tensor(glu).src[1]];
            let x = g.tensor(gate).src[1];
            let overlap = any_overlap(&g, &[x, gate, up, glu]);
            if fuse {
                assert!(
                    !overlap,
                    "fused launch group shares memory ({n_tokens} tokens)"
                );
            }
            overlapped |= overlap;
        }
    }
    assert!(
        overlapped,
        "the unfused plan never reused the activation: the test shows nothing"
    );
}
