//! Gemma 4 (dense and mixture-of-experts): interleaved sliding-window ("local") and global layers
//! with their own head sizes and KV head counts, NeoX RoPE (local: base `rope.freq_base_swa` over
//! `rope.dimension_count_swa` dims; global: the file's base with `rope_freqs` factors, whose huge
//! entries leave most pairs unrotated), per-head Q/K RMSNorm with weights and V RMSNorm without,
//! attention scale 1, Gemma pre- and post-norms, GELU-gated FFNs whose width may differ per layer,
//! embeddings × √n_embd, a final logit soft-cap, and per layer a scalar output scale.
//!
//! Optional parts: the last `attention.shared_kv_layers` layers attend to the cache of the last
//! earlier layer of their kind and have no K/V projections; a global layer without `attn_v` uses its
//! K projection as V; per-layer token embeddings ([`weights::PerLayerEmbd`]) mix a slice of a second
//! embedding table into every layer's output (the model's
//! [`Extension`](super::shared::hooks::Extension)); MoE files run a dense FFN and experts side by
//! side ([`weights::DenseAndMoe`], a [`CustomFfn`](super::shared::hooks::CustomFfn)). Here the
//! hyper-parameters; [`weights`] loads the tensors, [`forward`] builds the Gemma 4 parts of the graph.
//!
//! Tensor parallelism: attention splits by whole GQA groups like every architecture (a global layer
//! whose query heads all share one KV head is a single group, so it stays mirrored); the dense FFN
//! and the experts split by FFN rows; the per-layer-embedding weights stay mirrored (they are small,
//! and splitting them would cost one more all-reduce per layer).

mod forward;
#[cfg(test)]
mod tests;
mod weights;

use super::shared::config::ModelConfig;
use super::Arch;
use crate::error::ModelError;
use crate::load::{limits, Meta};
use ggml_core::gguf::GgufFile;
use ggml_core::RopeMode;
pub use weights::load;

pub fn config(file: &GgufFile, n_vocab: usize) -> Result<ModelConfig, ModelError> {
    let mut cfg = ModelConfig::common(file, Arch::Gemma4, RopeMode::Neox, n_vocab)?;
    let m = Arch::Gemma4.meta(file);
    let n = cfg.n_layer;
    let swa = m
        .opt_flags("attention.sliding_window_pattern", n)?
        .ok_or_else(|| ModelError::MissingKey("gemma4.attention.sliding_window_pattern".into()))?;
    cfg.set_swa(&m, |l| swa[l])?;
    let head_dim_swa = m
        .opt_count("attention.key_length_swa", limits::HEAD_DIM)?
        .unwrap_or(cfg.head_dim);
    let head_dim_v_swa = m
        .opt_count("attention.value_length_swa", limits::HEAD_DIM)?
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
        .opt_count("rope.dimension_count_swa", limits::ROPE_DIMS)?
        .unwrap_or(head_dim_swa);
    if let Some(base) = m.opt_f32("rope.freq_base_swa")? {
        cfg.rope_swa.freq_base = base;
    }
    if swa.iter().any(|&s| s) && cfg.n_swa == 0 {
        return Err(ModelError::MissingKey(
            "gemma4.attention.sliding_window".into(),
        ));
    }
    cfg.embd_scale = Some((cfg.n_embd as f32).sqrt());
    cfg.attn_scale = 1.0;
    cfg.kv_source = kv_sources(&m, &swa)?;
    cfg.final_logit_softcap = m.opt_f32("final_logit_softcapping")?.filter(|&c| c > 0.0);
    if m.opt_count("expert_count", limits::EXPERTS.or_zero())?
        .unwrap_or(0)
        > 0
    {
        cfg.set_moe(&m)?;
    }
    Ok(cfg)
}

/// Per layer, the layer whose KV cache it reads: itself, or for the last `shared_kv_layers` layers
/// the last earlier layer of the same kind (local or global) that has its own cache.
fn kv_sources(m: &Meta, swa: &[bool]) -> Result<Vec<usize>, ModelError> {
    let n = swa.len();
    let shared = m
        .opt_count("attention.shared_kv_layers", limits::LAYERS.or_zero())?
        .unwrap_or(0);
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

/// The width of the per-layer token embeddings fed to every layer (0: none).
fn n_embd_per_layer(m: &Meta) -> Result<usize, ModelError> {
    Ok(
        m.opt_count("embedding_length_per_layer_input", limits::EMBD.or_zero())?
            .unwrap_or(0),
    )
}
