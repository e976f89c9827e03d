//! A tiny fixture model with a Hermes-style chat template (tools in the system turn, calls as
//! `<tool_call>` blocks), for the tests of tool calls.

use llama::tokenizer::Tokenizer;
use std::path::PathBuf;

/// A small Hermes-style template (tools in the system turn, calls as `<tool_call>` blocks).
pub const TOOL_TEMPLATE: &str = "{%- if tools %}<|im_start|>system\nTools:{% for t in tools %}\n\
{{ t | tojson }}{% endfor %}<|im_end|>\n{% endif %}{%- for m in messages %}<|im_start|>{{ m.role }}\n\
{{ m.content }}{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}\
</tool_call>{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}\
<|im_start|>assistant\n{% endif %}";

/// A copy of `model` with [`TOOL_TEMPLATE`] (in a temporary file named after `what`) and its
/// tokenizer.
pub fn tool_model(model: &PathBuf, what: &str) -> (PathBuf, Tokenizer) {
    let file = ggml_core::gguf::GgufFile::open(model).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let mut w = ggml_core::gguf::GgufWriter::from_file(&file).unwrap();
    w.set("tokenizer.chat_template", TOOL_TEMPLATE);
    let name = format!("ggml-tp-{what}-{}.gguf", std::process::id());
    let path = std::env::temp_dir().join(name);
    w.write_to_path(&path).unwrap();
    (path, tok)
}
