//! The recurrent state of the delta-net layers of hybrid models (Qwen3.5, Qwen3-Next): per sequence
//! of the cache and per such layer a convolution state (the Q/K/V input columns of the last `conv_kernel - 1` tokens) and a delta-net
//! state (one `head_dim × head_dim` matrix per value head), both F32. They live with the layer's
//! weights (its device in a layer split; on a meta device cut by heads like the delta-net weights, see
//! [`crate::arch::shared::delta_net_splits`]) next to the KV cache; every forward graph reads them and writes the updated ones back in
//! place. Unlike a KV cache they summarise the whole sequence, so they cannot be cut back to an
//! earlier position: they can only be cleared. A forward pass over such layers holds the tokens of
//! one sequence, whose state it reads and updates.

use crate::arch::shared::blocks::Mixer;
use crate::load::{limits, Home, Weight};
use crate::model::{Model, ModelError};
use backend_meta::WeightSplit;
use ggml_core::DType;

/// The state of one delta-net layer.
pub struct LayerState {
    /// `[conv_channels, conv_kernel - 1]`: the convolution's inputs of the previous tokens, oldest first.
    pub conv: Weight,
    /// `[head_dim, head_dim, n_v_heads]`: per value head the matrix `S[key, value]`.
    pub ssm: Weight,
}

/// The recurrent states of every delta-net layer of a model, per sequence (none for attention-only
/// models).
pub struct RecurrentState {
    /// Per sequence, per layer.
    seqs: Vec<Vec<Option<LayerState>>>,
}

impl RecurrentState {
    /// Zeroed states of `n_seq` sequences for the delta-net layers of `model`.
    pub fn new(model: &Model, n_seq: usize) -> Result<RecurrentState, ModelError> {
        limits::SEQUENCES.check("recurrent state sequences (n_seq)", n_seq)?;
        let alloc = model.alloc();
        let tensor = |name: String,
                      ne: [usize; 4],
                      split: &WeightSplit,
                      l: usize|
         -> Result<Weight, ModelError> {
            let layout = limits::layout(&name, DType::F32, ne)?;
            let data = alloc.alloc(&name, layout, split, Home::Layer(l))?;
            Ok(Weight { name, layout, data })
        };
        let mut seqs = Vec::with_capacity(n_seq);
        for seq in 0..n_seq {
            let mut layers = Vec::with_capacity(model.weights.layers.len());
            for (l, layer) in model.weights.layers.iter().enumerate() {
                let state = match (&layer.mixer, &model.config.delta_net) {
                    (Mixer::DeltaNet(dn), Some(c)) => Some(LayerState {
                        conv: tensor(
                            format!("state_conv_s{seq}_l{l}"),
                            [c.conv_channels(), c.conv_kernel - 1, 1, 1],
                            &dn.splits.conv_state,
                            l,
                        )?,
                        ssm: tensor(
                            format!("state_ssm_s{seq}_l{l}"),
                            [c.head_dim, c.head_dim, c.n_v_heads, 1],
                            &dn.splits.state,
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
            seqs.push(layers);
        }
        let s = RecurrentState { seqs };
        for seq in 0..n_seq {
            s.clear(seq)?;
        }
        Ok(s)
    }

    /// The state of layer `l` of sequence `seq` (`None` for attention layers).
    pub fn layer(&self, seq: usize, l: usize) -> Option<&LayerState> {
        self.seqs.get(seq)?.get(l).and_then(Option::as_ref)
    }

    /// True when the model has no recurrent layer.
    pub fn is_empty(&self) -> bool {
        self.seqs.iter().flatten().all(Option::is_none)
    }

    /// Zeroes every state of sequence `seq` (the start of a new sequence there).
    pub fn clear(&self, seq: usize) -> Result<(), ModelError> {
        let layers = self
            .seqs
            .get(seq)
            .ok_or_else(|| ModelError::Input(format!("sequence {seq} of {}", self.seqs.len())))?;
        for s in layers.iter().flatten() {
            for w in [&s.conv, &s.ssm] {
                w.data.buffer.fill(w.data.offset, w.layout.nbytes(), 0)?;
            }
        }
        Ok(())
    }
}
