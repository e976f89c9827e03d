//! The forward graph shared by every architecture: embeddings, then per layer norm → attention (KV
//! cache written with `set_rows` at the batch's cache rows, then per sequence flash attention of its
//! tokens over the first `n_kv` slots of its cache region with a host-built causal / sliding-window
//! mask, optionally gated per head; or a gated delta net ([`super::delta_net`]) over the recurrent
//! state of the batch's one sequence) → residual → norm → dense FFN or mixture of experts (with an
//! optional shared expert) → residual, then the output norm and head for the requested rows. A batch
//! holds the tokens of one or several sequences; everything but the attention runs on all of them at
//! once. An architecture adds its own parts through [`super::hooks`] (Gemma 4: per-layer inputs,
//! dense FFN next to experts).

use super::blocks::{Attention, Dense, ExpertsIn, Ffn, Gating, Layer, Mixer, Moe};
use super::config::ModelConfig;
use super::hooks::Extension;
use super::ModelWeights;
use crate::error::ModelError;
use crate::kv::KvCache;
use crate::load::Weight;
use ggml_core::{Graph, TensorId, UnaryOp};

/// The inputs of one forward graph.
pub struct Inputs {
    /// I32 `[n_tokens]` token ids.
    pub tokens: TensorId,
    /// I32 `[n_tokens]` positions (of each token in its sequence).
    pub pos: TensorId,
    /// I32 `[n_tokens]` cache rows written ([`KvCache::row`] of each token's sequence and position).
    pub kv_rows: TensorId,
    /// The batch's sequences, each a contiguous run of tokens, in batch order.
    pub seqs: Vec<SeqInputs>,
    /// I32 `[n_out]` rows whose logits are wanted (`None`: all).
    pub out_ids: Option<TensorId>,
}

/// One sequence's tokens in a batch and the part of its cache region they attend.
pub struct SeqInputs {
    /// The sequence (its cache region and recurrent state).
    pub seq: usize,
    /// Index of its first token in the batch.
    pub first: usize,
    pub n_tokens: usize,
    /// The cache row of its position 0.
    pub kv_start: usize,
    /// Cache slots attended, from `kv_start`.
    pub n_kv: usize,
    /// F32 `[n_kv, n_tokens]` causal mask (0 or -inf).
    pub mask: TensorId,
    /// F32 `[n_kv, n_tokens]` causal sliding-window mask, for models with windowed layers.
    pub mask_swa: Option<TensorId>,
}

/// Graph-building state of one forward pass (what the architectures' [`super::hooks`] build on).
pub struct Fwd<'a> {
    pub(crate) g: &'a mut Graph,
    pub(crate) cfg: &'a ModelConfig,
    pub(crate) inp: &'a Inputs,
    pub(crate) n_tokens: usize,
    /// Per layer with attention built so far: the written K and V caches it attends to (shared-KV
    /// layers reuse their source layer's, which orders them after its cache writes).
    kv_views: Vec<Option<(TensorId, TensorId)>>,
}

impl Fwd<'_> {
    pub(crate) fn bind(&mut self, w: &Weight) -> TensorId {
        w.bind(self.g)
    }

    pub(crate) fn norm(&mut self, x: TensorId, w: &Weight) -> Result<TensorId, ModelError> {
        let h = self.g.rms_norm(x, self.cfg.rms_eps)?;
        let w = self.bind(w);
        Ok(self.g.mul(h, w)?)
    }

    /// `w · x (+ b)`.
    pub(crate) fn linear(
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

    /// `w · x (+ b)` for several weights of one input, the products next to each other in the
    /// graph's node order (a backend can then run them together; the biases come after).
    pub(super) fn linears<const N: usize>(
        &mut self,
        ws: [(&Weight, Option<&Weight>); N],
        x: TensorId,
    ) -> Result<[TensorId; N], ModelError> {
        let mut ys = [x; N];
        for (y, (w, _)) in ys.iter_mut().zip(&ws) {
            let w = self.bind(w);
            *y = self.g.mul_mat(w, x)?;
        }
        for &y in &ys {
            self.g.expand(y);
        }
        for (y, (_, b)) in ys.iter_mut().zip(&ws) {
            if let Some(b) = b {
                let b = self.bind(b);
                *y = self.g.add(*y, b)?;
            }
        }
        Ok(ys)
    }

    /// Splits a Q or K projection into heads `[head_dim, n_heads, n_tokens]`, normalises and rotates
    /// them.
    fn heads(
        &mut self,
        a: &Attention,
        y: TensorId,
        head_dim: usize,
        n_heads: usize,
        norm: Option<&Weight>,
        l: usize,
    ) -> Result<TensorId, ModelError> {
        let cfg = self.cfg;
        let mut y = self.g.reshape(y, &[head_dim, n_heads, self.n_tokens])?;
        if let Some(n) = norm {
            y = self.norm(y, n)?;
        }
        let freqs = a.rope_freqs.as_ref().map(|f| f.bind(self.g));
        Ok(self.g.rope(y, self.inp.pos, freqs, cfg.rope_of(l))?)
    }

    /// Writes `[d, n_heads, n_tokens]` rows into a cache `[d, rows, n_heads]` at the batch's cache
    /// rows; returns the written cache.
    fn write_cache(&mut self, cache: &Weight, x: TensorId) -> Result<TensorId, ModelError> {
        let c = self.bind(cache);
        let xp = self.g.permute(x, [0, 2, 1, 3])?;
        Ok(self.g.set_rows(c, xp, self.inp.kv_rows)?)
    }

    /// The view of the written cache `[d, rows, n_heads]` that sequence `s` attends.
    fn attended(&mut self, written: TensorId, s: &SeqInputs) -> Result<TensorId, ModelError> {
        let l = *self.g.layout(written);
        let [d, _, heads, _] = l.ne;
        Ok(self.g.view(
            written,
            &[d, s.n_kv, heads],
            &[l.nb[1], l.nb[2]],
            s.kv_start * l.nb[1],
        )?)
    }

    /// The sequence of a batch that holds one (layers with a recurrent state run one per pass).
    fn only_seq(&self) -> Result<usize, ModelError> {
        match self.inp.seqs.as_slice() {
            [s] => Ok(s.seq),
            seqs => Err(ModelError::Unsupported(format!(
                "{} sequences in one pass over delta-net layers (one at a time)",
                seqs.len()
            ))),
        }
    }

    /// The tokens of sequence `s` in `x` `[d, n_tokens, n_heads]`.
    fn tokens_of(&mut self, x: TensorId, s: &SeqInputs) -> Result<TensorId, ModelError> {
        if s.first == 0 && s.n_tokens == self.n_tokens {
            return Ok(x);
        }
        let l = *self.g.layout(x);
        let [d, _, heads, _] = l.ne;
        Ok(self.g.view(
            x,
            &[d, s.n_tokens, heads],
            &[l.nb[1], l.nb[2]],
            s.first * l.nb[1],
        )?)
    }

    fn attention(
        &mut self,
        a: &Attention,
        l: usize,
        x: TensorId,
        kv: &KvCache,
    ) -> Result<TensorId, ModelError> {
        let cfg = self.cfg;
        let shape = cfg.attn_shape(l);
        let (nh, nkv, t) = (shape.n_head, shape.n_head_kv, self.n_tokens);
        let projections = match (&a.wk, &a.wv) {
            (Some(wk), Some(wv)) => {
                let [q, k, v] = self.linears(
                    [
                        (&a.wq, a.bq.as_ref()),
                        (wk, a.bk.as_ref()),
                        (wv, a.bv.as_ref()),
                    ],
                    x,
                )?;
                (q, Some((k, v)))
            }
            (Some(wk), None) => {
                let [q, k] = self.linears([(&a.wq, a.bq.as_ref()), (wk, a.bk.as_ref())], x)?;
                (q, Some((k, k)))
            }
            (None, _) => (self.linear(&a.wq, x, a.bq.as_ref())?, None),
        };
        let q = self.heads(a, projections.0, shape.head_dim, nh, a.q_norm.as_ref(), l)?;
        let (k_all, v_all) = match projections.1 {
            Some((k_proj, v)) => {
                let k = self.heads(a, k_proj, shape.head_dim, nkv, a.k_norm.as_ref(), l)?;
                let mut v = self.g.reshape(v, &[shape.head_dim_v, nkv, t])?;
                if a.v_norm {
                    v = self.g.rms_norm(v, cfg.rms_eps)?;
                }
                let (kc, vc) = kv.layer(l)?;
                (self.write_cache(kc, k)?, self.write_cache(vc, v)?)
            }
            None => self.kv_views[cfg.kv_source[l]].ok_or_else(|| {
                ModelError::Unsupported(format!(
                    "layer {l} attends to the cache of layer {}, not built before it",
                    cfg.kv_source[l]
                ))
            })?,
        };
        self.kv_views[l] = Some((k_all, v_all));
        let qp = self.g.permute(q, [0, 2, 1, 3])?;
        let sinks = a.sinks.as_ref().map(|s| s.bind(self.g));
        // Each sequence attends its own cache region; the outputs are joined in batch order.
        let inp = self.inp;
        let mut out: Option<TensorId> = None;
        for s in &inp.seqs {
            let q_s = self.tokens_of(qp, s)?;
            let k_s = self.attended(k_all, s)?;
            let v_s = self.attended(v_all, s)?;
            let mask = match (cfg.swa_layers[l], s.mask_swa) {
                (true, Some(m)) => m,
                _ => s.mask,
            };
            let o = self.g.flash_attn_ext(
                q_s,
                k_s,
                v_s,
                Some(mask),
                sinks,
                cfg.attn_scale,
                0.0,
                0.0,
            )?;
            out = Some(match out {
                Some(prev) => self.g.concat(prev, o, 2)?,
                None => o,
            });
        }
        let o = out.ok_or_else(|| ModelError::Input("a batch without sequences".into()))?;
        let mut o = self.g.reshape(o, &[shape.head_dim_v * nh, t])?;
        if let Some(w) = &a.gate {
            let gate = self.linear(w, x, None)?;
            let gate = self.g.unary(gate, UnaryOp::Sigmoid)?;
            o = self.g.mul(o, gate)?;
        }
        self.linear(&a.wo, o, a.bo.as_ref())
    }

    pub(crate) fn dense(&mut self, f: &Dense, x: TensorId) -> Result<TensorId, ModelError> {
        let [gate, up] = self.linears([(&f.gate, None), (&f.up, None)], x)?;
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
        let scores = self.linear(&m.router, x, m.router_b.as_ref())?;
        self.experts_mix(m, x, scores)
    }

    /// The experts chosen by the router `scores` `[n_expert, n_tokens]` applied to `x`, weighted and
    /// summed, plus the shared expert's output if there is one.
    pub(crate) fn experts_mix(
        &mut self,
        m: &Moe,
        x: TensorId,
        scores: TensorId,
    ) -> Result<TensorId, ModelError> {
        let (d, t, k) = (self.cfg.n_embd, self.n_tokens, m.n_used);
        let n_expert = m.router.ne()[1];
        let (ids, mut weights) = match m.gating {
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
        // The router's nodes next to each other in the node order (the expert products would
        // otherwise come between its choice and its weights), so that a GPU runs it as one launch.
        self.g.expand(weights);
        if let Some(s) = &m.down_scale {
            // Each chosen expert's output scale, looked up like rows of a `[1, n_expert]` table.
            let s = self.bind(s);
            let table = self.g.reshape(s, &[1, n_expert])?;
            let flat = self.g.reshape(ids, &[k * t])?;
            let chosen = self.g.get_rows(table, flat)?;
            let chosen = self.g.reshape(chosen, &[1, k, t])?;
            weights = self.g.mul(weights, chosen)?;
        }
        let x3 = self.g.reshape(x, &[d, 1, t])?;
        let h = match &m.experts_in {
            ExpertsIn::Separate { gate, up } => {
                let gate = self.experts(gate, m.gate_b.as_ref(), x3, ids)?;
                let up = self.experts(up, m.up_b.as_ref(), x3, ids)?;
                self.g.glu(m.act, gate, up)?
            }
            ExpertsIn::Fused(gate_up) => {
                let gate_up = self.experts(gate_up, None, x3, ids)?;
                self.g.glu_fused(m.act, gate_up, false)?
            }
        };
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

    /// Layer `l` on the residual `x`; `ext` is the model's extension with its pass input.
    fn layer(
        &mut self,
        layer: &Layer,
        l: usize,
        x: TensorId,
        kv: &KvCache,
        ext: Option<(&dyn Extension, TensorId)>,
    ) -> Result<TensorId, ModelError> {
        let h = self.norm(x, &layer.attn_norm)?;
        let mut a = match &layer.mixer {
            Mixer::Attention(attn) => self.attention(attn, l, h, kv)?,
            Mixer::DeltaNet(dn) => {
                let seq = self.only_seq()?;
                self.delta_net(dn, l, h, kv.recurrent(), seq)?
            }
        };
        if let Some(n) = &layer.attn_post_norm {
            a = self.norm(a, n)?;
        }
        let x = self.g.add(a, x)?;
        let h = self.norm(x, &layer.ffn_norm)?;
        let mut f = match &layer.ffn {
            Ffn::Dense(d) => self.dense(d, h)?,
            Ffn::Moe(m) => self.moe(m, h)?,
            Ffn::Custom(c) => c.build(self, h, x)?,
        };
        if let Some(n) = &layer.ffn_post_norm {
            f = self.norm(f, n)?;
        }
        let mut x = self.g.add(f, x)?;
        if let Some((e, input)) = ext {
            x = e.layer_output(self, l, x, input)?;
        }
        if let Some(s) = &layer.out_scale {
            let s = self.bind(s);
            x = self.g.mul(x, s)?;
        }
        Ok(x)
    }
}

/// Builds the forward graph of a batch of `n_tokens` tokens of the model of `cfg` and `w`; returns
/// the logits `[n_vocab, n_out]` (marked as output).
pub fn build(
    g: &mut Graph,
    cfg: &ModelConfig,
    w: &ModelWeights,
    kv: &KvCache,
    inp: &Inputs,
    n_tokens: usize,
) -> Result<TensorId, ModelError> {
    let mut f = Fwd {
        g,
        cfg,
        inp,
        n_tokens,
        kv_views: vec![None; w.layers.len()],
    };
    let table = f.bind(&w.head.tok_embd);
    let mut x = f.g.get_rows(table, inp.tokens)?;
    if let Some(s) = cfg.embd_scale {
        x = f.g.scale(x, s)?;
    }
    let ext = match w.extension.as_deref() {
        Some(e) => Some((e, e.pass_input(&mut f, x)?)),
        None => None,
    };
    for (l, layer) in w.layers.iter().enumerate() {
        x = f.layer(layer, l, x, kv, ext)?;
    }
    if let Some(ids) = inp.out_ids {
        x = f.g.get_rows(x, ids)?;
    }
    let x = f.norm(x, &w.head.output_norm)?;
    let mut logits = f.linear(&w.head.output, x, None)?;
    if let Some(c) = cfg.final_logit_softcap {
        let y = f.g.scale(logits, 1.0 / c)?;
        let y = f.g.unary(y, UnaryOp::Tanh)?;
        logits = f.g.scale(y, c)?;
    }
    f.g.output(logits);
    Ok(logits)
}
