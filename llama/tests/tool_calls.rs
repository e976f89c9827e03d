//! Tool-call parsing per template family: replies in each family's syntax (Qwen/Hermes, Llama 3,
//! gpt-oss harmony, Gemma 4) split into content and calls, malformed calls left as content, the
//! family detected from template text, and a round trip through the real Qwen2.5 chat template
//! (an assistant turn with tool calls rendered by the model's template, then parsed back).

#[path = "logits_util.rs"]
mod util;

use ggml_core::gguf::GgufFile;
use llama::chat::{template_source, ChatTemplate, Message, RenderOptions};
use llama::tool_calls::{ToolCall, ToolFormat};
use serde_json::{json, Value};

fn call(name: &str, args: Value) -> ToolCall {
    ToolCall {
        name: name.into(),
        arguments: args.to_string(),
    }
}

#[test]
fn hermes_calls_and_content() {
    let reply = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \
                 {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"time\", \
                 \"arguments\": {}}\n</tool_call>";
    let p = ToolFormat::Hermes.parse(reply);
    assert_eq!(p.content, "Let me check.");
    assert_eq!(
        p.calls,
        vec![
            call("get_weather", json!({"city": "Paris", "days": 2})),
            call("time", json!({}))
        ]
    );
    // Broken JSON stays text; a reply cut before `</tool_call>` still gives its whole call.
    let broken = ToolFormat::Hermes.parse("<tool_call>\n{\"name\": \"f\", \"argu</tool_call>");
    assert!(broken.calls.is_empty());
    assert!(broken.content.contains("argu"));
    let cut = ToolFormat::Hermes.parse("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}");
    assert_eq!(cut.calls, vec![call("f", json!({"a": 1}))]);
    assert_eq!(
        ToolFormat::Hermes.parse("plain answer").content,
        "plain answer"
    );
}

#[test]
fn llama3_calls() {
    let p = ToolFormat::Llama3.parse(
        "<|python_tag|>{\"type\": \"function\", \"name\": \"search\", \"parameters\": {\"q\": \"rust\"}}",
    );
    assert_eq!(p.calls, vec![call("search", json!({"q": "rust"}))]);
    assert_eq!(p.content, "");
    let two = ToolFormat::Llama3.parse(
        "{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {}}",
    );
    assert_eq!(
        two.calls,
        vec![call("a", json!({"x": 1})), call("b", json!({}))]
    );
    // Arguments given as a JSON string are accepted.
    let s = ToolFormat::Llama3.parse("{\"name\": \"a\", \"arguments\": \"{\\\"x\\\": 2}\"}");
    assert_eq!(s.calls, vec![call("a", json!({"x": 2}))]);
    // Prose, or JSON followed by prose, is content.
    for text in [
        "The answer is 4.",
        "{\"name\": \"a\", \"parameters\": {}} and more",
    ] {
        let p = ToolFormat::Llama3.parse(text);
        assert!(p.calls.is_empty(), "{text}");
        assert_eq!(p.content, text);
    }
}

#[test]
fn harmony_calls_reasoning_and_final() {
    let reply = "<|channel|>analysis<|message|>The user wants weather.<|end|><|start|>assistant\
                 <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>\
                 {\"city\":\"Oslo\"}<|call|>";
    let p = ToolFormat::Harmony.parse(reply);
    assert_eq!(p.calls, vec![call("get_weather", json!({"city": "Oslo"}))]);
    assert_eq!(p.content, "");
    // The recipient before the channel; a final answer is the content, the analysis is not.
    let p = ToolFormat::Harmony.parse(
        "<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{\"id\": 7}<|call|>",
    );
    assert_eq!(p.calls, vec![call("lookup", json!({"id": 7}))]);
    let p = ToolFormat::Harmony.parse(
        "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>Hi there<|return|>",
    );
    assert!(p.calls.is_empty());
    assert_eq!(p.content, "Hi there");
}

#[test]
fn gemma4_calls() {
    let reply = "Sure.<|tool_call>call:get_weather{city:<|\"|>New York, NY<|\"|>,days:3,\
                 metric:true,tags:[<|\"|>a<|\"|>,2.5],opt:{deep:null}}<tool_call|>";
    let p = ToolFormat::Gemma4.parse(reply);
    assert_eq!(p.content, "Sure.");
    assert_eq!(
        p.calls,
        vec![call(
            "get_weather",
            json!({"city": "New York, NY", "days": 3, "metric": true, "tags": ["a", 2.5],
                "opt": {"deep": null}})
        )]
    );
    let empty = ToolFormat::Gemma4.parse("<|tool_call>call:now{}<tool_call|>");
    assert_eq!(empty.calls, vec![call("now", json!({}))]);
    let broken = ToolFormat::Gemma4.parse("<|tool_call>call:f{a:<tool_call|>");
    assert!(broken.calls.is_empty());
}

#[test]
fn families_are_detected_from_templates() {
    let cases = [
        (
            "{{ '<|start|>assistant<|channel|>final<|message|>' }}",
            Some(ToolFormat::Harmony),
        ),
        (
            "{% if tools %}<|tool_call>call:{% endif %}",
            Some(ToolFormat::Gemma4),
        ),
        (
            "{% if tools %}<tool_call>{% endif %}",
            Some(ToolFormat::Hermes),
        ),
        (
            "<|start_header_id|>ipython{% if tools %}{% endif %}",
            Some(ToolFormat::Llama3),
        ),
        ("<|im_start|>{{ m.content }}", None),
    ];
    for (t, want) in cases {
        assert_eq!(ToolFormat::detect(t), want, "{t}");
    }
}

/// The real Qwen2.5 template renders an assistant turn with tool calls; the Hermes parser reads
/// them back from the rendered turn, and the tools appear in the system prompt.
#[test]
fn qwen25_template_round_trip() {
    let Some(path) = util::model_file("qwen2.5-coder-0.5b-instruct.gguf") else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let source = template_source(&file, None).unwrap().unwrap();
    assert_eq!(ToolFormat::detect(source), Some(ToolFormat::Hermes));
    let template = ChatTemplate::new(source, "", "<|im_end|>").unwrap();
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let mut assistant = Message::assistant("");
    assistant.tool_calls = Some(json!([{"id": "c1", "type": "function", "function":
        {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}}]));
    let mut tool = Message::new("tool", "{\"temp\": 21}");
    tool.tool_call_id = Some("c1".into());
    let messages = [Message::user("Weather in Paris?"), assistant, tool];
    let options = RenderOptions {
        add_generation_prompt: true,
        tools: Some(tools),
        ..RenderOptions::default()
    };
    let rendered = template.render_with(&messages, &options).unwrap();
    assert!(rendered.contains("\"name\": \"get_weather\""));
    assert!(rendered.contains("<tool_response>\n{\"temp\": 21}\n</tool_response>"));
    let turn_start = rendered.find("<|im_start|>assistant").unwrap();
    let turn = &rendered[turn_start + "<|im_start|>assistant".len()..];
    let turn = &turn[..turn.find("<|im_end|>").unwrap()];
    let p = ToolFormat::Hermes.parse(turn);
    assert_eq!(
        p.calls,
        vec![call("get_weather", json!({"city": "Paris", "unit": "C"}))]
    );
    assert_eq!(p.content, "");
}
