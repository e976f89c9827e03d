//! The CPU kernels and their dispatch: [`compute_node`] runs one graph node given host views of its
//! sources and result; [`supports`] says which op/type combinations the kernels handle. Every kernel
//! splits its work over rows ([`crate::team::par_tasks`]) so that each task writes disjoint bytes.

pub mod attention;
pub mod copy;
pub mod delta_net;
pub mod elementwise;
#[cfg(target_arch = "x86_64")]
mod exp_x86;
pub mod norm;
pub mod rope;
pub mod rows;
pub mod sort;
pub(crate) mod vector;

use crate::view::TView;
use elementwise::BinOp;
use ggml_core::{DType, Error, Graph, Layout, Op, Result, TensorId};

/// Host views of one node: its result and its sources in the op's documented order.
#[derive(Clone, Debug)]
pub struct NodeViews {
    pub dst: TView,
    pub src: Vec<TView>,
}

/// Computes `node` of `graph` from `views`. Layout ops and leaves do nothing.
pub fn compute_node(graph: &Graph, node: TensorId, views: &NodeViews) -> Result<()> {
    run_op(&graph.tensor(node).op, &views.src, &views.dst)
}

fn need(op: &Op, src: &[TView], min: usize) -> Result<()> {
    if src.len() < min {
        return Err(Error::Shape {
            op: op.name(),
            msg: format!("needs {min} sources, got {}", src.len()),
        });
    }
    Ok(())
}

/// Runs the kernel of `op` on host views.
pub fn run_op(op: &Op, src: &[TView], dst: &TView) -> Result<()> {
    let unsupported = || Error::UnsupportedOp {
        op: format!(
            "{} ({:?})",
            op.name(),
            src.iter().map(|s| s.dtype()).collect::<Vec<_>>()
        ),
        backend: "cpu".into(),
    };
    let layouts: Vec<&Layout> = src.iter().map(|s| &s.layout).collect();
    if !op.is_view() && *op != Op::None && !supports(op, &layouts, &dst.layout) {
        return Err(unsupported());
    }
    match op {
        Op::None | Op::View { .. } | Op::Reshape | Op::Permute { .. } | Op::Transpose => Ok(()),
        Op::Cpy | Op::Cont => {
            need(op, src, 1)?;
            copy::copy(&src[0], dst)
        }
        Op::GetRows => {
            need(op, src, 2)?;
            copy::get_rows(&src[0], &src[1], dst)
        }
        Op::SetRows => {
            need(op, src, 3)?;
            copy::set_rows(dst, &src[1], &src[2])
        }
        Op::MulMat => {
            need(op, src, 2)?;
            crate::matmul::mul_mat(&src[0], &src[1], dst)
        }
        Op::MulMatId => {
            need(op, src, 3)?;
            crate::matmul::mul_mat_id(&src[0], &src[1], &src[2], dst)
        }
        Op::Add | Op::Sub | Op::Mul | Op::Div => {
            need(op, src, 2)?;
            let b = match op {
                Op::Add => BinOp::Add,
                Op::Sub => BinOp::Sub,
                Op::Mul => BinOp::Mul,
                _ => BinOp::Div,
            };
            elementwise::binary(b, &src[0], &src[1], dst)
        }
        Op::AddId => {
            need(op, src, 3)?;
            elementwise::add_id(&src[0], &src[1], &src[2], dst)
        }
        Op::Scale { scale, bias } => {
            need(op, src, 1)?;
            elementwise::scale(&src[0], dst, *scale, *bias)
        }
        Op::Clamp { min, max } => {
            need(op, src, 1)?;
            elementwise::clamp(&src[0], dst, *min, *max)
        }
        Op::Unary(u) => {
            need(op, src, 1)?;
            elementwise::unary(*u, &src[0], dst)
        }
        Op::Glu { op: g, swapped } => {
            need(op, src, 1)?;
            elementwise::glu(*g, *swapped, &src[0], src.get(1), dst)
        }
        Op::RmsNorm { eps } => {
            need(op, src, 1)?;
            norm::rms_norm(&src[0], dst, *eps)
        }
        Op::Norm { eps } => {
            need(op, src, 1)?;
            norm::norm(&src[0], dst, *eps)
        }
        Op::SumRows => {
            need(op, src, 1)?;
            norm::sum_rows(&src[0], dst)
        }
        Op::Rope(p) => {
            need(op, src, 2)?;
            rope::rope(&src[0], &src[1], src.get(2), dst, p)
        }
        Op::SoftMax { scale, max_bias } => {
            need(op, src, 1)?;
            norm::soft_max(&src[0], src.get(1), src.get(2), dst, *scale, *max_bias)
        }
        Op::FlashAttnExt {
            scale,
            max_bias,
            softcap,
        } => {
            need(op, src, 3)?;
            let p = attention::FaParams {
                scale: *scale,
                max_bias: *max_bias,
                softcap: *softcap,
            };
            attention::flash_attn_ext(&src[0], &src[1], &src[2], src.get(3), src.get(4), dst, p)
        }
        Op::Concat { dim } => {
            need(op, src, 2)?;
            copy::concat(&src[0], &src[1], dst, *dim)
        }
        Op::Argsort { order } => {
            need(op, src, 1)?;
            sort::argsort(&src[0], dst, *order)
        }
        Op::TopK { k } => {
            need(op, src, 1)?;
            sort::top_k(&src[0], dst, *k)
        }
        Op::GatedDeltaNet { heads } => {
            need(op, src, 5)?;
            let s = delta_net::DeltaNetSources {
                q: &src[0],
                k: &src[1],
                v: &src[2],
                gates: &src[3],
                state: &src[4],
            };
            delta_net::gated_delta_net(&s, dst, *heads)
        }
    }
}

fn is_float(t: DType) -> bool {
    t.is_float()
}

/// Types a row of which converts to and from f32 (scalars and the block formats).
fn convertible(t: DType) -> bool {
    t != DType::I32
}

/// Quantized rows must have their blocks packed (a row of one block may have any stride).
fn blocks_packed(l: &Layout) -> bool {
    !l.dtype.is_quantized() || l.nb[0] == l.dtype.type_size() || l.ne[0] <= l.dtype.block_size()
}

/// True when the kernels handle `op` with these source layouts and result layout.
pub fn supports(op: &Op, src: &[&Layout], dst: &Layout) -> bool {
    let t = |i: usize| src.get(i).map(|l| l.dtype);
    let all_packed = src.iter().all(|l| blocks_packed(l)) && blocks_packed(dst);
    if !all_packed {
        return false;
    }
    let (a, b) = (t(0), t(1));
    match op {
        Op::None | Op::View { .. } | Op::Reshape | Op::Permute { .. } | Op::Transpose => true,
        Op::Cpy | Op::Cont => match a {
            Some(s) if s == dst.dtype => true,
            Some(s) => {
                (convertible(s) || !dst.dtype.is_quantized())
                    && (convertible(dst.dtype) || !s.is_quantized())
            }
            None => false,
        },
        Op::GetRows => {
            b == Some(DType::I32)
                && a.is_some_and(|a| {
                    if a == DType::I32 {
                        dst.dtype == DType::I32
                    } else {
                        dst.dtype == DType::F32
                    }
                })
        }
        Op::SetRows => {
            t(1) == Some(DType::F32) && t(2) == Some(DType::I32) && convertible(dst.dtype)
        }
        Op::MulMat => {
            a.is_some_and(convertible) && b.is_some_and(is_float) && dst.dtype == DType::F32
        }
        Op::MulMatId => {
            a.is_some_and(convertible)
                && b.is_some_and(is_float)
                && t(2) == Some(DType::I32)
                && dst.dtype == DType::F32
        }
        Op::Add | Op::Sub | Op::Mul | Op::Div => {
            a.is_some_and(is_float) && b.is_some_and(is_float) && is_float(dst.dtype)
        }
        Op::AddId => {
            a == Some(DType::F32)
                && b == Some(DType::F32)
                && t(2) == Some(DType::I32)
                && dst.dtype == DType::F32
        }
        Op::Scale { .. }
        | Op::Clamp { .. }
        | Op::Unary(_)
        | Op::RmsNorm { .. }
        | Op::Norm { .. }
        | Op::SumRows => a.is_some_and(is_float) && is_float(dst.dtype),
        Op::Glu { .. } => {
            a.is_some_and(is_float)
                && src.get(1).is_none_or(|l| is_float(l.dtype))
                && is_float(dst.dtype)
        }
        Op::Rope(_) => {
            a.is_some_and(is_float)
                && b == Some(DType::I32)
                && src.get(2).is_none_or(|l| l.dtype == DType::F32)
                && is_float(dst.dtype)
        }
        Op::SoftMax { .. } => {
            a.is_some_and(is_float)
                && src.iter().skip(1).all(|l| is_float(l.dtype))
                && dst.dtype == DType::F32
        }
        Op::FlashAttnExt { .. } => {
            src.len() >= 3
                && src.iter().all(|l| convertible(l.dtype))
                && src[3..].iter().all(|l| is_float(l.dtype))
                && dst.dtype == DType::F32
        }
        Op::Concat { .. } => a.is_some_and(|a| !a.is_quantized() && Some(a) == b && a == dst.dtype),
        Op::Argsort { .. } | Op::TopK { .. } => a.is_some_and(is_float) && dst.dtype == DType::I32,
        Op::GatedDeltaNet { .. } => {
            src.iter().all(|l| l.dtype == DType::F32)
                && dst.dtype == DType::F32
                && dst.is_contiguous()
        }
    }
}

#[cfg(test)]
mod tests;
