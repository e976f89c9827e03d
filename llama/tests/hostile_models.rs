//! Hostile model files give a clear [`ModelError`], never a panic, an abort or a huge allocation:
//! copies of the tiny fixture models (`fixtures/arch`) with rewritten metadata or tensors (the cases
//! of issue 15 and the inputs the `model_load` fuzz target found, kept in
//! `fuzz/corpus/model_load/`), a file cut short, devices too small for the weights or the cache, and
//! a device that runs out of memory or is lost while loading or computing
//! ([`ggml_tp_tests::fault`]).

use backend_cpu::device::CpuDevice;
use backend_meta::MetaDevice;
use ggml_core::backend::Device;
use ggml_core::gguf::{GgufFile, GgufWriter, Value};
use ggml_core::DType;
use ggml_tp_tests::fault::{FaultDevice, FaultPlan};
use llama::runtime::{Outputs, Session, SessionOptions};
use llama::{Model, ModelError, Placement};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The fixture `arch/<name>.gguf`, or `None` (the test is skipped) without fixtures.
fn fixture(name: &str) -> Option<GgufFile> {
    let dir = std::env::var_os("GGML_TP_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures"));
    let path = dir.join("arch").join(format!("{name}.gguf"));
    if !path.is_file() {
        println!("skipped: {} not found", path.display());
        return None;
    }
    Some(GgufFile::open(path).unwrap())
}

/// `file` with the metadata `edits` applied (tensors unchanged).
fn rewritten(file: &GgufFile, edits: Vec<(&str, Value)>) -> GgufFile {
    let mut w = GgufWriter::from_file(file).unwrap();
    for (k, v) in edits {
        w.set(k, v);
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

/// `file` with tensor `name` of type `dtype`, its bytes reinterpreted (cut or zero-padded to the
/// new size), as the fuzz target's type mutation does.
fn retyped(file: &GgufFile, name: &str, dtype: DType) -> GgufFile {
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata() {
        w.set(k.clone(), v.clone());
    }
    for t in file.tensors() {
        let mut data = file.tensor_data(t).to_vec();
        let ty = if t.name == name { dtype } else { t.dtype };
        let elems: u64 = t.dims().iter().product();
        data.resize(elems as usize / ty.block_size() * ty.type_size(), 0);
        w.add_tensor(t.name.clone(), ty, t.dims(), data).unwrap();
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

/// A CPU device of `budget` bytes.
fn cpu(index: usize, budget: usize) -> Arc<dyn Device> {
    CpuDevice::new(index, 1, budget).unwrap()
}

fn single() -> Placement {
    Placement::Single(cpu(0, 1 << 30))
}

/// Tensor parallelism over 2 CPU devices of `budget` bytes each.
fn tensor2(budget: usize) -> Placement {
    Placement::Tensor(MetaDevice::new(vec![cpu(0, budget), cpu(1, budget)], None).unwrap())
}

/// Loads `file` onto `placement` and runs a few tokens; the error of whichever step fails.
fn load_and_run(file: &GgufFile, placement: &Placement) -> Result<(), ModelError> {
    let model = Arc::new(Model::from_gguf(file, placement)?);
    let mut s = Session::new(model, SessionOptions::default())?;
    s.eval(&[1, 2, 3], Outputs::Last).map(|_| ())
}

/// Asserts that `result` failed with an error naming `key`.
#[track_caller]
fn assert_names<T>(result: Result<T, ModelError>, key: &str) {
    match result {
        Ok(_) => panic!("loaded, expected an error naming {key:?}"),
        Err(e) => assert!(e.to_string().contains(key), "{e} does not name {key:?}"),
    }
}

#[test]
fn zero_key_and_value_length_with_tensor_split() {
    let Some(f) = fixture("llama") else { return };
    let f = rewritten(
        &f,
        vec![
            ("llama.attention.key_length", Value::U32(0)),
            ("llama.attention.value_length", Value::U32(0)),
        ],
    );
    let r = Model::from_gguf(&f, &tensor2(1 << 30));
    assert!(matches!(r, Err(ModelError::OutOfRange { value: 0, .. })));
    assert_names(r, "llama.attention.key_length");
    assert_names(
        Model::from_gguf(&f, &single()),
        "llama.attention.key_length",
    );
}

#[test]
fn huge_block_counts() {
    let Some(f) = fixture("llama") else { return };
    for n in [1u64 << 40, 1 << 61, u64::MAX, 4097] {
        let f = rewritten(&f, vec![("llama.block_count", Value::U64(n))]);
        let r = Model::from_gguf(&f, &single());
        assert!(matches!(&r, Err(ModelError::OutOfRange { value, .. }) if *value == n as u128));
        assert_names(r, "llama.block_count");
        assert_names(Model::from_gguf(&f, &tensor2(1 << 30)), "llama.block_count");
    }
}

#[test]
fn out_of_range_counts_name_their_key() {
    let cases: [(&str, &str, Value); 8] = [
        ("llama", "llama.attention.head_count", Value::U32(0)),
        (
            "llama",
            "llama.attention.head_count_kv",
            Value::U64(1 << 20),
        ),
        ("llama", "llama.embedding_length", Value::U64(1 << 40)),
        ("llama", "llama.context_length", Value::U64(1 << 60)),
        ("llama", "llama.rope.dimension_count", Value::U32(1 << 20)),
        ("qwen3moe", "qwen3moe.expert_count", Value::U64(1 << 33)),
        ("gemma3", "gemma3.attention.sliding_window", Value::I64(-1)),
        ("qwen35", "qwen35.ssm.conv_kernel", Value::U32(1 << 30)),
    ];
    for (name, key, value) in cases {
        let Some(f) = fixture(name) else { return };
        let f = rewritten(&f, vec![(key, value)]);
        assert_names(Model::from_gguf(&f, &single()), key);
    }
}

#[test]
fn rotated_dims_past_the_head_size() {
    let Some(f) = fixture("llama") else { return };
    let f = rewritten(&f, vec![("llama.rope.dimension_count", Value::U32(1000))]);
    assert_names(
        Model::from_gguf(&f, &single()),
        "llama.rope.dimension_count",
    );
}

#[test]
fn huge_cache_sizes_are_refused() {
    let Some(f) = fixture("llama") else { return };
    let model = Arc::new(Model::from_gguf(&f, &single()).unwrap());
    for n_ctx in [0, 1 << 40, usize::MAX] {
        let opts = SessionOptions {
            n_ctx,
            ..SessionOptions::default()
        };
        assert_names(Session::new(model.clone(), opts), "n_ctx");
    }
}

#[test]
fn truncated_file_is_an_error() {
    let Some(f) = fixture("llama") else { return };
    let bytes = f.as_bytes();
    let path = std::env::temp_dir().join(format!("hostile-truncated-{}.gguf", std::process::id()));
    for cut in [bytes.len() - 1, bytes.len() / 2, f.data_offset() + 10] {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        let r = Model::load(&path, &single());
        assert!(matches!(r, Err(ModelError::Gguf(_))), "cut at {cut}");
        assert!(r
            .err()
            .unwrap()
            .to_string()
            .contains("outside the data section"));
    }
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn devices_too_small_for_the_weights() {
    let Some(f) = fixture("llama") else { return };
    for placement in [Placement::Single(cpu(0, 1 << 16)), tensor2(1 << 16)] {
        let r = Model::from_gguf(&f, &placement);
        assert!(
            matches!(
                r,
                Err(ModelError::Core(ggml_core::Error::OutOfMemory { .. }))
            ),
            "{:?}",
            r.err()
        );
    }
}

#[test]
fn device_too_small_for_the_cache() {
    let Some(f) = fixture("llama") else { return };
    let budget = f.as_bytes().len() * 2;
    let model = Arc::new(Model::from_gguf(&f, &Placement::Single(cpu(0, budget))).unwrap());
    let opts = SessionOptions {
        n_ctx: 1 << 20,
        ..SessionOptions::default()
    };
    let r = Session::new(model.clone(), opts);
    assert!(matches!(
        r,
        Err(ModelError::Core(ggml_core::Error::OutOfMemory { .. }))
    ));
    // The failed cache released its memory: a small one fits.
    Session::new(model, SessionOptions::default()).unwrap();
}

#[test]
fn fixtures_still_run() {
    for name in ["llama", "qwen35", "gemma4-moe"] {
        let Some(f) = fixture(name) else { return };
        load_and_run(&f, &single()).unwrap();
        load_and_run(&f, &tensor2(1 << 30)).unwrap();
    }
}

/// Fuzz finding (`finding-q8-quantize-overflow-*`): quantized weights read as F32 (or Q4_0 as Q8_0)
/// give activations whose Q8_0 blocks have a subnormal scale, whose infinite inverse overflowed the
/// rounding of the activation quantizer (a panic with overflow checks, a wrapped value without).
#[test]
fn garbage_weights_quantize_without_overflow() {
    let cases = [
        ("llama-q8_0", "blk.0.ffn_gate.weight", DType::F32),
        ("llama-q8_0", "blk.0.attn_v.weight", DType::Q4_0),
        ("llama-q4_0", "blk.1.attn_v.weight", DType::Q8_0),
        ("llama", "blk.0.ffn_norm.weight", DType::BF16),
    ];
    for (name, tensor, dtype) in cases {
        let Some(f) = fixture(name) else { return };
        let f = retyped(&f, tensor, dtype);
        let tokens = llama::tokenizer::Tokenizer::from_gguf(&f).unwrap().encode(
            "Hello world, 12",
            true,
            true,
        );
        for placement in [single(), tensor2(1 << 30)] {
            // Garbage in, garbage logits out: any result but a panic.
            let model = Arc::new(Model::from_gguf(&f, &placement).unwrap());
            let mut s = Session::new(model, SessionOptions::default()).unwrap();
            let _ = s.eval(&tokens, Outputs::All);
        }
    }
}

/// Normalized mean squared error of `got` against `want`.
fn nmse(got: &[f32], want: &[f32]) -> f64 {
    let err: f64 = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w as f64).powi(2))
        .sum();
    let norm: f64 = want.iter().map(|&w| (w as f64).powi(2)).sum();
    err / norm.max(f64::MIN_POSITIVE)
}

/// A fault-injecting device around a CPU device, and its plan.
fn faulty_cpu(index: usize) -> (Arc<dyn Device>, Arc<FaultPlan>) {
    let plan = Arc::new(FaultPlan::default());
    (FaultDevice::new(cpu(index, 1 << 30), plan.clone()), plan)
}

/// Out of memory at each allocation of loading the model and its cache, one at a time: every one
/// is an [`ggml_core::Error::OutOfMemory`], and with the fault gone the same device loads and runs.
#[test]
fn out_of_memory_at_every_allocation_of_loading() {
    let Some(f) = fixture("llama") else { return };
    let (device, plan) = faulty_cpu(0);
    let placement = Placement::Single(device);
    load_and_run(&f, &placement).unwrap();
    let allocs = plan.allocs.load(Ordering::SeqCst);
    assert!(allocs >= 2, "{allocs}");
    for n in 0..allocs.min(64) {
        plan.fail_allocs_after(n);
        let r = load_and_run(&f, &placement);
        assert!(
            matches!(
                r,
                Err(ModelError::Core(ggml_core::Error::OutOfMemory { .. }))
            ),
            "allocation {n}: {:?}",
            r.err()
        );
    }
    plan.heal();
    load_and_run(&f, &placement).unwrap();
}

/// Faults under a loaded model, on one device and over two with tensor parallelism: the compute
/// buffer cannot grow for a longer batch (out of memory), the device is lost (compute fails): each
/// an error of that `eval`, and once the fault is gone the same session computes the same logits
/// as a session that never saw one.
#[test]
fn device_faults_mid_session_are_errors_and_the_session_goes_on() {
    let Some(f) = fixture("llama") else { return };
    let (d0, p0) = faulty_cpu(0);
    let (d1, p1) = faulty_cpu(1);
    let tensor = Placement::Tensor(MetaDevice::new(vec![d0, d1], None).unwrap());
    let (single_dev, p_single) = faulty_cpu(2);
    let cases = [
        (Placement::Single(single_dev), vec![p_single]),
        (tensor, vec![p0, p1]),
    ];
    let long: Vec<u32> = (1..=47).collect();
    for (placement, plans) in cases {
        let model = Arc::new(Model::from_gguf(&f, &placement).unwrap());
        let want = Session::new(model.clone(), SessionOptions::default())
            .unwrap()
            .eval(&long, Outputs::Last)
            .unwrap()
            .last()
            .to_vec();
        let mut s = Session::new(model, SessionOptions::default()).unwrap();
        s.eval(&[1, 2, 3], Outputs::Last).unwrap();
        s.reset();
        let faulty = plans.last().unwrap();
        faulty.fail_allocs_after(0);
        let r = s.eval(&long, Outputs::Last);
        assert!(
            matches!(
                r,
                Err(ModelError::Core(ggml_core::Error::OutOfMemory { .. }))
            ),
            "{:?}",
            r.err()
        );
        faulty.heal();
        s.reset();
        faulty.fail_computes_after(0);
        let Err(e) = s.eval(&long, Outputs::Last) else {
            panic!("computed on a lost device");
        };
        assert!(e.to_string().contains("device was lost"), "{e}");
        faulty.heal();
        s.reset();
        let got = s.eval(&long, Outputs::Last).unwrap();
        let err = nmse(got.last(), &want);
        assert!(err < 1e-10, "nmse {err}");
    }
}
