//! The generic model, above the architectures ([`crate::arch`]) and the weight loader
//! ([`crate::load`]): [`Model::load`] reads the file's architecture and its hyper-parameters, places
//! the layers for a [`Placement`] and has the architecture load every weight from the memory-mapped
//! file into device memory. Also random-weight models of published shapes ([`synthetic`]).

pub mod synthetic;

#[cfg(test)]
mod tests;

pub use crate::error::ModelError;
pub use crate::load::Placement;

use crate::arch::shared::config::ModelConfig;
use crate::arch::shared::ModelWeights;
use crate::arch::{self, Arch};
use crate::load::{limits, Alloc, Loader};
use ggml_core::gguf::GgufFile;
use std::path::Path;

/// A model in device memory.
pub struct Model {
    pub config: ModelConfig,
    pub(crate) placement: Placement,
    pub(crate) layer_device: Vec<usize>,
    pub(crate) weights: ModelWeights,
}

impl Model {
    /// Loads the GGUF file at `path` onto `placement`.
    pub fn load(path: impl AsRef<Path>, placement: &Placement) -> Result<Model, ModelError> {
        let file = GgufFile::open(path)?;
        Model::from_gguf(&file, placement)
    }

    /// Loads an opened GGUF file onto `placement`.
    pub fn from_gguf(file: &GgufFile, placement: &Placement) -> Result<Model, ModelError> {
        let arch_name = file.get_str("general.architecture")?;
        let arch =
            Arch::from_name(arch_name).ok_or_else(|| ModelError::UnknownArch(arch_name.into()))?;
        let embd = file
            .tensor("token_embd.weight")
            .ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?;
        let n_vocab =
            limits::VOCAB.check_wide("token_embd.weight (vocabulary)", embd.shape[1].into())?;
        let config = arch::config(file, arch, n_vocab)?;
        let layer_device = placement.layer_devices(config.n_layer)?;
        let ld = Loader {
            file,
            alloc: Alloc {
                placement,
                layer_device: &layer_device,
            },
        };
        let weights = arch::load(&ld, &config)?;
        Ok(Model {
            config,
            placement: placement.clone(),
            layer_device,
            weights,
        })
    }

    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The device index of each layer (all 0 unless the layers are split).
    pub fn layer_devices(&self) -> &[usize] {
        &self.layer_device
    }

    /// Allocates tensors (caches, states) with the weights of this model's placement.
    pub(crate) fn alloc(&self) -> Alloc<'_> {
        Alloc {
            placement: &self.placement,
            layer_device: &self.layer_device,
        }
    }
}
