//! End-to-end checks of the meta device over CPU devices: a two-layer transformer block (GQA attention
//! through flash attention and through mul_mat + softmax, SwiGLU FFN, and a MoE variant) computes the
//! same output on meta(cpu x N) as on one CPU device, for several device counts and ratios; the MoE
//! reduction is delayed past the expert sum; a repeated graph hits the program cache.

#![allow(clippy::too_many_arguments)]

use backend_cpu::device::cpu_devices;
use backend_meta::{MetaDevice, ReduceOptions, WeightSplit};
use ggml_core::backend::{Backend, Buffer, Device};
use ggml_core::sched::Scheduler;
use ggml_core::{DType, DataRef, GluOp, Graph, Layout, RopeMode, RopeParams, TensorId};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::sync::Arc;

const D: usize = 64; // model width
const HEAD: usize = 16;
const HQ: usize = 4;
const HKV: usize = 2;
const FFN: usize = 96;
const CTX: usize = 16;
const EXPERTS: usize = 4;
const USED: usize = 2;

/// Where weights go: one plain device, or a meta device with declared splits.
enum Place {
    Single(Arc<dyn Device>),
    Meta(Arc<MetaDevice>),
}

struct Weights {
    rng: rand::rngs::StdRng,
    buffers: HashMap<String, Arc<dyn Buffer>>,
}

impl Weights {
    fn new(seed: u64) -> Self {
        Weights {
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
    let group = HQ / HKV;
    let wq = w.make(
        g,
        p,
        &format!("wq{l}"),
        [D, HQ * HEAD, 1, 1],
        rows(1, HQ * HEAD, HEAD * group),
        l,
        0.3,
    );
    let wk = w.make(
        g,
        p,
        &format!("wk{l}"),
        [D, HKV * HEAD, 1, 1],
        rows(1, HKV * HEAD, HEAD),
        l,
        0.3,
    );
    let wv = w.make(
        g,
        p,
        &format!("wv{l}"),
        [D, HKV * HEAD, 1, 1],
        rows(1, HKV * HEAD, HEAD),
        l,
        0.3,
    );
    let wo = w.make(
        g,
        p,
        &format!("wo{l}"),
        [HQ * HEAD, D, 1, 1],
        rows(0, HQ * HEAD, HEAD * group),
        l,
        0.3,
    );
    let kc = w.make(
        g,
        p,
        &format!("kc{l}"),
        [HEAD, HKV, CTX, 1],
        rows(1, HKV, 1),
        l,
        0.0,
    );
    let vc = w.make(
        g,
        p,
        &format!("vc{l}"),
        [HEAD, HKV, CTX, 1],
        rows(1, HKV, 1),
        l,
        0.0,
    );
    let rope = RopeParams::simple(RopeMode::Neox, HEAD, 10000.0);
    let q = g.mul_mat(wq, h).unwrap();
    let q = g.reshape(q, &[HEAD, HQ, t]).unwrap();
    let q = g.rope(q, inp.pos, None, rope).unwrap();
    let k = g.mul_mat(wk, h).unwrap();
    let k = g.reshape(k, &[HEAD, HKV, t]).unwrap();
    let k = g.rope(k, inp.pos, None, rope).unwrap();
    let v = g.mul_mat(wv, h).unwrap();
    let v = g.reshape(v, &[HEAD, HKV, t]).unwrap();
    let nb = *g.layout(kc);
    let kdst = g
        .view(kc, &[HEAD, HKV, t], &[nb.nb[1], nb.nb[2]], 0)
        .unwrap();
    let kw = g.cpy(k, kdst).unwrap();
    g.expand(kw);
    let vdst = g
        .view(vc, &[HEAD, HKV, t], &[nb.nb[1], nb.nb[2]], 0)
        .unwrap();
    let vw = g.cpy(v, vdst).unwrap();
    g.expand(vw);
    let kall = g
        .view(kc, &[HEAD, HKV, t], &[nb.nb[1], nb.nb[2]], 0)
        .unwrap();
    let vall = g
        .view(vc, &[HEAD, HKV, t], &[nb.nb[1], nb.nb[2]], 0)
        .unwrap();
    let kp = g.permute(kall, [0, 2, 1, 3]).unwrap();
    let qp = g.permute(q, [0, 2, 1, 3]).unwrap();
    let scale = 1.0 / (HEAD as f32).sqrt();
    let att = if flash {
        let vp = g.permute(vall, [0, 2, 1, 3]).unwrap();
        let a = g
            .flash_attn_ext(qp, kp, vp, Some(inp.mask), None, scale, 0.0, 0.0)
            .unwrap();
        g.reshape(a, &[HQ * HEAD, t]).unwrap()
    } else {
        let kq = g.mul_mat(kp, qp).unwrap();
        let kq = g.soft_max(kq, Some(inp.mask), None, scale, 0.0).unwrap();
        let vt = g.permute(vall, [1, 2, 0, 3]).unwrap();
        let vt = g.cont(vt).unwrap();
        let kqv = g.mul_mat(vt, kq).unwrap();
        let o = g.permute(kqv, [0, 2, 1, 3]).unwrap();
        let o = g.cont(o).unwrap();
        g.reshape(o, &[HQ * HEAD, t]).unwrap()
    };
    g.mul_mat(wo, att).unwrap()
}

fn dense_ffn(g: &mut Graph, w: &mut Weights, p: &Place, l: usize, h: TensorId) -> TensorId {
    let gate = w.make(
        g,
        p,
        &format!("gate{l}"),
        [D, FFN, 1, 1],
        rows(1, FFN, 8),
        l,
        0.3,
    );
    let up = w.make(
        g,
        p,
        &format!("up{l}"),
        [D, FFN, 1, 1],
        rows(1, FFN, 8),
        l,
        0.3,
    );
    let down = w.make(
        g,
        p,
        &format!("down{l}"),
        [FFN, D, 1, 1],
        rows(0, FFN, 8),
        l,
        0.3,
    );
    let a = g.mul_mat(gate, h).unwrap();
    let b = g.mul_mat(up, h).unwrap();
    let act = g.glu(GluOp::Swiglu, a, b).unwrap();
    g.mul_mat(down, act).unwrap()
}

fn moe_ffn(g: &mut Graph, w: &mut Weights, p: &Place, l: usize, h: TensorId, t: usize) -> TensorId {
    let router = w.make(
        g,
        p,
        &format!("router{l}"),
        [D, EXPERTS, 1, 1],
        WeightSplit::Mirrored,
        l,
        0.5,
    );
    let gate = w.make(
        g,
        p,
        &format!("gexp{l}"),
        [D, FFN, EXPERTS, 1],
        rows(1, FFN, 8),
        l,
        0.3,
    );
    let up = w.make(
        g,
        p,
        &format!("uexp{l}"),
        [D, FFN, EXPERTS, 1],
        rows(1, FFN, 8),
        l,
        0.3,
    );
    let down = w.make(
        g,
        p,
        &format!("dexp{l}"),
        [FFN, D, EXPERTS, 1],
        rows(0, FFN, 8),
        l,
        0.3,
    );
    let bias = w.make(
        g,
        p,
        &format!("dbias{l}"),
        [D, EXPERTS, 1, 1],
        WeightSplit::Mirrored,
        l,
        0.2,
    );
    let logits = g.mul_mat(router, h).unwrap();
    let probs = g.soft_max(logits, None, None, 1.0, 0.0).unwrap();
    let ids = g.top_k(logits, USED).unwrap();
    let p3 = g.reshape(probs, &[1, EXPERTS, t]).unwrap();
    let weights = g.get_rows(p3, ids).unwrap();
    let h3 = g.reshape(h, &[D, 1, t]).unwrap();
    let a = g.mul_mat_id(gate, h3, ids).unwrap();
    let b = g.mul_mat_id(up, h3, ids).unwrap();
    let act = g.glu(GluOp::Swiglu, a, b).unwrap();
    let out = g.mul_mat_id(down, act, ids).unwrap();
    let out = g.add_id(out, bias, ids).unwrap();
    let out = g.mul(out, weights).unwrap();
    let nb = *g.layout(out);
    let mut sum = g.view(out, &[D, t], &[nb.nb[2]], 0).unwrap();
    for e in 1..USED {
        let v = g.view(out, &[D, t], &[nb.nb[2]], e * nb.nb[1]).unwrap();
        sum = g.add(sum, v).unwrap();
    }
    sum
}

/// Two layers; returns the graph, inputs and output.
fn block(w: &mut Weights, p: &Place, t: usize, moe: bool) -> (Graph, Inputs, TensorId) {
    let mut g = Graph::new();
    let inp = Inputs {
        x: g.new_input(DType::F32, &[D, t]).unwrap(),
        pos: g.new_input(DType::I32, &[t]).unwrap(),
        mask: g.new_input(DType::F32, &[t, t]).unwrap(),
    };
    let mut x = inp.x;
    for l in 0..2 {
        let n1 = w.make(
            &mut g,
            p,
            &format!("n1{l}"),
            [D, 1, 1, 1],
            WeightSplit::Mirrored,
            l,
            1.0,
        );
        let n2 = w.make(
            &mut g,
            p,
            &format!("n2{l}"),
            [D, 1, 1, 1],
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

fn run(
    backend: Arc<dyn Backend>,
    p: &Place,
    seed: u64,
    moe: bool,
    t: usize,
    repeats: usize,
) -> Vec<f32> {
    let mut w = Weights::new(seed);
    let mut sched = Scheduler::new(vec![backend]);
    let mut out = Vec::new();
    for _ in 0..repeats {
        let (mut g, inp, o) = block(&mut w, p, t, moe);
        sched.alloc(&mut g).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 7);
        let x: Vec<f32> = (0..D * t).map(|_| rng.gen_range(-1.0..1.0)).collect();
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
        sched.compute(&g).unwrap();
        out = g.get_f32(o).unwrap();
    }
    out
}

fn nmse(a: &[f32], r: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(r).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = r.iter().map(|y| (*y as f64).powi(2)).sum();
    num / den.max(1e-30)
}

fn single(seed: u64, moe: bool, t: usize) -> Vec<f32> {
    let dev: Arc<dyn Device> = cpu_devices(1, 1).unwrap().remove(0);
    run(
        dev.new_backend().unwrap(),
        &Place::Single(dev),
        seed,
        moe,
        t,
        1,
    )
}

fn on_meta(
    n: usize,
    ratios: Option<Vec<f32>>,
    seed: u64,
    moe: bool,
    t: usize,
    repeats: usize,
) -> (Vec<f32>, backend_meta::MetaStats) {
    on_meta_with(n, ratios, seed, moe, t, repeats, None)
}

fn on_meta_with(
    n: usize,
    ratios: Option<Vec<f32>>,
    seed: u64,
    moe: bool,
    t: usize,
    repeats: usize,
    reduce: Option<ReduceOptions>,
) -> (Vec<f32>, backend_meta::MetaStats) {
    let devs: Vec<Arc<dyn Device>> = cpu_devices(n, n)
        .unwrap()
        .into_iter()
        .map(|d| d as Arc<dyn Device>)
        .collect();
    let meta = MetaDevice::new(devs, ratios).unwrap();
    if let Some(r) = reduce {
        meta.set_reduce_options(r);
    }
    let backend = meta.new_meta_backend().unwrap();
    let out = run(backend.clone(), &Place::Meta(meta), seed, moe, t, repeats);
    (out, backend.stats())
}

#[test]
fn dense_block_matches_one_device() {
    let seed = rand::random::<u64>();
    for t in [1usize, 5] {
        let want = single(seed, false, t);
        assert!(want.iter().all(|v| v.is_finite()));
        for (n, ratios) in [
            (1, None),
            (2, None),
            (3, None),
            (4, None),
            (2, Some(vec![3.0, 1.0])),
            (3, Some(vec![1.0, 1.0, 0.0])),
        ] {
            let (got, stats) = on_meta(n, ratios.clone(), seed, false, t, 1);
            let e = nmse(&got, &want);
            assert!(
                e <= 1e-6,
                "seed {seed} t {t} n {n} ratios {ratios:?}: nmse {e}"
            );
            if n > 1 {
                assert!(stats.reductions > 0, "partial sums were reduced");
            }
        }
    }
}

#[test]
fn moe_block_matches_and_reduces_after_the_expert_sum() {
    let seed = rand::random::<u64>();
    let t = 3;
    let want = single(seed, true, t);
    for (n, ratios) in [(2, None), (3, Some(vec![1.0, 1.0, 0.0])), (4, None)] {
        let (got, stats) = on_meta(n, ratios.clone(), seed, true, t, 1);
        let e = nmse(&got, &want);
        assert!(e <= 1e-6, "seed {seed} n {n} ratios {ratios:?}: nmse {e}");
        // Per layer: one reduction of the attention output and one of the MoE output, each one token's
        // hidden state per token ([D, t] f32), not one per used expert ([D, USED, t]).
        let hidden = (D * t * 4) as u64;
        assert_eq!(stats.reductions, 4, "{stats:?}");
        assert_eq!(stats.reduced_bytes, 4 * hidden, "{stats:?}");
        assert_eq!(stats.gathers, 0, "{stats:?}");
    }
}

#[test]
fn repeated_graph_hits_the_program_cache() {
    let seed = rand::random::<u64>();
    let (_, stats) = on_meta(2, None, seed, false, 2, 3);
    assert_eq!(stats.builds, 1, "{stats:?}");
    assert_eq!(stats.hits, 2, "{stats:?}");
}

#[test]
fn mixed_families_and_bad_ratios_are_refused() {
    assert!(MetaDevice::new(vec![], None).is_err());
    let devs: Vec<Arc<dyn Device>> = cpu_devices(2, 2)
        .unwrap()
        .into_iter()
        .map(|d| d as Arc<dyn Device>)
        .collect();
    assert!(MetaDevice::new(devs.clone(), Some(vec![1.0])).is_err());
    assert!(MetaDevice::new(devs, Some(vec![0.0, 0.0])).is_err());
}

#[test]
fn generic_recursive_doubling_reduce_matches_for_any_device_count() {
    let seed = rand::random::<u64>();
    let t = 4;
    let want = single(seed, false, t);
    for n in [2usize, 3, 4] {
        let f32_only = ReduceOptions {
            generic: true,
            bf16_min_bytes: usize::MAX,
        };
        let (got, stats) = on_meta_with(n, None, seed, false, t, 1, Some(f32_only));
        let e = nmse(&got, &want);
        assert!(e <= 1e-6, "seed {seed} n {n}: nmse {e}");
        assert_eq!(
            stats.reduced_bytes,
            stats.reductions * (D * t * 4) as u64,
            "{stats:?}"
        );
        // Everything travels in BF16: half the bytes, BF16-sized error.
        let bf16 = ReduceOptions {
            generic: true,
            bf16_min_bytes: 0,
        };
        let (got, stats) = on_meta_with(n, None, seed, false, t, 1, Some(bf16));
        let e = nmse(&got, &want);
        assert!(e <= 1e-4, "seed {seed} n {n} bf16: nmse {e}");
        assert_eq!(stats.reduced_bytes, stats.reductions * (D * t * 2) as u64);
    }
}
