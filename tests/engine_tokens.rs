//! Tokens like the engine's (issue 50, item 4): with `models.NAME.tokenizer` naming the
//! GGUF file a llama.cpp server serves, the router's token ids are the engine's own, for
//! completion text and for rendered chats, so its prompt blocks are the ones the engine
//! caches. Checked against the real server's `/tokenize` and `/apply-template`; skipped,
//! saying why, when llama.cpp is not installed (CI requires it).

mod support;

use serde_json::{json, Value};
use support::llama::{self, MODEL};
use support::{post_json, write_config};
use switchyard::serve::frontend::tokenizer::ModelTokenizer;

/// Texts that exercise each split rule: digits (split one by one), contractions, runs of
/// spaces and newlines, punctuation, non-ASCII letters and emoji (byte fallback), and
/// the control tokens a chat template writes.
const TEXTS: &[&str] = &[
    "Hello, world!",
    "In 2024 there were 1,234,567 requests; 3.14159 of them were odd.",
    "I'm sure they'll say it's fine, we've done it, you'd agree.",
    "  leading spaces,\ttabs,\n\nnewlines   and trailing spaces   ",
    "naïve café résumé — Straße, Ελληνικά, 日本語のテキスト, emoji 🚀🔥.",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "fn main() { println!(\"{}\", x.iter().map(|v| v * 2).sum::<u32>()); }",
];

fn engine_tokens(agent: &ureq::Agent, base: &str, text: &str) -> Vec<u32> {
    let (status, _, body) = post_json(
        agent,
        &format!("{base}/tokenize"),
        &json!({"content": text, "add_special": false, "parse_special": true}),
    );
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    answer["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| u32::try_from(t.as_u64().unwrap()).unwrap())
        .collect()
}

#[test]
fn the_routers_tokens_are_the_engines_own() {
    if !llama::available() {
        return;
    }
    let engines = llama::servers(1, 1);
    let base = &engines[0].address;
    let agent = ureq::Agent::new();
    let tokenizer = ModelTokenizer::load(&llama::model()).unwrap();
    for text in TEXTS {
        let ours = tokenizer.prompt_tokens(text).unwrap();
        assert!(!ours.is_empty(), "{text:?}");
        assert_eq!(ours, engine_tokens(&agent, base, text), "{text:?}");
    }
    // A conversation as the engine renders it (its chat template), then tokenizes it.
    let messages = json!([
        {"role": "system", "content": "You are a terse assistant. Answer in 12 words or fewer."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy, in 2 words?"},
    ]);
    let (status, _, body) = post_json(
        &agent,
        &format!("{base}/apply-template"),
        &json!({"messages": messages}),
    );
    assert_eq!(status, 200, "{body}");
    let rendered: Value = serde_json::from_str(&body).unwrap();
    let rendered = rendered["prompt"].as_str().unwrap();
    assert_eq!(
        tokenizer.chat_tokens(&messages).unwrap(),
        engine_tokens(&agent, base, rendered),
        "the chat as the engine renders it: {rendered:?}"
    );
}

/// A GGUF file the router cannot tokenize as the engine would is refused at startup,
/// naming the file and what to do; so is a file that is no GGUF at all.
#[test]
fn a_gguf_the_router_cannot_read_is_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let not_gguf = dir.path().join("model.gguf");
    std::fs::write(&not_gguf, b"GGML and then some bytes").unwrap();
    let cut = dir.path().join("cut.gguf");
    std::fs::write(
        &cut,
        b"GGUF\x03\0\0\0\0\0\0\0\0\0\0\0\xff\xff\xff\xff\0\0\0\0",
    )
    .unwrap();
    for (file, expected) in [
        (&not_gguf, "does not start with `GGUF`"),
        (&cut, "cut short"),
    ] {
        let config = write_config(
            dir.path(),
            &format!(
                "models:\n  {MODEL}: {{tokenizer: {}}}\nworkers:\n  - {{model: {MODEL}, worker_id: 1}}\n",
                file.display()
            ),
        );
        let out = std::process::Command::new(support::switchyard_bin())
            .args(["check", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{stdout}{stderr}");
        let said = format!("{stdout}{stderr}");
        assert!(said.contains(expected), "{said}");
        assert!(said.contains(&file.display().to_string()), "{said}");
    }
}
