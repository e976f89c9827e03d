//! Token ids back to bytes and text (llama.cpp's `token_to_piece` and `detokenize`).
//!
//! A piece is the text of one token: SentencePiece and gemma4 tokens with `▁` turned back into
//! spaces, byte-level BPE tokens mapped back through GPT-2's byte table, `<0xXX>` tokens as their
//! byte. A piece may be part of a UTF-8 sequence, so pieces are bytes; [`Tokenizer::decode`] joins
//! them and then applies the model's space cleaning.

use super::vocab::attr;
use super::{ModelKind, Tokenizer};

impl Tokenizer {
    /// The bytes of token `id` for display; control and unknown tokens give nothing. Out-of-range
    /// ids give nothing.
    pub fn token_to_piece(&self, id: u32) -> Vec<u8> {
        self.token_to_piece_with(id, false)
    }

    /// The bytes of token `id`; with `special`, control and unknown tokens give their text.
    pub fn token_to_piece_with(&self, id: u32, special: bool) -> Vec<u8> {
        let v = &self.vocab;
        let Some(text) = v.tokens.get(id as usize) else {
            return Vec::new();
        };
        let a = v.attr(id);
        let special_attr = attr::UNKNOWN | attr::CONTROL;
        if !special && a & special_attr != 0 {
            return Vec::new();
        }
        if a & (special_attr | attr::USER_DEFINED) != 0 {
            return text.as_bytes().to_vec();
        }
        if a & attr::NORMAL != 0 {
            let unescape = v.kind == ModelKind::Spm || v.escape_whitespaces;
            return if unescape {
                text.replace('\u{2581}', " ").into_bytes()
            } else {
                self.decode_byte_level(text)
            };
        }
        if a & attr::BYTE != 0 {
            return v.token_to_byte(id).into_iter().collect();
        }
        Vec::new()
    }

    /// Maps a byte-level token text back to bytes; a character outside GPT-2's byte table is
    /// written as llama.cpp does (`[UNK_BYTE_0x..]`).
    fn decode_byte_level(&self, text: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(text.len());
        for c in text.chars() {
            match self.unicode_to_byte.get(&c) {
                Some(&b) => out.push(b),
                None => {
                    out.extend_from_slice(b"[UNK_BYTE_0x");
                    let mut buf = [0u8; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        out.extend_from_slice(format!("{b:02x}").as_bytes());
                    }
                    out.extend_from_slice(text.as_bytes());
                    out.push(b']');
                }
            }
        }
        out
    }

    /// The bytes of a token sequence, as llama.cpp's `detokenize`: with `remove_special`, a leading
    /// BOS and trailing EOS that the model adds are dropped; with `unparse_special`, control tokens
    /// are rendered as their text. The space the SentencePiece tokenizer prefixes is removed, and
    /// models that ask for it get their spaces before punctuation cleaned.
    pub fn detokenize(&self, ids: &[u32], remove_special: bool, unparse_special: bool) -> Vec<u8> {
        let v = &self.vocab;
        let mut ids = ids;
        let mut remove_space = v.add_space_prefix;
        if remove_special && v.add_bos {
            if let (Some(first), Some(bos)) = (ids.first(), v.special.bos) {
                if *first == bos {
                    remove_space = false;
                    ids = &ids[1..];
                }
            }
        }
        if remove_special && v.add_eos {
            if let (Some((last, rest)), Some(eos)) = (ids.split_last(), v.special.eos) {
                if *last == eos {
                    ids = rest;
                }
            }
        }
        let mut out = Vec::new();
        for &id in ids {
            let piece = self.token_to_piece_with(id, unparse_special);
            let piece = match piece.first() {
                Some(b' ') if remove_space => &piece[1..],
                _ => &piece[..],
            };
            out.extend_from_slice(piece);
            remove_space = false;
        }
        if v.clean_spaces {
            clean_spaces(&mut out);
        }
        out
    }

    /// The text of a token sequence (control tokens rendered as nothing; invalid UTF-8 replaced).
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.detokenize(ids, false, false)).into_owned()
    }
}

/// Turns a stream of generated tokens into text, holding back the bytes of an incomplete UTF-8
/// sequence until the tokens that complete it arrive.
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// Adds token `id` (rendered as [`Tokenizer::token_to_piece`]) and returns the text that is
    /// complete so far. Bytes that can never become valid UTF-8 come out as U+FFFD.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> String {
        self.push_bytes(&tokenizer.token_to_piece(id))
    }

    /// [`StreamDecoder::push`] with control tokens rendered as their text (for replies whose
    /// markers, such as tool calls, are control tokens).
    pub fn push_special(&mut self, tokenizer: &Tokenizer, id: u32) -> String {
        self.push_bytes(&tokenizer.token_to_piece_with(id, true))
    }

    fn push_bytes(&mut self, piece: &[u8]) -> String {
        self.pending.extend_from_slice(piece);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match e.error_len() {
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// The held-back bytes at the end of the stream, lossily.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

/// llama.cpp's three passes of space cleaning: no space before `?!.,`, a lone `'` between spaces
/// loses both spaces, and no space before the contractions `'s 'm 're 've`.
fn clean_spaces(text: &mut Vec<u8>) {
    // First pass: " ?", " !", " .", " ,".
    let mut out: Vec<u8> = Vec::with_capacity(text.len());
    for (i, &x) in text.iter().enumerate() {
        if i > 0 && text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            out.pop();
        }
        out.push(x);
    }
    // Second pass: " ' " becomes "'" (the space after is blanked in place, as llama.cpp does).
    let mut src = std::mem::take(&mut out);
    let mut i = 0;
    while i < src.len() {
        let x = src[i];
        out.push(x);
        if i > 0 && x == b'\'' && i + 1 < src.len() && src[i - 1] == b' ' && src[i + 1] == b' ' {
            out.pop();
            out.pop();
            out.push(x);
            src[i + 1] = 0;
            i += 1;
        }
        i += 1;
    }
    // Third pass: " 's", " 'm", " 're", " 've".
    let src = std::mem::take(&mut out);
    for (i, &x) in src.iter().enumerate() {
        if i > 0 && src[i - 1] == b' ' && x == b'\'' && i + 1 < src.len() {
            let x1 = src[i + 1];
            let x2 = src.get(i + 2).copied();
            let contraction = matches!(x1, b's' | b'm')
                || (i + 2 < src.len()
                    && matches!((x1, x2), (b'r', Some(b'e')) | (b'v', Some(b'e'))));
            if contraction {
                out.pop();
            }
        }
        out.push(x);
    }
    *text = out;
}

#[cfg(test)]
mod tests {
    use super::clean_spaces;

    fn clean(s: &str) -> String {
        let mut v = s.as_bytes().to_vec();
        clean_spaces(&mut v);
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn cleaning() {
        assert_eq!(clean("Hello , world !"), "Hello, world!");
        assert_eq!(clean("a ' b"), "a'b");
        assert_eq!(clean("it 's we 're I 'll"), "it's we're I 'll");
        assert_eq!(clean(" ."), ".");
    }
}
