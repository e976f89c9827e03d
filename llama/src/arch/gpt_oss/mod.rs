//! gpt-oss: attention with Q/K/V/O biases and per-head sinks, sliding window on even layers, YaRN NeoX
//! RoPE; mixture of experts with a biased router (top-k of the raw scores, softmax over the chosen),
//! biased experts (MXFP4 in the released files) and SwiGLU-OAI.

use super::shared::blocks::{layer_norm, Attention, AttnSpec, Ffn, Gating, Layer, Mixer, Moe};
use super::shared::config::ModelConfig;
use super::Arch;
use crate::error::ModelError;
use crate::load::Loader;
use ggml_core::gguf::GgufFile;
use ggml_core::{GluOp, RopeMode};

pub fn config(file: &GgufFile, n_vocab: usize) -> Result<ModelConfig, ModelError> {
    let mut cfg = ModelConfig::common(file, Arch::GptOss, RopeMode::Neox, n_vocab)?;
    let m = Arch::GptOss.meta(file);
    cfg.set_swa(&m, |l| l % 2 == 0)?;
    cfg.set_moe(&m)?;
    Ok(cfg)
}

pub fn layer(ld: &Loader, cfg: &ModelConfig, l: usize) -> Result<Layer, ModelError> {
    let spec = AttnSpec {
        qk_norm: false,
        sinks: true,
    };
    let act = GluOp::SwigluOai {
        alpha: 1.702,
        limit: 7.0,
    };
    Ok(Layer {
        attn_norm: layer_norm(ld, cfg, l, "attn_norm")?,
        mixer: Mixer::Attention(Box::new(Attention::load(ld, cfg, l, spec)?)),
        attn_post_norm: None,
        ffn_norm: layer_norm(ld, cfg, l, "post_attention_norm")?,
        ffn: Ffn::Moe(Box::new(Moe::load(ld, cfg, l, Gating::SoftmaxOfTopK, act)?)),
        ffn_post_norm: None,
        out_scale: None,
    })
}
