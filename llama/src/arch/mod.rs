//! The architectures: one module folder per family (`llama`, `qwen`, `qwen35`, `gemma3`, `gemma4`,
//! `gpt_oss`) reads its hyper-parameters and says how each layer's weights are named and split, on
//! the shared building blocks, hyper-parameters and graph builder of [`shared`]. An architecture with
//! model-wide parts beyond the embeddings, layers and head (Gemma 4's per-layer token embeddings)
//! returns them with its layers as a [`shared::hooks::Extension`].
//!
//! Below: [`crate::load`] (placement, weight loading, metadata), which knows no architecture. Above:
//! [`crate::model`], which loads a file and dispatches here by [`Arch`].

mod gemma3;
mod gemma4;
mod gpt_oss;
mod llama;
mod qwen;
mod qwen35;
pub mod shared;

use crate::error::ModelError;
use crate::load::{Loader, Meta};
use ggml_core::gguf::GgufFile;
use shared::blocks::Layer;
use shared::config::ModelConfig;
use shared::hooks::Extension;
use shared::{Head, ModelWeights};

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

    /// Typed access to the file's `<arch>.<key>` metadata.
    pub fn meta(self, file: &GgufFile) -> Meta<'_> {
        Meta {
            file,
            prefix: self.name(),
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

/// The hyper-parameters of a file of architecture `arch`.
pub fn config(file: &GgufFile, arch: Arch, n_vocab: usize) -> Result<ModelConfig, ModelError> {
    let cfg = match arch {
        Arch::Llama => llama::config(file, n_vocab),
        Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe => qwen::config(file, arch, n_vocab),
        Arch::Gemma3 => gemma3::config(file, n_vocab),
        Arch::GptOss => gpt_oss::config(file, n_vocab),
        Arch::Gemma4 => gemma4::config(file, n_vocab),
        Arch::Qwen35 | Arch::Qwen35Moe | Arch::Qwen3Next => qwen35::config(file, arch, n_vocab),
    }?;
    cfg.check_rope(&arch.meta(file))?;
    Ok(cfg)
}

/// What an architecture loads besides the embeddings and head: every layer's weights, and its
/// model-wide extension if it has one.
type ArchLayers = (Vec<Layer>, Option<Box<dyn Extension>>);

/// Loads the weights of a model of `cfg.arch`: the embeddings and head, every layer's, and the
/// architecture's extension if it has one.
pub fn load(ld: &Loader, cfg: &ModelConfig) -> Result<ModelWeights, ModelError> {
    type LayerFn = fn(&Loader, &ModelConfig, usize) -> Result<Layer, ModelError>;
    let head = Head::load(ld, cfg)?;
    let each = |layer: LayerFn| -> Result<ArchLayers, ModelError> {
        let layers = (0..cfg.n_layer).map(|l| layer(ld, cfg, l));
        Ok((layers.collect::<Result<_, _>>()?, None))
    };
    let (layers, extension) = match cfg.arch {
        Arch::Llama => each(llama::layer)?,
        Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe => each(qwen::layer)?,
        Arch::Gemma3 => each(gemma3::layer)?,
        Arch::GptOss => each(gpt_oss::layer)?,
        Arch::Gemma4 => gemma4::load(ld, cfg)?,
        Arch::Qwen35 | Arch::Qwen35Moe | Arch::Qwen3Next => each(qwen35::layer)?,
    };
    Ok(ModelWeights {
        head,
        layers,
        extension,
    })
}
