//! Where a model's weights (and its KV cache) live: one device, contiguous ranges of layers per
//! device, or sharded over a meta device.

use crate::error::ModelError;
use backend_meta::MetaDevice;
use ggml_core::backend::{Backend, Device};
use std::sync::Arc;

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

    /// The device of every layer of a model of `n_layer` layers.
    pub(crate) fn layer_devices(&self, n_layer: usize) -> Result<Vec<usize>, ModelError> {
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

    /// True for a layer split over more than one device.
    pub(crate) fn splits_layers(&self) -> bool {
        matches!(self, Placement::Layers { devices, .. } if devices.len() > 1)
    }

    /// True for weights sharded over more than one device.
    pub(crate) fn splits_tensors(&self) -> bool {
        matches!(self, Placement::Tensor(m) if m.devices().len() > 1)
    }
}
