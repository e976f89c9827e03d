//! The operations of the graph: each op's parameters and, in one place, its shape and type rule
//! ([`Op::infer`]). View-like ops (view, reshape, permute, transpose) get their layouts from the graph
//! builder and are never computed.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Layout;

/// Element-wise unary functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Silu,
    /// tanh approximation of GELU.
    Gelu,
    /// Exact GELU with erf.
    GeluErf,
    Tanh,
    Exp,
    Sigmoid,
    Neg,
    Relu,
    Sqr,
    Sqrt,
}

/// Gated linear unit variants: `out = f(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GluOp {
    Swiglu,
    Geglu,
    GegluErf,
    /// gpt-oss: `g = min(gate, limit)`, `u = clamp(up, -limit, limit)`, `out = g * sigmoid(alpha * g) * (u + 1)`.
    SwigluOai {
        alpha: f32,
        limit: f32,
    },
}

/// Rotary embedding layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeMode {
    /// Rotate adjacent pairs (x[2i], x[2i+1]) (Llama).
    Normal,
    /// Rotate halves (x[i], x[i + n_dims/2]) (GPT-NeoX, Qwen, Gemma).
    Neox,
}

/// Rotary embedding parameters, YaRN included (as in ggml's `rope_ext`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    pub mode: RopeMode,
    /// Number of leading dimensions of each head that rotate.
    pub n_dims: usize,
    pub n_ctx_orig: usize,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub ext_factor: f32,
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
}

impl RopeParams {
    /// Plain rotary embedding without context extension.
    pub fn simple(mode: RopeMode, n_dims: usize, freq_base: f32) -> Self {
        RopeParams {
            mode,
            n_dims,
            n_ctx_orig: 0,
            freq_base,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
        }
    }
}

/// Sort direction of argsort.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SortOrder {
    Asc,
    Desc,
}

/// An operation and its parameters. Sources are stored on the tensor, in the order documented per variant.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A leaf: weight or input.
    None,
    /// `[src]`: a strided view at a byte offset.
    View {
        offset: usize,
    },
    /// `[src]`: same bytes, new shape (src contiguous).
    Reshape,
    /// `[src]`: axis `i` of the source becomes axis `axes[i]` of the result.
    Permute {
        axes: [usize; 4],
    },
    /// `[src]`: swap axes 0 and 1.
    Transpose,
    /// `[src, dst]`: copy src into dst (type conversion allowed); the result is a view of dst.
    Cpy,
    /// `[src]`: a contiguous copy, converted to the result type.
    Cont,
    /// `[table, ids]`: rows of `table` picked by I32 `ids` [n, ne2, ne3]; result F32 [ne0, n, ne2, ne3].
    GetRows,
    /// `[dst, src, ids]`: write rows of F32 `src` into `dst` at rows `ids` (I32); result is a view of dst.
    SetRows,
    /// `[a, b]`: result[m, n] = dot(a row m, b row n); a [K, M, A2, A3], b [K, N, B2, B3] (B2 % A2 == 0).
    MulMat,
    /// `[experts, b, ids]`: experts [K, M, E], b [K, B1, T] (B1 = 1 or n_used), ids I32 [n_used, T];
    /// result [M, n_used, T].
    MulMatId,
    /// `[a, b]`: a + b, b broadcast over a.
    Add,
    /// `[a, b, ids]`: a [ne0, ne1, ne2] + b[:, ids[i1, i2]] (per-expert biases).
    AddId,
    Sub,
    Mul,
    Div,
    /// `[a]`: a * scale + bias.
    Scale {
        scale: f32,
        bias: f32,
    },
    Clamp {
        min: f32,
        max: f32,
    },
    Unary(UnaryOp),
    /// `[a]` (gate and up halves along axis 0) or `[gate, up]`. `swapped` takes up from the first half.
    Glu {
        op: GluOp,
        swapped: bool,
    },
    RmsNorm {
        eps: f32,
    },
    Norm {
        eps: f32,
    },
    /// `[a, positions (I32, one per a.ne[2])]` or `[a, positions, freq_factors (F32, n_dims/2)]`;
    /// a [head_dim, n_head, n_tokens, 1].
    Rope(RopeParams),
    /// `[a]`, `[a, mask]` or `[a, mask, sinks]`: softmax over axis 0 of `a * scale + mask` (mask F32/F16
    /// [ne0, >= ne1, broadcast over ne2/ne3]); ALiBi slopes when `max_bias > 0`; sinks F32 [ne2] add one
    /// extra logit per head to the normaliser.
    SoftMax {
        scale: f32,
        max_bias: f32,
    },
    /// `[q, k, v]`, `[q, k, v, mask]`, `[q, k, v, mask, sinks]`: q [D, Nq, H, S], k [D, Nkv, Hkv, S],
    /// v [Dv, Nkv, Hkv, S] with H % Hkv == 0; mask F16/F32 [Nkv, >= Nq]; result F32 [Dv, H, Nq, S].
    /// `softcap > 0` applies `softcap * tanh(x / softcap)` to the scaled scores.
    FlashAttnExt {
        scale: f32,
        max_bias: f32,
        softcap: f32,
    },
    /// `[a, b]`: concatenation along `dim`.
    Concat {
        dim: usize,
    },
    /// `[a]` F32: I32 indices that sort each row.
    Argsort {
        order: SortOrder,
    },
    /// `[a]` F32: I32 indices of the k largest values of each row, largest first.
    TopK {
        k: usize,
    },
    /// `[a]`: sum of each row, result [1, ne1, ne2, ne3].
    SumRows,
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

const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

impl Op {
    /// The op's name, as printed in errors and graph dumps.
    pub fn name(&self) -> &'static str {
        match self {
            Op::None => "none",
            Op::View { .. } => "view",
            Op::Reshape => "reshape",
            Op::Permute { .. } => "permute",
            Op::Transpose => "transpose",
            Op::Cpy => "cpy",
            Op::Cont => "cont",
            Op::GetRows => "get_rows",
            Op::SetRows => "set_rows",
            Op::MulMat => "mul_mat",
            Op::MulMatId => "mul_mat_id",
            Op::Add => "add",
            Op::AddId => "add_id",
            Op::Sub => "sub",
            Op::Mul => "mul",
            Op::Div => "div",
            Op::Scale { .. } => "scale",
            Op::Clamp { .. } => "clamp",
            Op::Unary(u) => match u {
                UnaryOp::Silu => "silu",
                UnaryOp::Gelu => "gelu",
                UnaryOp::GeluErf => "gelu_erf",
                UnaryOp::Tanh => "tanh",
                UnaryOp::Exp => "exp",
                UnaryOp::Sigmoid => "sigmoid",
                UnaryOp::Neg => "neg",
                UnaryOp::Relu => "relu",
                UnaryOp::Sqr => "sqr",
                UnaryOp::Sqrt => "sqrt",
            },
            Op::Glu { op, .. } => match op {
                GluOp::Swiglu => "swiglu",
                GluOp::Geglu => "geglu",
                GluOp::GegluErf => "geglu_erf",
                GluOp::SwigluOai { .. } => "swiglu_oai",
            },
            Op::RmsNorm { .. } => "rms_norm",
            Op::Norm { .. } => "norm",
            Op::Rope(_) => "rope",
            Op::SoftMax { .. } => "soft_max",
            Op::FlashAttnExt { .. } => "flash_attn_ext",
            Op::Concat { .. } => "concat",
            Op::Argsort { .. } => "argsort",
            Op::TopK { .. } => "top_k",
            Op::SumRows => "sum_rows",
        }
    }

    /// True for ops that only reinterpret their source's bytes (no compute, no memory of their own).
    pub fn is_view(&self) -> bool {
        matches!(
            self,
            Op::View { .. } | Op::Reshape | Op::Permute { .. } | Op::Transpose
        )
    }

    /// True for ops whose result aliases their destination source (`cpy`, `set_rows`).
    pub fn writes_in_place(&self) -> bool {
        matches!(self, Op::Cpy | Op::SetRows)
    }

    /// The shape and type rule of every computed op: validates the sources and returns the result's
    /// element type and shape. `out_type` is the requested result type where the op allows a choice
    /// (`cont`); other ops ignore it.
    pub fn infer(&self, srcs: &[&Layout], out_type: Option<DType>) -> Result<(DType, [usize; 4])> {
        let name = self.name();
        match self {
            Op::None | Op::View { .. } | Op::Reshape | Op::Permute { .. } | Op::Transpose => {
                Err(shape_err(
                    name,
                    "layout ops are built by the graph builder, not inferred",
                ))
            }
            Op::Cpy => {
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
            Op::Cont => {
                expect_srcs(name, srcs, 1, 1)?;
                let t = out_type.unwrap_or(srcs[0].dtype);
                check_row_blocks(name, t, srcs[0].ne[0])?;
                Ok((t, srcs[0].ne))
            }
            Op::GetRows => {
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
            Op::SetRows => {
                expect_srcs(name, srcs, 3, 3)?;
                let (dst, src, ids) = (srcs[0], srcs[1], srcs[2]);
                expect_type(name, "src", src.dtype, &[DType::F32])?;
                expect_type(name, "ids", ids.dtype, &[DType::I32])?;
                check_row_blocks(name, dst.dtype, dst.ne[0])?;
                if src.ne[0] != dst.ne[0] || ids.ne[0] != src.ne[1] {
                    return Err(shape_err(
                        name,
                        format!("dst {:?}, src {:?}, ids {:?}", dst.ne, src.ne, ids.ne),
                    ));
                }
                if !src.ne[2].is_multiple_of(ids.ne[1])
                    || !src.ne[3].is_multiple_of(ids.ne[2])
                    || dst.ne[2] != src.ne[2]
                    || dst.ne[3] != src.ne[3]
                {
                    return Err(shape_err(
                        name,
                        format!("dst {:?}, src {:?}, ids {:?}", dst.ne, src.ne, ids.ne),
                    ));
                }
                Ok((dst.dtype, dst.ne))
            }
            Op::MulMat => {
                expect_srcs(name, srcs, 2, 2)?;
                let (a, b) = (srcs[0], srcs[1]);
                if a.ne[0] != b.ne[0]
                    || !b.ne[2].is_multiple_of(a.ne[2])
                    || !b.ne[3].is_multiple_of(a.ne[3])
                {
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
            Op::MulMatId => {
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
            Op::Add | Op::Sub | Op::Mul | Op::Div => {
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
            Op::AddId => {
                expect_srcs(name, srcs, 3, 3)?;
                let (a, b, ids) = (srcs[0], srcs[1], srcs[2]);
                expect_type(name, "a", a.dtype, &[DType::F32])?;
                expect_type(name, "b", b.dtype, &[DType::F32])?;
                expect_type(name, "ids", ids.dtype, &[DType::I32])?;
                if b.ne[0] != a.ne[0]
                    || ids.ne[0] != a.ne[1]
                    || ids.ne[1] != a.ne[2]
                    || a.ne[3] != 1
                {
                    return Err(shape_err(
                        name,
                        format!("a {:?}, b {:?}, ids {:?}", a.ne, b.ne, ids.ne),
                    ));
                }
                Ok((DType::F32, a.ne))
            }
            Op::Scale { .. } | Op::Clamp { .. } | Op::Unary(_) => {
                expect_srcs(name, srcs, 1, 1)?;
                expect_type(name, "a", srcs[0].dtype, &FLOATS)?;
                Ok((srcs[0].dtype, srcs[0].ne))
            }
            Op::Glu { .. } => {
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
            Op::RmsNorm { .. } | Op::Norm { .. } | Op::SumRows => {
                expect_srcs(name, srcs, 1, 1)?;
                expect_type(name, "a", srcs[0].dtype, &[DType::F32])?;
                let ne = srcs[0].ne;
                Ok((
                    DType::F32,
                    if *self == Op::SumRows {
                        [1, ne[1], ne[2], ne[3]]
                    } else {
                        ne
                    },
                ))
            }
            Op::Rope(p) => {
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
            Op::SoftMax { .. } => {
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
                    expect_type(name, "sinks", s.dtype, &[DType::F32])?;
                    if s.ne[0] != a.ne[2] {
                        return Err(shape_err(
                            name,
                            format!("sinks {:?} for {} heads", s.ne, a.ne[2]),
                        ));
                    }
                }
                Ok((DType::F32, a.ne))
            }
            Op::FlashAttnExt { .. } => {
                expect_srcs(name, srcs, 3, 5)?;
                let (q, k, v) = (srcs[0], srcs[1], srcs[2]);
                expect_type(name, "q", q.dtype, &[DType::F32])?;
                expect_type(
                    name,
                    "k",
                    k.dtype,
                    &[
                        DType::F32,
                        DType::F16,
                        DType::BF16,
                        DType::Q8_0,
                        DType::Q4_0,
                    ],
                )?;
                expect_type(
                    name,
                    "v",
                    v.dtype,
                    &[
                        DType::F32,
                        DType::F16,
                        DType::BF16,
                        DType::Q8_0,
                        DType::Q4_0,
                    ],
                )?;
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
                    expect_type(name, "sinks", s.dtype, &[DType::F32])?;
                    if s.ne[0] != q.ne[2] {
                        return Err(shape_err(
                            name,
                            format!("sinks {:?} for {} heads", s.ne, q.ne[2]),
                        ));
                    }
                }
                Ok((DType::F32, [v.ne[0], q.ne[2], q.ne[1], q.ne[3]]))
            }
            Op::Concat { dim } => {
                expect_srcs(name, srcs, 2, 2)?;
                let (a, b) = (srcs[0], srcs[1]);
                if *dim > 3 || a.dtype != b.dtype || (0..4).any(|d| d != *dim && a.ne[d] != b.ne[d])
                {
                    return Err(shape_err(
                        name,
                        format!("cannot concat {:?} and {:?} on {dim}", a.ne, b.ne),
                    ));
                }
                if a.dtype.is_quantized() {
                    return Err(shape_err(name, "quantized concat"));
                }
                let mut ne = a.ne;
                ne[*dim] += b.ne[*dim];
                Ok((a.dtype, ne))
            }
            Op::Argsort { .. } => {
                expect_srcs(name, srcs, 1, 1)?;
                expect_type(name, "a", srcs[0].dtype, &[DType::F32])?;
                Ok((DType::I32, srcs[0].ne))
            }
            Op::TopK { k } => {
                expect_srcs(name, srcs, 1, 1)?;
                let a = srcs[0];
                expect_type(name, "a", a.dtype, &[DType::F32])?;
                if *k == 0 || *k > a.ne[0] {
                    return Err(shape_err(name, format!("k = {k} for rows of {}", a.ne[0])));
                }
                Ok((DType::I32, [*k, a.ne[1], a.ne[2], a.ne[3]]))
            }
        }
    }
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

/// Hashes an op and its parameters (floats by their bits), for plan and program caches.
impl std::hash::Hash for Op {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        std::mem::discriminant(self).hash(h);
        let bits = |v: &[f32], h: &mut H| v.iter().for_each(|x| x.to_bits().hash(h));
        match self {
            Op::View { offset } => offset.hash(h),
            Op::Permute { axes } => axes.hash(h),
            Op::Scale { scale, bias } => bits(&[*scale, *bias], h),
            Op::Clamp { min, max } => bits(&[*min, *max], h),
            Op::Unary(u) => u.hash(h),
            Op::Glu { op, swapped } => {
                swapped.hash(h);
                std::mem::discriminant(op).hash(h);
                if let GluOp::SwigluOai { alpha, limit } = op {
                    bits(&[*alpha, *limit], h);
                }
            }
            Op::RmsNorm { eps } | Op::Norm { eps } => bits(&[*eps], h),
            Op::Rope(p) => {
                (p.mode, p.n_dims, p.n_ctx_orig).hash(h);
                bits(
                    &[
                        p.freq_base,
                        p.freq_scale,
                        p.ext_factor,
                        p.attn_factor,
                        p.beta_fast,
                        p.beta_slow,
                    ],
                    h,
                );
            }
            Op::SoftMax { scale, max_bias } => bits(&[*scale, *max_bias], h),
            Op::FlashAttnExt {
                scale,
                max_bias,
                softcap,
            } => bits(&[*scale, *max_bias, *softcap], h),
            Op::Concat { dim } => dim.hash(h),
            Op::Argsort { order } => order.hash(h),
            Op::TopK { k } => k.hash(h),
            Op::None
            | Op::Reshape
            | Op::Transpose
            | Op::Cpy
            | Op::Cont
            | Op::GetRows
            | Op::SetRows
            | Op::MulMat
            | Op::MulMatId
            | Op::Add
            | Op::AddId
            | Op::Sub
            | Op::Mul
            | Op::Div
            | Op::SumRows => {}
        }
    }
}
