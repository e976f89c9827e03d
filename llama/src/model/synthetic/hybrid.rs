//! The hybrid shapes of the synthetic presets (gated delta-net layers with a gated attention layer
//! every `full_attention_interval`-th): Qwen3-Next-80B-A3B (`qwen3next`), Qwen3.5-27B (`qwen35`)
//! and Qwen3.5-35B-A3B (`qwen35moe`) with their published hyper-parameters (the models'
//! `config.json`: hidden size, layers, heads, linear-attention key/value heads of 128, conv kernel
//! 4, one attention layer in 4, partial rotation over 64 of 256 dimensions, RoPE base 10⁷,
//! experts), the fixtures' tiny Qwen3-Next, Qwen3.5 and Qwen3.5 MoE (`tiny-qwen3next`,
//! `tiny-qwen35`, `tiny-qwen35moe`: the same keys and tensors as
//! `fixtures/arch/{qwen3next,qwen35,qwen35moe}.gguf`), and Qwen3.5 / Qwen3-Next layouts scaled to a
//! 2-core CPU benchmark.
//!
//! Tensor names, shapes and metadata keys are those llama.cpp reads for these architectures:
//! `attn_qkv`, `attn_gate`, `ssm_conv1d`, `ssm_dt.bias`, `ssm_a`, `ssm_ba` (Qwen3-Next) or
//! `ssm_beta` and `ssm_alpha`, `ssm_norm`, `ssm_out` in delta-net layers; `attn_q` (queries and
//! their output gate), `attn_k`, `attn_v`, Q/K norms and `attn_output` in attention layers;
//! `post_attention_norm` before the FFN (dense, or experts plus a sigmoid-gated shared expert);
//! `ssm.*`, `full_attention_interval`, `rope.dimension_count` (partial rotation) and, for Qwen3.5,
//! `rope.dimension_sections` (M-RoPE). The convolution, `dt_bias`, `A` (negative), β/α projections,
//! norms and routers are F32.

use super::{Init, Shape, TensorSpec};
use ggml_core::gguf::{GgufWriter, Value};
use ggml_core::DType;

/// The delta-net and layout hyper-parameters of a hybrid shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Hybrid {
    pub full_attention_interval: u64,
    /// Rotated dimensions of each attention head (partial rotary embedding).
    pub rope_dims: u64,
    /// M-RoPE sections (Qwen3.5); `None` for plain NeoX RoPE (Qwen3-Next).
    pub rope_sections: Option<[i32; 4]>,
    pub conv_kernel: u64,
    /// Size of every key and value head.
    pub state_size: u64,
    pub n_k_heads: u64,
    pub n_v_heads: u64,
    /// Width of the shared expert (MoE shapes).
    pub shared_ff: u64,
}

/// A hybrid shape's entry: the common fields with the delta-net ones.
#[allow(clippy::too_many_arguments)]
const fn shape(
    name: &'static str,
    arch: &'static str,
    [n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_vocab]: [u64; 7],
    [n_expert, n_expert_used, expert_ff]: [u64; 3],
    n_ctx_train: u32,
    tied: bool,
    hybrid: Hybrid,
) -> Shape {
    Shape {
        name,
        arch,
        n_embd,
        n_layer,
        n_head,
        n_head_kv,
        head_dim,
        n_ff,
        n_vocab,
        n_expert,
        n_expert_used,
        expert_ff,
        rope_base: 1e7,
        rms_eps: 1e-6,
        n_ctx_train,
        swa: 0,
        tied,
        hybrid: Some(hybrid),
    }
}

/// Qwen3.5's M-RoPE over 64 of 256 dimensions.
const QWEN35_SECTIONS: Option<[i32; 4]> = Some([11, 11, 10, 0]);
/// The tiny and small shapes' M-RoPE over 16 of 64 dimensions.
const SMALL_SECTIONS: Option<[i32; 4]> = Some([3, 3, 2, 0]);

pub(super) const SHAPES: &[Shape] = &[
    // Qwen/Qwen3-Next-80B-A3B-Instruct's config.json: 48 layers of 2048, 16 query / 2 KV heads
    // of 256, linear attention 16 key / 32 value heads of 128, 512 experts of 512 (10 used) and a
    // shared one of 512, vocabulary 151936.
    shape(
        "qwen3-next-80b-a3b",
        "qwen3next",
        [2048, 48, 16, 2, 256, 5120, 151936],
        [512, 10, 512],
        262144,
        false,
        Hybrid {
            full_attention_interval: 4,
            rope_dims: 64,
            rope_sections: None,
            conv_kernel: 4,
            state_size: 128,
            n_k_heads: 16,
            n_v_heads: 32,
            shared_ff: 512,
        },
    ),
    // Qwen/Qwen3.5-27B's text_config: 64 layers of 5120, 24 query / 4 KV heads of 256, linear
    // attention 16 key / 48 value heads of 128, FFN 17408, vocabulary 248320.
    shape(
        "qwen3.5-27b",
        "qwen35",
        [5120, 64, 24, 4, 256, 17408, 248320],
        [0, 0, 0],
        262144,
        false,
        Hybrid {
            full_attention_interval: 4,
            rope_dims: 64,
            rope_sections: QWEN35_SECTIONS,
            conv_kernel: 4,
            state_size: 128,
            n_k_heads: 16,
            n_v_heads: 48,
            shared_ff: 0,
        },
    ),
    // Qwen/Qwen3.5-35B-A3B's text_config: 40 layers of 2048, 16 query / 2 KV heads of 256,
    // linear attention 16 key / 32 value heads of 128, 256 experts of 512 (8 used) and a shared
    // one of 512, vocabulary 248320.
    shape(
        "qwen3.5-35b-a3b",
        "qwen35moe",
        [2048, 40, 16, 2, 256, 512, 248320],
        [256, 8, 512],
        262144,
        false,
        Hybrid {
            full_attention_interval: 4,
            rope_dims: 64,
            rope_sections: QWEN35_SECTIONS,
            conv_kernel: 4,
            state_size: 128,
            n_k_heads: 16,
            n_v_heads: 32,
            shared_ff: 512,
        },
    ),
    // The fixtures' tiny Qwen3-Next: one delta-net and one attention layer.
    shape(
        "tiny-qwen3next",
        "qwen3next",
        [128, 2, 4, 2, 64, 128, 517],
        [8, 2, 64],
        262144,
        true,
        Hybrid {
            full_attention_interval: 2,
            rope_dims: 16,
            rope_sections: None,
            conv_kernel: 4,
            state_size: 32,
            n_k_heads: 2,
            n_v_heads: 4,
            shared_ff: 128,
        },
    ),
    // The fixtures' tiny Qwen3.5: three delta-net layers and an attention layer, with a dense FFN.
    shape(
        "tiny-qwen35",
        "qwen35",
        [128, 4, 4, 2, 64, 160, 517],
        [0, 0, 0],
        262144,
        true,
        Hybrid {
            full_attention_interval: 4,
            rope_dims: 16,
            rope_sections: SMALL_SECTIONS,
            conv_kernel: 4,
            state_size: 32,
            n_k_heads: 2,
            n_v_heads: 4,
            shared_ff: 0,
        },
    ),
    // The fixtures' tiny Qwen3.5 MoE: a delta-net and an attention layer, experts and a shared one.
    shape(
        "tiny-qwen35moe",
        "qwen35moe",
        [128, 2, 4, 2, 64, 128, 517],
        [8, 2, 64],
        262144,
        true,
        Hybrid {
            full_attention_interval: 2,
            rope_dims: 16,
            rope_sections: SMALL_SECTIONS,
            conv_kernel: 4,
            state_size: 32,
            n_k_heads: 2,
            n_v_heads: 4,
            shared_ff: 128,
        },
    ),
    // Qwen3-Next's and Qwen3.5's layouts at a size a 2-core CPU benchmarks in seconds.
    shape(
        "small-qwen3next",
        "qwen3next",
        [512, 8, 8, 2, 64, 1536, 32000],
        [32, 4, 256],
        4096,
        true,
        Hybrid {
            full_attention_interval: 4,
            rope_dims: 16,
            rope_sections: None,
            conv_kernel: 4,
            state_size: 64,
            n_k_heads: 4,
            n_v_heads: 8,
            shared_ff: 256,
        },
    ),
    shape(
        "small-qwen35",
        "qwen35",
        [512, 8, 8, 2, 64, 1536, 32000],
        [0, 0, 0],
        4096,
        true,
        Hybrid {
            full_attention_interval: 4,
            rope_dims: 16,
            rope_sections: SMALL_SECTIONS,
            conv_kernel: 4,
            state_size: 64,
            n_k_heads: 4,
            n_v_heads: 8,
            shared_ff: 0,
        },
    ),
];

impl Hybrid {
    /// The hybrid keys (`key` prefixes the architecture).
    pub(super) fn metadata(&self, w: &mut GgufWriter, key: impl Fn(&str) -> String) {
        w.set(
            key("full_attention_interval"),
            self.full_attention_interval as u32,
        );
        w.set(key("rope.dimension_count"), self.rope_dims as u32);
        if let Some(sections) = self.rope_sections {
            w.set(
                key("rope.dimension_sections"),
                Value::from(sections.to_vec()),
            );
        }
        w.set(key("ssm.conv_kernel"), self.conv_kernel as u32);
        w.set(key("ssm.state_size"), self.state_size as u32);
        w.set(key("ssm.group_count"), self.n_k_heads as u32);
        w.set(key("ssm.time_step_rank"), self.n_v_heads as u32);
        w.set(
            key("ssm.inner_size"),
            (self.state_size * self.n_v_heads) as u32,
        );
        if self.shared_ff > 0 {
            w.set(
                key("expert_shared_feed_forward_length"),
                self.shared_ff as u32,
            );
        }
    }

    /// The tensors of layer `l`: matrices of type `dense`, experts of type `experts`.
    pub(super) fn layer(&self, s: &Shape, l: u64, dense: DType, experts: DType) -> Vec<TensorSpec> {
        let n = |x: &str| format!("blk.{l}.{x}");
        let e = s.n_embd;
        let mut t = vec![TensorSpec::norm(&n("attn_norm.weight"), &[e])];
        if !(l + 1).is_multiple_of(self.full_attention_interval) {
            t.extend(self.delta_net(s, l, dense));
        } else {
            let (q, kv) = (s.n_head * s.head_dim, s.n_head_kv * s.head_dim);
            t.extend([
                TensorSpec::matrix(&n("attn_q.weight"), dense, &[e, 2 * q]),
                TensorSpec::matrix(&n("attn_k.weight"), dense, &[e, kv]),
                TensorSpec::matrix(&n("attn_v.weight"), dense, &[e, kv]),
                TensorSpec::norm(&n("attn_q_norm.weight"), &[s.head_dim]),
                TensorSpec::norm(&n("attn_k_norm.weight"), &[s.head_dim]),
                TensorSpec::matrix(&n("attn_output.weight"), dense, &[q, e]),
            ]);
        }
        t.push(TensorSpec::norm(&n("post_attention_norm.weight"), &[e]));
        if s.n_expert == 0 {
            t.extend([
                TensorSpec::matrix(&n("ffn_gate.weight"), dense, &[e, s.n_ff]),
                TensorSpec::matrix(&n("ffn_up.weight"), dense, &[e, s.n_ff]),
                TensorSpec::matrix(&n("ffn_down.weight"), dense, &[s.n_ff, e]),
            ]);
            return t;
        }
        let (x, f, sf) = (s.n_expert, s.expert_ff, self.shared_ff);
        t.extend([
            TensorSpec::router(&n("ffn_gate_inp.weight"), &[e, x]),
            TensorSpec::matrix(&n("ffn_gate_exps.weight"), experts, &[e, f, x]),
            TensorSpec::matrix(&n("ffn_up_exps.weight"), experts, &[e, f, x]),
            TensorSpec::matrix(&n("ffn_down_exps.weight"), experts, &[f, e, x]),
            TensorSpec::router(&n("ffn_gate_inp_shexp.weight"), &[e]),
            TensorSpec::matrix(&n("ffn_gate_shexp.weight"), dense, &[e, sf]),
            TensorSpec::matrix(&n("ffn_up_shexp.weight"), dense, &[e, sf]),
            TensorSpec::matrix(&n("ffn_down_shexp.weight"), dense, &[sf, e]),
        ]);
        t
    }

    /// The delta-net mixer's tensors of layer `l`.
    fn delta_net(&self, s: &Shape, l: u64, dense: DType) -> Vec<TensorSpec> {
        let n = |x: &str| format!("blk.{l}.{x}");
        let (e, hd, nk, nv) = (s.n_embd, self.state_size, self.n_k_heads, self.n_v_heads);
        let channels = 2 * nk * hd + nv * hd;
        let mut t = vec![
            TensorSpec::matrix(&n("attn_qkv.weight"), dense, &[e, channels]),
            TensorSpec::matrix(&n("attn_gate.weight"), dense, &[e, nv * hd]),
            TensorSpec::matrix(
                &n("ssm_conv1d.weight"),
                DType::F32,
                &[self.conv_kernel, channels],
            ),
            TensorSpec::bias(&n("ssm_dt.bias"), &[nv]),
            TensorSpec::new(&n("ssm_a"), DType::F32, &[nv], Init::Decay),
        ];
        if s.arch == "qwen3next" {
            t.push(TensorSpec::matrix(
                &n("ssm_ba.weight"),
                DType::F32,
                &[e, 2 * nv],
            ));
        } else {
            t.push(TensorSpec::matrix(
                &n("ssm_beta.weight"),
                DType::F32,
                &[e, nv],
            ));
            t.push(TensorSpec::matrix(
                &n("ssm_alpha.weight"),
                DType::F32,
                &[e, nv],
            ));
        }
        t.push(TensorSpec::norm(&n("ssm_norm.weight"), &[hd]));
        t.push(TensorSpec::matrix(
            &n("ssm_out.weight"),
            dense,
            &[nv * hd, e],
        ));
        t
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::billions;
    use super::super::{Preset, TensorSpec};
    use ggml_core::gguf::{GgufFile, GgufWriter, Value};
    use ggml_core::DType;
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::PathBuf;

    /// `arch/<name>.gguf` of the fixtures (`GGML_TP_FIXTURES`, else `../shared/fixtures` beside the
    /// checkout), if they are there.
    fn fixture(name: &str) -> Option<GgufFile> {
        let dir = std::env::var_os("GGML_TP_FIXTURES").map_or_else(
            || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures"),
            PathBuf::from,
        );
        let path = dir.join("arch").join(format!("{name}.gguf"));
        path.is_file().then(|| GgufFile::open(&path).unwrap())
    }

    /// The architecture's keys with the type of their values (of the elements for arrays).
    fn key_types<'a>(
        metadata: impl IntoIterator<Item = &'a (String, Value)>,
    ) -> BTreeSet<(String, String)> {
        metadata
            .into_iter()
            .filter(|(k, _)| !k.starts_with("general.") && !k.starts_with("tokenizer."))
            .map(|(k, v)| {
                let ty = match v.as_array() {
                    Some(a) => format!("array of {}", a.element_type()),
                    None => v.describe().split(' ').next().unwrap_or("").to_string(),
                };
                (k.clone(), ty)
            })
            .collect()
    }

    /// The names outside the layers, and the distinct sets of names in a layer (`blk.N.` removed).
    type Layout = (BTreeSet<String>, BTreeSet<BTreeSet<String>>);

    fn layout<'a>(names: impl IntoIterator<Item = &'a str>) -> Layout {
        let mut global = BTreeSet::new();
        let mut layers: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
        for name in names {
            match name.strip_prefix("blk.").and_then(|r| r.split_once('.')) {
                Some((l, rest)) => {
                    let l = l.parse().unwrap();
                    layers.entry(l).or_default().insert(rest.to_string());
                }
                None => {
                    global.insert(name.to_string());
                }
            }
        }
        (global, layers.into_values().collect())
    }

    /// Whether llama.cpp's files keep the tensor in F32: vectors, the convolution and the routers
    /// (llama-quantize leaves them), and here also the small β/α projections.
    fn stays_f32(t: &TensorSpec) -> bool {
        t.dims.len() == 1
            || [
                "ssm_conv1d",
                "ffn_gate_inp.",
                "ssm_beta",
                "ssm_alpha",
                "ssm_ba",
            ]
            .iter()
            .any(|s| t.name.contains(s))
    }

    #[test]
    fn published_hybrid_presets_have_the_keys_and_tensors_of_the_fixtures() {
        for (preset, name) in [
            ("qwen3-next-80b-a3b-q4_0", "qwen3next"),
            ("qwen3.5-27b-q8_0", "qwen35"),
            ("qwen3.5-35b-a3b-q4_0", "qwen35moe"),
        ] {
            let Some(file) = fixture(name) else {
                println!("skipped: no fixtures");
                return;
            };
            let p = Preset::parse(preset).unwrap();
            assert_eq!(p.shape.arch, name);
            let mut w = GgufWriter::new();
            p.metadata(&mut w);
            assert_eq!(
                key_types(w.metadata()),
                key_types(file.metadata()),
                "{preset}"
            );
            let tensors = p.tensors();
            let (mut global, layers) = layout(tensors.iter().map(|t| t.name.as_str()));
            // The published models have an output matrix, the tiny fixtures share the embeddings.
            assert!(global.remove("output.weight"), "{preset}");
            let want = layout(file.tensors().iter().map(|t| t.name.as_str()));
            assert_eq!((global, layers), want, "{preset}");
            for t in &tensors {
                let want = if stays_f32(t) { DType::F32 } else { p.wtype };
                assert_eq!(t.dtype, want, "{preset} {}", t.name);
            }
        }
    }

    #[test]
    fn sizes_match_the_published_models() {
        // Without the vision tower and the multi-token-prediction layer, which llama.cpp does not
        // load: 80B, 27B and 35B as published.
        for (name, published) in [
            ("qwen3-next-80b-a3b-q4_0", 80.0),
            ("qwen3.5-27b-q8_0", 27.0),
            ("qwen3.5-35b-a3b-q4_0", 35.0),
        ] {
            let (total, active) = billions(name);
            println!("{name}: {total:.3}B, {active:.3}B active");
            assert!(
                (total - published).abs() < 0.02 * published,
                "{name}: {total}B"
            );
        }
        // "A3B": about 3B that a token multiplies with (all but the embedding table it reads one row
        // of, and all but the unused experts).
        for name in ["qwen3-next-80b-a3b-q4_0", "qwen3.5-35b-a3b-q4_0"] {
            let s = Preset::parse(name).unwrap().shape;
            let lookup = (s.n_embd * s.n_vocab) as f64 / 1e9;
            let active = billions(name).1 - lookup;
            assert!((active - 3.0).abs() < 0.6, "{name}: {active}B active");
        }
    }

    #[test]
    fn qwen35_files_fit_one_80_gb_gpu() {
        // A Q4_0 block stores 32 weights in 18 bytes, Q8_0 in 34; only the few F32 tensors take
        // more.
        for name in ["qwen3.5-27b", "qwen3.5-35b-a3b", "qwen3-next-80b-a3b"] {
            for (ty, bits) in [("q4_0", 4.5), ("q8_0", 8.5)] {
                let p = Preset::parse(&format!("{name}-{ty}")).unwrap();
                let bytes = p.tensors().iter().map(|t| t.bytes()).sum::<usize>() as f64;
                let quantized = billions(&p.name()).0 * 1e9 * bits / 8.0;
                println!("{name}-{ty}: {:.2} GB of tensors", bytes / 1e9);
                assert!(
                    bytes >= quantized && bytes < 1.01 * quantized,
                    "{name}-{ty}"
                );
                if name.starts_with("qwen3.5") {
                    assert!(bytes < 60e9, "{name}-{ty}: {bytes} bytes");
                }
            }
        }
    }
}
