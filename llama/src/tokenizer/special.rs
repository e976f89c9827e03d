//! Splitting the input at special tokens written in the text (llama.cpp's
//! `tokenizer_st_partition`).
//!
//! Special tokens are searched for longest first; every occurrence of one splits the remaining
//! text fragments around it. User-defined tokens are always matched; control and unknown tokens only
//! when `parse_special` is set. Tokens with the `lstrip`/`rstrip` attribute eat the ASCII whitespace
//! before/after them.

use super::vocab::{attr, Vocab};

/// A piece of the input: text still to tokenize, or a token already recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

/// C's `isspace` on a character.
fn is_c_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r')
}

/// Splits `text` into fragments at the special tokens it contains.
pub(crate) fn partition<'t>(
    vocab: &Vocab,
    text: &'t str,
    parse_special: bool,
) -> Vec<Fragment<'t>> {
    if text.is_empty() {
        return Vec::new();
    }
    let mut fragments = vec![Fragment::Text(text)];
    for &id in &vocab.special_cache {
        let a = vocab.attr(id);
        if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
            continue;
        }
        let tok = vocab.tokens[id as usize].as_str();
        let present = fragments
            .iter()
            .any(|f| matches!(f, Fragment::Text(t) if t.contains(tok)));
        if !present {
            continue;
        }
        let mut next = Vec::with_capacity(fragments.len() + 2);
        for fragment in fragments {
            let Fragment::Text(mut rest) = fragment else {
                next.push(fragment);
                continue;
            };
            while let Some(pos) = rest.find(tok) {
                let mut left = &rest[..pos];
                if a & attr::LSTRIP != 0 {
                    left = left.trim_end_matches(is_c_space);
                }
                if !left.is_empty() {
                    next.push(Fragment::Text(left));
                }
                next.push(Fragment::Token(id));
                rest = &rest[pos + tok.len()..];
                if a & attr::RSTRIP != 0 {
                    rest = rest.trim_start_matches(is_c_space);
                }
            }
            if !rest.is_empty() {
                next.push(Fragment::Text(rest));
            }
        }
        fragments = next;
    }
    fragments
}
