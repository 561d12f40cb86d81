//! A real NATS server for the tests (Debian's `nats-server`; `scripts/install-test-tools`
//! installs it), on a loopback port, killed by its PID when dropped.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// A `nats-server` on a loopback port; killed when dropped.
pub struct Nats {
    child: Child,
    pub port: u16,
}

fn nats_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SWITCHYARD_NATS_SERVER") {
        return path.into();
    }
    for candidate in [
        "/usr/sbin/nats-server",
        "/usr/bin/nats-server",
        "/usr/local/bin/nats-server",
    ] {
        if std::path::Path::new(candidate).exists() {
            return candidate.into();
        }
    }
    panic!(
        "no nats-server: apt-get install nats-server (.ci/run does), or set SWITCHYARD_NATS_SERVER"
    )
}

impl Nats {
    pub fn start(port: u16) -> Nats {
        let mut child = Command::new(nats_binary())
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("nats-server starts");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        loop {
            let line = lines.next().expect("nats-server says it is ready").unwrap();
            if line.contains("Server is ready") {
                break;
            }
        }
        std::thread::spawn(move || for _ in lines {});
        Nats { child, port }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
