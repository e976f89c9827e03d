//! The shared dispatch (`ggml_gpu::dispatch`) as both backends drive it, checked without a GPU
//! through a recording [`Runner`]: every node of every conformance case is dispatched with the CUDA
//! backend's BLAS types and with the HIP backend's, and each launch's arguments are checked against
//! the kernel's parameter list parsed from the shared sources; the GEMM calls of wide products are
//! replayed on the host against a direct mul_mat; adjacent products of one activation make one
//! grouped GEMV launch; the decode fusions (gate and up with their gated unit, the rope of k with its
//! cache write) make one launch each, with the arguments they need.

use ggml_core::{
    DType, Error, GluOp, Graph, HeadShare, Layout, Result, RopeMode, RopeParams, TensorId, UnaryOp,
};
use ggml_gpu::dispatch::{
    compute_node, compute_nodes, kernel_names, supports, type_name, BatchedGemmCall, GemmCall,
    GemmTypes, KernelArg, Launch, Runner, TDesc,
};
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};

/// A runner that records what the dispatch asks for; tensor `id` lives at `(id + 1) << 32`,
/// scratch slot `s` at `(1 << 48) + (s << 40)`.
struct Recorder {
    types: GemmTypes,
    launches: RefCell<Vec<Launch>>,
    gemms: RefCell<Vec<GemmCall>>,
    batched: RefCell<Vec<BatchedGemmCall>>,
}

impl Recorder {
    fn new(types: GemmTypes) -> Recorder {
        Recorder {
            types,
            launches: RefCell::default(),
            gemms: RefCell::default(),
            batched: RefCell::default(),
        }
    }
}

fn address(id: TensorId) -> u64 {
    ((id.0 as u64) + 1) << 32
}

impl Runner for Recorder {
    fn device_name(&self) -> String {
        "test:0".into()
    }
    fn family(&self) -> &'static str {
        "test"
    }
    fn desc(&self, graph: &Graph, id: TensorId) -> Result<TDesc> {
        TDesc::new(address(id), graph.layout(id))
    }
    fn scratch(&self, slot: usize, _bytes: usize) -> Result<u64> {
        Ok((1 << 48) + ((slot as u64) << 40))
    }
    fn launch(&self, launch: &Launch) -> Result<()> {
        self.launches.borrow_mut().push(launch.clone());
        Ok(())
    }
    fn gemm_types(&self) -> GemmTypes {
        self.types
    }
    fn gemm(&self, call: &GemmCall) -> Result<()> {
        self.gemms.borrow_mut().push(*call);
        Ok(())
    }
    /// Like the CUDA backend with mixed-precision BLAS and tensor cores; the HIP backend has neither.
    fn has_mma(&self) -> bool {
        self.types == GemmTypes::Mixed
    }
    fn has_gemm_batched(&self) -> bool {
        self.types == GemmTypes::Mixed
    }
    fn gemm_batched(&self, call: &BatchedGemmCall) -> Result<()> {
        self.batched.borrow_mut().push(*call);
        Ok(())
    }
}

/// The parameter kinds of every kernel, parsed from its declaration in the shared sources (the
/// GEMV and dequantizer families from their macros).
fn kernel_signatures() -> HashMap<String, Vec<&'static str>> {
    let src = ggml_gpu::kernels::shared_source();
    let params_of = |decl: &str| -> Vec<&'static str> {
        let at = src.find(decl).unwrap_or_else(|| panic!("no {decl}")) + decl.len();
        src[at..at + src[at..].find(')').expect("closed")]
            .split(',')
            .map(|p| match p.split_whitespace().next() {
                Some("TD") => "tensor",
                Some("int") => "i32",
                Some("float") => "f32",
                Some("u64") => "u64",
                Some("GV") => "gemv",
                Some("GVGroup") => "gemv group",
                other => panic!("{decl}: parameter type {other:?} unknown to KernelArg"),
            })
            .collect()
    };
    kernel_names()
        .into_iter()
        .map(|name| {
            let decl = if name.starts_with("k_gemv_group_") {
                "k_gemv_group_##name(".to_string()
            } else if name.starts_with("k_gemv_glu_") {
                "k_gemv_glu_##name(".to_string()
            } else if name.starts_with("k_gemv_") {
                "k_gemv_##name##_##NC(".to_string()
            } else if name.starts_with("k_dequant_f16_") {
                "k_dequant_f16_##name(".to_string()
            } else if name.starts_with("k_moe_mm_") {
                "k_moe_mm_##name(".to_string()
            } else if name.starts_with("k_moe_mma_") {
                "k_moe_mma_##name(".to_string()
            } else if name.starts_with("k_flash_attn_vec_") {
                "k_flash_attn_vec_##name(".to_string()
            } else {
                // Plain, or after its `__launch_bounds__(..)`.
                let plain = format!("extern \"C\" __global__ void {name}(");
                if src.contains(&plain) {
                    plain
                } else {
                    format!(") {name}(")
                }
            };
            let params = params_of(&decl);
            (name, params)
        })
        .collect()
}

fn kind(a: &KernelArg) -> &'static str {
    match a {
        KernelArg::Tensor(_) => "tensor",
        KernelArg::I32(_) => "i32",
        KernelArg::F32(_) => "f32",
        KernelArg::U64(_) => "u64",
        KernelArg::Gemv(_) => "gemv",
        KernelArg::GemvGroup(_) => "gemv group",
    }
}

/// Checks the launches `r` recorded (for `what`) against their kernels' signatures, records the
/// kernels launched, and forgets the launches.
fn check_launches(
    r: &Recorder,
    signatures: &HashMap<String, Vec<&'static str>>,
    used: &mut BTreeSet<String>,
    what: &str,
) {
    for l in r.launches.borrow_mut().drain(..) {
        let want = signatures
            .get(l.kernel.as_ref())
            .unwrap_or_else(|| panic!("no kernel {}", l.kernel));
        let got: Vec<_> = l.args.iter().map(kind).collect();
        assert_eq!(&got, want, "{what} -> {}", l.kernel);
        assert!(
            l.grid.iter().all(|&n| n >= 1),
            "{} grid {:?}",
            l.kernel,
            l.grid
        );
        assert!(l.threads >= 32 && l.threads % 32 == 0);
        used.insert(l.kernel.into_owned());
    }
}

/// Dispatches every supported compute node of `g` on `r`, checks each launch against its
/// kernel's signature, and records the kernels launched.
fn check_graph(
    g: &Graph,
    r: &Recorder,
    signatures: &HashMap<String, Vec<&'static str>>,
    used: &mut BTreeSet<String>,
) {
    for &node in g.nodes() {
        let t = g.tensor(node);
        let layouts: Vec<_> = t.src.iter().map(|&s| g.layout(s)).collect();
        if t.op.is_view() || t.is_leaf() || !supports(&t.op, &layouts, &t.layout) {
            continue;
        }
        compute_node(r, g, node).unwrap_or_else(|e| panic!("{}: {e}", t.op.name()));
        check_launches(r, signatures, used, t.op.name());
        for c in r.gemms.borrow_mut().drain(..) {
            if r.types == GemmTypes::F32 {
                assert_eq!(
                    (c.a_type, c.b_type),
                    (DType::F32, DType::F32),
                    "{}",
                    t.op.name()
                );
            }
            assert!(c.m >= 1 && c.n >= 1 && c.lda >= 1 && c.ldb >= 1 && c.ldd >= c.m);
        }
        for c in r.batched.borrow_mut().drain(..) {
            assert!(matches!(c.dtype, DType::F16 | DType::F32), "{c:?}");
            let rows = |trans: bool, rows: i32, cols: i32| if trans { cols } else { rows };
            assert!(c.m >= 1 && c.n >= 1 && c.k >= 1 && c.batch >= 1, "{c:?}");
            assert!(c.lda >= rows(c.trans_a, c.m, c.k), "{c:?}");
            assert!(c.ldb >= rows(c.trans_b, c.k, c.n), "{c:?}");
            assert!(c.ldd >= c.m && c.stride_d >= 1, "{c:?}");
        }
    }
}

/// What the suite does not build: a same-type copy of quantized rows, attention over a long KV for
/// one query (split over the keys, then combined) with head sizes 64, 256 and 512, attention of
/// many queries (the tensor-core kernels for heads of 64 and 128, the BLAS path for 256) with a
/// mask and sinks, set_rows from rows that are not contiguous, and the norm of one row.
fn extra_graphs() -> Vec<Graph> {
    let mut copy = Graph::new();
    let a = copy.new_input(DType::Q8_0, &[64, 3]).unwrap();
    let b = copy.new_input(DType::Q8_0, &[64, 3]).unwrap();
    let c = copy.cpy(a, b).unwrap();
    copy.output(c);
    let mut graphs = vec![copy];
    for (d, n_q) in [(64, 1), (256, 1), (512, 1), (128, 64), (64, 64), (256, 64)] {
        let mut g = Graph::new();
        let q = g.new_input(DType::F32, &[d, n_q, 4, 1]).unwrap();
        let k = g.new_input(DType::F16, &[d, 4096, 2, 1]).unwrap();
        let v = g.new_input(DType::F16, &[d, 4096, 2, 1]).unwrap();
        let mask = g.new_input(DType::F16, &[4096, n_q]).unwrap();
        let sinks = g.new_input(DType::F32, &[4]).unwrap();
        let o = g
            .flash_attn_ext(q, k, v, Some(mask), Some(sinks), 0.125, 0.0, 0.0)
            .unwrap();
        g.output(o);
        graphs.push(g);
    }
    let mut set_rows = Graph::new();
    let cache = set_rows.new_input(DType::F16, &[8, 16]).unwrap();
    let x = set_rows.new_input(DType::F32, &[3, 8]).unwrap();
    let ids = set_rows.new_input(DType::I32, &[3]).unwrap();
    let xt = set_rows.transpose(x).unwrap();
    let w = set_rows.set_rows(cache, xt, ids).unwrap();
    set_rows.output(w);
    graphs.push(set_rows);
    // A decode step's norm: one row (k_norm_row1).
    let mut norm = Graph::new();
    let x = norm.new_input(DType::F32, &[512, 1]).unwrap();
    let n = norm.rms_norm(x, 1e-5).unwrap();
    norm.output(n);
    graphs.push(norm);
    // A norm over a transposed view: rows that are not contiguous (k_norm), whatever the cases drew.
    let mut strided = Graph::new();
    let x = strided.new_input(DType::F32, &[3, 64]).unwrap();
    let xt = strided.transpose(x).unwrap();
    let n = strided.norm(xt, 1e-5).unwrap();
    strided.output(n);
    graphs.push(strided);
    // A prompt's product with BF16 weights (k_bf16_from_f32 rounds the activations).
    let mut bf16 = Graph::new();
    let w = bf16.new_input(DType::BF16, &[64, 32]).unwrap();
    let x = bf16.new_input(DType::F32, &[64, 16]).unwrap();
    let y = bf16.mul_mat(w, x).unwrap();
    bf16.output(y);
    graphs.push(bf16);
    graphs
}

/// Graphs of the decode fusions, named: gate and up products with weights of every GEMV type and
/// their gated unit; the rope of k and its write into F16 and F32 caches through the permute view;
/// a MoE layer's router and expert mix; a chain of element-wise nodes; a norm with its scale; a
/// delta-net rule with the copy of its state.
fn fused_graphs() -> Vec<(String, Graph)> {
    let mut graphs = Vec::new();
    for t in DType::WEIGHTS {
        let mut g = Graph::new();
        let x = g.new_input(DType::F32, &[512, 1]).unwrap();
        let wg = g.new_input(t, &[512, 96]).unwrap();
        let wu = g.new_input(t, &[512, 96]).unwrap();
        let (gate, up) = (g.mul_mat(wg, x).unwrap(), g.mul_mat(wu, x).unwrap());
        g.expand(gate);
        g.expand(up);
        let h = g.glu(GluOp::Swiglu, gate, up).unwrap();
        g.output(h);
        graphs.push((format!("gate, up and swiglu of {t}"), g));
    }
    for cache_type in [DType::F16, DType::F32] {
        let (d, heads, tokens) = (128, 8, 1);
        let mut g = Graph::new();
        let x = g.new_input(DType::F32, &[d, heads, tokens]).unwrap();
        let pos = g.new_input(DType::I32, &[tokens]).unwrap();
        let ff = g.new_input(DType::F32, &[d / 2]).unwrap();
        let cache = g.new_input(cache_type, &[d, 256, heads]).unwrap();
        let ids = g.new_input(DType::I32, &[tokens]).unwrap();
        let p = RopeParams::simple(RopeMode::Neox, d, 500000.0);
        let k = g.rope(x, pos, Some(ff), p).unwrap();
        let kp = g.permute(k, [0, 2, 1, 3]).unwrap();
        let w = g.set_rows(cache, kp, ids).unwrap();
        g.output(w);
        graphs.push((format!("rope of k into a {cache_type} cache"), g));
    }
    let (d, n_exp, k) = (256, 16, 4);
    let mut g = Graph::new();
    let x = g.new_input(DType::F32, &[d, 1, 1]).unwrap();
    let scores = g.new_input(DType::F32, &[n_exp, 1]).unwrap();
    let probs = g.soft_max(scores, None, None, 1.0, 0.0).unwrap();
    let ids = g.top_k(probs, k).unwrap();
    let p3 = g.reshape(probs, &[1, n_exp, 1]).unwrap();
    let w = g.get_rows(p3, ids).unwrap();
    let w2 = g.reshape(w, &[k, 1]).unwrap();
    let sum = g.sum_rows(w2).unwrap();
    let w2 = g.div(w2, sum).unwrap();
    let weights = g.reshape(w2, &[1, k, 1]).unwrap();
    g.expand(weights);
    let wg = g.new_input(DType::Q4_0, &[d, 64, n_exp]).unwrap();
    let wu = g.new_input(DType::Q4_0, &[d, 64, n_exp]).unwrap();
    let (gate, up) = (
        g.mul_mat_id(wg, x, ids).unwrap(),
        g.mul_mat_id(wu, x, ids).unwrap(),
    );
    g.expand(gate);
    g.expand(up);
    let h = g.glu(GluOp::Swiglu, gate, up).unwrap();
    let out = g.mul(h, weights).unwrap();
    let nb = *g.layout(out);
    let mut mix = g.view(out, &[64, 1], &[nb.nb[2]], 0).unwrap();
    for e in 1..k {
        let v = g.view(out, &[64, 1], &[nb.nb[2]], e * nb.nb[1]).unwrap();
        mix = g.add(mix, v).unwrap();
    }
    g.output(mix);
    graphs.push((
        "a MoE router, expert gate/up/swiglu and expert mix".into(),
        g,
    ));
    let mut g = Graph::new();
    let alpha = g.new_input(DType::F32, &[48, 1]).unwrap();
    let bias = g.new_input(DType::F32, &[48]).unwrap();
    let a = g.new_input(DType::F32, &[48]).unwrap();
    let biased = g.add(alpha, bias).unwrap();
    let sp = g.unary(biased, UnaryOp::Softplus).unwrap();
    let decay = g.mul(sp, a).unwrap();
    g.output(decay);
    let x = g.new_input(DType::F32, &[128, 16]).unwrap();
    let n = g.rms_norm(x, 1e-6).unwrap();
    let l2 = g.scale(n, 0.088).unwrap();
    g.output(l2);
    graphs.push((
        "a chain of element-wise nodes, a norm and its scale".into(),
        g,
    ));
    let (dk, dv, h) = (128, 128, 2);
    let mut g = Graph::new();
    let q = g.new_input(DType::F32, &[dk, h, 1]).unwrap();
    let k = g.new_input(DType::F32, &[dk, h, 1]).unwrap();
    let v = g.new_input(DType::F32, &[dv, h, 1]).unwrap();
    let gb = g.new_input(DType::F32, &[h, 1, 2]).unwrap();
    let s0 = g.new_input(DType::F32, &[dk, dv, h]).unwrap();
    let rule = g
        .gated_delta_net([q, k, v, gb, s0], HeadShare::Grouped)
        .unwrap();
    let s = g
        .view(rule, &[dk, dv, h], &[dk * 4, dk * dv * 4], dv * h * 4)
        .unwrap();
    let copy = g.cpy(s, s0).unwrap();
    g.output(rule);
    g.output(copy);
    graphs.push(("a delta-net rule with the copy of its state".into(), g));
    graphs
}

#[test]
fn every_conformance_node_matches_its_kernel_signature() {
    let signatures = kernel_signatures();
    let mut used = BTreeSet::new();
    let built: Vec<_> = ggml_tp_tests::cases::all_cases(7)
        .iter()
        .map(|case| ggml_tp_tests::runner::build(case).expect("case builds"))
        .collect();
    let extra = extra_graphs();
    let fused = fused_graphs();
    for types in [GemmTypes::Mixed, GemmTypes::F32] {
        let r = Recorder::new(types);
        for g in built.iter().map(|b| &b.graph).chain(&extra) {
            check_graph(g, &r, &signatures, &mut used);
        }
        for (what, g) in &fused {
            compute_nodes(&r, g, g.nodes()).unwrap_or_else(|e| panic!("{what}: {e}"));
            check_launches(&r, &signatures, &mut used, what);
        }
    }
    for t in DType::WEIGHTS {
        let glu = format!("k_gemv_glu_{}", type_name(t).unwrap());
        assert!(used.contains(&glu), "{glu} never launched");
    }
    // k_hold is the profiler's, not the dispatch's.
    let unused: Vec<_> = ggml_gpu::dispatch::NAMED_KERNELS
        .iter()
        .filter(|k| !used.contains(**k) && **k != "k_hold")
        .collect();
    assert!(unused.is_empty(), "kernels never launched: {unused:?}");
    assert!(used.iter().any(|k| k.starts_with("k_gemv_")));
    assert!(used.iter().any(|k| k.starts_with("k_dequant_f16_")));
}

#[test]
fn unsupported_ops_are_errors_naming_the_device() {
    let mut g = Graph::new();
    let a = g.new_input(DType::Q8K, &[256, 2]).unwrap();
    let b = g.new_input(DType::F32, &[256, 3]).unwrap();
    let c = g.mul_mat(a, b).unwrap();
    let e = compute_node(&Recorder::new(GemmTypes::F32), &g, c).unwrap_err();
    assert!(matches!(e, Error::UnsupportedOp { ref backend, .. } if backend == "test:0"));
}

/// Replays `calls` (column-major `d = a^T b`, F32, addresses as recorded) on host arrays: `a` at
/// the address of tensor `ia`, `b` at `ib`'s, `d` at `id`'s.
fn replay(
    calls: &[GemmCall],
    (ia, a): (TensorId, &[f64]),
    (ib, b): (TensorId, &[f64]),
    id: TensorId,
    d_len: usize,
) -> Vec<f64> {
    let mut d = vec![f64::NAN; d_len];
    let at = |ptr: u64, base: TensorId| ((ptr - address(base)) / 4) as usize;
    for c in calls {
        let (a0, b0, d0) = (at(c.a, ia), at(c.b, ib), at(c.d, id));
        for col in 0..c.n as usize {
            for row in 0..c.m as usize {
                let dot: f64 = (0..c.k as usize)
                    .map(|kk| a[a0 + row * c.lda as usize + kk] * b[b0 + col * c.ldb as usize + kk])
                    .sum();
                d[d0 + col * c.ldd as usize + row] = dot;
            }
        }
    }
    d
}

/// ggml's mul_mat, directly.
fn direct(la: &Layout, lb: &Layout, a: &[f64], b: &[f64]) -> Vec<f64> {
    let [k, m, a2, a3] = la.ne;
    let [_, n, b2, b3] = lb.ne;
    let (r2, r3) = (b2 / a2, b3 / a3);
    let mut d = Vec::with_capacity(m * n * b2 * b3);
    for i3 in 0..b3 {
        for i2 in 0..b2 {
            for j in 0..n {
                for i in 0..m {
                    let ab = ((i3 / r3) * a2 + i2 / r2) * m * k + i * k;
                    let bb = (i3 * b2 + i2) * n * k + j * k;
                    d.push((0..k).map(|kk| a[ab + kk] * b[bb + kk]).sum());
                }
            }
        }
    }
    d
}

#[test]
fn gemm_calls_compute_mul_mat_with_broadcasts() {
    let shapes = [
        ([5, 3, 1, 1], [5, 9, 1, 1]),
        ([5, 3, 1, 1], [5, 10, 3, 2]),
        ([7, 2, 2, 1], [7, 12, 4, 1]),
        ([4, 3, 2, 3], [4, 9, 2, 6]),
    ];
    for (na, nb) in shapes {
        let mut g = Graph::new();
        let a = g.new_input(DType::F32, &na).unwrap();
        let b = g.new_input(DType::F32, &nb).unwrap();
        let c = g.mul_mat(a, b).unwrap();
        let r = Recorder::new(GemmTypes::F32);
        compute_node(&r, &g, c).unwrap();
        assert!(
            r.launches.borrow().is_empty(),
            "contiguous F32 needs no conversion"
        );
        let (la, lb) = (*g.layout(a), *g.layout(b));
        let fill = |len: usize, salt: usize| -> Vec<f64> {
            (0..len)
                .map(|i| ((i * 7 + salt * 13) % 17) as f64 - 8.0)
                .collect()
        };
        let (av, bv) = (fill(la.nelements(), 1), fill(lb.nelements(), 2));
        let want = direct(&la, &lb, &av, &bv);
        let got = replay(&r.gemms.borrow(), (a, &av), (b, &bv), c, want.len());
        assert_eq!(got, want, "{na:?} x {nb:?}");
    }
}

#[test]
fn adjacent_products_of_one_activation_make_one_grouped_launch() {
    let signatures = kernel_signatures();
    let mut g = Graph::new();
    let x = g.new_input(DType::F32, &[512, 1]).unwrap();
    let rows = [96, 32, 32];
    let products: Vec<TensorId> = rows
        .iter()
        .map(|&m| {
            let w = g.new_input(DType::Q8_0, &[512, m]).unwrap();
            g.mul_mat(w, x).unwrap()
        })
        .collect();
    for &p in &products {
        g.output(p);
    }
    let r = Recorder::new(GemmTypes::Mixed);
    compute_nodes(&r, &g, g.nodes()).unwrap();
    let launches = r.launches.borrow();
    let names: Vec<&str> = launches.iter().map(|l| l.kernel.as_ref()).collect();
    assert_eq!(
        names,
        ["k_quantize_q8", "k_gemv_group_q8_0"],
        "activations once, one GEMV"
    );
    let group = &launches[1];
    let kinds: Vec<_> = group.args.iter().map(kind).collect();
    assert_eq!(&kinds, &signatures["k_gemv_group_q8_0"]);
    let KernelArg::GemvGroup(args) = &group.args[0] else {
        panic!("grouped arguments");
    };
    assert_eq!(args.n, 3);
    assert_eq!(
        args.first[3] as u32, group.grid[0],
        "the grid covers every product"
    );
    for (i, (&p, &m)) in products.iter().zip(&rows).enumerate() {
        assert_eq!(args.g[i].d, address(p));
        assert_eq!(args.g[i].m, m as i64);
        assert_eq!(args.g[i].x, args.g[0].x, "one quantized activation");
        assert!(
            args.first[i] < args.first[i + 1],
            "product {i} has row blocks"
        );
    }
}

/// The nodes of `g` of the op named `op`, in node order.
fn nodes_of(g: &Graph, op: &str) -> Vec<TensorId> {
    g.nodes()
        .iter()
        .copied()
        .filter(|&n| g.tensor(n).op.name() == op)
        .collect()
}

#[test]
fn decode_fusions_make_one_launch_each() {
    let signatures = kernel_signatures();
    let mut used = BTreeSet::new();
    let fused = fused_graphs();
    let r = Recorder::new(GemmTypes::Mixed);
    let (what, g) = fused
        .iter()
        .find(|(what, _)| what.ends_with(" of q8_0"))
        .expect("a Q8_0 gated unit");
    compute_nodes(&r, g, g.nodes()).unwrap();
    let names: Vec<String> = r
        .launches
        .borrow()
        .iter()
        .map(|l| l.kernel.to_string())
        .collect();
    assert_eq!(names, ["k_quantize_q8", "k_gemv_glu_q8_0"], "{what}");
    {
        let launches = r.launches.borrow();
        let glu = &launches[1];
        let [KernelArg::Gemv(gate), KernelArg::Gemv(up), KernelArg::U64(out), KernelArg::I32(op)] =
            glu.args[..]
        else {
            panic!("{what}: arguments {:?}", glu.args);
        };
        let (products, h) = (nodes_of(g, "mul_mat"), nodes_of(g, "swiglu"));
        assert_eq!((gate.d, up.d), (address(products[0]), address(products[1])));
        assert_eq!(out, address(h[0]));
        assert_eq!(op, 0, "swiglu");
        assert_eq!((gate.m, up.m, gate.k), (96, 96, 512));
        assert_eq!(gate.x, up.x, "one quantized activation");
        let rows_per_block = 4 / gate.wpr as u32;
        assert_eq!(
            glu.grid[0],
            96u32.div_ceil(rows_per_block),
            "one row group per row"
        );
    }
    check_launches(&r, &signatures, &mut used, what);
    for (what, g) in fused.iter().filter(|(what, _)| what.starts_with("rope")) {
        compute_nodes(&r, g, g.nodes()).unwrap();
        {
            let launches = r.launches.borrow();
            let names: Vec<&str> = launches.iter().map(|l| l.kernel.as_ref()).collect();
            assert_eq!(names, ["k_rope_set_rows"], "{what}");
            let args = &launches[0].args;
            let (rope, write) = (nodes_of(g, "rope")[0], nodes_of(g, "set_rows")[0]);
            let (KernelArg::Tensor(d), KernelArg::Tensor(cache), KernelArg::I32(swap12)) =
                (&args[3], &args[4], &args[6])
            else {
                panic!("{what}: arguments {args:?}");
            };
            assert_eq!(d.ptr, address(rope), "{what}: the rope's result");
            assert_eq!(cache.ptr, address(write), "{what}: the cache");
            assert_eq!(*swap12, 1, "{what}: through the permute view");
        }
        check_launches(&r, &signatures, &mut used, what);
    }
}
