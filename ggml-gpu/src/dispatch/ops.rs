//! Dispatch of one graph node to its kernel: operand descriptors, the op's parameters as kernel
//! arguments, and the launch shape; the fast `_rows` kernels where [`super::rows`] takes the
//! operands, the strided generic kernels otherwise; matrix products go to [`super::gemv`],
//! [`super::gemm`] and [`super::moe`].

use super::rows::{all_rows, broadcasts_rows, chunked, norm_launch, vec_width};
use super::{args, attention, delta_net, gemm, moe, supports, KernelArg, Launch, Runner, TDesc};
use ggml_core::{
    DType, Error, GluOp, Graph, Layout, Op, Result, RopeMode, RopeParams, SortOrder, TensorId,
    UnaryOp,
};

/// Rows of at most this many elements are summed by one thread each (`k_sum_rows_short`), not a
/// block of 256.
const SHORT_ROW: usize = 32;

fn unary_code(u: UnaryOp) -> i32 {
    match u {
        UnaryOp::Silu => 0,
        UnaryOp::Gelu => 1,
        UnaryOp::GeluErf => 2,
        UnaryOp::Tanh => 3,
        UnaryOp::Exp => 4,
        UnaryOp::Sigmoid => 5,
        UnaryOp::Neg => 6,
        UnaryOp::Relu => 7,
        UnaryOp::Sqr => 8,
        UnaryOp::Sqrt => 9,
        UnaryOp::Softplus => 12,
    }
}

/// The `G_*` code of a gated unit in elementwise.cu and its parameters (alpha, limit).
pub(super) fn glu_code(op: GluOp) -> (i32, f32, f32) {
    match op {
        GluOp::Swiglu => (0, 0.0, 0.0),
        GluOp::Geglu => (1, 0.0, 0.0),
        GluOp::GegluErf => (2, 0.0, 0.0),
        GluOp::SwigluOai { alpha, limit } => (3, alpha, limit),
    }
}

fn yarn_corr_dim(n_dims: usize, n_ctx_orig: usize, n_rot: f32, base: f32) -> f32 {
    n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
        / (2.0 * base.ln())
}

/// ggml's `ggml_rope_yarn_corr_dims`.
fn yarn_corr_dims(p: &RopeParams) -> [f32; 2] {
    let start = yarn_corr_dim(p.n_dims, p.n_ctx_orig, p.beta_fast, p.freq_base).floor();
    let end = yarn_corr_dim(p.n_dims, p.n_ctx_orig, p.beta_slow, p.freq_base).ceil();
    [start.max(0.0), end.min(p.n_dims as f32 - 1.0)]
}

/// The rope kernels' arguments after the tensors: n_dims, neox, has_ff, the frequency parameters
/// and the YaRN correction dims.
pub(super) fn rope_scalars(p: &RopeParams, has_ff: bool) -> Vec<KernelArg> {
    let [corr0, corr1] = yarn_corr_dims(p);
    let n_dims = p.n_dims as i32;
    let neox = i32::from(p.mode == RopeMode::Neox);
    let (fb, fs, ef, af) = (p.freq_base, p.freq_scale, p.ext_factor, p.attn_factor);
    args![
        n_dims,
        neox,
        i32::from(has_ff),
        fb,
        fs,
        ef,
        af,
        corr0,
        corr1
    ]
}

/// Whether `k_rope_rows` takes a rope from `src` to `dst`: float rows of one shape, rotating an
/// even number of leading elements.
pub(super) fn rope_rows_fit(p: &RopeParams, src: &Layout, dst: &Layout) -> bool {
    all_rows(&[src, dst]) && src.ne == dst.ne && p.n_dims.is_multiple_of(2) && p.n_dims <= dst.ne[0]
}

/// The chunks of `k_rope_rows` over `dst`: one per rotated pair and per element past n_dims.
pub(super) fn rope_rows_chunks(p: &RopeParams, dst: &Layout) -> usize {
    dst.nelements() - dst.nrows() * (p.n_dims / 2)
}

/// The operands of `k_cpy_rows` for a float copy from `s` (layout `sl`) to `d` (layout `dl`), if it
/// takes them: rows of one shape, or both contiguous (then seen as one row each). Same-type copies
/// of 16-bit floats stay byte copies (the generic kernel keeps NaN payloads).
fn rows_copy(sl: &Layout, s: TDesc, dl: &Layout, d: TDesc) -> Option<(TDesc, TDesc)> {
    if !all_rows(&[sl, dl]) || (sl.dtype == dl.dtype && sl.dtype != DType::F32) {
        return None;
    }
    if sl.ne == dl.ne {
        return Some((s, d));
    }
    if !(sl.is_contiguous() && dl.is_contiguous()) {
        return None;
    }
    let n = dl.nelements();
    let flat =
        |x: TDesc, t: DType| -> Option<TDesc> { TDesc::contiguous(x.ptr, t, [n, 1, 1, 1]).ok() };
    Some((flat(s, sl.dtype)?, flat(d, dl.dtype)?))
}

/// The function an element-wise node applies: `unary_fn`'s code and parameters (unary ops, scale,
/// clamp), or `binary_fn`'s code (elementwise.cu).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Elementwise {
    Unary(i32, f32, f32),
    Binary(i32),
}

/// The element-wise function of `op`, if it is one.
pub(super) fn elementwise_fn(op: &Op) -> Option<Elementwise> {
    Some(match op {
        Op::Unary(u) => Elementwise::Unary(unary_code(*u), 0.0, 0.0),
        Op::Scale { scale, bias } => Elementwise::Unary(10, *scale, *bias),
        Op::Clamp { min, max } => Elementwise::Unary(11, *min, *max),
        Op::Add => Elementwise::Binary(0),
        Op::Sub => Elementwise::Binary(1),
        Op::Mul => Elementwise::Binary(2),
        Op::Div => Elementwise::Binary(3),
        _ => return None,
    })
}

/// Computes `node` of `graph` through `r` (layout ops and leaves are skipped by the caller).
pub fn compute_node(r: &dyn Runner, graph: &Graph, node: TensorId) -> Result<()> {
    let t = graph.tensor(node);
    let layouts: Vec<_> = t.src.iter().map(|&s| graph.layout(s)).collect();
    if !supports(&t.op, &layouts, &t.layout) {
        return Err(Error::UnsupportedOp {
            op: format!(
                "{} ({:?})",
                t.op.name(),
                layouts.iter().map(|l| l.dtype).collect::<Vec<_>>()
            ),
            backend: r.device_name(),
        });
    }
    let src = |i: usize| -> Result<TDesc> {
        match t.src.get(i) {
            Some(&s) => r.desc(graph, s),
            None => Ok(TDesc::absent()),
        }
    };
    let d = r.desc(graph, node)?;
    let n = t.nelements();
    let nrows = t.layout.nrows();
    let dl = &t.layout;
    let ne0 = dl.ne[0];
    let same_shape = |i: usize| layouts[i].ne == dl.ne;
    let launch = match &t.op {
        Op::None | Op::View { .. } | Op::Reshape | Op::Permute { .. } | Op::Transpose => {
            return Ok(())
        }
        Op::Unary(_) | Op::Scale { .. } | Op::Clamp { .. } => {
            let Some(Elementwise::Unary(op, p0, p1)) = elementwise_fn(&t.op) else {
                unreachable!("matched above")
            };
            let a = src(0)?;
            if all_rows(&[layouts[0], dl]) && same_shape(0) {
                let v = vec_width(ne0, &[a, d]);
                chunked("k_unary_rows", n, v, args![a, d, op, p0, p1])
            } else {
                Launch::elementwise("k_unary", n, args![a, d, op, p0, p1])
            }
        }
        Op::Add | Op::Sub | Op::Mul | Op::Div => {
            let Some(Elementwise::Binary(op)) = elementwise_fn(&t.op) else {
                unreachable!("matched above")
            };
            let (a, b) = (src(0)?, src(1)?);
            if all_rows(&[layouts[0], layouts[1], dl])
                && same_shape(0)
                && broadcasts_rows(layouts[1], dl)
            {
                let v = vec_width(ne0, &[a, b, d]);
                chunked("k_binary_rows", n, v, args![a, b, d, op])
            } else {
                Launch::elementwise("k_binary", n, args![a, b, d, op])
            }
        }
        Op::Glu { op, swapped } => {
            let fused = i32::from(t.src.len() == 1);
            let swapped = i32::from(*swapped);
            let (code, alpha, limit) = glu_code(*op);
            let (a, b) = (src(0)?, src(1)?);
            let fast = if fused == 1 {
                let l = layouts[0];
                all_rows(&[l, dl]) && l.ne[0] == 2 * ne0 && l.ne[1..] == dl.ne[1..]
            } else {
                all_rows(&[layouts[0], layouts[1], dl]) && same_shape(0) && same_shape(1)
            };
            let ar = args![a, b, d, code, fused, swapped, alpha, limit];
            if fast {
                let v = vec_width(ne0, &[a, b, d]);
                chunked("k_glu_rows", n, v, ar)
            } else {
                Launch::elementwise("k_glu", n, ar)
            }
        }
        Op::AddId => Launch::elementwise("k_add_id", n, args![src(0)?, src(1)?, src(2)?, d]),
        Op::RmsNorm { eps } | Op::Norm { eps } => {
            let rms = i32::from(matches!(t.op, Op::RmsNorm { .. }));
            let a = src(0)?;
            if all_rows(&[layouts[0], dl])
                && layouts[0].dtype == DType::F32
                && dl.dtype == DType::F32
            {
                let v = vec_width(ne0, &[a, d]);
                let x = TDesc::absent();
                norm_launch(
                    ne0,
                    nrows,
                    v,
                    None,
                    args![a, x, x, d, x, x, *eps, rms, 0i32, 1.0f32, 0.0f32],
                )
            } else {
                Launch::rows("k_norm", nrows, 256, 0, args![a, d, *eps, rms])
            }
        }
        Op::SumRows if graph.layout(t.src[0]).ne[0] <= SHORT_ROW => {
            Launch::elementwise("k_sum_rows_short", nrows, args![src(0)?, d])
        }
        Op::SumRows => Launch::rows("k_sum_rows", nrows, 256, 0, args![src(0)?, d]),
        Op::SoftMax { scale, max_bias } => {
            let has_mask = i32::from(t.src.len() > 1);
            let has_sinks = i32::from(t.src.len() > 2);
            let a = args![
                src(0)?,
                src(1)?,
                src(2)?,
                d,
                *scale,
                *max_bias,
                has_mask,
                has_sinks
            ];
            Launch::rows("k_soft_max", nrows, 256, 0, a)
        }
        Op::Rope(p) => {
            let mut a = args![src(0)?, src(1)?, src(2)?, d];
            a.extend(rope_scalars(p, t.src.len() > 2));
            if rope_rows_fit(p, layouts[0], dl) {
                Launch::elementwise("k_rope_rows", rope_rows_chunks(p, dl), a)
            } else {
                Launch::elementwise("k_rope", n, a)
            }
        }
        Op::Cpy | Op::Cont => {
            let s = src(0)?;
            let st = graph.layout(t.src[0]).dtype;
            if st == t.layout.dtype && st.is_quantized() {
                let ts = st.type_size() as i32;
                Launch::elementwise("k_cpy_blocks", n / st.block_size(), args![s, d, ts])
            } else if t.layout.dtype.is_quantized() {
                Launch::elementwise("k_cpy_q", n / 32, args![s, d])
            } else if let Some((s, d)) = rows_copy(graph.layout(t.src[0]), s, dl, d) {
                let v = vec_width(s.ne[0] as usize, &[s, d]);
                chunked("k_cpy_rows", n, v, args![s, d])
            } else {
                Launch::elementwise("k_cpy", n, args![s, d])
            }
        }
        Op::GetRows => {
            let (a, ids) = (src(0)?, src(1)?);
            if all_rows(&[layouts[0], dl]) && dl.dtype == DType::F32 {
                let v = vec_width(ne0, &[a, d]);
                chunked("k_get_rows_rows", n, v, args![a, ids, d])
            } else {
                Launch::elementwise("k_get_rows", n, args![a, ids, d])
            }
        }
        Op::SetRows => {
            let sn = graph.layout(t.src[1]).nelements();
            let (s, ids) = (src(1)?, src(2)?);
            let a = args![d, s, ids];
            if all_rows(&[layouts[1], dl]) {
                let v = vec_width(ne0, &[s, d]);
                chunked("k_set_rows_rows", sn, v, a)
            } else if t.layout.dtype.is_quantized() {
                Launch::elementwise("k_set_rows_q", sn / 32, a)
            } else {
                Launch::elementwise("k_set_rows", sn, a)
            }
        }
        Op::Concat { dim } => {
            let dim = *dim as i32;
            Launch::elementwise("k_concat", n, args![src(0)?, src(1)?, d, dim])
        }
        Op::Argsort { .. } | Op::TopK { .. } => {
            let desc_order = i32::from(!matches!(
                t.op,
                Op::Argsort {
                    order: SortOrder::Asc
                }
            ));
            let npad = graph.layout(t.src[0]).ne[0].next_power_of_two().max(1) as i32;
            let shared = npad as u32 * 8;
            Launch::rows(
                "k_argsort",
                nrows,
                256,
                shared,
                args![src(0)?, d, desc_order, npad],
            )
        }
        Op::FlashAttnExt {
            scale,
            max_bias,
            softcap,
        } => {
            let params = [*scale, *max_bias, *softcap];
            return attention::flash_attn_ext(r, graph, node, params, None).map(|_| ());
        }
        Op::GatedDeltaNet { heads } => return delta_net::gated_delta_net(r, graph, node, *heads),
        Op::MulMat => {
            let (la, lb) = (graph.layout(t.src[0]), graph.layout(t.src[1]));
            return gemm::mul_mat(r, (src(0)?, la), (src(1)?, lb), d);
        }
        Op::MulMatId => {
            let l = |i: usize| graph.layout(t.src[i]);
            return moe::mul_mat_id(r, (src(0)?, l(0)), (src(1)?, l(1)), (src(2)?, l(2)), d);
        }
    };
    r.launch(&launch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corr_dims_match_ggml_shape() {
        let mut p = RopeParams::simple(RopeMode::Neox, 128, 10000.0);
        p.n_ctx_orig = 4096;
        let [a, b] = yarn_corr_dims(&p);
        assert!(a >= 0.0 && a < b && b <= 127.0, "{a} {b}");
    }
}
