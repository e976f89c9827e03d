//! Chat templates of real models, read from the fixtures' GGUF files (`tokenizer/` vocabularies and
//! the tiny `arch/` models), rendered and compared with what Python's `jinja2` renders from the same
//! templates in Hugging Face's environment (`trim_blocks`, `lstrip_blocks`, `tojson` as
//! `json.dumps`); the expected strings below were produced that way.
//!
//! The fixtures are found through `GGML_TP_FIXTURES`, else `<CARGO_MANIFEST_DIR>/../../shared/fixtures`;
//! without them the tests print `skipped: fixtures not found` and pass.

use std::path::PathBuf;

use ggml_core::gguf::GgufFile;
use llama::chat::{ChatError, ChatTemplate, Message, RenderOptions};
use llama::tokenizer::Tokenizer;

fn fixtures() -> Option<PathBuf> {
    let dir = match std::env::var_os("GGML_TP_FIXTURES") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures"),
    };
    dir.is_dir().then_some(dir)
}

/// The file and its tokenizer, or `None` (after saying so) without fixtures.
fn load(rel: &str) -> Option<(GgufFile, Tokenizer)> {
    let Some(dir) = fixtures() else {
        println!("skipped: fixtures not found");
        return None;
    };
    let file = GgufFile::open(dir.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    let tok = Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{rel}: {e}"));
    Some((file, tok))
}

fn template(rel: &str) -> Option<ChatTemplate> {
    let (file, tok) = load(rel)?;
    let t = ChatTemplate::from_gguf(&file, &tok).unwrap_or_else(|e| panic!("{rel}: {e}"));
    Some(t)
}

fn one() -> Vec<Message> {
    vec![Message::user("Hi")]
}

fn multi() -> Vec<Message> {
    vec![
        Message::system("You are terse."),
        Message::user("Hi there "),
        Message::assistant(" Hello! How can I help?"),
        Message::user("Tell me a joke."),
    ]
}

/// Checks one template against (conversation, add_generation_prompt, expected) cases.
fn check(rel: &str, cases: &[(&[Message], bool, &str)]) {
    let Some(t) = template(rel) else { return };
    assert!(!t.is_fallback(), "{rel}: has its own template");
    for (i, (msgs, agp, expected)) in cases.iter().enumerate() {
        let got = t
            .render(msgs, *agp)
            .unwrap_or_else(|e| panic!("{rel}[{i}]: {e}"));
        assert_eq!(got, *expected, "{rel} case {i}");
    }
}

#[test]
fn qwen2_templates() {
    for rel in [
        "tokenizer/ggml-vocab-qwen2.gguf",
        "tokenizer/ggml-vocab-qwen35.gguf",
    ] {
        check(rel, &[
            (&one(), true, "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
            (&one(), false, "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"),
            (&multi(), true, "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there <|im_end|>\n<|im_start|>assistant\n Hello! How can I help?<|im_end|>\n<|im_start|>user\nTell me a joke.<|im_end|>\n<|im_start|>assistant\n"),
        ]);
    }
}

#[test]
fn phi3_template() {
    check("tokenizer/ggml-vocab-phi-3.gguf", &[
        (&one(), true, "<s><|user|>\nHi<|end|>\n<|assistant|>\n"),
        (&multi(), false, "<s><|user|>\nHi there <|end|>\n<|assistant|>\n Hello! How can I help?<|end|>\n<|user|>\nTell me a joke.<|end|>\n<|assistant|>\n"),
    ]);
}

#[test]
fn command_r_template() {
    check("tokenizer/ggml-vocab-command-r.gguf", &[
        (&one(), true, "<BOS_TOKEN><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
        (&one(), false, "<BOS_TOKEN><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi<|END_OF_TURN_TOKEN|>"),
        (&multi(), true, "<BOS_TOKEN><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are terse.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hello! How can I help?<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Tell me a joke.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
    ]);
}

#[test]
fn command_r_raise_exception() {
    let Some(t) = template("tokenizer/ggml-vocab-command-r.gguf") else {
        return;
    };
    let msgs = [Message::user("a"), Message::user("b")];
    let err = t.render(&msgs, true).unwrap_err();
    assert!(matches!(err, ChatError::Render(_)), "{err}");
    assert!(
        err.to_string()
            .contains("Conversation roles must alternate user/assistant/user/assistant/..."),
        "{err}"
    );
}

#[test]
fn command_r_tool_use_template() {
    let Some((file, tok)) = load("tokenizer/ggml-vocab-command-r.gguf") else {
        return;
    };
    let t = ChatTemplate::from_gguf_named(&file, &tok, "tool_use").unwrap();
    let tools = r#"[{"name": "internet_search", "description": "Returns a list of relevant document snippets for a textual query retrieved from the internet", "parameter_definitions": {"query": {"description": "Query to search the internet with", "type": "str", "required": true}}}, {"name": "directly_answer", "description": "Calls a standard (un-augmented) AI chatbot to generate a response given the conversation history", "parameter_definitions": {}}]"#;
    let options = RenderOptions {
        add_generation_prompt: true,
        tools: Some(serde_json::from_str(tools).unwrap()),
        ..RenderOptions::default()
    };
    let got = t
        .render_with(&[Message::user("Whats the biggest penguin?")], &options)
        .unwrap();
    assert_eq!(got, COMMAND_R_TOOL_USE_EXPECTED);
    let err = ChatTemplate::from_gguf_named(&file, &tok, "nope").unwrap_err();
    assert!(matches!(err, ChatError::NoSuchTemplate(_)), "{err}");
}

#[test]
fn gemma4_template() {
    check("tokenizer/ggml-vocab-gemma-4.gguf", &[
        (&one(), true, "<bos><|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"),
        (&one(), false, "<bos><|turn>user\nHi<turn|>\n"),
        (&multi(), true, "<bos><|turn>system\nYou are terse.<turn|>\n<|turn>user\nHi there<turn|>\n<|turn>model\nHello! How can I help?<turn|>\n<|turn>user\nTell me a joke.<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"),
    ]);
}

#[test]
fn gemma4_tools_and_thinking() {
    let Some(t) = template("tokenizer/ggml-vocab-gemma-4.gguf") else {
        return;
    };
    let tools = r#"[{"type": "function", "function": {"name": "get_weather", "description": "Get the weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}, "unit": {"type": "string", "enum": ["c", "f"]}, "days": {"type": "integer", "description": "Days ahead"}}, "required": ["city"]}}}]"#;
    let mut options = RenderOptions {
        add_generation_prompt: true,
        tools: Some(serde_json::from_str(tools).unwrap()),
        ..RenderOptions::default()
    };
    options
        .extra
        .insert("enable_thinking".into(), serde_json::Value::Bool(true));
    let msgs = [
        Message::system("Be helpful."),
        Message::user("Weather in Paris?"),
    ];
    assert_eq!(
        t.render_with(&msgs, &options).unwrap(),
        GEMMA4_TOOLS_EXPECTED
    );
}

#[test]
fn gguf_without_template_falls_back_to_chatml() {
    for rel in ["tokenizer/ggml-vocab-llama-spm.gguf", "arch/qwen2.gguf"] {
        let Some(t) = template(rel) else { return };
        assert!(t.is_fallback(), "{rel}");
        assert_eq!(
            t.render(&one(), true).unwrap(),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
            "{rel}"
        );
    }
}

#[test]
fn bos_and_eos_texts_come_from_the_vocabulary() {
    let Some(t) = template("tokenizer/ggml-vocab-llama-spm.gguf") else {
        return;
    };
    assert_eq!((t.bos_token(), t.eos_token()), ("<s>", "</s>"));
    let Some(t) = template("tokenizer/ggml-vocab-gemma-4.gguf") else {
        return;
    };
    assert_eq!(t.bos_token(), "<bos>");
    let rendered = t.render(&one(), true).unwrap();
    assert!(t
        .strip_special(&rendered, true, false)
        .starts_with("<|turn>user"));
}

/// Python jinja2's rendering of the Gemma 4 template with tools and `enable_thinking`.
const GEMMA4_TOOLS_EXPECTED: &str = r#"<bos><|turn>system
<|think|>Be helpful.<|tool>declaration:get_weather{description:<|"|>Get the weather<|"|>,parameters:{properties:{city:{description:<|"|>City name<|"|>,type:<|"|>STRING<|"|>},days:{description:<|"|>Days ahead<|"|>,type:<|"|>INTEGER<|"|>},unit:{enum:[<|"|>c<|"|>,<|"|>f<|"|>],type:<|"|>STRING<|"|>}},required:[<|"|>city<|"|>],type:<|"|>OBJECT<|"|>}}<tool|><turn|>
<|turn>user
Weather in Paris?<turn|>
<|turn>model
"#;

/// Python jinja2's rendering of Command-R's `tool_use` template.
const COMMAND_R_TOOL_USE_EXPECTED: &str = r#"<BOS_TOKEN><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|># Safety Preamble
The instructions in this section override those in the task description and style guide sections. Don't answer questions that are harmful or immoral.

# System Preamble
## Basic Rules
You are a powerful conversational AI trained by Cohere to help people. You are augmented by a number of tools, and your job is to use and consume the output of these tools to best help the user. You will see a conversation history between yourself and a user, ending with an utterance from the user. You will then see a specific instruction instructing you what kind of response to generate. When you answer the user's requests, you cite your sources in your answers, according to those instructions.

# User Preamble
## Task and Context
You help people answer their questions and other requests interactively. You will be asked a very wide array of requests on all kinds of topics. You will be equipped with a wide range of search engines or similar tools to help you, which you use to research your answer. You should focus on serving the user's needs as best you can, which will be wide-ranging.

## Style Guide
Unless the user asks for a different style of answer, you should answer in full sentences, using proper grammar and spelling.

## Available Tools
Here is a list of tools that you have available to you:

```python
def internet_search(query: str) -> List[Dict]:
    """Returns a list of relevant document snippets for a textual query retrieved from the internet

    Args:
        query (str): Query to search the internet with
    """
    pass
```

```python
def directly_answer() -> List[Dict]:
    """Calls a standard (un-augmented) AI chatbot to generate a response given the conversation history
    """
    pass
```<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Whats the biggest penguin?<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Write 'Action:' followed by a json-formatted list of actions that you want to perform in order to produce a good response to the user's last input. You can use any of the supplied tools any number of times, but you should aim to execute the minimum number of necessary actions for the input. You should use the `directly-answer` tool if calling the other tools is unnecessary. The list of actions you want to call should be formatted as a list of json objects, for example:
```json
[
    {
        "tool_name": title of the tool in the specification,
        "parameters": a dict of parameters to input into the tool as they are defined in the specs, or {} if it takes no parameters
    }
]```<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"#;
