//! Errors of loading and running: unknown architecture, missing or misshapen metadata and tensors,
//! impossible placements, bad batches and cache types, on a tiny generated Llama file.

use super::{Model, ModelError, Placement};
use crate::runtime::{Outputs, Session, SessionOptions};
use backend_cpu::device::cpu_devices;
use ggml_core::backend::Device;
use ggml_core::gguf::{GgufFile, GgufWriter};
use ggml_core::DType;
use std::sync::Arc;

const D: u64 = 32;
const FF: u64 = 32;
const VOCAB: u64 = 8;

/// A one-layer Llama file (2 query heads, 1 KV head of 16); `skip` leaves a tensor out, `arch` and
/// `drop_key` alter the metadata, `bad_q` gives `attn_q` a wrong shape.
fn tiny(arch: &str, skip: Option<&str>, drop_key: Option<&str>, bad_q: bool) -> GgufFile {
    let mut w = GgufWriter::new();
    w.set("general.architecture", arch);
    let keys: [(&str, u32); 5] = [
        ("embedding_length", D as u32),
        ("block_count", 1),
        ("attention.head_count", 2),
        ("attention.head_count_kv", 1),
        ("feed_forward_length", FF as u32),
    ];
    for (k, v) in keys {
        if drop_key != Some(k) {
            w.set(format!("{arch}.{k}"), v);
        }
    }
    w.set(format!("{arch}.attention.layer_norm_rms_epsilon"), 1e-5f32);
    let q_rows = if bad_q { D + 1 } else { D };
    let tensors: Vec<(&str, Vec<u64>)> = vec![
        ("token_embd.weight", vec![D, VOCAB]),
        ("output_norm.weight", vec![D]),
        ("blk.0.attn_norm.weight", vec![D]),
        ("blk.0.attn_q.weight", vec![D, q_rows]),
        ("blk.0.attn_k.weight", vec![D, 16]),
        ("blk.0.attn_v.weight", vec![D, 16]),
        ("blk.0.attn_output.weight", vec![D, D]),
        ("blk.0.ffn_norm.weight", vec![D]),
        ("blk.0.ffn_gate.weight", vec![D, FF]),
        ("blk.0.ffn_up.weight", vec![D, FF]),
        ("blk.0.ffn_down.weight", vec![FF, D]),
    ];
    for (name, dims) in tensors {
        if skip == Some(name) {
            continue;
        }
        let n: u64 = dims.iter().product();
        let vals: Vec<f32> = (0..n)
            .map(|i| ((i * 7919 % 101) as f32 - 50.0) / 200.0)
            .collect();
        w.add_tensor(
            name,
            DType::F32,
            &dims,
            bytemuck::cast_slice(&vals).to_vec(),
        )
        .unwrap();
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

fn cpu() -> Placement {
    Placement::Single(cpu_devices(1, 1).unwrap().remove(0))
}

#[test]
fn bad_files_give_clear_errors() {
    let load = |f: GgufFile| Model::from_gguf(&f, &cpu()).err().map(|e| e.to_string());
    assert!(matches!(
        Model::from_gguf(&tiny("mamba9", None, None, false), &cpu()),
        Err(ModelError::UnknownArch(a)) if a == "mamba9"
    ));
    let e = load(tiny("llama", None, Some("block_count"), false)).unwrap();
    assert!(e.contains("llama.block_count"), "{e}");
    let e = load(tiny("llama", Some("blk.0.ffn_up.weight"), None, false)).unwrap();
    assert!(
        e.contains("blk.0.ffn_up.weight") && e.contains("missing"),
        "{e}"
    );
    let e = load(tiny("llama", None, None, true)).unwrap();
    assert!(
        e.contains("blk.0.attn_q.weight") && e.contains("shape"),
        "{e}"
    );
}

#[test]
fn bad_placements_and_batches_are_refused() {
    let f = tiny("llama", None, None, false);
    let devices: Vec<Arc<dyn Device>> = cpu_devices(2, 2)
        .unwrap()
        .into_iter()
        .map(|d| d as Arc<dyn Device>)
        .collect();
    let bad = Placement::Layers {
        devices,
        ratios: vec![1.0],
    };
    assert!(matches!(
        Model::from_gguf(&f, &bad),
        Err(ModelError::Placement(_))
    ));
    let model = Arc::new(Model::from_gguf(&f, &cpu()).unwrap());
    let q8 = SessionOptions {
        n_ctx: 8,
        kv_type: DType::Q8_0,
    };
    assert!(matches!(
        Session::new(model.clone(), q8),
        Err(ModelError::Unsupported(_))
    ));
    let opts = SessionOptions {
        n_ctx: 4,
        kv_type: DType::F16,
    };
    let mut s = Session::new(model, opts).unwrap();
    assert!(matches!(
        s.eval(&[], Outputs::All),
        Err(ModelError::Input(_))
    ));
    assert!(matches!(
        s.eval(&[8], Outputs::All),
        Err(ModelError::Input(_))
    ));
    let l = s.eval(&[1, 2, 3], Outputs::All).unwrap();
    assert_eq!((l.positions.clone(), l.data.len()), (vec![0, 1, 2], 24));
    assert!(l.data.iter().all(|v| v.is_finite()));
    assert!(matches!(
        s.eval(&[1, 2], Outputs::Last),
        Err(ModelError::Input(_))
    ));
    s.truncate(2).unwrap();
    let again = s.eval(&[3], Outputs::Last).unwrap();
    assert_eq!(again.positions, vec![2]);
    for (a, b) in again.last().iter().zip(l.row(2)) {
        assert!((a - b).abs() < 1e-4, "{a} vs {b}");
    }
}
