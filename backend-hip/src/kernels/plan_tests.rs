//! Tests of the node planner: every node of every conformance case is planned and its arguments are
//! checked against the kernel's parameter list parsed from the shared sources; the SGEMM batching
//! is checked against a direct mul_mat on the host.

use super::*;
use crate::kernels::sources::shared_program;
use ggml_core::Op;
use std::collections::{BTreeSet, HashMap};

/// The parameter kinds of every kernel, parsed from its `extern "C" __global__` declaration.
fn kernel_signatures() -> HashMap<String, Vec<&'static str>> {
    let src = shared_program();
    let mut out = HashMap::new();
    for name in crate::kernels::sources::entry_points(&src) {
        let decl = format!("extern \"C\" __global__ void {name}(");
        let at = src.find(&decl).expect("declared") + decl.len();
        let params = &src[at..at + src[at..].find(')').expect("closed")];
        let kinds = params
            .split(',')
            .map(|p| match p.split_whitespace().next() {
                Some("TD") => "tensor",
                Some("int") => "i32",
                Some("float") => "f32",
                other => panic!("{name}: parameter type {other:?} unknown to KernelArg"),
            })
            .collect();
        out.insert(name.to_string(), kinds);
    }
    out
}

fn kind(a: &KernelArg) -> &'static str {
    match a {
        KernelArg::Tensor(_) => "tensor",
        KernelArg::I32(_) => "i32",
        KernelArg::F32(_) => "f32",
    }
}

/// A descriptor at a made-up address (the tensor's id in the upper bits).
fn fake_desc(graph: &Graph, id: TensorId) -> Result<TDesc> {
    TDesc::new(((id.0 as u64) + 1) << 20, graph.layout(id))
}

/// Plans every supported compute node of `graph`, checks each launch against its kernel's
/// signature, and records the ops planned and kernels launched.
fn check_graph(
    g: &Graph,
    signatures: &HashMap<String, Vec<&'static str>>,
    planned: &mut BTreeSet<&'static str>,
    used: &mut BTreeSet<&'static str>,
) {
    for &node in g.nodes() {
        let t = g.tensor(node);
        let layouts: Vec<_> = t.src.iter().map(|&s| g.layout(s)).collect();
        if t.op.is_view() || t.is_leaf() || !table::supports(&t.op, &layouts, &t.layout) {
            continue;
        }
        let work = plan_node(g, node, "hip:test", &|id| fake_desc(g, id)).unwrap();
        planned.insert(t.op.name());
        let Work::Launch(l) = work else {
            assert!(matches!(t.op, Op::MulMat), "{}", t.op.name());
            continue;
        };
        let want = signatures
            .get(l.kernel)
            .unwrap_or_else(|| panic!("no kernel {}", l.kernel));
        let got: Vec<_> = l.args.iter().map(kind).collect();
        assert_eq!(&got, want, "{} -> {}", t.op.name(), l.kernel);
        assert!(l.blocks >= 1 && l.threads >= 32 && l.threads % 32 == 0);
        used.insert(l.kernel);
    }
}

#[test]
fn every_conformance_node_matches_its_kernel_signature() {
    let signatures = kernel_signatures();
    let (mut planned, mut used) = (BTreeSet::new(), BTreeSet::new());
    for case in ggml_tp_tests::cases::all_cases(7) {
        let built = ggml_tp_tests::runner::build(&case).expect("case builds");
        check_graph(&built.graph, &signatures, &mut planned, &mut used);
    }
    // A same-type copy of quantized rows, which the suite does not build.
    let mut g = Graph::new();
    let a = g.new_input(DType::Q8_0, &[64, 3]).unwrap();
    let b = g.new_input(DType::Q8_0, &[64, 3]).unwrap();
    let c = g.cpy(a, b).unwrap();
    g.output(c);
    check_graph(&g, &signatures, &mut planned, &mut used);
    let unused: Vec<_> = signatures
        .keys()
        .filter(|k| !used.contains(k.as_str()))
        .collect();
    assert!(unused.is_empty(), "kernels never planned: {unused:?}");
    assert!(planned.len() >= 20, "ops planned: {planned:?}");
}

#[test]
fn unsupported_ops_are_errors_naming_the_backend() {
    let mut g = Graph::new();
    let a = g.new_input(DType::Q8K, &[256, 2]).unwrap();
    let b = g.new_input(DType::F32, &[256, 3]).unwrap();
    let c = g.mul_mat(a, b).unwrap();
    let e = plan_node(&g, c, "hip:0", &|id| fake_desc(&g, id)).unwrap_err();
    assert!(matches!(e, Error::UnsupportedOp { ref backend, .. } if backend == "hip:0"));
}

#[test]
fn conversions_to_f32_cover_the_tensor() {
    let l = Layout::contiguous(DType::Q4_0, [64, 3, 2, 1]);
    let src = TDesc::new(4096, &l).unwrap();
    let launch = to_f32(src, l.ne, 1 << 20).unwrap();
    assert_eq!(launch.kernel, "k_cpy");
    assert_eq!(launch.blocks, 2, "384 elements in 256-thread blocks");
    let KernelArg::Tensor(d) = launch.args[1] else {
        panic!("destination")
    };
    assert_eq!((d.ptr, d.dtype, d.nb[1]), (1 << 20, 0, 256));
}

/// `a [k, m, a2, a3] x b [k, n, b2, b3]` through the batches, each a column-major
/// `d = op_T(a) b` with leading dimensions k, k, m as the backends call BLAS.
fn through_batches(la: &Layout, lb: &Layout, a: &[f64], b: &[f64]) -> Vec<f64> {
    let [k, m, ..] = la.ne;
    let [_, n, b2, b3] = lb.ne;
    let mut d = vec![f64::NAN; m * n * b2 * b3];
    for g in gemm_batches(la, lb).unwrap() {
        for col in 0..g.cols {
            for row in 0..m {
                let dot: f64 = (0..k)
                    .map(|kk| a[g.a_offset + row * k + kk] * b[g.b_offset + col * k + kk])
                    .sum();
                d[g.d_offset + col * m + row] = dot;
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
fn gemm_batches_compute_mul_mat_with_broadcasts() {
    let shapes = [
        ([5, 3, 1, 1], [5, 4, 1, 1]),
        ([5, 3, 1, 1], [5, 4, 3, 2]),
        ([7, 2, 2, 1], [7, 3, 4, 1]),
        ([4, 3, 2, 3], [4, 2, 2, 6]),
        ([0, 3, 1, 1], [0, 2, 1, 1]),
    ];
    for (na, nb) in shapes {
        let la = Layout::contiguous(DType::F32, na);
        let lb = Layout::contiguous(DType::F32, nb);
        let fill = |len: usize, salt: usize| -> Vec<f64> {
            (0..len)
                .map(|i| ((i * 7 + salt * 13) % 17) as f64 - 8.0)
                .collect()
        };
        let a = fill(la.nelements(), 1);
        let b = fill(lb.nelements(), 2);
        assert_eq!(
            through_batches(&la, &lb, &a, &b),
            direct(&la, &lb, &a, &b),
            "{na:?} x {nb:?}"
        );
    }
    let la = Layout::contiguous(DType::F32, [4, 3, 2, 1]);
    let lb = Layout::contiguous(DType::F32, [4, 3, 3, 1]);
    assert!(gemm_batches(&la, &lb).is_err(), "3 batches over 2");
}

#[test]
fn corr_dims_match_ggml_shape() {
    let mut p = RopeParams::simple(RopeMode::Neox, 128, 10000.0);
    p.n_ctx_orig = 4096;
    let [a, b] = yarn_corr_dims(&p);
    assert!(a >= 0.0 && a < b && b <= 127.0, "{a} {b}");
}
