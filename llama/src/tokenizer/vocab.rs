//! The vocabulary as read from GGUF metadata: token texts, scores and attributes, the special token
//! ids, the per-model flags (`add_bos`, `add_space_prefix`, `clean_spaces`, ...) and the
//! end-of-generation set, following llama.cpp's `llama_vocab::load`.
//!
//! Nothing here panics on a corrupt file: missing arrays are errors, out-of-range special ids fall
//! back to their defaults (or to none), short `scores`/`token_type` arrays are errors.

use std::collections::{BTreeSet, HashMap};

use ggml_core::gguf::{GgufFile, Value};

use super::pretokenize::PreTokenizer;
use super::special::SpecialMatcher;
use super::TokenizerError;

/// Token attribute bits (llama.cpp's `llama_token_attr`).
pub(crate) mod attr {
    pub const UNKNOWN: u32 = 1 << 0;
    pub const UNUSED: u32 = 1 << 1;
    pub const NORMAL: u32 = 1 << 2;
    pub const CONTROL: u32 = 1 << 3;
    pub const USER_DEFINED: u32 = 1 << 4;
    pub const BYTE: u32 = 1 << 5;
    pub const LSTRIP: u32 = 1 << 7;
    pub const RSTRIP: u32 = 1 << 8;
}

/// Which tokenization algorithm the vocabulary uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// SentencePiece BPE by token score with `<0xXX>` byte fallback (`tokenizer.ggml.model = llama`).
    Spm,
    /// Merge-rank BPE (`gpt2`: byte-level; `gemma4`: over raw UTF-8 with `▁` for spaces).
    Bpe,
}

/// Special token ids; `None` where the model has none.
#[derive(Debug, Clone, Default)]
pub struct SpecialTokens {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

/// The loaded vocabulary.
pub(crate) struct Vocab {
    pub kind: ModelKind,
    pub pre: PreTokenizer,
    pub tokens: Vec<String>,
    pub scores: Vec<f32>,
    pub attrs: Vec<u32>,
    pub token_to_id: HashMap<String, u32>,
    pub special: SpecialTokens,
    pub eog: BTreeSet<u32>,
    /// Control, user-defined and unknown tokens, longest text first (the order in which they are
    /// searched for in the input).
    pub special_cache: Vec<u32>,
    /// Finds the tokens of `special_cache` in a text in one pass.
    pub special_matcher: SpecialMatcher,
    /// The `<0xXX>` token of every byte, where the vocabulary has one.
    pub hex_byte_tokens: [Option<u32>; 256],
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
    pub escape_whitespaces: bool,
    pub clean_spaces: bool,
    pub ignore_merges: bool,
}

fn get_u32(file: &GgufFile, key: &str) -> Option<u32> {
    file.get(key).and_then(Value::as_u32)
}

fn get_bool(file: &GgufFile, key: &str) -> Option<bool> {
    file.get(key).and_then(Value::as_bool)
}

fn get_str<'a>(file: &'a GgufFile, key: &str) -> Option<&'a str> {
    file.get(key).and_then(Value::as_str)
}

/// Texts that mark a token as ending generation (llama.cpp's list).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
];

const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

impl Vocab {
    /// Reads the vocabulary of `file`.
    pub fn from_gguf(file: &GgufFile) -> Result<Vocab, TokenizerError> {
        let model = get_str(file, "tokenizer.ggml.model")
            .ok_or(TokenizerError::MissingKey("tokenizer.ggml.model"))?;
        let pre_name = get_str(file, "tokenizer.ggml.pre").unwrap_or("");

        let (kind, pre, mut special) = match model {
            "llama" => {
                let special = SpecialTokens {
                    bos: Some(1),
                    eos: Some(2),
                    unk: Some(0),
                    ..Default::default()
                };
                (ModelKind::Spm, PreTokenizer::Unsplit, special)
            }
            "gpt2" => {
                let pre_name = if pre_name.is_empty() {
                    "default"
                } else {
                    pre_name
                };
                let pre = PreTokenizer::from_name(pre_name)
                    .ok_or_else(|| TokenizerError::UnknownPreTokenizer(pre_name.to_string()))?;
                let special = SpecialTokens {
                    bos: Some(11),
                    eos: Some(11),
                    ..Default::default()
                };
                (ModelKind::Bpe, pre, special)
            }
            "gemma4" => (
                ModelKind::Bpe,
                PreTokenizer::Gemma4,
                SpecialTokens::default(),
            ),
            other => return Err(TokenizerError::UnknownModel(other.to_string())),
        };

        let mut tokens: Vec<String> = file
            .get_str_array("tokenizer.ggml.tokens")
            .map_err(|_| TokenizerError::MissingKey("tokenizer.ggml.tokens"))?
            .to_vec();
        let n = tokens.len();
        if n == 0 || u32::try_from(n).is_err() {
            return Err(TokenizerError::Corrupt(format!("bad vocabulary size {n}")));
        }
        let scores = match file.get("tokenizer.ggml.scores") {
            None => vec![0.0; n],
            Some(_) => {
                let s = file
                    .get_f32_array("tokenizer.ggml.scores")
                    .map_err(|e| TokenizerError::Corrupt(e.to_string()))?;
                if s.len() < n {
                    return Err(TokenizerError::Corrupt(format!(
                        "{} scores for {n} tokens",
                        s.len()
                    )));
                }
                s
            }
        };
        let types = match file.get("tokenizer.ggml.token_type") {
            None => None,
            Some(_) => {
                let t = file
                    .get_i32_array("tokenizer.ggml.token_type")
                    .map_err(|e| TokenizerError::Corrupt(e.to_string()))?;
                if t.len() < n {
                    return Err(TokenizerError::Corrupt(format!(
                        "{} token types for {n} tokens",
                        t.len()
                    )));
                }
                Some(t)
            }
        };

        let mut token_to_id = HashMap::with_capacity(n);
        let mut attrs = Vec::with_capacity(n);
        for (i, word) in tokens.iter_mut().enumerate() {
            if word.is_empty() {
                *word = format!("[EMPTY_{i}]");
            }
            token_to_id.insert(word.clone(), i as u32);
            attrs.push(match types.as_ref().map(|t| t[i]) {
                None | Some(1) => attr::NORMAL,
                Some(2) => attr::UNKNOWN,
                Some(3) => attr::CONTROL,
                Some(4) => attr::USER_DEFINED,
                Some(5) => attr::UNUSED,
                Some(6) => attr::BYTE,
                Some(_) => 0,
            });
        }

        // Model flags, as llama.cpp sets them per model and pre-tokenizer, then the GGUF overrides.
        let mut add_bos;
        let mut add_eos = false;
        let mut add_space_prefix;
        let escape_whitespaces;
        let clean_spaces;
        let mut ignore_merges = false;
        match kind {
            ModelKind::Spm => {
                add_space_prefix = true;
                escape_whitespaces = true;
                clean_spaces = false;
                add_bos = true;
            }
            ModelKind::Bpe => {
                add_space_prefix = false;
                let flags = pre.flags();
                clean_spaces = flags.clean_spaces;
                ignore_merges = flags.ignore_merges;
                add_bos = flags.add_bos;
                escape_whitespaces = flags.escape_whitespaces;
                if flags.no_bos {
                    special.bos = None;
                }
            }
        }
        if let Some(v) = get_bool(file, "tokenizer.ggml.add_space_prefix") {
            add_space_prefix = v;
        }

        let n32 = n as u32;
        type Slot = fn(&mut SpecialTokens) -> &mut Option<u32>;
        let keys: [(&str, Slot); 17] = [
            ("tokenizer.ggml.bos_token_id", |s| &mut s.bos),
            ("tokenizer.ggml.eos_token_id", |s| &mut s.eos),
            ("tokenizer.ggml.eot_token_id", |s| &mut s.eot),
            ("tokenizer.ggml.eom_token_id", |s| &mut s.eom),
            ("tokenizer.ggml.unknown_token_id", |s| &mut s.unk),
            ("tokenizer.ggml.seperator_token_id", |s| &mut s.sep),
            ("tokenizer.ggml.padding_token_id", |s| &mut s.pad),
            ("tokenizer.ggml.mask_token_id", |s| &mut s.mask),
            ("tokenizer.ggml.fim_pre_token_id", |s| &mut s.fim_pre),
            ("tokenizer.ggml.fim_suf_token_id", |s| &mut s.fim_suf),
            ("tokenizer.ggml.fim_mid_token_id", |s| &mut s.fim_mid),
            ("tokenizer.ggml.fim_pad_token_id", |s| &mut s.fim_pad),
            ("tokenizer.ggml.fim_rep_token_id", |s| &mut s.fim_rep),
            ("tokenizer.ggml.fim_sep_token_id", |s| &mut s.fim_sep),
            ("tokenizer.ggml.prefix_token_id", |s| &mut s.fim_pre),
            ("tokenizer.ggml.suffix_token_id", |s| &mut s.fim_suf),
            ("tokenizer.ggml.middle_token_id", |s| &mut s.fim_mid),
        ];
        for (key, slot) in keys {
            let id = slot(&mut special);
            if id.is_some_and(|v| v >= n32) {
                *id = None;
            }
            if let Some(new_id) = get_u32(file, key) {
                if new_id < n32 {
                    *id = Some(new_id);
                }
            }
        }
        if let Some(v) = get_bool(file, "tokenizer.ggml.add_bos_token") {
            add_bos = v;
        }
        if let Some(v) = get_bool(file, "tokenizer.ggml.add_eos_token") {
            add_eos = v;
        }
        if pre == PreTokenizer::Gemma4 {
            add_bos = true;
        }

        let mut vocab = Vocab {
            kind,
            pre,
            tokens,
            scores,
            attrs,
            token_to_id,
            special,
            eog: BTreeSet::new(),
            special_cache: Vec::new(),
            special_matcher: SpecialMatcher::default(),
            hex_byte_tokens: [None; 256],
            add_bos,
            add_eos,
            add_space_prefix,
            escape_whitespaces,
            clean_spaces,
            ignore_merges,
        };
        for b in 0..=255u8 {
            vocab.hex_byte_tokens[b as usize] = vocab.text_to_token(&format!("<0x{b:02X}>"));
        }
        vocab.detect_special_tokens();
        vocab.build_special_cache()?;
        if let Some(name) = get_str(file, "general.name") {
            vocab.apply_model_attrs(&name.to_lowercase());
        }
        Ok(vocab)
    }

    pub fn n_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// The id of the token whose text is exactly `text`.
    pub fn text_to_token(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    pub fn attr(&self, id: u32) -> u32 {
        self.attrs.get(id as usize).copied().unwrap_or(0)
    }

    /// Marks `id` as a control token (llama.cpp does this for control-looking tokens).
    fn force_control(&mut self, id: u32) {
        if let Some(a) = self.attrs.get_mut(id as usize) {
            *a |= attr::CONTROL;
        }
    }

    /// The lowest id among the tokens whose text is in `texts`.
    fn find_first(&self, texts: &[&str]) -> Option<u32> {
        texts.iter().filter_map(|t| self.text_to_token(t)).min()
    }

    /// EOT/EOM/FIM detection by token text and the end-of-generation set.
    fn detect_special_tokens(&mut self) {
        type Slot = fn(&mut SpecialTokens) -> &mut Option<u32>;
        let lists: [(&[&str], Slot); 8] = [
            (EOT_TEXTS, |s| &mut s.eot),
            (EOM_TEXTS, |s| &mut s.eom),
            (FIM_PRE_TEXTS, |s| &mut s.fim_pre),
            (FIM_SUF_TEXTS, |s| &mut s.fim_suf),
            (FIM_MID_TEXTS, |s| &mut s.fim_mid),
            (FIM_PAD_TEXTS, |s| &mut s.fim_pad),
            (FIM_REP_TEXTS, |s| &mut s.fim_rep),
            (FIM_SEP_TEXTS, |s| &mut s.fim_sep),
        ];
        for (texts, slot) in lists {
            if slot(&mut self.special).is_none() {
                if let Some(id) = self.find_first(texts) {
                    *slot(&mut self.special) = Some(id);
                    self.force_control(id);
                }
            }
        }

        let mut eog = BTreeSet::new();
        let s = &self.special;
        eog.extend([s.fim_pad, s.fim_rep, s.fim_sep].into_iter().flatten());
        let eog_ids: Vec<u32> = EOG_TEXTS
            .iter()
            .filter_map(|t| self.text_to_token(t))
            .collect();
        for id in eog_ids {
            eog.insert(id);
            self.force_control(id);
        }
        // gpt-oss: these are always rendered.
        for t in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(id) = self.text_to_token(t) {
                self.attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        let s = &self.special;
        eog.extend([s.eos, s.eot, s.eom].into_iter().flatten());

        let in_eog = |text: &str| self.text_to_token(text).filter(|id| eog.contains(id));
        let harmony = (in_eog("<|return|>").is_some() && in_eog("<|call|>").is_some())
            || (in_eog("<|calls|>").is_some() && in_eog("<|flush|>").is_some());
        let end_id = in_eog("<|end|>").filter(|_| harmony);
        let s_id = in_eog("</s>").filter(|_| in_eog("<|tool_response>").is_some());
        // o200k_harmony / solar-open: "<|end|>" is not end-of-generation there.
        if let Some(end) = end_id {
            eog.remove(&end);
            self.attrs[end as usize] = attr::USER_DEFINED;
        }
        // gemma4: "</s>" is not end-of-generation there.
        if let Some(s_id) = s_id {
            eog.remove(&s_id);
            self.attrs[s_id as usize] = attr::NORMAL;
        }
        self.eog = eog;
    }

    fn build_special_cache(&mut self) -> Result<(), TokenizerError> {
        let mask = attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN;
        let mut cache: Vec<u32> = (0..self.tokens.len() as u32)
            .filter(|&id| self.attrs[id as usize] & mask != 0)
            .collect();
        cache.sort_by_key(|&id| (std::cmp::Reverse(self.tokens[id as usize].len()), id));
        self.special_matcher = SpecialMatcher::new(&self.tokens, &cache)?;
        self.special_cache = cache;
        Ok(())
    }

    /// Per-model token attributes that llama.cpp sets by model name.
    fn apply_model_attrs(&mut self, model_name: &str) {
        if model_name.contains("phi-3") || model_name.contains("phi3") {
            for &id in &self.special_cache {
                self.attrs[id as usize] |= attr::RSTRIP;
            }
            for (text, on) in [
                ("</s>", true),
                ("<unk>", false),
                ("<s>", false),
                ("<|endoftext|>", false),
            ] {
                if let Some(id) = self.text_to_token(text) {
                    let a = &mut self.attrs[id as usize];
                    *a = if on {
                        *a | attr::RSTRIP
                    } else {
                        *a & !attr::RSTRIP
                    };
                }
            }
        }
    }

    /// The token of byte `b` in the `<0xXX>` form, if the vocabulary has it.
    pub fn byte_token_hex(&self, b: u8) -> Option<u32> {
        self.hex_byte_tokens[b as usize]
    }

    /// The byte a `<0xXX>` token stands for.
    pub fn token_to_byte(&self, id: u32) -> Option<u8> {
        let text = self.tokens.get(id as usize)?;
        let hex = text.get(3..5)?;
        u8::from_str_radix(hex, 16).ok()
    }
}
