//! The chat crate's contract beyond matching jinja2: the ChatML fallback,
//! reading the template from GGUF metadata, and errors (never panics) for
//! broken, refusing or hostile templates.

use chat::{ChatTemplate, Error, Message, CHATML_TEMPLATE, CHAT_TEMPLATE_KEY};
use gguf::{Metadata, Value};

fn conversation() -> Vec<Message> {
    vec![
        Message::system("Be brief."),
        Message::user("Hi"),
        Message::assistant("Hello!"),
        Message::user("Bye"),
    ]
}

#[test]
fn fallback_is_chatml() {
    let template = ChatTemplate::or_fallback(None, Some("<s>"), Some("</s>")).unwrap();
    assert!(template.is_fallback());
    let chatml = "<|im_start|>system\nBe brief.<|im_end|>\n\
                  <|im_start|>user\nHi<|im_end|>\n\
                  <|im_start|>assistant\nHello!<|im_end|>\n\
                  <|im_start|>user\nBye<|im_end|>\n";
    assert_eq!(template.render(&conversation(), false).unwrap(), chatml);
    assert_eq!(
        template.render(&conversation(), true).unwrap(),
        format!("{chatml}<|im_start|>assistant\n")
    );
    assert_eq!(
        template.render(&[], true).unwrap(),
        "<|im_start|>assistant\n"
    );
}

#[test]
fn gguf_without_template_falls_back() {
    let template = ChatTemplate::from_gguf(&Metadata::new(), None, None).unwrap();
    assert!(template.is_fallback());

    let mut md = Metadata::new();
    md.set(CHAT_TEMPLATE_KEY, Value::String(" \n".into()));
    let template = ChatTemplate::from_gguf(&md, None, None).unwrap();
    assert!(template.is_fallback(), "a blank template counts as none");
}

/// Gemma 3 270M ships without a template: a Gemma file gets Gemma's turn
/// format (a system message opens the first user turn), checked against
/// the rendering of Google's gemma-2 template where they overlap.
#[test]
fn gemma_without_template_gets_gemma_turns() {
    let mut md = Metadata::new();
    md.set("general.architecture", Value::String("gemma3".into()));
    let template = ChatTemplate::from_gguf(&md, Some("<bos>"), Some("<eos>")).unwrap();
    assert_eq!(template.fallback_kind(), Some(chat::Fallback::Gemma));
    assert!(template.fallback_notice().unwrap().contains("Gemma"));
    assert_eq!(
        template.render(&conversation(), true).unwrap(),
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n\
         <start_of_turn>model\nHello!<end_of_turn>\n\
         <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    );
    let no_system = &conversation()[1..];
    let gemma2 = ChatTemplate::new(
        include_str!("fixtures/templates/google-gemma-2-2b-it.jinja"),
        Some("<bos>"),
        Some("<eos>"),
    )
    .unwrap();
    assert_eq!(
        template.render(no_system, true).unwrap(),
        gemma2.render(no_system, true).unwrap()
    );
    let e = template
        .render(&[Message::user("a"), Message::user("b")], true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("alternate"), "{e}");
    md.set("general.architecture", Value::String("llama".into()));
    let template = ChatTemplate::from_gguf(&md, None, None).unwrap();
    assert_eq!(template.fallback_kind(), Some(chat::Fallback::ChatMl));
}

#[test]
fn gguf_template_is_used_with_its_tokens() {
    let mut md = Metadata::new();
    md.set(
        CHAT_TEMPLATE_KEY,
        Value::String(
            "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}"
                .into(),
        ),
    );
    let template = ChatTemplate::from_gguf(&md, Some("<s>"), Some("</s>")).unwrap();
    assert!(!template.is_fallback());
    assert_eq!(
        template.render(&[Message::user("x")], false).unwrap(),
        "<s>x</s>"
    );
}

#[test]
fn gguf_template_of_wrong_type_is_an_error() {
    let mut md = Metadata::new();
    md.set(CHAT_TEMPLATE_KEY, Value::U32(7));
    let err = ChatTemplate::from_gguf(&md, None, None).unwrap_err();
    assert!(matches!(err, Error::Metadata(_)), "{err:?}");
    assert!(err.to_string().contains(CHAT_TEMPLATE_KEY), "{err}");
}

/// The fixture copy of SmolLM2's template is the one in the real GGUF, and
/// bos/eos come out of its vocabulary as render.py assumes.
#[test]
fn real_smollm2_template_renders_like_the_fixture() {
    let Some(path) = testkit::model(testkit::SMOLLM2_Q4_1) else {
        return;
    };
    let file = gguf::GgufFile::open(&path).unwrap();
    let vocab = tokenize::Vocab::from_gguf(file.metadata()).unwrap();
    let bos = vocab.bos().and_then(|id| vocab.token_text(id));
    let eos = vocab.eos().and_then(|id| vocab.token_text(id));
    assert_eq!((bos, eos), (Some("<|im_start|>"), Some("<|im_end|>")));
    let from_model = ChatTemplate::from_gguf(file.metadata(), bos, eos).unwrap();
    assert!(!from_model.is_fallback());

    let fixture = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/templates/HuggingFaceTB-SmolLM2-135M-Instruct.jinja"
    ))
    .unwrap();
    assert_eq!(file.metadata().get_str(CHAT_TEMPLATE_KEY).unwrap(), fixture);
    let prompt = from_model.render(&conversation()[1..], true).unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n\
         <|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn fallback_source_is_the_documented_chatml() {
    assert!(CHATML_TEMPLATE.contains("<|im_start|>"));
    assert!(chat::FALLBACK_NOTICE.contains("ChatML"));
}

#[test]
fn syntax_errors_name_the_line() {
    let cases = [
        ("{% for m in messages %}\n{{ m.content }}\n", "unclosed for"),
        ("ok\n{{ messages[0] \n", "unclosed variable"),
        ("\n\n{% if %}{% endif %}", "if without condition"),
        ("{{ 'x' | no_such_filter }}", "unknown filter"),
    ];
    for (source, what) in cases {
        match ChatTemplate::new(source, None, None) {
            Err(err @ Error::Syntax { line: Some(_), .. }) => {
                assert!(err.to_string().contains("at line"), "{what}: {err}")
            }
            // minijinja resolves filters at render time, jinja2 at compile
            // time: either way an error, never a panic.
            Ok(template) => {
                let err = template.render(&[Message::user("x")], false).unwrap_err();
                assert!(
                    matches!(err, Error::Render { line: Some(1), .. }),
                    "{what}: {err:?}"
                );
            }
            Err(err) => panic!("{what}: {err:?}"),
        }
    }
}

#[test]
fn raise_exception_carries_the_templates_message() {
    let source = "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}ok";
    let template = ChatTemplate::new(source, None, None).unwrap();
    assert_eq!(template.render(&[Message::user("x")], true).unwrap(), "ok");
    let err = template.render(&conversation(), true).unwrap_err();
    match &err {
        Error::Raised { message } => assert_eq!(message, "System role not supported"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "chat template rejected the conversation: System role not supported"
    );
}

#[test]
fn render_errors_name_the_line() {
    let template =
        ChatTemplate::new("line one\n{{ messages[0].nope.deeper }}", None, None).unwrap();
    let err = template.render(&[Message::user("x")], false).unwrap_err();
    assert!(
        matches!(err, Error::Render { line: Some(2), .. }),
        "{err:?}"
    );
}

/// A template is data from the model file: runaway loops, recursion and
/// blow-ups end in an error, quickly.
#[test]
fn hostile_templates_fail_instead_of_hanging() {
    let hostile = [
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ j }}{% endfor %}{% endfor %}",
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
        "{{ 'x' * 4000000000 }}",
        // ~700k levels of nesting before the fuel runs out: minijinja drops
        // them recursively, which needs far more than a default stack.
        "{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% for j in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}{% endfor %}ok",
        "{% set ns = namespace(x=[]) %}{% for i in range(3000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x | tojson }}",
        "{% set ns = namespace(x=[]) %}{% for i in range(3000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}",
    ];
    for source in hostile {
        let start = std::time::Instant::now();
        let template = ChatTemplate::new(source, None, None).unwrap();
        let result = template.render(&[Message::user("x")], false);
        assert!(
            matches!(result, Err(Error::Render { .. })),
            "{source}: {:?}",
            result.map(|s| s.len())
        );
        assert!(
            start.elapsed().as_secs() < 20,
            "{source} took {:?}",
            start.elapsed()
        );
    }
}

/// Within its fuel, a template that writes a 1 KiB message 52,700 times
/// (63 MB, which then took minutes to tokenize; found by the fuzz target)
/// is refused: a render writes at most 1 MiB plus 4× the conversation.
#[test]
fn templates_that_repeat_their_input_are_capped() {
    let source = "{% for i in range(527) %}{% for j in range(100) %}{{ messages[0].content }}{% endfor %}{% endfor %}";
    let template = ChatTemplate::new(source, None, None).unwrap();
    let long = "x".repeat(1200);
    match template.render(&[Message::user(&long)], false) {
        Err(Error::Render { line: None, detail }) => {
            assert!(detail.contains("repeats its input"), "{detail}")
        }
        other => panic!("{:?}", other.map(|s| s.len())),
    }
    // Writing each message once is far inside the cap, however long.
    let source = "{% for m in messages %}{{ m.content }}{% endfor %}";
    let once = ChatTemplate::new(source, None, None).unwrap();
    let big = "y".repeat(3 << 20);
    let rendered = once.render(&[Message::user(&big)], false).unwrap();
    assert_eq!(rendered.len(), 3 << 20);
}

#[test]
fn reserved_variables_cannot_be_overridden() {
    let template = ChatTemplate::or_fallback(None, None, None).unwrap();
    let mut extra = serde_json::Map::new();
    extra.insert("messages".into(), serde_json::json!([]));
    let err = template.render_with(&[], true, &extra).unwrap_err();
    assert!(
        matches!(err, Error::ReservedVariable(ref v) if v == "messages"),
        "{err:?}"
    );
}

#[test]
fn missing_special_tokens_are_undefined() {
    let source = "{{ bos_token is defined }} {{ eos_token is defined }} [{{ bos_token }}]";
    let template = ChatTemplate::new(source, None, Some("</s>")).unwrap();
    assert_eq!(template.render(&[], false).unwrap(), "False True []");
}

#[test]
fn strftime_now_reads_the_clock_unless_pinned() {
    let source = "{{ strftime_now('%Y-%m-%d') }}";
    let live = ChatTemplate::new(source, None, None).unwrap();
    let today = live.render(&[], false).unwrap();
    assert_eq!(today.len(), 10, "{today}");

    let pinned = live.with_now(chat::DateTime::new(2024, 7, 26, 9, 0, 0, 0).unwrap());
    assert_eq!(pinned.render(&[], false).unwrap(), "2024-07-26");

    let bad = ChatTemplate::new("{{ strftime_now('%Q') }}", None, None).unwrap();
    assert!(matches!(bad.render(&[], false), Err(Error::Render { .. })));
}

/// The work budget that stops hostile templates leaves room for real
/// conversations far longer than any context window.
#[test]
fn long_conversations_fit_the_work_budget() {
    let source = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/templates/meta-llama-Llama-3.2-3B-Instruct.jinja"
    ))
    .unwrap();
    let template =
        ChatTemplate::new(&source, Some("<|begin_of_text|>"), Some("<|eot_id|>")).unwrap();
    let turn = "word ".repeat(200);
    let messages: Vec<Message> = (0..4000)
        .map(|i| {
            if i % 2 == 0 {
                Message::user(&turn)
            } else {
                Message::assistant(&turn)
            }
        })
        .collect();
    let prompt = template.render(&messages, true).unwrap();
    assert!(prompt.len() > 4000 * 1000, "{}", prompt.len());
}

/// Deeply nested syntax is refused by the parser, not a stack overflow.
#[test]
fn deeply_nested_source_is_a_syntax_error() {
    let n = 100_000;
    let sources = [
        format!("{{{{ {}1{} }}}}", "(".repeat(n), ")".repeat(n)),
        format!("{{{{ {}1{} }}}}", "[".repeat(n), "]".repeat(n)),
        format!("{}x{}", "{% if true %}".repeat(n), "{% endif %}".repeat(n)),
    ];
    for source in sources {
        let result = ChatTemplate::new(&source, None, None);
        assert!(
            matches!(result, Err(Error::Syntax { .. })),
            "{}...: {:?}",
            &source[..20],
            result.map(|_| ())
        );
    }
}

/// The text between a reply and the next user turn, which chat stops on.
#[test]
fn turn_stop_is_what_starts_the_next_user_turn() {
    // The built-in model's Q:/A: format (crates/train/src/export.rs).
    let qa = "{% for m in messages %}\
{% if m['role'] == 'system' %}{{ m['content'] | trim }}\n\
{% elif m['role'] == 'user' %}Q: {{ m['content'] | trim }}\n\
{% else %}A: {{ m['content'] | trim }}\n{% endif %}\
{% endfor %}{% if add_generation_prompt %}A:{% endif %}";
    let template = ChatTemplate::new(qa, None, None).unwrap();
    assert_eq!(template.turn_stop().as_deref(), Some("\nQ:"));
    let chatml = ChatTemplate::or_fallback(None, None, None).unwrap();
    assert_eq!(
        chatml.turn_stop().as_deref(),
        Some("<|im_end|>\n<|im_start|>user")
    );
    // Nothing (or only whitespace) between turns: no stop string.
    for source in [
        "{% for m in messages %}{{ m['content'] }}{% endfor %}",
        "{% for m in messages %}{{ m['content'] }}\n\n{% endfor %}",
    ] {
        let t = ChatTemplate::new(source, None, None).unwrap();
        assert_eq!(t.turn_stop(), None, "{source}");
    }
    // A template that refuses the probe conversation: none, not an error.
    let strict = "{{ raise_exception('no') }}";
    assert_eq!(
        ChatTemplate::new(strict, None, None).unwrap().turn_stop(),
        None
    );
}

/// Qwen2.5-Coder-0.5B-Instruct (the tool-calling test model) carries
/// Qwen2.5's template, the fixture the tool golden cases render; its
/// tools come out in the Hermes syntax, and the calls written back into a
/// prompt are its `<tool_call>` token, not text pieces.
#[test]
fn real_qwen25_coder_template_is_the_tool_fixture() {
    let Some(path) = testkit::model(testkit::QWEN25_CODER_05B) else {
        return;
    };
    let file = gguf::GgufFile::open(&path).unwrap();
    let vocab = tokenize::Vocab::from_gguf(file.metadata()).unwrap();
    let eos = vocab.eos().and_then(|id| vocab.token_text(id));
    let template = ChatTemplate::from_gguf(file.metadata(), None, eos).unwrap();
    let fixture = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/templates/Qwen-Qwen2.5-7B-Instruct.jinja"
    ))
    .unwrap();
    assert_eq!(file.metadata().get_str(CHAT_TEMPLATE_KEY).unwrap(), fixture);
    assert_eq!(template.tool_format(), Some(chat::ToolFormat::Hermes));

    let tools = [serde_json::json!({"type": "function", "function": {"name": "get_weather"}})];
    let messages = [
        Message::user("Weather in Paris?"),
        Message::tool_calls(vec![chat::ToolCall::from_openai(
            Some("call_1".into()),
            "get_weather".into(),
            r#"{"city": "Paris"}"#,
        )]),
        Message::tool("call_1", "18 C"),
    ];
    let p = chat::tool_calls::prepare(&template, &messages, &tools);
    let prompt = chat::prompt_tokens_with(
        &template,
        &p.messages,
        true,
        &p.extra,
        &vocab,
        chat::Special::Text,
    )
    .unwrap();
    let open = vocab.token_id("<tool_call>").unwrap();
    // Two in the instructions ("within <tool_call></tool_call> XML tags",
    // the example), one the assistant's call.
    assert_eq!(prompt.tokens.iter().filter(|&&t| t == open).count(), 3);
    assert!(prompt.text.contains(
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>"
    ));
}
