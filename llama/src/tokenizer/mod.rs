//! Tokenizers built from GGUF metadata, matching llama.cpp's `llama-vocab.cpp` token for token.
//!
//! * `tokenizer.ggml.model = llama`: SentencePiece-style BPE by token score with `<0xXX>` byte
//!   fallback; spaces become `▁` and a space is prefixed when `add_space_prefix` (see [`spm`]).
//! * `gpt2`: byte-level BPE by merge rank after the regex pre-tokenizer named by
//!   `tokenizer.ggml.pre` (see [`pretokenize`], [`bpe`]).
//! * `gemma4`: merge-rank BPE over raw UTF-8 with spaces as `▁`, split only at newline runs.
//!
//! Special tokens written in the text are split out first ([`special`]). [`Tokenizer::encode`]
//! returns token ids; [`Tokenizer::token_to_piece`] gives the bytes of one token (possibly a partial
//! UTF-8 sequence, for streaming) and [`Tokenizer::decode`] the text of a sequence.

mod bpe;
mod decode;
mod merge;
mod pretokenize;
mod special;
mod spm;
mod vocab;

use std::collections::{BTreeSet, HashMap};

use ggml_core::gguf::GgufFile;

pub use decode::StreamDecoder;
pub use pretokenize::PreTokenizer;
pub use vocab::{ModelKind, SpecialTokens};

use bpe::{BpeModel, Merges};
use pretokenize::Splitter;
use special::Fragment;
use vocab::{attr, Vocab};

/// Errors of building a tokenizer from GGUF metadata.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("unknown tokenizer model '{0}' (tokenizer.ggml.model)")]
    UnknownModel(String),
    #[error("unknown pre-tokenizer '{0}' (tokenizer.ggml.pre)")]
    UnknownPreTokenizer(String),
    #[error("missing or malformed GGUF key '{0}'")]
    MissingKey(&'static str),
    #[error("corrupt vocabulary: {0}")]
    Corrupt(String),
    #[error("bad pre-tokenizer regex {0}")]
    Regex(String),
}

/// A tokenizer: the vocabulary, its merges and its pre-tokenizer.
pub struct Tokenizer {
    vocab: Vocab,
    merges: Merges,
    splitter: Splitter,
    byte_to_unicode: [char; 256],
    unicode_to_byte: HashMap<char, u8>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.vocab.kind)
            .field("pre", &self.vocab.pre)
            .field("n_vocab", &self.vocab.n_tokens())
            .field("n_merges", &self.merges.len())
            .finish()
    }
}

impl Tokenizer {
    /// Builds the tokenizer described by the `tokenizer.ggml.*` metadata of `file`.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        let vocab = Vocab::from_gguf(file)?;
        let merges = match vocab.kind {
            ModelKind::Spm => Merges::new(&[]),
            ModelKind::Bpe => Merges::new(
                file.get_str_array("tokenizer.ggml.merges")
                    .map_err(|_| TokenizerError::MissingKey("tokenizer.ggml.merges"))?,
            ),
        };
        let splitter = Splitter::new(vocab.pre)?;
        let byte_to_unicode = bpe::byte_to_unicode_table();
        let unicode_to_byte = bpe::unicode_to_byte_map(&byte_to_unicode);
        Ok(Tokenizer {
            vocab,
            merges,
            splitter,
            byte_to_unicode,
            unicode_to_byte,
        })
    }

    /// Tokenizes `text`. With `add_special`, BOS/EOS are added where the model asks for them; with
    /// `parse_special`, control tokens written in the text (e.g. `<|im_start|>`) become their ids
    /// (user-defined tokens always do).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let v = &self.vocab;
        let fragments = special::partition(v, text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && v.add_bos {
            out.extend(v.special.bos);
        }
        match v.kind {
            ModelKind::Spm => {
                let mut prev_special = true;
                for fragment in fragments {
                    match fragment {
                        Fragment::Text(t) => {
                            let mut s = String::with_capacity(t.len() + 1);
                            if v.add_space_prefix && prev_special {
                                s.push(' ');
                            }
                            s.push_str(t);
                            spm::tokenize(v, &s.replace(' ', "\u{2581}"), &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            ModelKind::Bpe => {
                let model = BpeModel {
                    vocab: v,
                    merges: &self.merges,
                    byte_encode: v.pre.byte_encode(),
                    gemma4_newlines: v.pre == PreTokenizer::Gemma4,
                };
                let mut encoded = String::new();
                for fragment in fragments {
                    match fragment {
                        Fragment::Text(t) => {
                            let escaped;
                            let t = if v.escape_whitespaces {
                                escaped = t.replace(' ', "\u{2581}");
                                escaped.as_str()
                            } else {
                                t
                            };
                            for word in self.splitter.split(t) {
                                if model.byte_encode {
                                    encoded.clear();
                                    encoded.extend(
                                        word.bytes().map(|b| self.byte_to_unicode[b as usize]),
                                    );
                                    model.tokenize_word(&encoded, &mut out);
                                } else {
                                    model.tokenize_word(word, &mut out);
                                }
                            }
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && v.add_eos {
            out.extend(v.special.eos);
        }
        out
    }

    /// The number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.vocab.n_tokens()
    }

    /// The tokenization algorithm.
    pub fn model_kind(&self) -> ModelKind {
        self.vocab.kind
    }

    /// The pre-tokenizer (`PreTokenizer::Unsplit` for SentencePiece vocabularies).
    pub fn pre_tokenizer(&self) -> PreTokenizer {
        self.vocab.pre
    }

    /// All special token ids (BOS, EOS, EOT, FIM, ...).
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.vocab.special
    }

    /// The beginning-of-sequence token.
    pub fn bos(&self) -> Option<u32> {
        self.vocab.special.bos
    }

    /// The end-of-sequence token.
    pub fn eos(&self) -> Option<u32> {
        self.vocab.special.eos
    }

    /// The end-of-turn token (`<|eot_id|>`, `<|im_end|>`, `<end_of_turn>`, ...), if any.
    pub fn eot(&self) -> Option<u32> {
        self.vocab.special.eot
    }

    /// The tokens that end generation: EOS, EOT, EOM and the tokens llama.cpp recognises by text.
    pub fn eog_tokens(&self) -> &BTreeSet<u32> {
        &self.vocab.eog
    }

    /// Whether `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.contains(&id)
    }

    /// Whether encoding with `add_special` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.vocab.add_bos && self.vocab.special.bos.is_some()
    }

    /// Whether encoding with `add_special` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.vocab.add_eos && self.vocab.special.eos.is_some()
    }

    /// Whether [`Tokenizer::decode`] removes spaces before punctuation and contractions (llama.cpp's
    /// `clean_spaces`), so that it does not always give back the encoded text.
    pub fn cleans_spaces(&self) -> bool {
        self.vocab.clean_spaces
    }

    /// Whether `id` is a control token (rendered as nothing unless asked for).
    pub fn is_control(&self, id: u32) -> bool {
        self.vocab.attr(id) & attr::CONTROL != 0
    }

    /// Whether `id` is a special token: control, user-defined or unknown (the tokens that are
    /// matched in the text before tokenization).
    pub fn is_special(&self, id: u32) -> bool {
        self.vocab.attr(id) & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
    }

    /// The vocabulary text of token `id` as stored in the GGUF (e.g. `Ġthe`, `▁the`, `<0x0A>`).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of the token whose vocabulary text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.text_to_token(text)
    }
}

#[cfg(test)]
mod tests;
