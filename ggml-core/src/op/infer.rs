//! The shape and type rule of every computed op ([`Op::infer`]), one function per op family:
//! copies, rows, matrix products, element-wise ops, row reductions, rope, softmax, attention,
//! concatenation and sorts. Each validates its sources and returns the result's type and shape.

use super::{Op, RopeParams};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Layout;

/// A result's element type and shape.
type Inferred = Result<(DType, [usize; 4])>;

const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// The types attention reads keys and values in.
const KV_TYPES: [DType; 5] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q8_0,
    DType::Q4_0,
];

impl Op {
    /// The shape and type rule of every computed op: validates the sources and returns the result's
    /// element type and shape. `out_type` is the requested result type where the op allows a choice
    /// (`cont`); other ops ignore it.
    pub fn infer(&self, srcs: &[&Layout], out_type: Option<DType>) -> Inferred {
        let name = self.name();
        match self {
            Op::None | Op::View { .. } | Op::Reshape | Op::Permute { .. } | Op::Transpose => {
                Err(shape_err(
                    name,
                    "layout ops are built by the graph builder, not inferred",
                ))
            }
            Op::Cpy => cpy(name, srcs),
            Op::Cont => cont(name, srcs, out_type),
            Op::GetRows => get_rows(name, srcs),
            Op::SetRows => set_rows(name, srcs),
            Op::MulMat => mul_mat(name, srcs),
            Op::MulMatId => mul_mat_id(name, srcs),
            Op::Add | Op::Sub | Op::Mul | Op::Div => binary(name, srcs),
            Op::AddId => add_id(name, srcs),
            Op::Scale { .. } | Op::Clamp { .. } | Op::Unary(_) => unary(name, srcs),
            Op::Glu { .. } => glu(name, srcs),
            Op::RmsNorm { .. } | Op::Norm { .. } => Ok((DType::F32, f32_rows(name, srcs)?)),
            Op::SumRows => {
                let ne = f32_rows(name, srcs)?;
                Ok((DType::F32, [1, ne[1], ne[2], ne[3]]))
            }
            Op::Rope(p) => rope(name, srcs, p),
            Op::SoftMax { .. } => soft_max(name, srcs),
            Op::FlashAttnExt { .. } => flash_attn_ext(name, srcs),
            Op::Concat { dim } => concat(name, srcs, *dim),
            Op::Argsort { .. } => argsort(name, srcs),
            Op::TopK { k } => top_k(name, srcs, *k),
            Op::GatedDeltaNet { .. } => gated_delta_net(name, srcs),
        }
    }
}

fn shape_err(op: &'static str, msg: impl Into<String>) -> Error {
    Error::Shape {
        op,
        msg: msg.into(),
    }
}

fn can_repeat(b: &Layout, a: &Layout) -> bool {
    (0..4).all(|d| a.ne[d].is_multiple_of(b.ne[d]))
}

fn expect_type(op: &'static str, what: &str, got: DType, allowed: &[DType]) -> Result<()> {
    if allowed.contains(&got) {
        Ok(())
    } else {
        Err(shape_err(
            op,
            format!("{what} has type {got}, expected one of {allowed:?}"),
        ))
    }
}

fn expect_srcs(op: &'static str, srcs: &[&Layout], min: usize, max: usize) -> Result<()> {
    if srcs.len() < min || srcs.len() > max {
        return Err(shape_err(
            op,
            format!("takes {min}..={max} sources, got {}", srcs.len()),
        ));
    }
    Ok(())
}

fn check_row_blocks(op: &'static str, t: DType, ne0: usize) -> Result<()> {
    if !ne0.is_multiple_of(t.block_size()) {
        return Err(shape_err(
            op,
            format!("rows of {ne0} are not whole {t} blocks"),
        ));
    }
    Ok(())
}

/// `cpy`: `[src, dst]` of one element count; the result is dst.
fn cpy(name: &'static str, srcs: &[&Layout]) -> Inferred {
    expect_srcs(name, srcs, 2, 2)?;
    let (a, b) = (srcs[0], srcs[1]);
    if a.nelements() != b.nelements() {
        return Err(shape_err(
            name,
            format!("{:?} and {:?} differ in element count", a.ne, b.ne),
        ));
    }
    check_row_blocks(name, b.dtype, b.ne[0])?;
    Ok((b.dtype, b.ne))
}

/// `cont`: the source's shape in `out_type` (default: the source's type).
fn cont(name: &'static str, srcs: &[&Layout], out_type: Option<DType>) -> Inferred {
    expect_srcs(name, srcs, 1, 1)?;
    let t = out_type.unwrap_or(srcs[0].dtype);
    check_row_blocks(name, t, srcs[0].ne[0])?;
    Ok((t, srcs[0].ne))
}

/// `get_rows`: `[table, ids]`, F32 rows (I32 from an I32 table).
fn get_rows(name: &'static str, srcs: &[&Layout]) -> Inferred {
    expect_srcs(name, srcs, 2, 2)?;
    let (a, ids) = (srcs[0], srcs[1]);
    expect_type(name, "ids", ids.dtype, &[DType::I32])?;
    if ids.ne[1] != a.ne[2] || ids.ne[2] != a.ne[3] || ids.ne[3] != 1 {
        return Err(shape_err(
            name,
            format!("ids {:?} do not match table {:?}", ids.ne, a.ne),
        ));
    }
    let t = if a.dtype == DType::I32 {
        DType::I32
    } else {
        DType::F32
    };
    Ok((t, [a.ne[0], ids.ne[0], ids.ne[1], ids.ne[2]]))
}

/// `set_rows`: `[dst, src, ids]`; the result is dst.
fn set_rows(name: &'static str, srcs: &[&Layout]) -> Inferred {
    expect_srcs(name, srcs, 3, 3)?;
    let (dst, src, ids) = (srcs[0], srcs[1], srcs[2]);
    expect_type(name, "src", src.dtype, &[DType::F32])?;
    expect_type(name, "ids", ids.dtype, &[DType::I32])?;
    check_row_blocks(name, dst.dtype, dst.ne[0])?;
    let mismatch = || {
        shape_err(
            name,
            format!("dst {:?}, src {:?}, ids {:?}", dst.ne, src.ne, ids.ne),
        )
    };
    if src.ne[0] != dst.ne[0] || ids.ne[0] != src.ne[1] {
        return Err(mismatch());
    }
    if !src.ne[2].is_multiple_of(ids.ne[1])
        || !src.ne[3].is_multiple_of(ids.ne[2])
        || dst.ne[2] != src.ne[2]
        || dst.ne[3] != src.ne[3]
    {
        return Err(mismatch());
    }
    Ok((dst.dtype, dst.ne))
}

/// `mul_mat`: `[a, b]`, F32 [a rows, b rows, b.ne2, b.ne3].
fn mul_mat(name: &'static str, srcs: &[&Layout]) -> Inferred {
    expect_srcs(name, srcs, 2, 2)?;
    let (a, b) = (srcs[0], srcs[1]);
    if a.ne[0] != b.ne[0] || !b.ne[2].is_multiple_of(a.ne[2]) || !b.ne[3].is_multiple_of(a.ne[3]) {
        return Err(shape_err(
            name,
            format!("cannot multiply {:?} by {:?}", a.ne, b.ne),
        ));
    }
    expect_type(name, "b", b.dtype, &FLOATS)?;
    if a.dtype == DType::I32 {
        return Err(shape_err(name, "a has type i32"));
    }
    Ok((DType::F32, [a.ne[1], b.ne[1], b.ne[2], b.ne[3]]))
}

/// `mul_mat_id`: `[experts, b, ids]`, F32 [M, n_used, T].
fn mul_mat_id(name: &'static str, srcs: &[&Layout]) -> Inferred {
    expect_srcs(name, srcs, 3, 3)?;
    let (w, b, ids) = (srcs[0], srcs[1], srcs[2]);
    expect_type(name, "ids", ids.dtype, &[DType::I32])?;
    expect_type(name, "b", b.dtype, &FLOATS)?;
    if w.ne[0] != b.ne[0]
        || w.ne[3] != 1
        || b.ne[2] != ids.ne[1]
        || (b.ne[1] != 1 && b.ne[1] != ids.ne[0])
    {
        return Err(shape_err(
            name,
            format!("experts {:?}, b {:?}, ids {:?}", w.ne, b.ne, ids.ne),
        ));
    }
    Ok((DType::F32, [w.ne[1], ids.ne[0], ids.ne[1], 1]))
}

/// `add`, `sub`, `mul`, `div`: float `[a, b]` with b broadcast over a.
fn binary(name: &'static str, srcs: &[&Layout]) -> Inferred {
    expect_srcs(name, srcs, 2, 2)?;
    let (a, b) = (srcs[0], srcs[1]);
    expect_type(name, "a", a.dtype, &FLOATS)?;
    expect_type(name, "b", b.dtype, &FLOATS)?;
    if !can_repeat(b, a) {
        return Err(shape_err(
            name,
            format!("{:?} does not broadcast to {:?}", b.ne, a.ne),
        ));
    }
    Ok((a.dtype, a.ne))
}

/// `add_id`: F32 `[a, b, ids]`, per-expert biases.
fn add_id(name: &'static str, srcs: &[&Layout]) -> Inferred {
    expect_srcs(name, srcs, 3, 3)?;
    let (a, b, ids) = (srcs[0], srcs[1], srcs[2]);
    expect_type(name, "a", a.dtype, &[DType::F32])?;
    expect_type(name, "b", b.dtype, &[DType::F32])?;
    expect_type(name, "ids", ids.dtype, &[DType::I32])?;
    if b.ne[0] != a.ne[0] || ids.ne[0] != a.ne[1] || ids.ne[1] != a.ne[2] || a.ne[3] != 1 {
        return Err(shape_err(
            name,
            format!("a {:?}, b {:?}, ids {:?}", a.ne, b.ne, ids.ne),
        ));
    }
    Ok((DType::F32, a.ne))
}

/// `scale`, `clamp` and the unary functions: one float source, same type and shape.
fn unary(name: &'static str, srcs: &[&Layout]) -> Inferred {
    expect_srcs(name, srcs, 1, 1)?;
    expect_type(name, "a", srcs[0].dtype, &FLOATS)?;
    Ok((srcs[0].dtype, srcs[0].ne))
}

/// Gated linear units: `[gate, up]` of one shape, or one source of fused halves along axis 0.
fn glu(name: &'static str, srcs: &[&Layout]) -> Inferred {
    expect_srcs(name, srcs, 1, 2)?;
    let a = srcs[0];
    expect_type(name, "a", a.dtype, &FLOATS)?;
    if let Some(b) = srcs.get(1) {
        if b.ne != a.ne || b.dtype != a.dtype {
            return Err(shape_err(
                name,
                format!("gate {:?} and up {:?} differ", a.ne, b.ne),
            ));
        }
        Ok((a.dtype, a.ne))
    } else {
        if !a.ne[0].is_multiple_of(2) {
            return Err(shape_err(
                name,
                format!("fused gate/up width {} is odd", a.ne[0]),
            ));
        }
        Ok((a.dtype, [a.ne[0] / 2, a.ne[1], a.ne[2], a.ne[3]]))
    }
}

/// Norms and row sums: one F32 source, whose shape is returned.
fn f32_rows(name: &'static str, srcs: &[&Layout]) -> Result<[usize; 4]> {
    expect_srcs(name, srcs, 1, 1)?;
    expect_type(name, "a", srcs[0].dtype, &[DType::F32])?;
    Ok(srcs[0].ne)
}

/// `rope`: `[a, positions]` or `[a, positions, freq_factors]`.
fn rope(name: &'static str, srcs: &[&Layout], p: &RopeParams) -> Inferred {
    expect_srcs(name, srcs, 2, 3)?;
    let (a, pos) = (srcs[0], srcs[1]);
    expect_type(name, "a", a.dtype, &[DType::F32, DType::F16])?;
    expect_type(name, "positions", pos.dtype, &[DType::I32])?;
    if pos.ne[0] != a.ne[2] || p.n_dims > a.ne[0] || !p.n_dims.is_multiple_of(2) {
        return Err(shape_err(
            name,
            format!("a {:?}, positions {:?}, n_dims {}", a.ne, pos.ne, p.n_dims),
        ));
    }
    if let Some(f) = srcs.get(2) {
        expect_type(name, "freq_factors", f.dtype, &[DType::F32])?;
        if f.ne[0] < p.n_dims / 2 {
            return Err(shape_err(
                name,
                format!("freq_factors has {} < n_dims/2 values", f.ne[0]),
            ));
        }
    }
    Ok((a.dtype, a.ne))
}

/// `soft_max`: `[a]`, `[a, mask]` or `[a, mask, sinks]`.
fn soft_max(name: &'static str, srcs: &[&Layout]) -> Inferred {
    expect_srcs(name, srcs, 1, 3)?;
    let a = srcs[0];
    expect_type(name, "a", a.dtype, &[DType::F32])?;
    if let Some(m) = srcs.get(1) {
        expect_type(name, "mask", m.dtype, &[DType::F32, DType::F16])?;
        if m.ne[0] != a.ne[0]
            || m.ne[1] < a.ne[1]
            || !a.ne[2].is_multiple_of(m.ne[2])
            || !a.ne[3].is_multiple_of(m.ne[3])
        {
            return Err(shape_err(
                name,
                format!("mask {:?} does not fit {:?}", m.ne, a.ne),
            ));
        }
    }
    if let Some(s) = srcs.get(2) {
        expect_sinks(name, s, a.ne[2])?;
    }
    Ok((DType::F32, a.ne))
}

/// Attention sinks: F32, one per head.
fn expect_sinks(name: &'static str, s: &Layout, heads: usize) -> Result<()> {
    expect_type(name, "sinks", s.dtype, &[DType::F32])?;
    if s.ne[0] != heads {
        return Err(shape_err(
            name,
            format!("sinks {:?} for {heads} heads", s.ne),
        ));
    }
    Ok(())
}

/// `flash_attn_ext`: `[q, k, v]`, then optionally a mask and sinks; F32 [Dv, H, Nq, S].
fn flash_attn_ext(name: &'static str, srcs: &[&Layout]) -> Inferred {
    expect_srcs(name, srcs, 3, 5)?;
    let (q, k, v) = (srcs[0], srcs[1], srcs[2]);
    expect_type(name, "q", q.dtype, &[DType::F32])?;
    expect_type(name, "k", k.dtype, &KV_TYPES)?;
    expect_type(name, "v", v.dtype, &KV_TYPES)?;
    if q.ne[0] != k.ne[0]
        || k.ne[1] != v.ne[1]
        || k.ne[2] != v.ne[2]
        || !q.ne[2].is_multiple_of(k.ne[2])
        || q.ne[3] != k.ne[3]
        || k.ne[3] != v.ne[3]
    {
        return Err(shape_err(
            name,
            format!("q {:?}, k {:?}, v {:?}", q.ne, k.ne, v.ne),
        ));
    }
    if let Some(m) = srcs.get(3) {
        expect_type(name, "mask", m.dtype, &[DType::F32, DType::F16])?;
        if m.ne[0] != k.ne[1] || m.ne[1] < q.ne[1] {
            return Err(shape_err(
                name,
                format!("mask {:?} for q {:?}, k {:?}", m.ne, q.ne, k.ne),
            ));
        }
    }
    if let Some(s) = srcs.get(4) {
        expect_sinks(name, s, q.ne[2])?;
    }
    Ok((DType::F32, [v.ne[0], q.ne[2], q.ne[1], q.ne[3]]))
}

/// `concat`: `[a, b]` of one type, equal but along `dim`.
fn concat(name: &'static str, srcs: &[&Layout], dim: usize) -> Inferred {
    expect_srcs(name, srcs, 2, 2)?;
    let (a, b) = (srcs[0], srcs[1]);
    if dim > 3 || a.dtype != b.dtype || (0..4).any(|d| d != dim && a.ne[d] != b.ne[d]) {
        return Err(shape_err(
            name,
            format!("cannot concat {:?} and {:?} on {dim}", a.ne, b.ne),
        ));
    }
    if a.dtype.is_quantized() {
        return Err(shape_err(name, "quantized concat"));
    }
    let mut ne = a.ne;
    ne[dim] += b.ne[dim];
    Ok((a.dtype, ne))
}

/// `argsort`: I32 indices of each F32 row.
fn argsort(name: &'static str, srcs: &[&Layout]) -> Inferred {
    expect_srcs(name, srcs, 1, 1)?;
    expect_type(name, "a", srcs[0].dtype, &[DType::F32])?;
    Ok((DType::I32, srcs[0].ne))
}

/// `top_k`: I32 indices of the `k` largest values of each F32 row.
fn top_k(name: &'static str, srcs: &[&Layout], k: usize) -> Inferred {
    expect_srcs(name, srcs, 1, 1)?;
    let a = srcs[0];
    expect_type(name, "a", a.dtype, &[DType::F32])?;
    if k == 0 || k > a.ne[0] {
        return Err(shape_err(name, format!("k = {k} for rows of {}", a.ne[0])));
    }
    Ok((DType::I32, [k, a.ne[1], a.ne[2], a.ne[3]]))
}

/// `gated_delta_net`: `[q, k, v, gates, state]` F32 with q, k `[Dk, Hk, T]`, v `[Dv, H, T]`
/// (`H % Hk == 0`), gates `[H, T, 2]`, state `[Dk, Dv, H]`; result `[Dv, H, T + Dk]`.
fn gated_delta_net(name: &'static str, srcs: &[&Layout]) -> Inferred {
    expect_srcs(name, srcs, 5, 5)?;
    for (l, what) in srcs.iter().zip(["q", "k", "v", "gates", "state"]) {
        expect_type(name, what, l.dtype, &[DType::F32])?;
    }
    let [q, k, v, gates, s] = [srcs[0], srcs[1], srcs[2], srcs[3], srcs[4]];
    let [dk, hk, t, _] = k.ne;
    let [dv, h, _, _] = v.ne;
    let fits = q.ne == k.ne
        && q.ne[3] == 1
        && v.ne == [dv, h, t, 1]
        && gates.ne == [h, t, 2, 1]
        && s.ne == [dk, dv, h, 1]
        // No heads at all is an empty rule (a device holding no head of a head split).
        && ((hk > 0 && h.is_multiple_of(hk)) || h == hk);
    if !fits {
        return Err(shape_err(
            name,
            format!(
                "q {:?} k {:?} v {:?} gates {:?} state {:?} do not fit",
                q.ne, k.ne, v.ne, gates.ne, s.ne
            ),
        ));
    }
    Ok((DType::F32, [dv, h, t + dk, 1]))
}
