//! Gemma 4 (dense and mixture-of-experts): interleaved sliding-window ("local") and global layers
//! with their own head sizes and KV head counts, NeoX RoPE (local: base `rope.freq_base_swa` over
//! `rope.dimension_count_swa` dims; global: the file's base with `rope_freqs` factors, whose huge
//! entries leave most pairs unrotated), per-head Q/K RMSNorm with weights and V RMSNorm without,
//! attention scale 1, Gemma pre- and post-norms, GELU-gated FFNs whose width may differ per layer,
//! embeddings × √n_embd, a final logit soft-cap, and per layer a scalar output scale.
//!
//! Optional parts: the last `attention.shared_kv_layers` layers attend to the cache of the last
//! earlier layer of their kind and have no K/V projections; a global layer without `attn_v` uses its
//! K projection as V; per-layer token embeddings ([`PerLayerEmbd`], [`PerLayerInput`]) mix a slice
//! of a second embedding table into every layer's output; MoE files run a dense FFN and experts
//! side by side ([`DenseAndMoe`]).
//!
//! Tensor parallelism: attention splits by whole GQA groups like every architecture (a global layer
//! whose query heads all share one KV head is a single group, so it stays mirrored); the dense FFN
//! and the experts split by FFN rows; the per-layer-embedding weights stay mirrored (they are small,
//! and splitting them would cost one more all-reduce per layer).

use super::blocks::{
    blk, layer_norm, Attention, AttnSpec, AttnVariant, Dense, Ffn, Gating, Layer, Mixer, Moe,
};
use crate::model::config::{Arch, Meta, ModelConfig};
use crate::model::weights::{Home, Loader, Weight};
use crate::model::ModelError;
use backend_meta::WeightSplit;
use ggml_core::gguf::GgufFile;
use ggml_core::{GluOp, RopeMode};

#[cfg(test)]
mod tests;

pub fn config(file: &GgufFile, n_vocab: usize) -> Result<ModelConfig, ModelError> {
    let mut cfg = ModelConfig::common(file, Arch::Gemma4, RopeMode::Neox, n_vocab)?;
    let m = Meta {
        file,
        prefix: "gemma4",
    };
    let n = cfg.n_layer;
    let swa = m
        .opt_flags("attention.sliding_window_pattern", n)?
        .ok_or_else(|| ModelError::MissingKey("gemma4.attention.sliding_window_pattern".into()))?;
    cfg.set_swa(&m, |l| swa[l])?;
    let head_dim_swa = m
        .opt_usize("attention.key_length_swa")?
        .unwrap_or(cfg.head_dim);
    let head_dim_v_swa = m
        .opt_usize("attention.value_length_swa")?
        .unwrap_or(head_dim_swa);
    cfg.layer_attn = (0..n)
        .map(|l| {
            let mut shape = cfg.attn_shape(l);
            if swa[l] {
                shape.head_dim = head_dim_swa;
                shape.head_dim_v = head_dim_v_swa;
            }
            shape
        })
        .collect();
    cfg.rope_swa.n_dims = m
        .opt_usize("rope.dimension_count_swa")?
        .unwrap_or(head_dim_swa);
    if let Some(base) = m.opt_f32("rope.freq_base_swa")? {
        cfg.rope_swa.freq_base = base;
    }
    if swa.iter().any(|&s| s) && cfg.n_swa == 0 {
        return Err(ModelError::MissingKey(
            "gemma4.attention.sliding_window".into(),
        ));
    }
    let bad_rope = |l: usize| {
        let r = cfg.rope_of(l).n_dims;
        r > cfg.layer_attn[l].head_dim || r % 2 != 0
    };
    if let Some(l) = (0..n).find(|&l| bad_rope(l)) {
        return Err(ModelError::BadKey {
            key: "gemma4.rope.dimension_count".into(),
            msg: format!(
                "{} rotated dims in layer {l} with heads of {}",
                cfg.rope_of(l).n_dims,
                cfg.layer_attn[l].head_dim
            ),
        });
    }
    cfg.embd_scale = Some((cfg.n_embd as f32).sqrt());
    cfg.attn_scale = 1.0;
    cfg.kv_source = kv_sources(&m, &swa)?;
    cfg.n_embd_per_layer = m
        .opt_usize("embedding_length_per_layer_input")?
        .unwrap_or(0);
    cfg.final_logit_softcap = m.opt_f32("final_logit_softcapping")?.filter(|&c| c > 0.0);
    if m.opt_usize("expert_count")?.unwrap_or(0) > 0 {
        cfg.set_moe(&m)?;
    }
    Ok(cfg)
}

/// Per layer, the layer whose KV cache it reads: itself, or for the last `shared_kv_layers` layers
/// the last earlier layer of the same kind (local or global) that has its own cache.
fn kv_sources(m: &Meta, swa: &[bool]) -> Result<Vec<usize>, ModelError> {
    let n = swa.len();
    let shared = m.opt_usize("attention.shared_kv_layers")?.unwrap_or(0);
    let bad = |msg: String| ModelError::BadKey {
        key: "gemma4.attention.shared_kv_layers".into(),
        msg,
    };
    if shared >= n {
        return Err(bad(format!(
            "{shared} of {n} layers share the KV of others"
        )));
    }
    let first_shared = n - shared;
    (0..n)
        .map(|l| {
            if l < first_shared {
                return Ok(l);
            }
            (0..first_shared)
                .rev()
                .find(|&s| swa[s] == swa[l])
                .ok_or_else(|| bad(format!("layer {l} has no earlier layer of its kind")))
        })
        .collect()
}

/// The model part of the per-layer token embeddings: a second embedding table
/// `[n_embd_per_layer · n_layer, n_vocab]`, the projection of the (scaled) token embeddings onto the
/// same width, and the RMSNorm `[n_embd_per_layer]` of that projection per layer.
pub struct PerLayerEmbd {
    pub table: Weight,
    pub proj: Weight,
    pub proj_norm: Weight,
}

impl PerLayerEmbd {
    /// Loads the per-layer embeddings of a model that has them (mirrored, with the embeddings).
    pub fn load(ld: &Loader, cfg: &ModelConfig) -> Result<Option<PerLayerEmbd>, ModelError> {
        let n = cfg.n_embd_per_layer;
        if n == 0 {
            return Ok(None);
        }
        let all = n * cfg.n_layer;
        let get = |name: &str, ne: &[usize]| ld.get(name, ne, WeightSplit::Mirrored, Home::First);
        Ok(Some(PerLayerEmbd {
            table: get("per_layer_token_embd.weight", &[all, cfg.n_vocab])?,
            proj: get("per_layer_model_proj.weight", &[cfg.n_embd, all])?,
            proj_norm: get("per_layer_proj_norm.weight", &[n])?,
        }))
    }
}

/// One layer's use of its per-layer input: `gate` `[n_embd, n_embd_per_layer]` (GELU) times the
/// layer's slice, projected back by `proj` `[n_embd_per_layer, n_embd]`, RMS-normed by `post_norm`
/// and added to the layer's output.
pub struct PerLayerInput {
    pub gate: Weight,
    pub proj: Weight,
    pub post_norm: Weight,
}

/// Gemma 4's MoE FFN: the dense FFN (on the layer's FFN-normed input) with its own post-norm, plus the
/// experts on the residual normed by `moe_norm`, with their own post-norm. The router reads the
/// residual RMS-normed, divided by √n_embd and scaled by `router_scale`.
pub struct DenseAndMoe {
    pub dense: Dense,
    pub dense_post_norm: Weight,
    pub moe_norm: Weight,
    pub router_scale: Weight,
    pub moe: Moe,
    pub moe_post_norm: Weight,
}

pub fn layer(ld: &Loader, cfg: &ModelConfig, l: usize) -> Result<Layer, ModelError> {
    let spec = AttnSpec {
        qk_norm: true,
        sinks: false,
    };
    let variant = AttnVariant {
        q_gate: false,
        v_may_be_k: true,
        v_norm: true,
        no_rope_freqs: cfg.swa_layers[l],
    };
    let dense = Dense::load(ld, cfg, l, GluOp::Geglu)?;
    let ffn = if ld.info(&blk(l, "ffn_gate_inp.weight")).is_some() {
        let home = Home::Layer(l);
        let scale = blk(l, "ffn_gate_inp.scale");
        Ffn::DenseAndMoe(Box::new(DenseAndMoe {
            dense,
            dense_post_norm: layer_norm(ld, cfg, l, "post_ffw_norm_1")?,
            moe_norm: layer_norm(ld, cfg, l, "pre_ffw_norm_2")?,
            router_scale: ld.get(&scale, &[cfg.n_embd], WeightSplit::Mirrored, home)?,
            moe: Moe::load(ld, cfg, l, Gating::Softmax { renorm: true }, GluOp::Geglu)?,
            moe_post_norm: layer_norm(ld, cfg, l, "post_ffw_norm_2")?,
        }))
    } else {
        Ffn::Dense(Box::new(dense))
    };
    let per_layer_input = if cfg.n_embd_per_layer > 0 {
        let (d, n) = (cfg.n_embd, cfg.n_embd_per_layer);
        let get = |name: &str, ne: &[usize]| {
            ld.get(&blk(l, name), ne, WeightSplit::Mirrored, Home::Layer(l))
        };
        Some(PerLayerInput {
            gate: get("inp_gate.weight", &[d, n])?,
            proj: get("proj.weight", &[n, d])?,
            post_norm: layer_norm(ld, cfg, l, "post_norm")?,
        })
    } else {
        None
    };
    let out_scale = ld.opt(
        &blk(l, "layer_output_scale.weight"),
        &[1],
        WeightSplit::Mirrored,
        Home::Layer(l),
    )?;
    Ok(Layer {
        attn_norm: layer_norm(ld, cfg, l, "attn_norm")?,
        mixer: Mixer::Attention(Box::new(Attention::load_variant(
            ld, cfg, l, spec, variant,
        )?)),
        attn_post_norm: Some(layer_norm(ld, cfg, l, "post_attention_norm")?),
        ffn_norm: layer_norm(ld, cfg, l, "ffn_norm")?,
        ffn,
        ffn_post_norm: Some(layer_norm(ld, cfg, l, "post_ffw_norm")?),
        per_layer_input,
        out_scale,
    })
}
