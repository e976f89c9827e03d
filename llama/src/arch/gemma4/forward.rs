//! The Gemma 4 parts of the forward graph: the per-layer inputs built once from the token ids and the
//! scaled embeddings, each layer's use of its slice of them, and the FFN that runs a dense MLP next
//! to the experts.

use super::Fwd;
use crate::arch::gemma4::{DenseAndMoe, PerLayerEmbd, PerLayerInput};
use crate::model::ModelError;
use ggml_core::TensorId;

impl Fwd<'_> {
    /// The per-layer inputs `[n_embd_per_layer, n_tokens, n_layer]`: each layer's slice of the
    /// per-layer table (× √n_embd_per_layer) plus the RMS-normed projection of the scaled embeddings
    /// `x` (÷ √n_embd), the sum × 1/√2.
    pub(super) fn per_layer_inputs(
        &mut self,
        p: &PerLayerEmbd,
        x: TensorId,
    ) -> Result<TensorId, ModelError> {
        let cfg = &self.model.config;
        let (n, n_layer, t) = (cfg.n_embd_per_layer, cfg.n_layer, self.n_tokens);
        let embd_scale = 1.0 / (cfg.n_embd as f32).sqrt();
        let table = self.bind(&p.table);
        let rows = self.g.get_rows(table, self.inp.tokens)?;
        let rows = self.g.reshape(rows, &[n, n_layer, t])?;
        let rows = self.g.scale(rows, (n as f32).sqrt())?;
        let proj = self.linear(&p.proj, x, None)?;
        let proj = self.g.scale(proj, embd_scale)?;
        let proj = self.g.reshape(proj, &[n, n_layer, t])?;
        let proj = self.norm(proj, &p.proj_norm)?;
        let sum = self.g.add(proj, rows)?;
        let sum = self.g.scale(sum, std::f32::consts::FRAC_1_SQRT_2)?;
        let by_layer = self.g.permute(sum, [0, 2, 1, 3])?;
        Ok(self.g.cont(by_layer)?)
    }

    /// Layer `l`'s output `x` plus the RMS-normed projection of GELU(gate · x) × the layer's per-layer
    /// input.
    pub(super) fn per_layer_input(
        &mut self,
        p: &PerLayerInput,
        l: usize,
        x: TensorId,
    ) -> Result<TensorId, ModelError> {
        let all = self.per_layer.ok_or_else(|| {
            ModelError::Unsupported(format!(
                "layer {l} has per-layer input weights but the model no per-layer embeddings"
            ))
        })?;
        let [n, t, _, _] = self.g.layout(all).ne;
        let nb = self.g.layout(all).nb;
        let slice = self.g.view(all, &[n, t], &[nb[1]], l * nb[2])?;
        let gate = self.linear(&p.gate, x, None)?;
        let gate = self.g.gelu(gate)?;
        let h = self.g.mul(gate, slice)?;
        let h = self.linear(&p.proj, h, None)?;
        let h = self.norm(h, &p.post_norm)?;
        Ok(self.g.add(x, h)?)
    }

    /// Gemma 4's MoE FFN of the residual `x`, `h` being `x` normed by the layer's FFN norm.
    pub(super) fn dense_and_moe(
        &mut self,
        f: &DenseAndMoe,
        h: TensorId,
        x: TensorId,
    ) -> Result<TensorId, ModelError> {
        let cfg = &self.model.config;
        let (eps, router_in_scale) = (cfg.rms_eps, 1.0 / (cfg.n_embd as f32).sqrt());
        let dense = self.dense(&f.dense, h)?;
        let dense = self.norm(dense, &f.dense_post_norm)?;
        let xn = self.g.rms_norm(x, eps)?;
        let router_in = self.g.scale(xn, router_in_scale)?;
        let router_scale = self.bind(&f.router_scale);
        let router_in = self.g.mul(router_in, router_scale)?;
        let scores = self.linear(&f.moe.router, router_in, f.moe.router_b.as_ref())?;
        let moe_norm = self.bind(&f.moe_norm);
        let moe_in = self.g.mul(xn, moe_norm)?;
        let moe = self.experts_mix(&f.moe, moe_in, scores)?;
        let moe = self.norm(moe, &f.moe_post_norm)?;
        Ok(self.g.add(dense, moe)?)
    }
}
