//! Chat prompts: the model's Jinja chat template (GGUF key `tokenizer.chat_template`) rendered with
//! `minijinja` the way Hugging Face's `apply_chat_template` and llama.cpp render it.
//!
//! The environment matches Hugging Face's: `trim_blocks` and `lstrip_blocks` on, the trailing newline
//! of the template dropped, Python string/dict/list methods (`.strip()`, `.items()`, `.split()`, ...)
//! through `minijinja-contrib`'s pycompat, `raise_exception(msg)`, `strftime_now(fmt)` (UTC) and a
//! `tojson` that writes like Python's `json.dumps` ([`json`]). The context has `messages`,
//! `add_generation_prompt`, `bos_token`, `eos_token`, `tools` and `documents` (none unless given),
//! plus any extra variables (e.g. `enable_thinking`).
//!
//! A GGUF without a template gets llama.cpp's fallback, ChatML ([`CHATML_TEMPLATE`]).
//!
//! A render is bounded ([`limits`]): a fuel budget of instructions, a budget of the text it builds
//! (checked by the template's instructions rewritten in [`program`]), a cap on the rendered bytes,
//! bounded lists and small padding widths; a hostile template ends with [`ChatError::Render`].

mod json;
mod limits;
mod program;
mod time;

use std::collections::BTreeMap;

use ggml_core::gguf::GgufFile;
use minijinja::machinery::{get_compiled_template, make_string_output, Vm};
use minijinja::{Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use crate::tokenizer::Tokenizer;

/// The GGUF key of the default chat template; named ones are `tokenizer.chat_template.<name>`.
pub const CHAT_TEMPLATE_KEY: &str = "tokenizer.chat_template";

/// llama.cpp's fallback template for models without one: ChatML.
pub const CHATML_TEMPLATE: &str = "{%- for message in messages -%}\n  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n  {{- '<|im_start|>assistant\\n' -}}\n{%- endif -%}";

/// The name the template is registered under in its environment (shown in error messages).
const TEMPLATE_NAME: &str = "chat_template";

/// Errors of loading or rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("GGUF key '{0}' is not a string")]
    BadMetadata(String),
    #[error("GGUF has no chat template named '{0}'")]
    NoSuchTemplate(String),
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    #[error("chat template failed to render: {0}")]
    Render(String),
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    pub content: String,
    /// An assistant message's tool calls (`[{"id", "type", "function": {"name", "arguments"}}]`,
    /// the arguments an object, as templates expect).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The tool's name, for a `tool` message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Message {
    /// A message of `role`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }

    /// A `system` message.
    pub fn system(content: impl Into<String>) -> Message {
        Message::new("system", content)
    }

    /// A `user` message.
    pub fn user(content: impl Into<String>) -> Message {
        Message::new("user", content)
    }

    /// An `assistant` message.
    pub fn assistant(content: impl Into<String>) -> Message {
        Message::new("assistant", content)
    }
}

/// What a template sees besides the messages.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    /// Append the header of the assistant's turn.
    pub add_generation_prompt: bool,
    /// Tool definitions (the JSON the OpenAI API takes); `tools` is none without them.
    pub tools: Option<serde_json::Value>,
    /// Documents for retrieval templates; `documents` is none without them.
    pub documents: Option<serde_json::Value>,
    /// Further variables, e.g. `enable_thinking`; they cannot replace the ones above.
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// A compiled chat template with the BOS/EOS texts it may write.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    fallback: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("fallback", &self.fallback)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` are the texts of those tokens (empty if none).
    pub fn new(
        source: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<ChatTemplate, ChatError> {
        let source = source.into();
        if source.contains(program::RESERVED) {
            return Err(ChatError::Syntax(format!(
                "names starting with {} are reserved",
                program::RESERVED
            )));
        }
        let mut env = environment();
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|e| ChatError::Syntax(describe(&e)))?;
        Ok(ChatTemplate {
            env,
            source,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
            fallback: false,
        })
    }

    /// ChatML, the template of models that have none.
    pub fn chatml(
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<ChatTemplate, ChatError> {
        let mut t = ChatTemplate::new(CHATML_TEMPLATE, bos_token, eos_token)?;
        t.fallback = true;
        Ok(t)
    }

    /// The default template of a GGUF model (`tokenizer.chat_template`), or ChatML when it has
    /// none; BOS/EOS texts from `tokenizer` (built from the same file).
    pub fn from_gguf(file: &GgufFile, tokenizer: &Tokenizer) -> Result<ChatTemplate, ChatError> {
        let (bos, eos) = special_texts(tokenizer);
        match template_source(file, None)? {
            Some(source) => ChatTemplate::new(source, bos, eos),
            None => ChatTemplate::chatml(bos, eos),
        }
    }

    /// The named template `tokenizer.chat_template.<name>` of a GGUF model (e.g. `tool_use`).
    pub fn from_gguf_named(
        file: &GgufFile,
        tokenizer: &Tokenizer,
        name: &str,
    ) -> Result<ChatTemplate, ChatError> {
        let source = template_source(file, Some(name))?
            .ok_or_else(|| ChatError::NoSuchTemplate(name.to_string()))?;
        let (bos, eos) = special_texts(tokenizer);
        ChatTemplate::new(source, bos, eos)
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether this is the ChatML fallback rather than the model's own template.
    pub fn is_fallback(&self) -> bool {
        self.fallback
    }

    /// The text of `bos_token`.
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    /// The text of `eos_token`.
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Renders `messages`, with the assistant's turn header appended when `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        self.render_with(
            messages,
            &RenderOptions {
                add_generation_prompt,
                ..RenderOptions::default()
            },
        )
    }

    /// Renders `messages` with tools, documents or extra variables.
    pub fn render_with(
        &self,
        messages: &[Message],
        options: &RenderOptions,
    ) -> Result<String, ChatError> {
        let mut ctx: BTreeMap<String, Value> = options
            .extra
            .iter()
            .map(|(k, v)| (k.clone(), Value::from_serialize(v)))
            .collect();
        let optional = |v: &Option<serde_json::Value>| match v {
            Some(v) => Value::from_serialize(v),
            None => Value::from(()),
        };
        ctx.insert("messages".into(), Value::from_serialize(messages));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(options.add_generation_prompt),
        );
        ctx.insert("bos_token".into(), Value::from(self.bos_token.as_str()));
        ctx.insert("eos_token".into(), Value::from(self.eos_token.as_str()));
        ctx.insert("tools".into(), optional(&options.tools));
        ctx.insert("documents".into(), optional(&options.documents));
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatError::Render(describe(&e)))?;
        let program = program::Program::of(get_compiled_template(&template));
        let _budget = limits::Budget::start();
        let mut rendered = String::new();
        Vm::new(&self.env)
            .eval(
                &program.main,
                Value::from_serialize(&ctx),
                &program.blocks,
                &mut make_string_output(&mut rendered),
                program.auto_escape,
            )
            .map_err(|e| ChatError::Render(describe(&e)))?;
        if rendered.len() > limits::MAX_RENDERED_BYTES {
            return Err(ChatError::Render(format!(
                "the rendered prompt exceeds {} bytes",
                limits::MAX_RENDERED_BYTES
            )));
        }
        Ok(rendered)
    }

    /// `rendered` without a leading BOS text when the tokenizer adds BOS itself (`add_bos`), and
    /// without a trailing EOS text when it adds EOS (`add_eos`), as llama.cpp does before
    /// tokenizing, so the prompt does not get the token twice.
    pub fn strip_special<'a>(&self, rendered: &'a str, add_bos: bool, add_eos: bool) -> &'a str {
        let mut s = rendered;
        if add_bos && !self.bos_token.is_empty() {
            s = s.strip_prefix(self.bos_token.as_str()).unwrap_or(s);
        }
        if add_eos && !self.eos_token.is_empty() {
            s = s.strip_suffix(self.eos_token.as_str()).unwrap_or(s);
        }
        s
    }
}

/// The source of the default (`name = None`) or a named template, if the file has it.
pub fn template_source<'a>(
    file: &'a GgufFile,
    name: Option<&str>,
) -> Result<Option<&'a str>, ChatError> {
    let key = match name {
        Some(n) => format!("{CHAT_TEMPLATE_KEY}.{n}"),
        None => CHAT_TEMPLATE_KEY.to_string(),
    };
    match file.get(&key) {
        None => Ok(None),
        Some(v) => v.as_str().map(Some).ok_or(ChatError::BadMetadata(key)),
    }
}

/// The texts of the BOS and EOS tokens, empty when the vocabulary has none.
fn special_texts(tokenizer: &Tokenizer) -> (String, String) {
    let text = |id: Option<u32>| {
        id.and_then(|id| tokenizer.token_text(id))
            .unwrap_or_default()
            .to_string()
    };
    (text(tokenizer.bos()), text(tokenizer.eos()))
}

/// An error with its cause chain and template location, on one line.
fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}

/// The Jinja environment of chat templates.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_fuel(Some(limits::FUEL));
    env.set_unknown_method_callback(limits::unknown_method);
    env.add_filter("tojson", json::tojson);
    env.add_filter("indent", limits::indent);
    env.add_filter("format", limits::format);
    env.add_filter("replace", limits::replace);
    env.add_filter("join", limits::join);
    program::install(&mut env);
    env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_function("strftime_now", |fmt: String| {
        time::DateTime::now().format(&fmt)
    });
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_fallback() {
        let t = ChatTemplate::chatml("<s>", "</s>").unwrap();
        let msgs = [Message::system("Be brief."), Message::user("Hi")];
        assert_eq!(
            t.render(&msgs, true).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            t.render(&msgs[1..], false).unwrap(),
            "<|im_start|>user\nHi<|im_end|>\n"
        );
        assert!(t.is_fallback());
    }

    #[test]
    fn helpers_and_errors() {
        let src = "{{ bos_token }}{% for m in messages %}{{ m.content.strip().upper() }}|{{ m | tojson }}\n{% endfor %}{{ strftime_now('%Y') | length }}{% if extra_flag %}!{% endif %}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let mut options = RenderOptions::default();
        options
            .extra
            .insert("extra_flag".into(), serde_json::Value::Bool(true));
        let out = t.render_with(&[Message::user(" hi ")], &options).unwrap();
        assert_eq!(out, "<s>HI|{\"role\": \"user\", \"content\": \" hi \"}\n4!");
        assert_eq!(t.strip_special(&out, true, false), &out[3..]);

        let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}", "", "").unwrap();
        let err = t.render(&[], true).unwrap_err().to_string();
        assert!(err.contains("roles must alternate"), "{err}");

        let err = ChatTemplate::new("{% for %}", "", "").unwrap_err();
        assert!(matches!(err, ChatError::Syntax(_)), "{err}");
    }

    #[test]
    fn hostile_templates_end_with_an_error() {
        let wide_indent = format!("{{{{ messages|tojson(indent='{}') }}}}", "&".repeat(300));
        let hostile = [
            "{{ messages|tojson(indent=1000000000000) }}",
            wide_indent.as_str(),
            "{{ 'x'|indent(1000000000000) }}",
            "{{ 'x'|indent(width=1000000000000) }}",
            "{{ '%1000000000000d'|format(1) }}",
            "{{ '{:>1000000000000}'.format(1) }}",
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "{% for i in range(100000) %}{{ 'x' * 10000 }}{% endfor %}",
        ];
        for src in hostile {
            let t = ChatTemplate::new(src, "", "").unwrap();
            let err = t.render(&[Message::user("hi")], true).unwrap_err();
            assert!(matches!(err, ChatError::Render(_)), "{src}: {err}");
        }
        let t = ChatTemplate::new(
            "{{ messages|tojson(indent=2) }}|{{ 'a'|indent(4) }}",
            "",
            "",
        )
        .unwrap();
        assert_eq!(
            t.render(&[Message::user("hi")], false).unwrap(),
            "[\n  {\n    \"role\": \"user\",\n    \"content\": \"hi\"\n  }\n]|a"
        );
    }

    /// Templates that double a string or a list in a loop (kept in a namespace, as a `set` in a loop
    /// does not outlive its iteration; by every operator and filter that can build one) or in a
    /// recursive macro end with an error once the text budget or the list bound is reached, and the
    /// same thread renders normally afterwards.
    #[test]
    fn doubling_templates_end_with_an_error() {
        let loop_of = |init: &str, step: &str| {
            format!("{{% set ns = namespace(s={init}) %}}{{% for i in range(100) %}}{step}{{% endfor %}}{{{{ ns.s|length }}}}")
        };
        let hostile = [
            loop_of("'ab'", "{% set ns.s = ns.s ~ ns.s %}"),
            loop_of("'ab'", "{% set ns.s = ns.s + ns.s %}"),
            loop_of("'ab'", "{% set ns.s = ns.s * 2 %}"),
            loop_of("'ab'", "{% set ns.s = 2 * ns.s %}"),
            loop_of("'ab'", "{% set ns.s = [ns.s, ns.s]|join %}"),
            loop_of("'ab'", "{% set ns.s = ''.join([ns.s, ns.s]) %}"),
            loop_of("'ab'", "{% set ns.s = ns.s|replace('a', ns.s) %}"),
            loop_of("'ab'", "{% set ns.s = ns.s.replace('a', ns.s) %}"),
            loop_of("'ab'", "{% set ns.s = '%s%s'|format(ns.s, ns.s) %}"),
            loop_of("'ab'", "{% set ns.s = '{}{}'.format(ns.s, ns.s) %}"),
            loop_of("'ab'", "{% set c %}{{ ns.s }}{{ ns.s }}{% endset %}{% set ns.s = c %}"),
            loop_of("'ab'", "{% set ns.s = [ns.s, ns.s]|tojson %}"),
            loop_of("'ab'", "{% set ns.s = (ns.s ~ ns.s)|upper %}"),
            loop_of("['ab']", "{% set ns.s = ns.s + ns.s %}"),
            loop_of("['ab']", "{% set ns.s = ns.s * 2 %}"),
            loop_of("['ab']", "{% set ns.s = ns.s + ns.s %}{% set t = ns.s|list %}"),
            "{% set s = 'ab' %}{% for i in range(100) %}{% set s = s ~ s %}{% endfor %}{{ s * 100000000 }}".into(),
            "{% macro d(s, n) %}{% if n %}{{ d(s ~ s, n - 1) }}{% else %}{{ s|length }}{% endif %}{% endmacro %}{{ d('ab', 100) }}".into(),
            "{% set s = 'x' * 1000000 %}{% for i in range(1000) %}{{ s }}{% endfor %}".into(),
            format!("{{% for i in range(100000) %}}{{% for j in range(100) %}}{}{{% endfor %}}{{% endfor %}}", "0123456789abcdef".repeat(64)),
        ];
        let msgs = [Message::user("hi")];
        for src in &hostile {
            let t = ChatTemplate::new(src.as_str(), "", "").unwrap();
            let err = t.render(&msgs, true).unwrap_err();
            assert!(matches!(err, ChatError::Render(_)), "{src}: {err}");
        }
        // Growth within the bounds renders as before, and so does a template after the errors.
        let t = ChatTemplate::new(
            loop_of(
                "'ab'",
                "{% if ns.s|length < 1000 %}{% set ns.s = ns.s ~ ns.s %}{% endif %}",
            )
            .as_str(),
            "",
            "",
        )
        .unwrap();
        assert_eq!(t.render(&msgs, true).unwrap(), "1024");
        let t = ChatTemplate::new(
            loop_of(
                "['ab']",
                "{% if ns.s|length < 1000 %}{% set ns.s = ns.s + ns.s * 1 %}{% endif %}",
            )
            .as_str(),
            "",
            "",
        )
        .unwrap();
        assert_eq!(t.render(&msgs, true).unwrap(), "1024");
        let reserved = ChatTemplate::new("{{ __ggml_tp_concat('a', 'b') }}", "", "").unwrap_err();
        assert!(matches!(reserved, ChatError::Syntax(_)), "{reserved}");
    }

    /// The rewritten program keeps jumps, loops, macros, filters and raw text as they were.
    #[test]
    fn rewritten_templates_render_as_before() {
        let src = "{% macro m(x) %}<{{ x ~ '!' }}>{% endmacro %}{% for msg in messages %}{% if loop.first %}[{% endif %}{{ m(msg.content) }}{{ (msg.role + ':')|upper }}{% if not loop.last %}, {% else %}]{% endif %}{% endfor %}{{ 'ab' * 2 }}{{ [1, 2] + [3] }}{{ ['x', 'y']|join('-') }}{{ 'aXa'|replace('X', 'b') }}{{ '%s=%d'|format('n', 3) }}{% set c %}raw {{ 1 + 2 }}{% endset %}{{ c }}{% if add_generation_prompt %}?{% endif %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let msgs = [Message::user("hi"), Message::assistant("yo")];
        assert_eq!(
            t.render(&msgs, true).unwrap(),
            "[<hi!>USER:, <yo!>ASSISTANT:]abab[1, 2, 3]x-yaban=3raw 3?"
        );
    }
}
