//! Qwen2 (Q/K/V biases), Qwen3 (per-head Q/K RMSNorm, head size independent of the width) and
//! Qwen3-MoE (Qwen3 attention, softmax top-k experts renormalised to sum 1): pre-norm layers with
//! NeoX RoPE.

use super::blocks::{AttnSpec, Dense, Ffn, Gating, Layer, Moe};
use crate::model::config::{Arch, Meta, ModelConfig};
use crate::model::weights::Loader;
use crate::model::ModelError;
use ggml_core::gguf::GgufFile;
use ggml_core::{GluOp, RopeMode};

pub fn config(file: &GgufFile, arch: Arch, n_vocab: usize) -> Result<ModelConfig, ModelError> {
    let mut cfg = ModelConfig::common(file, arch, RopeMode::Neox, n_vocab)?;
    if arch == Arch::Qwen3Moe {
        cfg.set_moe(&Meta {
            file,
            prefix: arch.name(),
        })?;
    }
    Ok(cfg)
}

pub fn layer(ld: &Loader, cfg: &ModelConfig, l: usize) -> Result<Layer, ModelError> {
    let spec = AttnSpec {
        qk_norm: cfg.arch != Arch::Qwen2,
        sinks: false,
    };
    let ffn = if cfg.arch == Arch::Qwen3Moe {
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
    Layer::pre_norm(ld, cfg, l, spec, ffn)
}
