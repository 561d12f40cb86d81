//! `engine-sim`'s `/metrics`: the gauges and counters vLLM's own engine exports, in its
//! names (vllm/v1/metrics/loggers.py), from the simulated engine's state.

use std::sync::atomic::Ordering;

use super::Engine;

/// `/metrics` in vLLM's names (vllm/v1/metrics/loggers.py).
pub(super) fn metrics_text(engine: &Engine) -> String {
    let load = engine.load.lock();
    let model = &engine.args.model;
    let usage = (load.running_blocks as f64 / engine.args.cache_blocks.max(1) as f64).min(1.0);
    let mut text = format!(
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
         # TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{engine=\"0\",model_name=\"{model}\"}} {}\n\
         # HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{engine=\"0\",model_name=\"{model}\"}} {}\n\
         # HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n\
         # TYPE vllm:kv_cache_usage_perc gauge\n\
         vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"{model}\"}} {usage}\n\
         # HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.\n\
         # TYPE vllm:prefix_cache_queries counter\n\
         vllm:prefix_cache_queries_total{{engine=\"0\",model_name=\"{model}\"}} {}\n\
         # HELP vllm:prefix_cache_hits Prefix cache hits, in terms of number of cached tokens.\n\
         # TYPE vllm:prefix_cache_hits counter\n\
         vllm:prefix_cache_hits_total{{engine=\"0\",model_name=\"{model}\"}} {}\n\
         # HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
         # TYPE vllm:cache_config_info gauge\n\
         vllm:cache_config_info{{block_size=\"{}\",enable_prefix_caching=\"True\",engine=\"0\",num_gpu_blocks=\"{}\"}} 1.0\n",
        load.running,
        load.waiting,
        engine.prefix_queries.load(Ordering::Relaxed),
        engine.prefix_hits.load(Ordering::Relaxed),
        engine.args.block_size,
        engine.args.cache_blocks,
    );
    if !engine.args.lora_adapters.is_empty() {
        let list = |phase: fn(&(u64, u64)) -> bool| {
            load.adapters
                .iter()
                .filter(|(_, counts)| phase(counts))
                .map(|(name, _)| name.as_str())
                .collect::<Vec<_>>()
                .join(",")
        };
        text.push_str(&format!(
            "# HELP vllm:lora_requests_info Running stats on lora requests.\n\
             # TYPE vllm:lora_requests_info gauge\n\
             vllm:lora_requests_info{{max_lora=\"{}\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"{}\"}} {}\n",
            engine.args.lora_adapters.len(),
            list(|c| c.1 > 0),
            list(|c| c.1 == 0 && c.0 > 0),
            load.adapters_changed
        ));
    }
    text.push_str(&engine.transfers.metrics());
    text
}
