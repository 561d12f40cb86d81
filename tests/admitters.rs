//! ABI 1.3's admitters with real libraries and real processes: the C tenant allow-list
//! refuses strangers with an OpenAI-shaped 403 and orders the queue by its tenants'
//! priorities through the frontend, and refuses through a real Envoy (ext_proc), in
//! process and isolated; broken admitters are refused at load with the reason; a failing
//! one answers 503 or is passed over, as configured; the built-in rate limit refuses with
//! 429 and `Retry-After`; plugins built against the frozen 1.2 header load unchanged.

mod support;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use support::real_envoy::Envoy;
use support::*;

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(30))
        .build()
}

fn chat(content: &str, max_tokens: u32) -> Value {
    json!({"model": "demo", "max_tokens": max_tokens,
           "messages": [{"role": "user", "content": content}]})
}

/// POSTs `body` as `tenant` (when given): the status, the `Retry-After` header, and the
/// body as JSON (the error object of a refusal).
fn post_as(url: &str, tenant: Option<&str>, body: &Value) -> (u16, Option<String>, Value) {
    let mut request = agent().post(url);
    if let Some(tenant) = tenant {
        request = request.set("x-tenant", tenant);
    }
    match request.send_json(body.clone()) {
        Ok(r) => (r.status(), None, r.into_json().unwrap_or(Value::Null)),
        Err(ureq::Error::Status(code, r)) => {
            let retry = r.header("retry-after").map(str::to_owned);
            let body = r.into_string().unwrap_or_default();
            (
                code,
                retry,
                serde_json::from_str(&body).unwrap_or(json!(body)),
            )
        }
        Err(e) => (0, None, json!(e.to_string())),
    }
}

fn waiting(base: &str) -> f64 {
    metric(base, "switchyard_admission_waiting")
}

/// One engine, one request at a time; tenants from `x-tenant`; the C allow-list with
/// `gold` above `bronze`.
fn allowlist_router(dir: &Path, engine: &Process, picker: u16, isolation: &str) -> Process {
    let yaml = format!(
        "request_attributes: {{tenant: ['header:x-tenant']}}\nplugins:\n  - path: {}\n{isolation}admission:\n  busy: {{max_active_requests: 1}}\n  queue: {{max_wait_ms: 20000}}\n  admitters:\n    - type: c.tenant-allowlist\n      parameters:\n        tenants: [{{name: gold, priority: 10}}, {{name: bronze, priority: 0}}]\nworkers:\n  - {{model: demo, worker_id: 1, url: \"{}\", address: \"{}\"}}\n",
        cmake_plugin("tenant_allowlist_c").display(),
        engine.address,
        engine.address.trim_start_matches("http://")
    );
    let config = write_config(dir, &yaml);
    check_passes(&config);
    serve_with_picker(&config, picker)
}

fn allowlist_on_every_path(isolation: &str) {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_sim("e0", "127.0.0.1:0", &["--decode-tps", "100"]);
    let port = free_port();
    let router = allowlist_router(dir.path(), &engine, port, isolation);
    let base = router.address.clone();
    let url = format!("{base}/v1/chat/completions");
    // Strangers and requests without a tenant: 403, OpenAI-shaped, naming the tenant.
    let (status, _, body) = post_as(&url, Some("stranger"), &chat("hi", 1));
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "admission_rejected", "{body}");
    assert_eq!(body["error"]["type"], "permission_error", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains("tenant `stranger` is not served"),
        "{body}"
    );
    let (status, _, body) = post_as(&url, None, &chat("hi", 1));
    assert_eq!(status, 403, "{body}");
    assert_eq!(post_as(&url, Some("gold"), &chat("hi", 1)).0, 200);
    // The queue's order is the admitter's: a gold request overtakes bronze ones queued
    // before it (no request says its own priority).
    let finished = Arc::new(Mutex::new(Vec::new()));
    let send = |name: &'static str, tenant: &'static str, tokens: u32| {
        let (url, finished) = (url.clone(), finished.clone());
        std::thread::spawn(move || {
            let (status, _, _) = post_as(&url, Some(tenant), &chat(name, tokens));
            finished.lock().unwrap().push((name, status));
        })
    };
    let mut threads = vec![send("first", "bronze", 200)];
    wait_for("the first request booked", || {
        waiting(&base) == 0.0 && active_requests(&base) == [1]
    });
    for (i, name) in ["bronze-1", "bronze-2"].into_iter().enumerate() {
        threads.push(send(name, "bronze", 20));
        wait_for("the bronze request queued", || {
            waiting(&base) == (i + 1) as f64
        });
    }
    threads.push(send("gold", "gold", 20));
    wait_for("the gold request queued", || waiting(&base) == 3.0);
    for t in threads {
        t.join().unwrap();
    }
    let finished = finished.lock().unwrap().clone();
    assert!(finished.iter().all(|(_, s)| *s == 200), "{finished:?}");
    let order: Vec<&str> = finished.iter().map(|(n, _)| *n).collect();
    assert_eq!(order, ["first", "gold", "bronze-1", "bronze-2"]);
    // A real Envoy: the picker asks the same admitter; a refusal is Envoy's answer.
    let envoy = Envoy::start(dir.path(), port);
    let through = format!("{}/v1/chat/completions", envoy.base);
    wait_for("Envoy routes through the picker", || {
        post_as(&through, Some("gold"), &chat("ready?", 1)).0 == 200
    });
    let (status, _, body) = post_as(&through, Some("stranger"), &chat("hi", 1));
    assert_eq!(status, 403, "{body}");
    assert!(
        body.to_string().contains("tenant `stranger` is not served"),
        "{body}"
    );
    assert_eq!(post_as(&through, Some("bronze"), &chat("hi", 2)).0, 200);
    wait_for_no_bookings(&base, Duration::from_secs(10));
    assert_eq!(waiting(&base), 0.0);
}

#[test]
fn the_c_allowlist_refuses_and_orders_through_the_frontend_and_envoy() {
    allowlist_on_every_path("");
}

#[test]
fn the_c_allowlist_works_isolated_in_a_child_process_too() {
    allowlist_on_every_path("    isolation: process\n");
}

fn broken(dir: &Path, name: &str, defines: &[&str]) -> PathBuf {
    compile_c(
        dir,
        name,
        &repo().join("tests/fixtures/broken_admitter.c"),
        &repo().join("include"),
        defines,
    )
}

fn check_error(dir: &Path, yaml: &str) -> String {
    let config = write_config(dir, yaml);
    let output = std::process::Command::new(switchyard_bin())
        .args(["check", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!output.status.success(), "check passed:\n{yaml}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn broken_admitters_are_refused_at_load_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = |path: &Path| format!("plugins:\n  - path: {}\n", path.display());
    let cases = [
        (
            broken(dir.path(), "no_on_admit", &["NO_ON_ADMIT"]),
            "an admitter must set `on_admit`",
        ),
        (
            broken(dir.path(), "reads_cache", &["READS_CACHE"]),
            "it sees no candidates, so it may declare only SWITCHYARD_INPUT_ATTRIBUTES",
        ),
        (
            compile_c(
                dir.path(),
                "built_for_1_2",
                &repo().join("tests/fixtures/broken_admitter.c"),
                &repo().join("tests/fixtures/abi-1.2"),
                &[],
            ),
            "an admitter (kind 3) needs ABI 1.3; the plugin is built for 1.2",
        ),
    ];
    for (path, expected) in &cases {
        let error = check_error(dir.path(), &plugin(path));
        assert!(error.contains(expected), "{error}");
        assert!(error.contains("config.yaml:2:"), "names the line: {error}");
    }
    // Config mistakes, each at its line, all reported at once.
    let yaml = format!(
        "{}admission:\n  admitters:\n    - type: c.tenant-allowlist\n      parameters: {{tenants: [{{name: 5}}]}}\n    - type: builtin.lowest-cost\n    - type: acme.nope\nworker_selection:\n  instances:\n    - name: x\n      scorers: [{{type: c.tenant-allowlist}}]\n      picker: {{type: builtin.lowest-cost}}\n",
        plugin(&cmake_plugin("tenant_allowlist_c"))
    );
    let error = check_error(dir.path(), &yaml);
    for expected in [
        "config.yaml:5: admission.admitters: admitter `c.tenant-allowlist` (from plugin `acme-tenant-allowlist-c`",
        "`tenants[0].name` must be a non-empty string",
        "config.yaml:7: admission.admitters: `builtin.lowest-cost` is a picker, not an admitter; list it in an instance's `picker:`",
        "config.yaml:8: admission.admitters: unknown admitter type `acme.nope`. Registered admitters: builtin.rate-limit, builtin.strict-priority, c.tenant-allowlist",
        "config.yaml:12: instance `x`: `c.tenant-allowlist` is an admitter, but it is listed as a scorer; list it in `admission.admitters`",
    ] {
        assert!(error.contains(expected), "missing `{expected}` in:\n{error}");
    }
}

/// `/v1/reserve` against one engine with `admitters`: the status, `Retry-After` and body.
fn reserve(base: &str, n: u32, tenant: &str) -> (u16, Option<String>, Value) {
    post_as(
        &format!("{base}/v1/reserve"),
        None,
        &json!({"model": "demo", "block_hashes": [n], "request_id": format!("r{n}"),
                "attributes": {"tenant": tenant}}),
    )
}

fn router_with_admitters(dir: &Path, engine: &Process, plugins: &str, admitters: &str) -> Process {
    let yaml = format!(
        "{plugins}admission:\n  admitters:\n{admitters}workers:\n{}",
        demo_workers([engine], false)
    );
    serve(&write_config(dir, &yaml))
}

#[test]
fn a_failing_admitter_answers_503_unless_its_on_error_says_admit() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_sim("e0", "127.0.0.1:0", &[]);
    let failing = broken(dir.path(), "failing", &["FAIL"]);
    let status_200 = broken(dir.path(), "status_200", &["ANSWER_STATUS_200"]);
    let plugins = |path: &Path| format!("plugins:\n  - path: {}\n", path.display());
    let closed = router_with_admitters(
        dir.path(),
        &engine,
        &plugins(&failing),
        "    - {type: broken.admitter}\n",
    );
    let (status, retry, body) = reserve(&closed.address, 1, "a");
    assert_eq!((status, retry.as_deref()), (503, Some("1")), "{body}");
    let error = body["error"].as_str().unwrap_or("");
    assert!(
        error.contains("the allow-list service is unreachable"),
        "{body}"
    );
    assert!(error.contains("on_error is `reject`"), "{body}");
    drop(closed);
    let open = router_with_admitters(
        dir.path(),
        &engine,
        &plugins(&failing),
        "    - {type: broken.admitter, on_error: admit}\n",
    );
    assert_eq!(reserve(&open.address, 2, "a").0, 200);
    let metrics = agent()
        .get(&format!("{}/metrics", open.address))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("switchyard_component_errors_total{")
                && l.contains("broken.admitter")
                && l.ends_with(" 1")),
        "the failure is counted on its component:\n{metrics}"
    );
    drop(open);
    // An answer out of the ABI's range is the admitter's failure, not a 200.
    let invalid = router_with_admitters(
        dir.path(),
        &engine,
        &plugins(&status_200),
        "    - {type: broken.admitter}\n",
    );
    let (status, _, body) = reserve(&invalid.address, 3, "a");
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or("")
            .contains("rejected with status 200; a rejection's status is 400 to 599"),
        "{body}"
    );
}

#[test]
fn the_builtin_rate_limit_and_strict_priority_admit_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_sim("e0", "127.0.0.1:0", &[]);
    let router = router_with_admitters(
        dir.path(),
        &engine,
        "",
        "    - {type: builtin.strict-priority, parameters: {priorities: {vip: 10}, trust_request: false}}\n    - type: builtin.rate-limit\n      parameters: {limits: {noisy: {requests_per_s: 0.5, request_burst: 1}}}\n",
    );
    assert_eq!(reserve(&router.address, 1, "noisy").0, 200);
    let (status, retry, body) = reserve(&router.address, 2, "noisy");
    assert_eq!((status, retry.as_deref()), (429, Some("2")), "{body}");
    assert_eq!(body["code"], "admission_rejected", "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or("")
            .contains("tenant `noisy` is over its request rate (builtin.rate-limit)"),
        "{body}"
    );
    assert_eq!(reserve(&router.address, 3, "vip").0, 200, "another tenant");
    let policies: Value = agent()
        .get(&format!("{}/v1/policies", router.address))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    let admitters = &policies["admission"]["admitters"];
    assert_eq!(
        admitters[0]["type"], "builtin.strict-priority",
        "{policies}"
    );
    assert_eq!(admitters[1]["type"], "builtin.rate-limit", "{policies}");
    assert_eq!(
        admitters[1]["origin"], "the router (built-in)",
        "{policies}"
    );
}

#[test]
fn plugins_built_against_the_frozen_1_2_header_load_and_route_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let frozen = repo().join("tests/fixtures/abi-1.2");
    let header = std::fs::read_to_string(frozen.join("switchyard/plugin.h")).unwrap();
    assert!(
        header.contains("#define SWITCHYARD_ABI_MINOR 2"),
        "the frozen header is 1.2"
    );
    assert!(!header.contains("on_admit"));
    let least_busy = compile_c(
        dir.path(),
        "least_busy_1_2",
        &repo().join("plugins/c/least-busy/least_busy.c"),
        &frozen,
        &[],
    );
    let yaml = format!(
        "plugins:\n  - path: {}\nworkers:\n  - {{model: m, worker_id: 1}}\n  - {{model: m, worker_id: 2}}\nworker_selection:\n  default: busy\n  instances:\n    - {{name: busy, type: c.least-busy}}\n",
        least_busy.display()
    );
    let config = write_config(dir.path(), &yaml);
    check_passes(&config);
    let server = serve(&config);
    let mut picked = Vec::new();
    for n in 0..2 {
        let (status, _, body) = post_as(
            &format!("{}/v1/reserve", server.address),
            None,
            &json!({"model": "m", "block_hashes": [n], "request_id": format!("r{n}")}),
        );
        assert_eq!(status, 200, "{body}");
        picked.push(body["worker_id"].as_u64().unwrap());
    }
    picked.sort_unstable();
    assert_eq!(picked, [1, 2], "least busy spreads the two");
}

/// The C++ layer's `Admitter`: compiled here against `plugin.hpp`, loaded and asked on
/// `/v1/reserve`; its rejection's status and message reach the client as written.
#[test]
fn a_cpp_admitter_through_plugin_hpp() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("vip.cpp");
    std::fs::write(
        &source,
        r#"#include <switchyard/plugin.hpp>
class VipOnly : public switchyard::Admitter {
public:
    static constexpr uint32_t input_groups = switchyard::inputs::attributes;
    VipOnly(const switchyard::Params &, const switchyard::Partition &) {}
    uint32_t required_inputs() const override { return input_groups; }
    switchyard::Admission admit(const switchyard::Request &request,
                                const switchyard::Saturation &saturation) override {
        auto tenant = request.attributes().tenant();
        if (tenant && *tenant == "vip") {
            return switchyard::Admission::admit().priority(7).tenant("vip-lane");
        }
        return switchyard::Admission::reject(451, 0, "vip only; " +
            std::to_string(saturation.workers) + " workers");
    }
};
static void register_types(switchyard::Registrar &r) { r.admitter<VipOnly>("cpp.vip-only"); }
SWITCHYARD_CPP_PLUGIN("vip-only", "0.1.0", "switchyard tests", register_types)
"#,
    )
    .unwrap();
    let lib = dir.path().join("libvip.so");
    let status = std::process::Command::new("c++")
        .args([
            "-std=c++17",
            "-shared",
            "-fPIC",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-I",
        ])
        .arg(repo().join("include"))
        .arg(&source)
        .arg("-o")
        .arg(&lib)
        .status()
        .unwrap();
    assert!(status.success(), "compiling the C++ admitter");
    let engine = engine_sim("e0", "127.0.0.1:0", &[]);
    let router = router_with_admitters(
        dir.path(),
        &engine,
        &format!("plugins:\n  - path: {}\n", lib.display()),
        "    - {type: cpp.vip-only}\n",
    );
    assert_eq!(reserve(&router.address, 1, "vip").0, 200);
    let (status, retry, body) = reserve(&router.address, 2, "guest");
    assert_eq!((status, retry), (451, None), "{body}");
    assert_eq!(body["error"], "vip only; 1 workers", "{body}");
}

/// The Rust SDK's `RequestAdmitter` in a real library: the example's
/// `acme.shed-when-saturated` admits while a worker has room (queued as its lane) and, once
/// every worker is busy, sheds low-priority requests at once while high ones wait.
#[test]
fn a_rust_admitter_sheds_low_priority_when_saturated() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_sim("e0", "127.0.0.1:0", &[]);
    let yaml = format!(
        "plugins:\n  - path: {}\nadmission:\n  busy: {{max_active_requests: 1}}\n  queue: {{max_wait_ms: 300}}\n  admitters:\n    - {{type: acme.shed-when-saturated, parameters: {{keep_priority: 5, lane: shed-ok}}}}\nworkers:\n{}",
        rust_plugin("least_busy").display(),
        demo_workers([&engine], false)
    );
    let router = serve(&write_config(dir.path(), &yaml));
    let reserve = |n: u32, priority: i32| {
        post_as(
            &format!("{}/v1/reserve", router.address),
            None,
            &json!({"model": "demo", "block_hashes": [n], "request_id": format!("r{n}"),
                    "strict_priority": priority}),
        )
    };
    assert_eq!(reserve(1, 0).0, 200, "the worker has room");
    let (status, retry, body) = reserve(2, 0);
    assert_eq!((status, retry.as_deref()), (503, Some("1")), "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or("")
            .contains("all 1 workers are busy; requests below priority 5 are shed"),
        "{body}"
    );
    // A high one is admitted and waits; nothing frees within 300 ms, so it times out.
    let (status, _, body) = reserve(3, 9);
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or("")
            .contains("admission.queue.max_wait_ms"),
        "waited, then timed out: {body}"
    );
}
