//! How a gated delta-net layer is cut for tensor parallelism: by whole key heads, each device taking
//! its key heads' queries and keys and the value heads that read them, so that the delta rule runs on
//! every device over its own heads and only the output projection's partial sums are joined.
//!
//! The fused Q/K/V rows (and the convolution's channels, weight and state alike) are three or more
//! segments cut in step: queries and keys `n_k_heads` heads each, then the values. With Qwen3-Next's
//! grouped sharing (value head `h` reads key head `h / ratio`) the values are one segment cut
//! `ratio` heads per key head; with Qwen3.5's tiled sharing (value head `h` reads key head
//! `h % n_k_heads`) they are `ratio` copies of the key heads, so `ratio` segments each cut like the
//! keys: a device's value heads then tile its own key heads, with no regrouping of the file's rows.
//! The per-value-head tensors (output gate `z`, β and α rows, `dt_bias`, `A`, the recurrent state and
//! the output projection's columns) follow the value segments. Every segment of every split of one
//! layer is cut with the layer's rotation ([`WeightSplit::InStep`]), so segments of as many units
//! are cut alike.
//!
//! A unit of the cut is the fewest key heads whose output-projection columns are whole quant blocks
//! (one key head for 128-wide heads and 32-element blocks, two for tiled 128-wide heads and K-quants'
//! 256). A layer is mirrored when it has fewer than two units, or when a fused β/α projection meets
//! tiled sharing.

use super::config::{DeltaNetConfig, KeyHeadMap};
use backend_meta::WeightSplit;
use ggml_core::DType;

/// The splits of one delta-net layer's weights and recurrent state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeltaNetSplits {
    /// `attn_qkv` `[n_embd, conv_channels]`: rows by queries, keys and values.
    pub qkv_rows: WeightSplit,
    /// `ssm_conv1d` `[conv_kernel, conv_channels]`: channels like the Q/K/V rows.
    pub conv_channels: WeightSplit,
    /// The convolution state `[conv_channels, conv_kernel - 1]`.
    pub conv_state: WeightSplit,
    /// `attn_gate` `[n_embd, value_dim]`: rows by value heads.
    pub gate_rows: WeightSplit,
    /// `ssm_beta`, `ssm_alpha` `[n_embd, n_v_heads]`.
    pub beta_alpha_rows: WeightSplit,
    /// `ssm_ba` `[n_embd, 2 n_v_heads]` (per key head its value heads' β then α).
    pub fused_ba_rows: WeightSplit,
    /// `ssm_dt.bias`, `ssm_a` `[n_v_heads]`.
    pub per_head: WeightSplit,
    /// `ssm_out` `[value_dim, n_embd]`: columns by value heads (partial sums).
    pub out_cols: WeightSplit,
    /// The recurrent state `[head_dim, head_dim, n_v_heads]`.
    pub state: WeightSplit,
}

impl DeltaNetSplits {
    /// Every weight and state whole on every device.
    pub fn mirrored() -> DeltaNetSplits {
        let m = WeightSplit::Mirrored;
        DeltaNetSplits {
            qkv_rows: m.clone(),
            conv_channels: m.clone(),
            conv_state: m.clone(),
            gate_rows: m.clone(),
            beta_alpha_rows: m.clone(),
            fused_ba_rows: m.clone(),
            per_head: m.clone(),
            out_cols: m.clone(),
            state: m,
        }
    }

    /// The head split of a layer of sizes `c` whose output projection has type `out_type` (and
    /// whose β/α projection is fused when `fused_ba`), or [`DeltaNetSplits::mirrored`] where the
    /// layer cannot be cut (see the module doc).
    pub fn new(c: &DeltaNetConfig, out_type: DType, fused_ba: bool) -> DeltaNetSplits {
        let (hd, nk, nv) = (c.head_dim, c.n_k_heads, c.n_v_heads);
        if nk == 0 || !nv.is_multiple_of(nk) || (fused_ba && c.key_heads == KeyHeadMap::Tiled) {
            return DeltaNetSplits::mirrored();
        }
        let ratio = nv / nk;
        let value_heads_per_key = match c.key_heads {
            KeyHeadMap::Grouped => ratio,
            KeyHeadMap::Tiled => 1,
        };
        // The fewest key heads per unit whose output columns are whole quant blocks.
        let columns = value_heads_per_key * hd;
        let block = out_type.block_size();
        let keys_per_unit = block / gcd(block, columns);
        // One unit would put the whole layer on one device: mirror it.
        if !nk.is_multiple_of(keys_per_unit) || nk / keys_per_unit < 2 {
            return DeltaNetSplits::mirrored();
        }
        let shape = ValueHeads {
            share: c.key_heads,
            n_k_heads: nk,
            ratio,
            value_heads_per_key,
            keys_per_unit,
        };
        let keys = (nk * hd, keys_per_unit * hd);
        let channels = [vec![keys, keys], shape.segments(hd)].concat();
        let axis =
            |axis: usize, segments: Vec<(usize, usize)>| WeightSplit::InStep { axis, segments };
        DeltaNetSplits {
            qkv_rows: axis(1, channels.clone()),
            conv_channels: axis(1, channels.clone()),
            conv_state: axis(0, channels),
            gate_rows: axis(1, shape.segments(hd)),
            beta_alpha_rows: axis(1, shape.segments(1)),
            fused_ba_rows: axis(1, vec![(2 * nv, 2 * ratio * keys_per_unit)]),
            per_head: axis(0, shape.segments(1)),
            out_cols: axis(0, shape.segments(hd)),
            state: axis(2, shape.segments(1)),
        }
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// How the value heads line up with the key heads they read, and the key heads of one unit of the
/// cut.
struct ValueHeads {
    share: KeyHeadMap,
    n_k_heads: usize,
    ratio: usize,
    /// Value heads of one segment that one key head brings (`ratio` grouped, 1 tiled).
    value_heads_per_key: usize,
    keys_per_unit: usize,
}

impl ValueHeads {
    /// The `(length, granularity)` segments of an axis holding `per_head` elements per value head,
    /// each `n_k_heads / keys_per_unit` units long.
    fn segments(&self, per_head: usize) -> Vec<(usize, usize)> {
        let per_key = self.value_heads_per_key * per_head;
        let segment = (self.n_k_heads * per_key, self.keys_per_unit * per_key);
        match self.share {
            KeyHeadMap::Grouped => vec![segment],
            KeyHeadMap::Tiled => vec![segment; self.ratio],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_step(axis: usize, segments: Vec<(usize, usize)>) -> WeightSplit {
        WeightSplit::InStep { axis, segments }
    }

    fn config(nk: usize, nv: usize, key_heads: KeyHeadMap) -> DeltaNetConfig {
        DeltaNetConfig {
            conv_kernel: 4,
            head_dim: 32,
            n_k_heads: nk,
            n_v_heads: nv,
            key_heads,
            layers: vec![true],
        }
    }

    #[test]
    fn tiled_values_are_copies_of_the_key_heads() {
        let s = DeltaNetSplits::new(&config(2, 4, KeyHeadMap::Tiled), DType::Q8_0, false);
        let seg = (64, 32);
        assert_eq!(
            s.qkv_rows,
            WeightSplit::InStep {
                axis: 1,
                segments: vec![seg; 4]
            }
        );
        assert_eq!(
            s.state,
            WeightSplit::InStep {
                axis: 2,
                segments: vec![(2, 1); 2]
            }
        );
    }

    #[test]
    fn grouped_values_are_cut_by_key_head_groups() {
        let s = DeltaNetSplits::new(&config(2, 4, KeyHeadMap::Grouped), DType::Q4_0, true);
        assert_eq!(
            s.qkv_rows,
            WeightSplit::InStep {
                axis: 1,
                segments: vec![(64, 32), (64, 32), (128, 64)]
            }
        );
        assert_eq!(s.fused_ba_rows, in_step(1, vec![(8, 4)]));
        assert_eq!(s.per_head, in_step(0, vec![(4, 2)]));
        assert_eq!(s.out_cols, in_step(0, vec![(128, 64)]));
    }

    #[test]
    fn uncuttable_layers_stay_mirrored() {
        let m = DeltaNetSplits::mirrored();
        let one_key_head = config(1, 4, KeyHeadMap::Grouped);
        assert_eq!(DeltaNetSplits::new(&one_key_head, DType::F32, false), m);
        let fused_tiled = config(2, 4, KeyHeadMap::Tiled);
        assert_eq!(DeltaNetSplits::new(&fused_tiled, DType::F32, true), m);
        let mut small_heads = config(2, 4, KeyHeadMap::Tiled);
        small_heads.head_dim = 16;
        assert_eq!(DeltaNetSplits::new(&small_heads, DType::Q8_0, false), m);
    }

    #[test]
    fn k_quant_columns_take_two_tiled_key_heads_per_unit() {
        let mut c = config(16, 48, KeyHeadMap::Tiled);
        c.head_dim = 128;
        let s = DeltaNetSplits::new(&c, DType::Q4K, false);
        assert_eq!(s.out_cols, in_step(0, vec![(2048, 256); 3]));
        assert_eq!(s.state, in_step(2, vec![(16, 2); 3]));
        let keys = (2048, 256);
        assert_eq!(s.qkv_rows, in_step(1, vec![keys; 5]));
    }
}
