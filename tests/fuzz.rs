//! Property-based fuzzing of every parser a user or a plugin file can feed: the ELF
//! check on mutated libraries, the YAML config, OpenAI request bodies, the HTTP API's
//! JSON bodies. Each input is accepted or refused with a message; nothing panics.
//!
//! `cargo test` runs a short pass (PROPTEST_CASES defaults to 256 here); `make fuzz`
//! runs 100,000 cases per target.

mod support;

use std::path::Path;

use proptest::prelude::*;
use support::*;
use switchyard::config::ConfigSource;
use switchyard::fleet::router::Router;
use switchyard::serve::frontend::prompt::{self, Endpoint};

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// A valid plugin library, built once per test binary.
fn library() -> &'static [u8] {
    static LIBRARY: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    LIBRARY.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::read(broken_plugin(dir.path(), "fuzz_base", &["MANIFEST"])).unwrap()
    })
}

/// A router over the built-in policies and two workers of model `demo`.
fn router() -> &'static Router {
    static ROUTER: std::sync::OnceLock<Router> = std::sync::OnceLock::new();
    ROUTER.get_or_init(|| {
        let yaml = "workers:\n  - {model: demo, worker_id: 1}\n  - {model: demo, worker_id: 2}\n";
        let source = ConfigSource::parse(yaml.into(), "fuzz.yaml".into(), ".".into()).unwrap();
        Router::new(switchyard::startup::start(source).unwrap()).unwrap()
    })
}

/// A mutation of a library file: bit flips, overwritten header fields, a truncation.
#[derive(Clone, Debug)]
enum Mutation {
    Flip { at: usize, bit: u8 },
    Write { at: usize, value: u64 },
    Truncate { len: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (0usize..100_000, 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        // Header and program-header fields sit in the first few hundred bytes.
        (0usize..512, any::<u64>()).prop_map(|(at, value)| Mutation::Write { at, value }),
        (0usize..100_000).prop_map(|len| Mutation::Truncate { len }),
    ]
}

fn mutate(bytes: &mut Vec<u8>, m: &Mutation) {
    let len = bytes.len();
    if len == 0 {
        return; // an earlier mutation truncated it all: nothing left to flip or write
    }
    match *m {
        Mutation::Flip { at, bit } => bytes[at % len] ^= 1 << bit,
        Mutation::Write { at, value } => {
            let at = at % len.saturating_sub(8).max(1);
            let end = (at + 8).min(len);
            bytes[at..end].copy_from_slice(&value.to_le_bytes()[..end - at]);
        }
        Mutation::Truncate { len: to } => bytes.truncate(to % (len + 1)),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// The ELF check never panics, and whatever it refuses it refuses with a message
    /// naming the file. (It does not dlopen: a mutation it accepts is not loaded here.)
    #[test]
    fn the_elf_check_refuses_mutated_libraries_with_a_message(mutations in proptest::collection::vec(mutation(), 1..4)) {
        let mut bytes = library().to_vec();
        for m in &mutations {
            mutate(&mut bytes, m);
        }
        let checked = switchyard::plugin::elf_check::check(Path::new("fuzz.so"), &bytes)
            .and_then(|()| switchyard::plugin::manifest::read(Path::new("fuzz.so"), &bytes));
        if let Err(error) = checked {
            let message = error.to_string();
            prop_assert!(message.starts_with("fuzz.so: "), "{}", message);
        }
    }

    /// Engine KV-event payloads: a vLLM golden batch with bytes flipped, cut or
    /// overwritten decodes or is refused with a message; never a panic.
    #[test]
    fn mutated_vllm_kv_event_payloads_decode_or_are_refused(mutations in proptest::collection::vec(mutation(), 1..4), which in 0usize..4) {
        let names = ["v0.23.0-int-hashes.bin", "v0.33.0-int-hashes.bin", "v0.33.0-newer-keys.bin", "v0.23.0-defaults-omitted.bin"];
        let mut bytes = std::fs::read(repo().join("tests/fixtures/kv_events").join(names[which])).unwrap();
        for m in &mutations {
            if !bytes.is_empty() {
                mutate(&mut bytes, m);
            }
        }
        if let Err(error) = switchyard::fleet::kv_events::wire::decode(&bytes) {
            prop_assert!(!error.to_string().is_empty());
        }
    }

    /// Any manifest section (records, keys, values, NULs in any order) is read or refused
    /// with a message; never a panic.
    #[test]
    fn any_manifest_section_is_read_or_refused(text in "(switchyard-manifest 1|switchyard-type 1|abi|fingerprint|sdk|name|version|vendor|kind|inputs|scorer|policy|inputs::load|\\||1\\.0|[0-9]{1,22}| |\n|\u{0}|[a-z.]){0,120}") {
        if let Err(problem) = switchyard::plugin::manifest::parse(text.as_bytes()) {
            prop_assert!(!problem.to_string().is_empty());
        }
    }

    /// Any text is a config or a message naming the file.
    #[test]
    fn any_config_text_parses_or_is_refused_with_a_message(text in "(plugins|worker_selection|router|workers|models|frontend|instances|name|type|path|:|-|\\{|\\}|\\[|\\]|,| |\n|[a-z0-9._\"]){0,200}") {
        if let Err(error) = ConfigSource::parse(text, "fuzz.yaml".into(), ".".into()) {
            prop_assert!(error.to_string().starts_with("fuzz.yaml"), "{}", error);
        }
    }

    /// Deeply nested flow collections, quotes and comments around them, paths to special
    /// files: refused (or parsed) with a message naming the file, in time linear in the
    /// text (the nesting check runs before the parser).
    #[test]
    fn nested_and_special_config_text_is_refused_with_a_message(depth in 0usize..5_000, open in "[\\[{]", quote in "(|\"|'|# )", path in "(/dev/zero|/proc/self/mem|/dev/null|/tmp|.)") {
        let close = if open == "[" { "]" } else { "}" };
        let text = format!("plugins:\n  - path: {path}\nworkers: {quote}{}{}\n", open.repeat(depth), close.repeat(depth));
        if let Err(error) = ConfigSource::parse(text, "fuzz.yaml".into(), ".".into()) {
            prop_assert!(error.to_string().starts_with("fuzz.yaml"), "{}", error);
        }
    }

    /// The KV index against the obvious model under any sequence of stores, removals,
    /// clears and worker removals: the same pairs per tier and the same prefix per worker.
    #[test]
    fn the_kv_index_matches_a_reference_model(ops in proptest::collection::vec((0u64..4, 0usize..3, 0u8..10, 0u64..6, 0u64..6), 1..200)) {
        use std::collections::{HashMap, HashSet};
        use switchyard::fleet::kv_index::{KvEvent, KvIndex, QueryScratch, Tier};
        let mut index = KvIndex::with_sweep_floor(8);
        let mut model: HashMap<(u64, usize), HashSet<u64>> = HashMap::new();
        let id = |w: u64| switchyard_plugin_sdk::WorkerId { worker_id: w, dp_rank: 0 };
        for &(w, t, op, a, b) in &ops {
            let tier = Tier::ALL[t];
            let (from, to) = (a.min(b), a.max(b) + 1);
            let hashes: Vec<u64> = (from..to).collect();
            match op {
                0..=5 => {
                    index.apply(id(w), &KvEvent::Stored { tier, parent_hash: None, block_hashes: hashes.clone() });
                    model.entry((w, t)).or_default().extend(hashes);
                }
                6 | 7 => {
                    index.apply(id(w), &KvEvent::Removed { tier, block_hashes: hashes.clone() });
                    if let Some(set) = model.get_mut(&(w, t)) {
                        hashes.iter().for_each(|h| { set.remove(h); });
                    }
                }
                8 => {
                    index.apply(id(w), &KvEvent::Cleared { tier: Some(tier) });
                    model.remove(&(w, t));
                }
                _ => {
                    index.remove_worker(id(w));
                    model.retain(|(mw, _), _| *mw != w);
                }
            }
        }
        for t in 0..3 {
            let pairs: usize = model.iter().filter(|((_, mt), _)| *mt == t).map(|(_, s)| s.len()).sum();
            prop_assert_eq!(index.blocks()[t], pairs);
        }
        let chain: Vec<u64> = (0..7).collect();
        let mut scratch = QueryScratch::default();
        let result = index.query(&chain, &mut scratch);
        for w in 0..4 {
            for (t, tier) in Tier::ALL.iter().enumerate() {
                let set = model.get(&(w, t));
                let expected = chain.iter().take_while(|h| set.is_some_and(|s| s.contains(h))).count() as u32;
                prop_assert_eq!(result.overlap(id(w)).tier(*tier), expected);
            }
        }
    }

    /// Any OpenAI body is a prompt or a refusal with a message.
    #[test]
    fn any_openai_body_parses_or_is_refused_with_a_message(body in proptest::collection::vec(any::<u8>(), 0..200), json in "\\{(\"(model|messages|prompt|stream|max_tokens|role|content)\":(\"[a-z]{0,5}\"|[0-9]{1,3}|true|null|\\[|\\]|\\{|\\}|,)){0,12}\\}?") {
        for bytes in [body.as_slice(), json.as_bytes()] {
            for endpoint in [Endpoint::ChatCompletions, Endpoint::Completions] {
                if let Err(invalid) = prompt::parse(endpoint, bytes, 16, |_| None) {
                    prop_assert!(!invalid.message.is_empty());
                }
            }
        }
    }

    /// Route requests through a real router: any body that deserializes is routed or
    /// refused with a message (what the API answers), whatever its token ids, hashes,
    /// temperature or instance.
    #[test]
    fn any_route_body_is_routed_or_refused_with_a_message(json in "\\{(\"(model|token_ids|block_hashes|request_id|instance|router_temperature|priority_jump|expected_output_tokens)\":(\"(demo|default|x)\"|-?[0-9]{1,20}(\\.[0-9])?|\\[[0-9,]{0,40}\\]|true|null),?){0,8}\\}") {
        if let Ok(request) = switchyard::serve::http_service::route_request(json.as_bytes()) {
            if let Err(error) = router().select(&request) {
                prop_assert!(!error.to_string().is_empty());
            }
        }
    }
}
