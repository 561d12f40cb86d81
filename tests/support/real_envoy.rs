//! A real Envoy for the tests and the Envoy benchmark: the binary `scripts/install-test-tools`
//! provides, and the config `docs/envoy.md` ships (read from the doc, its addresses
//! changed to loopback ports), so the docs cannot drift from what runs.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// The fenced blocks of `lang` in `markdown`.
pub fn blocks(markdown: &str, lang: &str) -> Vec<String> {
    let fence = format!("```{lang}\n");
    markdown
        .split(&fence)
        .skip(1)
        .map(|rest| rest.split("```").next().unwrap_or_default().to_owned())
        .collect()
}

/// A loopback port nothing listens on (until a test starts something there).
/// A loopback port free now, for a process a test starts later (or restarts on the same
/// port). Taken below the kernel's ephemeral range (32768 and up): a port the kernel hands
/// out is soon some outgoing connection's local port, and a restarted engine would find
/// it taken. Each test process walks its own stretch (from its PID), so parallel test
/// binaries rarely meet; a port something listens on is skipped.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(2_654_435_761) % SPAN;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LOW + (start + n) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {LOW}..{}", LOW + SPAN)
}

pub fn envoy_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("SWITCHYARD_ENVOY") {
        return path.into();
    }
    let venv = repo().join("target/test-venv/bin/envoy");
    if venv.exists() {
        return venv;
    }
    let on_path = Command::new("sh")
        .args(["-c", "command -v envoy"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    on_path.unwrap_or_else(|| {
        panic!("no Envoy: run scripts/install-test-tools (make test does), put an envoy on PATH, or set SWITCHYARD_ENVOY")
    })
}

/// The Envoy config of docs/envoy.md, listening on `listen` and picking through the
/// switchyard at `picker`.
pub fn envoy_config(listen: u16, picker: u16) -> String {
    let doc = std::fs::read_to_string(repo().join("docs/envoy.md")).unwrap();
    let yaml = blocks(&doc, "yaml")
        .into_iter()
        .find(|b| b.contains("static_resources"))
        .expect("docs/envoy.md has an Envoy config");
    let mut config = yaml.clone();
    for (from, to) in [
        (
            "socket_address: { address: 0.0.0.0, port_value: 8080 }".to_owned(),
            format!("socket_address: {{ address: 127.0.0.1, port_value: {listen} }}"),
        ),
        (
            "socket_address: { address: 10.0.0.5, port_value: 9002 }".to_owned(),
            format!("socket_address: {{ address: 127.0.0.1, port_value: {picker} }}"),
        ),
    ] {
        assert!(
            config.contains(&from),
            "docs/envoy.md's config no longer has `{from}`"
        );
        config = config.replace(&from, &to);
    }
    config
}

/// docs/envoy.md's config with the processing mode of its "lean response path" section
/// (each `key: value` line of that block replaces the config's line of the same key).
pub fn lean_envoy_config(listen: u16, picker: u16) -> String {
    let doc = std::fs::read_to_string(repo().join("docs/envoy.md")).unwrap();
    let lean = blocks(&doc, "yaml")
        .into_iter()
        .find(|b| b.contains("response_body_mode: NONE") && !b.contains("static_resources"))
        .expect("docs/envoy.md has the lean response path's processing mode");
    let mut config = envoy_config(listen, picker);
    for line in lean
        .lines()
        .map(str::trim)
        .filter(|l| l.contains("_mode: "))
    {
        let key = line.split(':').next().unwrap();
        let Some(at) = config.find(&format!("{key}:")) else {
            panic!("docs/envoy.md's config has no `{key}` for the lean mode to replace");
        };
        let end = at + config[at..].find('\n').unwrap();
        config.replace_range(at..end, line);
    }
    config
}

/// A real Envoy, stopped by its PID when dropped.
pub struct Envoy {
    child: Child,
    pub base: String,
}

impl Envoy {
    /// The Envoy process's id (benchmarks read its CPU time from /proc).
    pub fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// An Envoy with docs/envoy.md's config, picking through `picker`.
    pub fn start(dir: &Path, picker: u16) -> Envoy {
        let port = free_port();
        Envoy::start_with(dir, port, &envoy_config(port, picker))
    }

    /// An Envoy running `config`, which listens on `port`.
    pub fn start_with(dir: &Path, port: u16, config_text: &str) -> Envoy {
        Envoy::start_with_env(dir, port, config_text, &[])
    }

    /// `start_with`, with `env` added to Envoy's environment (a dynamic module's search
    /// path, for one).
    pub fn start_with_env(
        dir: &Path,
        port: u16,
        config_text: &str,
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Envoy {
        let config = dir.join(format!("envoy-{port}.yaml"));
        std::fs::write(&config, config_text).unwrap();
        // One worker thread unless SWITCHYARD_ENVOY_WORKERS says otherwise (the Envoy
        // bench measures Envoy's default too: one worker per core).
        let workers = std::env::var("SWITCHYARD_ENVOY_WORKERS").unwrap_or_else(|_| "1".into());
        let mut child = Command::new(envoy_bin())
            .envs(env.iter().copied())
            .arg("-c")
            .arg(&config)
            .args([
                "--disable-hot-restart",
                "-l",
                "warning",
                "--concurrency",
                &workers,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("envoy starts");
        let stderr = child.stderr.take().unwrap();
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                kept.lock().unwrap().push(line);
            }
        });
        // Killed when dropped, also when it never listens.
        let mut envoy = Envoy {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        super::eventually::eventually_ok("envoy listens", Duration::from_secs(20), || {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(());
            }
            if let Ok(Some(status)) = envoy.child.try_wait() {
                panic!(
                    "envoy exited ({status}): {}",
                    lines.lock().unwrap().join("\n")
                );
            }
            Err(lines.lock().unwrap().join("\n"))
        });
        envoy
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Envoy config of docs/envoy.md's "Fallback endpoints": the main config with the
/// page's override-host route and cluster in place of the ORIGINAL_DST ones, the
/// cluster's hosts `engines`.
pub fn fallback_config(listen: u16, picker: u16, engines: &[std::net::SocketAddr]) -> String {
    let doc = std::fs::read_to_string(repo().join("docs/envoy.md")).unwrap();
    let snippet = blocks(&doc, "yaml")
        .into_iter()
        .find(|b| b.contains("override_host_sources"))
        .expect("docs/envoy.md has the fallback endpoints' route and cluster");
    let (route, cluster) = snippet
        .split_once("---\n")
        .expect("the snippet is the route, `---`, then the cluster");
    let indent = |text: &str, by: usize| -> String {
        text.lines()
            .map(|l| format!("{}{l}\n", " ".repeat(by)))
            .collect()
    };
    let mut config = envoy_config(listen, picker);
    let old_route = "                          route:\n                            cluster: original_destination_cluster\n                            timeout: 0s            # answers stream for as long as they take\n";
    assert!(config.contains(old_route), "docs/envoy.md's route changed");
    config = config.replace(old_route, &indent(route, 26));
    let start = config
        .find("    - name: original_destination_cluster")
        .expect("the ORIGINAL_DST cluster");
    let end = config
        .find("    - name: switchyard")
        .expect("the picker's cluster");
    let hosts: String = engines
        .iter()
        .map(|e| {
            format!(
                "          - endpoint: {{ address: {{ socket_address: {{ address: {}, port_value: {} }} }} }}\n",
                e.ip(),
                e.port()
            )
        })
        .collect();
    let mut cluster = cluster.to_owned();
    let doc_hosts: String = cluster
        .lines()
        .filter(|l| l.contains("- endpoint: { address:"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(!doc_hosts.is_empty(), "the cluster lists its hosts");
    cluster = cluster.replace(&doc_hosts, &hosts);
    config.replace_range(start..end, &indent(&cluster, 4));
    config
}

/// Builds `libswitchyard_envoy.so` (host/envoy-module) in this binary's profile (cargo
/// serializes it with any other build) and returns its folder, Envoy's
/// `ENVOY_DYNAMIC_MODULES_SEARCH_PATH`. It builds the workspace, as `make test` and
/// `make build` have just done (so it costs nothing there): `-p switchyard-envoy` alone
/// would resolve other features, relinking the module here and again at the next
/// workspace build. `SWITCHYARD_ENVOY_MODULE_DIR` names the folder of a module built
/// otherwise instead (a vendor's, or one built with profile-guided optimization), taken as
/// it is.
pub fn module_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SWITCHYARD_ENVOY_MODULE_DIR") {
        let dir = PathBuf::from(dir);
        assert!(
            dir.join("libswitchyard_envoy.so").exists(),
            "SWITCHYARD_ENVOY_MODULE_DIR={} holds no libswitchyard_envoy.so",
            dir.display()
        );
        return dir;
    }
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap().to_owned();
    let mut build = super::nested_cargo::nested_cargo();
    build.args(["build", "--quiet", "--workspace"]);
    if dir.ends_with("release") {
        build.arg("--release");
    }
    let status = build.status().expect("cargo runs");
    assert!(status.success(), "cargo build --workspace failed");
    assert!(
        dir.join("libswitchyard_envoy.so").exists(),
        "cargo build --workspace wrote no {}/libswitchyard_envoy.so",
        dir.display()
    );
    dir
}

/// docs/envoy.md's module config: listening on `listen`, switchyard's config at `config`,
/// its HTTP API on `api`, the cluster's hosts `engines`.
pub fn module_config(
    listen: u16,
    config: &Path,
    api: u16,
    engines: &[std::net::SocketAddr],
) -> String {
    let doc = std::fs::read_to_string(repo().join("docs/envoy.md")).unwrap();
    let yaml = blocks(&doc, "yaml")
        .into_iter()
        .find(|b| b.contains("dynamic_modules.v3.DynamicModuleFilter"))
        .expect("docs/envoy.md has the dynamic module's Envoy config");
    let hosts: String = engines
        .iter()
        .map(|e| {
            format!(
                "              - endpoint: {{ address: {{ socket_address: {{ address: {}, port_value: {} }} }} }}\n",
                e.ip(),
                e.port()
            )
        })
        .collect();
    let doc_hosts: String = yaml
        .lines()
        .filter(|l| l.contains("- endpoint: { address:"))
        .map(|l| format!("{l}\n"))
        .collect();
    let mut config_text = yaml.clone();
    for (from, to) in [
        (
            "socket_address: { address: 0.0.0.0, port_value: 8080 }".to_owned(),
            format!("socket_address: {{ address: 127.0.0.1, port_value: {listen} }}"),
        ),
        (
            "/etc/switchyard/switchyard.yaml".to_owned(),
            config.display().to_string(),
        ),
        ("127.0.0.1:9090".to_owned(), format!("127.0.0.1:{api}")),
        (doc_hosts, hosts),
    ] {
        assert!(
            !from.is_empty() && config_text.contains(&from),
            "docs/envoy.md's module config no longer has `{from}`"
        );
        config_text = config_text.replace(&from, &to);
    }
    config_text
}

/// docs/envoy.md's module config with `"headers_only": true` in the filter's config.
pub fn headers_only(text: String) -> String {
    let line = text
        .lines()
        .find(|l| l.contains("\"listen\":") && l.trim_end().ends_with("\"}'"))
        .expect("docs/envoy.md's filter_config value")
        .to_owned();
    let edited = line.replace("\"}'", "\", \"headers_only\": true}'");
    text.replace(&line, &edited)
}
