//! SentencePiece-style BPE (llama.cpp's `llm_tokenizer_spm_session`).
//!
//! The text (spaces already escaped to `▁`) is cut into UTF-8 characters; then, repeatedly, the
//! adjacent pair whose concatenation is the vocabulary token with the highest score (leftmost on
//! ties) is merged. Every merged symbol is a token by construction; a single character that is not
//! a token is emitted as its `<0xXX>` byte tokens (or the token of the raw byte, or `<unk>`).

use std::cmp::Ordering;

use super::merge::Symbols;
use super::vocab::Vocab;

/// A token score, totally ordered.
#[derive(PartialEq)]
struct Score(f32);

impl Eq for Score {}

impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Score {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Tokenizes `text` (whitespace already escaped) with the SentencePiece merge rule.
pub(crate) fn tokenize(vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
    let mut symbols = Symbols::chars(text);
    symbols.merge(|_, _, joined| {
        let id = vocab.text_to_token(joined)?;
        Some(Score(vocab.scores[id as usize]))
    });
    for piece in symbols.pieces() {
        match vocab.text_to_token(piece) {
            Some(id) => out.push(id),
            None => {
                for &b in piece.as_bytes() {
                    out.extend(byte_to_token(vocab, b));
                }
            }
        }
    }
}

/// The token of one byte: `<0xXX>`, else the one-byte text, else `<unk>`.
fn byte_to_token(vocab: &Vocab, b: u8) -> Option<u32> {
    vocab
        .byte_token_hex(b)
        .or_else(|| {
            std::str::from_utf8(&[b])
                .ok()
                .and_then(|s| vocab.text_to_token(s))
        })
        .or(vocab.special.unk)
}
