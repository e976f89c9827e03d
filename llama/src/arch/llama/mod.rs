//! Llama (Llama 2/3, SmolLM2, Mistral-style MoE when the file has experts): RMSNorm pre-norm layers,
//! GQA attention with normal (adjacent-pair) RoPE and optional Llama 3 frequency factors, SwiGLU FFN.

use super::shared::blocks::{AttnSpec, Ffn, Layer};
use super::shared::config::ModelConfig;
use super::Arch;
use crate::error::ModelError;
use crate::load::{limits, Loader};
use ggml_core::gguf::GgufFile;
use ggml_core::RopeMode;

pub fn config(file: &GgufFile, n_vocab: usize) -> Result<ModelConfig, ModelError> {
    let mut cfg = ModelConfig::common(file, Arch::Llama, RopeMode::Normal, n_vocab)?;
    let m = Arch::Llama.meta(file);
    if m.opt_count("expert_count", limits::EXPERTS.or_zero())?
        .unwrap_or(0)
        > 0
    {
        cfg.set_moe(&m)?;
    }
    Ok(cfg)
}

pub fn layer(ld: &Loader, cfg: &ModelConfig, l: usize) -> Result<Layer, ModelError> {
    let ffn = Ffn::swiglu(ld, cfg, l)?;
    Layer::pre_norm(ld, cfg, l, AttnSpec::default(), ffn)
}
