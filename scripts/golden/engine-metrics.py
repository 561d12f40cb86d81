#!/usr/bin/env python3
"""Writes the golden engine scrapes in tests/fixtures/engine_metrics/.

Made with prometheus_client (the library vLLM and SGLang expose their metrics with),
declaring each metric the router reads as the engine's own source declares it: name,
documentation, type and label names from vLLM's vllm/v1/metrics/loggers.py
(PrometheusStatLogger) and SGLang's python/sglang/srt/metrics/collector.py
(SchedulerMetricsCollector). A few neighbouring metrics are declared too, so the
parser meets what it skips.

    python3 -m venv /tmp/golden && /tmp/golden/bin/pip install prometheus-client==0.21.1
    /tmp/golden/bin/python scripts/golden/engine-metrics.py
"""
import pathlib

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

OUT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "engine_metrics"


def vllm() -> bytes:
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                    labels, registry=registry)
    waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                    labels, registry=registry)
    kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
               labels, registry=registry)
    prompt = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", labels,
                     registry=registry)
    lora = Gauge("vllm:lora_requests_info", "Running stats on lora requests.",
                 ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
                 registry=registry)
    # Two engine cores (data parallel): the request gauges add up, KV usage is the max.
    for engine, (r, w, k) in {"0": (1, 2, 0.25), "1": (2, 3, 0.125)}.items():
        running.labels("meta-llama/Llama-3.1-8B", engine).set(r)
        waiting.labels("meta-llama/Llama-3.1-8B", engine).set(w)
        kv.labels("meta-llama/Llama-3.1-8B", engine).set(k)
        prompt.labels("meta-llama/Llama-3.1-8B", engine).inc(1000)
    # CacheConfig.metrics_info(): every field as a label, its value as str(); the gauge
    # set to 1 per engine core (log_metrics_info("cache_config", ...)). A subset of the
    # fields, in CacheConfig's order.
    cache = {"block_size": "16", "gpu_memory_utilization": "0.9", "swap_space": "4",
             "cache_dtype": "auto", "is_attention_free": "False",
             "num_gpu_blocks_override": "None", "sliding_window": "None",
             "enable_prefix_caching": "True", "prefix_caching_hash_algo": "sha256",
             "cpu_offload_gb": "0", "num_gpu_blocks": "27648", "num_cpu_blocks": "0"}
    info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                 [*cache, "engine"], registry=registry)
    for engine in ["0", "1"]:
        info.labels(**cache, engine=engine).set(1)
    # vLLM sets the series of the current adapter sets to the time of the update
    # (set_to_current_time); an older label set stays exported with an older time.
    lora.labels("4", "", "sql-lora").set(1764590000.0)
    lora.labels("4", "tool-lora", "sql-lora,chat-lora").set(1764590400.5)
    return generate_latest(registry)


def sglang() -> bytes:
    registry = CollectorRegistry()
    labels = ["model_name", "engine_type", "tp_rank", "pp_rank"]
    values = ["Qwen/Qwen2.5-7B-Instruct", "unified", "0", "0"]
    Gauge("sglang:num_running_reqs", "The number of running requests.", labels,
          registry=registry).labels(*values).set(2)
    Gauge("sglang:num_used_tokens", "The number of used tokens.", labels,
          registry=registry).labels(*values).set(4096)
    Gauge("sglang:token_usage", "The token usage.", labels,
          registry=registry).labels(*values).set(0.5)
    Gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", labels,
          registry=registry).labels(*values).set(7)
    Gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", labels,
          registry=registry).labels(*values).set(0.3)
    return generate_latest(registry)


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "vllm.txt").write_bytes(vllm())
    (OUT / "sglang.txt").write_bytes(sglang())
    print(f"wrote {OUT}/vllm.txt and sglang.txt")
