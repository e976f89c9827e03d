//! The recurrent state of the delta-net layers of hybrid models (Qwen3.5, Qwen3-Next): per such layer
//! a convolution state (the Q/K/V input columns of the last `conv_kernel - 1` tokens) and a delta-net
//! state (one `head_dim × head_dim` matrix per value head), both F32. They live with the layer's
//! weights (its device in a layer split, whole on every device of a meta device, like the delta-net
//! weights) next to the KV cache; every forward graph reads them and writes the updated ones back in
//! place. Unlike a KV cache they summarise the whole sequence, so they cannot be cut back to an
//! earlier position: they can only be cleared.

use crate::arch::blocks::Mixer;
use crate::model::weights::{Alloc, Home, Weight};
use crate::model::{Model, ModelError};
use backend_meta::WeightSplit;
use ggml_core::{DType, Layout};

/// The state of one delta-net layer.
pub struct LayerState {
    /// `[conv_channels, conv_kernel - 1]`: the convolution's inputs of the previous tokens, oldest first.
    pub conv: Weight,
    /// `[head_dim, head_dim, n_v_heads]`: per value head the matrix `S[key, value]`.
    pub ssm: Weight,
}

/// The recurrent states of every delta-net layer of a model (none for attention-only models).
pub struct RecurrentState {
    layers: Vec<Option<LayerState>>,
}

impl RecurrentState {
    /// Zeroed states for the delta-net layers of `model`.
    pub fn new(model: &Model) -> Result<RecurrentState, ModelError> {
        let alloc = Alloc {
            placement: &model.placement,
            layer_device: &model.layer_device,
        };
        let tensor = |name: String, ne: [usize; 4], l: usize| -> Result<Weight, ModelError> {
            let layout = Layout::contiguous(DType::F32, ne);
            let data = alloc.alloc(&name, layout, &WeightSplit::Mirrored, Home::Layer(l))?;
            Ok(Weight { name, layout, data })
        };
        let mut layers = Vec::with_capacity(model.layers.len());
        for (l, layer) in model.layers.iter().enumerate() {
            let state = match (&layer.mixer, &model.config.delta_net) {
                (Mixer::DeltaNet(_), Some(c)) => Some(LayerState {
                    conv: tensor(
                        format!("state_conv_l{l}"),
                        [c.conv_channels(), c.conv_kernel - 1, 1, 1],
                        l,
                    )?,
                    ssm: tensor(
                        format!("state_ssm_l{l}"),
                        [c.head_dim, c.head_dim, c.n_v_heads, 1],
                        l,
                    )?,
                }),
                (Mixer::DeltaNet(_), None) => {
                    return Err(ModelError::Unsupported(format!(
                        "delta-net layer {l} without delta-net hyper-parameters"
                    )))
                }
                (Mixer::Attention(_), _) => None,
            };
            layers.push(state);
        }
        let s = RecurrentState { layers };
        s.clear()?;
        Ok(s)
    }

    /// The state of layer `l` (`None` for attention layers).
    pub fn layer(&self, l: usize) -> Option<&LayerState> {
        self.layers.get(l).and_then(Option::as_ref)
    }

    /// True when the model has no recurrent layer.
    pub fn is_empty(&self) -> bool {
        self.layers.iter().all(Option::is_none)
    }

    /// Zeroes every state (the start of a new sequence).
    pub fn clear(&self) -> Result<(), ModelError> {
        for s in self.layers.iter().flatten() {
            for w in [&s.conv, &s.ssm] {
                w.data.buffer.fill(w.data.offset, w.layout.nbytes(), 0)?;
            }
        }
        Ok(())
    }
}
