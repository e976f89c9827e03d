//! Hyper-parameters of a model, read from GGUF metadata (`<arch>.embedding_length`, ...). Keys every
//! architecture needs are read here; architecture-specific ones (sliding-window pattern, expert counts)
//! by the architecture's own module through [`Meta`].

use crate::arch::Arch;
use crate::error::ModelError;
use crate::load::{limits, Meta};
use ggml_core::gguf::GgufFile;
use ggml_core::{RopeMode, RopeParams};

/// Mixture-of-experts sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeConfig {
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
    /// Width of the shared expert that runs next to the routed ones (0: none).
    pub n_ff_shexp: usize,
}

/// How the value heads of a gated delta net share the key heads: `Tiled`, value head `h` uses key
/// head `h mod n_k_heads` (Qwen3.5); `Grouped`, key head `h / (n_v_heads / n_k_heads)` (Qwen3-Next).
pub use ggml_core::HeadShare as KeyHeadMap;

/// Sizes of the gated delta net (linear attention) layers of hybrid models.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeltaNetConfig {
    /// Length of the causal convolution over the Q/K/V channels.
    pub conv_kernel: usize,
    /// Size of every key and value head (the state of one head is `head_dim × head_dim`).
    pub head_dim: usize,
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub key_heads: KeyHeadMap,
    /// Per layer: true for a delta-net layer, false for a full-attention one.
    pub layers: Vec<bool>,
}

impl DeltaNetConfig {
    /// Channels of the convolution: queries, keys, then values.
    pub fn conv_channels(&self) -> usize {
        2 * self.head_dim * self.n_k_heads + self.head_dim * self.n_v_heads
    }
}

/// The attention shape of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Per-head size of queries and keys.
    pub head_dim: usize,
    /// Per-head size of values.
    pub head_dim_v: usize,
}

/// Hyper-parameters of one model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    /// KV heads (the most of any layer where layers differ, see [`ModelConfig::attn_shape`]).
    pub n_head_kv: usize,
    /// Per-head size of queries and keys.
    pub head_dim: usize,
    /// Per-head size of values.
    pub head_dim_v: usize,
    /// Dense feed-forward width (0 when the model has none; the widest where layers differ, see
    /// [`ModelConfig::n_ff_of`]).
    pub n_ff: usize,
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    /// Rotary embedding of full-attention layers.
    pub rope: RopeParams,
    /// Rotary embedding of sliding-window layers.
    pub rope_swa: RopeParams,
    /// Sliding-window size (0: none).
    pub n_swa: usize,
    /// Per layer: true when the layer uses the sliding window.
    pub swa_layers: Vec<bool>,
    pub moe: Option<MoeConfig>,
    /// Factor applied to the token embeddings (Gemma: √n_embd).
    pub embd_scale: Option<f32>,
    /// Scale of attention scores.
    pub attn_scale: f32,
    /// The delta-net layers of hybrid recurrent models (Qwen3.5, Qwen3-Next).
    pub delta_net: Option<DeltaNetConfig>,
    /// Per-layer attention shapes where layers differ (Gemma 4's local and global layers); empty when
    /// every layer has the shape given by the fields above.
    pub layer_attn: Vec<AttnShape>,
    /// Per-layer dense feed-forward widths where layers differ (Gemma 4); empty otherwise.
    pub layer_n_ff: Vec<usize>,
    /// Per layer: the layer whose KV cache it attends to; itself, or for Gemma 4's shared-KV layers an
    /// earlier layer of the same kind (the layer then has no K/V projections and no cache of its own).
    pub kv_source: Vec<usize>,
    /// Final logit soft-capping `c`: logits become `c · tanh(logits / c)` (Gemma 4).
    pub final_logit_softcap: Option<f32>,
}

impl ModelConfig {
    /// Reads the hyper-parameters every architecture shares; `rope_mode` is the architecture's rotary
    /// layout. `n_vocab` comes from the embedding table.
    pub fn common(
        file: &GgufFile,
        arch: Arch,
        rope_mode: RopeMode,
        n_vocab: usize,
    ) -> Result<ModelConfig, ModelError> {
        let m = arch.meta(file);
        let n_embd = m.count("embedding_length", limits::EMBD)?;
        let n_layer = m.count("block_count", limits::LAYERS)?;
        let n_head = m.count("attention.head_count", limits::HEADS)?;
        let kv_heads = m
            .opt_per_layer("attention.head_count_kv", n_layer, limits::HEADS)?
            .unwrap_or_else(|| vec![n_head; n_layer]);
        if let Some(&bad) = kv_heads.iter().find(|&&k| n_head % k != 0) {
            return Err(ModelError::BadKey {
                key: m.key("attention.head_count_kv"),
                msg: format!("{bad} KV heads for {n_head} query heads"),
            });
        }
        let n_head_kv = kv_heads.iter().copied().max().unwrap_or(n_head);
        let ff_widths = m
            .opt_per_layer("feed_forward_length", n_layer, limits::FF)?
            .unwrap_or_else(|| vec![0; n_layer]);
        let head_dim = match m.opt_count("attention.key_length", limits::HEAD_DIM)? {
            Some(d) => d,
            None => limits::HEAD_DIM.check(
                &format!(
                    "{} / {}",
                    m.key("embedding_length"),
                    m.key("attention.head_count")
                ),
                n_embd / n_head,
            )?,
        };
        let head_dim_v = m
            .opt_count("attention.value_length", limits::HEAD_DIM)?
            .unwrap_or(head_dim);
        let n_rot = m
            .opt_count("rope.dimension_count", limits::ROPE_DIMS)?
            .unwrap_or(head_dim);
        let n_ctx_train = m
            .opt_count("context_length", limits::CONTEXT)?
            .unwrap_or(4096);
        let freq_base = m.opt_f32("rope.freq_base")?.unwrap_or(10000.0);
        let mut rope = RopeParams::simple(rope_mode, n_rot, freq_base);
        rope.n_ctx_orig = n_ctx_train;
        let factor = m.opt_f32("rope.scaling.factor")?.unwrap_or(1.0);
        match m.opt_str("rope.scaling.type") {
            Some("linear") if factor > 0.0 => rope.freq_scale = 1.0 / factor,
            Some("yarn") if factor > 0.0 => {
                rope.freq_scale = 1.0 / factor;
                rope.ext_factor = 1.0;
                rope.n_ctx_orig = m
                    .opt_count("rope.scaling.original_context_length", limits::CONTEXT)?
                    .unwrap_or(n_ctx_train);
                rope.attn_factor = m.opt_f32("rope.scaling.attn_factor")?.unwrap_or(1.0);
                if let Some(b) = m.opt_f32("rope.scaling.yarn_beta_fast")? {
                    rope.beta_fast = b;
                }
                if let Some(b) = m.opt_f32("rope.scaling.yarn_beta_slow")? {
                    rope.beta_slow = b;
                }
            }
            None | Some("none") | Some("linear") | Some("yarn") => {}
            Some(other) => {
                return Err(ModelError::Unsupported(format!(
                    "rope scaling type {other:?}"
                )))
            }
        }
        let varies = |v: &[usize]| v.iter().any(|&x| x != v[0]);
        let layer_attn = if varies(&kv_heads) {
            kv_heads
                .iter()
                .map(|&n_head_kv| AttnShape {
                    n_head,
                    n_head_kv,
                    head_dim,
                    head_dim_v,
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok(ModelConfig {
            arch,
            n_vocab,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            head_dim_v,
            n_ff: ff_widths.iter().copied().max().unwrap_or(0),
            n_ctx_train,
            rms_eps: m.f32("attention.layer_norm_rms_epsilon")?,
            rope,
            rope_swa: rope,
            n_swa: 0,
            swa_layers: vec![false; n_layer],
            moe: None,
            embd_scale: None,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            delta_net: None,
            layer_attn,
            layer_n_ff: if varies(&ff_widths) {
                ff_widths
            } else {
                Vec::new()
            },
            kv_source: (0..n_layer).collect(),
            final_logit_softcap: None,
        })
    }

    /// Reads the sliding window and marks layer `l` as windowed where `is_swa(l)`.
    pub fn set_swa(&mut self, m: &Meta, is_swa: impl Fn(usize) -> bool) -> Result<(), ModelError> {
        self.n_swa = m
            .opt_count("attention.sliding_window", limits::WINDOW)?
            .unwrap_or(0);
        if self.n_swa > 0 {
            self.swa_layers = (0..self.n_layer).map(is_swa).collect();
        }
        Ok(())
    }

    /// Reads the expert counts.
    pub fn set_moe(&mut self, m: &Meta) -> Result<(), ModelError> {
        let moe = MoeConfig {
            n_expert: m.count("expert_count", limits::EXPERTS)?,
            n_expert_used: m.count("expert_used_count", limits::EXPERTS)?,
            n_ff_exp: m.count("expert_feed_forward_length", limits::FF)?,
            n_ff_shexp: m
                .opt_count("expert_shared_feed_forward_length", limits::FF)?
                .unwrap_or(0),
        };
        if moe.n_expert_used > moe.n_expert {
            return Err(ModelError::BadKey {
                key: m.key("expert_used_count"),
                msg: format!("{} of {} experts", moe.n_expert_used, moe.n_expert),
            });
        }
        self.moe = Some(moe);
        Ok(())
    }

    /// Checks what only the whole configuration shows: every layer's rotated dimensions are even and
    /// at most its head size (`rope.dimension_count`, or `rope.dimension_count_swa` where windowed
    /// layers rotate differently).
    pub fn check_rope(&self, m: &Meta) -> Result<(), ModelError> {
        let bad = |l: usize| {
            let r = self.rope_of(l).n_dims;
            r > self.attn_shape(l).head_dim || !r.is_multiple_of(2)
        };
        let Some(l) = (0..self.n_layer).find(|&l| bad(l)) else {
            return Ok(());
        };
        let own_swa = self.swa_layers[l] && self.rope_swa.n_dims != self.rope.n_dims;
        let key = if own_swa {
            "rope.dimension_count_swa"
        } else {
            "rope.dimension_count"
        };
        Err(ModelError::BadKey {
            key: m.key(key),
            msg: format!(
                "{} rotated dims in layer {l} with heads of {}",
                self.rope_of(l).n_dims,
                self.attn_shape(l).head_dim
            ),
        })
    }

    /// The attention shape of layer `l`.
    pub fn attn_shape(&self, l: usize) -> AttnShape {
        self.layer_attn.get(l).copied().unwrap_or(AttnShape {
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            head_dim: self.head_dim,
            head_dim_v: self.head_dim_v,
        })
    }

    /// The dense feed-forward width of layer `l`.
    pub fn n_ff_of(&self, l: usize) -> usize {
        self.layer_n_ff.get(l).copied().unwrap_or(self.n_ff)
    }

    /// The delta-net sizes; an error for a model without them.
    pub fn delta_net_sizes(&self) -> Result<&DeltaNetConfig, ModelError> {
        self.delta_net.as_ref().ok_or_else(|| {
            ModelError::Unsupported(format!("{} without delta-net sizes", self.arch.name()))
        })
    }

    /// The rotary embedding of layer `l`.
    pub fn rope_of(&self, l: usize) -> RopeParams {
        if self.swa_layers[l] {
            self.rope_swa
        } else {
            self.rope
        }
    }
}
