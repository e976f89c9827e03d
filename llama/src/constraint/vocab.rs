//! The tokenizer as llguidance sees it: the bytes of every token (control tokens as
//! `0xFF` + their text, llguidance's marker of special tokens), the end-of-sequence token, and
//! tokenization through our own [`Tokenizer`].

use std::sync::Arc;

use llguidance::toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::tokenizer::Tokenizer;

use super::ConstraintError;

/// Our tokenizer behind llguidance's [`TokenizerEnv`].
pub(super) struct ModelTokEnv {
    tokenizer: Arc<Tokenizer>,
    trie: TokTrie,
}

impl ModelTokEnv {
    /// The trie of `tokenizer`'s tokens; the end-of-sequence token is the end of turn when the
    /// model has one, else EOS, else the first end-of-generation token.
    pub(super) fn new(tokenizer: Arc<Tokenizer>) -> Result<ModelTokEnv, ConstraintError> {
        let eos = tokenizer
            .eot()
            .or(tokenizer.eos())
            .or_else(|| tokenizer.eog_tokens().iter().next().copied())
            .ok_or(ConstraintError::NoEndToken)?;
        let words: Vec<Vec<u8>> = (0..tokenizer.n_vocab() as u32)
            .map(|id| token_bytes(&tokenizer, id))
            .collect();
        let info = TokRxInfo::new(words.len() as u32, eos);
        let trie = TokTrie::from(&info, &words);
        Ok(ModelTokEnv { tokenizer, trie })
    }
}

/// The bytes llguidance matches token `id` against: control (and unknown) tokens are special,
/// `0xFF` then their text; other tokens are the bytes they decode to.
fn token_bytes(tokenizer: &Tokenizer, id: u32) -> Vec<u8> {
    let plain = tokenizer.token_to_piece(id);
    if !plain.is_empty() || !tokenizer.is_special(id) {
        return plain;
    }
    let text = tokenizer.token_to_piece_with(id, true);
    if text.is_empty() {
        return text;
    }
    let mut bytes = Vec::with_capacity(text.len() + 1);
    bytes.push(TokTrie::SPECIAL_TOKEN_MARKER);
    bytes.extend_from_slice(&text);
    bytes
}

impl TokenizerEnv for ModelTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Our tokenizer's ids for valid UTF-8 (special tokens not parsed), the trie's greedy
    /// tokenization for other bytes.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s) {
            Ok(text) => self.tokenizer.encode(text, false, false),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}
