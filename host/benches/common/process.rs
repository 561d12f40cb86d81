//! The processes a benchmark starts (`switchyard serve`, `engine-sim`): killed by their PID
//! when dropped, so nothing outlives the run.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the switchyard binary with `args`; returns it and what follows `announce` in
/// its first line that starts so (its address).
pub fn start(args: &[&str], announce: &str) -> (Process, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(args)
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .spawn()
        .expect("switchyard starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let found = loop {
        let line = lines.next().expect("it announces its address").unwrap();
        if let Some(rest) = line.strip_prefix(announce) {
            break rest.to_owned();
        }
    };
    // Keep draining stdout so the process never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (Process(child), found)
}
