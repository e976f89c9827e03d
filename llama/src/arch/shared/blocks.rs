//! The weights of the building blocks shared by the architectures (attention, optionally with a gated
//! query, dense FFN, mixture of experts with an optional shared expert, norms; the layer's token
//! mixer is attention or a [`DeltaNet`]), how each is read from the file, and the split each weight
//! declares for tensor parallelism: Q/K/V rows by whole GQA groups, the output projection and FFN
//! down projection by columns (their partial sums are reduced), FFN gate/up rows, KV cache by KV
//! heads, norms and routers mirrored. A block whose sizes cannot be cut that way (granularity larger
//! than the axis) stays mirrored, and so does one that would be cut into a single unit (e.g. a layer
//! whose query heads all share one KV head: a single GQA group).
//!
//! Attention and FFN are each cut on their own, not against each other: each ends in its own
//! AllReduce (two joins a layer), so cutting a layer's FFN unevenly the other way where its whole
//! GQA groups do not divide among the devices (3 over 2) would add a second uneven stage instead of
//! evening out the first (measured, BENCHMARKS.md). CPU devices even out an uneven stage while it
//! runs: a driver done with its share runs tasks of the other devices' ops.

use super::config::{AttnShape, ModelConfig};
use super::delta_net::DeltaNet;
use super::hooks::CustomFfn;
use crate::error::ModelError;
use crate::load::{Home, Loader, Weight};
use backend_meta::WeightSplit;
use ggml_core::{DType, GluOp};

/// Splits of one attention block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttnSplits {
    pub q_rows: WeightSplit,
    pub kv_rows: WeightSplit,
    pub o_cols: WeightSplit,
    pub q_bias: WeightSplit,
    pub kv_bias: WeightSplit,
    pub sinks: WeightSplit,
    /// KV cache `[head_dim, n_ctx, n_head_kv]`, split by KV heads.
    pub cache: WeightSplit,
}

impl AttnSplits {
    fn mirrored() -> AttnSplits {
        let m = WeightSplit::Mirrored;
        AttnSplits {
            q_rows: m.clone(),
            kv_rows: m.clone(),
            o_cols: m.clone(),
            q_bias: m.clone(),
            kv_bias: m.clone(),
            sinks: m.clone(),
            cache: m,
        }
    }

    /// Splits by whole GQA groups, with the granularity rounded up so that the output projection's
    /// columns are whole quant blocks (`o_type`).
    fn new(shape: AttnShape, o_type: DType) -> AttnSplits {
        let (hd, nh, nkv) = (shape.head_dim, shape.n_head, shape.n_head_kv);
        let group = nh / nkv;
        let q_gran = lcm(hd * group, o_type.block_size());
        // One unit (e.g. a single KV head) would put the whole block on one device: mirror it.
        if shape.head_dim_v != hd || !(nh * hd).is_multiple_of(q_gran) || nh * hd / q_gran < 2 {
            return AttnSplits::mirrored();
        }
        let heads = q_gran / hd;
        let kv_heads = heads / group;
        AttnSplits {
            q_rows: WeightSplit::axis(1, nh * hd, q_gran),
            kv_rows: WeightSplit::axis(1, nkv * hd, kv_heads * hd),
            o_cols: WeightSplit::axis(0, nh * hd, q_gran),
            q_bias: WeightSplit::axis(0, nh * hd, q_gran),
            kv_bias: WeightSplit::axis(0, nkv * hd, kv_heads * hd),
            sinks: WeightSplit::axis(0, nh, heads),
            cache: WeightSplit::axis(2, nkv, kv_heads),
        }
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn lcm(a: usize, b: usize) -> usize {
    a / gcd(a, b) * b
}

/// Splits of an FFN (dense or experts) of width `n_ff`: gate/up rows and down columns cut alike.
fn ffn_splits(n_ff: usize, down_type: DType) -> (WeightSplit, WeightSplit, WeightSplit) {
    let gran = down_type.block_size();
    if !n_ff.is_multiple_of(gran) || n_ff / gran < 2 {
        let m = WeightSplit::Mirrored;
        return (m.clone(), m.clone(), m);
    }
    (
        WeightSplit::axis(1, n_ff, gran),
        WeightSplit::axis(0, n_ff, gran),
        WeightSplit::axis(0, n_ff, gran),
    )
}

/// Which optional parts an architecture's attention has.
#[derive(Clone, Copy, Debug, Default)]
pub struct AttnSpec {
    /// Per-head RMS norms of Q and K (required when set).
    pub qk_norm: bool,
    /// Attention sinks, one logit per head (required when set).
    pub sinks: bool,
}

/// Variations of an attention block (all off by default).
#[derive(Clone, Copy, Debug, Default)]
pub struct AttnVariant {
    /// `attn_q` yields per head the query then an output gate; the two halves load as separate
    /// projections (Qwen3.5, Qwen3-Next).
    pub q_gate: bool,
    /// Without `attn_v`, V is the K projection (before K's norm and rotation; Gemma 4).
    pub v_may_be_k: bool,
    /// V is RMS-normalised per head, without a weight (Gemma 4).
    pub v_norm: bool,
    /// The layer rotates without the file's `rope_freqs` (Gemma 4's sliding-window layers).
    pub no_rope_freqs: bool,
}

/// Weights of one attention block (biases optional).
pub struct Attention {
    pub wq: Weight,
    /// `None` on a layer that attends to an earlier layer's KV cache ([`ModelConfig::kv_source`]):
    /// it has no K and V projections.
    pub wk: Option<Weight>,
    /// `None` when V is the K projection (or the layer has no K/V projections).
    pub wv: Option<Weight>,
    pub wo: Weight,
    pub bq: Option<Weight>,
    pub bk: Option<Weight>,
    pub bv: Option<Weight>,
    pub bo: Option<Weight>,
    pub q_norm: Option<Weight>,
    pub k_norm: Option<Weight>,
    pub sinks: Option<Weight>,
    /// V is RMS-normalised per head, without a weight (Gemma 4).
    pub v_norm: bool,
    /// Rotary frequency factors (Llama 3 long-context scaling, Gemma 4 partial rotation), per layer so
    /// that it lives with it.
    pub rope_freqs: Option<Weight>,
    /// Output gate projection `[n_embd, n_head * head_dim]` (split like the queries): the attention
    /// output is multiplied by its sigmoid (Qwen3.5, Qwen3-Next).
    pub gate: Option<Weight>,
    pub splits: AttnSplits,
}

/// The name of layer `l`'s tensor `name` (`blk.<l>.<name>`).
pub(crate) fn blk(l: usize, name: &str) -> String {
    format!("blk.{l}.{name}")
}

impl Attention {
    pub fn load(
        ld: &Loader,
        cfg: &ModelConfig,
        l: usize,
        spec: AttnSpec,
    ) -> Result<Attention, ModelError> {
        Attention::load_variant(ld, cfg, l, spec, AttnVariant::default())
    }

    /// Loads layer `l`'s attention of shape [`ModelConfig::attn_shape`] with the variations `variant`;
    /// a layer that reads another layer's cache loads no K/V weights and cuts its heads like that
    /// layer.
    pub fn load_variant(
        ld: &Loader,
        cfg: &ModelConfig,
        l: usize,
        spec: AttnSpec,
        variant: AttnVariant,
    ) -> Result<Attention, ModelError> {
        let shape = cfg.attn_shape(l);
        let (d, hd, nh, nkv) = (cfg.n_embd, shape.head_dim, shape.n_head, shape.n_head_kv);
        let hv = shape.head_dim_v;
        let own_kv = cfg.kv_source[l] == l;
        let home = Home::LayerLike {
            layer: l,
            like: cfg.kv_source[l],
        };
        let o_name = blk(l, "attn_output.weight");
        let o_type = ld
            .info(&o_name)
            .map(|i| i.0)
            .ok_or_else(|| ModelError::MissingTensor(o_name.clone()))?;
        let s = if ld.tensor_parallel() {
            AttnSplits::new(shape, o_type)
        } else {
            AttnSplits::mirrored()
        };
        let m = || WeightSplit::Mirrored;
        let norm = |name: &str, req: bool| -> Result<Option<Weight>, ModelError> {
            if req {
                ld.get(&blk(l, name), &[hd], m(), home).map(Some)
            } else {
                Ok(None)
            }
        };
        let q_name = blk(l, "attn_q.weight");
        let q_part = |start: usize| {
            ld.get_row_groups(
                &q_name,
                [d, 2 * nh * hd],
                2 * hd,
                start,
                hd,
                s.q_rows.clone(),
                home,
            )
        };
        let (wq, gate) = if variant.q_gate {
            (q_part(0)?, Some(q_part(hd)?))
        } else {
            (
                ld.get(&q_name, &[d, nh * hd], s.q_rows.clone(), home)?,
                None,
            )
        };
        let kv = |name: &str, width: usize| {
            ld.get(&blk(l, name), &[d, nkv * width], s.kv_rows.clone(), home)
        };
        let has_v = ld.info(&blk(l, "attn_v.weight")).is_some();
        let wv = if own_kv && (has_v || !variant.v_may_be_k) {
            Some(kv("attn_v.weight", hv)?)
        } else {
            None
        };
        if own_kv && wv.is_none() && hv != hd {
            return Err(ModelError::BadTensor {
                name: blk(l, "attn_v.weight"),
                msg: format!("missing, and K (head size {hd}) cannot stand in for V of {hv}"),
            });
        }
        let rope_freqs = if variant.no_rope_freqs {
            None
        } else {
            ld.opt("rope_freqs.weight", &[cfg.rope_of(l).n_dims / 2], m(), home)?
        };
        Ok(Attention {
            wq,
            wk: own_kv.then(|| kv("attn_k.weight", hd)).transpose()?,
            wv,
            wo: ld.get(&o_name, &[nh * hv, d], s.o_cols.clone(), home)?,
            bq: ld.opt(&blk(l, "attn_q.bias"), &[nh * hd], s.q_bias.clone(), home)?,
            bk: ld.opt(&blk(l, "attn_k.bias"), &[nkv * hd], s.kv_bias.clone(), home)?,
            bv: ld.opt(&blk(l, "attn_v.bias"), &[nkv * hv], s.kv_bias.clone(), home)?,
            bo: ld.opt(&blk(l, "attn_output.bias"), &[d], m(), home)?,
            q_norm: norm("attn_q_norm.weight", spec.qk_norm)?,
            k_norm: norm("attn_k_norm.weight", spec.qk_norm && own_kv)?,
            sinks: if spec.sinks {
                Some(ld.get(&blk(l, "attn_sinks.weight"), &[nh], s.sinks.clone(), home)?)
            } else {
                None
            },
            v_norm: variant.v_norm,
            rope_freqs,
            gate,
            splits: s,
        })
    }
}

/// A dense gated FFN.
pub struct Dense {
    pub gate: Weight,
    pub up: Weight,
    pub down: Weight,
    pub act: GluOp,
}

impl Dense {
    pub fn load(ld: &Loader, cfg: &ModelConfig, l: usize, act: GluOp) -> Result<Dense, ModelError> {
        Dense::load_named(ld, cfg, l, "", cfg.n_ff_of(l), act)
    }

    /// `blk.<l>.ffn_{gate,up,down}<suffix>.weight` of width `f`.
    fn load_named(
        ld: &Loader,
        cfg: &ModelConfig,
        l: usize,
        suffix: &str,
        f: usize,
        act: GluOp,
    ) -> Result<Dense, ModelError> {
        let d = cfg.n_embd;
        let home = Home::Layer(l);
        let name = |part: &str| blk(l, &format!("ffn_{part}{suffix}.weight"));
        let down = name("down");
        let down_type = ld.info(&down).map(|i| i.0).unwrap_or(DType::F32);
        let (rows, _, cols) = ffn_splits(f, down_type);
        Ok(Dense {
            gate: ld.get(&name("gate"), &[d, f], rows.clone(), home)?,
            up: ld.get(&name("up"), &[d, f], rows, home)?,
            down: ld.get(&down, &[f, d], cols, home)?,
            act,
        })
    }
}

/// A shared expert: a dense FFN every token runs next to the routed experts, optionally scaled per
/// token by the sigmoid of a learned gate (Qwen3-Next, Qwen3.5-MoE).
pub struct SharedExpert {
    pub ffn: Dense,
    /// `[n_embd]` gate vector (mirrored).
    pub gate: Option<Weight>,
}

impl SharedExpert {
    /// The `*_shexp` tensors of layer `l`, if the file has them.
    fn load(
        ld: &Loader,
        cfg: &ModelConfig,
        l: usize,
        n_ff: usize,
        act: GluOp,
    ) -> Result<Option<SharedExpert>, ModelError> {
        if n_ff == 0 || ld.info(&blk(l, "ffn_up_shexp.weight")).is_none() {
            return Ok(None);
        }
        Ok(Some(SharedExpert {
            ffn: Dense::load_named(ld, cfg, l, "_shexp", n_ff, act)?,
            gate: ld.opt(
                &blk(l, "ffn_gate_inp_shexp.weight"),
                &[cfg.n_embd],
                WeightSplit::Mirrored,
                Home::Layer(l),
            )?,
        }))
    }
}

/// How router scores become expert weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over all experts, top-k, optionally renormalised to sum 1 (Qwen3-MoE).
    Softmax { renorm: bool },
    /// Top-k of the raw scores, softmax over the k chosen (gpt-oss).
    SoftmaxOfTopK,
}

/// The expert projections whose results feed the gated activation.
pub enum ExpertsIn {
    /// Gate and up experts `[n_embd, n_ff_exp, n_expert]`.
    Separate { gate: Weight, up: Weight },
    /// Gate and up experts fused along the rows, `[n_embd, 2 · n_ff_exp, n_expert]`, gate first
    /// (`ffn_gate_up_exps`, Gemma 4).
    Fused(Weight),
}

/// A mixture-of-experts FFN (biases optional).
pub struct Moe {
    pub router: Weight,
    pub router_b: Option<Weight>,
    pub experts_in: ExpertsIn,
    pub down: Weight,
    /// Biases of separate gate and up experts.
    pub gate_b: Option<Weight>,
    pub up_b: Option<Weight>,
    pub down_b: Option<Weight>,
    /// Per-expert output scale `[n_expert]` (`ffn_down_exps.scale`, Gemma 4).
    pub down_scale: Option<Weight>,
    pub gating: Gating,
    pub act: GluOp,
    pub n_used: usize,
    pub shared: Option<SharedExpert>,
}

impl Moe {
    pub fn load(
        ld: &Loader,
        cfg: &ModelConfig,
        l: usize,
        gating: Gating,
        act: GluOp,
    ) -> Result<Moe, ModelError> {
        let moe = cfg.moe.ok_or_else(|| {
            ModelError::Unsupported(format!("{} without expert counts", cfg.arch.name()))
        })?;
        let (d, f, e) = (cfg.n_embd, moe.n_ff_exp, moe.n_expert);
        let home = Home::Layer(l);
        let m = || WeightSplit::Mirrored;
        let down = blk(l, "ffn_down_exps.weight");
        let down_type = ld.info(&down).map(|i| i.0).unwrap_or(DType::F32);
        let (rows, bias, cols) = ffn_splits(f, down_type);
        let gate_up = blk(l, "ffn_gate_up_exps.weight");
        let experts_in = if ld.info(&gate_up).is_some() {
            // Both halves cut like the down projection's columns. Where an uneven cut's remainder
            // lands on different devices for the two halves, the meta backend gathers the
            // activation's input instead of pairing the slices.
            let fused_rows = match &rows {
                WeightSplit::Axis { segments, .. } => WeightSplit::Axis {
                    axis: 1,
                    segments: [segments.as_slice(), segments.as_slice()].concat(),
                },
                WeightSplit::InStep { .. } | WeightSplit::Mirrored => m(),
            };
            ExpertsIn::Fused(ld.get(&gate_up, &[d, 2 * f, e], fused_rows, home)?)
        } else {
            ExpertsIn::Separate {
                gate: ld.get(
                    &blk(l, "ffn_gate_exps.weight"),
                    &[d, f, e],
                    rows.clone(),
                    home,
                )?,
                up: ld.get(&blk(l, "ffn_up_exps.weight"), &[d, f, e], rows, home)?,
            }
        };
        Ok(Moe {
            router: ld.get(&blk(l, "ffn_gate_inp.weight"), &[d, e], m(), home)?,
            router_b: ld.opt(&blk(l, "ffn_gate_inp.bias"), &[e], m(), home)?,
            experts_in,
            down: ld.get(&down, &[f, d, e], cols, home)?,
            gate_b: ld.opt(&blk(l, "ffn_gate_exps.bias"), &[f, e], bias.clone(), home)?,
            up_b: ld.opt(&blk(l, "ffn_up_exps.bias"), &[f, e], bias, home)?,
            down_b: ld.opt(&blk(l, "ffn_down_exps.bias"), &[d, e], m(), home)?,
            down_scale: ld.opt(&blk(l, "ffn_down_exps.scale"), &[e], m(), home)?,
            gating,
            act,
            n_used: moe.n_expert_used,
            shared: SharedExpert::load(ld, cfg, l, moe.n_ff_shexp, act)?,
        })
    }
}

/// The feed-forward part of a layer.
pub enum Ffn {
    Dense(Box<Dense>),
    Moe(Box<Moe>),
    /// An architecture's own block (Gemma 4's dense FFN and experts side by side).
    Custom(Box<dyn CustomFfn>),
}

impl Ffn {
    /// A SwiGLU FFN: softmax top-k experts renormalised to sum 1 when the model has experts, else a
    /// dense one.
    pub fn swiglu(ld: &Loader, cfg: &ModelConfig, l: usize) -> Result<Ffn, ModelError> {
        Ok(if cfg.moe.is_some() {
            let gating = Gating::Softmax { renorm: true };
            Ffn::Moe(Box::new(Moe::load(ld, cfg, l, gating, GluOp::Swiglu)?))
        } else {
            Ffn::Dense(Box::new(Dense::load(ld, cfg, l, GluOp::Swiglu)?))
        })
    }
}

/// What mixes the tokens of a layer.
pub enum Mixer {
    /// Attention over the KV cache.
    Attention(Box<Attention>),
    /// A gated delta net carrying a recurrent state from call to call (no KV cache).
    DeltaNet(Box<DeltaNet>),
}

/// One transformer layer: pre-norms, token mixer, FFN, and the optional post-norms (Gemma) and output
/// scale (Gemma 4).
pub struct Layer {
    pub attn_norm: Weight,
    pub mixer: Mixer,
    pub attn_post_norm: Option<Weight>,
    pub ffn_norm: Weight,
    pub ffn: Ffn,
    pub ffn_post_norm: Option<Weight>,
    /// Scalar `[1]` the layer's output is multiplied by (Gemma 4's `layer_output_scale`).
    pub out_scale: Option<Weight>,
}

/// Loads the `[n_embd]` norm `blk.<l>.<name>.weight`.
pub fn layer_norm(
    ld: &Loader,
    cfg: &ModelConfig,
    l: usize,
    name: &str,
) -> Result<Weight, ModelError> {
    ld.get(
        &blk(l, &format!("{name}.weight")),
        &[cfg.n_embd],
        WeightSplit::Mirrored,
        Home::Layer(l),
    )
}

impl Layer {
    /// The common pre-norm layer: `attn_norm` → attention → residual, `ffn_norm` → FFN → residual.
    pub fn pre_norm(
        ld: &Loader,
        cfg: &ModelConfig,
        l: usize,
        spec: AttnSpec,
        ffn: Ffn,
    ) -> Result<Layer, ModelError> {
        Ok(Layer {
            attn_norm: layer_norm(ld, cfg, l, "attn_norm")?,
            mixer: Mixer::Attention(Box::new(Attention::load(ld, cfg, l, spec)?)),
            attn_post_norm: None,
            ffn_norm: layer_norm(ld, cfg, l, "ffn_norm")?,
            ffn,
            ffn_post_norm: None,
            out_scale: None,
        })
    }
}
