//! Fuzz target for the GGUF reader: parse arbitrary bytes; on success touch every metadata value and
//! every tensor's data slice, then check that writing the file back and re-reading it gives a file
//! that rewrites to the same bytes (the writer accepts everything the reader accepts).

#![no_main]

use std::hint::black_box;

use ggml_core::gguf::{Array, GgufFile, GgufWriter, Value};
use libfuzzer_sys::fuzz_target;

fn touch_array(a: &Array) -> usize {
    let n = a.len() + a.element_type().id() as usize;
    match a {
        Array::String(v) => n + v.iter().map(String::len).sum::<usize>(),
        Array::Array(v) => n + v.iter().map(touch_array).sum::<usize>(),
        _ => n + a.to_ints::<i64>().map_or(0, |v| v.len()) + a.to_f32s().map_or(0, |v| v.len()),
    }
}

fn touch(v: &Value) -> usize {
    let n = v.describe().len() + v.as_u64().unwrap_or(0) as usize % 7;
    match v {
        Value::Array(a) => n + touch_array(a),
        Value::String(s) => n + s.len(),
        _ => {
            n + usize::from(v.as_bool().unwrap_or(false))
                + v.as_f64().map_or(0, |f| f.is_nan() as usize)
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    let mut acc = 0usize;
    for (key, value) in file.metadata() {
        assert!(std::ptr::eq(file.get(key).expect("key indexed"), value));
        acc = acc.wrapping_add(touch(value));
        acc = acc.wrapping_add(file.get_str(key).map_or(0, str::len));
        acc = acc.wrapping_add(file.get_u32(key).unwrap_or(0) as usize);
        acc = acc.wrapping_add(file.get_str_array(key).map_or(0, <[String]>::len));
        acc = acc.wrapping_add(file.get_i32_array(key).map_or(0, |v| v.len()));
        acc = acc.wrapping_add(file.get_f32_array(key).map_or(0, |v| v.len()));
    }
    for t in file.tensors() {
        assert_eq!(file.tensor(&t.name), Some(t));
        let bytes = file.tensor_data(t);
        assert_eq!(bytes.len(), t.size_bytes);
        assert_eq!(t.offset % file.alignment(), 0);
        acc = acc.wrapping_add(bytes.iter().map(|&b| b as usize).sum::<usize>());
    }
    black_box(acc);

    let rewritten = GgufWriter::from_file(&file)
        .and_then(|w| w.to_bytes())
        .expect("a file the reader accepts can be written");
    let again = GgufFile::from_bytes(rewritten.clone()).expect("the writer's output parses");
    assert_eq!(again.metadata().len(), file.metadata().len());
    assert_eq!(again.tensors().len(), file.tensors().len());
    for (a, b) in again.tensors().iter().zip(file.tensors()) {
        assert_eq!(
            (&a.name, a.dtype, a.shape, a.n_dims),
            (&b.name, b.dtype, b.shape, b.n_dims)
        );
        assert_eq!(again.tensor_data(a), file.tensor_data(b));
    }
    let twice = GgufWriter::from_file(&again)
        .and_then(|w| w.to_bytes())
        .expect("rewrite of a rewritten file");
    assert_eq!(
        twice, rewritten,
        "writing is a fixed point after one round trip"
    );
});
