//! The Gemma 4 parts of the forward graph: the per-layer inputs built once from the token ids and the
//! scaled embeddings, each layer's use of its slice of them (the [`Extension`] of
//! [`PerLayerEmbd`]), and the FFN that runs a dense MLP next to the experts (the [`CustomFfn`]
//! [`DenseAndMoe`]).

use super::weights::{DenseAndMoe, PerLayerEmbd};
use crate::arch::shared::forward::Fwd;
use crate::arch::shared::hooks::{CustomFfn, Extension};
use crate::error::ModelError;
use ggml_core::TensorId;

impl Extension for PerLayerEmbd {
    /// The per-layer inputs `[n_embd_per_layer, n_tokens, n_layer]`: each layer's slice of the
    /// per-layer table (× √n_embd_per_layer) plus the RMS-normed projection of the scaled embeddings
    /// `x` (÷ √n_embd), the sum × 1/√2.
    fn pass_input(&self, f: &mut Fwd, x: TensorId) -> Result<TensorId, ModelError> {
        let cfg = f.cfg;
        let (n, n_layer, t) = (self.width, cfg.n_layer, f.n_tokens);
        let embd_scale = 1.0 / (cfg.n_embd as f32).sqrt();
        let table = f.bind(&self.table);
        let rows = f.g.get_rows(table, f.inp.tokens)?;
        let rows = f.g.reshape(rows, &[n, n_layer, t])?;
        let rows = f.g.scale(rows, (n as f32).sqrt())?;
        let proj = f.linear(&self.proj, x, None)?;
        let proj = f.g.scale(proj, embd_scale)?;
        let proj = f.g.reshape(proj, &[n, n_layer, t])?;
        let proj = f.norm(proj, &self.proj_norm)?;
        let sum = f.g.add(proj, rows)?;
        let sum = f.g.scale(sum, std::f32::consts::FRAC_1_SQRT_2)?;
        let by_layer = f.g.permute(sum, [0, 2, 1, 3])?;
        Ok(f.g.cont(by_layer)?)
    }

    /// Layer `l`'s output `x` plus the RMS-normed projection of GELU(gate · x) × the layer's slice of
    /// the per-layer inputs `all`.
    fn layer_output(
        &self,
        f: &mut Fwd,
        l: usize,
        x: TensorId,
        all: TensorId,
    ) -> Result<TensorId, ModelError> {
        let p = &self.layers[l];
        let [n, t, _, _] = f.g.layout(all).ne;
        let nb = f.g.layout(all).nb;
        let slice = f.g.view(all, &[n, t], &[nb[1]], l * nb[2])?;
        let gate = f.linear(&p.gate, x, None)?;
        let gate = f.g.gelu(gate)?;
        let h = f.g.mul(gate, slice)?;
        let h = f.linear(&p.proj, h, None)?;
        let h = f.norm(h, &p.post_norm)?;
        Ok(f.g.add(x, h)?)
    }
}

impl CustomFfn for DenseAndMoe {
    /// Gemma 4's MoE FFN of the residual `x`, `h` being `x` normed by the layer's FFN norm.
    fn build(&self, f: &mut Fwd, h: TensorId, x: TensorId) -> Result<TensorId, ModelError> {
        let cfg = f.cfg;
        let (eps, router_in_scale) = (cfg.rms_eps, 1.0 / (cfg.n_embd as f32).sqrt());
        let dense = f.dense(&self.dense, h)?;
        let dense = f.norm(dense, &self.dense_post_norm)?;
        let xn = f.g.rms_norm(x, eps)?;
        let router_in = f.g.scale(xn, router_in_scale)?;
        let router_scale = f.bind(&self.router_scale);
        let router_in = f.g.mul(router_in, router_scale)?;
        let scores = f.linear(&self.moe.router, router_in, self.moe.router_b.as_ref())?;
        let moe_norm = f.bind(&self.moe_norm);
        let moe_in = f.g.mul(xn, moe_norm)?;
        let moe = f.experts_mix(&self.moe, moe_in, scores)?;
        let moe = f.norm(moe, &self.moe_post_norm)?;
        Ok(f.g.add(dense, moe)?)
    }
}
