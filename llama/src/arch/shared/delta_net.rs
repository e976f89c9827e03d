//! The gated delta net (linear attention) of the hybrid Qwen3.5 / Qwen3-Next layers: its weights, how
//! they load, and its graph.
//!
//! Per token `t` and value head `h` (key head `kh` shared by several value heads):
//! a causal convolution of kernel `K` (with the previous `K - 1` tokens kept in the recurrent state)
//! and SiLU over the Q/K/V projections, L2-normalised queries and keys (queries also scaled by
//! `1/√head_dim`), `β = σ(b)`, the log decay `g = softplus(a + dt_bias) · ssm_a` (`ssm_a = -exp(A_log)`),
//! then the delta rule on the state `S[key, value]` of the head:
//! `S ← S·e^g`, `S ← S + k ⊗ β (v - Sᵀk)`, `o = Sᵀq`. The output is RMS-normalised per head,
//! gated by `silu(z)` and projected back to the model width.
//!
//! The rule over the whole batch is one op, [`ggml_core::Op::GatedDeltaNet`] (chunked for prompts,
//! token by token for decode, in the backends' kernels); its final state and the last `K - 1`
//! convolution inputs are copied back into the persistent tensors of [`crate::state`].
//!
//! Tensor parallelism: the layer is cut by whole key heads ([`DeltaNetSplits`]): each device convolves,
//! normalises and runs the delta rule over its own heads with its slice of the recurrent state, and
//! the output projection (cut by its input columns) leaves partial sums joined by one AllReduce. The
//! graph is built in full shapes; the meta device follows the splits through it.

use super::blocks::blk;
use super::config::{DeltaNetConfig, ModelConfig};
use super::delta_net_splits::DeltaNetSplits;
use super::forward::Fwd;
use crate::error::ModelError;
use crate::load::{Home, Loader, Weight};
use crate::state::RecurrentState;
use backend_meta::WeightSplit;
use ggml_core::{GluOp, TensorId, UnaryOp};

/// Bytes of an F32 element (every delta-net activation is F32).
const F32: usize = 4;

/// The β (update strength) and α (decay) projections.
pub enum BetaAlpha {
    /// `ssm_beta` and `ssm_alpha`, `[n_embd, n_v_heads]` each (Qwen3.5).
    Separate { beta: Weight, alpha: Weight },
    /// `ssm_ba` `[n_embd, 2 n_v_heads]`: per key head its value heads' β then their α (Qwen3-Next).
    Fused(Weight),
}

/// The weights of one delta-net layer.
pub struct DeltaNet {
    /// `[n_embd, conv_channels]`: queries, keys, values.
    pub qkv: Weight,
    /// `[n_embd, value_dim]`: the output gate `z`.
    pub gate: Weight,
    pub beta_alpha: BetaAlpha,
    /// `[conv_kernel, conv_channels]`.
    pub conv: Weight,
    /// `[n_v_heads]`.
    pub dt_bias: Weight,
    /// `[n_v_heads]`: `-exp(A_log)`.
    pub a: Weight,
    /// `[head_dim]`: the per-head output norm.
    pub norm: Weight,
    /// `[value_dim, n_embd]`.
    pub out: Weight,
    /// How the weights above and the layer's recurrent state are cut over the devices.
    pub splits: DeltaNetSplits,
}

impl DeltaNet {
    /// Loads the delta-net weights of layer `l`, cut by key heads in tensor mode.
    pub fn load(ld: &Loader, cfg: &ModelConfig, l: usize) -> Result<DeltaNet, ModelError> {
        let c = cfg.delta_net_sizes()?;
        let (d, nv, vd) = (cfg.n_embd, c.n_v_heads, c.head_dim * c.n_v_heads);
        let fused_ba = ld.info(&blk(l, "ssm_ba.weight")).is_some();
        let out_name = blk(l, "ssm_out.weight");
        let out_type = ld
            .info(&out_name)
            .map(|i| i.0)
            .ok_or_else(|| ModelError::MissingTensor(out_name.clone()))?;
        let s = if ld.tensor_parallel() {
            DeltaNetSplits::new(c, out_type, fused_ba)
        } else {
            DeltaNetSplits::mirrored()
        };
        let get = |name: &str, ne: &[usize], split: &WeightSplit| {
            ld.get(&blk(l, name), ne, split.clone(), Home::Layer(l))
        };
        let beta_alpha = if fused_ba {
            BetaAlpha::Fused(get("ssm_ba.weight", &[d, 2 * nv], &s.fused_ba_rows)?)
        } else {
            BetaAlpha::Separate {
                beta: get("ssm_beta.weight", &[d, nv], &s.beta_alpha_rows)?,
                alpha: get("ssm_alpha.weight", &[d, nv], &s.beta_alpha_rows)?,
            }
        };
        let channels = c.conv_channels();
        Ok(DeltaNet {
            qkv: get("attn_qkv.weight", &[d, channels], &s.qkv_rows)?,
            gate: get("attn_gate.weight", &[d, vd], &s.gate_rows)?,
            beta_alpha,
            conv: get(
                "ssm_conv1d.weight",
                &[c.conv_kernel, channels],
                &s.conv_channels,
            )?,
            dt_bias: get("ssm_dt.bias", &[nv], &s.per_head)?,
            a: get("ssm_a", &[nv], &s.per_head)?,
            norm: get("ssm_norm.weight", &[c.head_dim], &WeightSplit::Mirrored)?,
            out: get("ssm_out.weight", &[vd, d], &s.out_cols)?,
            splits: s,
        })
    }
}

impl Fwd<'_> {
    /// The delta-net mixer of layer `l` on the normalised input `x` `[n_embd, n_tokens]` (the tokens
    /// of sequence `seq` alone); reads and updates the layer's recurrent state of that sequence.
    pub(super) fn delta_net(
        &mut self,
        dn: &DeltaNet,
        l: usize,
        x: TensorId,
        rs: &RecurrentState,
        seq: usize,
    ) -> Result<TensorId, ModelError> {
        let cfg = self.cfg;
        let c = cfg.delta_net_sizes()?;
        let state = rs
            .layer(seq, l)
            .ok_or_else(|| ModelError::Unsupported(format!("layer {l} has no recurrent state")))?;
        let (hd, nk, nv, t) = (c.head_dim, c.n_k_heads, c.n_v_heads, self.n_tokens);
        let ch = c.conv_channels();
        let [qkv, z] = self.linears([(&dn.qkv, None), (&dn.gate, None)], x)?;
        let (b, alpha) = self.beta_alpha(&dn.beta_alpha, c, x)?;
        let beta = self.g.unary(b, UnaryOp::Sigmoid)?;
        let gate = self.log_decay(dn, alpha)?;
        let conv = self.short_conv(&dn.conv, qkv, &state.conv, c.conv_kernel)?;

        let eps = cfg.rms_eps;
        // Channels as heads, so that queries, keys and values are views of whole (split) segments.
        let heads = self.g.reshape(conv, &[hd, ch / hd, t])?;
        let mut part = |first: usize, n: usize| {
            self.g
                .view(heads, &[hd, n, t], &[hd * F32, ch * F32], first * hd * F32)
        };
        let (q, k, v) = (part(0, nk)?, part(nk, nk)?, part(2 * nk, nv)?);
        // The L2 norm with the attention scale 1/√head_dim folded in.
        let q = self.l2_normalize(q, hd, eps, 1.0 / (hd as f32).sqrt())?;
        let k = self.l2_normalize(k, hd, eps, 1.0)?;

        let gate = self.g.reshape(gate, &[nv, t, 1])?;
        let beta = self.g.reshape(beta, &[nv, t, 1])?;
        let gates = self.g.concat(gate, beta, 2)?;
        let s0 = self.bind(&state.ssm);
        let rule = self.g.gated_delta_net([q, k, v, gates, s0], c.key_heads)?;
        let (row, head) = (hd * F32, hd * nv * F32);
        let o = self.g.view(rule, &[hd, nv, t], &[row, head], 0)?;
        let s = self
            .g
            .view(rule, &[hd, hd, nv], &[row, hd * row], t * head)?;
        let written = self.g.cpy(s, s0)?;
        self.g.expand(written);

        let o = self.norm(o, &dn.norm)?;
        let z = self.g.reshape(z, &[hd, nv, t])?;
        let o = self.g.glu(GluOp::Swiglu, z, o)?;
        let o = self.g.reshape(o, &[hd * nv, t])?;
        self.linear(&dn.out, o, None)
    }

    /// The raw β and α `[n_v_heads, n_tokens]`, value heads in order.
    fn beta_alpha(
        &mut self,
        ba: &BetaAlpha,
        c: &DeltaNetConfig,
        x: TensorId,
    ) -> Result<(TensorId, TensorId), ModelError> {
        let t = self.n_tokens;
        match ba {
            BetaAlpha::Separate { beta, alpha } => {
                let [b, a] = self.linears([(beta, None), (alpha, None)], x)?;
                Ok((b, a))
            }
            BetaAlpha::Fused(w) => {
                let per_key = c.n_v_heads / c.n_k_heads;
                let y = self.linear(w, x, None)?;
                let y = self.g.reshape(y, &[2 * per_key, c.n_k_heads, t])?;
                let nb = self.g.layout(y).nb;
                let mut half = |offset: usize| -> Result<TensorId, ModelError> {
                    let h = self
                        .g
                        .view(y, &[per_key, c.n_k_heads, t], &[nb[1], nb[2]], offset)?;
                    let h = self.g.cont(h)?;
                    Ok(self.g.reshape(h, &[c.n_v_heads, t])?)
                };
                Ok((half(0)?, half(per_key * F32)?))
            }
        }
    }

    /// `softplus(α + dt_bias) · ssm_a` `[n_v_heads, n_tokens]`: the per-token log decay of the state.
    fn log_decay(&mut self, dn: &DeltaNet, alpha: TensorId) -> Result<TensorId, ModelError> {
        let dt = self.bind(&dn.dt_bias);
        let biased = self.g.add(alpha, dt)?;
        let sp = self.g.unary(biased, UnaryOp::Softplus)?;
        let a = self.bind(&dn.a);
        Ok(self.g.mul(sp, a)?)
    }

    /// SiLU of the causal convolution of `qkv` `[channels, n_tokens]` over the stored inputs of the
    /// previous `kernel - 1` tokens followed by the batch; stores the last `kernel - 1` inputs.
    fn short_conv(
        &mut self,
        w: &Weight,
        qkv: TensorId,
        state: &Weight,
        kernel: usize,
    ) -> Result<TensorId, ModelError> {
        let t = self.n_tokens;
        let ch = self.g.layout(qkv).ne[0];
        let row = ch * F32;
        let past = self.bind(state);
        let inputs = self.g.concat(past, qkv, 1)?;
        let w = self.bind(w);
        let kept = self.g.view(inputs, &[ch, kernel - 1], &[row], t * row)?;
        let written = self.g.cpy(kept, past)?;
        self.g.expand(written);
        let out = if t == 1 {
            self.conv_one_token(inputs, w)?
        } else {
            self.conv_taps(inputs, w, kernel)?
        };
        Ok(self.g.silu(out)?)
    }

    /// The convolution of one token: `inputs` `[channels, kernel]` (transposed, a view) times the
    /// weight `[kernel, channels]` element by element, summed over the taps: two launches.
    fn conv_one_token(&mut self, inputs: TensorId, w: TensorId) -> Result<TensorId, ModelError> {
        let ch = self.g.layout(inputs).ne[0];
        let taps = self.g.transpose(inputs)?;
        let p = self.g.mul(taps, w)?;
        let sums = self.g.sum_rows(p)?;
        Ok(self.g.reshape(sums, &[ch, 1])?)
    }

    /// The convolution of a batch: a product and a sum per tap over the shifted inputs
    /// `[channels, kernel - 1 + n_tokens]`.
    fn conv_taps(
        &mut self,
        inputs: TensorId,
        w: TensorId,
        kernel: usize,
    ) -> Result<TensorId, ModelError> {
        let t = self.n_tokens;
        let ch = self.g.layout(inputs).ne[0];
        let row = ch * F32;
        let wt = self.g.transpose(w)?;
        let wt = self.g.cont(wt)?;
        let mut acc: Option<TensorId> = None;
        for j in 0..kernel {
            let xj = self.g.view(inputs, &[ch, t], &[row], j * row)?;
            let wj = self.g.view(wt, &[ch], &[], j * row)?;
            let p = self.g.mul(xj, wj)?;
            acc = Some(match acc {
                Some(a) => self.g.add(a, p)?,
                None => p,
            });
        }
        acc.ok_or_else(|| ModelError::Unsupported("a convolution kernel of 0".into()))
    }

    /// `scale · x / ‖x‖` per head of `x` `[head_dim, heads, n_tokens]` (contiguous result), as an RMS
    /// norm: `x / ‖x‖ = rms_norm(x) / √head_dim`, with ε² spread over the elements.
    fn l2_normalize(
        &mut self,
        x: TensorId,
        hd: usize,
        eps: f32,
        scale: f32,
    ) -> Result<TensorId, ModelError> {
        let n = self.g.rms_norm(x, eps * eps / hd as f32)?;
        Ok(self.g.scale(n, scale / (hd as f32).sqrt())?)
    }
}
