//! Unit tests on small synthetic vocabularies: special-token parsing, BOS/EOS, byte fallback,
//! decoding and the errors of bad metadata.

use ggml_core::gguf::{GgufFile, GgufWriter, Value};

use super::{Tokenizer, TokenizerError};

fn build(meta: Vec<(&str, Value)>) -> GgufFile {
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.set(k, v);
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

/// A tiny byte-level BPE vocabulary: the 256 byte characters, a few merges and chat tokens.
fn bpe_file(extra: Vec<(&str, Value)>) -> GgufFile {
    let table = super::bpe::byte_to_unicode_table();
    let mut tokens: Vec<String> = table.iter().map(|c| c.to_string()).collect();
    let mut types = vec![1i32; 256];
    for t in [
        "he", "ll", "llo", "hello", "Ġw", "or", "Ġwor", "ld", "Ġworld",
    ] {
        tokens.push(t.to_string());
        types.push(1);
    }
    for t in ["<|im_start|>", "<|im_end|>", "<|endoftext|>"] {
        tokens.push(t.to_string());
        types.push(3);
    }
    tokens.push("<tool>".to_string());
    types.push(4);
    let merges = vec![
        "h e", "l l", "ll o", "he llo", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld",
    ];
    let mut meta = vec![
        ("tokenizer.ggml.model", Value::from("gpt2")),
        ("tokenizer.ggml.pre", Value::from("qwen2")),
        (
            "tokenizer.ggml.tokens",
            Value::from(tokens.iter().map(String::as_str).collect::<Vec<_>>()),
        ),
        ("tokenizer.ggml.token_type", Value::from(types)),
        ("tokenizer.ggml.merges", Value::from(merges)),
        ("tokenizer.ggml.eos_token_id", Value::U32(267)),
        ("tokenizer.ggml.bos_token_id", Value::U32(267)),
    ];
    meta.extend(extra);
    build(meta)
}

#[test]
fn bpe_merges_and_special_parsing() {
    let tok = Tokenizer::from_gguf(&bpe_file(vec![])).unwrap();
    let hello = tok.token_id("hello").unwrap();
    let world = tok.token_id("Ġworld").unwrap();
    let im_start = tok.token_id("<|im_start|>").unwrap();
    let im_end = tok.token_id("<|im_end|>").unwrap();
    assert_eq!(tok.encode("hello world", false, false), vec![hello, world]);

    // parse_special: control tokens in the text become their ids.
    let ids = tok.encode("<|im_start|>hello world<|im_end|>", false, true);
    assert_eq!(ids, vec![im_start, hello, world, im_end]);
    // Without it they are plain text.
    let plain = tok.encode("<|im_start|>hello", false, false);
    assert!(!plain.contains(&im_start));
    assert_eq!(tok.decode(&plain), "<|im_start|>hello");
    // User-defined tokens are always matched.
    let tool = tok.token_id("<tool>").unwrap();
    assert_eq!(tok.encode("<tool>hello", false, false), vec![tool, hello]);

    // End of generation: eos, "<|im_end|>", "<|endoftext|>".
    assert!(tok.is_eog(im_end));
    assert!(tok.is_eog(tok.eos().unwrap()));
    assert_eq!(tok.eot(), Some(im_end));
    assert!(tok.is_special(im_start) && !tok.is_special(hello));
    // Control tokens render as nothing unless asked for.
    assert!(tok.token_to_piece(im_end).is_empty());
    assert_eq!(tok.token_to_piece_with(im_end, true), b"<|im_end|>");
    assert_eq!(tok.decode(&[hello, world]), "hello world");
    // qwen2 adds no BOS.
    assert!(!tok.add_bos());
    assert_eq!(tok.encode("hello", true, false), vec![hello]);
}

#[test]
fn bpe_add_bos_from_metadata() {
    let file = bpe_file(vec![("tokenizer.ggml.add_bos_token", Value::Bool(true))]);
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let hello = tok.token_id("hello").unwrap();
    assert!(tok.add_bos());
    assert_eq!(tok.encode("hello", true, false), vec![267, hello]);
    assert_eq!(tok.encode("", true, false), vec![267]);
    assert!(tok.encode("", false, false).is_empty());
}

#[test]
fn unknown_model_and_pre_are_errors() {
    let err = Tokenizer::from_gguf(&bpe_file(vec![(
        "tokenizer.ggml.model",
        Value::from("wordpiece-x"),
    )]));
    // The later key wins in the writer; make sure the error names the model.
    match err {
        Err(TokenizerError::UnknownModel(m)) => assert_eq!(m, "wordpiece-x"),
        other => panic!("expected UnknownModel, got {other:?}"),
    }
    let err = Tokenizer::from_gguf(&bpe_file(vec![(
        "tokenizer.ggml.pre",
        Value::from("no-such-pre"),
    )]))
    .unwrap_err();
    assert!(err.to_string().contains("no-such-pre"), "{err}");
}

#[test]
fn corrupt_vocabularies_are_errors() {
    // No tokens.
    let f = build(vec![("tokenizer.ggml.model", Value::from("gpt2"))]);
    assert!(Tokenizer::from_gguf(&f).is_err());
    // No merges for a BPE model.
    let f = build(vec![
        ("tokenizer.ggml.model", Value::from("gpt2")),
        ("tokenizer.ggml.pre", Value::from("gpt-2")),
        ("tokenizer.ggml.tokens", Value::from(vec!["a", "b"])),
    ]);
    assert!(matches!(
        Tokenizer::from_gguf(&f),
        Err(TokenizerError::MissingKey("tokenizer.ggml.merges"))
    ));
    // Too few scores, tokens of the wrong type, no model key.
    let f = build(vec![
        ("tokenizer.ggml.model", Value::from("llama")),
        ("tokenizer.ggml.tokens", Value::from(vec!["a", "b"])),
        ("tokenizer.ggml.scores", Value::from(vec![0.0f32])),
    ]);
    assert!(Tokenizer::from_gguf(&f).is_err());
    let f = build(vec![
        ("tokenizer.ggml.model", Value::from("llama")),
        ("tokenizer.ggml.tokens", Value::from(vec![1u32, 2])),
    ]);
    assert!(Tokenizer::from_gguf(&f).is_err());
    let f = build(vec![("tokenizer.ggml.tokens", Value::from(vec!["a"]))]);
    assert!(matches!(
        Tokenizer::from_gguf(&f),
        Err(TokenizerError::MissingKey("tokenizer.ggml.model"))
    ));
}

#[test]
fn corrupt_but_loadable_vocab_does_not_panic() {
    // Special ids out of range, empty tokens, odd merges, a byte token with a bad name.
    let f = build(vec![
        ("tokenizer.ggml.model", Value::from("gpt2")),
        ("tokenizer.ggml.pre", Value::from("gpt-2")),
        (
            "tokenizer.ggml.tokens",
            Value::from(vec!["", "a", "<0xZZ>", "ab"]),
        ),
        (
            "tokenizer.ggml.token_type",
            Value::from(vec![1i32, 1, 6, 99]),
        ),
        (
            "tokenizer.ggml.merges",
            Value::from(vec!["a b", "nospace", " ", "é x"]),
        ),
        ("tokenizer.ggml.bos_token_id", Value::U32(1000)),
        ("tokenizer.ggml.eos_token_id", Value::I32(-1)),
    ]);
    let tok = Tokenizer::from_gguf(&f).unwrap();
    assert_eq!(tok.bos(), None);
    assert_eq!(tok.eos(), None);
    assert_eq!(tok.encode("ab a zz é\n", true, true), vec![3, 1]);
    for id in 0..10 {
        let _ = tok.token_to_piece_with(id, true);
    }
    let _ = tok.decode(&[0, 1, 2, 3, 4, u32::MAX]);
}

/// A tiny SentencePiece vocabulary with byte fallback.
fn spm_file(extra: Vec<(&str, Value)>) -> GgufFile {
    let mut tokens = vec!["<unk>".to_string(), "<s>".to_string(), "</s>".to_string()];
    let mut types = vec![2i32, 3, 3];
    let mut scores = vec![0.0f32; 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for (t, s) in [
        ("▁", -1.0f32),
        ("h", -2.0),
        ("i", -2.0),
        ("hi", -1.5),
        ("▁hi", -0.5),
    ] {
        tokens.push(t.to_string());
        types.push(1);
        scores.push(s);
    }
    let mut meta = vec![
        ("tokenizer.ggml.model", Value::from("llama")),
        ("tokenizer.ggml.pre", Value::from("default")),
        (
            "tokenizer.ggml.tokens",
            Value::from(tokens.iter().map(String::as_str).collect::<Vec<_>>()),
        ),
        ("tokenizer.ggml.token_type", Value::from(types)),
        ("tokenizer.ggml.scores", Value::from(scores)),
    ];
    meta.extend(extra);
    build(meta)
}

#[test]
fn spm_space_prefix_byte_fallback_and_bos() {
    let tok = Tokenizer::from_gguf(&spm_file(vec![])).unwrap();
    let hi = tok.token_id("▁hi").unwrap();
    assert_eq!(tok.encode("hi", false, false), vec![hi]);
    assert_eq!(tok.encode("hi", true, false), vec![1, hi]);
    // "é" has no token: its two UTF-8 bytes.
    let ids = tok.encode("hié", false, false);
    assert_eq!(ids, vec![hi, 3 + 0xC3, 3 + 0xA9]);
    assert_eq!(tok.decode(&ids), "hié");
    // Partial UTF-8 pieces for streaming.
    assert_eq!(tok.token_to_piece(3 + 0xC3), vec![0xC3]);
    let mut stream = super::StreamDecoder::new();
    assert_eq!(stream.push(&tok, 3 + 0xC3), "");
    assert_eq!(stream.push(&tok, 3 + 0xA9), "é");
    assert_eq!(stream.push(&tok, 3 + 0xFF), "\u{FFFD}");
    assert_eq!(stream.push(&tok, 3 + 0xE2), "");
    assert_eq!(stream.finish(), "\u{FFFD}");
    // Decoding as llama.cpp: the prefixed space goes unless a leading BOS was removed.
    assert_eq!(tok.detokenize(&[1, hi], true, false), b" hi");
    assert_eq!(tok.decode(&[hi]), "hi");
    assert_eq!(tok.detokenize(&[1, hi], false, true), b"<s> hi");
    assert_eq!(tok.decode(&[1, hi]), " hi");
    // Special tokens with parse_special, and the space prefix after them.
    assert_eq!(tok.encode("<s>hi", false, true), vec![1, hi]);
    assert_eq!(tok.eos(), Some(2));
    assert!(tok.is_eog(2));
    assert_eq!(tok.n_vocab(), 3 + 256 + 5);
}

#[test]
fn spm_without_space_prefix() {
    let file = spm_file(vec![(
        "tokenizer.ggml.add_space_prefix",
        Value::Bool(false),
    )]);
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let hi = tok.token_id("hi").unwrap();
    assert_eq!(tok.encode("hi", false, false), vec![hi]);
    assert_eq!(tok.decode(&[hi]), "hi");
}
