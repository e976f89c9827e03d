//! Gemma 3: embeddings scaled by √n_embd, per-head Q/K RMSNorm, pre- and post-norms around attention
//! and FFN, GELU-gated FFN, NeoX RoPE, and interleaved sliding-window attention (by default five
//! windowed layers, RoPE base 10 000, then one global layer with the file's base and scaling).

use super::shared::blocks::{layer_norm, Attention, AttnSpec, Dense, Ffn, Layer, Mixer};
use super::shared::config::ModelConfig;
use super::Arch;
use crate::error::ModelError;
use crate::load::{limits, Loader};
use ggml_core::gguf::GgufFile;
use ggml_core::{GluOp, RopeMode};

pub fn config(file: &GgufFile, n_vocab: usize) -> Result<ModelConfig, ModelError> {
    let mut cfg = ModelConfig::common(file, Arch::Gemma3, RopeMode::Neox, n_vocab)?;
    let m = Arch::Gemma3.meta(file);
    let period = m
        .opt_count("attention.sliding_window_pattern", limits::PERIOD)?
        .unwrap_or(6)
        .max(1);
    cfg.set_swa(&m, |l| l % period < period - 1)?;
    cfg.rope_swa.freq_base = 10000.0;
    cfg.rope_swa.freq_scale = 1.0;
    cfg.embd_scale = Some((cfg.n_embd as f32).sqrt());
    // Gemma 3 27B scales queries by the width per head rather than the head size.
    let per_head = if cfg.n_layer == 62 {
        cfg.n_embd / cfg.n_head
    } else {
        cfg.head_dim
    };
    cfg.attn_scale = 1.0 / (per_head as f32).sqrt();
    Ok(cfg)
}

pub fn layer(ld: &Loader, cfg: &ModelConfig, l: usize) -> Result<Layer, ModelError> {
    let spec = AttnSpec {
        qk_norm: true,
        sinks: false,
    };
    Ok(Layer {
        attn_norm: layer_norm(ld, cfg, l, "attn_norm")?,
        mixer: Mixer::Attention(Box::new(Attention::load(ld, cfg, l, spec)?)),
        attn_post_norm: Some(layer_norm(ld, cfg, l, "post_attention_norm")?),
        ffn_norm: layer_norm(ld, cfg, l, "ffn_norm")?,
        ffn: Ffn::Dense(Box::new(Dense::load(ld, cfg, l, GluOp::Geglu)?)),
        ffn_post_norm: Some(layer_norm(ld, cfg, l, "post_ffw_norm")?),
        out_scale: None,
    })
}
