//! The KV cache of one or several sequences: per attention layer a K and a V tensor
//! `[head_dim, n_seq * n_ctx, n_head_kv]` (F16 by default; F32 or Q8_0 selectable) living with the
//! layer's weights (its device in a layer split, split by KV heads on a meta device). Sequence `s`
//! owns the region of rows `s * n_ctx .. (s + 1) * n_ctx`, position `p` being row `s * n_ctx + p`.
//! The other (delta-net) layers keep a recurrent state per sequence instead ([`RecurrentState`]).
//! Also the host-built attention masks of one sequence over the first `n_kv` slots of its region. A
//! layer that attends to an earlier layer's cache
//! ([`ModelConfig::kv_source`](crate::ModelConfig::kv_source)) has none of its own:
//! its entry is that layer's tensors.

use crate::arch::shared::blocks::Mixer;
use crate::load::{limits, Alloc, Home, Weight};
use crate::model::{Model, ModelError};
use crate::state::RecurrentState;
use backend_meta::WeightSplit;
use ggml_core::DType;

/// Granularity of the attended cache length: graphs repeat their structure while the length stays
/// inside one step.
pub const KV_PAD: usize = 256;

/// K and V tensors of every attention layer, and the recurrent states of the others.
pub struct KvCache {
    layers: Vec<Option<(Weight, Weight)>>,
    recurrent: RecurrentState,
    n_ctx: usize,
    n_seq: usize,
    dtype: DType,
}

impl KvCache {
    /// A zeroed cache of `n_seq` sequences of `n_ctx` slots per layer of `model`, of element type
    /// `dtype`.
    pub fn new(
        model: &Model,
        n_ctx: usize,
        n_seq: usize,
        dtype: DType,
    ) -> Result<KvCache, ModelError> {
        if !matches!(dtype, DType::F16 | DType::F32 | DType::Q8_0) {
            return Err(ModelError::Unsupported(format!(
                "KV cache type {dtype} (F16, F32 or Q8_0)"
            )));
        }
        limits::CONTEXT.check("cache slots per sequence (n_ctx)", n_ctx)?;
        limits::SEQUENCES.check("cache sequences (n_seq)", n_seq)?;
        let rows = limits::product("cache rows (n_ctx × n_seq)", n_ctx, n_seq, limits::ROWS)?;
        let cfg = &model.config;
        let alloc = model.alloc();
        let model_layers = &model.weights.layers;
        let mut layers: Vec<Option<(Weight, Weight)>> = Vec::with_capacity(model_layers.len());
        for (l, layer) in model_layers.iter().enumerate() {
            let Mixer::Attention(attn) = &layer.mixer else {
                layers.push(None);
                continue;
            };
            let source = cfg.kv_source[l];
            if source != l {
                let shared = layers.get(source).cloned().flatten().ok_or_else(|| {
                    ModelError::Unsupported(format!(
                        "layer {l} reads the KV cache of layer {source}, which has none before it"
                    ))
                })?;
                layers.push(Some(shared));
                continue;
            }
            let shape = cfg.attn_shape(l);
            for d in [shape.head_dim, shape.head_dim_v] {
                if d % dtype.block_size() != 0 {
                    return Err(ModelError::Unsupported(format!(
                        "KV cache type {dtype} with head size {d} (not whole blocks)"
                    )));
                }
            }
            let (split, heads) = (&attn.splits.cache, shape.n_head_kv);
            let k = cache_tensor(&alloc, split, l, "k", shape.head_dim, rows, dtype, heads)?;
            let v = cache_tensor(&alloc, split, l, "v", shape.head_dim_v, rows, dtype, heads)?;
            layers.push(Some((k, v)));
        }
        Ok(KvCache {
            layers,
            recurrent: RecurrentState::new(model, n_seq)?,
            n_ctx,
            n_seq,
            dtype,
        })
    }

    /// The K and V tensors of layer `l` (those of the layer it shares them with, if any); an error for
    /// a delta-net layer, which has none.
    pub fn layer(&self, l: usize) -> Result<(&Weight, &Weight), ModelError> {
        match self.layers.get(l) {
            Some(Some((k, v))) => Ok((k, v)),
            Some(None) => Err(ModelError::Unsupported(format!(
                "layer {l} keeps a recurrent state, not a KV cache"
            ))),
            None => Err(ModelError::Input(format!(
                "layer {l} of {}",
                self.layers.len()
            ))),
        }
    }

    /// The recurrent state of the delta-net layers (one per sequence).
    pub fn recurrent(&self) -> &RecurrentState {
        &self.recurrent
    }

    /// Slots of each sequence.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Sequences the cache holds.
    pub fn n_seq(&self) -> usize {
        self.n_seq
    }

    /// The cache row of position `pos` of sequence `seq`.
    pub fn row(&self, seq: usize, pos: usize) -> usize {
        seq * self.n_ctx + pos
    }

    /// Buffer offset and byte length of positions `0..n` of sequence `seq` for KV head `head` in
    /// cache tensor `t` (one of [`KvCache::layer`]'s): contiguous rows.
    pub fn span(&self, t: &Weight, seq: usize, head: usize, n: usize) -> (usize, usize) {
        let nb = t.layout.nb;
        (
            t.data.offset + head * nb[2] + self.row(seq, 0) * nb[1],
            n * nb[1],
        )
    }

    /// Copies positions `0..n` of sequence `from` into sequence `to` (K/V rows of every attention
    /// layer and, for the delta-net layers, the whole recurrent state), so `to` continues from the
    /// same prefix without evaluating it again.
    pub fn copy_sequence(&self, from: usize, to: usize, n: usize) -> Result<(), ModelError> {
        for seq in [from, to] {
            if seq >= self.n_seq {
                return Err(ModelError::Input(format!(
                    "sequence {seq} of {}",
                    self.n_seq
                )));
            }
        }
        if n > self.n_ctx {
            return Err(ModelError::Input(format!(
                "{n} positions exceed the context of {}",
                self.n_ctx
            )));
        }
        if from == to {
            return Ok(());
        }
        let mut buf = Vec::new();
        let mut done: Vec<&str> = Vec::new();
        for (k, v) in self.layers.iter().flatten() {
            // A layer sharing another's cache holds the same tensors: copy them once.
            if done.contains(&k.name.as_str()) {
                continue;
            }
            done.push(&k.name);
            for t in [k, v] {
                for head in 0..t.ne()[2] {
                    let (src, len) = self.span(t, from, head, n);
                    let (dst, _) = self.span(t, to, head, n);
                    copy_bytes(t, src, t, dst, len, &mut buf)?;
                }
            }
        }
        for l in 0..self.layers.len() {
            let (Some(a), Some(b)) = (self.recurrent.layer(from, l), self.recurrent.layer(to, l))
            else {
                continue;
            };
            for (s, d) in [(&a.conv, &b.conv), (&a.ssm, &b.ssm)] {
                let len = s.layout.nbytes();
                copy_bytes(s, s.data.offset, d, d.data.offset, len, &mut buf)?;
            }
        }
        Ok(())
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Cache slots attended by a batch ending at `end` positions: `end` rounded up to [`KV_PAD`],
    /// at most `n_ctx`.
    pub fn n_kv_for(&self, end: usize) -> usize {
        end.div_ceil(KV_PAD).saturating_mul(KV_PAD).min(self.n_ctx)
    }
}

/// Copies `len` bytes at `src_offset` of `src`'s buffer to `dst_offset` of `dst`'s, through `buf`.
fn copy_bytes(
    src: &Weight,
    src_offset: usize,
    dst: &Weight,
    dst_offset: usize,
    len: usize,
    buf: &mut Vec<u8>,
) -> Result<(), ModelError> {
    buf.resize(len, 0);
    src.data.buffer.get(src_offset, buf)?;
    dst.data.buffer.set(dst_offset, buf)?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn cache_tensor(
    alloc: &Alloc,
    split: &WeightSplit,
    l: usize,
    which: &str,
    d: usize,
    rows: usize,
    dtype: DType,
    heads: usize,
) -> Result<Weight, ModelError> {
    let name = format!("cache_{which}_l{l}");
    let layout = limits::layout(&name, dtype, [d, rows, heads, 1])?;
    let data = alloc.alloc(&name, layout, split, Home::Layer(l))?;
    data.buffer.fill(data.offset, layout.nbytes(), 0)?;
    Ok(Weight { name, layout, data })
}

/// Writes the `[n_kv, n_tokens]` mask of queries at positions `n_past..` into `out` (`n_tokens`
/// rows of `n_kv` values; a partial last row is left as it is): key slot `j` is visible (0) from
/// position `p` when `j <= p` and, with a window `swa > 0`, `p - j < swa`; the others are -inf.
/// Each row is three runs (hidden, visible, hidden), written at the speed of a fill.
pub fn write_mask(out: &mut [f32], n_past: usize, n_kv: usize, swa: usize) {
    if n_kv == 0 {
        return;
    }
    for (i, row) in out.chunks_exact_mut(n_kv).enumerate() {
        let p = n_past + i;
        let lo = if swa > 0 {
            (p + 1).saturating_sub(swa)
        } else {
            0
        };
        let hi = (p + 1).min(n_kv);
        let lo = lo.min(hi);
        row[..lo].fill(f32::NEG_INFINITY);
        row[lo..hi].fill(0.0);
        row[hi..].fill(f32::NEG_INFINITY);
    }
}

#[cfg(test)]
mod tests {
    use super::write_mask;

    /// The mask element by element, as the definition reads.
    fn reference(n_past: usize, n_tokens: usize, n_kv: usize, swa: usize) -> Vec<f32> {
        let mut m = vec![f32::NEG_INFINITY; n_kv * n_tokens];
        for i in 0..n_tokens {
            let p = n_past + i;
            for j in 0..n_kv {
                if j <= p && (swa == 0 || p - j < swa) {
                    m[i * n_kv + j] = 0.0;
                }
            }
        }
        m
    }

    /// `write_mask` into a buffer that held another mask.
    fn written(n_past: usize, n_tokens: usize, n_kv: usize, swa: usize) -> Vec<f32> {
        let mut m = vec![7.0; n_kv * n_tokens];
        write_mask(&mut m, n_past, n_kv, swa);
        m
    }

    #[test]
    fn causal_and_windowed_masks() {
        let inf = f32::NEG_INFINITY;
        assert_eq!(
            written(1, 2, 4, 0),
            [0.0, 0.0, inf, inf, 0.0, 0.0, 0.0, inf]
        );
        assert_eq!(written(3, 1, 4, 2), [inf, inf, 0.0, 0.0]);
    }

    #[test]
    fn runs_match_the_definition() {
        // Causal and windowed, windows wider than the cache, queries past the attended slots.
        for (n_past, n_tokens, n_kv) in
            [(0, 5, 8), (3, 4, 8), (0, 16, 16), (250, 9, 256), (9, 3, 8)]
        {
            for swa in [0, 1, 2, 5, 300] {
                let want = reference(n_past, n_tokens, n_kv, swa);
                assert_eq!(
                    written(n_past, n_tokens, n_kv, swa),
                    want,
                    "n_past {n_past}, {n_tokens} tokens, n_kv {n_kv}, window {swa}"
                );
            }
        }
        write_mask(&mut [], 0, 0, 0);
    }
}
