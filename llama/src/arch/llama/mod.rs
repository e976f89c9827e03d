//! Llama (Llama 2/3, SmolLM2, Mistral-style MoE when the file has experts): RMSNorm pre-norm layers,
//! GQA attention with normal (adjacent-pair) RoPE and optional Llama 3 frequency factors, SwiGLU FFN.

use super::blocks::{AttnSpec, Dense, Ffn, Gating, Layer, Moe};
use crate::model::config::{Arch, Meta, ModelConfig};
use crate::model::weights::Loader;
use crate::model::ModelError;
use ggml_core::gguf::GgufFile;
use ggml_core::{GluOp, RopeMode};

pub fn config(file: &GgufFile, n_vocab: usize) -> Result<ModelConfig, ModelError> {
    let mut cfg = ModelConfig::common(file, Arch::Llama, RopeMode::Normal, n_vocab)?;
    let m = Meta {
        file,
        prefix: "llama",
    };
    if m.opt_usize("expert_count")?.unwrap_or(0) > 0 {
        cfg.set_moe(&m)?;
    }
    Ok(cfg)
}

pub fn layer(ld: &Loader, cfg: &ModelConfig, l: usize) -> Result<Layer, ModelError> {
    let ffn = if cfg.moe.is_some() {
        Ffn::Moe(Box::new(Moe::load(
            ld,
            cfg,
            l,
            Gating::Softmax { renorm: true },
            GluOp::Swiglu,
        )?))
    } else {
        Ffn::Dense(Box::new(Dense::load(ld, cfg, l, GluOp::Swiglu)?))
    };
    Layer::pre_norm(ld, cfg, l, AttnSpec::default(), ffn)
}
