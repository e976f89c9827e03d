//! Pre-tokenizers of byte-level BPE vocabularies: the value of `tokenizer.ggml.pre` selects a list
//! of regexes (llama.cpp's `llm_tokenizer_bpe` table) and a few model flags.
//!
//! The regexes are applied one after the other, as llama.cpp's `unicode_regex_split` does: each one
//! splits every piece left by the previous ones into its matches and the text between them, and a
//! regex never sees past the end of the piece it runs on (so `\s+(?!\S)` matches at a piece end).

use fancy_regex::Regex;

use super::TokenizerError;

/// The pre-tokenizer of a vocabulary; each variant is one regex list with one set of flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// No pre-tokenization (SentencePiece vocabularies).
    Unsplit,
    Default,
    /// `llama3`, `llama-bpe`, ...: ignores merges for whole-word tokens and adds BOS by default.
    Llama3,
    /// The llama3 regex without the llama3 flags (`dbrx`, `smaug-bpe`).
    Dbrx,
    /// The llama3 regex, no BOS token (`glm4`, `chatglm-bpe`).
    ChatGlm4,
    DeepseekLlm,
    DeepseekCoder,
    Deepseek3,
    Falcon,
    /// Digits one by one, then the GPT-2 regex (`starcoder`, `refact`, `codeshell`, ...).
    Starcoder,
    /// The starcoder regexes without space cleaning on decode (`command-r`).
    CommandR,
    /// The starcoder regexes without space cleaning on decode (`smollm`).
    Smollm,
    Gpt2,
    /// `qwen2` and its relatives: like llama3 but one digit per piece.
    Qwen2,
    /// The qwen2 regex with space cleaning on decode (`stablelm2`, `megrez`).
    StableLm2,
    /// `qwen35`: like qwen2 but combining marks join letters.
    Qwen35,
    Gpt4o,
    /// Gemma 4: spaces escaped to `▁`, split only at newline runs, BPE on raw UTF-8.
    Gemma4,
}

/// Flags that llama.cpp sets per pre-tokenizer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PreFlags {
    pub clean_spaces: bool,
    pub ignore_merges: bool,
    pub add_bos: bool,
    pub escape_whitespaces: bool,
    pub no_bos: bool,
}

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const DEEPSEEK_LETTERS: &str = r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝ\x{1F5F}-\x{1F7D}ᾀ-ᾴᾶ-ᾼ\x{1FBE}ῂ-ῄῆ-ῌ\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\x{2126}ℨ\x{212A}-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+";
const DEEPSEEK_PUNCT: &str = r"\s?[!-/:-~！-／：-～‘-‟　-。]+";
const CJK_HANGUL: &str = r"[一-龥ࠀ-一가-퟿]+";

impl PreTokenizer {
    /// The pre-tokenizer named by `tokenizer.ggml.pre` for a `gpt2` vocabulary.
    pub fn from_name(name: &str) -> Option<PreTokenizer> {
        use PreTokenizer::*;
        Some(match name {
            "default" => Default,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" => Llama3,
            "dbrx" | "smaug-bpe" => Dbrx,
            "glm4" | "chatglm-bpe" => ChatGlm4,
            "deepseek-llm" => DeepseekLlm,
            "deepseek-coder" => DeepseekCoder,
            "deepseek-v3" => Deepseek3,
            "falcon" => Falcon,
            "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" => Starcoder,
            "command-r" => CommandR,
            "smollm" => Smollm,
            "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "exaone4" | "mellum" => Gpt2,
            "qwen2" | "deepseek-r1-qwen" => Qwen2,
            "stablelm2" | "megrez" => StableLm2,
            "qwen35" => Qwen35,
            "gpt-4o" | "llama4" => Gpt4o,
            "gemma4" => Gemma4,
            _ => return None,
        })
    }

    pub(crate) fn flags(self) -> PreFlags {
        use PreTokenizer::*;
        let mut f = PreFlags {
            clean_spaces: true,
            ignore_merges: false,
            add_bos: false,
            escape_whitespaces: false,
            no_bos: false,
        };
        match self {
            Llama3 => {
                f.ignore_merges = true;
                f.add_bos = true;
            }
            ChatGlm4 => f.no_bos = true,
            DeepseekLlm | DeepseekCoder | Deepseek3 | CommandR | Smollm | Qwen2 | Qwen35
            | Gpt4o => f.clean_spaces = false,
            Gemma4 => f.escape_whitespaces = true,
            _ => {}
        }
        f
    }

    /// Whether the BPE symbols are GPT-2 byte-encoded (false: raw UTF-8 with `<0xXX>` fallback).
    pub fn byte_encode(self) -> bool {
        self != PreTokenizer::Gemma4
    }

    fn regex_sources(self) -> Vec<&'static str> {
        use PreTokenizer::*;
        match self {
            Unsplit => vec![],
            Default => vec![r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
            Llama3 | Dbrx | ChatGlm4 => vec![LLAMA3],
            DeepseekLlm => vec![
                r"[\r\n]",
                DEEPSEEK_LETTERS,
                DEEPSEEK_PUNCT,
                r"\s+$",
                CJK_HANGUL,
                r"\p{N}+",
            ],
            DeepseekCoder => vec![r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", CJK_HANGUL, r"\p{N}"],
            Deepseek3 => vec![
                r"\p{N}{1,3}",
                r"[一-龥぀-ゟ゠-ヿ]+",
                r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}\~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
            ],
            Falcon => vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"],
            Starcoder | CommandR | Smollm => vec![r"\p{N}", GPT2],
            Gpt2 => vec![GPT2],
            Qwen2 | StableLm2 => vec![QWEN2],
            Qwen35 => vec![QWEN35],
            Gpt4o => vec![GPT4O],
            Gemma4 => vec![r"[^\n]+|[\n]+"],
        }
    }
}

/// A compiled pre-tokenizer.
pub(crate) struct Splitter {
    regexes: Vec<Regex>,
}

impl Splitter {
    pub fn new(pre: PreTokenizer) -> Result<Splitter, TokenizerError> {
        let regexes = pre
            .regex_sources()
            .into_iter()
            .map(|src| Regex::new(src).map_err(|e| TokenizerError::Regex(format!("{src}: {e}"))))
            .collect::<Result<_, _>>()?;
        Ok(Splitter { regexes })
    }

    /// Splits `text` into pieces (byte ranges covering all of it, in order).
    pub fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut pieces: Vec<(usize, usize)> = vec![(0, text.len())];
        for re in &self.regexes {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for &(start, end) in &pieces {
                let piece = &text[start..end];
                let mut last = 0;
                for m in re.find_iter(piece) {
                    let Ok(m) = m else { break };
                    if m.start() == m.end() {
                        continue;
                    }
                    if m.start() > last {
                        next.push((start + last, start + m.start()));
                    }
                    next.push((start + m.start(), start + m.end()));
                    last = m.end();
                }
                if last < piece.len() {
                    next.push((start + last, end));
                }
            }
            pieces = next;
        }
        pieces.into_iter().map(|(s, e)| &text[s..e]).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_regexes_compile() {
        use PreTokenizer::*;
        for pre in [
            Default,
            Llama3,
            DeepseekLlm,
            DeepseekCoder,
            Deepseek3,
            Falcon,
            Starcoder,
            Gpt2,
            Qwen2,
            Qwen35,
            Gpt4o,
            Gemma4,
        ] {
            Splitter::new(pre).unwrap();
        }
    }

    #[test]
    fn gpt2_split() {
        let s = Splitter::new(PreTokenizer::Gpt2).unwrap();
        assert_eq!(
            s.split("Hello world's   end"),
            vec!["Hello", " world", "'s", "  ", " end"]
        );
    }

    #[test]
    fn starcoder_digits() {
        let s = Splitter::new(PreTokenizer::Starcoder).unwrap();
        assert_eq!(s.split("a 123"), vec!["a", " ", "1", "2", "3"]);
    }
}
