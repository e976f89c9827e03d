//! Fuzz target for model loading: structure-aware mutations of the tiny fixture models
//! (`$GGML_TP_FIXTURES/arch/*.gguf`), then the tokenizer, the whole load and one forward pass of a
//! few tokens, in split mode none or tensor over 2 CPU devices. Any error is fine; a panic, an abort
//! or a huge allocation is a finding.
//!
//! An input is a compact mutation description: byte 0 picks the fixture, byte 1 the split mode, then
//! each 12-byte record is one mutation (see [`Mutation::decode`]): an integer key scaled, zeroed or set
//! to an extreme, an array shortened or lengthened, a value's type changed, a key removed, a float set
//! to an odd value, a key of any fixture's architecture added under this file's architecture, a
//! tensor dim changed (its data cut or zero-padded to the new size) or its type changed.

#![no_main]

use backend_cpu::device::CpuDevice;
use backend_meta::MetaDevice;
use ggml_core::backend::Device;
use ggml_core::gguf::{Array, GgufFile, GgufWriter, Value};
use ggml_core::DType;
use libfuzzer_sys::fuzz_target;
use llama::runtime::{Outputs, Session, SessionOptions};
use llama::tokenizer::Tokenizer;
use llama::{Model, Placement};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// Memory budget of each CPU device: far above the fixtures, so that a hostile size fails to
/// allocate instead of taking the machine's memory.
const BUDGET: usize = 1 << 30;
/// The largest tensor data a mutation may make (the rest is skipped).
const MAX_TENSOR_BYTES: u64 = 64 << 20;

/// The fixture models, every `<arch>.` key of them (the suffix after the architecture, with its
/// value), and the CPU devices, loaded once.
struct World {
    fixtures: Vec<GgufFile>,
    arch_keys: Vec<(String, Value)>,
    devices: Vec<Arc<dyn Device>>,
}

/// The suffixes of the `<arch>.<suffix>` keys of `files`, each once, with a value it has.
fn arch_keys(files: &[GgufFile]) -> Vec<(String, Value)> {
    let mut keys: Vec<(String, Value)> = Vec::new();
    for f in files {
        let Ok(arch) = f.get_str("general.architecture") else {
            continue;
        };
        let prefix = format!("{arch}.");
        for (k, v) in f.metadata() {
            if let Some(suffix) = k.strip_prefix(&prefix) {
                if !keys.iter().any(|(s, _)| s == suffix) {
                    keys.push((suffix.to_string(), v.clone()));
                }
            }
        }
    }
    keys
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let dir = std::env::var_os("GGML_TP_FIXTURES")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/work/shared/fixtures"))
            .join("arch");
        let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("fixtures {}: {e}", dir.display()))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
            .collect();
        paths.sort();
        let fixtures: Vec<GgufFile> = paths
            .iter()
            .map(|p| GgufFile::open(p).expect("fixture parses"))
            .collect();
        let arch_keys = arch_keys(&fixtures);
        let devices = (0..2)
            .map(|i| CpuDevice::new(i, 1, BUDGET).expect("cpu device") as Arc<dyn Device>)
            .collect();
        World {
            fixtures,
            arch_keys,
            devices,
        }
    })
}

/// One mutation of a file's metadata or tensors.
enum Mutation {
    /// Integer key `key` (index into the metadata) set from its value by `how`.
    Int { key: usize, how: u8, typ: u8 },
    /// Array key shortened or lengthened to `len` elements.
    ArrayLen { key: usize, len: usize },
    /// Key `key` replaced by a value of another type.
    Retype { key: usize, typ: u8 },
    Remove { key: usize },
    Float { key: usize, how: u8 },
    /// Key `key` of [`World::arch_keys`] added (or set) under this file's architecture, its
    /// integer value changed by `how`.
    Add { key: usize, how: u8, typ: u8 },
    /// Dim `dim` of tensor `tensor` set from its value by `how`.
    Dim { tensor: usize, dim: usize, how: u8 },
    /// Tensor `tensor` given type `typ`.
    TensorType { tensor: usize, typ: u8 },
}

impl Mutation {
    /// Record layout: op, then a u16 key or tensor index, then op-dependent bytes.
    fn decode(r: &[u8]) -> Mutation {
        let index = u16::from_le_bytes([r[1], r[2]]) as usize;
        let len = u32::from_le_bytes([r[4], r[5], r[6], r[7]]) as usize;
        match r[0] % 8 {
            0 => Mutation::Int { key: index, how: r[3], typ: r[4] },
            1 => Mutation::ArrayLen { key: index, len: len % 4096 },
            2 => Mutation::Retype { key: index, typ: r[3] },
            3 => Mutation::Remove { key: index },
            4 => Mutation::Float { key: index, how: r[3] },
            5 => Mutation::Dim { tensor: index, dim: r[3] as usize % 4, how: r[4] },
            6 => Mutation::TensorType { tensor: index, typ: r[3] },
            _ => Mutation::Add { key: index, how: r[3], typ: r[4] },
        }
    }
}

/// `v` changed by `how`: zeroed, off by one, scaled, or an extreme.
fn new_int(v: i128, how: u8) -> i128 {
    match how % 16 {
        0 => 0,
        1 => 1,
        2 => v.saturating_sub(1),
        3 => v.saturating_add(1),
        4 => v.saturating_mul(2),
        5 => v / 2,
        6 => v.saturating_mul(v),
        7 => 1 << 31,
        8 => 1 << 32,
        9 => 1 << 40,
        10 => 1 << 61,
        11 => u64::MAX as i128,
        12 => -1,
        13 => i64::MIN as i128,
        14 => 3,
        _ => v.saturating_mul(1000),
    }
}

/// `v` as an integer value of the type `typ` picks (wrapped into its range).
fn int_value(v: i128, typ: u8) -> Value {
    match typ % 8 {
        0 => Value::U8(v as u8),
        1 => Value::I8(v as i8),
        2 => Value::U16(v as u16),
        3 => Value::I16(v as i16),
        4 => Value::U32(v as u32),
        5 => Value::I32(v as i32),
        6 => Value::U64(v as u64),
        _ => Value::I64(v as i64),
    }
}

fn resize<T: Clone + Default>(v: &[T], len: usize) -> Vec<T> {
    let mut out: Vec<T> = v.iter().take(len).cloned().collect();
    let fill = v.last().cloned().unwrap_or_default();
    out.resize(len, fill);
    out
}

fn resize_array(a: &Array, len: usize) -> Option<Array> {
    Some(match a {
        Array::U8(v) => Array::U8(resize(v, len)),
        Array::I8(v) => Array::I8(resize(v, len)),
        Array::U16(v) => Array::U16(resize(v, len)),
        Array::I16(v) => Array::I16(resize(v, len)),
        Array::U32(v) => Array::U32(resize(v, len)),
        Array::I32(v) => Array::I32(resize(v, len)),
        Array::U64(v) => Array::U64(resize(v, len)),
        Array::I64(v) => Array::I64(resize(v, len)),
        Array::F32(v) => Array::F32(resize(v, len)),
        Array::F64(v) => Array::F64(resize(v, len)),
        Array::Bool(v) => Array::Bool(resize(v, len)),
        Array::String(v) => Array::String(resize(v, len)),
        Array::Array(_) => return None,
    })
}

fn retyped(typ: u8) -> Value {
    match typ % 6 {
        0 => Value::String("x".into()),
        1 => Value::F32(1.5),
        2 => Value::Bool(true),
        3 => Value::Array(Array::I32(vec![1, 2, 3])),
        4 => Value::Array(Array::String(vec!["a".into()])),
        _ => Value::I32(-7),
    }
}

fn new_float(how: u8) -> f32 {
    [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -1.0, 1e-30, 1e30][how as usize % 7]
}

/// A tensor as the writer takes it.
struct Tensor {
    name: String,
    dtype: DType,
    dims: Vec<u64>,
    data: Vec<u8>,
}

/// `data` cut or zero-padded to the size of `dims` of `dtype`; `None` past [`MAX_TENSOR_BYTES`] or
/// for a shape the writer refuses.
fn refit(dtype: DType, dims: &[u64], data: &[u8]) -> Option<Vec<u8>> {
    let mut w = GgufWriter::new();
    let elems = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d))?;
    let bytes = elems.checked_mul(dtype.type_size() as u64)? / dtype.block_size() as u64;
    if bytes > MAX_TENSOR_BYTES {
        return None;
    }
    let mut out = data.to_vec();
    out.resize(bytes as usize, 0);
    w.add_tensor("t", dtype, dims, out.clone()).ok()?;
    Some(out)
}

const TYPES: [DType; 5] = [DType::F32, DType::F16, DType::Q8_0, DType::Q4_0, DType::BF16];

/// The value of `base` changed by `how` (kept as it is for `how` 255 and for a non-integer).
fn changed(base: &Value, how: u8, typ: u8) -> Value {
    match base.as_int::<i128>() {
        Some(x) if how != 255 => int_value(new_int(x, how), typ),
        _ => base.clone(),
    }
}

fn apply(meta: &mut Vec<(String, Value)>, tensors: &mut [Tensor], m: Mutation) {
    let n_meta = meta.len().max(1);
    let n_tensors = tensors.len().max(1);
    match m {
        Mutation::Int { key, how, typ } => {
            if let Some((_, v)) = meta.get_mut(key % n_meta) {
                if v.as_int::<i128>().is_some() {
                    *v = changed(v, how, typ);
                } else if let Value::Array(a) = v {
                    if let Some(xs) = a.to_ints::<i64>() {
                        let xs = xs.iter().map(|&x| new_int(x.into(), how) as i64).collect();
                        *a = Array::I64(xs);
                    }
                }
            }
        }
        Mutation::ArrayLen { key, len } => {
            if let Some((_, Value::Array(a))) = meta.get_mut(key % n_meta) {
                if let Some(b) = resize_array(a, len) {
                    *a = b;
                }
            }
        }
        Mutation::Retype { key, typ } => {
            if let Some((_, v)) = meta.get_mut(key % n_meta) {
                *v = retyped(typ);
            }
        }
        Mutation::Remove { key } => {
            if key % n_meta < meta.len() {
                meta.remove(key % n_meta);
            }
        }
        Mutation::Float { key, how } => {
            if let Some((_, v)) = meta.get_mut(key % n_meta) {
                if matches!(v, Value::F32(_) | Value::F64(_)) {
                    *v = Value::F32(new_float(how));
                }
            }
        }
        Mutation::Add { key, how, typ } => {
            let keys = &world().arch_keys;
            let arch = meta
                .iter()
                .find(|(k, _)| k == "general.architecture")
                .and_then(|(_, v)| v.as_str().map(str::to_string));
            if let (Some(arch), Some((suffix, base))) = (arch, keys.get(key % keys.len().max(1))) {
                let name = format!("{arch}.{suffix}");
                let value = changed(base, how, typ);
                match meta.iter_mut().find(|(k, _)| *k == name) {
                    Some((_, v)) => *v = value,
                    None => meta.push((name, value)),
                }
            }
        }
        Mutation::Dim { tensor, dim, how } => {
            if let Some(t) = tensors.get_mut(tensor % n_tensors) {
                let mut dims = t.dims.clone();
                dims.resize(dims.len().max(dim + 1), 1);
                dims[dim] = new_int(dims[dim].into(), how).clamp(0, u32::MAX as i128) as u64;
                if let Some(data) = refit(t.dtype, &dims, &t.data) {
                    t.dims = dims;
                    t.data = data;
                }
            }
        }
        Mutation::TensorType { tensor, typ } => {
            if let Some(t) = tensors.get_mut(tensor % n_tensors) {
                let dtype = TYPES[typ as usize % TYPES.len()];
                if let Some(data) = refit(dtype, &t.dims, &t.data) {
                    t.dtype = dtype;
                    t.data = data;
                }
            }
        }
    }
}

/// The fixture `base` with the mutations of `records`, written and read back; `None` when the
/// writer or reader refuses it (the GGUF reader has its own target).
fn mutated(base: &GgufFile, records: &[u8]) -> Option<GgufFile> {
    let mut meta: Vec<(String, Value)> = base.metadata().to_vec();
    let mut tensors: Vec<Tensor> = base
        .tensors()
        .iter()
        .map(|t| Tensor {
            name: t.name.clone(),
            dtype: t.dtype,
            dims: t.dims().to_vec(),
            data: base.tensor_data(t).to_vec(),
        })
        .collect();
    for r in records.chunks_exact(12).take(16) {
        apply(&mut meta, &mut tensors, Mutation::decode(r));
    }
    if std::env::var_os("MODEL_LOAD_PRINT").is_some() {
        print_changes(base, &meta, &tensors);
    }
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.set(k, v);
    }
    for t in tensors {
        w.add_tensor(t.name, t.dtype, &t.dims, t.data).ok()?;
    }
    GgufFile::from_bytes(w.to_bytes().ok()?).ok()
}

/// Prints (with `MODEL_LOAD_PRINT` set, to reproduce a finding) how `meta` and `tensors` differ
/// from `base`.
fn print_changes(base: &GgufFile, meta: &[(String, Value)], tensors: &[Tensor]) {
    for (k, v) in meta {
        if base.get(k) != Some(v) {
            eprintln!("set {k} = {v:?}");
        }
    }
    for (k, _) in base.metadata() {
        if !meta.iter().any(|(m, _)| m == k) {
            eprintln!("removed {k}");
        }
    }
    for t in tensors {
        let old = base.tensor(&t.name).map(|i| (i.dtype, i.dims().to_vec()));
        if old != Some((t.dtype, t.dims.clone())) {
            eprintln!("tensor {}: {:?} -> {} {:?}", t.name, old, t.dtype, t.dims);
        }
    }
}

/// Tokenizes a short text, loads the model and runs one forward pass; errors are expected.
fn run(file: &GgufFile, placement: &Placement) {
    let tokens: Vec<u32> = match Tokenizer::from_gguf(file) {
        Ok(t) => t.encode("Hello world, 12", true, true),
        Err(_) => vec![1, 2, 3],
    };
    let Ok(model) = Model::from_gguf(file, placement) else {
        return;
    };
    let n_vocab = model.config.n_vocab as u32;
    let tokens: Vec<u32> = tokens.iter().take(8).map(|&t| t % n_vocab).collect();
    let opts = SessionOptions {
        n_ctx: 64,
        ..SessionOptions::default()
    };
    if let Ok(mut s) = Session::new(Arc::new(model), opts) {
        let _ = s.eval(&tokens, Outputs::All);
        let _ = s.eval(&tokens[..1.min(tokens.len())], Outputs::Last);
    }
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    if data.len() < 2 || w.fixtures.is_empty() {
        return;
    }
    let base = &w.fixtures[data[0] as usize % w.fixtures.len()];
    let Some(file) = mutated(base, &data[2..]) else {
        return;
    };
    let placement = if data[1] % 2 == 0 {
        Placement::Single(w.devices[0].clone())
    } else {
        match MetaDevice::new(w.devices.clone(), None) {
            Ok(m) => Placement::Tensor(m),
            Err(_) => return,
        }
    };
    run(&file, &placement);
});
