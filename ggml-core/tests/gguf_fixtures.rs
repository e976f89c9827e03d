//! Reads every `.gguf` under the shared fixtures (`tokenizer/` vocab files and `arch/` tiny models):
//! the architecture key is present, tensor data lies inside the file, and the writer reproduces a file
//! that reads back the same. Skipped when the fixtures folder is absent.

use std::path::PathBuf;
use std::time::Instant;

use ggml_core::gguf::{GgufFile, GgufWriter};

fn fixtures_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("GGML_TP_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures"));
    dir.is_dir().then_some(dir)
}

fn gguf_files(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    files.sort();
    files
}

#[test]
fn fixtures_are_read() {
    let Some(root) = fixtures_dir() else {
        println!("skipped: fixtures not found");
        return;
    };
    let mut n_files = 0;
    for sub in ["tokenizer", "arch"] {
        for path in gguf_files(&root.join(sub)) {
            let t = Instant::now();
            let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let elapsed = t.elapsed();
            let arch = file.get_str("general.architecture").unwrap();
            assert!(!arch.is_empty(), "{}", path.display());
            let len = file.as_bytes().len();
            for t in file.tensors() {
                let start = file.data_offset() + t.offset as usize;
                assert!(start + t.size_bytes <= len, "{} {}", path.display(), t.name);
                assert_eq!(file.tensor_data(t).len(), t.size_bytes);
                assert_eq!(t.offset % file.alignment(), 0);
            }
            if sub == "arch" {
                assert!(!file.tensors().is_empty(), "{}", path.display());
            }
            if let Ok(tokens) = file.get_str_array("tokenizer.ggml.tokens") {
                assert!(!tokens.is_empty());
            }
            // Rewriting gives the same metadata and tensors.
            let again =
                GgufFile::from_bytes(GgufWriter::from_file(&file).unwrap().to_bytes().unwrap())
                    .unwrap();
            assert_eq!(again.metadata().len(), file.metadata().len());
            for ((k1, v1), (k2, v2)) in again.metadata().iter().zip(file.metadata()) {
                assert_eq!(k1, k2);
                // Compare via Debug so that NaN floats compare equal to themselves.
                assert_eq!(format!("{v1:?}"), format!("{v2:?}"), "{k1}");
            }
            for (a, b) in again.tensors().iter().zip(file.tensors()) {
                assert_eq!((&a.name, a.dtype, a.shape), (&b.name, b.dtype, b.shape));
                assert_eq!(again.tensor_data(a), file.tensor_data(b));
            }
            println!(
                "{}: v{} arch {arch}, {} keys, {} tensors, parsed in {elapsed:?}",
                path.display(),
                file.version(),
                file.metadata().len(),
                file.tensors().len()
            );
            n_files += 1;
        }
    }
    assert!(n_files > 0, "no .gguf files under {}", root.display());
}
