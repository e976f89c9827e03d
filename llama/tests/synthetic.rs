//! Synthetic models (`--synthetic PRESET`): the tiny presets have the hyper-parameters of the
//! fixtures' tiny models of the same architecture, so their metadata and tensor names and shapes must
//! equal those files' (which llama.cpp loads) — the check that the large presets follow the same
//! conventions. A synthetic model loads and gives finite logits that agree between split mode none
//! and tensor over two CPU devices, and the tiny hybrid ones also when written to a file and loaded
//! from its path. (`ggml-tp bench --synthetic` and `ggml-tp synth` are tested with the program,
//! `ggml-tp/tests/synthetic.rs`.)

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
        ("tiny-qwen35-q4_0", "qwen35"),
        ("tiny-qwen35moe-q8_0", "qwen35moe"),
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

#[test]
fn tiny_hybrid_presets_written_to_a_file_load_and_run() {
    // What `ggml-tp synth` does (the image's bytes to a file), then the loader on the path.
    let tokens: Vec<u32> = (0..5).map(|i| (i * 101 + 7) % 517).collect();
    for preset in [
        "tiny-qwen3next-q4_0",
        "tiny-qwen3next-q8_0",
        "tiny-qwen35-q4_0",
        "tiny-qwen35-q8_0",
        "tiny-qwen35moe-q4_0",
        "tiny-qwen35moe-q8_0",
    ] {
        let file = Preset::parse(preset).unwrap().build(5).unwrap();
        let path = std::env::temp_dir().join(format!("synth-{preset}-{}.gguf", std::process::id()));
        std::fs::write(&path, file.as_bytes()).unwrap();
        let model = Model::load(&path, &Mode::None.placement());
        std::fs::remove_file(&path).unwrap();
        let mut s = Session::new(Arc::new(model.unwrap()), SessionOptions::default()).unwrap();
        let out = s.eval(&tokens, Outputs::All).unwrap();
        let (logits, n_vocab) = (out.data, out.n_vocab);
        assert_eq!(logits.len(), tokens.len() * n_vocab, "{preset}");
        assert!(logits.iter().all(|x| x.is_finite()), "{preset}");
        // Random weights give logits that differ between tokens and between positions.
        let row = |p: usize| &logits[p * n_vocab..(p + 1) * n_vocab];
        assert!(row(0).iter().any(|&x| x != row(0)[0]), "{preset}");
        assert_ne!(row(0), row(tokens.len() - 1), "{preset}");
    }
}

/// GPUs keep Q8_0 matrices whose rows are whole groups of 32 blocks regrouped (here the kernels
/// compiled for the host; Q4_0 only with `GGML_TP_GROUPED_WEIGHTS=q4_0,...`): on one device and
/// split over two (cut at whole groups) the logits agree with the CPU's, which keeps the file's
/// layout. A split that would cut a group keeps the file's type.
#[test]
fn regrouped_gpu_weights_give_the_cpu_logits() {
    use backend_meta::{MetaDevice, WeightSplit};
    use ggml_core::{DType, Device, Layout};
    use ggml_tp_tests::emulated::{self, Flavor};
    use llama::Placement;

    let gpus = emulated::devices(Flavor::Cuda, 3).unwrap();
    let cpu: Arc<dyn Device> = backend_cpu::device::cpu_devices(1, 2).unwrap().remove(0);
    // Q8_0 by default; Q4_0 measured slower regrouped.
    assert_eq!(gpus[0].weight_dtype(DType::Q8_0, 14336), DType::Q8_0G);
    assert_eq!(gpus[0].weight_dtype(DType::Q8_0, 1056), DType::Q8_0);
    assert_eq!(gpus[0].weight_dtype(DType::Q4_0, 4096), DType::Q4_0);
    assert_eq!(gpus[0].weight_dtype(DType::Q4K, 4096), DType::Q4K);
    assert_eq!(cpu.weight_dtype(DType::Q8_0, 1024), DType::Q8_0);

    let down = Layout::contiguous(DType::Q8_0, [14336, 4096, 1, 1]);
    let cols = WeightSplit::axis(0, 14336, 32);
    let meta = |n: usize| MetaDevice::new(gpus[..n].to_vec(), None).unwrap();
    // 7168 columns each: whole groups; a third of 14336 is not.
    let split = |n: usize, how: &WeightSplit| meta(n).split_weight_dtype(&down, how, 0, "down");
    assert_eq!(split(2, &cols).unwrap(), DType::Q8_0G);
    assert_eq!(split(3, &cols).unwrap(), DType::Q8_0);
    assert_eq!(
        split(3, &WeightSplit::axis(1, 4096, 1)).unwrap(),
        DType::Q8_0G
    );

    let tokens: Vec<u32> = (0..12).map(|i| (i * 151 + 7) % 2048).collect();
    for preset in ["small-llama-q4_0", "small-llama-q8_0"] {
        let file = Preset::parse(preset).unwrap().build(5).unwrap();
        let logits = |placement: Placement| {
            let model = Model::from_gguf(&file, &placement).unwrap();
            let mut s = Session::new(Arc::new(model), SessionOptions::default()).unwrap();
            s.eval(&tokens, Outputs::All).unwrap().data
        };
        let reference = logits(Placement::Single(cpu.clone()));
        let one = logits(Placement::Single(gpus[0].clone()));
        let two = logits(Placement::Tensor(meta(2)));
        // The GPU kernels round activations to 8 bits with F32 scales, the CPU's Q8_0 blocks with
        // F16 ones: about 1e-4 apart (a layout that misplaced a scale or quant would be ~1).
        for (name, got) in [("one GPU", one), ("two GPUs", two)] {
            let e = nmse(&got, &reference);
            assert!(e < 1e-3, "{preset} on {name}: NMSE {e} against the CPU");
        }
    }
}
