//! A two-layer transformer block (GQA attention through flash attention and through mul_mat +
//! softmax, a SwiGLU FFN or a MoE FFN) built for one plain device or for a meta device with declared
//! weight splits, and a harness that computes it; shared by the meta tests and benchmarks.

#![allow(clippy::too_many_arguments, dead_code)]

use backend_cpu::device::cpu_devices;
use backend_meta::{MetaDevice, ReduceOptions, WeightSplit};
use ggml_core::backend::{Backend, Buffer, Device};
use ggml_core::sched::Scheduler;
use ggml_core::{DType, DataRef, GluOp, Graph, Layout, RopeMode, RopeParams, TensorId};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::sync::Arc;

/// Sizes of the test block.
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub d: usize,
    pub head: usize,
    pub hq: usize,
    pub hkv: usize,
    pub ffn: usize,
    pub ctx: usize,
    pub experts: usize,
    pub used: usize,
}

impl Dims {
    /// Small sizes for correctness tests (uneven splits on purpose).
    pub const TEST: Dims = Dims {
        d: 64,
        head: 16,
        hq: 4,
        hkv: 2,
        ffn: 96,
        ctx: 16,
        experts: 4,
        used: 2,
    };
}

/// Where weights go: one plain device, or a meta device with declared splits.
pub enum Place {
    Single(Arc<dyn Device>),
    Meta(Arc<MetaDevice>),
}

pub struct Weights {
    pub dims: Dims,
    rng: rand::rngs::StdRng,
    buffers: HashMap<String, Arc<dyn Buffer>>,
}

impl Weights {
    pub fn new(seed: u64, dims: Dims) -> Self {
        Weights {
            dims,
            rng: rand::rngs::StdRng::seed_from_u64(seed),
            buffers: HashMap::new(),
        }
    }

    /// A weight with deterministic values (same per name for every placement), split as declared.
    fn make(
        &mut self,
        g: &mut Graph,
        place: &Place,
        name: &str,
        ne: [usize; 4],
        split: WeightSplit,
        layer: usize,
        scale: f32,
    ) -> TensorId {
        let layout = Layout::contiguous(DType::F32, ne);
        if let Some(b) = self.buffers.get(name) {
            return g.new_bound(layout, DataRef::new(b.clone(), 0), name, true);
        }
        let n: usize = ne.iter().product();
        let rng = &mut self.rng;
        let vals: Vec<f32> = (0..n)
            .map(|_| {
                if scale > 0.0 {
                    rng.gen_range(-scale..scale)
                } else {
                    0.0
                }
            })
            .collect();
        let buffer: Arc<dyn Buffer> = match place {
            Place::Single(dev) => dev.buffer_type().alloc(layout.nbytes()).unwrap(),
            Place::Meta(m) => m.alloc_tensor(layout, &split, layer, name).unwrap(),
        };
        buffer.set(0, bytemuck::cast_slice(&vals)).unwrap();
        self.buffers.insert(name.to_string(), buffer.clone());
        g.new_bound(layout, DataRef::new(buffer, 0), name, true)
    }
}

fn rows(axis: usize, len: usize, gran: usize) -> WeightSplit {
    WeightSplit::axis(axis, len, gran)
}

struct Inputs {
    x: TensorId,
    pos: TensorId,
    mask: TensorId,
}

fn attention(
    g: &mut Graph,
    w: &mut Weights,
    p: &Place,
    l: usize,
    h: TensorId,
    inp: &Inputs,
    t: usize,
    flash: bool,
) -> TensorId {
    let dm = w.dims;
    let group = dm.hq / dm.hkv;
    let wq = w.make(
        g,
        p,
        &format!("wq{l}"),
        [dm.d, dm.hq * dm.head, 1, 1],
        rows(1, dm.hq * dm.head, dm.head * group),
        l,
        0.3,
    );
    let wk = w.make(
        g,
        p,
        &format!("wk{l}"),
        [dm.d, dm.hkv * dm.head, 1, 1],
        rows(1, dm.hkv * dm.head, dm.head),
        l,
        0.3,
    );
    let wv = w.make(
        g,
        p,
        &format!("wv{l}"),
        [dm.d, dm.hkv * dm.head, 1, 1],
        rows(1, dm.hkv * dm.head, dm.head),
        l,
        0.3,
    );
    let wo = w.make(
        g,
        p,
        &format!("wo{l}"),
        [dm.hq * dm.head, dm.d, 1, 1],
        rows(0, dm.hq * dm.head, dm.head * group),
        l,
        0.3,
    );
    let kc = w.make(
        g,
        p,
        &format!("kc{l}"),
        [dm.head, dm.hkv, dm.ctx, 1],
        rows(1, dm.hkv, 1),
        l,
        0.0,
    );
    let vc = w.make(
        g,
        p,
        &format!("vc{l}"),
        [dm.head, dm.hkv, dm.ctx, 1],
        rows(1, dm.hkv, 1),
        l,
        0.0,
    );
    let rope = RopeParams::simple(RopeMode::Neox, dm.head, 10000.0);
    let q = g.mul_mat(wq, h).unwrap();
    let q = g.reshape(q, &[dm.head, dm.hq, t]).unwrap();
    let q = g.rope(q, inp.pos, None, rope).unwrap();
    let k = g.mul_mat(wk, h).unwrap();
    let k = g.reshape(k, &[dm.head, dm.hkv, t]).unwrap();
    let k = g.rope(k, inp.pos, None, rope).unwrap();
    let v = g.mul_mat(wv, h).unwrap();
    let v = g.reshape(v, &[dm.head, dm.hkv, t]).unwrap();
    let nb = *g.layout(kc);
    let kdst = g
        .view(kc, &[dm.head, dm.hkv, t], &[nb.nb[1], nb.nb[2]], 0)
        .unwrap();
    let kw = g.cpy(k, kdst).unwrap();
    g.expand(kw);
    let vdst = g
        .view(vc, &[dm.head, dm.hkv, t], &[nb.nb[1], nb.nb[2]], 0)
        .unwrap();
    let vw = g.cpy(v, vdst).unwrap();
    g.expand(vw);
    let kall = g
        .view(kc, &[dm.head, dm.hkv, t], &[nb.nb[1], nb.nb[2]], 0)
        .unwrap();
    let vall = g
        .view(vc, &[dm.head, dm.hkv, t], &[nb.nb[1], nb.nb[2]], 0)
        .unwrap();
    let kp = g.permute(kall, [0, 2, 1, 3]).unwrap();
    let qp = g.permute(q, [0, 2, 1, 3]).unwrap();
    let scale = 1.0 / (dm.head as f32).sqrt();
    let att = if flash {
        let vp = g.permute(vall, [0, 2, 1, 3]).unwrap();
        let a = g
            .flash_attn_ext(qp, kp, vp, Some(inp.mask), None, scale, 0.0, 0.0)
            .unwrap();
        g.reshape(a, &[dm.hq * dm.head, t]).unwrap()
    } else {
        let kq = g.mul_mat(kp, qp).unwrap();
        let kq = g.soft_max(kq, Some(inp.mask), None, scale, 0.0).unwrap();
        let vt = g.permute(vall, [1, 2, 0, 3]).unwrap();
        let vt = g.cont(vt).unwrap();
        let kqv = g.mul_mat(vt, kq).unwrap();
        let o = g.permute(kqv, [0, 2, 1, 3]).unwrap();
        let o = g.cont(o).unwrap();
        g.reshape(o, &[dm.hq * dm.head, t]).unwrap()
    };
    g.mul_mat(wo, att).unwrap()
}

fn dense_ffn(g: &mut Graph, w: &mut Weights, p: &Place, l: usize, h: TensorId) -> TensorId {
    let dm = w.dims;
    let gate = w.make(
        g,
        p,
        &format!("gate{l}"),
        [dm.d, dm.ffn, 1, 1],
        rows(1, dm.ffn, 8),
        l,
        0.3,
    );
    let up = w.make(
        g,
        p,
        &format!("up{l}"),
        [dm.d, dm.ffn, 1, 1],
        rows(1, dm.ffn, 8),
        l,
        0.3,
    );
    let down = w.make(
        g,
        p,
        &format!("down{l}"),
        [dm.ffn, dm.d, 1, 1],
        rows(0, dm.ffn, 8),
        l,
        0.3,
    );
    let a = g.mul_mat(gate, h).unwrap();
    let b = g.mul_mat(up, h).unwrap();
    let act = g.glu(GluOp::Swiglu, a, b).unwrap();
    g.mul_mat(down, act).unwrap()
}

fn moe_ffn(g: &mut Graph, w: &mut Weights, p: &Place, l: usize, h: TensorId, t: usize) -> TensorId {
    let dm = w.dims;
    let router = w.make(
        g,
        p,
        &format!("router{l}"),
        [dm.d, dm.experts, 1, 1],
        WeightSplit::Mirrored,
        l,
        0.5,
    );
    let gate = w.make(
        g,
        p,
        &format!("gexp{l}"),
        [dm.d, dm.ffn, dm.experts, 1],
        rows(1, dm.ffn, 8),
        l,
        0.3,
    );
    let up = w.make(
        g,
        p,
        &format!("uexp{l}"),
        [dm.d, dm.ffn, dm.experts, 1],
        rows(1, dm.ffn, 8),
        l,
        0.3,
    );
    let down = w.make(
        g,
        p,
        &format!("dexp{l}"),
        [dm.ffn, dm.d, dm.experts, 1],
        rows(0, dm.ffn, 8),
        l,
        0.3,
    );
    let bias = w.make(
        g,
        p,
        &format!("dbias{l}"),
        [dm.d, dm.experts, 1, 1],
        WeightSplit::Mirrored,
        l,
        0.2,
    );
    let logits = g.mul_mat(router, h).unwrap();
    let probs = g.soft_max(logits, None, None, 1.0, 0.0).unwrap();
    let ids = g.top_k(logits, dm.used).unwrap();
    let p3 = g.reshape(probs, &[1, dm.experts, t]).unwrap();
    let weights = g.get_rows(p3, ids).unwrap();
    let h3 = g.reshape(h, &[dm.d, 1, t]).unwrap();
    let a = g.mul_mat_id(gate, h3, ids).unwrap();
    let b = g.mul_mat_id(up, h3, ids).unwrap();
    let act = g.glu(GluOp::Swiglu, a, b).unwrap();
    let out = g.mul_mat_id(down, act, ids).unwrap();
    let out = g.add_id(out, bias, ids).unwrap();
    let out = g.mul(out, weights).unwrap();
    let nb = *g.layout(out);
    let mut sum = g.view(out, &[dm.d, t], &[nb.nb[2]], 0).unwrap();
    for e in 1..dm.used {
        let v = g.view(out, &[dm.d, t], &[nb.nb[2]], e * nb.nb[1]).unwrap();
        sum = g.add(sum, v).unwrap();
    }
    sum
}

/// Two layers; returns the graph, inputs and output.
fn block(w: &mut Weights, p: &Place, t: usize, moe: bool) -> (Graph, Inputs, TensorId) {
    let dm = w.dims;
    let mut g = Graph::new();
    let inp = Inputs {
        x: g.new_input(DType::F32, &[dm.d, t]).unwrap(),
        pos: g.new_input(DType::I32, &[t]).unwrap(),
        mask: g.new_input(DType::F32, &[t, t]).unwrap(),
    };
    let mut x = inp.x;
    for l in 0..2 {
        let n1 = w.make(
            &mut g,
            p,
            &format!("n1{l}"),
            [dm.d, 1, 1, 1],
            WeightSplit::Mirrored,
            l,
            1.0,
        );
        let n2 = w.make(
            &mut g,
            p,
            &format!("n2{l}"),
            [dm.d, 1, 1, 1],
            WeightSplit::Mirrored,
            l,
            1.0,
        );
        let h = g.rms_norm(x, 1e-5).unwrap();
        let h = g.mul(h, n1).unwrap();
        let a = attention(&mut g, w, p, l, h, &inp, t, l == 0);
        let x2 = g.add(a, x).unwrap();
        let h2 = g.rms_norm(x2, 1e-5).unwrap();
        let h2 = g.mul(h2, n2).unwrap();
        let f = if moe {
            moe_ffn(&mut g, w, p, l, h2, t)
        } else {
            dense_ffn(&mut g, w, p, l, h2)
        };
        x = g.add(f, x2).unwrap();
    }
    let out = g.rms_norm(x, 1e-5).unwrap();
    g.output(out);
    (g, inp, out)
}

/// Computes the block again and again with the same weights (plans and programs are reused).
pub struct Harness {
    w: Weights,
    sched: Scheduler,
    place: Place,
    /// The seed of the inputs.
    inputs: u64,
    moe: bool,
    t: usize,
}

impl Harness {
    pub fn new(
        backend: Arc<dyn Backend>,
        place: Place,
        dims: Dims,
        seed: u64,
        moe: bool,
        t: usize,
    ) -> Harness {
        Harness {
            w: Weights::new(seed, dims),
            sched: Scheduler::new(vec![backend]),
            place,
            inputs: seed ^ 7,
            moe,
            t,
        }
    }

    /// Later steps take inputs derived from `seed` (the weights stay).
    pub fn set_inputs(&mut self, seed: u64) {
        self.inputs = seed;
    }

    /// Later steps run `t` tokens (a graph of another shape).
    pub fn set_tokens(&mut self, t: usize) {
        self.t = t;
    }

    /// The scheduler's compute memory for the last graph (on a meta device: its arena).
    pub fn planned_memory(&self) -> usize {
        self.sched.memory().iter().map(|m| m.planned).sum()
    }

    /// One forward pass over fresh inputs derived from the seed; returns the output.
    pub fn step(&mut self) -> Vec<f32> {
        self.try_step().unwrap()
    }

    /// [`Harness::step`], with the computation's error returned.
    pub fn try_step(&mut self) -> ggml_core::Result<Vec<f32>> {
        let t = self.t;
        let (mut g, inp, o) = block(&mut self.w, &self.place, t, self.moe);
        self.sched.alloc(&mut g).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(self.inputs);
        let x: Vec<f32> = (0..self.w.dims.d * t)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        g.set_f32(inp.x, &x).unwrap();
        g.set_i32(inp.pos, &(0..t as i32).collect::<Vec<_>>())
            .unwrap();
        let mask: Vec<f32> = (0..t * t)
            .map(|i| {
                if i % t > i / t {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        g.set_f32(inp.mask, &mask).unwrap();
        self.sched.compute(&g)?;
        g.get_f32(o)
    }
}

/// A meta device over `n` CPU devices.
pub fn meta_device(
    n: usize,
    ratios: Option<Vec<f32>>,
    reduce: Option<ReduceOptions>,
) -> Arc<MetaDevice> {
    let devs: Vec<Arc<dyn Device>> = cpu_devices(n, n)
        .unwrap()
        .into_iter()
        .map(|d| d as Arc<dyn Device>)
        .collect();
    let meta = MetaDevice::new(devs, ratios).unwrap();
    if let Some(r) = reduce {
        meta.set_reduce_options(r);
    }
    meta
}

/// One plain CPU device with `threads` threads.
pub fn cpu_device(threads: usize) -> Arc<dyn Device> {
    cpu_devices(1, threads).unwrap().remove(0)
}

pub fn nmse(a: &[f32], r: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(r).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = r.iter().map(|y| (*y as f64).powi(2)).sum();
    num / den.max(1e-30)
}

pub fn single(seed: u64, moe: bool, t: usize) -> Vec<f32> {
    single_with_inputs(seed, seed ^ 7, moe, t)
}

/// [`single`] with the inputs of [`Harness::set_inputs`]`(inputs)`.
pub fn single_with_inputs(seed: u64, inputs: u64, moe: bool, t: usize) -> Vec<f32> {
    let dev = cpu_device(1);
    let mut h = Harness::new(
        dev.new_backend().unwrap(),
        Place::Single(dev),
        Dims::TEST,
        seed,
        moe,
        t,
    );
    h.set_inputs(inputs);
    h.step()
}

pub fn on_meta(
    n: usize,
    ratios: Option<Vec<f32>>,
    seed: u64,
    moe: bool,
    t: usize,
    repeats: usize,
) -> (Vec<f32>, backend_meta::MetaStats) {
    on_meta_with(n, ratios, seed, moe, t, repeats, None)
}

pub fn on_meta_with(
    n: usize,
    ratios: Option<Vec<f32>>,
    seed: u64,
    moe: bool,
    t: usize,
    repeats: usize,
    reduce: Option<ReduceOptions>,
) -> (Vec<f32>, backend_meta::MetaStats) {
    let meta = meta_device(n, ratios, reduce);
    let backend = meta.new_meta_backend().unwrap();
    let mut h = Harness::new(backend.clone(), Place::Meta(meta), Dims::TEST, seed, moe, t);
    let mut out = Vec::new();
    for _ in 0..repeats {
        out = h.step();
    }
    (out, backend.stats())
}
