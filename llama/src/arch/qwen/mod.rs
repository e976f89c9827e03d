//! Qwen2 (Q/K/V biases), Qwen3 (per-head Q/K RMSNorm, head size independent of the width) and
//! Qwen3-MoE (Qwen3 attention, softmax top-k experts renormalised to sum 1): pre-norm layers with
//! NeoX RoPE.

use super::shared::blocks::{AttnSpec, Ffn, Layer};
use super::shared::config::ModelConfig;
use super::Arch;
use crate::error::ModelError;
use crate::load::Loader;
use ggml_core::gguf::GgufFile;
use ggml_core::RopeMode;

pub fn config(file: &GgufFile, arch: Arch, n_vocab: usize) -> Result<ModelConfig, ModelError> {
    let mut cfg = ModelConfig::common(file, arch, RopeMode::Neox, n_vocab)?;
    if arch == Arch::Qwen3Moe {
        cfg.set_moe(&arch.meta(file))?;
    }
    Ok(cfg)
}

pub fn layer(ld: &Loader, cfg: &ModelConfig, l: usize) -> Result<Layer, ModelError> {
    let spec = AttnSpec {
        qk_norm: cfg.arch != Arch::Qwen2,
        sinks: false,
    };
    // Only Qwen3-MoE has expert counts.
    let ffn = Ffn::swiglu(ld, cfg, l)?;
    Layer::pre_norm(ld, cfg, l, spec, ffn)
}
