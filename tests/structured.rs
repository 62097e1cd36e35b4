//! Constrained decoding on the GPU with the tiny fixtures: answers under a JSON schema always
//! parse and validate (random weights, sampled at temperature 1, several seeds), GBNF grammars
//! hold, a grammar the engine cannot compile is the request's error, and a forced tool call
//! comes out in each family's own syntax through its published chat template and reads back
//! as the call.

mod common;

#[path = "support/temp_dir.rs"]
mod temp_dir;

use backpack_engine::grammar::{Constraint, GrammarError};
use backpack_engine::load::ChatMessage;
use backpack_engine::models::tool_calls::ToolFormat;
use backpack_engine::models::{GenerateParams, Prompt, StopReason, TextModel};
use backpack_engine::ops::{SamplerParams, WeightDType};
use common::goldens::{fixtures, load, load_path};
use serde_json::{Value, json};

fn sampled(seed: u64, max_tokens: u32, constraint: Constraint) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampler: SamplerParams {
            temperature: 1.0,
            seed,
            ..Default::default()
        },
        constraint: Some(constraint),
        ..Default::default()
    }
}

fn answer(m: &mut TextModel, prompt: &Prompt, params: &GenerateParams) -> (String, StopReason) {
    let stats = m
        .generate(prompt, params, &|| false, |_, _| {})
        .unwrap_or_else(|e| panic!("generate: {e}"));
    (stats.text, stats.stop)
}

/// The schema keywords the test schema uses, checked by hand.
fn validate(schema: &Value, v: &Value, at: &str) -> Result<(), String> {
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(v)
    {
        return Err(format!("{at}: {v} is not one of {options:?}"));
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => {
            let o = v.as_object().ok_or(format!("{at}: not an object"))?;
            let props = schema["properties"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            for r in schema["required"].as_array().into_iter().flatten() {
                let key = r.as_str().unwrap_or_default();
                if !o.contains_key(key) {
                    return Err(format!("{at}: {key} is missing"));
                }
            }
            for (k, item) in o {
                match props.get(k) {
                    Some(s) => validate(s, item, &format!("{at}.{k}"))?,
                    None if schema["additionalProperties"] == json!(false) => {
                        return Err(format!("{at}: {k} is not allowed"));
                    }
                    None => {}
                }
            }
        }
        Some("array") => {
            let a = v.as_array().ok_or(format!("{at}: not an array"))?;
            if let Some(max) = schema["maxItems"].as_u64()
                && a.len() as u64 > max
            {
                return Err(format!("{at}: {} items", a.len()));
            }
            for (i, item) in a.iter().enumerate() {
                validate(&schema["items"], item, &format!("{at}[{i}]"))?;
            }
        }
        Some("string") => {
            let s = v.as_str().ok_or(format!("{at}: not a string"))?;
            if let Some(max) = schema["maxLength"].as_u64()
                && s.chars().count() as u64 > max
            {
                return Err(format!("{at}: {} characters", s.chars().count()));
            }
        }
        Some("integer") => {
            let n = v.as_i64().ok_or(format!("{at}: not an integer"))?;
            let min = schema["minimum"].as_i64().unwrap_or(i64::MIN);
            let max = schema["maximum"].as_i64().unwrap_or(i64::MAX);
            if !(min..=max).contains(&n) {
                return Err(format!("{at}: {n} out of range"));
            }
        }
        Some("boolean") if !v.is_boolean() => return Err(format!("{at}: not a boolean")),
        _ => {}
    }
    Ok(())
}

#[test]
fn json_schema_answers_always_parse_and_validate() {
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 10},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
            "home": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"}},
                "required": ["city", "ok"],
                "additionalProperties": false
            }
        },
        "required": ["name", "age", "tags", "home"],
        "additionalProperties": false
    });
    for name in ["tiny-qwen2", "tiny-gpt-oss"] {
        let mut m = load(name, WeightDType::F32);
        let prompt = Prompt::Chat(vec![ChatMessage::new("user", "Describe someone.")]);
        let mut complete = 0;
        for seed in 0..6 {
            let constraint = Constraint::JsonSchema {
                schema: schema.clone(),
                strict: true,
            };
            let (text, stop) = answer(&mut m, &prompt, &sampled(seed, 200, constraint));
            // Random weights may run out of tokens first (in GPT-OSS's analysis message, or in
            // the whitespace JSON allows between tokens): what came is then cut short, not
            // wrong.
            if stop != StopReason::EndOfText {
                assert!(
                    matches!(stop, StopReason::MaxTokens | StopReason::ContextFull),
                    "{text:?}"
                );
                continue;
            }
            assert_eq!(stop, StopReason::EndOfText, "{name} seed {seed}: {text:?}");
            complete += 1;
            // A harmony model's analysis comes first, between <think> tags.
            let reply = text.rsplit("</think>").next().unwrap_or(&text).trim();
            let value: Value = serde_json::from_str(reply)
                .unwrap_or_else(|e| panic!("{name} seed {seed}: {e}: {reply:?}"));
            validate(&schema, &value, "$").unwrap_or_else(|e| panic!("{name} seed {seed}: {e}"));
        }
        assert!(complete >= 2, "{name}: {complete} answers completed");
    }
    // Any object, for json_object.
    let mut m = load("tiny-qwen2", WeightDType::F32);
    let (text, _) = answer(
        &mut m,
        &Prompt::Raw("{".into()),
        &sampled(7, 300, Constraint::JsonObject),
    );
    if let Ok(v) = serde_json::from_str::<Value>(&text) {
        assert!(v.is_object(), "{text}");
    }
}

#[test]
fn gbnf_grammars_hold_and_bad_ones_are_the_requests_error() {
    let mut m = load("tiny-qwen2", WeightDType::F32);
    let prompt = Prompt::Raw("Answer:".into());
    let gbnf = "root ::= verdict \", \" [0-9]{2} \".\"\nverdict ::= \"yes\" | \"no\"\n";
    for seed in 0..4 {
        let (text, stop) = answer(
            &mut m,
            &prompt,
            &sampled(seed, 40, Constraint::Gbnf(gbnf.into())),
        );
        assert_eq!(stop, StopReason::EndOfText, "{text:?}");
        let (verdict, rest) = text.split_once(", ").unwrap_or_else(|| panic!("{text:?}"));
        assert!(["yes", "no"].contains(&verdict), "{text:?}");
        assert!(
            rest.len() == 3 && rest.ends_with('.') && rest[..2].bytes().all(|b| b.is_ascii_digit()),
            "{text:?}"
        );
    }
    for bad in [
        Constraint::Gbnf("root ::= missing\n".into()),
        Constraint::Lark("start: (".into()),
        Constraint::JsonSchema {
            schema: json!({"type": "object", "dependentSchemas": {"a": {}}}),
            strict: true,
        },
    ] {
        let e = m
            .generate(&prompt, &sampled(0, 8, bad.clone()), &|| false, |_, _| {})
            .expect_err("refused");
        assert!(
            matches!(e, backpack_engine::Error::Grammar(GrammarError::Invalid(_))),
            "{bad:?}: {e}"
        );
    }
    // After a refusal and a constrained answer, a free one runs as before.
    let free = GenerateParams {
        max_tokens: 6,
        ..Default::default()
    };
    let stats = m
        .generate(&prompt, &free, &|| false, |_, _| {})
        .expect("free");
    assert_eq!(stats.tokens.len(), 6);
}

/// A fixture's weights and tokenizer with room for long prompts, and a published chat template
/// where one is given.
fn with_template(dir: &std::path::Path, fixture: &str, template: Option<&str>) {
    let source = fixtures().join("models").join(fixture);
    for entry in std::fs::read_dir(&source).expect("fixture") {
        let path = entry.expect("entry").path();
        let name = path.file_name().expect("name");
        if name != "tokenizer_config.json" && name != "chat_template.jinja" && name != "config.json"
        {
            std::fs::copy(&path, dir.join(name)).expect("copy");
        }
    }
    // The published templates' prompts with tools outgrow the fixture's 256 positions; its
    // random weights read any position alike.
    let model = std::fs::read_to_string(source.join("config.json")).expect("config");
    let mut model: Value = serde_json::from_str(&model).expect("json");
    model["max_position_embeddings"] = 2048.into();
    std::fs::write(dir.join("config.json"), model.to_string()).expect("write");
    let config = std::fs::read_to_string(source.join("tokenizer_config.json")).expect("config");
    let mut config: Value = serde_json::from_str(&config).expect("json");
    if let Some(template) = template {
        config["chat_template"] = template.into();
    }
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).expect("write");
}

#[test]
fn forced_tool_calls_come_out_in_each_familys_syntax() {
    let tools = vec![json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "Weather now",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Tokyo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"],
            "additionalProperties": false
        }
    }})];
    let conformance = fixtures().join("../conformance/models");
    for (dir, format) in [
        ("Qwen--Qwen2.5-7B-Instruct", ToolFormat::Hermes),
        ("meta-llama--Llama-3.1-8B-Instruct", ToolFormat::Llama3),
        ("mistralai--Mistral-Nemo-Instruct-2407", ToolFormat::Mistral),
    ] {
        let template =
            std::fs::read_to_string(conformance.join(dir).join("chat_template.jinja")).expect(dir);
        let folder = temp_dir::TempDir::new("tool-template");
        with_template(&folder, "tiny-qwen2", Some(&template));
        let mut m = load_path(&folder, WeightDType::F32);
        assert_eq!(m.info().tool_format, format, "{dir}");
        let prompt = Prompt::Chat(vec![ChatMessage::new("user", "Weather in Paris?")]);
        for (seed, function) in [(1, Some("get_weather")), (2, None)] {
            let mut params = sampled(
                seed,
                120,
                Constraint::ToolCall {
                    function: function.map(str::to_owned),
                    parallel: false,
                },
            );
            params.tools = tools.clone();
            let (text, stop) = answer(&mut m, &prompt, &params);
            assert_eq!(stop, StopReason::EndOfText, "{dir}: {text:?}");
            let (content, calls) = format.parse(&text, &tools);
            assert_eq!(calls.len(), 1, "{dir}: {text:?}");
            assert_eq!(calls[0].name, "get_weather", "{dir}");
            validate(
                &tools[0]["function"]["parameters"],
                &calls[0].arguments,
                dir,
            )
            .unwrap_or_else(|e| panic!("{dir}: {e}: {text:?}"));
            assert!(content.trim().is_empty(), "{dir}: {content:?}");
        }
    }
    // GPT-OSS: the call goes to the commentary channel and comes back as `<tool_call>` JSON.
    // Its analysis message comes first where the sampled tokens open one.
    let folder = temp_dir::TempDir::new("tool-gpt-oss");
    with_template(&folder, "tiny-gpt-oss", None);
    let mut m = load_path(&folder, WeightDType::F32);
    let prompt = Prompt::Chat(vec![ChatMessage::new("user", "Weather in Paris?")]);
    let mut complete = 0;
    for seed in 0..6 {
        let mut params = sampled(
            seed,
            120,
            Constraint::ToolCall {
                function: None,
                parallel: false,
            },
        );
        params.tools = tools.clone();
        let (text, stop) = answer(&mut m, &prompt, &params);
        if stop != StopReason::EndOfText {
            let reply = text.rsplit("</think>").next().unwrap_or_default();
            assert!(
                text.starts_with("<think>") && reply.trim().is_empty(),
                "{text:?}"
            );
            continue;
        }
        complete += 1;
        let reply = text.rsplit("</think>").next().unwrap_or(&text);
        let (_, calls) = ToolFormat::Hermes.parse(reply, &tools);
        assert_eq!(calls.len(), 1, "{text:?}");
        validate(
            &tools[0]["function"]["parameters"],
            &calls[0].arguments,
            "gpt-oss",
        )
        .unwrap_or_else(|e| panic!("{e}: {text:?}"));
    }
    assert!(complete >= 2, "gpt-oss: {complete} calls completed");
}
