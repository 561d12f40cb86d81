//! The out-of-process probe: before `check` or `serve` loads a plugin into the router's
//! process, a child process (this same binary, `switchyard __probe-plugin`) loads it,
//! registers it, builds every configured instance for every worker type, and runs each
//! instance once on a synthetic fleet, under a time limit. A library whose constructors,
//! registration, build or first call crashes, aborts, exits or hangs is refused with the
//! file, the phase and the cause, instead of taking the router down.
//!
//! The child announces each phase on stdout before entering it; the parent reports the
//! last one it heard when the child dies.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use switchyard_plugin_sdk::{WorkerId, WorkerType};

use super::start;
use crate::config::ConfigSource;
use crate::plugin::{PartitionKey, PluginSpec, RequestContext};
use crate::policy::{CandidateRow, Registry, Selector};

/// How long a probe may take before it counts as hung.
pub const PROBE_TIME_LIMIT: Duration = Duration::from_secs(20);

/// The hidden subcommand's name.
pub const SUBCOMMAND: &str = "__probe-plugin";

/// What the parent hands the child on stdin: the config and which plugin to probe.
#[derive(Serialize, Deserialize)]
pub struct ProbeInput {
    pub text: String,
    pub name: String,
    pub base_dir: PathBuf,
    pub plugin: usize,
}

/// A plugin the probe refused: what `check` and `serve` print.
#[derive(Debug, thiserror::Error)]
#[error("{config}: {}: the plugin {cause} in a probe process while {phase}. Loaded into the router, it would have taken the router down: fix the plugin, or set `probe: false` on it to skip this check (not recommended)", path.display())]
pub struct ProbeFailure {
    /// `file:line` of the plugin's entry.
    pub config: String,
    pub path: PathBuf,
    pub phase: String,
    pub cause: String,
}

/// Probes every plugin of `source` that does not say `probe: false`; returns one
/// failure per plugin that crashed, exited or hung in its child.
pub fn probe_all(source: &ConfigSource) -> Vec<ProbeFailure> {
    let Ok(exe) = std::env::current_exe() else {
        return Vec::new();
    };
    let mut failures = Vec::new();
    for (index, entry) in source.config.plugins.iter().enumerate() {
        // An isolated plugin needs no probe: it is loaded in its own process anyway.
        if !entry.probe || entry.isolation.process_group(&entry.path).is_some() {
            continue;
        }
        let input = ProbeInput {
            text: source.text.clone(),
            name: source.name.clone(),
            base_dir: source.base_dir.clone(),
            plugin: index,
        };
        if let Some((phase, cause)) = probe_one(&exe, &input) {
            let line = source.line_of("path", &entry.path.to_string_lossy(), 0);
            failures.push(ProbeFailure {
                config: match line {
                    Some(line) => format!("{}:{line}", source.name),
                    None => source.name.clone(),
                },
                path: source.resolve(&entry.path),
                phase,
                cause,
            });
        }
    }
    failures
}

/// Runs one child; `Some((phase, cause))` when it did not end well.
fn probe_one(exe: &std::path::Path, input: &ProbeInput) -> Option<(String, String)> {
    let spawned = Command::new(exe)
        .arg(SUBCOMMAND)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            return Some((
                "starting the probe".into(),
                format!("could not be probed ({e})"),
            ))
        }
    };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(serde_json::to_string(input).unwrap_or_default().as_bytes());
    }
    let stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut phase = String::from("starting");
        let mut finished = false;
        if let Some(stdout) = stdout {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(p) = line.strip_prefix("phase: ") {
                    phase = p.to_owned();
                } else if line == "probe: ok" {
                    finished = true;
                }
            }
        }
        (phase, finished)
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() > PROBE_TIME_LIMIT => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => break None,
        }
    };
    let (phase, finished) = reader.join().unwrap_or_else(|_| ("starting".into(), false));
    match status {
        None => Some((
            phase,
            format!("did not finish within {} s", PROBE_TIME_LIMIT.as_secs()),
        )),
        Some(status) if status.success() && finished => None,
        // A plugin the loader refuses is reported by the in-process checks, in detail.
        Some(status) if status.code() == Some(REFUSED) => None,
        Some(status) => Some((phase, crate::isolation::describe_exit(status, finished))),
    }
}

/// The child's exit code when the loader refused the plugin (no crash).
const REFUSED: i32 = 3;

fn phase(name: &str) {
    println!("phase: {name}");
    let _ = std::io::stdout().flush();
}

/// The child: reads a [`ProbeInput`] on stdin and exercises that one plugin. Returns the
/// process exit code.
pub fn run_child() -> i32 {
    let mut text = String::new();
    if std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).is_err() {
        return 2;
    }
    let Ok(input) = serde_json::from_str::<ProbeInput>(&text) else {
        return 2;
    };
    let Ok(mut source) = ConfigSource::parse(input.text, input.name, input.base_dir) else {
        return REFUSED;
    };
    if input.plugin >= source.config.plugins.len() {
        return 2;
    }
    // Only this plugin: a crash here is its own.
    let entry = source.config.plugins.swap_remove(input.plugin);
    let spec = PluginSpec {
        path: source.resolve(&entry.path),
        sha256: entry.sha256.clone(),
        revision: entry.revision,
    };
    source.config.plugins = vec![entry];
    source.config.workers.clear();
    phase("loading (constructors) and registration");
    if Registry::with_builtins().load_plugin(&spec).is_err() {
        return REFUSED;
    }
    phase("building every instance for prefill, decode and select");
    // Instances that need other plugins' types fail to build here; that is not this
    // plugin's fault, and the in-process startup reports it.
    let startup = match start(source) {
        Ok(startup) => startup,
        Err(_) => {
            println!("probe: ok");
            return 0;
        }
    };
    phase("the first call of each instance");
    let rows: Vec<CandidateRow> = (0..8u64)
        .map(|id| {
            let mut row = CandidateRow::new(WorkerId {
                worker_id: id,
                dp_rank: 0,
            });
            row.cache.device_overlap_blocks = (id * 3 % 16) as u32;
            row.load.active_requests = (id % 4) as u32;
            row.load.decode_cost_blocks = id * 2;
            row
        })
        .collect();
    for instance in &startup.instances {
        for worker_type in WorkerType::ALL {
            if let Ok(policy) = instance.build(&PartitionKey::new("probe", worker_type)) {
                let mut selector = Selector::new(policy);
                let _ = selector.select(&RequestContext::new(16, 16), rows.iter().copied());
            }
        }
    }
    println!("probe: ok");
    0
}
