//! Qwen3.5 (dense), Qwen3.5-MoE and Qwen3-Next: hybrid decoders whose layers are gated delta nets
//! ([`super::shared::delta_net`]) except every `full_attention_interval`-th one, a gated attention layer
//! (the query projection yields per head the query and a sigmoid output gate; Q/K RMS norms; GQA;
//! rotary embedding over the first `rope.dimension_count` dimensions of each head). Each layer:
//! `attn_norm` → mixer → residual → `post_attention_norm` → SwiGLU FFN (Qwen3.5) or softmax top-k
//! experts renormalised plus a sigmoid-gated shared expert (the MoE variants) → residual.
//!
//! Qwen3.5's interleaved M-RoPE gives each rotary pair the temporal, height or width position; for
//! text all three are the token's position, so it is NeoX RoPE as long as the sections give every
//! pair one of them (the fourth component is 0 for text). Qwen3-Next uses NeoX RoPE.

use super::shared::blocks::{layer_norm, Attention, AttnSpec, AttnVariant, Ffn, Layer, Mixer};
use super::shared::config::{DeltaNetConfig, KeyHeadMap, ModelConfig};
use super::shared::delta_net::DeltaNet;
use super::Arch;
use crate::error::ModelError;
use crate::load::{limits, Loader, Meta};
use ggml_core::gguf::GgufFile;
use ggml_core::RopeMode;

pub fn config(file: &GgufFile, arch: Arch, n_vocab: usize) -> Result<ModelConfig, ModelError> {
    let mut cfg = ModelConfig::common(file, arch, RopeMode::Neox, n_vocab)?;
    let m = arch.meta(file);
    if arch != Arch::Qwen35 {
        cfg.set_moe(&m)?;
        if let Some(moe) = cfg.moe.as_mut().filter(|moe| moe.n_ff_shexp == 0) {
            moe.n_ff_shexp = cfg.n_ff;
        }
    }
    if arch != Arch::Qwen3Next {
        check_text_mrope(&m, cfg.rope.n_dims)?;
    }
    let interval = m
        .opt_count("full_attention_interval", limits::PERIOD)?
        .unwrap_or(4);
    if interval == 0 {
        return Err(bad_key(&m, "full_attention_interval", "must be positive"));
    }
    let c = DeltaNetConfig {
        conv_kernel: m.count("ssm.conv_kernel", limits::CONV_KERNEL)?,
        head_dim: m.count("ssm.state_size", limits::HEAD_DIM)?,
        n_k_heads: m.count("ssm.group_count", limits::HEADS)?,
        n_v_heads: m.count("ssm.time_step_rank", limits::HEADS)?,
        key_heads: if arch == Arch::Qwen3Next {
            KeyHeadMap::Grouped
        } else {
            KeyHeadMap::Tiled
        },
        layers: (0..cfg.n_layer).map(|l| (l + 1) % interval != 0).collect(),
    };
    if !c.n_v_heads.is_multiple_of(c.n_k_heads) {
        return Err(bad_key(
            &m,
            "ssm.time_step_rank",
            &format!(
                "{} value heads of {} for {} key heads",
                c.n_v_heads, c.head_dim, c.n_k_heads
            ),
        ));
    }
    let inner = m.count("ssm.inner_size", limits::ROWS)?;
    if inner != c.head_dim * c.n_v_heads {
        return Err(bad_key(
            &m,
            "ssm.inner_size",
            &format!(
                "{inner} is not {} value heads of the key head size {}",
                c.n_v_heads, c.head_dim
            ),
        ));
    }
    cfg.delta_net = Some(c);
    Ok(cfg)
}

fn bad_key(m: &Meta, key: &str, msg: &str) -> ModelError {
    ModelError::BadKey {
        key: m.key(key),
        msg: msg.into(),
    }
}

/// Checks that interleaved M-RoPE with `rope.dimension_sections` gives each of the `n_dims / 2`
/// rotary pairs the temporal, height or width position (equal for text), i.e. is NeoX RoPE here.
fn check_text_mrope(m: &Meta, n_dims: usize) -> Result<(), ModelError> {
    let key = "rope.dimension_sections";
    let s = m
        .opt_ints(key)?
        .ok_or_else(|| ModelError::MissingKey(format!("{}.{key}", m.prefix)))?;
    let max = limits::ROPE_SECTION.max;
    if let Some(&bad) = s.iter().find(|&&x| !(0..=max as i64).contains(&x)) {
        return Err(bad_key(
            m,
            key,
            &format!("section {bad} is out of range 0..={max}"),
        ));
    }
    if s.len() < 3 || s.iter().sum::<i64>() == 0 {
        return Err(bad_key(m, key, &format!("{s:?} are not M-RoPE sections")));
    }
    let total: i64 = s.iter().sum();
    let by_position = |sector: i64| (0..3).any(|c| sector % 3 == c && sector < 3 * s[c as usize]);
    if let Some(pair) = (0..n_dims as i64 / 2).find(|&i| !by_position(i % total)) {
        return Err(ModelError::Unsupported(format!(
            "M-RoPE sections {s:?}: rotary pair {pair} follows the fourth position component, \
             which only images use"
        )));
    }
    Ok(())
}

pub fn layer(ld: &Loader, cfg: &ModelConfig, l: usize) -> Result<Layer, ModelError> {
    let recurrent = cfg
        .delta_net
        .as_ref()
        .is_some_and(|c| c.layers.get(l).copied().unwrap_or(false));
    let mixer = if recurrent {
        Mixer::DeltaNet(Box::new(DeltaNet::load(ld, cfg, l)?))
    } else {
        let spec = AttnSpec {
            qk_norm: true,
            sinks: false,
        };
        let variant = AttnVariant {
            q_gate: true,
            ..AttnVariant::default()
        };
        Mixer::Attention(Box::new(Attention::load_variant(
            ld, cfg, l, spec, variant,
        )?))
    };
    let ffn = Ffn::swiglu(ld, cfg, l)?;
    Ok(Layer {
        attn_norm: layer_norm(ld, cfg, l, "attn_norm")?,
        mixer,
        attn_post_norm: None,
        ffn_norm: layer_norm(ld, cfg, l, "post_attention_norm")?,
        ffn,
        ffn_post_norm: None,
        out_scale: None,
    })
}
