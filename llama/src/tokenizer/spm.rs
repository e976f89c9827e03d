//! SentencePiece-style BPE (llama.cpp's `llm_tokenizer_spm_session`).
//!
//! The text (spaces already escaped to `▁`) is cut into UTF-8 characters; then, repeatedly, the
//! adjacent pair whose concatenation is the vocabulary token with the highest score (leftmost on
//! ties) is merged. Every merged symbol is a token by construction; a single character that is not
//! a token is emitted as its `<0xXX>` byte tokens (or the token of the raw byte, or `<unk>`).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::vocab::Vocab;

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        // Max-heap: the highest score first, then the leftmost.
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Tokenizes `text` (whitespace already escaped) with the SentencePiece merge rule.
pub(crate) fn tokenize(vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
    let mut symbols: Vec<Symbol> = Vec::new();
    for (i, (start, ch)) in text.char_indices().enumerate() {
        let len = ch.len_utf8();
        symbols.push(Symbol {
            start,
            len,
            prev: i.checked_sub(1),
            next: (start + len < text.len()).then_some(i + 1),
        });
    }

    let mut queue = BinaryHeap::new();
    for i in 1..symbols.len() {
        push_bigram(vocab, text, &symbols, i - 1, i, &mut queue);
    }
    while let Some(bigram) = queue.pop() {
        let (l, r) = (symbols[bigram.left], symbols[bigram.right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != bigram.size {
            continue;
        }
        symbols[bigram.left].len += r.len;
        symbols[bigram.right].len = 0;
        symbols[bigram.left].next = r.next;
        if let Some(n) = r.next {
            symbols[n].prev = Some(bigram.left);
        }
        if let Some(p) = l.prev {
            push_bigram(vocab, text, &symbols, p, bigram.left, &mut queue);
        }
        if let Some(n) = r.next {
            push_bigram(vocab, text, &symbols, bigram.left, n, &mut queue);
        }
    }

    let mut i = if symbols.is_empty() { None } else { Some(0) };
    while let Some(idx) = i {
        let sym = symbols[idx];
        let piece = &text[sym.start..sym.start + sym.len];
        match vocab.text_to_token(piece) {
            Some(id) => out.push(id),
            None => {
                for &b in piece.as_bytes() {
                    out.extend(byte_to_token(vocab, b));
                }
            }
        }
        i = sym.next;
    }
}

fn push_bigram(
    vocab: &Vocab,
    text: &str,
    symbols: &[Symbol],
    left: usize,
    right: usize,
    queue: &mut BinaryHeap<Bigram>,
) {
    let (l, r) = (&symbols[left], &symbols[right]);
    let size = l.len + r.len;
    if let Some(id) = vocab.text_to_token(&text[l.start..l.start + size]) {
        queue.push(Bigram {
            score: vocab.scores[id as usize],
            left,
            right,
            size,
        });
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
