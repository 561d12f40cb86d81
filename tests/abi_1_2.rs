//! ABI 1.2 exercised with real libraries and real processes: plugins built against the
//! frozen 1.1 header load and route unchanged; a C filter reads a request header the
//! operator listed and keeps the workers whose label matches, through the OpenAI
//! frontend, a real Envoy (ext_proc) and `/v1/select`, in process and isolated; and a
//! policy reading the engines' own load (scraped from engine-sim's `/metrics`) routes
//! around traffic that bypasses the router, where a bookings-only policy does not.

mod support;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use support::real_envoy::Envoy;
use support::*;

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(20))
        .build()
}

fn chat(content: &str) -> Value {
    json!({"model": "demo", "max_tokens": 2, "messages": [{"role": "user", "content": content}]})
}

/// POSTs `body` with the `x-zone` header (when given): the status, and the engine that
/// answered: its `x-engine-name` through Envoy, the router's `x-switchyard-worker`
/// (`worker-N`) through the frontend.
fn post_zoned(agent: &ureq::Agent, url: &str, zone: Option<&str>, body: &Value) -> (u16, String) {
    let mut request = agent.post(url);
    if let Some(zone) = zone {
        request = request.set("x-zone", zone);
    }
    match request.send_json(body.clone()) {
        Ok(r) => {
            let who = match r.header("x-switchyard-worker") {
                Some(worker) => format!("worker-{worker}"),
                None => r.header("x-engine-name").unwrap_or("").to_owned(),
            };
            (r.status(), who)
        }
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => (0, e.to_string()),
    }
}

fn select(agent: &ureq::Agent, base: &str, body: Value) -> Value {
    match agent.post(&format!("{base}/v1/select")).send_json(body) {
        Ok(r) => r.into_json().unwrap(),
        Err(ureq::Error::Status(code, r)) => {
            json!({"status": code, "body": r.into_string().unwrap_or_default()})
        }
        Err(e) => panic!("POST /v1/select: {e}"),
    }
}

fn compile_c(dir: &Path, name: &str, source: &Path, include: &Path) -> PathBuf {
    support::compile_c(dir, name, source, include, &[])
}

#[test]
fn plugins_built_against_the_frozen_1_1_header_load_and_route_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let frozen = repo().join("tests/fixtures/abi-1.1");
    let header = std::fs::read_to_string(frozen.join("switchyard/plugin.h")).unwrap();
    assert!(
        header.contains("#define SWITCHYARD_ABI_MINOR 1"),
        "the frozen header is 1.1"
    );
    assert!(!header.contains("SWITCHYARD_INPUT_ENGINE"));
    let least_busy = compile_c(
        dir.path(),
        "least_busy_1_1",
        &repo().join("plugins/c/least-busy/least_busy.c"),
        &frozen,
    );
    let zone = compile_c(
        dir.path(),
        "zone_1_1",
        &repo().join("plugins/c/zone/zone.c"),
        &frozen,
    );
    let yaml = format!(
        "plugins:\n  - path: {}\n  - path: {}\nworkers:\n  - {{model: m, worker_id: 1, labels: {{zone: b}}}}\n  - {{model: m, worker_id: 2, labels: {{zone: a}}}}\n  - {{model: m, worker_id: 3, labels: {{zone: a}}}}\nworker_selection:\n  default: zone\n  instances:\n    - {{name: zone, type: c.zone-least-busy, parameters: {{zone: a}}}}\n    - {{name: busy, type: c.least-busy}}\n",
        least_busy.display(),
        zone.display()
    );
    let config = write_config(dir.path(), &yaml);
    check_passes(&config);
    let server = serve(&config);
    let agent = agent();
    for n in 0..4 {
        let picked = agent
            .post(&format!("{}/v1/reserve", server.address))
            .send_json(json!({"model": "m", "block_hashes": [1], "request_id": format!("r{n}")}))
            .unwrap()
            .into_json::<Value>()
            .unwrap();
        let worker = picked["worker_id"].as_u64().unwrap();
        assert!(worker == 2 || worker == 3, "zone a only: {picked}");
    }
    let busy = select(
        &agent,
        &server.address,
        json!({"model": "m", "instance": "busy", "block_hashes": [1]}),
    );
    assert_eq!(busy["worker_id"], 1, "the least busy: {busy}");
}

/// Two engines, one per zone, known by `url` (the frontend) and `address` (Envoy).
fn zoned_router(dir: &Path, engines: &[&Process], picker: u16, isolation: &str) -> Process {
    let workers: String = engines
        .iter()
        .zip(["a", "b"])
        .enumerate()
        .map(|(i, (e, zone))| {
            format!(
                "  - {{model: demo, worker_id: {}, url: \"{}\", address: \"{}\", labels: {{zone: {zone}}}}}\n",
                i + 1,
                e.address,
                e.address.trim_start_matches("http://")
            )
        })
        .collect();
    let yaml = format!(
        "request_attributes: {{headers: [X-Zone]}}\nplugins:\n  - path: {}\n{isolation}models:\n  demo: {{kv_tracking: predicted}}\nworkers:\n{workers}worker_selection:\n  default: zoned\n  instances:\n    - name: zoned\n      filters: [{{type: c.label-matches-header, parameters: {{label: zone, header: x-zone}}}}]\n      scorers: [{{type: builtin.active-requests}}]\n      picker: {{type: builtin.lowest-cost, parameters: {{tie_break: worker-id}}}}\n",
        cmake_plugin("header_match_c").display()
    );
    let config = write_config(dir, &yaml);
    serve_with_picker(&config, picker)
}

fn header_filter_on_every_path(isolation: &str) {
    let dir = tempfile::tempdir().unwrap();
    let a = engine_sim("engine-a", "127.0.0.1:0", &[]);
    let b = engine_sim("engine-b", "127.0.0.1:0", &[]);
    let port = free_port();
    let router = zoned_router(dir.path(), &[&a, &b], port, isolation);
    let agent = agent();
    let frontend = format!("{}/v1/chat/completions", router.address);
    // The frontend: the caller's zone wins over the lower worker id.
    for n in 0..3 {
        let (status, engine) = post_zoned(&agent, &frontend, Some("b"), &chat(&format!("f{n}")));
        assert_eq!((status, engine.as_str()), (200, "worker-2"));
    }
    let (status, engine) = post_zoned(&agent, &frontend, None, &chat("no zone"));
    assert_eq!(
        (status, engine.as_str()),
        (200, "worker-1"),
        "no header: every worker, the lowest id"
    );
    // `/v1/select`: a gateway passes the headers in the attributes.
    let picked = select(
        &agent,
        &router.address,
        json!({"model": "demo", "block_hashes": [1], "attributes": {"headers": {"X-Zone": "b"}}}),
    );
    assert_eq!(picked["worker_id"], 2, "{picked}");
    let picked = select(
        &agent,
        &router.address,
        json!({"model": "demo", "block_hashes": [1], "attributes": {"headers": {"x-zone": "nowhere"}}}),
    );
    assert!(
        picked["body"]
            .as_str()
            .unwrap_or("")
            .contains("c.label-matches-header"),
        "no worker in that zone: the filter is named: {picked}"
    );
    // A real Envoy: its request headers reach the picker over ext_proc.
    let envoy = Envoy::start(dir.path(), port);
    let through_envoy = format!("{}/v1/chat/completions", envoy.base);
    eventually("Envoy routes", Duration::from_secs(20), || {
        post_zoned(&agent, &through_envoy, Some("b"), &chat("ready?")).0 == 200
    });
    for n in 0..3 {
        let (status, engine) =
            post_zoned(&agent, &through_envoy, Some("b"), &chat(&format!("e{n}")));
        assert_eq!((status, engine.as_str()), (200, "engine-b"));
    }
    let (status, engine) = post_zoned(&agent, &through_envoy, Some("a"), &chat("zone a"));
    assert_eq!((status, engine.as_str()), (200, "engine-a"));
}

#[test]
fn a_c_filter_matches_a_request_header_through_the_frontend_envoy_and_select() {
    header_filter_on_every_path("");
}

#[test]
fn the_header_filter_works_isolated_in_a_child_process_too() {
    header_filter_on_every_path("    isolation: process\n");
}

/// Opens `n` streamed completions straight to `engine` (bypassing the router) and keeps
/// them open: each holds the engine busy for a while.
fn bypass(engine: &Process, n: usize) -> Vec<std::net::TcpStream> {
    let address = engine.address.trim_start_matches("http://");
    (0..n)
        .map(|i| {
            let mut s = std::net::TcpStream::connect(address).unwrap();
            let body = json!({"model": "demo", "stream": true, "max_tokens": 400,
                              "messages": [{"role": "user", "content": format!("outside {i}")}]})
            .to_string();
            write!(
                s,
                "POST /v1/chat/completions HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            s
        })
        .collect()
}

#[test]
fn engine_reported_load_routes_around_traffic_that_bypasses_the_router() {
    let dir = tempfile::tempdir().unwrap();
    // 400 tokens at 40 tokens/s: each outside request runs for 10 s.
    let slow = ["--decode-tps", "40"];
    let a = engine_sim("engine-a", "127.0.0.1:0", &slow);
    let b = engine_sim("engine-b", "127.0.0.1:0", &slow);
    let yaml = format!(
        "engine_metrics: {{interval_ms: 100, timeout_ms: 500}}\nworkers:\n{}worker_selection:\n  default: engine\n  instances:\n    - name: engine\n      scorers: [{{type: builtin.engine-queue}}]\n      picker: {{type: builtin.lowest-cost, parameters: {{tie_break: worker-id}}}}\n    - name: booked\n      scorers: [{{type: builtin.active-requests}}]\n      picker: {{type: builtin.lowest-cost, parameters: {{tie_break: worker-id}}}}\n    - {{name: blended, type: default, parameters: {{engine_load_weight: 1}}}}\n",
        demo_workers([&a, &b], false)
    );
    let config = write_config(dir.path(), &yaml);
    let router = serve(&config);
    let agent = agent();
    let pick = |instance: &str| {
        select(
            &agent,
            &router.address,
            json!({"model": "demo", "instance": instance, "block_hashes": [1]}),
        )["worker_id"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(
        (pick("engine"), pick("booked")),
        (1, 1),
        "an idle fleet: the lowest id"
    );
    let mut outside = bypass(&a, 6);
    // engine-a reports the six on its /metrics; the router's next scrape sees them.
    eventually(
        "the engine-queue policy sees engine-a's load",
        Duration::from_secs(10),
        || pick("engine") == 2,
    );
    assert_eq!(pick("booked"), 1, "bookings alone see nothing on engine-a");
    let workers = || -> Value {
        agent
            .get(&format!("{}/v1/workers", router.address))
            .call()
            .unwrap()
            .into_json()
            .unwrap()
    };
    // The engine admits arrivals at its next step: a scrape in between counts some of
    // the six as waiting, so the sample is waited for, not assumed.
    eventually(
        "engine-a's sample shows the six running",
        Duration::from_secs(10),
        || workers()[0]["engine"]["running_requests"] == 6.0,
    );
    let workers = workers();
    let engine = &workers[0]["engine"];
    assert_eq!(engine["state"], "fresh", "{workers}");
    assert_eq!(engine["running_requests"], 6.0, "{workers}");
    assert!(workers[0].get("engine_error").is_none(), "{workers}");
    assert_eq!(
        pick("blended"),
        2,
        "default with engine_load_weight sees it"
    );
    // Reserved requests through the engine-aware policy go to engine-b.
    for n in 0..3 {
        let reserved: Value = agent
            .post(&format!("{}/v1/reserve", router.address))
            .send_json(json!({"model": "demo", "block_hashes": [n], "request_id": format!("r{n}")}))
            .unwrap()
            .into_json()
            .unwrap();
        assert_eq!(reserved["worker_id"], 2, "{reserved}");
    }
    // The outside traffic ends: engine-a empties, and wins again on the tie-break
    // over engine-b's three bookings.
    for s in &mut outside {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    eventually("engine-a's load clears", Duration::from_secs(10), || {
        pick("engine") == 1
    });
    let mut metrics = String::new();
    std::net::TcpStream::connect(a.address.trim_start_matches("http://"))
        .and_then(|mut s| {
            s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")?;
            s.read_to_string(&mut metrics)
        })
        .unwrap();
    assert!(metrics.contains("vllm:num_requests_running"), "{metrics}");
}

/// `switchyard select` carries the request's attributes (`--header`, `--lora-adapter`) and
/// a fleet's engine samples (`engine:`) to every component: the C header filter, the
/// built-in engine-queue and LoRA scorers, and the C++ LoRA scorer.
#[test]
fn select_cli_takes_attributes_and_engine_samples() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = dir.path().join("fleet.yaml");
    std::fs::write(
        &fleet,
        "- {worker_id: 1, labels: {zone: a}, engine: {running_requests: 9, waiting_requests: 4}}\n\
         - {worker_id: 2, labels: {zone: b}, engine: {running_requests: 1, running_adapters: [sql]}}\n\
         - {worker_id: 3, labels: {zone: b}}\n",
    )
    .unwrap();
    let yaml = format!(
        "plugins:\n  - path: {}\n  - path: {}\nworker_selection:\n  default: zoned\n  instances:\n    - name: zoned\n      filters: [{{type: c.label-matches-header, parameters: {{label: zone, header: x-zone}}}}]\n      scorers: [{{type: builtin.engine-queue}}, {{type: builtin.lora-affinity, weight: 5}}, {{type: cpp.lora-affinity}}]\n      picker: {{type: builtin.lowest-cost, parameters: {{tie_break: worker-id}}}}\n",
        cmake_plugin("header_match_c").display(),
        cmake_plugin("lora_affinity_cpp").display()
    );
    let config = write_config(dir.path(), &yaml);
    let select = |extra: &[&str]| {
        let output = Command::new(switchyard_bin())
            .args(["select", "--explain", "--config"])
            .arg(&config)
            .arg("--fleet")
            .arg(&fleet)
            .args(extra)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let zoned = select(&["--header", "x-zone=b", "--lora-adapter", "sql"]);
    assert!(
        zoned.ends_with("worker 2 dp_rank 0\n"),
        "zone b, adapter running on 2:\n{zoned}"
    );
    assert!(zoned.lines().nth(1).unwrap().contains("DROP"), "{zoned}");
    let anywhere = select(&[]);
    assert!(
        anywhere.ends_with("worker 3 dp_rank 0\n"),
        "no zone, no adapter: the idle engine:\n{anywhere}"
    );
    assert!(
        anywhere.contains("13.000"),
        "engine 1's queue is 9 + 4:\n{anywhere}"
    );
}

/// Every YAML example of docs/engine-load.md is a config `switchyard check` accepts.
#[test]
fn the_engine_load_guide_configs_pass_check() {
    let markdown = std::fs::read_to_string(repo().join("docs/engine-load.md")).unwrap();
    let examples = blocks(&markdown, "yaml");
    assert!(examples.len() >= 3);
    let dir = tempfile::tempdir().unwrap();
    for (i, yaml) in examples.iter().enumerate() {
        let folder = dir.path().join(format!("example-{i}"));
        std::fs::create_dir_all(&folder).unwrap();
        check_passes(&write_config(&folder, yaml));
    }
}

/// A policy type whose build adds no picker is refused naming the type and its library,
/// not only the instance.
#[test]
fn a_policy_type_without_a_picker_is_refused_naming_its_library() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("no_picker.c");
    std::fs::write(
        &source,
        r#"#include <stdlib.h>
#include <switchyard/plugin.h>
static int32_t validate(void *u, const switchyard_params *p, void **out, const switchyard_error *e) {
    (void)u; (void)p; (void)e; *out = NULL; return SWITCHYARD_STATUS_OK;
}
static int32_t build(void *f, const switchyard_partition *p, const switchyard_policy_builder *b,
                     const switchyard_error *e) {
    (void)f; (void)p; (void)e;
    return switchyard_builder_add_registered(b, "builtin.active-requests", "", 1.0, e);
}
static const switchyard_policy_def def = {
    .struct_size = sizeof(switchyard_policy_def), .type_name = "acme.no-picker",
    .on_validate = validate, .on_build = build,
};
static int32_t reg(const switchyard_registrar *r, const switchyard_error *e) {
    return r->callback_register_policy(r, &def, e);
}
SWITCHYARD_PLUGIN("acme-no-picker", "1.0.0", "tests", reg)
"#,
    )
    .unwrap();
    let lib = compile_c(dir.path(), "no_picker", &source, &repo().join("include"));
    let yaml = format!(
        "plugins:\n  - path: {}\nworker_selection:\n  instances:\n    - {{name: p, type: acme.no-picker}}\n",
        lib.display()
    );
    let config = write_config(dir.path(), &yaml);
    let output = Command::new(switchyard_bin())
        .args(["check", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("a policy needs exactly one picker; policy type `acme.no-picker`")
            && stderr.contains("no_picker.so")
            && stderr.contains("added none"),
        "{stderr}"
    );
}

/// `check` says when an instance reads ENGINE while no engine is scraped.
#[test]
fn check_warns_when_engine_load_is_read_but_never_scraped() {
    let dir = tempfile::tempdir().unwrap();
    let instances = "worker_selection:\n  instances:\n    - name: engine\n      scorers: [{type: builtin.engine-queue}]\n      picker: {type: builtin.lowest-cost}\n    - {name: plain, type: builtin.least-busy}\n";
    let check = |yaml: &str| check_passes(&write_config(dir.path(), yaml));
    let warned = check(instances);
    assert!(
        warned.contains("instance `engine` reads engine-reported load")
            && warned.contains("engine_metrics.interval_ms")
            && !warned.contains("`plain`"),
        "{warned}"
    );
    let scraped = check(&format!(
        "engine_metrics: {{interval_ms: 500}}\n{instances}"
    ));
    assert!(!scraped.contains("engine-reported"), "{scraped}");
}
