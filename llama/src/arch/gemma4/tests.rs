//! Gemma 4 on a generated tiny file with every optional part and sizes that split unevenly: the
//! hyper-parameters it reads, the splits its weights declare, the same logits on one device, over
//! layers and tensor-split (where fused expert halves get cut differently), and clear errors for
//! inconsistent files.

use crate::arch::shared::blocks::Mixer;
use crate::arch::shared::config::AttnShape;
use crate::arch::Arch;
use crate::model::{Model, ModelError, Placement};
use crate::runtime::{Outputs, Session, SessionOptions};
use backend_cpu::device::cpu_devices;
use backend_meta::{MetaDevice, WeightSplit};
use ggml_core::backend::Device;
use ggml_core::gguf::{GgufFile, GgufWriter, Value};
use ggml_core::DType;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

const D: usize = 32;
const VOCAB: usize = 11;
const HEADS: usize = 4;
/// Head sizes of local and global layers.
const HD_LOCAL: usize = 8;
const HD_GLOBAL: usize = 16;
/// Layers: local, global, local, global; the last two reuse the KV of the first two.
const SWA: [bool; 4] = [true, false, true, false];
const KV_HEADS: [u32; 4] = [2, 1, 2, 1];
const FF: [u32; 4] = [24, 24, 40, 40];
const PER_LAYER: usize = 8;
/// Layer 1 adds experts; odd expert width, so the fused gate/up halves cut unevenly.
const N_EXPERT: usize = 4;
const FF_EXP: usize = 5;

/// What to break in the generated file.
#[derive(Clone, Copy, PartialEq)]
enum Flaw {
    None,
    SharedKvAll,
    PatternTooShort,
    KvHeadsTooShort,
    NoAttnK,
}

fn tiny(flaw: Flaw) -> GgufFile {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let mut w = GgufWriter::new();
    let n = SWA.len();
    w.set("general.architecture", "gemma4");
    let k = |s: &str| format!("gemma4.{s}");
    w.set(k("embedding_length"), D as u32);
    w.set(k("block_count"), n as u32);
    w.set(k("attention.head_count"), HEADS as u32);
    let kv_heads = match flaw {
        Flaw::KvHeadsTooShort => KV_HEADS[..3].to_vec(),
        _ => KV_HEADS.to_vec(),
    };
    w.set(k("attention.head_count_kv"), kv_heads);
    w.set(k("feed_forward_length"), FF.to_vec());
    w.set(k("attention.layer_norm_rms_epsilon"), 1e-6f32);
    w.set(k("rope.freq_base"), 1e6f32);
    w.set(k("rope.freq_base_swa"), 1e4f32);
    w.set(k("attention.sliding_window"), 3u32);
    let pattern = match flaw {
        Flaw::PatternTooShort => SWA[..2].to_vec(),
        _ => SWA.to_vec(),
    };
    w.set(k("attention.sliding_window_pattern"), pattern);
    let shared = if flaw == Flaw::SharedKvAll { n } else { 2 };
    w.set(k("attention.shared_kv_layers"), shared as u32);
    w.set(k("embedding_length_per_layer_input"), PER_LAYER as u32);
    w.set(k("attention.key_length"), HD_GLOBAL as u32);
    w.set(k("attention.value_length"), HD_GLOBAL as u32);
    w.set(k("attention.key_length_swa"), HD_LOCAL as u32);
    w.set(k("attention.value_length_swa"), HD_LOCAL as u32);
    w.set(k("rope.dimension_count"), HD_GLOBAL as u32);
    w.set(k("rope.dimension_count_swa"), HD_LOCAL as u32);
    w.set(k("final_logit_softcapping"), 5.0f32);
    w.set(k("expert_count"), N_EXPERT as u32);
    w.set(k("expert_used_count"), 2u32);
    w.set(k("expert_feed_forward_length"), FF_EXP as u32);
    // Two of the eight global pairs rotate, the others (factor 1e30) stay put.
    let freqs: Vec<f32> = (0..HD_GLOBAL / 2)
        .map(|i| if i < 2 { 1.0 } else { 1e30 })
        .collect();
    w.add_tensor(
        "rope_freqs.weight",
        DType::F32,
        &[freqs.len() as u64],
        bytemuck::cast_slice(&freqs).to_vec(),
    )
    .unwrap();
    let mut add = |name: String, dims: &[usize], scale: f32, offset: f32| {
        let count: usize = dims.iter().product();
        let vals: Vec<f32> = (0..count)
            .map(|_| offset + scale * rng.gen_range(-1.0f32..1.0))
            .collect();
        let dims: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        w.add_tensor(
            name,
            DType::F32,
            &dims,
            bytemuck::cast_slice(&vals).to_vec(),
        )
        .unwrap();
    };
    let fan = |n: usize| 1.0 / (n as f32).sqrt();
    let all = PER_LAYER * n;
    add("token_embd.weight".into(), &[D, VOCAB], 1.0, 0.0);
    add(
        "per_layer_token_embd.weight".into(),
        &[all, VOCAB],
        1.0,
        0.0,
    );
    add("per_layer_model_proj.weight".into(), &[D, all], fan(D), 0.0);
    add("per_layer_proj_norm.weight".into(), &[PER_LAYER], 0.1, 1.0);
    add("output_norm.weight".into(), &[D], 0.1, 1.0);
    for l in 0..n {
        let b = |s: &str| format!("blk.{l}.{s}.weight");
        let hd = if SWA[l] { HD_LOCAL } else { HD_GLOBAL };
        let kv = KV_HEADS[l] as usize * hd;
        let ff = FF[l] as usize;
        add(b("attn_norm"), &[D], 0.1, 1.0);
        add(b("attn_q"), &[D, HEADS * hd], fan(D), 0.0);
        add(b("attn_q_norm"), &[hd], 0.1, 1.0);
        add(b("attn_output"), &[HEADS * hd, D], fan(HEADS * hd), 0.0);
        if l < n - 2 {
            if !(flaw == Flaw::NoAttnK && l == 0) {
                add(b("attn_k"), &[D, kv], fan(D), 0.0);
            }
            add(b("attn_k_norm"), &[hd], 0.1, 1.0);
            // The first global layer takes V from K.
            if l != 1 {
                add(b("attn_v"), &[D, kv], fan(D), 0.0);
            }
        }
        for norm in [
            "post_attention_norm",
            "ffn_norm",
            "post_ffw_norm",
            "post_norm",
        ] {
            add(b(norm), &[D], 0.1, 1.0);
        }
        add(b("layer_output_scale"), &[1], 0.2, 0.8);
        add(b("ffn_gate"), &[D, ff], fan(D), 0.0);
        add(b("ffn_up"), &[D, ff], fan(D), 0.0);
        add(b("ffn_down"), &[ff, D], fan(ff), 0.0);
        add(b("inp_gate"), &[D, PER_LAYER], fan(D), 0.0);
        add(b("proj"), &[PER_LAYER, D], fan(PER_LAYER), 0.0);
        if l == 1 {
            add(b("ffn_gate_inp"), &[D, N_EXPERT], 2.0 * fan(D), 0.0);
            add(format!("blk.{l}.ffn_gate_inp.scale"), &[D], 0.1, 1.0);
            for norm in ["pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"] {
                add(b(norm), &[D], 0.1, 1.0);
            }
            add(
                b("ffn_gate_up_exps"),
                &[D, 2 * FF_EXP, N_EXPERT],
                fan(D),
                0.0,
            );
            add(b("ffn_down_exps"), &[FF_EXP, D, N_EXPERT], fan(FF_EXP), 0.0);
            add(
                format!("blk.{l}.ffn_down_exps.scale"),
                &[N_EXPERT],
                0.3,
                1.0,
            );
        }
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

fn devices(n: usize) -> Vec<Arc<dyn Device>> {
    cpu_devices(n, 2)
        .unwrap()
        .into_iter()
        .map(|d| d as Arc<dyn Device>)
        .collect()
}

fn tensor(ratios: &[f32]) -> Placement {
    Placement::Tensor(MetaDevice::new(devices(ratios.len()), Some(ratios.to_vec())).unwrap())
}

/// Logits of every position of a fixed 9-token prompt (in one batch, or 5 tokens then one per step).
fn logits(placement: &Placement, stepwise: bool) -> Vec<f32> {
    let model = Model::from_gguf(&tiny(Flaw::None), placement).unwrap();
    let opts = SessionOptions {
        n_ctx: 16,
        kv_type: DType::F32,
    };
    let mut s = Session::new(Arc::new(model), opts).unwrap();
    let ids = [3, 7, 1, 10, 0, 4, 4, 9, 2];
    if !stepwise {
        return s.eval(&ids, Outputs::All).unwrap().data;
    }
    let mut out = s.eval(&ids[..5], Outputs::All).unwrap().data;
    for &t in &ids[5..] {
        out.extend(s.eval(&[t], Outputs::Last).unwrap().data);
    }
    out
}

fn nmse(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    num / want.iter().map(|&b| (b as f64).powi(2)).sum::<f64>()
}

#[test]
fn reads_per_layer_shapes_shared_kv_and_rope() {
    let cfg = super::config(&tiny(Flaw::None), VOCAB).unwrap();
    for l in 0..SWA.len() {
        let hd = if SWA[l] { HD_LOCAL } else { HD_GLOBAL };
        let want = AttnShape {
            n_head: HEADS,
            n_head_kv: KV_HEADS[l] as usize,
            head_dim: hd,
            head_dim_v: hd,
        };
        assert_eq!(cfg.attn_shape(l), want, "layer {l}");
        assert_eq!(cfg.n_ff_of(l), FF[l] as usize, "layer {l}");
        assert_eq!(cfg.rope_of(l).n_dims, hd, "layer {l}");
    }
    assert_eq!(cfg.swa_layers, SWA.to_vec());
    assert_eq!(cfg.kv_source, vec![0, 1, 0, 1]);
    assert_eq!((cfg.rope.freq_base, cfg.rope_swa.freq_base), (1e6, 1e4));
    let per_layer = super::n_embd_per_layer(&Arch::Gemma4.meta(&tiny(Flaw::None))).unwrap();
    assert_eq!(per_layer, PER_LAYER);
    assert_eq!(cfg.final_logit_softcap, Some(5.0));
    assert_eq!(
        (cfg.attn_scale, cfg.embd_scale),
        (1.0, Some((D as f32).sqrt()))
    );
}

#[test]
fn heads_split_by_groups_and_single_group_layers_stay_mirrored() {
    let model = Model::from_gguf(&tiny(Flaw::None), &tensor(&[1.0, 1.0])).unwrap();
    let attn = |l: usize| match &model.weights.layers[l].mixer {
        Mixer::Attention(a) => a,
        Mixer::DeltaNet(_) => panic!("layer {l} of a Gemma 4 model is a delta net"),
    };
    let split = |l: usize| attn(l).splits.q_rows.clone();
    // Local layers: 2 KV heads, 2 groups. Global layers: 1 KV head, a single group.
    assert!(matches!(split(0), WeightSplit::Axis { .. }));
    assert!(matches!(split(2), WeightSplit::Axis { .. }));
    assert_eq!(split(1), WeightSplit::Mirrored);
    assert_eq!(split(3), WeightSplit::Mirrored);
    // Shared-KV layers carry no K/V weights.
    assert!(attn(2).wk.is_none() && attn(3).wv.is_none());
    // The global layer without `attn_v` takes V from K.
    assert!(attn(1).wk.is_some() && attn(1).wv.is_none());
}

#[test]
fn every_split_mode_gives_the_logits_of_one_device() {
    let reference = logits(&Placement::Single(devices(1).remove(0)), false);
    assert!(reference.iter().all(|v| v.is_finite() && v.abs() <= 5.0));
    let spread = reference.iter().map(|v| v * v).sum::<f32>() / reference.len() as f32;
    assert!(spread > 0.1, "degenerate logits: mean square {spread}");
    let modes = [
        (
            "layers 1:1",
            Placement::Layers {
                devices: devices(2),
                ratios: vec![1.0, 1.0],
            },
        ),
        ("tensor 1:1", tensor(&[1.0, 1.0])),
        ("tensor 3:1:1", tensor(&[3.0, 1.0, 1.0])),
    ];
    for (name, placement) in &modes {
        for stepwise in [false, true] {
            let got = logits(placement, stepwise);
            let e = nmse(&got, &reference);
            assert!(e < 1e-10, "{name} stepwise={stepwise}: NMSE {e:e}");
        }
    }
}

#[test]
fn inconsistent_files_give_clear_errors() {
    let cpu = Placement::Single(devices(1).remove(0));
    let err = |flaw| match Model::from_gguf(&tiny(flaw), &cpu) {
        Ok(_) => panic!("a flawed file loaded"),
        Err(e) => e,
    };
    let key_of = |e: ModelError| match e {
        ModelError::BadKey { key, .. } => key,
        other => panic!("{other}"),
    };
    assert_eq!(
        key_of(err(Flaw::SharedKvAll)),
        "gemma4.attention.shared_kv_layers"
    );
    assert_eq!(
        key_of(err(Flaw::PatternTooShort)),
        "gemma4.attention.sliding_window_pattern"
    );
    assert_eq!(
        key_of(err(Flaw::KvHeadsTooShort)),
        "gemma4.attention.head_count_kv"
    );
    assert!(matches!(
        err(Flaw::NoAttnK),
        ModelError::MissingTensor(name) if name == "blk.0.attn_k.weight"
    ));
    // A value of the wrong type is named too.
    let base = tiny(Flaw::None);
    let mut w = GgufWriter::from_file(&base).unwrap();
    w.set("gemma4.feed_forward_length", Value::from("wide"));
    let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    let e = Model::from_gguf(&file, &cpu).err().map(key_of);
    assert_eq!(e.as_deref(), Some("gemma4.feed_forward_length"));
}
