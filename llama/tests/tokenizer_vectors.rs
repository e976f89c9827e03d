//! llama.cpp's tokenizer test vectors: every `.gguf` in the fixtures' `tokenizer/` folder with its
//! `.inp` strings and `.out` ids (encoded with `add_special = false`, `parse_special = false`).
//!
//! The fixtures are found through `GGML_TP_FIXTURES`, else `<CARGO_MANIFEST_DIR>/../../shared/fixtures`;
//! without them the tests print `skipped: fixtures not found` and pass.

use std::path::PathBuf;
use std::time::Instant;

use ggml_core::gguf::GgufFile;
use llama::tokenizer::Tokenizer;

fn fixtures() -> Option<PathBuf> {
    let dir = match std::env::var_os("GGML_TP_FIXTURES") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures"),
    };
    let dir = dir.join("tokenizer");
    dir.is_dir().then_some(dir)
}

/// Splits an `.inp` file the way llama.cpp's test does.
fn parse_inputs(text: &str) -> Vec<String> {
    const SEP: &str = "\n__ggml_vocab_test__\n";
    let mut parts: Vec<String> = text.split(SEP).map(str::to_string).collect();
    if text.ends_with(SEP) {
        parts.pop();
    }
    parts
}

fn parse_outputs(text: &str) -> Vec<Vec<u32>> {
    text.lines()
        .map(|l| {
            l.split_whitespace()
                .map(|n| n.parse().expect("bad id in .out"))
                .collect()
        })
        .collect()
}

fn vocab_files(dir: &PathBuf) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    files.sort();
    files
}

/// Whether `decode(encode(s)) == s` is expected, as in llama.cpp: always, except where the vocabulary
/// cleans spaces on decode (" ?" becomes "?", " 's" becomes "'s", ...) and `s` has such a pattern.
fn roundtrip_expected(tok: &Tokenizer, s: &str) -> bool {
    !tok.cleans_spaces() || ![" ?", " !", " .", " ,", " '"].iter().any(|p| s.contains(p))
}

#[test]
fn tokenizer_vectors() {
    let Some(dir) = fixtures() else {
        println!("skipped: fixtures not found");
        return;
    };
    let mut failures = Vec::new();
    for path in vocab_files(&dir) {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let t0 = Instant::now();
        let file = GgufFile::open(&path).unwrap();
        let tok = Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{name}: {e}"));
        let load = t0.elapsed();
        let inp = std::fs::read_to_string(format!("{}.inp", path.display())).unwrap();
        let out = std::fs::read_to_string(format!("{}.out", path.display())).unwrap();
        let inputs = parse_inputs(&inp);
        let expected = parse_outputs(&out);
        assert_eq!(
            inputs.len(),
            expected.len(),
            "{name}: .inp/.out counts differ"
        );

        let t1 = Instant::now();
        let mut ok = 0;
        let mut roundtrip_fail = 0;
        for (s, want) in inputs.iter().zip(&expected) {
            let got = tok.encode(s, false, false);
            if &got == want {
                ok += 1;
            } else {
                failures.push(format!("{name}: {s:?}\n   want {want:?}\n   got  {got:?}"));
            }
            if roundtrip_expected(&tok, s) && tok.decode(&got) != *s {
                roundtrip_fail += 1;
                failures.push(format!(
                    "{name}: round trip of {s:?} gave {:?}",
                    tok.decode(&got)
                ));
            }
        }
        println!(
            "{name}: {ok}/{} strings match (load {:.0} ms, encode {:.2} ms), {roundtrip_fail} round-trip failures",
            inputs.len(),
            load.as_secs_f64() * 1e3,
            t1.elapsed().as_secs_f64() * 1e3
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn tokenizer_long_text_is_fast() {
    let Some(dir) = fixtures() else {
        println!("skipped: fixtures not found");
        return;
    };
    for stem in [
        "ggml-vocab-llama-spm",
        "ggml-vocab-qwen2",
        "ggml-vocab-gemma-4",
    ] {
        let path = dir.join(format!("{stem}.gguf"));
        let file = GgufFile::open(&path).unwrap();
        let tok = Tokenizer::from_gguf(&file).unwrap();
        let inp = std::fs::read_to_string(format!("{}.inp", path.display())).unwrap();
        let text = inp.repeat(2); // ~4 KB of mixed scripts
        let t = Instant::now();
        let ids = tok.encode(&text, true, true);
        let ms = t.elapsed().as_secs_f64() * 1e3;
        println!(
            "{stem}: {} bytes -> {} tokens in {ms:.2} ms",
            text.len(),
            ids.len()
        );
        assert!(!ids.is_empty());
        assert!(ms < 500.0, "{stem}: encoding took {ms} ms");
    }
}

/// Random strings over a palette of scripts, spaces, digits and punctuation: encoding never
/// panics, and decoding gives the text back wherever llama.cpp's would.
#[test]
fn tokenizer_random_roundtrip() {
    use rand::{Rng, SeedableRng};
    let Some(dir) = fixtures() else {
        println!("skipped: fixtures not found");
        return;
    };
    let palette: Vec<char> = "aZ09 \t\n\r  .,!?'\"-_/\\()[]{}<>|#$%^&*=+~`éüßñçøÅЖжλΩ中文日本語한국어ก\u{17d2}\u{301}\u{200d}🦙😁🚀\u{a0}\u{3000}\u{85}\u{feff}"
        .chars()
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for path in vocab_files(&dir) {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let file = GgufFile::open(&path).unwrap();
        let tok = Tokenizer::from_gguf(&file).unwrap();
        let mut fails = 0;
        for _ in 0..200 {
            let len = rng.gen_range(0..40);
            let s: String = (0..len)
                .map(|_| palette[rng.gen_range(0..palette.len())])
                .collect();
            let ids = tok.encode(&s, true, true);
            assert!(ids.iter().all(|&id| (id as usize) < tok.n_vocab()));
            let plain = tok.encode(&s, false, false);
            if roundtrip_expected(&tok, &s) && tok.decode(&plain) != s {
                fails += 1;
                if fails < 4 {
                    println!("{name}: {s:?} -> {:?}", tok.decode(&plain));
                }
            }
        }
        println!("{name}: {fails}/200 random round-trip failures");
        assert_eq!(fails, 0, "{name}");
    }
}

/// The tiny models of `arch/` carry cut-down real vocabularies; they must all load and encode.
#[test]
fn tokenizer_loads_arch_models() {
    let Some(dir) = fixtures() else {
        println!("skipped: fixtures not found");
        return;
    };
    let dir = dir.parent().unwrap().join("arch");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        println!("skipped: arch fixtures not found");
        return;
    };
    let mut paths: Vec<PathBuf> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    paths.sort();
    for path in paths {
        let file = GgufFile::open(&path).unwrap();
        let tok = Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let ids = tok.encode("Hello world, 123 <|im_start|>", true, true);
        println!(
            "{}: {:?} n_vocab {} -> {} ids, eog {:?}",
            path.file_name().unwrap().to_string_lossy(),
            tok.pre_tokenizer(),
            tok.n_vocab(),
            ids.len(),
            tok.eog_tokens()
        );
        assert!(ids.iter().all(|&id| (id as usize) < tok.n_vocab()));
    }
}
