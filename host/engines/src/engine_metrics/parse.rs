//! Reads an engine's load out of its Prometheus text exposition (`GET /metrics`), for
//! vLLM, SGLang and llama.cpp by their own metric names (vLLM:
//! `vllm/v1/metrics/loggers.py`; SGLang: `python/sglang/srt/metrics/collector.py`;
//! llama.cpp: `tools/server/server-context.cpp`, `--metrics`). One pass over the text,
//! linear in its size, no allocation per line but for the LoRA adapter lists.
//!
//! | what | vLLM | SGLang | llama.cpp | over several series |
//! |---|---|---|---|---|
//! | running requests | `vllm:num_requests_running` | `sglang:num_running_reqs` | `llamacpp:requests_processing` | sum |
//! | waiting requests | `vllm:num_requests_waiting` | `sglang:num_queue_reqs` | `llamacpp:requests_deferred` | sum |
//! | KV-cache usage (0-1) | `vllm:kv_cache_usage_perc` (V1), `vllm:gpu_cache_usage_perc` (V0) | `sglang:token_usage` | - (none exported: NaN) | max |
//! | KV cache capacity (tokens) | `vllm:cache_config_info{num_gpu_blocks, block_size}` | - | - | the last |
//! | LoRA adapters | `vllm:lora_requests_info{running_lora_adapters, waiting_lora_adapters}` | - | - | the series with the largest value (vLLM sets it to the time of the update; older label sets stay exported) |

use switchyard_plugin_host::plugin::EngineSample;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Metric {
    Running,
    Waiting,
    KvUsage,
    Lora,
    CacheConfig,
}

fn metric(name: &str) -> Option<Metric> {
    Some(match name {
        "vllm:num_requests_running"
        | "sglang:num_running_reqs"
        | "llamacpp:requests_processing" => Metric::Running,
        "vllm:num_requests_waiting" | "sglang:num_queue_reqs" | "llamacpp:requests_deferred" => {
            Metric::Waiting
        }
        "vllm:kv_cache_usage_perc" | "vllm:gpu_cache_usage_perc" | "sglang:token_usage" => {
            Metric::KvUsage
        }
        "vllm:lora_requests_info" => Metric::Lora,
        "vllm:cache_config_info" => Metric::CacheConfig,
        _ => return None,
    })
}

/// What makes a scrape unreadable.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MetricsError {
    #[error("`{0}`: its labels are not closed")]
    OpenLabels(String),
    #[error("`{0}`: no number after the name")]
    NoValue(String),
    #[error("the metrics text has no samples")]
    NoSamples,
    #[error("no vLLM (`vllm:num_requests_running`, `vllm:num_requests_waiting`), SGLang (`sglang:num_running_reqs`, `sglang:num_queue_reqs`) or llama.cpp (`llamacpp:requests_processing`, `llamacpp:requests_deferred`; start it with `--metrics`) request gauges; the first metric is `{0}`")]
    NotAnEngine(String),
}

/// Parses a scrape. An error when the text has none of the request gauges (not an
/// engine this router knows), naming what it found instead.
pub fn parse(text: &str) -> Result<EngineSample, MetricsError> {
    let mut running = None::<f64>;
    let mut waiting = None::<f64>;
    let mut kv = None::<f64>;
    let mut lora: Option<(f64, &str)> = None;
    let mut capacity = None::<u64>;
    let mut first_metric = None;
    for line in text.lines() {
        let line = line.trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line
            .find(|c: char| c == '{' || c.is_ascii_whitespace())
            .unwrap_or(line.len());
        let name = &line[..name_end];
        first_metric.get_or_insert(name);
        let Some(which) = metric(name) else { continue };
        let (labels, rest) = match line[name_end..].strip_prefix('{') {
            Some(after) => match label_block_end(after) {
                Some(end) => (&after[..end], &after[end + 1..]),
                None => return Err(MetricsError::OpenLabels(name.to_owned())),
            },
            None => ("", &line[name_end..]),
        };
        let value = rest
            .split_ascii_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| MetricsError::NoValue(name.to_owned()))?;
        if !value.is_finite() && which != Metric::KvUsage {
            continue;
        }
        match which {
            Metric::Running => *running.get_or_insert(0.0) += value,
            Metric::Waiting => *waiting.get_or_insert(0.0) += value,
            Metric::KvUsage => kv = Some(kv.map_or(value, |k: f64| k.max(value))),
            Metric::CacheConfig => capacity = kv_capacity_tokens(labels).or(capacity),
            Metric::Lora => {
                if lora.is_none_or(|(best, _)| value > best) {
                    lora = Some((value, labels));
                }
            }
        }
    }
    let (Some(running), Some(waiting)) = (running, waiting) else {
        return Err(match first_metric {
            None => MetricsError::NoSamples,
            Some(name) => MetricsError::NotAnEngine(name.to_owned()),
        });
    };
    let (running_adapters, waiting_adapters) = match lora {
        Some((_, labels)) => (
            Some(adapters(label(labels, "running_lora_adapters"))),
            Some(adapters(label(labels, "waiting_lora_adapters"))),
        ),
        None => (None, None),
    };
    Ok(EngineSample {
        running_requests: running,
        waiting_requests: waiting,
        kv_cache_usage: kv.filter(|k| k.is_finite()).unwrap_or(f64::NAN),
        running_adapters,
        waiting_adapters,
        kv_capacity_tokens: capacity,
    })
}

/// vLLM's cache config (an info metric: the values are labels): its GPU blocks times
/// their size in tokens. `None` when either is missing, zero or not a number (vLLM
/// writes `None` before the cache is sized).
fn kv_capacity_tokens(labels: &str) -> Option<u64> {
    let blocks: u64 = label(labels, "num_gpu_blocks").parse().ok()?;
    let block_size: u64 = label(labels, "block_size").parse().ok()?;
    blocks.checked_mul(block_size).filter(|&t| t > 0)
}

/// Where the label block `a="x",b="y"}` ends (the `}` outside quotes).
fn label_block_end(after: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, b) in after.bytes().enumerate() {
        match (quoted, escaped, b) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (_, false, b'"') => quoted = !quoted,
            (false, _, b'}') => return Some(i),
            _ => {}
        }
    }
    None
}

/// The raw (still escaped) value of label `key` in a label block.
fn label<'a>(labels: &'a str, key: &str) -> &'a str {
    let mut rest = labels;
    while let Some(eq) = rest.find("=\"") {
        let name = rest[..eq].trim_start_matches([',', ' ']).trim();
        let value_start = eq + 2;
        let bytes = rest.as_bytes();
        let mut i = value_start;
        while i < bytes.len() && bytes[i] != b'"' {
            i += if bytes[i] == b'\\' { 2 } else { 1 };
        }
        let value = &rest[value_start..i.min(rest.len())];
        if name == key {
            return value;
        }
        rest = rest.get(i + 1..).unwrap_or("");
    }
    ""
}

/// vLLM joins adapter names with commas.
fn adapters(joined: &str) -> Box<[Box<str>]> {
    joined
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(|a| {
            a.replace("\\\"", "\"")
                .replace("\\\\", "\\")
                .into_boxed_str()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // The golden scrapes are read in tests/engine_metrics.rs (through the public API).

    /// vLLM's `cache_config_info` as its own logger writes it (every cache config field
    /// a label, values as Python's `str()`; `num_gpu_blocks` is `None` until sized).
    #[test]
    fn reads_the_kv_capacity_from_vllms_cache_config() {
        let gauges = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n";
        let info = |blocks: &str| {
            format!(
                "{gauges}vllm:cache_config_info{{block_size=\"16\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",gpu_memory_utilization=\"0.9\",num_cpu_blocks=\"None\",num_gpu_blocks=\"{blocks}\",swap_space=\"4\"}} 1.0\n"
            )
        };
        assert_eq!(
            parse(&info("131072")).unwrap().kv_capacity_tokens,
            Some(131072 * 16)
        );
        assert_eq!(parse(&info("None")).unwrap().kv_capacity_tokens, None);
        assert_eq!(parse(gauges).unwrap().kv_capacity_tokens, None);
    }

    #[test]
    fn refuses_what_is_no_engine_and_stays_linear() {
        let err = parse("# HELP x\nprocess_cpu_seconds_total 1\n").unwrap_err();
        assert!(
            matches!(&err, MetricsError::NotAnEngine(name) if name == "process_cpu_seconds_total"),
            "{err}"
        );
        assert!(
            err.to_string().contains("process_cpu_seconds_total"),
            "{err}"
        );
        assert!(matches!(parse(""), Err(MetricsError::NoSamples)));
        assert!(parse("vllm:num_requests_running{a=\"}").is_err());
        // A huge label block is read once.
        let long = format!(
            "vllm:num_requests_running{{a=\"{}\"}} 1\nvllm:num_requests_waiting 2\n",
            "x".repeat(1 << 20)
        );
        assert_eq!(parse(&long).unwrap().waiting_requests, 2.0);
    }
}
