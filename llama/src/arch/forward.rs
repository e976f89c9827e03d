//! The forward graph shared by every architecture: embeddings, then per layer norm → attention (KV
//! cache written with `set_rows` at the batch positions, flash attention over the first `n_kv` cache
//! slots with a host-built causal / sliding-window mask, optionally gated per head) or a gated delta
//! net ([`super::delta_net`]) → residual → norm → dense FFN or mixture of experts (with an optional
//! shared expert) → residual, then the output norm and head for the requested rows.

use super::blocks::{Attention, Dense, Ffn, Gating, Layer, Mixer, Moe};
use crate::kv::KvCache;
use crate::model::weights::Weight;
use crate::model::{Model, ModelError};
use ggml_core::{Graph, TensorId, UnaryOp};

/// The inputs of one forward graph.
pub struct Inputs {
    /// I32 `[n_tokens]` token ids.
    pub tokens: TensorId,
    /// I32 `[n_tokens]` positions (also the cache rows written).
    pub pos: TensorId,
    /// F32 `[n_kv, n_tokens]` causal mask (0 or -inf).
    pub mask: TensorId,
    /// F32 `[n_kv, n_tokens]` causal sliding-window mask, for models with windowed layers.
    pub mask_swa: Option<TensorId>,
    /// I32 `[n_out]` rows whose logits are wanted (`None`: all).
    pub out_ids: Option<TensorId>,
}

/// Graph-building state of one forward pass.
pub(super) struct Fwd<'a> {
    pub(super) g: &'a mut Graph,
    pub(super) model: &'a Model,
    inp: &'a Inputs,
    pub(super) n_tokens: usize,
    n_kv: usize,
}

impl Fwd<'_> {
    pub(super) fn bind(&mut self, w: &Weight) -> TensorId {
        w.bind(self.g)
    }

    pub(super) fn norm(&mut self, x: TensorId, w: &Weight) -> Result<TensorId, ModelError> {
        let h = self.g.rms_norm(x, self.model.config.rms_eps)?;
        let w = self.bind(w);
        Ok(self.g.mul(h, w)?)
    }

    /// `w · x (+ b)`.
    pub(super) fn linear(
        &mut self,
        w: &Weight,
        x: TensorId,
        b: Option<&Weight>,
    ) -> Result<TensorId, ModelError> {
        let w = self.bind(w);
        let y = self.g.mul_mat(w, x)?;
        match b {
            Some(b) => {
                let b = self.bind(b);
                Ok(self.g.add(y, b)?)
            }
            None => Ok(y),
        }
    }

    /// Projects, normalises and rotates Q or K: `[head_dim, n_heads, n_tokens]`.
    #[allow(clippy::too_many_arguments)]
    fn head_proj(
        &mut self,
        a: &Attention,
        w: &Weight,
        b: Option<&Weight>,
        norm: Option<&Weight>,
        x: TensorId,
        n_heads: usize,
        l: usize,
    ) -> Result<TensorId, ModelError> {
        let cfg = &self.model.config;
        let y = self.linear(w, x, b)?;
        let mut y = self.g.reshape(y, &[cfg.head_dim, n_heads, self.n_tokens])?;
        if let Some(n) = norm {
            y = self.norm(y, n)?;
        }
        let freqs = a.rope_freqs.as_ref().map(|f| f.bind(self.g));
        Ok(self.g.rope(y, self.inp.pos, freqs, cfg.rope_of(l))?)
    }

    /// Writes `[d, n_heads, n_tokens]` rows into a cache `[d, n_ctx, n_heads]` at the positions and
    /// returns the view of its first `n_kv` slots.
    fn cache(&mut self, cache: &Weight, x: TensorId) -> Result<TensorId, ModelError> {
        let c = self.bind(cache);
        let xp = self.g.permute(x, [0, 2, 1, 3])?;
        let written = self.g.set_rows(c, xp, self.inp.pos)?;
        let [d, _, heads, _] = cache.ne();
        let nb = cache.layout.nb;
        Ok(self
            .g
            .view(written, &[d, self.n_kv, heads], &[nb[1], nb[2]], 0)?)
    }

    fn attention(
        &mut self,
        a: &Attention,
        l: usize,
        x: TensorId,
        kv: &KvCache,
    ) -> Result<TensorId, ModelError> {
        let cfg = &self.model.config;
        let (nh, nkv, t) = (cfg.n_head, cfg.n_head_kv, self.n_tokens);
        let q = self.head_proj(a, &a.wq, a.bq.as_ref(), a.q_norm.as_ref(), x, nh, l)?;
        let k = self.head_proj(a, &a.wk, a.bk.as_ref(), a.k_norm.as_ref(), x, nkv, l)?;
        let v = self.linear(&a.wv, x, a.bv.as_ref())?;
        let v = self.g.reshape(v, &[cfg.head_dim_v, nkv, t])?;
        let (kc, vc) = kv.layer(l)?;
        let k_all = self.cache(kc, k)?;
        let v_all = self.cache(vc, v)?;
        let qp = self.g.permute(q, [0, 2, 1, 3])?;
        let mask = match (cfg.swa_layers[l], self.inp.mask_swa) {
            (true, Some(m)) => m,
            _ => self.inp.mask,
        };
        let sinks = a.sinks.as_ref().map(|s| s.bind(self.g));
        let o = self.g.flash_attn_ext(
            qp,
            k_all,
            v_all,
            Some(mask),
            sinks,
            cfg.attn_scale,
            0.0,
            0.0,
        )?;
        let mut o = self.g.reshape(o, &[cfg.head_dim_v * nh, t])?;
        if let Some(w) = &a.gate {
            let gate = self.linear(w, x, None)?;
            let gate = self.g.unary(gate, UnaryOp::Sigmoid)?;
            o = self.g.mul(o, gate)?;
        }
        self.linear(&a.wo, o, a.bo.as_ref())
    }

    fn dense(&mut self, f: &Dense, x: TensorId) -> Result<TensorId, ModelError> {
        let gate = self.linear(&f.gate, x, None)?;
        let up = self.linear(&f.up, x, None)?;
        let h = self.g.glu(f.act, gate, up)?;
        self.linear(&f.down, h, None)
    }

    /// `experts(x)` for the chosen experts, plus the per-expert bias.
    fn experts(
        &mut self,
        w: &Weight,
        b: Option<&Weight>,
        x: TensorId,
        ids: TensorId,
    ) -> Result<TensorId, ModelError> {
        let w = self.bind(w);
        let y = self.g.mul_mat_id(w, x, ids)?;
        match b {
            Some(b) => {
                let b = self.bind(b);
                Ok(self.g.add_id(y, b, ids)?)
            }
            None => Ok(y),
        }
    }

    fn moe(&mut self, m: &Moe, x: TensorId) -> Result<TensorId, ModelError> {
        let (d, t, k) = (self.model.config.n_embd, self.n_tokens, m.n_used);
        let n_expert = m.router.ne()[1];
        let scores = self.linear(&m.router, x, m.router_b.as_ref())?;
        let (ids, weights) = match m.gating {
            Gating::Softmax { renorm } => {
                let probs = self.g.soft_max(scores, None, None, 1.0, 0.0)?;
                let ids = self.g.top_k(probs, k)?;
                let p3 = self.g.reshape(probs, &[1, n_expert, t])?;
                let mut w = self.g.get_rows(p3, ids)?;
                if renorm {
                    let w2 = self.g.reshape(w, &[k, t])?;
                    let sum = self.g.sum_rows(w2)?;
                    let w2 = self.g.div(w2, sum)?;
                    w = self.g.reshape(w2, &[1, k, t])?;
                }
                (ids, w)
            }
            Gating::SoftmaxOfTopK => {
                let ids = self.g.top_k(scores, k)?;
                let s3 = self.g.reshape(scores, &[1, n_expert, t])?;
                let w = self.g.get_rows(s3, ids)?;
                let w = self.g.reshape(w, &[k, t])?;
                let w = self.g.soft_max(w, None, None, 1.0, 0.0)?;
                (ids, self.g.reshape(w, &[1, k, t])?)
            }
        };
        let x3 = self.g.reshape(x, &[d, 1, t])?;
        let gate = self.experts(&m.gate, m.gate_b.as_ref(), x3, ids)?;
        let up = self.experts(&m.up, m.up_b.as_ref(), x3, ids)?;
        let h = self.g.glu(m.act, gate, up)?;
        let out = self.experts(&m.down, m.down_b.as_ref(), h, ids)?;
        let out = self.g.mul(out, weights)?;
        let nb = *self.g.layout(out);
        let mut sum = self.g.view(out, &[d, t], &[nb.nb[2]], 0)?;
        for e in 1..k {
            let v = self.g.view(out, &[d, t], &[nb.nb[2]], e * nb.nb[1])?;
            sum = self.g.add(sum, v)?;
        }
        if let Some(shared) = &m.shared {
            let mut s = self.dense(&shared.ffn, x)?;
            if let Some(w) = &shared.gate {
                let gate = self.linear(w, x, None)?;
                let gate = self.g.unary(gate, UnaryOp::Sigmoid)?;
                s = self.g.mul(s, gate)?;
            }
            sum = self.g.add(sum, s)?;
        }
        Ok(sum)
    }

    fn layer(
        &mut self,
        layer: &Layer,
        l: usize,
        x: TensorId,
        kv: &KvCache,
    ) -> Result<TensorId, ModelError> {
        let h = self.norm(x, &layer.attn_norm)?;
        let mut a = match &layer.mixer {
            Mixer::Attention(attn) => self.attention(attn, l, h, kv)?,
            Mixer::DeltaNet(dn) => self.delta_net(dn, l, h, kv.recurrent())?,
        };
        if let Some(n) = &layer.attn_post_norm {
            a = self.norm(a, n)?;
        }
        let x = self.g.add(a, x)?;
        let h = self.norm(x, &layer.ffn_norm)?;
        let mut f = match &layer.ffn {
            Ffn::Dense(d) => self.dense(d, h)?,
            Ffn::Moe(m) => self.moe(m, h)?,
        };
        if let Some(n) = &layer.ffn_post_norm {
            f = self.norm(f, n)?;
        }
        Ok(self.g.add(f, x)?)
    }
}

/// Builds the forward graph of `n_tokens` tokens attending to the first `n_kv` cache slots; returns the
/// logits `[n_vocab, n_out]` (marked as output).
pub fn build(
    g: &mut Graph,
    model: &Model,
    kv: &KvCache,
    inp: &Inputs,
    n_tokens: usize,
    n_kv: usize,
) -> Result<TensorId, ModelError> {
    let mut f = Fwd {
        g,
        model,
        inp,
        n_tokens,
        n_kv,
    };
    let table = f.bind(&model.tok_embd);
    let mut x = f.g.get_rows(table, inp.tokens)?;
    if let Some(s) = model.config.embd_scale {
        x = f.g.scale(x, s)?;
    }
    for (l, layer) in model.layers.iter().enumerate() {
        x = f.layer(layer, l, x, kv)?;
    }
    if let Some(ids) = inp.out_ids {
        x = f.g.get_rows(x, ids)?;
    }
    let x = f.norm(x, &model.output_norm)?;
    let logits = f.linear(&model.output, x, None)?;
    f.g.output(logits);
    Ok(logits)
}
