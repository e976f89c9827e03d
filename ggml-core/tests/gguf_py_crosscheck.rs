//! Cross-check with the reference Python implementation (`pip install gguf numpy`): a file written by
//! [`GgufWriter`] is read by gguf-py's `GGUFReader`, which must see the same keys, value types and
//! values, and the same tensors (type, dims, data). The Python interpreter is named by
//! `GGML_TP_GGUF_PYTHON`; `cargo xtask ci` sets it to an environment that has gguf.

mod gguf_common;

use std::fmt::Write as _;
use std::process::Command;

use ggml_core::gguf::{Array, Value, ALIGNMENT_KEY};
use gguf_common::{all_values, sample_tensors, sample_writer};

/// Prints every field and tensor in a canonical text form: ints in decimal, floats and strings as
/// hex of their little-endian / UTF-8 bytes, bools as 0/1, nested arrays as their element count.
const SCRIPT: &str = r#"
import sys
from gguf import GGUFReader, GGUFValueType as T
r = GGUFReader(sys.argv[1])
FLOAT = (T.FLOAT32, T.FLOAT64)
def one(t, part):
    if t == T.STRING: return bytes(part).hex()
    if t in FLOAT: return part.tobytes().hex()
    if t == T.BOOL: return str(int(part[0]))
    return str(int(part[0]))
for name, f in r.fields.items():
    if name.startswith("GGUF."): continue
    t = f.types[0]
    if t == T.ARRAY:
        # parts: key length, key, value type, element type, count, elements...
        et = T(int(f.parts[3][0]))
        if et == T.ARRAY:
            print(f"kv {name} 9 9 nested")
            continue
        vals = [one(et, f.parts[i]) for i in f.data]
        print(f"kv {name} 9 {int(et)} " + ",".join(vals))
    else:
        print(f"kv {name} {int(t)} " + one(t, f.parts[f.data[0]]))
for t in r.tensors:
    dims = ",".join(str(int(d)) for d in t.shape)
    print(f"tensor {t.name} {int(t.tensor_type)} {dims} {t.data.tobytes().hex()}")
"#;

fn hex(b: &[u8]) -> String {
    b.iter().fold(String::new(), |mut s, x| {
        let _ = write!(s, "{x:02x}");
        s
    })
}

fn scalar(v: &Value) -> String {
    match v {
        Value::F32(x) => hex(&x.to_le_bytes()),
        Value::F64(x) => hex(&x.to_le_bytes()),
        Value::String(s) => hex(s.as_bytes()),
        Value::Bool(b) => u8::from(*b).to_string(),
        other => other
            .as_int::<i128>()
            .map(|i| i.to_string())
            .unwrap_or_default(),
    }
}

fn array(a: &Array) -> String {
    let items: Vec<String> = match a {
        Array::U8(v) => v.iter().map(|&x| scalar(&x.into())).collect(),
        Array::I8(v) => v.iter().map(|&x| scalar(&x.into())).collect(),
        Array::U16(v) => v.iter().map(|&x| scalar(&x.into())).collect(),
        Array::I16(v) => v.iter().map(|&x| scalar(&x.into())).collect(),
        Array::U32(v) => v.iter().map(|&x| scalar(&x.into())).collect(),
        Array::I32(v) => v.iter().map(|&x| scalar(&x.into())).collect(),
        Array::U64(v) => v.iter().map(|&x| scalar(&x.into())).collect(),
        Array::I64(v) => v.iter().map(|&x| scalar(&x.into())).collect(),
        Array::F32(v) => v.iter().map(|&x| scalar(&x.into())).collect(),
        Array::F64(v) => v.iter().map(|&x| scalar(&x.into())).collect(),
        Array::Bool(v) => v.iter().map(|&x| scalar(&x.into())).collect(),
        Array::String(v) => v.iter().map(|x| hex(x.as_bytes())).collect(),
        Array::Array(_) => return "nested".into(),
    };
    items.join(",")
}

#[test]
fn gguf_py_reads_our_files() {
    let Some(python) = std::env::var_os("GGML_TP_GGUF_PYTHON") else {
        println!("skipped: GGML_TP_GGUF_PYTHON is not set (cargo xtask ci sets it)");
        return;
    };
    let path = std::env::temp_dir().join(format!("ggml_tp_crosscheck_{}.gguf", std::process::id()));
    sample_writer(Some(64)).write_to_path(&path).unwrap();
    let out = Command::new(python)
        .arg("-c")
        .arg(SCRIPT)
        .arg(&path)
        .output()
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = String::from_utf8(out.stdout).unwrap();

    let mut values = vec![
        ("general.architecture".to_string(), Value::from("llama")),
        (ALIGNMENT_KEY.to_string(), Value::U32(64)),
    ];
    values.extend(all_values());
    let mut expected = String::new();
    for (k, v) in &values {
        let _ = match v {
            Value::Array(a) => {
                let et = a.element_type().id();
                writeln!(expected, "kv {k} 9 {et} {}", array(a))
            }
            _ => writeln!(expected, "kv {k} {} {}", v.value_type().id(), scalar(v)),
        };
    }
    for (name, dtype, dims, data) in sample_tensors() {
        let dims: Vec<String> = dims.iter().map(u64::to_string).collect();
        let _ = writeln!(
            expected,
            "tensor {name} {} {} {}",
            dtype.gguf_id(),
            dims.join(","),
            hex(&data)
        );
    }
    assert_eq!(got, expected);
}
