//! The architectures: one module per family declares its hyper-parameters and how each layer's weights
//! are named and split; [`blocks`] holds the shared weight blocks, [`delta_net`] the recurrent mixer of
//! hybrid models, and [`forward`] the one graph builder they all use.

pub mod blocks;
pub mod delta_net;
pub mod forward;
mod gemma3;
pub mod gemma4;
mod gpt_oss;
mod llama;
mod qwen;
mod qwen35;

use crate::model::config::{Arch, ModelConfig};
use crate::model::weights::Loader;
use crate::model::ModelError;
use blocks::Layer;
use ggml_core::gguf::GgufFile;

/// The hyper-parameters of a file of architecture `arch`.
pub fn config(file: &GgufFile, arch: Arch, n_vocab: usize) -> Result<ModelConfig, ModelError> {
    match arch {
        Arch::Llama => llama::config(file, n_vocab),
        Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe => qwen::config(file, arch, n_vocab),
        Arch::Gemma3 => gemma3::config(file, n_vocab),
        Arch::GptOss => gpt_oss::config(file, n_vocab),
        Arch::Gemma4 => gemma4::config(file, n_vocab),
        Arch::Qwen35 | Arch::Qwen35Moe | Arch::Qwen3Next => qwen35::config(file, arch, n_vocab),
    }
}

/// Loads the weights of layer `l`.
pub fn layer(ld: &Loader, cfg: &ModelConfig, l: usize) -> Result<Layer, ModelError> {
    match cfg.arch {
        Arch::Llama => llama::layer(ld, cfg, l),
        Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe => qwen::layer(ld, cfg, l),
        Arch::Gemma3 => gemma3::layer(ld, cfg, l),
        Arch::GptOss => gpt_oss::layer(ld, cfg, l),
        Arch::Gemma4 => gemma4::layer(ld, cfg, l),
        Arch::Qwen35 | Arch::Qwen35Moe | Arch::Qwen3Next => qwen35::layer(ld, cfg, l),
    }
}
