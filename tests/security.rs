//! Safe on a network, over loopback with real sockets and the real binary: API keys per
//! audience on every route (rotated by a reload), worker addresses that could exfiltrate
//! prompts or turn the router against itself refused, the refusal to serve a non-loopback
//! address unguarded, IPv4-mapped loopback, JSON 405/408/413.

mod support;

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};
use support::*;

const CLIENT_OLD: &str = "client-key-0123456789-old";
const CLIENT_NEW: &str = "client-key-0123456789-new";
const CLIENT_ROTATED_IN: &str = "client-key-0123456789-rotated-in";
const SCOPED: &str = "scoped-key-0123456789-other-model";
const OPERATOR: &str = "operator-key-0123456789abcdef";
const OPERATOR_ENV: &str = "SWITCHYARD_TEST_OPERATOR_KEY";

/// One HTTP call: status and body (JSON when it parses, else the text).
fn call(
    base: &str,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<&Value>,
) -> (u16, Value) {
    let mut request = ureq::request(method, &format!("{base}{path}"));
    if let Some(key) = key {
        request = request.set("authorization", &format!("Bearer {key}"));
    }
    let response = match body {
        Some(body) => request.send_json(body.clone()),
        None => request.call(),
    };
    let response = match response {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{method} {path}: {e}"),
    };
    let status = response.status();
    let text = response.into_string().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn serve_with_env(config: &Path, listen: &str, env: &[(&str, &str)], extra: &[&str]) -> Process {
    let mut command = Command::new(switchyard_bin());
    command
        .args(["serve", "--listen", listen, "--config"])
        .arg(config)
        .args(extra)
        .env("RUST_LOG", "warn");
    for (k, v) in env {
        command.env(k, v);
    }
    Process::start(&mut command, "switchyard listening on ")
}

fn keyed_config(dir: &Path, choose_instance: &str) -> std::path::PathBuf {
    std::fs::write(
        dir.join("clients.keys"),
        format!("# one key per line\n{CLIENT_OLD}\n{CLIENT_NEW}  # added for the rotation\n"),
    )
    .unwrap();
    std::fs::write(dir.join("scoped.keys"), format!("{SCOPED}\n")).unwrap();
    write_config(
        dir,
        &format!(
            "worker_selection:\n  instances:\n    - {{name: other, type: default}}\nworkers:\n  - {{model: demo, worker_id: 1}}\nauth:\n  choose_instance: {choose_instance}\n  clients:\n    - {{name: app, key_file: clients.keys}}\n    - {{name: scoped, key_file: scoped.keys, models: [other-model], instances: [other]}}\n  operators:\n    - {{name: ops, key_env: {OPERATOR_ENV}}}\n"
        ),
    )
}

/// Every route, with a body it accepts, by audience.
fn routes() -> Vec<(&'static str, &'static str, Option<Value>, &'static str)> {
    let select = json!({"model": "demo", "block_hashes": [1, 2]});
    let chat = json!({"model": "demo", "messages": [{"role": "user", "content": "hi"}]});
    vec![
        ("POST", "/v1/select", Some(select.clone()), "client"),
        ("POST", "/v1/chat/completions", Some(chat), "client"),
        (
            "POST",
            "/v1/completions",
            Some(json!({"model": "demo", "prompt": "hi"})),
            "client",
        ),
        ("GET", "/v1/models", None, "client"),
        (
            "POST",
            "/v1/reserve",
            Some(json!({"model": "demo", "request_id": "r1"})),
            "operator",
        ),
        ("POST", "/v1/requests/r1/prefill_complete", None, "operator"),
        ("POST", "/v1/requests/r1/free", None, "operator"),
        ("DELETE", "/v1/requests/r1", None, "operator"),
        ("GET", "/v1/workers", None, "operator"),
        (
            "POST",
            "/v1/workers",
            Some(json!({"model": "demo", "worker_id": 9})),
            "operator",
        ),
        ("DELETE", "/v1/workers/9", None, "operator"),
        (
            "POST",
            "/v1/kv_events",
            Some(json!({"worker_id": 1, "events": []})),
            "operator",
        ),
        ("GET", "/v1/policies", None, "operator"),
        ("GET", "/metrics", None, "operator"),
        ("POST", "/v1/admin/reload", None, "operator"),
        ("GET", "/v1/no-such-route", None, "operator"),
    ]
}

#[test]
fn every_route_answers_401_without_a_key_and_403_with_the_other_audiences() {
    let dir = tempfile::tempdir().unwrap();
    let config = keyed_config(dir.path(), "loopback");
    let server = serve_with_env(&config, "127.0.0.1:0", &[(OPERATOR_ENV, OPERATOR)], &[]);
    let base = &server.address;
    for open in ["/healthz", "/readyz"] {
        assert_eq!(
            call(base, "GET", open, None, None).0,
            200,
            "{open} stays open"
        );
    }
    for (method, path, body, audience) in routes() {
        let (status, error) = call(base, method, path, None, body.as_ref());
        assert_eq!(status, 401, "{method} {path} without a key: {error}");
        let openai = path.starts_with("/v1/chat")
            || path.starts_with("/v1/completions")
            || path == "/v1/models";
        if openai {
            assert_eq!(
                error["error"]["code"], "missing_api_key",
                "{path}: OpenAI's shape: {error}"
            );
            assert!(
                error["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("Bearer"),
                "{error}"
            );
        } else {
            assert_eq!(error["code"], "missing_api_key", "{path}: {error}");
            assert!(
                error["error"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("auth.{audience}s")),
                "{error}"
            );
        }
        let (status, error) = call(
            base,
            method,
            path,
            Some("not-a-key-of-anyone-here"),
            body.as_ref(),
        );
        assert_eq!(status, 401, "{method} {path} with an unknown key: {error}");
        let other = if audience == "client" {
            OPERATOR
        } else {
            CLIENT_NEW
        };
        let (status, error) = call(base, method, path, Some(other), body.as_ref());
        assert_eq!(
            status, 403,
            "{method} {path} with the other audience's key: {error}"
        );
        let own = if audience == "client" {
            CLIENT_OLD
        } else {
            OPERATOR
        };
        let (status, answer) = call(base, method, path, Some(own), body.as_ref());
        assert!(
            status != 401 && status != 403,
            "{method} {path} with its own audience's key: {status} {answer}"
        );
    }
    // No key ever shows in an answer.
    let (_, policies) = call(base, "GET", "/v1/policies", Some(OPERATOR), None);
    for key in [CLIENT_OLD, CLIENT_NEW, OPERATOR, SCOPED] {
        assert!(!policies.to_string().contains(key));
    }
}

/// The client keys file rewritten: the old key goes, a new one comes, with a reload and
/// no restart; a file that breaks the rules refuses the reload, the serving keys stay.
fn keys_rotate_by_reload(dir: &std::path::Path, base: &str) {
    std::fs::write(
        dir.join("clients.keys"),
        format!("{CLIENT_NEW}\n{CLIENT_ROTATED_IN}\n"),
    )
    .unwrap();
    let (status, reloaded) = call(base, "POST", "/v1/admin/reload", Some(OPERATOR), None);
    assert_eq!(status, 200, "{reloaded}");
    let select = json!({"model": "demo", "block_hashes": [1]});
    assert_eq!(
        call(base, "POST", "/v1/select", Some(CLIENT_OLD), Some(&select)).0,
        401,
        "rotated out"
    );
    assert_eq!(
        call(base, "POST", "/v1/select", Some(CLIENT_NEW), Some(&select)).0,
        200
    );
    assert_eq!(
        call(
            base,
            "POST",
            "/v1/select",
            Some(CLIENT_ROTATED_IN),
            Some(&select)
        )
        .0,
        200
    );

    // A key file that breaks the rules refuses the reload; the serving keys stay.
    std::fs::write(dir.join("clients.keys"), "short\n").unwrap();
    let (status, refused) = call(base, "POST", "/v1/admin/reload", Some(OPERATOR), None);
    assert_eq!(status, 422, "{refused}");
    let errors = refused["errors"].to_string();
    assert!(
        errors.contains("clients.keys, line 1") && errors.contains("at least 16 characters"),
        "{errors}"
    );
    assert!(
        !errors.contains("short"),
        "the key itself is never shown: {errors}"
    );
    assert_eq!(
        call(base, "POST", "/v1/select", Some(CLIENT_NEW), Some(&select)).0,
        200
    );
}

#[test]
fn a_client_key_cannot_register_a_worker_an_operator_key_can_and_keys_rotate_by_reload() {
    let dir = tempfile::tempdir().unwrap();
    let config = keyed_config(dir.path(), "loopback");
    let server = serve_with_env(&config, "127.0.0.1:0", &[(OPERATOR_ENV, OPERATOR)], &[]);
    let base = &server.address;
    let worker = json!({"model": "demo", "worker_id": 7, "url": "http://127.0.0.1:9"});
    assert_eq!(
        call(base, "POST", "/v1/workers", Some(CLIENT_OLD), Some(&worker)).0,
        403
    );
    let (status, added) = call(base, "POST", "/v1/workers", Some(OPERATOR), Some(&worker));
    assert_eq!(status, 201, "{added}");

    // Scopes: a key for another model may not route `demo`; a key's listed instance may
    // be chosen (loopback may choose any under `choose_instance: loopback`).
    let (status, error) = call(
        base,
        "POST",
        "/v1/select",
        Some(SCOPED),
        Some(&json!({"model": "demo"})),
    );
    assert_eq!(status, 403, "{error}");
    assert!(
        error["error"].as_str().unwrap().contains("model `demo`"),
        "{error}"
    );
    let pick = json!({"model": "demo", "instance": "other", "block_hashes": [1]});
    let (status, picked) = call(base, "POST", "/v1/select", Some(CLIENT_OLD), Some(&pick));
    assert_eq!(status, 200, "{picked}");

    // Rotation: the old key goes, a new one comes, with a reload and no restart.
    keys_rotate_by_reload(dir.path(), base);

    // `choose_instance: scoped`: only a key listing the instance may choose it.
    std::fs::write(dir.path().join("clients.keys"), format!("{CLIENT_NEW}\n")).unwrap();
    let scoped_config = std::fs::read_to_string(&config)
        .unwrap()
        .replace("choose_instance: loopback", "choose_instance: scoped");
    std::fs::write(&config, scoped_config).unwrap();
    assert_eq!(
        call(base, "POST", "/v1/admin/reload", Some(OPERATOR), None).0,
        200
    );
    let (status, error) = call(base, "POST", "/v1/select", Some(CLIENT_NEW), Some(&pick));
    assert_eq!(status, 403, "{error}");
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .contains("auth.choose_instance"),
        "{error}"
    );
}

#[test]
fn keys_never_stand_in_the_config_and_bad_key_sources_name_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    for (auth, expected) in [
        (
            "clients: [{name: a, key: abcdefghijklmnopqrstuvwxyz}]",
            "keys never stand in the config",
        ),
        (
            "clients: [{name: a, key_file: missing.keys}]",
            "missing.keys: cannot read it",
        ),
        (
            "clients: [{name: a, key_env: SWITCHYARD_TEST_UNSET_VARIABLE}]",
            "`SWITCHYARD_TEST_UNSET_VARIABLE` is not set",
        ),
        (
            "clients: [{name: a}]",
            "exactly one of `key_file` and `key_env`",
        ),
        (
            "operators: [{name: o, key_env: HOME, models: [x]}]",
            "scope client keys",
        ),
    ] {
        let config = write_config(dir.path(), &format!("auth:\n  {auth}\n"));
        let out = Command::new(switchyard_bin())
            .args(["check", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{auth}: check passed");
        assert!(stderr.contains(expected), "{auth}: {stderr}");
        assert!(
            stderr.contains("config.yaml:"),
            "{auth}: names the config line: {stderr}"
        );
        assert!(!stderr.contains("abcdefghijklmnopqrstuvwxyz"), "{stderr}");
    }
}

fn configured_worker_outside_the_allow_list_fails(dir: &std::path::Path) {
    let bad = write_config(dir, "router:\n  worker_networks: [10.0.0.0/8]\nworkers:\n  - {model: demo, worker_id: 1, url: 'http://192.168.0.5:8000'}\n");
    let out = Command::new(switchyard_bin())
        .args(["check", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("config.yaml:4:") && stderr.contains("worker 1: `url` host `192.168.0.5`"),
        "{stderr}"
    );
}

#[test]
fn worker_urls_that_would_exfiltrate_or_forge_requests_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "router:\n  worker_networks: [127.0.0.0/8, '*.engines.test']\n",
    );
    let server = serve(&config);
    let base = &server.address;
    let port = base.rsplit(':').next().unwrap();
    let add = |spec: Value| call(base, "POST", "/v1/workers", None, Some(&spec));
    let worker = |url: &str| json!({"model": "demo", "worker_id": 5, "url": url});
    for (url, expected) in [
        (
            format!("http://127.0.0.1:{port}/v1/admin/reload?"),
            "has a path",
        ),
        ("http://127.0.0.1:9?x=1".to_owned(), "query"),
        ("http://127.0.0.1:9#frag".to_owned(), "fragment"),
        (
            "http://user:hunter2@127.0.0.1:9".to_owned(),
            "user name or password",
        ),
        ("http://%%%:99999".to_owned(), "not a URL"),
        ("ftp://127.0.0.1:9".to_owned(), "scheme `ftp`"),
        ("http://10.1.2.3:8000".to_owned(), "router.worker_networks"),
        (
            "http://evil.example:8000".to_owned(),
            "router.worker_networks",
        ),
        (
            format!("http://127.0.0.1:{port}"),
            "points at the router itself",
        ),
        (
            format!("http://localhost:{port}"),
            "points at the router itself",
        ),
        (
            format!("http://[::ffff:127.0.0.1]:{port}"),
            "points at the router itself",
        ),
    ] {
        let (status, error) = add(worker(&url));
        assert_eq!(status, 400, "{url}: {error}");
        let message = error["error"].as_str().unwrap();
        assert!(message.contains(expected), "{url}: {message}");
        assert!(
            !message.contains("hunter2"),
            "a password is never repeated: {message}"
        );
    }
    let kv =
        json!({"model": "demo", "worker_id": 6, "kv_events": {"endpoint": "tcp://10.9.9.9:5557"}});
    let (status, error) = add(kv);
    assert_eq!(status, 400, "{error}");
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .contains("kv_events.endpoint"),
        "{error}"
    );
    let gateway = json!({"model": "demo", "worker_id": 6, "address": "192.168.1.1:8000"});
    assert_eq!(add(gateway).0, 400);

    for url in ["http://127.0.0.1:9", "https://engine-1.engines.test:8443/"] {
        let (status, added) = add(json!({"model": "demo", "worker_id": 8, "url": url}));
        assert_eq!(status, 201, "{url}: {added}");
        assert_eq!(call(base, "DELETE", "/v1/workers/8", None, None).0, 200);
    }
    let (_, workers) = call(base, "GET", "/v1/workers", None, None);
    assert!(!workers.to_string().contains("hunter2"));

    // A configured worker outside the allow-list fails the config, at its line.
    configured_worker_outside_the_allow_list_fails(dir.path());
}

/// Names in /etc/hosts (other than `localhost`) for a loopback address: each one is the
/// router's machine as much as `localhost` is (at most three, as written there).
fn loopback_names_in_hosts_file() -> Vec<String> {
    let hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    let mut names: Vec<String> = hosts
        .lines()
        .map(|line| line.split('#').next().unwrap_or(""))
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let ip: std::net::IpAddr = fields.next()?.parse().ok()?;
            ip.is_loopback()
                .then(|| fields.map(str::to_owned).collect::<Vec<_>>())
        })
        .flatten()
        .filter(|name| !name.eq_ignore_ascii_case("localhost"))
        .collect();
    names.dedup();
    names.truncate(3);
    names
}

/// The router's own port, however spelled: a trailing dot, IPv6 loopback, another
/// loopback address, a name that resolves to loopback; and an engine URL must name a
/// port other than 0 (`http://host` is not `http://host:80`). Nothing else is listed in
/// `router.worker_networks`, so only these checks stand in the way.
#[test]
fn a_worker_resolving_to_the_router_or_without_a_port_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(&write_config(dir.path(), "workers: []\n"));
    let base = &server.address;
    let port = base.rsplit(':').next().unwrap();
    let add = |spec: Value| call(base, "POST", "/v1/workers", None, Some(&spec));
    let mut own: Vec<String> = ["localhost.", "LocalHost", "[::1]", "127.0.0.2", "0.0.0.0"]
        .iter()
        .map(|host| format!("http://{host}:{port}"))
        .collect();
    own.extend(
        loopback_names_in_hosts_file()
            .iter()
            .map(|name| format!("http://{name}:{port}")),
    );
    let mut refusals: Vec<(String, &str)> = own
        .into_iter()
        .map(|url| (url, "points at the router itself"))
        .collect();
    refusals.push(("http://127.0.0.1".into(), "has no port"));
    refusals.push(("https://engine.invalid/".into(), "has no port"));
    refusals.push(("http://127.0.0.1:0".into(), "port 0"));
    for (url, expected) in &refusals {
        let (status, error) = add(json!({"model": "demo", "worker_id": 5, "url": url}));
        assert_eq!(status, 400, "{url}: {error}");
        let message = error["error"].as_str().unwrap_or_default();
        assert!(message.contains(expected), "{url}: {message}");
        assert!(message.contains("`url`"), "names the field: {message}");
    }
    let (status, error) = add(json!({"model": "demo", "worker_id": 5, "address": "127.0.0.1:0"}));
    assert_eq!(status, 400, "{error}");
    assert!(
        error["error"].as_str().unwrap().contains("port 0"),
        "{error}"
    );
    // An explicit default port is a port; another port on loopback is not the router.
    for url in ["http://127.0.0.1:80", "http://[::1]:9"] {
        let (status, added) = add(json!({"model": "demo", "worker_id": 8, "url": url}));
        assert_eq!(status, 201, "{url}: {added}");
        assert_eq!(call(base, "DELETE", "/v1/workers/8", None, None).0, 200);
    }
}

#[test]
fn a_non_loopback_address_without_keys_refuses_to_start_unless_told_insecure() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "workers:\n  - {model: demo, worker_id: 1}\n");
    let out = Command::new(switchyard_bin())
        .args(["serve", "--listen", "0.0.0.0:0", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started unguarded on 0.0.0.0");
    assert!(
        stderr.contains("auth.operators")
            && stderr.contains("--insecure")
            && stderr.contains("config.yaml"),
        "{stderr}"
    );

    // With --insecure on the IPv6 wildcard, a client on 127.0.0.1 arrives IPv4-mapped
    // (::ffff:127.0.0.1) and is still loopback: reload is answered.
    let server = serve_with_env(&config, "[::]:0", &[], &["--insecure"]);
    let port = server.address.rsplit(':').next().unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let (status, answer) = call(&base, "POST", "/v1/admin/reload", None, None);
    assert_eq!(status, 200, "{answer}");
}

#[test]
fn every_error_is_json_405_and_413_included() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "http: {max_body_bytes: 1000}\nworkers:\n  - {model: demo, worker_id: 1}\n",
    );
    let server = serve(&config);
    let base = &server.address;
    let (status, error) = call(base, "GET", "/v1/select", None, None);
    assert_eq!(status, 405);
    assert_eq!(error["code"], "method_not_allowed", "{error}");
    let (status, error) = call(base, "DELETE", "/v1/chat/completions", None, None);
    assert_eq!(status, 405);
    assert_eq!(
        error["error"]["code"], "method_not_allowed",
        "OpenAI's shape: {error}"
    );
    let big = json!({"model": "demo", "prompt": "x".repeat(2000)});
    let (status, error) = call(base, "POST", "/v1/completions", None, Some(&big));
    assert_eq!(status, 413);
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("http.max_body_bytes"),
        "{error}"
    );
    let (status, error) = call(base, "POST", "/v1/select", None, Some(&big));
    assert_eq!(status, 413);
    assert_eq!(error["code"], "body_too_large", "{error}");
    let (status, error) = call(base, "GET", "/nowhere", None, None);
    assert_eq!(status, 404);
    assert!(error["error"].is_string(), "{error}");
}

/// Sends `request` on a connection of its own and reads the answer to its end: the status,
/// the head and the body.
fn raw_answer(address: &str, request: &[u8]) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut tcp = std::net::TcpStream::connect(address).unwrap();
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    // hyper may answer and close before it read everything: the answer is still there.
    let _ = tcp.write_all(request);
    let mut answer = Vec::new();
    let _ = tcp.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_owned(), body.to_owned())
}

/// Every malformed request kind, from the request line to the body, is answered with a
/// JSON error naming what is wrong, those hyper answers itself (400, 414, 431) included.
#[test]
fn every_malformed_request_kind_gets_a_json_error() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(&write_config(dir.path(), "workers: []\n"));
    let address = server.address.trim_start_matches("http://").to_owned();
    let get = |extra: &str| {
        format!("GET /v1/workers HTTP/1.1\r\nhost: x\r\nconnection: close\r\n{extra}\r\n")
    };
    let post = |headers: &str, body: &str| {
        format!("POST /v1/select HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\n{headers}\r\n{body}")
    };
    let many: String = (0..500).map(|i| format!("x-h{i}: 1\r\n")).collect();
    let cases: Vec<(&str, u16, String)> = vec![
        ("no HTTP at all", 400, "BLAH\r\n\r\n".into()),
        (
            "TLS bytes on the plain port",
            400,
            "\u{16}\u{3}\u{1}\0\u{10}hello\r\n\r\n".into(),
        ),
        ("a header line without a colon", 400, get("bad header\r\n")),
        (
            "HTTP/2.0 in an HTTP/1 request line",
            400,
            "GET / HTTP/2.0\r\nhost: x\r\n\r\n".into(),
        ),
        (
            "a Content-Length that is not a number",
            400,
            post("content-length: abc\r\n", ""),
        ),
        ("500 headers", 431, get(&many)),
        (
            "a 600 KB header",
            431,
            get(&format!("x-big: {}\r\n", "a".repeat(600_000))),
        ),
        (
            "a 70 KB URI",
            414,
            format!("GET /{} HTTP/1.1\r\nhost: x\r\n\r\n", "a".repeat(70_000)),
        ),
        (
            "a path segment that is not UTF-8",
            400,
            "DELETE /v1/requests/%ff HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".into(),
        ),
        (
            "a body that is not JSON",
            400,
            post("content-length: 5\r\n", "{bad}"),
        ),
    ];
    for (kind, expected, request) in &cases {
        let (status, head, body) = raw_answer(&address, request.as_bytes());
        assert_eq!(status, *expected, "{kind}: {head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: application/json"),
            "{kind}: {head}"
        );
        let error: Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{kind}: {e}: {body:?}"));
        let message = error["error"].as_str().unwrap_or_default();
        assert!(message.len() > 10, "{kind}: an error message: {body}");
    }
    // After a good request on the same connection too (the second answer is the last).
    let (status, _, both) = raw_answer(
        &address,
        b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\nBLAH\r\n\r\n",
    );
    assert_eq!(status, 200, "{both}");
    assert!(both.ends_with(r#""code":"malformed_request"}"#), "{both}");
}

#[test]
fn a_body_trickled_past_the_timeout_gets_408_and_frees_the_connection() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "http: {body_read_timeout_secs: 1}\n");
    let server = serve(&config);
    let address = server.address.trim_start_matches("http://").to_owned();
    let mut tcp = std::net::TcpStream::connect(&address).unwrap();
    tcp.write_all(b"POST /v1/select HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"mo").unwrap();
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut answer = String::new();
    let _ = tcp.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("http.body_read_timeout_secs"), "{answer}");
}
