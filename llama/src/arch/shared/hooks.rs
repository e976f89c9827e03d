//! The hooks through which an architecture adds its own parts to the shared forward graph, each an
//! arch-owned type behind a trait object so that the shared code names no architecture: an
//! [`Extension`] holds model-wide weights and the graph steps that use them (Gemma 4's per-layer
//! token embeddings), a [`CustomFfn`] is a layer's feed-forward block of the architecture's own make
//! (Gemma 4's dense FFN next to experts).

use super::forward::Fwd;
use crate::error::ModelError;
use ggml_core::TensorId;

/// Model-wide weights of an architecture beyond the embeddings, layers and head, and the graph steps
/// that use them.
pub trait Extension: Send + Sync {
    /// Builds, once per pass, from the (scaled) token embeddings `x` the tensor every
    /// [`Extension::layer_output`] then receives.
    fn pass_input(&self, f: &mut Fwd, x: TensorId) -> Result<TensorId, ModelError>;

    /// Layer `l`'s output `x` (after the FFN residual, before the layer's output scale) as the
    /// extension changes it, `input` being [`Extension::pass_input`]'s tensor.
    fn layer_output(
        &self,
        f: &mut Fwd,
        l: usize,
        x: TensorId,
        input: TensorId,
    ) -> Result<TensorId, ModelError>;
}

/// A feed-forward block of an architecture's own make.
pub trait CustomFfn: Send + Sync {
    /// The FFN output for the residual `x`, `h` being `x` normed by the layer's FFN norm.
    fn build(&self, f: &mut Fwd, h: TensorId, x: TensorId) -> Result<TensorId, ModelError>;
}
