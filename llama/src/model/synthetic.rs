//! Random-weight models with the exact shapes of published ones, built in memory as a GGUF image
//! (no file), for benchmarks on identical models across programs: `ggml-tp bench --synthetic
//! PRESET` loads the image directly, `ggml-tp synth PRESET -o FILE` (and `cargo xtask gguf-synth`)
//! writes it out for other programs such as llama.cpp.
//!
//! A preset is `SHAPE-TYPE`: the shape (`llama3-8b`, `qwen3-30b-a3b`, `gpt-oss-20b`, the hybrid
//! `qwen3-next-80b-a3b`, `qwen3.5-27b`, `qwen3.5-35b-a3b` ([`hybrid`]), or the tiny `tiny-llama`,
//! `tiny-qwen3moe`, `tiny-gpt-oss`, `tiny-qwen3next`, `tiny-qwen35`, `tiny-qwen35moe` with the
//! fixtures' hyper-parameters, and `small-llama`, `small-qwen3moe`, `small-qwen3next`,
//! `small-qwen35`, the published layouts scaled to a 2-core CPU benchmark) and the type of the matrices (`f16`, `bf16`,
//! `q8_0`, `q4_0`, `q4_k`, `q6_k`, `mxfp4`; gpt-oss keeps its non-expert matrices F16 whatever the
//! type, like the released files). `q4_k` lays the types out as llama-quantize's Q4_K_M does: Q6_K
//! for the output matrix and for `attn_v` and `ffn_down` of the layers it gives more bits (the
//! first and last eighth, and every third one between), Q4_K for the rest. The K-quants need rows
//! of whole 256-element super-blocks (not gpt-oss). Norms, biases, sinks and routers are F32.
//! Weights are uniform with standard deviation 1/√fan_in (embeddings 1), norms 1 ± 0.1, biases
//! ± 0.1, drawn by a seeded generator per tensor and 64 KiB chunk, so every run and every thread
//! count gives the same bytes. The tokenizer is a SentencePiece-style list of byte tokens plus
//! placeholder pieces.

mod hybrid;

use super::ModelError;
use ggml_core::gguf::{GgufFile, GgufWriter, Value};
use ggml_core::DType;
use half::{bf16, f16};
use hybrid::Hybrid;

/// The hyper-parameters of a synthetic shape.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Shape {
    name: &'static str,
    arch: &'static str,
    n_embd: u64,
    n_layer: u64,
    n_head: u64,
    n_head_kv: u64,
    head_dim: u64,
    /// Dense FFN width (also written as `feed_forward_length` for MoE models).
    n_ff: u64,
    n_vocab: u64,
    n_expert: u64,
    n_expert_used: u64,
    expert_ff: u64,
    rope_base: f32,
    rms_eps: f32,
    n_ctx_train: u32,
    /// Sliding window of the windowed layers (gpt-oss).
    swa: u32,
    /// The head shares the embedding table (no `output.weight`).
    tied: bool,
    /// Delta-net layers and their hyper-parameters (Qwen3-Next, Qwen3.5).
    hybrid: Option<Hybrid>,
}

const SHAPES: &[Shape] = &[
    Shape {
        name: "llama3-8b",
        arch: "llama",
        n_embd: 4096,
        n_layer: 32,
        n_head: 32,
        n_head_kv: 8,
        head_dim: 128,
        n_ff: 14336,
        n_vocab: 128256,
        n_expert: 0,
        n_expert_used: 0,
        expert_ff: 0,
        rope_base: 500000.0,
        rms_eps: 1e-5,
        n_ctx_train: 131072,
        swa: 0,
        tied: false,
        hybrid: None,
    },
    Shape {
        name: "qwen3-30b-a3b",
        arch: "qwen3moe",
        n_embd: 2048,
        n_layer: 48,
        n_head: 32,
        n_head_kv: 4,
        head_dim: 128,
        n_ff: 6144,
        n_vocab: 151936,
        n_expert: 128,
        n_expert_used: 8,
        expert_ff: 768,
        rope_base: 1e6,
        rms_eps: 1e-6,
        n_ctx_train: 40960,
        swa: 0,
        tied: false,
        hybrid: None,
    },
    Shape {
        name: "gpt-oss-20b",
        arch: "gpt-oss",
        n_embd: 2880,
        n_layer: 24,
        n_head: 64,
        n_head_kv: 8,
        head_dim: 64,
        n_ff: 2880,
        n_vocab: 201088,
        n_expert: 32,
        n_expert_used: 4,
        expert_ff: 2880,
        rope_base: 150000.0,
        rms_eps: 1e-5,
        n_ctx_train: 131072,
        swa: 128,
        tied: false,
        hybrid: None,
    },
    Shape {
        name: "tiny-llama",
        arch: "llama",
        n_embd: 128,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 32,
        n_ff: 224,
        n_vocab: 1001,
        n_expert: 0,
        n_expert_used: 0,
        expert_ff: 0,
        rope_base: 500000.0,
        rms_eps: 1e-5,
        n_ctx_train: 2048,
        swa: 0,
        tied: false,
        hybrid: None,
    },
    // llama3-8b's layout scaled down with rows of 1024 and 2048: whole groups of the regrouped
    // Q4_0 / Q8_0 GPUs keep weights in (about 23 M parameters).
    Shape {
        name: "small-llama",
        arch: "llama",
        n_embd: 1024,
        n_layer: 2,
        n_head: 8,
        n_head_kv: 2,
        head_dim: 128,
        n_ff: 2048,
        n_vocab: 2048,
        n_expert: 0,
        n_expert_used: 0,
        expert_ff: 0,
        rope_base: 500000.0,
        rms_eps: 1e-5,
        n_ctx_train: 2048,
        swa: 0,
        tied: false,
        hybrid: None,
    },
    Shape {
        name: "tiny-qwen3moe",
        arch: "qwen3moe",
        n_embd: 128,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_ff: 320,
        n_vocab: 517,
        n_expert: 8,
        n_expert_used: 2,
        expert_ff: 128,
        rope_base: 1e6,
        rms_eps: 1e-6,
        n_ctx_train: 4096,
        swa: 0,
        tied: true,
        hybrid: None,
    },
    // qwen3-30b-a3b's layout at a size a 2-core CPU runs a 512-token prompt of in seconds (about
    // 120 M parameters, 16 M of them active per token): MoE prompt benchmarks of the CPU backend.
    Shape {
        name: "small-qwen3moe",
        arch: "qwen3moe",
        n_embd: 512,
        n_layer: 8,
        n_head: 8,
        n_head_kv: 2,
        head_dim: 64,
        n_ff: 1536,
        n_vocab: 32000,
        n_expert: 32,
        n_expert_used: 4,
        expert_ff: 256,
        rope_base: 1e6,
        rms_eps: 1e-6,
        n_ctx_train: 4096,
        swa: 0,
        tied: true,
        hybrid: None,
    },
    Shape {
        name: "tiny-gpt-oss",
        arch: "gpt-oss",
        n_embd: 160,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_ff: 224,
        n_vocab: 515,
        n_expert: 8,
        n_expert_used: 4,
        expert_ff: 224,
        rope_base: 150000.0,
        rms_eps: 1e-5,
        n_ctx_train: 131072,
        swa: 16,
        tied: false,
        hybrid: None,
    },
];

/// Every shape, the hybrid ones last.
fn shapes() -> impl Iterator<Item = &'static Shape> {
    SHAPES.iter().chain(hybrid::SHAPES)
}

/// Matrix types a preset may name.
const TYPES: &[(&str, DType)] = &[
    ("f16", DType::F16),
    ("bf16", DType::BF16),
    ("q8_0", DType::Q8_0),
    ("q4_0", DType::Q4_0),
    ("q4_k", DType::Q4K),
    ("q6_k", DType::Q6K),
    ("mxfp4", DType::MXFP4),
];

/// A synthetic model: a shape and the type of its matrices.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Preset {
    shape: Shape,
    wtype: DType,
}

impl Preset {
    /// Parses `SHAPE-TYPE`, e.g. `llama3-8b-q4_0`.
    pub fn parse(name: &str) -> Result<Preset, ModelError> {
        let bad = || {
            let shapes: Vec<&str> = shapes().map(|s| s.name).collect();
            let types: Vec<&str> = TYPES.iter().map(|t| t.0).collect();
            ModelError::Input(format!(
                "unknown synthetic preset {name:?}: SHAPE-TYPE with SHAPE one of {} and TYPE one \
                 of {} (mxfp4 for gpt-oss only)",
                shapes.join(", "),
                types.join(", ")
            ))
        };
        let (shape, ty) = name.rsplit_once('-').ok_or_else(bad)?;
        let shape = *shapes().find(|s| s.name == shape).ok_or_else(bad)?;
        let wtype = TYPES.iter().find(|t| t.0 == ty).ok_or_else(bad)?.1;
        if wtype == DType::MXFP4 && shape.arch != "gpt-oss" {
            return Err(bad());
        }
        let preset = Preset { shape, wtype };
        if let Some(t) = preset
            .tensors()
            .iter()
            .find(|t| t.dims[0] % t.dtype.block_size() as u64 != 0)
        {
            return Err(ModelError::Input(format!(
                "synthetic preset {name:?}: {} has rows of {} elements, not whole {:?} blocks",
                t.name, t.dims[0], t.dtype
            )));
        }
        Ok(preset)
    }

    /// The preset's name as parsed.
    pub fn name(&self) -> String {
        let ty = TYPES
            .iter()
            .find(|t| t.1 == self.wtype)
            .map_or("?", |t| t.0);
        format!("{}-{ty}", self.shape.name)
    }

    /// Builds the GGUF image with weights drawn from `seed`.
    pub fn build(&self, seed: u64) -> Result<GgufFile, ModelError> {
        let specs = self.tensors();
        let largest = specs.iter().map(|t| t.bytes()).max().unwrap_or(0);
        let zeros = vec![0u8; largest];
        let mut w = GgufWriter::new();
        self.metadata(&mut w);
        for t in &specs {
            w.add_tensor(t.name.clone(), t.dtype, &t.dims, &zeros[..t.bytes()])?;
        }
        let image = w.to_bytes()?;
        drop(zeros);
        let file = GgufFile::from_bytes(image)?;
        let ranges: Vec<(usize, usize)> = file
            .tensors()
            .iter()
            .map(|t| (file.data_offset() + t.offset as usize, t.size_bytes))
            .collect();
        let mut image = file.into_bytes();
        for (i, (t, &(start, len))) in specs.iter().zip(&ranges).enumerate() {
            fill(
                &mut image[start..start + len],
                t,
                seed ^ (i as u64).wrapping_mul(GOLDEN),
            );
        }
        Ok(GgufFile::from_bytes(image)?)
    }

    fn metadata(&self, w: &mut GgufWriter) {
        let s = &self.shape;
        let a = s.arch;
        let k = |key: &str| format!("{a}.{key}");
        w.set("general.architecture", a);
        w.set("general.name", format!("synthetic-{}", self.name()));
        w.set(k("context_length"), s.n_ctx_train);
        w.set(k("embedding_length"), s.n_embd as u32);
        w.set(k("block_count"), s.n_layer as u32);
        w.set(k("feed_forward_length"), s.n_ff as u32);
        w.set(k("attention.head_count"), s.n_head as u32);
        w.set(k("attention.head_count_kv"), s.n_head_kv as u32);
        w.set(k("attention.layer_norm_rms_epsilon"), s.rms_eps);
        w.set(k("rope.freq_base"), s.rope_base);
        if a == "llama" {
            w.set(k("rope.dimension_count"), s.head_dim as u32);
            w.set(k("vocab_size"), s.n_vocab as u32);
        } else {
            w.set(k("attention.key_length"), s.head_dim as u32);
            w.set(k("attention.value_length"), s.head_dim as u32);
        }
        if s.swa > 0 {
            w.set(k("attention.sliding_window"), s.swa);
        }
        if s.n_expert > 0 {
            w.set(k("expert_count"), s.n_expert as u32);
            w.set(k("expert_used_count"), s.n_expert_used as u32);
            w.set(k("expert_feed_forward_length"), s.expert_ff as u32);
        }
        if let Some(h) = &s.hybrid {
            h.metadata(w, k);
        }
        if a == "gpt-oss" {
            w.set(k("rope.scaling.type"), "yarn");
            w.set(k("rope.scaling.factor"), 32.0f32);
            w.set(k("rope.scaling.original_context_length"), 4096u32);
        }
        tokenizer(w, s.n_vocab as usize);
    }

    /// The output matrix's type: Q6_K in the Q4_K_M layout, else the dense type.
    fn head_type(&self, dense: DType) -> DType {
        if dense == DType::Q4K {
            DType::Q6K
        } else {
            dense
        }
    }

    /// The type of `attn_v` and `ffn_down` of layer `l`: Q6_K in the Q4_K_M layout for the layers
    /// llama-quantize gives more bits (the first and last eighth, and every third one between).
    fn more_bits_type(&self, dense: DType, l: u64) -> DType {
        let n = self.shape.n_layer;
        let more_bits = l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2;
        if dense == DType::Q4K && more_bits {
            DType::Q6K
        } else {
            dense
        }
    }

    /// Every tensor, in file order.
    fn tensors(&self) -> Vec<TensorSpec> {
        let s = &self.shape;
        let (e, v) = (s.n_embd, s.n_vocab);
        let (q, kv) = (s.n_head * s.head_dim, s.n_head_kv * s.head_dim);
        let gpt_oss = s.arch == "gpt-oss";
        // gpt-oss stores its non-expert matrices in F16; the other shapes use the preset's type.
        let dense = if gpt_oss || self.wtype == DType::MXFP4 {
            DType::F16
        } else {
            self.wtype
        };
        let mut t = vec![
            TensorSpec::embedding("token_embd.weight", dense, &[e, v]),
            TensorSpec::norm("output_norm.weight", &[e]),
        ];
        if !s.tied {
            t.push(TensorSpec::matrix("output.weight", dense, &[e, v]));
        }
        if !s.tied {
            t.last_mut().expect("output pushed").dtype = self.head_type(dense);
        }
        for l in 0..s.n_layer {
            if let Some(h) = &s.hybrid {
                t.extend(h.layer(s, l, dense, self.wtype));
                continue;
            }
            let n = |x: &str| format!("blk.{l}.{x}");
            let more_bits = self.more_bits_type(dense, l);
            t.push(TensorSpec::norm(&n("attn_norm.weight"), &[e]));
            for (name, dims) in [
                ("attn_q", [e, q]),
                ("attn_k", [e, kv]),
                ("attn_v", [e, kv]),
                ("attn_output", [q, e]),
            ] {
                let ty = if name == "attn_v" { more_bits } else { dense };
                t.push(TensorSpec::matrix(&n(&format!("{name}.weight")), ty, &dims));
                if gpt_oss {
                    t.push(TensorSpec::bias(&n(&format!("{name}.bias")), &[dims[1]]));
                }
            }
            if s.arch == "qwen3moe" {
                t.push(TensorSpec::norm(&n("attn_q_norm.weight"), &[s.head_dim]));
                t.push(TensorSpec::norm(&n("attn_k_norm.weight"), &[s.head_dim]));
            }
            if gpt_oss {
                t.push(TensorSpec::bias(&n("attn_sinks.weight"), &[s.n_head]));
                t.push(TensorSpec::norm(&n("post_attention_norm.weight"), &[e]));
            } else {
                t.push(TensorSpec::norm(&n("ffn_norm.weight"), &[e]));
            }
            if s.n_expert == 0 {
                t.push(TensorSpec::matrix(
                    &n("ffn_gate.weight"),
                    dense,
                    &[e, s.n_ff],
                ));
                t.push(TensorSpec::matrix(&n("ffn_up.weight"), dense, &[e, s.n_ff]));
                t.push(TensorSpec::matrix(
                    &n("ffn_down.weight"),
                    more_bits,
                    &[s.n_ff, e],
                ));
                continue;
            }
            let (x, f) = (s.n_expert, s.expert_ff);
            t.push(TensorSpec::router(&n("ffn_gate_inp.weight"), &[e, x]));
            if gpt_oss {
                t.push(TensorSpec::bias(&n("ffn_gate_inp.bias"), &[x]));
            }
            for (name, dims) in [
                ("ffn_gate_exps", [e, f, x]),
                ("ffn_up_exps", [e, f, x]),
                ("ffn_down_exps", [f, e, x]),
            ] {
                t.push(TensorSpec::matrix(
                    &n(&format!("{name}.weight")),
                    self.wtype,
                    &dims,
                ));
                if gpt_oss {
                    t.push(TensorSpec::bias(&n(&format!("{name}.bias")), &[dims[1], x]));
                }
            }
        }
        t
    }
}

/// A SentencePiece-style vocabulary of `n` tokens: `<unk>`, `<s>`, `</s>`, the 256 byte tokens, then
/// placeholder pieces.
fn tokenizer(w: &mut GgufWriter, n: usize) {
    let mut tokens = Vec::with_capacity(n);
    let mut types = Vec::with_capacity(n);
    for (t, ty) in [("<unk>", 2), ("<s>", 3), ("</s>", 3)] {
        tokens.push(t.to_string());
        types.push(ty);
    }
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    for i in tokens.len()..n {
        tokens.push(format!("\u{2581}t{i}"));
        types.push(1);
    }
    tokens.truncate(n);
    types.truncate(n);
    let scores: Vec<f32> = (0..n).map(|i| -(i as f32)).collect();
    w.set("tokenizer.ggml.model", "llama");
    w.set("tokenizer.ggml.pre", "default");
    w.set("tokenizer.ggml.tokens", Value::from(tokens));
    w.set("tokenizer.ggml.scores", Value::from(scores));
    w.set("tokenizer.ggml.token_type", Value::from(types));
    w.set("tokenizer.ggml.bos_token_id", 1u32);
    w.set("tokenizer.ggml.eos_token_id", 2u32);
    w.set("tokenizer.ggml.unknown_token_id", 0u32);
    w.set("tokenizer.ggml.add_bos_token", false);
}

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Init {
    /// Uniform with standard deviation `std`.
    Uniform { std: f32 },
    /// `1 + uniform(±0.1)`.
    Norm,
    /// `-2 + uniform(±1)`: a delta net's `A = -exp(A_log)`, a decay.
    Decay,
}

struct TensorSpec {
    name: String,
    dtype: DType,
    dims: Vec<u64>,
    init: Init,
}

impl TensorSpec {
    fn new(name: &str, dtype: DType, dims: &[u64], init: Init) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            dtype,
            dims: dims.to_vec(),
            init,
        }
    }
    fn matrix(name: &str, dtype: DType, dims: &[u64]) -> TensorSpec {
        let std = 1.0 / (dims[0] as f32).sqrt();
        Self::new(name, dtype, dims, Init::Uniform { std })
    }
    fn router(name: &str, dims: &[u64]) -> TensorSpec {
        let std = 2.0 / (dims[0] as f32).sqrt();
        Self::new(name, DType::F32, dims, Init::Uniform { std })
    }
    fn embedding(name: &str, dtype: DType, dims: &[u64]) -> TensorSpec {
        Self::new(name, dtype, dims, Init::Uniform { std: 1.0 })
    }
    fn norm(name: &str, dims: &[u64]) -> TensorSpec {
        Self::new(name, DType::F32, dims, Init::Norm)
    }
    fn bias(name: &str, dims: &[u64]) -> TensorSpec {
        Self::new(name, DType::F32, dims, Init::Uniform { std: 0.1 })
    }
    fn elements(&self) -> usize {
        self.dims.iter().product::<u64>() as usize
    }
    fn bytes(&self) -> usize {
        self.elements() / self.dtype.block_size() * self.dtype.type_size()
    }
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// A small, fast, seedable generator (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn signed(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Bytes per independently seeded chunk (a multiple of every block size used here).
const CHUNK: usize = 64 * 34 * 18 * 17;

/// Fills a tensor's bytes, chunks in parallel.
fn fill(dst: &mut [u8], t: &TensorSpec, seed: u64) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunks: Vec<(usize, &mut [u8])> = dst.chunks_mut(CHUNK).enumerate().collect();
    let per = chunks.len().div_ceil(threads).max(1);
    let mut groups: Vec<Vec<(usize, &mut [u8])>> = Vec::new();
    for c in chunks {
        match groups.last_mut() {
            Some(g) if g.len() < per => g.push(c),
            _ => groups.push(vec![c]),
        }
    }
    std::thread::scope(|s| {
        for g in groups {
            s.spawn(move || {
                for (i, c) in g {
                    let mut rng = Rng(seed ^ (i as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93));
                    fill_chunk(c, t.dtype, t.init, &mut rng);
                }
            });
        }
    });
}

fn fill_chunk(dst: &mut [u8], dtype: DType, init: Init, rng: &mut Rng) {
    // Uniform(±a) has standard deviation a/√3.
    let (center, amp) = match init {
        Init::Uniform { std } => (0.0, std * 3f32.sqrt()),
        Init::Norm => (1.0, 0.1),
        Init::Decay => (-2.0, 1.0),
    };
    let mut value = || center + amp * rng.signed();
    match dtype {
        DType::F32 => dst
            .chunks_exact_mut(4)
            .for_each(|b| b.copy_from_slice(&value().to_le_bytes())),
        DType::F16 => dst
            .chunks_exact_mut(2)
            .for_each(|b| b.copy_from_slice(&f16::from_f32(value()).to_le_bytes())),
        DType::BF16 => dst
            .chunks_exact_mut(2)
            .for_each(|b| b.copy_from_slice(&bf16::from_f32(value()).to_le_bytes())),
        // Blocks of one f16 scale and random codes spanning ±amp.
        DType::Q8_0 => dst.chunks_exact_mut(34).for_each(|b| {
            b[..2].copy_from_slice(&f16::from_f32(amp / 127.0).to_le_bytes());
            random_bytes(&mut b[2..], rng);
            b[2..]
                .iter_mut()
                .filter(|c| **c == 0x80)
                .for_each(|c| *c = 0x81);
        }),
        DType::Q4_0 => dst.chunks_exact_mut(18).for_each(|b| {
            b[..2].copy_from_slice(&f16::from_f32(amp / 8.0).to_le_bytes());
            random_bytes(&mut b[2..], rng);
        }),
        // d, dmin, random 6-bit scales and mins, random 4-bit codes: d·sc·q − dmin·m is centred
        // (E[sc·q] = 32 · 7.5, E[m] = 32) with a spread of about ±amp.
        DType::Q4K => dst.chunks_exact_mut(144).for_each(|b| {
            let d = amp / 256.0;
            b[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
            b[2..4].copy_from_slice(&f16::from_f32(7.5 * d).to_le_bytes());
            random_bytes(&mut b[4..], rng);
        }),
        // Random 6-bit codes (q − 32), random signed 8-bit scales, then d.
        DType::Q6K => dst.chunks_exact_mut(210).for_each(|b| {
            random_bytes(&mut b[..208], rng);
            b[208..].copy_from_slice(&f16::from_f32(amp / 2048.0).to_le_bytes());
        }),
        // One E8M0 exponent (2^(e-127), largest code 6) and random E2M1 codes.
        DType::MXFP4 => dst.chunks_exact_mut(17).for_each(|b| {
            b[0] = (127.0 + (amp / 6.0).log2().round()).clamp(1.0, 254.0) as u8;
            random_bytes(&mut b[1..], rng);
        }),
        other => unreachable!("no synthetic preset uses {other:?}"),
    }
}

fn random_bytes(dst: &mut [u8], rng: &mut Rng) {
    for c in dst.chunks_mut(8) {
        let r = rng.next().to_le_bytes();
        c.copy_from_slice(&r[..c.len()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_parse_and_refuse() {
        let p = Preset::parse("llama3-8b-q4_0").unwrap();
        assert_eq!(p.name(), "llama3-8b-q4_0");
        assert_eq!(p.shape.n_ff, 14336);
        assert!(Preset::parse("gpt-oss-20b-mxfp4").is_ok());
        assert!(Preset::parse("llama3-8b-q4_k").is_ok());
        assert!(Preset::parse("qwen3-30b-a3b-q6_k").is_ok());
        for hybrid in [
            "qwen3-next-80b-a3b",
            "qwen3.5-27b",
            "qwen3.5-35b-a3b",
            "tiny-qwen35",
            "tiny-qwen35moe",
        ] {
            for ty in ["q4_0", "q8_0", "bf16"] {
                let name = format!("{hybrid}-{ty}");
                assert_eq!(Preset::parse(&name).unwrap().name(), name);
            }
        }
        for bad in [
            "qwen3.5-27b-mxfp4",
            "tiny-qwen35-q4_k",
            "llama3-8b",
            "llama3-8b-q5_k",
            "gpt-oss-20b-q4_k",
            "llama3-8b-mxfp4",
            "nope-f16",
            "",
        ] {
            assert!(Preset::parse(bad).is_err(), "{bad}");
        }
    }

    /// Billions of parameters of a preset: all of them, and those one token uses (the experts in
    /// the proportion used).
    pub(super) fn billions(name: &str) -> (f64, f64) {
        let p = Preset::parse(name).unwrap();
        let (mut total, mut active) = (0.0, 0.0);
        for t in p.tensors() {
            let n = t.elements() as f64 / 1e9;
            total += n;
            active += match t.name.contains("_exps.") {
                true => n * p.shape.n_expert_used as f64 / p.shape.n_expert as f64,
                false => n,
            };
        }
        (total, active)
    }

    #[test]
    fn sizes_match_the_published_models() {
        // Parameter counts of the published models (embeddings and head included, untied).
        let total = |name: &str| billions(name).0;
        assert!((total("llama3-8b-f16") - 8.03).abs() < 0.01);
        assert!((total("qwen3-30b-a3b-q4_0") - 30.5).abs() < 0.1);
        assert!((total("gpt-oss-20b-mxfp4") - 20.9).abs() < 0.1);
    }

    #[test]
    fn images_are_deterministic_and_finite() {
        for name in [
            "tiny-llama-q4_0",
            "tiny-llama-bf16",
            "tiny-gpt-oss-mxfp4",
            "tiny-qwen3next-q8_0",
            "tiny-qwen35-q4_0",
            "tiny-qwen35moe-q8_0",
        ] {
            let p = Preset::parse(name).unwrap();
            let a = p.build(7).unwrap();
            let b = p.build(7).unwrap();
            let c = p.build(8).unwrap();
            assert_eq!(a.as_bytes(), b.as_bytes(), "{name}");
            assert_ne!(a.as_bytes(), c.as_bytes(), "{name}");
            for t in a.tensors() {
                let data = a.tensor_data(t);
                let out = ggml_core::quant::dequantize_to_vec(t.dtype, data).unwrap();
                assert!(out.iter().all(|x| x.is_finite()), "{name} {}", t.name);
                let ms = out.iter().map(|x| x * x).sum::<f32>() / out.len() as f32;
                assert!(ms > 0.0, "{name} {} is all zero", t.name);
            }
        }
    }

    #[test]
    fn q4_k_lays_out_types_like_q4_k_m() {
        let p = Preset::parse("llama3-8b-q4_k").unwrap();
        let tensors = p.tensors();
        let of = |name: &str| tensors.iter().find(|t| t.name == name).unwrap().dtype;
        assert_eq!(of("output.weight"), DType::Q6K);
        assert_eq!(of("token_embd.weight"), DType::Q4K);
        for (l, more) in [
            (0, true),
            (3, true),
            (4, false),
            (6, true),
            (27, true),
            (28, true),
        ] {
            let want = if more { DType::Q6K } else { DType::Q4K };
            assert_eq!(of(&format!("blk.{l}.attn_v.weight")), want, "{l}");
            assert_eq!(of(&format!("blk.{l}.ffn_down.weight")), want, "{l}");
            assert_eq!(of(&format!("blk.{l}.attn_q.weight")), DType::Q4K, "{l}");
        }
        let q6 = tensors.iter().filter(|t| t.dtype == DType::Q6K).count();
        assert_eq!(q6, 1 + 2 * 16);
    }

    #[test]
    fn k_quant_blocks_are_finite_and_centred() {
        for dtype in [DType::Q4K, DType::Q6K] {
            let spec = TensorSpec::matrix("w", dtype, &[4096, 64]);
            let mut bytes = vec![0u8; spec.bytes()];
            fill(&mut bytes, &spec, 3);
            let out = ggml_core::quant::dequantize_to_vec(dtype, &bytes).unwrap();
            let n = out.len() as f32;
            let mean = out.iter().sum::<f32>() / n;
            let rms = (out.iter().map(|x| x * x).sum::<f32>() / n).sqrt();
            assert!(out.iter().all(|x| x.is_finite()), "{dtype:?}");
            assert!(rms > 0.005 && rms < 0.2, "{dtype:?} rms {rms}");
            assert!(mean.abs() < 0.2 * rms, "{dtype:?} mean {mean} rms {rms}");
        }
    }
}
