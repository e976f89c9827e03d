//! Planning one graph node for the shared kernels, independent of the vendor: which kernel, what
//! launch shape, and the op's parameters as typed arguments in the order of the kernel's parameter
//! list ([`plan_node`]); matrix products are handed to the vendor's BLAS as [`GemmBatch`]es. The
//! backend only turns device memory into [`TDesc`]s and runs what is planned.

use super::table::{self, TDesc, FA_THREADS, MAX_BLOCKS, THREADS};
use crate::err;
use ggml_core::{
    DType, Error, GluOp, Graph, Layout, Op, Result, RopeMode, RopeParams, SortOrder, TensorId,
    UnaryOp,
};

/// One kernel argument, passed by value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KernelArg {
    Tensor(TDesc),
    I32(i32),
    F32(f32),
}

impl From<TDesc> for KernelArg {
    fn from(t: TDesc) -> Self {
        KernelArg::Tensor(t)
    }
}

impl From<i32> for KernelArg {
    fn from(v: i32) -> Self {
        KernelArg::I32(v)
    }
}

impl From<f32> for KernelArg {
    fn from(v: f32) -> Self {
        KernelArg::F32(v)
    }
}

/// The arguments of a launch, from local variables (a `TDesc`, `i32` or `f32` each).
macro_rules! args {
    ($($arg:expr),* $(,)?) => { vec![$(KernelArg::from($arg)),*] };
}

/// A one-dimensional launch of a kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub kernel: &'static str,
    pub blocks: u32,
    pub threads: u32,
    pub shared_bytes: u32,
    pub args: Vec<KernelArg>,
}

impl Launch {
    /// Blocks of [`THREADS`] threads covering `n` elements (grid-stride loops cover the rest).
    pub fn elementwise(kernel: &'static str, n: usize, args: Vec<KernelArg>) -> Launch {
        Launch {
            kernel,
            blocks: n.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS) as u32,
            threads: THREADS,
            shared_bytes: 0,
            args,
        }
    }

    /// One block of `threads` threads per row (`rows` < 2^31, see [`table::supports`]).
    pub fn rows(
        kernel: &'static str,
        rows: usize,
        threads: u32,
        shared_bytes: u32,
        args: Vec<KernelArg>,
    ) -> Launch {
        Launch {
            kernel,
            blocks: rows as u32,
            threads,
            shared_bytes,
            args,
        }
    }
}

/// What computing one node takes.
#[derive(Clone, Debug, PartialEq)]
pub enum Work {
    /// Nothing (a layout-only op).
    Nothing,
    /// One kernel launch.
    Launch(Launch),
    /// `d = a x b` (ggml's mul_mat), through the vendor's BLAS: see [`to_f32`] and
    /// [`gemm_batches`].
    MulMat { a: TDesc, b: TDesc, d: TDesc },
}

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

/// Plans `node` of `graph` for a backend called `backend`; `desc` gives the descriptor of a tensor
/// in that backend's memory (layout ops and leaves are skipped by the caller).
pub fn plan_node(
    graph: &Graph,
    node: TensorId,
    backend: &str,
    desc: &dyn Fn(TensorId) -> Result<TDesc>,
) -> Result<Work> {
    let t = graph.tensor(node);
    let layouts: Vec<_> = t.src.iter().map(|&s| graph.layout(s)).collect();
    if !table::supports(&t.op, &layouts, &t.layout) {
        return Err(Error::UnsupportedOp {
            op: format!(
                "{} ({:?})",
                t.op.name(),
                layouts.iter().map(|l| l.dtype).collect::<Vec<_>>()
            ),
            backend: backend.to_string(),
        });
    }
    let src = |i: usize| -> Result<TDesc> {
        match t.src.get(i) {
            Some(&s) => desc(s),
            None => Ok(TDesc::absent()),
        }
    };
    let d = desc(node)?;
    let n = t.nelements();
    let nrows = t.layout.nrows();
    let launch = match &t.op {
        Op::None | Op::View { .. } | Op::Reshape | Op::Permute { .. } | Op::Transpose => {
            return Ok(Work::Nothing)
        }
        Op::MulMat => {
            return Ok(Work::MulMat {
                a: src(0)?,
                b: src(1)?,
                d,
            })
        }
        Op::Unary(_) | Op::Scale { .. } | Op::Clamp { .. } => {
            let a = src(0)?;
            let (op, p0, p1) = match &t.op {
                Op::Unary(u) => (unary_code(*u), 0f32, 0f32),
                Op::Scale { scale, bias } => (10, *scale, *bias),
                Op::Clamp { min, max } => (11, *min, *max),
                _ => unreachable!("matched above"),
            };
            Launch::elementwise("k_unary", n, args![a, d, op, p0, p1])
        }
        Op::Add | Op::Sub | Op::Mul | Op::Div => {
            let op: i32 = match t.op {
                Op::Add => 0,
                Op::Sub => 1,
                Op::Mul => 2,
                _ => 3,
            };
            Launch::elementwise("k_binary", n, args![src(0)?, src(1)?, d, op])
        }
        Op::Glu { op, swapped } => {
            let fused = i32::from(t.src.len() == 1);
            let swapped = i32::from(*swapped);
            let (code, alpha, limit): (i32, f32, f32) = match *op {
                GluOp::Swiglu => (0, 0.0, 0.0),
                GluOp::Geglu => (1, 0.0, 0.0),
                GluOp::GegluErf => (2, 0.0, 0.0),
                GluOp::SwigluOai { alpha, limit } => (3, alpha, limit),
            };
            let a = args![src(0)?, src(1)?, d, code, fused, swapped, alpha, limit];
            Launch::elementwise("k_glu", n, a)
        }
        Op::AddId => Launch::elementwise("k_add_id", n, args![src(0)?, src(1)?, src(2)?, d]),
        Op::RmsNorm { eps } | Op::Norm { eps } => {
            let rms = i32::from(matches!(t.op, Op::RmsNorm { .. }));
            Launch::rows("k_norm", nrows, 256, 0, args![src(0)?, d, *eps, rms])
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
            let [corr0, corr1] = yarn_corr_dims(p);
            let n_dims = p.n_dims as i32;
            let neox = i32::from(p.mode == RopeMode::Neox);
            let has_ff = i32::from(t.src.len() > 2);
            let a = args![
                src(0)?,
                src(1)?,
                src(2)?,
                d,
                n_dims,
                neox,
                has_ff,
                p.freq_base,
                p.freq_scale,
                p.ext_factor,
                p.attn_factor,
                corr0,
                corr1
            ];
            Launch::elementwise("k_rope", n, a)
        }
        Op::Cpy | Op::Cont => {
            let s = src(0)?;
            let st = graph.layout(t.src[0]).dtype;
            if st == t.layout.dtype && st.is_quantized() {
                let ts = st.type_size() as i32;
                Launch::elementwise("k_cpy_blocks", n / st.block_size(), args![s, d, ts])
            } else if t.layout.dtype.is_quantized() {
                Launch::elementwise("k_cpy_q", n / 32, args![s, d])
            } else {
                Launch::elementwise("k_cpy", n, args![s, d])
            }
        }
        Op::GetRows => Launch::elementwise("k_get_rows", n, args![src(0)?, src(1)?, d]),
        Op::SetRows => {
            let sn = graph.layout(t.src[1]).nelements();
            let a = args![d, src(1)?, src(2)?];
            if t.layout.dtype.is_quantized() {
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
            let a = args![src(0)?, d, desc_order, npad];
            Launch::rows("k_argsort", nrows, 256, shared, a)
        }
        Op::FlashAttnExt {
            scale,
            max_bias,
            softcap,
        } => {
            let has_mask = i32::from(t.src.len() > 3);
            let has_sinks = i32::from(t.src.len() > 4);
            let a = args![
                src(0)?,
                src(1)?,
                src(2)?,
                src(3)?,
                src(4)?,
                d,
                *scale,
                *max_bias,
                *softcap,
                has_mask,
                has_sinks
            ];
            Launch::rows("k_flash_attn", nrows, FA_THREADS, 0, a)
        }
        Op::MulMatId => {
            // One 32-lane group per result element.
            let a = args![src(0)?, src(1)?, src(2)?, d];
            Launch::elementwise("k_mul_mat_id", n.saturating_mul(32), a)
        }
    };
    Ok(Work::Launch(launch))
}

/// The launch converting `src` (shape `ne`, any readable type and strides) into contiguous F32 at
/// device address `dst`.
pub fn to_f32(src: TDesc, ne: [usize; 4], dst: u64) -> Result<Launch> {
    let d = TDesc::contiguous(dst, DType::F32, ne)?;
    Ok(Launch::elementwise(
        "k_cpy",
        ne.iter().product(),
        args![src, d],
    ))
}

/// One column-major SGEMM of a mul_mat: `d[m, cols] = a[k, m]^T b[k, cols]`, operands at these
/// element offsets from contiguous F32 copies of a, b and from d.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmBatch {
    pub a_offset: usize,
    pub b_offset: usize,
    pub d_offset: usize,
    pub cols: usize,
}

/// The SGEMMs of `a [K, M, A2, A3] x b [K, N, B2, B3]` (a broadcast over b's batches): one over
/// every batch when a has one, else one per batch of b.
pub fn gemm_batches(la: &Layout, lb: &Layout) -> Result<Vec<GemmBatch>> {
    let [k, m, a2, a3] = la.ne;
    let [_, n, b2, b3] = lb.ne;
    if a2 == 0 || a3 == 0 || b2 % a2 != 0 || b3 % a3 != 0 {
        return Err(err(format!("mul_mat batches {:?} x {:?}", la.ne, lb.ne)));
    }
    if a2 * a3 == 1 {
        return Ok(vec![GemmBatch {
            a_offset: 0,
            b_offset: 0,
            d_offset: 0,
            cols: n * b2 * b3,
        }]);
    }
    let (r2, r3) = (b2 / a2, b3 / a3);
    let mut batches = Vec::with_capacity(b2 * b3);
    for i3 in 0..b3 {
        for i2 in 0..b2 {
            batches.push(GemmBatch {
                a_offset: k * m * ((i2 / r2) + a2 * (i3 / r3)),
                b_offset: k * n * (i2 + b2 * i3),
                d_offset: m * n * (i2 + b2 * i3),
                cols: n,
            });
        }
    }
    Ok(batches)
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
