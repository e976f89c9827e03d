//! Merge-rank BPE (llama.cpp's `llm_tokenizer_bpe_session`).
//!
//! Each pre-tokenized word is cut into UTF-8 characters (for byte-level vocabularies the word has
//! first been mapped byte by byte to GPT-2's printable characters), then the adjacent pair with the
//! lowest merge rank (leftmost on ties) is merged until no pair has a rank (see [`super::merge`]).
//! A final symbol that is not a token falls back to one token per byte.

use std::cmp::Reverse;
use std::collections::HashMap;

use super::merge::Symbols;
use super::vocab::Vocab;

/// The merge table: every string that appears on either side of a merge gets a small id, and the
/// ranks are keyed by pairs of ids.
pub(crate) struct Merges {
    part_ids: HashMap<String, u32>,
    ranks: HashMap<(u32, u32), u32>,
}

impl Merges {
    /// Parses `"left right"` merge strings; the split is at the first space after the first byte.
    /// A merge without such a space ranks the pair of empty strings (which never occurs in
    /// tokenization). On duplicate pairs the first rank wins.
    pub fn new(merges: &[String]) -> Merges {
        let mut part_ids: HashMap<String, u32> = HashMap::with_capacity(merges.len());
        let mut ranks = HashMap::with_capacity(merges.len());
        let mut intern = |s: &str| -> u32 {
            if let Some(&id) = part_ids.get(s) {
                return id;
            }
            let id = part_ids.len() as u32;
            part_ids.insert(s.to_string(), id);
            id
        };
        for (rank, word) in merges.iter().enumerate() {
            let space = word.bytes().skip(1).position(|b| b == b' ');
            let (left, right) = match space {
                Some(p) => (&word[..p + 1], &word[p + 2..]),
                None => ("", ""),
            };
            let key = (intern(left), intern(right));
            ranks.entry(key).or_insert(rank as u32);
        }
        Merges { part_ids, ranks }
    }

    /// The rank of merging `left` with `right`, if they merge.
    pub fn rank(&self, left: &str, right: &str) -> Option<u32> {
        let l = *self.part_ids.get(left)?;
        let r = *self.part_ids.get(right)?;
        self.ranks.get(&(l, r)).copied()
    }

    pub fn len(&self) -> usize {
        self.ranks.len()
    }
}

/// GPT-2's map of bytes to printable characters: printable Latin-1 bytes map to themselves, the
/// others to U+0100 onwards in byte order.
pub(crate) fn byte_to_unicode_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let keep = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let cp = if keep {
            u32::from(b)
        } else {
            next += 1;
            next - 1
        };
        table[b as usize] = char::from_u32(cp).unwrap_or('\0');
    }
    table
}

/// The inverse of [`byte_to_unicode_table`].
pub(crate) fn unicode_to_byte_map(table: &[char; 256]) -> HashMap<char, u8> {
    table
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect()
}

/// The BPE tokenizer of one vocabulary.
pub(crate) struct BpeModel<'v> {
    pub vocab: &'v Vocab,
    pub merges: &'v Merges,
    pub byte_encode: bool,
    pub gemma4_newlines: bool,
}

impl BpeModel<'_> {
    /// Tokenizes one pre-tokenized word (already byte-encoded where the vocabulary is byte-level).
    pub fn tokenize_word(&self, word: &str, out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        let whole = (self.vocab.ignore_merges
            || (self.gemma4_newlines && word.bytes().all(|b| b == b'\n')))
            && self.vocab.text_to_token(word).is_some();
        let mut symbols = if whole {
            Symbols::whole(word)
        } else {
            Symbols::chars(word)
        };
        symbols.merge(|left, right, _| self.merges.rank(left, right).map(Reverse));
        for piece in symbols.pieces() {
            match self.vocab.text_to_token(piece) {
                Some(id) => out.push(id),
                None => self.byte_fallback(piece, out),
            }
        }
    }

    /// One token per byte of a symbol that is not a token; bytes without a token are dropped.
    fn byte_fallback(&self, text: &str, out: &mut Vec<u32>) {
        for &b in text.as_bytes() {
            let id = if self.byte_encode {
                std::str::from_utf8(&[b])
                    .ok()
                    .and_then(|s| self.vocab.text_to_token(s))
            } else {
                self.vocab.byte_token_hex(b)
            };
            out.extend(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table() {
        let t = byte_to_unicode_table();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[0xAD], 'Ń');
        let inv = unicode_to_byte_map(&t);
        assert_eq!(inv.len(), 256);
    }

    #[test]
    fn merge_parsing() {
        let m = Merges::new(&["a b".to_string(), "  x".to_string(), "ab c".to_string()]);
        assert_eq!(m.rank("a", "b"), Some(0));
        assert_eq!(m.rank(" ", "x"), Some(1));
        assert_eq!(m.rank("ab", "c"), Some(2));
        assert_eq!(m.rank("b", "c"), None);
        assert_eq!(m.len(), 3);
    }
}
