//! Dispatch of one graph node to its kernel: operand descriptors (device addresses checked against
//! their buffers), the op's parameters as kernel arguments, and the launch shape.

use super::{gemv, grid_for, matmul, rows_grid, TDesc};
use crate::memory::CudaBuffer;
use crate::stream::CudaBackend;
use crate::{cu, err};
use cudarc::driver::LaunchConfig;
use ggml_core::backend::check_range;
use ggml_core::Buffer as _;
use ggml_core::{Device, Error, GluOp, Graph, Op, Result, RopeMode, SortOrder, TensorId, UnaryOp};

/// Launches kernel `$name` on the backend's stream with `$cfg` and the given local variables as
/// arguments.
macro_rules! launch {
    ($be:expr, $name:expr, $cfg:expr; $($arg:ident),*) => {{
        let f = $be.kernels().get($name)?;
        #[allow(unused_imports)]
        use cudarc::driver::PushKernelArg as _;
        let mut b = $be.stream().launch_builder(f);
        $( b.arg(&$arg); )*
        // SAFETY: every argument matches the kernel's parameter list in cu/*.cu, and every tensor
        // address was checked to lie inside a live buffer of this device.
        cu($name, unsafe { b.launch($cfg) }).map(|_| ())
    }};
}
pub(crate) use launch;

/// The descriptor of tensor `id`: its device address (through views) and layout.
pub fn desc(be: &CudaBackend, graph: &Graph, id: TensorId) -> Result<TDesc> {
    let t = graph.tensor(id);
    let data = graph.data(id)?;
    let buf = data
        .buffer
        .as_any()
        .downcast_ref::<CudaBuffer>()
        .filter(|b| b.ordinal() == be.cuda_device().ordinal())
        .ok_or_else(|| {
            err(format!(
                "tensor {} lives in {}, not in memory of {}",
                t.name,
                data.buffer.name(),
                be.cuda_device().name()
            ))
        })?;
    check_range(data.offset, t.nbytes(), buf.size())?;
    TDesc::new(buf.device_ptr() + data.offset as u64, &t.layout)
}

/// A placeholder for an absent optional operand (shape of ones, so index arithmetic stays defined).
fn absent() -> TDesc {
    TDesc {
        ne: [1; 4],
        ..Default::default()
    }
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
fn yarn_corr_dims(p: &ggml_core::RopeParams) -> [f32; 2] {
    let start = yarn_corr_dim(p.n_dims, p.n_ctx_orig, p.beta_fast, p.freq_base).floor();
    let end = yarn_corr_dim(p.n_dims, p.n_ctx_orig, p.beta_slow, p.freq_base).ceil();
    [start.max(0.0), end.min(p.n_dims as f32 - 1.0)]
}

/// Threads per flash attention block (`FA_THREADS`).
const FA_THREADS: u32 = 128;
/// Blocks a flash attention launch aims for (a few per SM of a large GPU).
const FA_TARGET_BLOCKS: usize = 512;
/// Fewest keys one split handles.
const FA_MIN_KEYS_PER_SPLIT: usize = 256;
/// Scratch slot of the per-split flash attention partials.
const SLOT_ATTN_PARTS: usize = 4;

/// Splits of the KV axis for `rows` query rows over `n_kv` keys, and the keys per split (a multiple
/// of [`FA_THREADS`]): one split unless the rows alone leave the GPU idle and the KV is long.
fn attention_splits(rows: usize, n_kv: usize) -> (usize, usize) {
    let wanted = FA_TARGET_BLOCKS.div_ceil(rows.max(1));
    let most = n_kv.div_ceil(FA_MIN_KEYS_PER_SPLIT);
    let splits = wanted.min(most).max(1);
    let per = n_kv
        .div_ceil(splits)
        .next_multiple_of(FA_THREADS as usize)
        .max(FA_THREADS as usize);
    (n_kv.div_ceil(per).max(1), per)
}

/// Computes `node` of `graph` on `be`'s stream (layout ops and leaves are skipped by the caller).
pub fn compute_node(be: &CudaBackend, graph: &Graph, node: TensorId) -> Result<()> {
    let t = graph.tensor(node);
    let layouts: Vec<_> = t.src.iter().map(|&s| graph.layout(s)).collect();
    if !super::supports(&t.op, &layouts, &t.layout) {
        return Err(Error::UnsupportedOp {
            op: format!(
                "{} ({:?})",
                t.op.name(),
                layouts.iter().map(|l| l.dtype).collect::<Vec<_>>()
            ),
            backend: be.cuda_device().name(),
        });
    }
    let src = |i: usize| -> Result<TDesc> {
        match t.src.get(i) {
            Some(&s) => desc(be, graph, s),
            None => Ok(absent()),
        }
    };
    let d = desc(be, graph, node)?;
    let n = t.nelements();
    let nrows = t.layout.nrows();
    match &t.op {
        Op::None | Op::View { .. } | Op::Reshape | Op::Permute { .. } | Op::Transpose => Ok(()),
        Op::Unary(_) | Op::Scale { .. } | Op::Clamp { .. } => {
            let a = src(0)?;
            let (op, p0, p1) = match &t.op {
                Op::Unary(u) => (unary_code(*u), 0f32, 0f32),
                Op::Scale { scale, bias } => (10, *scale, *bias),
                Op::Clamp { min, max } => (11, *min, *max),
                _ => unreachable!("matched above"),
            };
            launch!(be, "k_unary", grid_for(n); a, d, op, p0, p1)
        }
        Op::Add | Op::Sub | Op::Mul | Op::Div => {
            let (a, b) = (src(0)?, src(1)?);
            let op: i32 = match t.op {
                Op::Add => 0,
                Op::Sub => 1,
                Op::Mul => 2,
                _ => 3,
            };
            launch!(be, "k_binary", grid_for(n); a, b, d, op)
        }
        Op::Glu { op, swapped } => {
            let (a, b) = (src(0)?, src(1)?);
            let fused = i32::from(t.src.len() == 1);
            let swapped = i32::from(*swapped);
            let (code, alpha, limit): (i32, f32, f32) = match *op {
                GluOp::Swiglu => (0, 0.0, 0.0),
                GluOp::Geglu => (1, 0.0, 0.0),
                GluOp::GegluErf => (2, 0.0, 0.0),
                GluOp::SwigluOai { alpha, limit } => (3, alpha, limit),
            };
            launch!(be, "k_glu", grid_for(n); a, b, d, code, fused, swapped, alpha, limit)
        }
        Op::AddId => {
            let (a, b, ids) = (src(0)?, src(1)?, src(2)?);
            launch!(be, "k_add_id", grid_for(n); a, b, ids, d)
        }
        Op::RmsNorm { eps } | Op::Norm { eps } => {
            let a = src(0)?;
            let eps = *eps;
            let rms = i32::from(matches!(t.op, Op::RmsNorm { .. }));
            launch!(be, "k_norm", rows_grid(nrows, 256, 0); a, d, eps, rms)
        }
        Op::SumRows => {
            let a = src(0)?;
            launch!(be, "k_sum_rows", rows_grid(nrows, 256, 0); a, d)
        }
        Op::SoftMax { scale, max_bias } => {
            let (a, m, s) = (src(0)?, src(1)?, src(2)?);
            let (scale, max_bias) = (*scale, *max_bias);
            let has_mask = i32::from(t.src.len() > 1);
            let has_sinks = i32::from(t.src.len() > 2);
            launch!(be, "k_soft_max", rows_grid(nrows, 256, 0);
                a, m, s, d, scale, max_bias, has_mask, has_sinks)
        }
        Op::Rope(p) => {
            let (a, pos, ff) = (src(0)?, src(1)?, src(2)?);
            let [corr0, corr1] = yarn_corr_dims(p);
            let n_dims = p.n_dims as i32;
            let neox = i32::from(p.mode == RopeMode::Neox);
            let has_ff = i32::from(t.src.len() > 2);
            let (fb, fs, ef, af) = (p.freq_base, p.freq_scale, p.ext_factor, p.attn_factor);
            launch!(be, "k_rope", grid_for(n);
                a, pos, ff, d, n_dims, neox, has_ff, fb, fs, ef, af, corr0, corr1)
        }
        Op::Cpy | Op::Cont => {
            let s = src(0)?;
            let st = graph.layout(t.src[0]).dtype;
            if st == t.layout.dtype && st.is_quantized() {
                let ts = st.type_size() as i32;
                let blocks = n / st.block_size();
                launch!(be, "k_cpy_blocks", grid_for(blocks); s, d, ts)
            } else if t.layout.dtype.is_quantized() {
                launch!(be, "k_cpy_q", grid_for(n / 32); s, d)
            } else {
                launch!(be, "k_cpy", grid_for(n); s, d)
            }
        }
        Op::GetRows => {
            let (table, ids) = (src(0)?, src(1)?);
            launch!(be, "k_get_rows", grid_for(n); table, ids, d)
        }
        Op::SetRows => {
            let (s, ids) = (src(1)?, src(2)?);
            let sn = graph.layout(t.src[1]).nelements();
            if t.layout.dtype.is_quantized() {
                launch!(be, "k_set_rows_q", grid_for(sn / 32); d, s, ids)
            } else {
                launch!(be, "k_set_rows", grid_for(sn); d, s, ids)
            }
        }
        Op::Concat { dim } => {
            let (a, b) = (src(0)?, src(1)?);
            let dim = *dim as i32;
            launch!(be, "k_concat", grid_for(n); a, b, d, dim)
        }
        Op::Argsort { .. } | Op::TopK { .. } => {
            let a = src(0)?;
            let desc_order = i32::from(!matches!(
                t.op,
                Op::Argsort {
                    order: SortOrder::Asc
                }
            ));
            let npad = graph.layout(t.src[0]).ne[0].next_power_of_two().max(1) as i32;
            let shared = npad as u32 * 8;
            launch!(be, "k_argsort", rows_grid(nrows, 256, shared); a, d, desc_order, npad)
        }
        Op::FlashAttnExt {
            scale,
            max_bias,
            softcap,
        } => {
            let (q, k, v, m, s) = (src(0)?, src(1)?, src(2)?, src(3)?, src(4)?);
            let (scale, max_bias, softcap) = (*scale, *max_bias, *softcap);
            let has_mask = i32::from(t.src.len() > 3);
            let has_sinks = i32::from(t.src.len() > 4);
            let n_kv = graph.layout(t.src[1]).ne[1];
            let (splits, kv_per_split) = attention_splits(nrows, n_kv);
            let cfg = LaunchConfig {
                grid_dim: (nrows as u32, splits as u32, 1),
                ..rows_grid(nrows, FA_THREADS, 0)
            };
            let kv_per_split = kv_per_split as i32;
            if splits == 1 {
                let part = 0u64;
                return launch!(be, "k_flash_attn", cfg; q, k, v, m, s, d, scale, max_bias,
                    softcap, has_mask, has_sinks, kv_per_split, part);
            }
            let part = be.scratch(SLOT_ATTN_PARTS, nrows * splits * (t.layout.ne[0] + 2) * 4)?;
            launch!(be, "k_flash_attn", cfg; q, k, v, m, s, d, scale, max_bias, softcap,
                has_mask, has_sinks, kv_per_split, part)?;
            let splits = splits as i32;
            launch!(be, "k_flash_attn_combine", rows_grid(nrows, FA_THREADS, 0);
                s, d, has_sinks, splits, part)
        }
        Op::MulMat => {
            let (a, b) = (src(0)?, src(1)?);
            matmul::mul_mat(be, a, graph.layout(t.src[0]), b, graph.layout(t.src[1]), d)
        }
        Op::MulMatId => {
            let (a, b, ids) = (src(0)?, src(1)?, src(2)?);
            let l = |i: usize| graph.layout(t.src[i]);
            gemv::mul_mat_id(be, (a, l(0)), (b, l(1)), (ids, l(2)), d)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_splits_cover_the_keys() {
        assert_eq!(attention_splits(64, 100), (1, 128));
        assert_eq!(attention_splits(1024, 100_000).0, 1);
        for (rows, n_kv) in [(32, 8192), (1, 1000), (8, 300), (4, 65_536)] {
            let (splits, per) = attention_splits(rows, n_kv);
            assert!(splits > 1, "{rows} rows, {n_kv} keys");
            assert_eq!(per % FA_THREADS as usize, 0);
            assert!(splits * per >= n_kv && (splits - 1) * per < n_kv);
            assert!(per >= FA_MIN_KEYS_PER_SPLIT);
        }
    }

    #[test]
    fn corr_dims_match_ggml_shape() {
        let mut p = ggml_core::RopeParams::simple(RopeMode::Neox, 128, 10000.0);
        p.n_ctx_orig = 4096;
        let [a, b] = yarn_corr_dims(&p);
        assert!(a >= 0.0 && a < b && b <= 127.0, "{a} {b}");
    }
}
