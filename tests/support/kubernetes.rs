//! A Kubernetes API server without a cluster, for the tests: Debian's etcd and a
//! kube-apiserver built by scripts/install-test-tools, both on loopback with certificates,
//! a token and a service-account key made here; stopped by their PIDs when dropped. No
//! kubelet runs: pods are API objects whose status (IP, Ready) the tests write.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use serde_json::{json, Value};

use super::{eventually_ok, free_port};

/// The version scripts/install-test-tools builds.
pub const KUBERNETES_VERSION: &str = "1.37.2";
const TOKEN: &str = "switchyard-test-admin-token";

/// The Gateway API version whose CRDs scripts/install-test-tools fetches.
pub const GATEWAY_API_VERSION: &str = "1.4.1";

/// Where scripts/install-test-tools keeps what it builds and fetches for Kubernetes.
fn kube_cache() -> PathBuf {
    let cache = std::env::var_os("SWITCHYARD_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("switchyard")))
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/switchyard")
        });
    cache.join(format!("kubernetes-v{KUBERNETES_VERSION}"))
}

fn cached_apiserver() -> PathBuf {
    kube_cache().join("kube-apiserver")
}

/// The Gateway API CRD file for `plural` (`gateways`, `httproutes`, `gatewayclasses`), or
/// why it is missing.
pub fn gateway_api_crd(plural: &str) -> Result<PathBuf, String> {
    let file = kube_cache()
        .join(format!("gateway-api-v{GATEWAY_API_VERSION}"))
        .join(format!("gateway.networking.k8s.io_{plural}.yaml"));
    if file.exists() {
        Ok(file)
    } else {
        Err(format!(
            "no Gateway API CRD at {} (scripts/install-test-tools fetches it)",
            file.display()
        ))
    }
}

/// etcd and kube-apiserver, or why not.
fn binaries() -> Result<(PathBuf, PathBuf), String> {
    let etcd = std::env::var_os("SWITCHYARD_ETCD")
        .map(PathBuf::from)
        .or_else(|| {
            ["/usr/bin/etcd", "/usr/local/bin/etcd"]
                .map(PathBuf::from)
                .into_iter()
                .find(|p| p.exists())
        })
        .ok_or("no etcd (apt-get install etcd-server, or set SWITCHYARD_ETCD)")?;
    let apiserver = std::env::var_os("SWITCHYARD_KUBE_APISERVER")
        .map(PathBuf::from)
        .unwrap_or_else(cached_apiserver);
    if !apiserver.exists() {
        return Err(format!(
            "no kube-apiserver at {} (scripts/install-test-tools builds it, or set SWITCHYARD_KUBE_APISERVER)",
            apiserver.display()
        ));
    }
    Ok((etcd, apiserver))
}

/// The API server and its etcd; killed by PID when dropped.
pub struct Cluster {
    etcd: Child,
    apiserver: Option<Child>,
    apiserver_args: Vec<String>,
    apiserver_bin: PathBuf,
    pub dir: tempfile::TempDir,
    pub url: String,
    pub ca: PathBuf,
    pub kubeconfig: PathBuf,
    api: Api,
}

impl Cluster {
    /// Starts both and waits for `/readyz`; `None` (said on stderr) when they are not
    /// installed, unless `SWITCHYARD_KUBERNETES=required`, where that fails the test.
    pub fn start() -> Option<Cluster> {
        let (etcd_bin, apiserver_bin) = match binaries() {
            Ok(found) => found,
            Err(why) if std::env::var("SWITCHYARD_KUBERNETES").as_deref() == Ok("required") => {
                panic!("SWITCHYARD_KUBERNETES=required, but {why}")
            }
            Err(why) => {
                eprintln!("skipped: {why}");
                return None;
            }
        };
        let dir = tempfile::tempdir().unwrap();
        let etcd_port = free_port();
        let etcd = Command::new(etcd_bin)
            .arg("--data-dir")
            .arg(dir.path().join("etcd"))
            .args([
                "--listen-client-urls",
                &format!("http://127.0.0.1:{etcd_port}"),
            ])
            .args([
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{etcd_port}"),
            ])
            .args([
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{}", free_port()),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd starts");
        let (ca, apiserver_args, port) = credentials(dir.path(), etcd_port);
        let url = format!("https://127.0.0.1:{port}");
        let kubeconfig = write_kubeconfig(dir.path(), "admin", &url, &ca, TOKEN, "default");
        let api = Api::new(&url, &ca);
        let mut cluster = Cluster {
            etcd,
            apiserver: None,
            apiserver_args,
            apiserver_bin,
            dir,
            url,
            ca,
            kubeconfig,
            api,
        };
        cluster.start_apiserver();
        Some(cluster)
    }

    /// Starts kube-apiserver (again, on the same port and etcd) and waits until ready.
    pub fn start_apiserver(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("apiserver.log")).unwrap();
        self.apiserver = Some(
            Command::new(&self.apiserver_bin)
                .args(&self.apiserver_args)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("kube-apiserver starts"),
        );
        let log = self.dir.path().join("apiserver.log");
        eventually_ok("kube-apiserver ready", Duration::from_secs(90), || {
            if let Some(status) = self.apiserver.as_mut().unwrap().try_wait().unwrap() {
                let tail = std::fs::read_to_string(&log).unwrap_or_default();
                let tail = &tail[tail.len().saturating_sub(3000)..];
                panic!("kube-apiserver exited ({status}):\n{tail}");
            }
            match self.api.call("GET", "/readyz", None) {
                (200, _) => Ok(()),
                (status, body) => Err(format!("{status} {body}")),
            }
        });
    }

    /// Kills kube-apiserver (etcd keeps the objects).
    pub fn stop_apiserver(&mut self) {
        if let Some(mut child) = self.apiserver.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn api(&self) -> &Api {
        &self.api
    }

    /// A kubeconfig with a token of service account `account` in `namespace` (its
    /// context's namespace), as a pod running under it would authenticate.
    pub fn service_account_kubeconfig(&self, namespace: &str, account: &str) -> PathBuf {
        let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}});
        let path = format!("/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token");
        let answer = self.api.ok("POST", &path, Some(&request));
        let token = answer["status"]["token"].as_str().unwrap();
        write_kubeconfig(
            self.dir.path(),
            account,
            &self.url,
            &self.ca,
            token,
            namespace,
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_apiserver();
        let _ = self.etcd.kill();
        let _ = self.etcd.wait();
    }
}

/// Writes the CA, the serving certificate, the token file and the service-account key;
/// the API server's arguments and port.
fn credentials(dir: &Path, etcd_port: u16) -> (PathBuf, Vec<String>, u16) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    let cert = CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let service_accounts = KeyPair::generate().unwrap();
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let ca = write("ca.crt", issuer.pem());
    let tls_cert = write("apiserver.crt", cert.pem());
    let tls_key = write("apiserver.key", key.serialize_pem());
    let sa_key = write("service-accounts.key", service_accounts.serialize_pem());
    let sa_public = write("service-accounts.pub", service_accounts.public_key_pem());
    let tokens = write(
        "tokens.csv",
        format!("{TOKEN},admin,admin-uid,system:masters\n"),
    );
    let port = free_port();
    let args = [
        format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        // No kubernetes Service endpoint to keep: it may not be a loopback address.
        "--endpoint-reconciler-type=none".into(),
        format!("--secure-port={port}"),
        format!("--tls-cert-file={tls_cert}"),
        format!("--tls-private-key-file={tls_key}"),
        format!("--token-auth-file={tokens}"),
        format!("--service-account-key-file={sa_public}"),
        format!("--service-account-signing-key-file={sa_key}"),
        "--service-account-issuer=https://kubernetes.default.svc".into(),
        "--authorization-mode=RBAC".into(),
        format!("--cert-dir={}", dir.join("certs").display()),
        "--service-cluster-ip-range=10.96.0.0/16".into(),
    ];
    (PathBuf::from(ca), args.to_vec(), port)
}

/// A kubeconfig `NAME.kubeconfig` for `token`, its context in `namespace`, as
/// `discovery.kubernetes.kubeconfig` reads it.
fn write_kubeconfig(
    dir: &Path,
    name: &str,
    url: &str,
    ca: &Path,
    token: &str,
    namespace: &str,
) -> PathBuf {
    let path = dir.join(format!("{name}.kubeconfig"));
    let config = json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": url, "certificate-authority": ca}}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": name, "namespace": namespace}}],
    });
    std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
    path
}

/// The API over HTTPS with the admin token, blocking (a runtime of its own).
pub struct Api {
    runtime: tokio::runtime::Runtime,
    client: reqwest::Client,
    url: String,
}

impl Api {
    fn new(url: &str, ca: &Path) -> Api {
        switchyard::engines::tls::install_default_provider();
        let ca = reqwest::Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap();
        let client = reqwest::Client::builder()
            .add_root_certificate(ca)
            .timeout(Duration::from_secs(20))
            .build()
            .unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        Api {
            runtime,
            client,
            url: url.to_owned(),
        }
    }

    /// `method path` with `body` (JSON, or a merge patch for PATCH); status and body.
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let content = if method == reqwest::Method::PATCH {
            "application/merge-patch+json"
        } else {
            "application/json"
        };
        self.send(method, path, body.map(|b| (content, b.to_string())))
    }

    /// A server-side apply of `object` at `path` (`dry_run`: validated, not stored).
    pub fn apply(&self, path: &str, object: &Value, dry_run: bool) -> (u16, Value) {
        let query = if dry_run { "&dryRun=All" } else { "" };
        let path = format!("{path}?fieldManager=switchyard-tests&force=true{query}");
        let body = ("application/apply-patch+yaml", object.to_string());
        self.send(reqwest::Method::PATCH, &path, Some(body))
    }

    fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<(&str, String)>,
    ) -> (u16, Value) {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(TOKEN);
        if let Some((content, body)) = body {
            request = request.header("content-type", content).body(body);
        }
        self.runtime.block_on(async {
            match request.send().await {
                Ok(answer) => {
                    let status = answer.status().as_u16();
                    let text = answer.text().await.unwrap_or_default();
                    (
                        status,
                        serde_json::from_str(&text).unwrap_or(Value::String(text)),
                    )
                }
                Err(e) => (0, Value::String(e.to_string())),
            }
        })
    }

    /// `call`, failing the test unless the answer is 2xx; its body.
    pub fn ok(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let (status, answer) = self.call(method, path, body);
        assert!(
            (200..300).contains(&status),
            "{method} {path}: {status} {answer}"
        );
        answer
    }

    /// Creates namespace `ns` and its `default` service account (no controller manager
    /// runs to make it, and pods need it).
    pub fn namespace(&self, ns: &str) {
        let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        self.ok("POST", "/api/v1/namespaces", Some(&namespace));
        let account =
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}});
        self.ok(
            "POST",
            &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
            Some(&account),
        );
    }

    /// Applies GIE's InferencePool CRD (tests/fixtures/kubernetes/) and waits until pools
    /// can be listed.
    pub fn inference_pool_crd(&self) {
        let file = super::repo().join("tests/fixtures/kubernetes/inferencepools-v1.6.0.yaml");
        self.crd(&file, "inferencepools", "inference.networking.k8s.io/v1");
    }

    /// Applies the CustomResourceDefinition in `file` (of `plural` in `group_version`) and
    /// waits until the API serves it.
    pub fn crd(&self, file: &std::path::Path, plural: &str, group_version: &str) {
        let crd: Value = serde_yaml::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        let group = group_version.split('/').next().unwrap_or_default();
        let path =
            format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.{group}");
        let (status, answer) = self.apply(&path, &crd, false);
        assert!(matches!(status, 200 | 201), "{}: {answer}", file.display());
        eventually_ok(
            &format!("{plural} served"),
            Duration::from_secs(30),
            || match self.call("GET", &format!("/apis/{group_version}/{plural}"), None) {
                (200, _) => Ok(()),
                (status, body) => Err(format!("{status} {body}")),
            },
        );
    }
}
