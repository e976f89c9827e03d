//! Hyper-parameters of a model, read from GGUF metadata (`<arch>.embedding_length`, ...). Keys every
//! architecture needs are read here; architecture-specific ones (sliding-window pattern, expert counts)
//! by the architecture's own module through [`Meta`].

use super::ModelError;
use ggml_core::gguf::{Array, GgufFile, Value};
use ggml_core::{RopeMode, RopeParams};

/// The architectures this runtime can build graphs for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Qwen3Moe,
    Gemma3,
    GptOss,
    Qwen35,
    Qwen35Moe,
    Qwen3Next,
    Gemma4,
}

impl Arch {
    /// The architecture named by `general.architecture`.
    pub fn from_name(name: &str) -> Option<Arch> {
        Some(match name {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "qwen3moe" => Arch::Qwen3Moe,
            "gemma3" => Arch::Gemma3,
            "gpt-oss" => Arch::GptOss,
            "qwen35" => Arch::Qwen35,
            "qwen35moe" => Arch::Qwen35Moe,
            "qwen3next" => Arch::Qwen3Next,
            "gemma4" => Arch::Gemma4,
            _ => return None,
        })
    }

    /// The GGUF name (and metadata key prefix).
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Gemma3 => "gemma3",
            Arch::GptOss => "gpt-oss",
            Arch::Qwen35 => "qwen35",
            Arch::Qwen35Moe => "qwen35moe",
            Arch::Qwen3Next => "qwen3next",
            Arch::Gemma4 => "gemma4",
        }
    }

    /// Whether one forward pass may hold the tokens of several sequences: true where a sequence's
    /// only state is its KV cache region; an architecture with a recurrent per-sequence state runs
    /// one sequence per pass.
    pub fn batches_sequences(self) -> bool {
        match self {
            Arch::Llama
            | Arch::Qwen2
            | Arch::Qwen3
            | Arch::Qwen3Moe
            | Arch::Gemma3
            | Arch::GptOss
            | Arch::Gemma4 => true,
            // Delta-net layers: a pass updates the recurrent state of its one sequence.
            Arch::Qwen35 | Arch::Qwen35Moe | Arch::Qwen3Next => false,
        }
    }
}

/// Typed access to `<arch>.<key>` metadata with errors that name the key.
pub struct Meta<'a> {
    pub file: &'a GgufFile,
    pub prefix: &'static str,
}

impl Meta<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.prefix)
    }

    /// A required integer.
    pub fn usize(&self, k: &str) -> Result<usize, ModelError> {
        let key = self.key(k);
        match self.file.get(&key) {
            None => Err(ModelError::MissingKey(key)),
            Some(v) => v.as_usize().ok_or(ModelError::BadKey {
                key,
                msg: format!("expected an integer, found {}", v.describe()),
            }),
        }
    }

    /// An optional integer.
    pub fn opt_usize(&self, k: &str) -> Result<Option<usize>, ModelError> {
        match self.file.get(&self.key(k)) {
            None => Ok(None),
            Some(_) => self.usize(k).map(Some),
        }
    }

    /// An optional float.
    pub fn opt_f32(&self, k: &str) -> Result<Option<f32>, ModelError> {
        let key = self.key(k);
        match self.file.get(&key) {
            None => Ok(None),
            Some(v) => v.as_f32().map(Some).ok_or(ModelError::BadKey {
                key,
                msg: format!("expected a float, found {}", v.describe()),
            }),
        }
    }

    /// A required float.
    pub fn f32(&self, k: &str) -> Result<f32, ModelError> {
        self.opt_f32(k)?
            .ok_or_else(|| ModelError::MissingKey(self.key(k)))
    }

    /// An optional array of integers.
    pub fn opt_ints(&self, k: &str) -> Result<Option<Vec<i64>>, ModelError> {
        let key = self.key(k);
        match self.file.get(&key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .and_then(|a| a.to_ints())
                .map(Some)
                .ok_or(ModelError::BadKey {
                    key,
                    msg: format!("expected an array of integers, found {}", v.describe()),
                }),
        }
    }

    /// An optional string.
    pub fn opt_str(&self, k: &str) -> Option<&str> {
        self.file.get(&self.key(k)).and_then(|v| v.as_str())
    }

    /// An optional per-layer integer: one integer for every layer, or an array of `n_layer` integers.
    pub fn opt_per_layer(&self, k: &str, n_layer: usize) -> Result<Option<Vec<usize>>, ModelError> {
        let key = self.key(k);
        let Some(v) = self.file.get(&key) else {
            return Ok(None);
        };
        let values = match v {
            Value::Array(a) => a.to_ints::<usize>().filter(|x| x.len() == n_layer),
            other => other.as_usize().map(|x| vec![x; n_layer]),
        };
        values.map(Some).ok_or(ModelError::BadKey {
            key,
            msg: format!(
                "expected an integer or {n_layer} integers, found {}",
                v.describe()
            ),
        })
    }

    /// An optional array of `n_layer` booleans.
    pub fn opt_flags(&self, k: &str, n_layer: usize) -> Result<Option<Vec<bool>>, ModelError> {
        let key = self.key(k);
        match self.file.get(&key) {
            None => Ok(None),
            Some(Value::Array(Array::Bool(v))) if v.len() == n_layer => Ok(Some(v.clone())),
            Some(v) => Err(ModelError::BadKey {
                key,
                msg: format!("expected {n_layer} booleans, found {}", v.describe()),
            }),
        }
    }
}

/// Mixture-of-experts sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeConfig {
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
    /// Width of the shared expert that runs next to the routed ones (0: none).
    pub n_ff_shexp: usize,
}

/// How the value heads of a gated delta net share the key heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyHeadMap {
    /// Value head `h` uses key head `h mod n_k_heads` (Qwen3.5).
    Tiled,
    /// Value head `h` uses key head `h / (n_v_heads / n_k_heads)` (Qwen3-Next).
    Grouped,
}

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
    /// Width of the per-layer token embeddings fed to every layer (Gemma 4; 0: none).
    pub n_embd_per_layer: usize,
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
        let m = Meta {
            file,
            prefix: arch.name(),
        };
        let n_embd = m.usize("embedding_length")?;
        let n_layer = m.usize("block_count")?;
        let n_head = m.usize("attention.head_count")?;
        if n_head == 0 || n_embd == 0 || n_layer == 0 {
            return Err(ModelError::BadKey {
                key: format!("{}.attention.head_count", arch.name()),
                msg: "head count, width and block count must be positive".into(),
            });
        }
        let kv_heads = m
            .opt_per_layer("attention.head_count_kv", n_layer)?
            .unwrap_or_else(|| vec![n_head; n_layer]);
        if let Some(&bad) = kv_heads.iter().find(|&&k| k == 0 || n_head % k != 0) {
            return Err(ModelError::BadKey {
                key: format!("{}.attention.head_count_kv", arch.name()),
                msg: format!("{bad} KV heads for {n_head} query heads"),
            });
        }
        let n_head_kv = kv_heads.iter().copied().max().unwrap_or(n_head);
        let ff_widths = m
            .opt_per_layer("feed_forward_length", n_layer)?
            .unwrap_or_else(|| vec![0; n_layer]);
        let head_dim = m
            .opt_usize("attention.key_length")?
            .unwrap_or(n_embd / n_head);
        let head_dim_v = m.opt_usize("attention.value_length")?.unwrap_or(head_dim);
        let n_rot = m.opt_usize("rope.dimension_count")?.unwrap_or(head_dim);
        let n_ctx_train = m.opt_usize("context_length")?.unwrap_or(4096);
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
                    .opt_usize("rope.scaling.original_context_length")?
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
            n_embd_per_layer: 0,
            final_logit_softcap: None,
        })
    }

    /// Reads the sliding window and marks layer `l` as windowed where `is_swa(l)`.
    pub fn set_swa(&mut self, m: &Meta, is_swa: impl Fn(usize) -> bool) -> Result<(), ModelError> {
        self.n_swa = m.opt_usize("attention.sliding_window")?.unwrap_or(0);
        if self.n_swa > 0 {
            self.swa_layers = (0..self.n_layer).map(is_swa).collect();
        }
        Ok(())
    }

    /// Reads the expert counts.
    pub fn set_moe(&mut self, m: &Meta) -> Result<(), ModelError> {
        let moe = MoeConfig {
            n_expert: m.usize("expert_count")?,
            n_expert_used: m.usize("expert_used_count")?,
            n_ff_exp: m.usize("expert_feed_forward_length")?,
            n_ff_shexp: m
                .opt_usize("expert_shared_feed_forward_length")?
                .unwrap_or(0),
        };
        if moe.n_expert_used == 0 || moe.n_expert_used > moe.n_expert {
            return Err(ModelError::BadKey {
                key: format!("{}.expert_used_count", self.arch.name()),
                msg: format!("{} of {} experts", moe.n_expert_used, moe.n_expert),
            });
        }
        self.moe = Some(moe);
        Ok(())
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

    /// The rotary embedding of layer `l`.
    pub fn rope_of(&self, l: usize) -> RopeParams {
        if self.swa_layers[l] {
            self.rope_swa
        } else {
            self.rope
        }
    }
}
