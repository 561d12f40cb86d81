//! Every file the config names passes one gate: a regular file, opened non-blocking, of a
//! size its kind can have, read in bounded steps. `http.tls.cert: /dev/zero` once made
//! `check` allocate without end, a FIFO as `cert:` hung it forever, and a plugin file
//! just under 1 GiB was read whole before its first bytes were looked at. Each case runs
//! the real `switchyard check`, under a time limit (a hang fails instead of hanging) and a
//! data limit (reading without end fails instead of taking the machine's memory).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use support::*;

/// Far more than any of these checks needs; a check that runs longer hangs.
const TIME_LIMIT: Duration = Duration::from_secs(30);

/// The check process's data limit (soft; its probe children may raise theirs).
const DATA_LIMIT: u64 = 1 << 30;

/// `switchyard check --config config`, which must fail within `TIME_LIMIT`; its stderr.
fn check_refuses(dir: &Path, config: &Path) -> String {
    let errors = dir.join("check.stderr");
    let mut command = Command::new(switchyard_bin());
    command
        .args(["check", "--config"])
        .arg(config)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&errors).unwrap());
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            use nix::sys::resource::{getrlimit, setrlimit, Resource};
            let (_, hard) = getrlimit(Resource::RLIMIT_DATA)?;
            setrlimit(Resource::RLIMIT_DATA, DATA_LIMIT.min(hard), hard)?;
            Ok(())
        });
    }
    // Killed when dropped: a check that hangs does not outlive the test.
    let mut check = Process {
        child: command.spawn().unwrap(),
        address: String::new(),
    };
    let status = eventually_ok(
        &format!(
            "check {} ends (else it hangs or reads without end)",
            config.display()
        ),
        TIME_LIMIT,
        || check.child.try_wait().unwrap().ok_or("still running"),
    );
    let stderr = std::fs::read_to_string(&errors).unwrap();
    assert_eq!(
        status.code(),
        Some(1),
        "check {}: {stderr}",
        config.display()
    );
    stderr
}

/// The files no setting should take, each with what the refusal must say it is.
fn bad_files(dir: &Path, oversized_bytes: u64) -> Vec<(PathBuf, &'static str)> {
    let fifo = dir.join("pipe");
    if !fifo.exists() {
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    }
    let folder = dir.join("folder");
    std::fs::create_dir_all(&folder).unwrap();
    // Sparse: as large as it says, without the disk space.
    let oversized = dir.join(format!("oversized-{oversized_bytes}"));
    std::fs::File::create(&oversized)
        .unwrap()
        .set_len(oversized_bytes)
        .unwrap();
    vec![
        (PathBuf::from("/dev/zero"), "is a character device"),
        (fifo, "is a FIFO"),
        (folder, "is a directory"),
        (oversized, "bytes, more than the"),
    ]
}

/// The refusal names the config file and line, the setting, the file and what it is.
fn refused_at_once(yaml: &str, line: usize, setting: &str, path: &Path, expected: &str) {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), yaml);
    let stderr = check_refuses(dir.path(), &config);
    for wanted in [
        format!("config.yaml:{line}"),
        setting.to_owned(),
        path.display().to_string(),
        expected.to_owned(),
    ] {
        assert!(stderr.contains(&wanted), "`{wanted}` not in: {stderr}");
    }
}

#[test]
fn a_tls_certificate_that_is_no_regular_file_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let limit = switchyard_plugin_host::file_gate::FileKind::Certificate.limit();
    for (path, expected) in bad_files(dir.path(), limit + 1) {
        let yaml = format!(
            "http:\n  tls: {{cert: {}, key: router.key}}\n",
            path.display()
        );
        refused_at_once(&yaml, 2, "http.tls.cert", &path, expected);
    }
}

#[test]
fn a_key_file_tokenizer_engine_ca_or_token_that_is_no_regular_file_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let limit = switchyard_plugin_host::file_gate::FileKind::Tokenizer.limit();
    let files = bad_files(dir.path(), limit + 1);
    for (path, expected) in &files {
        let p = path.display();
        let settings = [
            (
                format!("auth:\n  clients:\n    - {{name: app, key_file: {p}}}\n"),
                3,
                "key file",
            ),
            (
                format!("models:\n  demo:\n    tokenizer: {p}\n"),
                3,
                "tokenizer",
            ),
            (
                format!("frontend:\n  engine_ca: {p}\n"),
                2,
                "frontend.engine_ca",
            ),
            (
                format!("replicas:\n  nats: nats://127.0.0.1:4222\n  token_file: {p}\n"),
                3,
                "replicas.token_file",
            ),
        ];
        for (yaml, line, setting) in settings {
            if expected.contains("more than") && setting != "tokenizer" {
                continue; // oversized for a tokenizer, not for these: another size
            }
            refused_at_once(&yaml, line, setting, path, expected);
        }
    }
}

/// A plugin file is refused at its first bytes when they are no ELF header: a file just
/// under the 1 GiB cap is not read whole first (the check's data limit is 1 GiB).
#[test]
fn a_plugin_file_is_refused_by_its_header_before_the_rest_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let limit = switchyard_plugin_host::file_gate::FileKind::Plugin.limit();
    let mut files = bad_files(dir.path(), limit + 1);
    let large = dir.path().join("large.so");
    std::fs::File::create(&large)
        .unwrap()
        .set_len(limit - 1)
        .unwrap();
    files.push((large, "does not start with the ELF magic bytes"));
    for (path, expected) in &files {
        let yaml = format!("plugins:\n  - path: {}\n", path.display());
        refused_at_once(&yaml, 2, "path:", path, expected);
    }
}

/// The config file itself passes the same gate.
#[test]
fn a_config_that_is_no_regular_file_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    for (path, expected) in bad_files(dir.path(), (16 << 20) + 1) {
        let stderr = check_refuses(dir.path(), &path);
        assert!(
            stderr.contains(expected) && stderr.contains(&path.display().to_string()),
            "{stderr}"
        );
    }
}
