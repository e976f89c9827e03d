//! Loading a GGUF model onto devices: [`Placement`] says where weights go (one device, contiguous
//! ranges of layers per device, or sharded over a meta device), [`Model::load`] reads the
//! hyper-parameters ([`config`]) and copies every weight from the memory-mapped file into device
//! memory ([`weights`]), each architecture naming and splitting its own tensors (`crate::arch`).

pub mod config;
pub mod synthetic;
pub mod weights;

#[cfg(test)]
mod tests;

use backend_meta::{MetaDevice, WeightSplit};
use config::{Arch, ModelConfig};
use ggml_core::backend::{Backend, Device};
use ggml_core::gguf::{GgufError, GgufFile};
use std::path::Path;
use std::sync::Arc;
use weights::{Alloc, Home, Loader, Weight};

/// Errors of loading and running models.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(
        "unknown architecture {0:?} (supported: llama, qwen2, qwen3, qwen3moe, gemma3, gpt-oss, gemma4, qwen35, qwen35moe, qwen3next)"
    )]
    UnknownArch(String),
    #[error("metadata key {0:?} is missing")]
    MissingKey(String),
    #[error("metadata key {key:?}: {msg}")]
    BadKey { key: String, msg: String },
    #[error("tensor {0:?} is missing")]
    MissingTensor(String),
    #[error("tensor {name:?}: {msg}")]
    BadTensor { name: String, msg: String },
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("bad input: {0}")]
    Input(String),
    #[error("bad placement: {0}")]
    Placement(String),
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Core(#[from] ggml_core::Error),
}

/// Where a model's weights (and its KV cache) live.
#[derive(Clone)]
pub enum Placement {
    /// Everything on one device.
    Single(Arc<dyn Device>),
    /// Contiguous ranges of layers per device, sized in proportion to `ratios`; the embeddings go
    /// with the first device, the output norm and head with the last.
    Layers {
        devices: Vec<Arc<dyn Device>>,
        ratios: Vec<f32>,
    },
    /// Tensor parallelism: every weight sharded over the meta device's devices as its architecture
    /// declares, the KV cache split by KV heads.
    Tensor(Arc<MetaDevice>),
}

impl Placement {
    /// The streams a scheduler runs this placement's graphs on.
    pub fn backends(&self) -> Result<Vec<Arc<dyn Backend>>, ModelError> {
        Ok(match self {
            Placement::Single(d) => vec![d.new_backend()?],
            Placement::Layers { devices, .. } => devices
                .iter()
                .map(|d| d.new_backend())
                .collect::<Result<_, _>>()?,
            Placement::Tensor(m) => vec![m.new_backend()?],
        })
    }

    /// The device of every layer.
    fn layer_devices(&self, n_layer: usize) -> Result<Vec<usize>, ModelError> {
        let Placement::Layers { devices, ratios } = self else {
            return Ok(vec![0; n_layer]);
        };
        if devices.is_empty() || devices.len() != ratios.len() {
            return Err(ModelError::Placement(format!(
                "{} devices with {} ratios",
                devices.len(),
                ratios.len()
            )));
        }
        let counts = backend_meta::split::split_sizes(n_layer, 1, ratios, 0)
            .map_err(|e| ModelError::Placement(e.to_string()))?;
        Ok(counts
            .iter()
            .enumerate()
            .flat_map(|(d, &n)| std::iter::repeat_n(d, n))
            .collect())
    }
}

/// A model in device memory.
pub struct Model {
    pub config: ModelConfig,
    pub(crate) placement: Placement,
    pub(crate) layer_device: Vec<usize>,
    pub(crate) tok_embd: Weight,
    pub(crate) output_norm: Weight,
    /// The head (the embedding table when tied).
    pub(crate) output: Weight,
    pub(crate) layers: Vec<crate::arch::blocks::Layer>,
    /// Per-layer token embeddings (Gemma 4).
    pub(crate) per_layer_embd: Option<crate::arch::gemma4::PerLayerEmbd>,
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
        let n_vocab = embd.shape[1] as usize;
        let config = crate::arch::config(file, arch, n_vocab)?;
        let layer_device = placement.layer_devices(config.n_layer)?;
        let ld = Loader {
            file,
            alloc: Alloc {
                placement,
                layer_device: &layer_device,
            },
        };
        let (d, v) = (config.n_embd, config.n_vocab);
        let m = || WeightSplit::Mirrored;
        // With a head of its own, the table is only read by row lookups: in tensor parallelism each
        // device keeps a slice of every row (the lookup's result is gathered); a tied table stays
        // whole for the head.
        let embd_split = if file.tensor("output.weight").is_some() {
            WeightSplit::axis(0, d, embd.dtype.block_size())
        } else {
            m()
        };
        let tok_embd = ld.get("token_embd.weight", &[d, v], embd_split, Home::First)?;
        let output_norm = ld.get("output_norm.weight", &[d], m(), Home::Last)?;
        let output = match ld.opt(
            "output.weight",
            &[d, v],
            WeightSplit::axis(1, v, 1),
            Home::Last,
        )? {
            Some(w) => w,
            None if matches!(placement, Placement::Layers { devices, .. } if devices.len() > 1) => {
                // Tied head on the last device: its own copy of the table.
                ld.get("token_embd.weight", &[d, v], m(), Home::Last)?
            }
            None => tok_embd.clone(),
        };
        let per_layer_embd = crate::arch::gemma4::PerLayerEmbd::load(&ld, &config)?;
        let layers = (0..config.n_layer)
            .map(|l| crate::arch::layer(&ld, &config, l))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Model {
            config,
            placement: placement.clone(),
            layer_device,
            tok_embd,
            output_norm,
            output,
            layers,
            per_layer_embd,
        })
    }

    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The device index of each layer (all 0 unless the layers are split).
    pub fn layer_devices(&self) -> &[usize] {
        &self.layer_device
    }
}
