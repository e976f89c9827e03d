//! Synthetic models (`--synthetic PRESET`): the tiny presets have the hyper-parameters of the
//! fixtures' tiny models of the same architecture, so their metadata and tensor names and shapes must
//! equal those files' (which llama.cpp loads) — the check that the large presets follow the same
//! conventions. A synthetic model loads and gives finite logits that agree between split mode none
//! and tensor over two CPU devices. (`ggml-tp bench --synthetic` and `ggml-tp synth` are tested with
//! the program, `ggml-tp/tests/synthetic.rs`.)

#[path = "logits_util.rs"]
mod util;

use ggml_core::gguf::GgufFile;
use llama::model::synthetic::Preset;
use llama::{Model, Outputs, Session, SessionOptions};
use std::collections::BTreeMap;
use std::sync::Arc;
use util::{arch_dir, nmse, Mode};

/// Metadata other than the tokenizer's and the names, as comparable strings.
fn hparams(f: &GgufFile) -> BTreeMap<String, String> {
    f.metadata()
        .iter()
        .filter(|(k, _)| !k.starts_with("tokenizer.") && !k.starts_with("general."))
        .map(|(k, v)| (k.clone(), v.describe()))
        .collect()
}

/// Tensor names with their shapes.
fn shapes(f: &GgufFile) -> BTreeMap<String, Vec<u64>> {
    f.tensors()
        .iter()
        .map(|t| (t.name.clone(), t.dims().to_vec()))
        .collect()
}

#[test]
fn tiny_presets_have_the_layout_of_the_fixtures() {
    let Some(dir) = arch_dir() else { return };
    for (preset, fixture) in [
        ("tiny-llama-f16", "llama"),
        ("tiny-qwen3moe-q8_0", "qwen3moe"),
        ("tiny-gpt-oss-mxfp4", "gpt-oss"),
        ("tiny-qwen3next-f16", "qwen3next"),
    ] {
        let synth = Preset::parse(preset).unwrap().build(1).unwrap();
        let file = GgufFile::open(dir.join(format!("{fixture}.gguf"))).unwrap();
        assert_eq!(hparams(&synth), hparams(&file), "{preset} vs {fixture}");
        assert_eq!(shapes(&synth), shapes(&file), "{preset} vs {fixture}");
    }
}

#[test]
fn synthetic_models_run_in_none_and_tensor_mode() {
    let tokens: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 500).collect();
    for preset in [
        "tiny-llama-q4_0",
        "tiny-qwen3moe-bf16",
        "tiny-gpt-oss-mxfp4",
        "tiny-qwen3next-q8_0",
        "small-qwen35-q4_0",
    ] {
        let file = Preset::parse(preset).unwrap().build(3).unwrap();
        let logits = |mode: Mode| {
            let model = Model::from_gguf(&file, &mode.placement()).unwrap();
            let mut s = Session::new(Arc::new(model), SessionOptions::default()).unwrap();
            s.eval(&tokens, Outputs::All).unwrap().data
        };
        let one = logits(Mode::None);
        let two = logits(Mode::Tensor(vec![1.0, 1.0]));
        assert!(one.iter().all(|x| x.is_finite()), "{preset}");
        let e = nmse(&two, &one);
        assert!(e < 1e-6, "{preset}: tensor vs none NMSE {e}");
    }
}
