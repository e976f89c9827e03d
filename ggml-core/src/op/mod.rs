//! The operations of the graph: each op's parameters, name and hash. Their shape and type rules
//! ([`Op::infer`]) live in the `infer` submodule, one function per op family. View-like ops (view,
//! reshape, permute, transpose) get their layouts from the graph builder and are never computed.

mod infer;

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
    /// `ln(1 + eˣ)`.
    Softplus,
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
    /// Rotate adjacent pairs (`x[2i]`, `x[2i+1]`) (Llama).
    Normal,
    /// Rotate halves (`x[i]`, `x[i + n_dims/2]`) (GPT-NeoX, Qwen, Gemma).
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

/// How the key heads of [`Op::GatedDeltaNet`] are shared by its value heads (`ratio` value heads
/// per key head).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HeadShare {
    /// Value head `h` reads key head `h / ratio` (each key head's value heads side by side).
    Grouped,
    /// Value head `h` reads key head `h % n_key_heads` (whole copies of the key heads in turn).
    Tiled,
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
    /// [ne0, >= ne1, broadcast over ne2/ne3]); ALiBi slopes when `max_bias > 0`; sinks F32 `[ne2]` add one
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
    /// `[q, k, v, gates, state]`, all F32: the gated delta rule over `T` tokens, per value head,
    /// on the state `S[key, value]`: `S ← e^g S`, `S ← S + β k (v - Sᵀk)ᵀ`, `o = Sᵀq`. q and k
    /// `[Dk, Hk, T]`, v `[Dv, H, T]` (H a multiple of Hk, key heads shared as `heads` says), gates
    /// `[H, T, 2]` (the log decay g, then β), state `[Dk, Dv, H]`. Result `[Dv, H, T + Dk]`: the outputs
    /// `o` `[Dv, H, T]`, then the final state (its `Dk·Dv·H` elements in the layout of `state`).
    GatedDeltaNet {
        heads: HeadShare,
    },
}

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
                UnaryOp::Softplus => "softplus",
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
            Op::GatedDeltaNet { .. } => "gated_delta_net",
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
            Op::GatedDeltaNet { heads } => heads.hash(h),
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
