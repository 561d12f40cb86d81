//! The engines' load, read from their own `/metrics` text through the engines layer's
//! public API: golden scrapes of vLLM and SGLang (made with `prometheus_client` and each
//! engine's metric definitions, `scripts/golden/engine-metrics.py`) and a real llama.cpp
//! server's (`scripts/golden/llamacpp-metrics.py`, one request processing and two
//! deferred).

use switchyard_engines::engine_metrics::parse::parse;

const VLLM: &str = include_str!("../../../tests/fixtures/engine_metrics/vllm.txt");
const SGLANG: &str = include_str!("../../../tests/fixtures/engine_metrics/sglang.txt");
const LLAMACPP: &str = include_str!("../../../tests/fixtures/engine_metrics/llamacpp.txt");

#[test]
fn reads_the_golden_vllm_scrape() {
    let s = parse(VLLM).unwrap();
    assert_eq!((s.running_requests, s.waiting_requests), (3.0, 5.0));
    assert_eq!(s.kv_cache_usage, 0.25);
    assert_eq!(s.kv_capacity_tokens, Some(27648 * 16));
    let names = |l: &Option<Box<[Box<str>]>>| -> Vec<String> {
        l.as_deref()
            .unwrap()
            .iter()
            .map(|a| a.to_string())
            .collect()
    };
    // The latest of the two label sets wins.
    assert_eq!(names(&s.running_adapters), ["sql-lora", "chat-lora"]);
    assert_eq!(names(&s.waiting_adapters), ["tool-lora"]);
}

#[test]
fn reads_the_golden_sglang_scrape() {
    let s = parse(SGLANG).unwrap();
    assert_eq!((s.running_requests, s.waiting_requests), (2.0, 7.0));
    assert_eq!(s.kv_cache_usage, 0.5);
    assert_eq!(s.running_adapters, None);
    assert_eq!(s.kv_capacity_tokens, None);
}

/// llama.cpp exports no KV-cache usage, capacity or adapters: they stay unknown.
#[test]
fn reads_the_golden_llamacpp_scrape() {
    let s = parse(LLAMACPP).unwrap();
    assert_eq!((s.running_requests, s.waiting_requests), (1.0, 2.0));
    assert!(s.kv_cache_usage.is_nan(), "{}", s.kv_cache_usage);
    assert_eq!(s.kv_capacity_tokens, None);
    assert_eq!((s.running_adapters, s.waiting_adapters), (None, None));
}
