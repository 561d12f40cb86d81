//! The body parse's cases: what routing reads from a body, and how a bad one is named.

use super::*;

fn chat(body: &str) -> Result<Prompt, InvalidRequest> {
    parse(Endpoint::ChatCompletions, body.as_bytes(), 4, |_| None)
}

#[test]
fn a_longer_conversation_shares_the_earlier_blocks() {
    let system = "x".repeat(200);
    let short = chat(&format!(
        r#"{{"model":"m","messages":[{{"role":"system","content":"{system}"}}]}}"#
    ))
    .unwrap();
    let long = chat(&format!(
        r#"{{"model":"m","stream":true,"max_tokens":7,"messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"hello there, router!"}}]}}"#
    ))
    .unwrap();
    assert!(long.block_hashes.len() > short.block_hashes.len());
    assert_eq!(
        long.block_hashes[..short.block_hashes.len()],
        short.block_hashes[..]
    );
    assert!(long.stream && !short.stream);
    assert_eq!(long.expected_output_tokens, Some(7));
    // "system\n" + 200 + "\n": 208 bytes, 52 pseudo-tokens, 13 blocks of 4.
    assert_eq!(short.request_blocks, 13);
}

/// The body's fields are read without a map of the body: a list is still no body (a
/// struct would read one positionally), `null` is still a value, a field given twice
/// is refused, and the fields routing does not read are skipped, however nested.
#[test]
fn the_body_is_one_object_read_field_by_field() {
    let message = |body: &str| chat(body).unwrap_err().message;
    assert_eq!(
        message(r#"["m", [{"role": "user"}]]"#),
        "the body must be a JSON object"
    );
    assert_eq!(message(r#""m""#), "the body must be a JSON object");
    assert_eq!(
        message(r#"{"model": null, "messages": [{"role": "user"}]}"#),
        "`model` must be a non-empty string"
    );
    assert_eq!(
        message(r#"{"model": "m", "messages": null}"#),
        "`messages` must be a list of messages"
    );
    assert!(
        message(r#"{"model": "a", "model": "b", "messages": [{"role": "user"}]}"#)
            .contains("duplicate field `model`"),
        "a field given twice is refused"
    );
    let skipped = chat(
        r#" {"tools": [{"a": {"b": [1, 2, {"c": null}]}}], "model": "m", "n": 1,
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": null} "#,
    )
    .unwrap();
    assert_eq!(skipped.model, "m");
    assert_eq!(skipped.expected_output_tokens, None);
    let plain = chat(r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#);
    assert_eq!(skipped.block_hashes, plain.unwrap().block_hashes);
}

/// The messages' borrowed shapes read what a JSON value of them holds: escapes
/// decoded, the text parts in order (a part without a string `text` adds nothing), the
/// last of a key given twice, and a bad message or content named by its index.
#[test]
fn messages_are_read_as_their_text() {
    let tokens_of = |text: &str| {
        let mut tokens = Vec::new();
        push_text(text, &mut tokens);
        tokens
    };
    let read = |messages: &str| {
        chat(&format!(r#"{{"model": "m", "messages": {messages}}}"#)).map(|p| p.tokens)
    };
    let cases = [
        (
            r#"[{"role": "user", "content": "a\"b\u00e9"}]"#,
            "user\na\"b\u{e9}\n",
        ),
        (
            r#"[{"role": "user", "content": [{"type": "text", "text": "x"},
                {"type": "image_url", "image_url": {"url": "u"}}, {"text": 5}, "s",
                {"text": "y", "text": "z"}]}]"#,
            "user\nxz\n",
        ),
        (
            r#"[{"role": "system", "role": "user", "content": null, "name": [1, {}]}]"#,
            "user\n\n",
        ),
    ];
    for (messages, text) in cases {
        assert_eq!(read(messages).unwrap(), tokens_of(text), "{messages}");
    }
    let message = |messages: &str| read(messages).unwrap_err().message;
    assert_eq!(
        message(r#"[{"role": "user"}, "hi"]"#),
        "messages[1] needs a string `role`"
    );
    assert_eq!(
        message(r#"[{"role": 7}]"#),
        "messages[0] needs a string `role`"
    );
    assert_eq!(
        message(r#"[{"role": "user", "content": {"text": "x"}}]"#),
        "messages[0].content must be a string or a list of parts"
    );
}

/// Hostile nesting: in a field routing reads, refused at serde_json's recursion limit
/// and named; in a field it skips, skipped in time linear in its length (serde_json
/// skips without recursing; the engine judges it); never a deep stack.
#[test]
fn deep_nesting_is_refused_where_it_is_read() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let read = [
        (
            "model",
            format!(r#"{{"model": {deep}, "messages": [{{"role": "user"}}]}}"#),
        ),
        (
            "messages",
            format!(r#"{{"model": "m", "messages": [{{"role": "user", "content": {deep}}}]}}"#),
        ),
    ];
    for (param, body) in read {
        let error = chat(&body).unwrap_err();
        assert_eq!(error.param, Some(param));
        assert!(
            error.message.contains("recursion limit"),
            "{}",
            error.message
        );
    }
    let error = chat(&deep).unwrap_err();
    assert_eq!(error.message, "the body must be a JSON object");
    let skipped = format!(r#"{{"x": {deep}, "model": "m", "messages": [{{"role": "user"}}]}}"#);
    assert_eq!(chat(&skipped).unwrap().model, "m");
}

#[test]
fn bad_bodies_name_the_field() {
    let param = |body: &str| chat(body).unwrap_err().param;
    assert_eq!(param(r#"{"messages":[]}"#), Some("model"));
    assert_eq!(param(r#"{"model":"m","messages":{}}"#), Some("messages"));
    assert_eq!(param(r#"{"model":"m","messages":[]}"#), Some("messages"));
    assert_eq!(
        param(r#"{"model":"m","messages":[{"content":"x"}]}"#),
        Some("messages")
    );
    assert_eq!(
        param(r#"{"model":"m","stream":"yes","messages":[{"role":"user"}]}"#),
        Some("stream")
    );
    assert_eq!(param("[1]"), None);
    assert_eq!(param("{"), None);
    let completion = |body: &str| parse(Endpoint::Completions, body.as_bytes(), 4, |_| None);
    assert_eq!(
        completion(r#"{"model":"m","prompt":["a","b"]}"#)
            .unwrap_err()
            .param,
        Some("prompt")
    );
    assert_eq!(
        completion(r#"{"model":"m","prompt":[1,2,3,4,5]}"#)
            .unwrap()
            .block_hashes
            .len(),
        1
    );
}

/// The router's tokens equal what Hugging Face's tokenizers and transformers' way of
/// rendering chat templates give (tests/fixtures/tokenizer/make_golden.py).
#[test]
fn a_tokenizer_gives_the_engines_tokens() {
    let fixtures =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer");
    let tokenizer = ModelTokenizer::load(&fixtures.join("tokenizer.json")).unwrap();
    assert!(tokenizer.has_chat_template());
    let golden: Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures.join("golden.json")).unwrap())
            .unwrap();
    let block_size = 4;
    for case in golden["chat"].as_array().unwrap() {
        let ids: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        let body = serde_json::json!({"model": "m", "messages": case["messages"]}).to_string();
        let prompt = parse(
            Endpoint::ChatCompletions,
            body.as_bytes(),
            block_size,
            |_| Some(&tokenizer),
        )
        .unwrap();
        let mut expected = Vec::new();
        hash_tokens(&ids, block_size, &mut expected);
        assert_eq!(prompt.block_hashes[..], expected[..], "{}", case["text"]);
        assert_eq!(prompt.request_blocks, (ids.len() as u64).div_ceil(4));
    }
    for case in golden["completion"].as_array().unwrap() {
        let ids: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        let body = serde_json::json!({"model": "m", "prompt": case["prompt"]}).to_string();
        let prompt = parse(Endpoint::Completions, body.as_bytes(), block_size, |_| {
            Some(&tokenizer)
        })
        .unwrap();
        let mut expected = Vec::new();
        hash_tokens(&ids, block_size, &mut expected);
        assert_eq!(prompt.block_hashes[..], expected[..], "{}", case["prompt"]);
    }
    // A template that raises is a 400 naming the messages.
    let body = r#"{"model":"m","messages":[{"role":"tool","content":"x"}]}"#;
    let error = parse(Endpoint::ChatCompletions, body.as_bytes(), 4, |_| {
        Some(&tokenizer)
    })
    .unwrap_err();
    assert_eq!(error.param, Some("messages"));
    assert!(
        error
            .message
            .contains("Conversation roles must be system, user or assistant"),
        "{}",
        error.message
    );
}

/// What a reader of the body's fields found, comparable: each scalar, the prompt's text,
/// and the messages as the pseudo-tokens they render to (or the error they give).
fn found(shapes: Shapes) -> String {
    let mut tokens = Vec::new();
    let messages = chat_tokens(shapes.messages, &mut tokens).map(|()| tokens);
    format!(
        "{:?} {:?} {:?} {:?} {:?} {:?} {:?}",
        shapes.model,
        shapes.stream,
        shapes.prompt.map(RawValue::get),
        shapes.max_completion_tokens,
        shapes.max_tokens,
        shapes.user,
        messages.map_err(|e| e.message),
    )
}

/// The one pass every request takes and the field-by-field reading (which names a field
/// at fault) find the same in the same bodies, and refuse the same ones; a field nested
/// just past what the one pass allows is read field by field.
#[test]
fn the_one_pass_and_the_field_by_field_reading_agree() {
    let nested = |depth: usize| format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
    let bodies = [
        r#"{"model":"demo","stream":false,"max_tokens":2,"messages":[{"role":"user","content":"hi"}]}"#.to_owned(),
        r#"{"mod\u0065l":"d\u00e9mo","stream":null,"user":"ann","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"text":"b"},7]}]}"#.to_owned(),
        r#"{"model":"m","max_completion_tokens":5,"max_tokens":9,"messages":[{"content":"x"},"no",{"role":"r","role":"s"}]}"#.to_owned(),
        r#"{"model":"m","prompt":["a"],"x":{"deep":[1,2,{"y":null}]},"stream":true}"#.to_owned(),
        r#"{"model":1.5,"stream":"yes","messages":{},"user":[],"max_tokens":-1}"#.to_owned(),
        r#"{"model":"m","model":"n"}"#.to_owned(),
        r#"{"model":"m","messages":[{"role":"user","content":"x"}]"#.to_owned(),
        format!(r#"{{"model":"m","stream":{}}}"#, nested(127)),
        format!(r#"{{"model":"m","user":{}}}"#, nested(128)),
        format!(r#"{{"model":"m","skipped":{}}}"#, nested(5_000)),
        "{}".to_owned(),
    ];
    for body in &bodies {
        let one_pass = Shapes::read(body.as_bytes()).map(found);
        let by_field = Fields::read(body.as_bytes())
            .and_then(Fields::shapes)
            .map(found);
        match (one_pass, by_field) {
            (Ok(once), Ok(by_field)) => assert_eq!(once, by_field, "{body}"),
            (Err(once), Err(by_field)) => {
                assert_eq!(
                    (once.param, once.message),
                    (by_field.param, by_field.message)
                )
            }
            (once, by_field) => panic!(
                "{body}: the one pass gave {:?}, the field by field reading {:?}",
                once.map_err(|e| e.message),
                by_field.map_err(|e| e.message)
            ),
        }
    }
    // The one pass alone (no fallback) reads the common body.
    let common: Result<Shapes, _> = serde_json::from_slice(bodies[0].as_bytes());
    assert!(common.is_ok());
}
