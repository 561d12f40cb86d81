//! TLS end to end, with CAs made for the test run: the router serves https (curl and the
//! official OpenAI Python client talk to it), proxies to an https engine verified
//! against `frontend.engine_ca`, refuses a certificate it cannot verify with a message
//! that says so, and takes new certificates on SIGHUP without a restart. The picker's
//! gRPC listener serves TLS with mutual authentication.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use support::*;

/// A CA of the test's own, written as `NAME.pem` in `dir`.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pem: PathBuf,
}

impl Ca {
    fn new(dir: &Path, name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("switchyard test CA {name}"));
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let pem = dir.join(format!("{name}.pem"));
        std::fs::write(&pem, issuer.pem()).unwrap();
        Ca { issuer, pem }
    }

    /// A leaf for localhost and 127.0.0.1, written as `NAME.crt` and `NAME.key`.
    fn leaf(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (cert_path, key_path) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }
}

fn curl(ca: &Path, url: &str, body: Option<&str>) -> (bool, String, String) {
    let mut command = Command::new("curl");
    command
        .args(["--silent", "--show-error", "--max-time", "20", "--cacert"])
        .arg(ca)
        .arg(url);
    if let Some(body) = body {
        command.args(["-H", "content-type: application/json", "--data", body]);
    }
    let out = command.output().expect("curl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn https_engine(name: &str, model: &str, cert: &Path, key: &Path) -> Process {
    Process::start(
        Command::new(switchyard_bin())
            .args([
                "engine-sim",
                "--model",
                model,
                "--name",
                name,
                "--listen",
                "127.0.0.1:0",
                "--tls-cert",
            ])
            .arg(cert)
            .arg("--tls-key")
            .arg(key)
            .env("RUST_LOG", "warn"),
        "engine-sim listening on ",
    )
}

/// Worker 2 (the rogue engine) is out, its health error naming the unknown issuer and
/// `frontend.engine_ca` (30 s at most).
fn rogue_engine_out_for_its_issuer(ca: &std::path::Path, base: &str) {
    let reason = eventually_ok(
        "worker 2's health error naming the unknown issuer",
        std::time::Duration::from_secs(30),
        || {
            let (_, workers, _) = curl(ca, &format!("{base}/v1/workers"), None);
            let workers: serde_json::Value = serde_json::from_str(&workers).unwrap();
            let reason = workers[1]["health_error"].as_str().unwrap_or_default();
            if reason.contains("UnknownIssuer") {
                Ok(reason.to_owned())
            } else {
                Err(workers)
            }
        },
    );
    assert!(reason.contains("frontend.engine_ca"), "{reason}");
}

fn openai_client_over_https(base: &str, ca: &std::path::Path) {
    let python = repo().join("target/test-venv/bin/python");
    assert!(
        python.exists(),
        "no {}: run scripts/install-test-tools (make test does) for the OpenAI client",
        python.display()
    );
    let script = r#"
import sys, openai
client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused", http_client=openai.DefaultHttpxClient(verify=sys.argv[2]))
answer = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
print(answer.system_fingerprint, answer.choices[0].finish_reason)
chunks = list(client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True))
print("streamed", len(chunks))
"#;
    let out = Command::new(&python)
        .args(["-c", script, base])
        .arg(ca)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("tls-engine"), "{stdout}");
    assert!(stdout.contains("streamed"), "{stdout}");
}

const CHAT: &str = r#"{"model": "demo", "messages": [{"role": "user", "content": "hello over TLS"}], "max_tokens": 4}"#;

#[test]
fn https_clients_and_https_engines_with_a_test_ca_and_certificates_reloaded_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (ca, other_ca) = (Ca::new(d, "ca"), Ca::new(d, "other-ca"));
    let (router_cert, router_key) = ca.leaf(d, "router");
    let (engine_cert, engine_key) = ca.leaf(d, "engine");
    let (rogue_cert, rogue_key) = other_ca.leaf(d, "rogue");
    let engine = https_engine("tls-engine", "demo", &engine_cert, &engine_key);
    let rogue = https_engine("rogue-engine", "rogue", &rogue_cert, &rogue_key);
    let https = engine.address.starts_with("https://127.0.0.1:");
    assert!(https, "{}", engine.address);
    let config = write_config(
        d,
        &format!(
            "http:\n  tls: {{cert: router.crt, key: router.key}}\nfrontend:\n  engine_ca: ca.pem\nworkers:\n  - {{model: demo, worker_id: 1, url: '{}'}}\n  - {{model: rogue, worker_id: 2, url: '{}'}}\n",
            engine.address, rogue.address
        ),
    );
    let router = serve(&config);
    assert!(router.address.starts_with("https://"), "{}", router.address);
    let base = router
        .address
        .replace("https://127.0.0.1", "https://localhost");

    // curl, verifying against the test CA; through the router to the https engine.
    let (ok, out, err) = curl(&ca.pem, &format!("{base}/healthz"), None);
    assert!(ok, "{err}");
    assert_eq!(out, "ok\n");
    let (ok, out, err) = curl(&ca.pem, &format!("{base}/v1/chat/completions"), Some(CHAT));
    assert!(ok, "{err}");
    assert!(
        out.contains("tls-engine"),
        "answered by the https engine: {out}"
    );

    // A client that trusts another CA refuses the router's certificate, saying why.
    let (ok, _, err) = curl(&other_ca.pem, &format!("{base}/healthz"), None);
    assert!(!ok);
    assert!(err.to_lowercase().contains("certificate"), "{err}");

    // An engine whose certificate `frontend.engine_ca` does not vouch for is never sent a
    // prompt; the worker list says why it is out.
    let rogue_chat = CHAT.replace("\"demo\"", "\"rogue\"");
    let (ok, out, err) = curl(
        &ca.pem,
        &format!("{base}/v1/chat/completions"),
        Some(&rogue_chat),
    );
    assert!(ok, "{err}");
    assert!(!out.contains("rogue-engine"), "{out}");
    assert!(out.contains("\"error\""), "{out}");
    rogue_engine_out_for_its_issuer(&ca.pem, &base);

    // The official OpenAI Python client, over https with the test CA.
    openai_client_over_https(&base, &ca.pem);

    // New certificates (from another CA) on SIGHUP, no restart: new connections get them.
    let (new_cert, new_key) = other_ca.leaf(d, "router-next");
    std::fs::copy(new_cert, &router_cert).unwrap();
    std::fs::copy(new_key, &router_key).unwrap();
    let signalled = Command::new("kill")
        .args(["-HUP", &router.pid().to_string()])
        .status()
        .unwrap();
    assert!(signalled.success());
    eventually(
        "the reloaded certificate serves",
        std::time::Duration::from_secs(30),
        || curl(&other_ca.pem, &format!("{base}/healthz"), None).0,
    );
    assert!(
        !curl(&ca.pem, &format!("{base}/healthz"), None).0,
        "the old certificate is gone"
    );
}

#[test]
fn a_certificate_that_does_not_load_stops_startup_naming_the_setting_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new(d, "ca");
    let (cert, _) = ca.leaf(d, "router");
    let (_, other_key) = ca.leaf(d, "other");
    std::fs::write(d.join("empty.pem"), "not a certificate\n").unwrap();
    for (tls, expected) in [
        ("{cert: missing.crt, key: router.key}", "http.tls.cert"),
        ("{cert: empty.pem, key: router.key}", "no certificate in it"),
        (
            "{cert: router.crt, key: other.key}",
            "does not fit the certificate",
        ),
    ] {
        let _ = (&cert, &other_key);
        let config = write_config(d, &format!("http:\n  tls: {tls}\n"));
        let out = Command::new(switchyard_bin())
            .args(["check", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(expected),
            "check, {tls}: {stderr}"
        );
        let out = Command::new(switchyard_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{tls}: started");
        assert!(stderr.contains(expected), "{tls}: {stderr}");
    }
}

#[test]
fn the_picker_serves_grpc_over_mutual_tls_and_refuses_clients_without_a_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new(d, "ca");
    ca.leaf(d, "picker");
    let port = free_port();
    let config = write_config(
        d,
        &format!("ext_proc:\n  listen: 127.0.0.1:{port}\n  tls: {{cert: picker.crt, key: picker.key, client_ca: ca.pem}}\nworkers:\n  - {{model: demo, worker_id: 1, address: '127.0.0.1:9'}}\n"),
    );
    let _router = serve(&config);
    let (client_cert, client_key) = ca.leaf(d, "envoy");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
        use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
        switchyard::engines::tls::install_default_provider();
        let ca_pem = std::fs::read(&ca.pem).unwrap();
        let endpoint = |identity: Option<Identity>| {
            let mut tls = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&ca_pem))
                .domain_name("localhost");
            if let Some(identity) = identity {
                tls = tls.identity(identity);
            }
            Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
                .unwrap()
                .tls_config(tls)
                .unwrap()
        };
        let identity = Identity::from_pem(
            std::fs::read(&client_cert).unwrap(),
            std::fs::read(&client_key).unwrap(),
        );
        let channel = endpoint(Some(identity)).connect().await.unwrap();
        let status = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: "readiness".into(),
            })
            .await
            .unwrap();
        assert_eq!(status.into_inner().status, 1, "SERVING");
        // Without a client certificate the handshake fails.
        let refused = match endpoint(None).connect().await {
            Err(e) => e.to_string(),
            Ok(channel) => HealthClient::new(channel)
                .check(HealthCheckRequest {
                    service: "readiness".into(),
                })
                .await
                .map(|_| String::new())
                .unwrap_or_else(|e| e.to_string()),
        };
        assert!(
            !refused.is_empty(),
            "a client without a certificate was served"
        );
    });
}

#[test]
fn the_hardened_config_of_docs_security_md_passes_check_without_a_warning() {
    use std::os::unix::fs::PermissionsExt;
    let doc = std::fs::read_to_string(repo().join("docs/security.md")).unwrap();
    let hardened = doc.split("## A hardened config").nth(1).unwrap();
    let yaml = hardened
        .split("```yaml\n")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for folder in ["keys", "tls"] {
        std::fs::create_dir(d.join(folder)).unwrap();
    }
    let ca = Ca::new(&d.join("tls"), "engines-ca");
    Ca::new(&d.join("tls"), "gateway-ca");
    ca.leaf(&d.join("tls"), "router");
    for (file, key) in [
        ("chat-app", "chat-app-key-0123456789abcdef"),
        ("operators", "operator-key-0123456789abcdef"),
    ] {
        let path = d.join(format!("keys/{file}.keys"));
        std::fs::write(&path, format!("{key}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let config = write_config(d, yaml);
    let out = Command::new(switchyard_bin())
        .args(["check", "--config"])
        .arg(&config)
        .env("SWITCHYARD_GATEWAY_KEY", "gateway-key-0123456789abcdef")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");

    // The default config, by contrast, is warned about.
    let out = Command::new(switchyard_bin())
        .arg("check")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    for setting in [
        "auth.operators",
        "auth.clients",
        "router.worker_networks",
        "http.tls",
    ] {
        assert!(
            stderr.contains(setting),
            "check names `{setting}`: {stderr}"
        );
    }
}
