//! The Gemma 4 weights: every layer's, the per-layer token embeddings (the model's extension, with
//! each layer's use of them) and the FFN that runs a dense MLP next to the experts.

use super::n_embd_per_layer;
use crate::arch::shared::blocks::{
    blk, layer_norm, Attention, AttnSpec, AttnVariant, Dense, Ffn, Gating, Layer, Mixer, Moe,
};
use crate::arch::shared::config::ModelConfig;
use crate::arch::shared::hooks::Extension;
use crate::arch::{Arch, ArchLayers};
use crate::error::ModelError;
use crate::load::{limits, Home, Loader, Weight};
use backend_meta::WeightSplit;
use ggml_core::GluOp;

/// The per-layer token embeddings: a second embedding table `[n_embd_per_layer · n_layer, n_vocab]`,
/// the projection of the (scaled) token embeddings onto the same width, the RMSNorm
/// `[n_embd_per_layer]` of that projection per layer, and every layer's use of its slice.
pub struct PerLayerEmbd {
    /// The width of each layer's slice (`n_embd_per_layer`).
    pub width: usize,
    pub table: Weight,
    pub proj: Weight,
    pub proj_norm: Weight,
    /// Per layer.
    pub layers: Vec<PerLayerInput>,
}

/// One layer's use of its per-layer input: `gate` `[n_embd, n_embd_per_layer]` (GELU) times the
/// layer's slice, projected back by `proj` `[n_embd_per_layer, n_embd]`, RMS-normed by `post_norm`
/// and added to the layer's output.
pub struct PerLayerInput {
    pub gate: Weight,
    pub proj: Weight,
    pub post_norm: Weight,
}

/// Gemma 4's MoE FFN: the dense FFN (on the layer's FFN-normed input) with its own post-norm, plus the
/// experts on the residual normed by `moe_norm`, with their own post-norm. The router reads the
/// residual RMS-normed, divided by √n_embd and scaled by `router_scale`.
pub struct DenseAndMoe {
    pub dense: Dense,
    pub dense_post_norm: Weight,
    pub moe_norm: Weight,
    pub router_scale: Weight,
    pub moe: Moe,
    pub moe_post_norm: Weight,
}

/// Loads a Gemma 4 model's layers, and its per-layer token embeddings (mirrored, with the embeddings)
/// if it has them.
pub fn load(ld: &Loader, cfg: &ModelConfig) -> Result<ArchLayers, ModelError> {
    let m = Arch::Gemma4.meta(ld.file);
    let width = n_embd_per_layer(&m)?;
    let mut per_layer = if width > 0 {
        let key = m.key("embedding_length_per_layer_input");
        let all = limits::product(
            &format!("{key} × block_count"),
            width,
            cfg.n_layer,
            limits::ROWS,
        )?;
        let get = |name: &str, ne: &[usize]| ld.get(name, ne, WeightSplit::Mirrored, Home::First);
        Some(PerLayerEmbd {
            width,
            table: get("per_layer_token_embd.weight", &[all, cfg.n_vocab])?,
            proj: get("per_layer_model_proj.weight", &[cfg.n_embd, all])?,
            proj_norm: get("per_layer_proj_norm.weight", &[width])?,
            layers: Vec::with_capacity(cfg.n_layer),
        })
    } else {
        None
    };
    let mut layers = Vec::with_capacity(cfg.n_layer);
    for l in 0..cfg.n_layer {
        let ffn = ffn(ld, cfg, l)?;
        if let Some(p) = per_layer.as_mut() {
            p.layers.push(PerLayerInput::load(ld, cfg, l, p.width)?);
        }
        layers.push(layer(ld, cfg, l, ffn)?);
    }
    let extension = per_layer.map(|p| Box::new(p) as Box<dyn Extension>);
    Ok((layers, extension))
}

impl PerLayerInput {
    fn load(
        ld: &Loader,
        cfg: &ModelConfig,
        l: usize,
        width: usize,
    ) -> Result<PerLayerInput, ModelError> {
        let (d, n) = (cfg.n_embd, width);
        let get = |name: &str, ne: &[usize]| {
            ld.get(&blk(l, name), ne, WeightSplit::Mirrored, Home::Layer(l))
        };
        Ok(PerLayerInput {
            gate: get("inp_gate.weight", &[d, n])?,
            proj: get("proj.weight", &[n, d])?,
            post_norm: layer_norm(ld, cfg, l, "post_norm")?,
        })
    }
}

/// Layer `l`'s FFN: dense, or dense next to experts where the layer has a router.
fn ffn(ld: &Loader, cfg: &ModelConfig, l: usize) -> Result<Ffn, ModelError> {
    let dense = Dense::load(ld, cfg, l, GluOp::Geglu)?;
    if ld.info(&blk(l, "ffn_gate_inp.weight")).is_none() {
        return Ok(Ffn::Dense(Box::new(dense)));
    }
    let scale = blk(l, "ffn_gate_inp.scale");
    Ok(Ffn::Custom(Box::new(DenseAndMoe {
        dense,
        dense_post_norm: layer_norm(ld, cfg, l, "post_ffw_norm_1")?,
        moe_norm: layer_norm(ld, cfg, l, "pre_ffw_norm_2")?,
        router_scale: ld.get(&scale, &[cfg.n_embd], WeightSplit::Mirrored, Home::Layer(l))?,
        moe: Moe::load(ld, cfg, l, Gating::Softmax { renorm: true }, GluOp::Geglu)?,
        moe_post_norm: layer_norm(ld, cfg, l, "post_ffw_norm_2")?,
    })))
}

/// The rest of layer `l` around its FFN `ffn`.
fn layer(ld: &Loader, cfg: &ModelConfig, l: usize, ffn: Ffn) -> Result<Layer, ModelError> {
    let spec = AttnSpec {
        qk_norm: true,
        sinks: false,
    };
    let variant = AttnVariant {
        q_gate: false,
        v_may_be_k: true,
        v_norm: true,
        no_rope_freqs: cfg.swa_layers[l],
    };
    let out_scale = ld.opt(
        &blk(l, "layer_output_scale.weight"),
        &[1],
        WeightSplit::Mirrored,
        Home::Layer(l),
    )?;
    Ok(Layer {
        attn_norm: layer_norm(ld, cfg, l, "attn_norm")?,
        mixer: Mixer::Attention(Box::new(Attention::load_variant(
            ld, cfg, l, spec, variant,
        )?)),
        attn_post_norm: Some(layer_norm(ld, cfg, l, "post_attention_norm")?),
        ffn_norm: layer_norm(ld, cfg, l, "ffn_norm")?,
        ffn,
        ffn_post_norm: Some(layer_norm(ld, cfg, l, "post_ffw_norm")?),
        out_scale,
    })
}
