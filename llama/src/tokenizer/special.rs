//! Splitting the input at special tokens written in the text (llama.cpp's
//! `tokenizer_st_partition`).
//!
//! Special tokens are searched for longest first; every occurrence of one splits the remaining
//! text fragments around it. User-defined tokens are always matched; control and unknown tokens only
//! when `parse_special` is set. Tokens with the `lstrip`/`rstrip` attribute eat the ASCII whitespace
//! before/after them.
//!
//! The search takes time linear in the text (plus the occurrences found), whatever the number of
//! special tokens: one Aho-Corasick pass ([`SpecialMatcher`]) finds every occurrence of every special
//! token, overlapping ones included; then, token by token in search order, each occurrence that
//! still lies whole inside a text fragment splits it (a fragment found by its start in an ordered
//! map), which gives exactly the fragments of searching the fragments for each token in turn.

use super::vocab::{attr, Vocab};
use super::TokenizerError;
use aho_corasick::{AhoCorasick, MatchKind};
use std::collections::BTreeMap;

/// A piece of the input: text still to tokenize, or a token already recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

/// Finds every occurrence of the special tokens of [`Vocab::special_cache`] in one pass.
#[derive(Debug, Clone, Default)]
pub(crate) struct SpecialMatcher {
    /// Over the non-empty tokens (an empty one cannot be written in a text).
    automaton: Option<AhoCorasick>,
    /// The index in `special_cache` of each pattern of `automaton`.
    order: Vec<usize>,
}

impl SpecialMatcher {
    /// The matcher of `special_cache`, the special tokens' ids of `tokens` in search order.
    pub(crate) fn new(tokens: &[String], special_cache: &[u32]) -> Result<Self, TokenizerError> {
        let (order, patterns): (Vec<usize>, Vec<&str>) = special_cache
            .iter()
            .enumerate()
            .map(|(k, &id)| (k, tokens[id as usize].as_str()))
            .filter(|(_, t)| !t.is_empty())
            .unzip();
        if patterns.is_empty() {
            return Ok(SpecialMatcher::default());
        }
        let automaton = AhoCorasick::builder()
            .match_kind(MatchKind::Standard)
            .build(&patterns)
            .map_err(|e| TokenizerError::Corrupt(format!("the special tokens: {e}")))?;
        Ok(SpecialMatcher {
            automaton: Some(automaton),
            order,
        })
    }

    /// Every occurrence in `text` as (index in `special_cache`, start), sorted.
    fn occurrences(&self, text: &str) -> Vec<(usize, usize)> {
        let Some(ac) = &self.automaton else {
            return Vec::new();
        };
        let mut found: Vec<(usize, usize)> = ac
            .find_overlapping_iter(text)
            .map(|m| (self.order[m.pattern().as_usize()], m.start()))
            .collect();
        found.sort_unstable();
        found
    }
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
    // The text fragments (start -> end) and the tokens found (start -> id), disjoint ranges of
    // `text`; whitespace eaten by lstrip/rstrip is in neither.
    let mut texts = BTreeMap::from([(0usize, text.len())]);
    let mut tokens = BTreeMap::new();
    for (k, start) in vocab.special_matcher.occurrences(text) {
        let id = vocab.special_cache[k];
        let a = vocab.attr(id);
        if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
            continue;
        }
        let end = start + vocab.tokens[id as usize].len();
        let Some((&from, &to)) = texts.range(..=start).next_back() else {
            continue;
        };
        if end > to {
            continue; // not inside a text fragment: over a token found earlier, or past its end
        }
        texts.remove(&from);
        let mut left = &text[from..start];
        if a & attr::LSTRIP != 0 {
            left = left.trim_end_matches(is_c_space);
        }
        if !left.is_empty() {
            texts.insert(from, from + left.len());
        }
        tokens.insert(start, id);
        let mut rest = &text[end..to];
        if a & attr::RSTRIP != 0 {
            rest = rest.trim_start_matches(is_c_space);
        }
        if !rest.is_empty() {
            texts.insert(to - rest.len(), to);
        }
    }
    let mut fragments: Vec<(usize, Fragment<'t>)> = texts
        .into_iter()
        .map(|(from, to)| (from, Fragment::Text(&text[from..to])))
        .chain(tokens.into_iter().map(|(at, id)| (at, Fragment::Token(id))))
        .collect();
    fragments.sort_unstable_by_key(|&(at, _)| at);
    fragments.into_iter().map(|(_, f)| f).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The search as it was before the matcher: each token in turn over every fragment (time
    /// proportional to the special tokens times the text), the reference of the tests.
    fn partition_reference<'t>(
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

    /// Special tokens that overlap, share prefixes and suffixes, tie in length, hold whitespace,
    /// and strip it; with the attributes to set on them.
    const SPECIALS: [(&str, i32, u32); 10] = [
        ("<|a|>", 3, 0),
        ("<|ab|>", 3, attr::LSTRIP),
        ("ab|>", 4, 0),
        ("<|", 4, 0),
        ("|>", 3, attr::LSTRIP | attr::RSTRIP),
        ("<s>", 3, attr::RSTRIP),
        ("  ", 4, 0),
        ("bcde", 4, 0),
        ("cd", 4, attr::RSTRIP),
        ("<unk>", 2, 0),
    ];

    /// What random texts are made of: the specials, pieces of them, whitespace and letters.
    const PIECES: [&str; 20] = [
        "<|a|>", "<|ab|>", "ab|>", "<|", "|>", "<s>", "  ", "bcde", "cd", "<unk>", " ", "\n", "\t",
        "a", "b", "c", "d", "e", "<", "é",
    ];

    fn vocab() -> Vocab {
        use ggml_core::gguf::{GgufFile, GgufWriter, Value};
        let table = super::super::bpe::byte_to_unicode_table();
        let mut tokens: Vec<String> = table.iter().map(|c| c.to_string()).collect();
        let mut types = vec![1i32; tokens.len()];
        for (t, ty, _) in SPECIALS {
            tokens.push(t.to_string());
            types.push(ty);
        }
        let mut w = GgufWriter::new();
        w.set("tokenizer.ggml.model", Value::from("gpt2"));
        w.set("tokenizer.ggml.pre", Value::from("qwen2"));
        let token_refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
        w.set("tokenizer.ggml.tokens", Value::from(token_refs));
        w.set("tokenizer.ggml.token_type", Value::from(types));
        w.set("tokenizer.ggml.merges", Value::from(Vec::<&str>::new()));
        let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
        let mut vocab = Vocab::from_gguf(&file).unwrap();
        for (t, _, a) in SPECIALS {
            let id = vocab.text_to_token(t).unwrap();
            vocab.attrs[id as usize] |= a;
        }
        vocab
    }

    fn random_text(rng: &mut impl rand::Rng, pieces: usize) -> String {
        (0..pieces)
            .map(|_| PIECES[rng.gen_range(0..PIECES.len())])
            .collect()
    }

    #[test]
    fn the_matcher_splits_as_the_search_token_by_token() {
        let vocab = vocab();
        assert_eq!(vocab.special_cache.len(), SPECIALS.len());
        let seed = rand::random();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        for case in 0..3000 {
            let n = rng.gen_range(0..40);
            let text = random_text(&mut rng, n);
            for parse_special in [false, true] {
                assert_eq!(
                    partition(&vocab, &text, parse_special),
                    partition_reference(&vocab, &text, parse_special),
                    "seed {seed} case {case}, parse_special {parse_special}: {text:?}"
                );
            }
        }
    }

    #[test]
    fn a_huge_prompt_full_of_specials_splits_as_before() {
        let vocab = vocab();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(rand::random());
        let text = random_text(&mut rng, 200_000);
        let got = partition(&vocab, &text, true);
        let tokens = got
            .iter()
            .filter(|f| matches!(f, Fragment::Token(_)))
            .count();
        assert!(tokens > 50_000, "{tokens}");
        assert_eq!(got, partition_reference(&vocab, &text, true));
    }

    #[test]
    fn texts_without_specials_stay_whole() {
        let vocab = vocab();
        assert_eq!(partition(&vocab, "", true), []);
        assert_eq!(
            partition(&vocab, "plain text", true),
            [Fragment::Text("plain text")]
        );
        let s = vocab.text_to_token("<s>").unwrap();
        let unk = vocab.text_to_token("<unk>").unwrap();
        assert_eq!(
            partition(&vocab, "x<s>  \ty<unk>", true),
            [
                Fragment::Text("x"),
                Fragment::Token(s),
                Fragment::Text("y"),
                Fragment::Token(unk)
            ]
        );
        assert_eq!(
            partition(&vocab, "x<s>y<unk>", false),
            [Fragment::Text("x<s>y<unk>")]
        );
    }

    /// A special token of empty text (a hostile vocabulary) cannot be written in a text: it is
    /// never matched, and the split ends (the token-by-token search looped forever on it).
    #[test]
    fn an_empty_special_token_is_never_matched() {
        let mut vocab = vocab();
        let before = partition(&vocab, "x<s>y  z", true);
        let empty = vocab.tokens.len() as u32;
        vocab.tokens.push(String::new());
        vocab.attrs.push(attr::CONTROL);
        vocab.special_cache.push(empty);
        vocab.special_matcher = SpecialMatcher::new(&vocab.tokens, &vocab.special_cache).unwrap();
        assert_eq!(partition(&vocab, "x<s>y  z", true), before);
    }
}
