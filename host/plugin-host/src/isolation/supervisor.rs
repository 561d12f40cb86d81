//! The router's side of one isolated child process: starting it (with its limits),
//! control requests, and the supervisor thread that notices a death or a call stuck past
//! its deadline, kills, counts, logs, and restarts with backoff, rebuilding every live
//! channel and instance in the new process.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::child::{CONTROL_FD, LOG_LEVEL_ENV, LOG_RATE_ENV, SECCOMP_ENV, SPIN_ENV, SUBCOMMAND};
use super::control::{ComponentInfo, Connection, Reply, Request};
use super::settings::IsolationSettings;
use crate::plugin::{CallError, LoadError, LoadedPlugin, PluginImage, PluginSpec, Status};

/// The `switchyard` executable to start isolated processes from, when the router runs
/// inside another program (tests, benchmarks); by default the running executable.
pub const EXE_ENV: &str = "SWITCHYARD_EXE";

/// What an isolated library registered.
pub struct IsolatedLibrary {
    pub plugin: LoadedPlugin,
    pub components: Vec<ComponentInfo>,
    pub policies: Vec<String>,
}

/// A library an isolated process loads: what to load, the sealed bytes to load it from
/// (the same in every incarnation), and the names the router had taken before it.
type Library = (PluginSpec, Option<Arc<PluginImage>>, Vec<(String, String)>);

/// Counters of one isolated process, for `/metrics`.
#[derive(Debug, Clone)]
pub struct ProcessSnapshot {
    pub name: String,
    pub up: bool,
    pub restarts: u64,
    /// Deaths by cause (`signal:SIGSEGV`, `exit:0`, `killed:deadline`, ...).
    pub exits: BTreeMap<String, u64>,
    pub deadline_misses: u64,
    /// Calls answered at once with an error because the process was down or busy.
    pub refused_calls: u64,
    pub calls: u64,
}

struct Incarnation {
    process: std::process::Child,
    control: Arc<Connection>,
}

/// One supervised child process running some plugin libraries.
pub struct IsolatedProcess {
    pub name: String,
    pub settings: IsolationSettings,
    current: Mutex<Option<Incarnation>>,
    /// Serializes control requests (one answer at a time on the connection), without
    /// holding `current`: the supervisor must be able to reap and kill meanwhile.
    control: Mutex<()>,
    /// Bumped per start; channels and instance slots remember the one they belong to.
    incarnation: AtomicU32,
    up: AtomicBool,
    pid: AtomicU32,
    /// Libraries to load in every new incarnation, with the names taken before each.
    libraries: Mutex<Vec<Library>>,
    channels: Mutex<Vec<Weak<dyn SupervisedChannel>>>,
    units: Mutex<Vec<Weak<dyn RebuiltUnit>>>,
    /// Why the last incarnation ended (for the errors of calls while it is down).
    last_exit: Mutex<String>,
    /// The last death: how it ended and what the process was doing, in words.
    last_death: Mutex<Option<(String, String)>>,
    restarts: AtomicU64,
    exits: Mutex<BTreeMap<String, u64>>,
    pub(super) deadline_misses: AtomicU64,
    pub(super) refused_calls: AtomicU64,
    pub(super) calls: AtomicU64,
    /// The control request in progress, in words (for death reports).
    control_phase: Mutex<Option<String>>,
    /// A kill the supervisor ordered: its metric label and why, in words (reported
    /// instead of SIGKILL).
    kill_reason: Mutex<Option<(&'static str, String)>>,
    stop: AtomicBool,
}

impl IsolatedProcess {
    /// Starts the process `name` and its supervisor thread.
    pub fn start(name: &str, settings: &IsolationSettings) -> std::io::Result<Arc<Self>> {
        let process = Arc::new(IsolatedProcess {
            name: name.to_owned(),
            settings: settings.clone(),
            current: Mutex::new(None),
            control: Mutex::new(()),
            incarnation: AtomicU32::new(0),
            up: AtomicBool::new(false),
            pid: AtomicU32::new(0),
            libraries: Mutex::default(),
            channels: Mutex::default(),
            units: Mutex::default(),
            last_exit: Mutex::new("it has not started".into()),
            last_death: Mutex::new(None),
            restarts: AtomicU64::new(0),
            exits: Mutex::default(),
            deadline_misses: AtomicU64::new(0),
            refused_calls: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            kill_reason: Mutex::new(None),
            control_phase: Mutex::new(None),
            stop: AtomicBool::new(false),
        });
        process.spawn()?;
        let weak = Arc::downgrade(&process);
        std::thread::Builder::new()
            .name(format!("isolation-{name}"))
            .spawn(move || supervise(&weak))?;
        Ok(process)
    }

    fn spawn(&self) -> std::io::Result<()> {
        let (parent, child) = Connection::pair()?;
        let exe = match std::env::var_os(EXE_ENV) {
            Some(exe) => std::path::PathBuf::from(exe),
            None => std::env::current_exe()?,
        };
        let inherited = child.raw_fd();
        let memory = self.settings.memory_limit_mb.map(|mb| mb << 20);
        let cpu = self.settings.cpu_time_limit_secs;
        let mut command = Command::new(exe);
        command
            .arg(SUBCOMMAND)
            .env(SPIN_ENV, self.settings.spin_us.to_string())
            .env(SECCOMP_ENV, if self.settings.seccomp { "1" } else { "0" })
            .env(
                LOG_RATE_ENV,
                crate::plugin::logger::lines_per_second().to_string(),
            )
            .env(
                LOG_LEVEL_ENV,
                crate::plugin::logger::router_max_level().to_string(),
            )
            .stdin(Stdio::null());
        super::child::name_parent(&mut command);
        // SAFETY: only async-signal-safe calls between fork and exec: dup2, fcntl,
        // setrlimit, prctl.
        unsafe {
            command.pre_exec(move || {
                if libc::dup2(inherited, CONTROL_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if inherited == CONTROL_FD {
                    libc::fcntl(CONTROL_FD, libc::F_SETFD, 0);
                }
                let limit = |resource, value: u64| {
                    let rlim = libc::rlimit {
                        rlim_cur: value as libc::rlim_t,
                        rlim_max: value as libc::rlim_t,
                    };
                    libc::setrlimit(resource, &rlim)
                };
                if let Some(bytes) = memory {
                    limit(libc::RLIMIT_DATA, bytes);
                }
                if let Some(secs) = cpu {
                    limit(libc::RLIMIT_CPU, secs);
                }
                // No core files of plugin crashes (each would be the size of the process),
                // and no setuid escalation from plugin code. (No PR_SET_PDEATHSIG: it fires
                // when the spawning *thread* ends; the child watches its parent instead,
                // `child::exit_with_parent`.)
                limit(libc::RLIMIT_CORE, 0);
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                Ok(())
            });
        }
        let process = command.spawn()?;
        drop(child);
        parent.set_timeout(Some(Duration::from_millis(
            self.settings.control_timeout_ms,
        )))?;
        self.pid.store(process.id(), Ordering::Relaxed);
        *self.current.lock() = Some(Incarnation {
            process,
            control: Arc::new(parent),
        });
        self.incarnation.fetch_add(1, Ordering::SeqCst);
        self.up.store(true, Ordering::SeqCst);
        Ok(())
    }

    pub fn incarnation(&self) -> u32 {
        self.incarnation.load(Ordering::SeqCst)
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::SeqCst)
    }

    /// The error of a call refused because the process is down.
    pub(super) fn down_error(&self) -> CallError {
        self.refused_calls.fetch_add(1, Ordering::Relaxed);
        CallError::new(
            Status::Error,
            format!(
                "the isolated process `{}` is down ({}); it is being restarted",
                self.name,
                self.last_exit.lock()
            ),
        )
    }

    /// One control request and its answer. A child that does not answer within
    /// `control_timeout_ms` is killed (the supervisor restarts it).
    pub(super) fn request(
        &self,
        request: &Request,
        fd: Option<&OwnedFd>,
    ) -> Result<Reply, CallError> {
        let _one_at_a_time = self.control.lock();
        let connection = match self.current.lock().as_ref() {
            Some(incarnation) if self.is_up() => incarnation.control.clone(),
            _ => return Err(self.down_error()),
        };
        *self.control_phase.lock() = Some(request.describe());
        let answer = connection.send(request, fd).and_then(|()| loop {
            // Log lines the child queued come first; the answer follows them.
            match connection.receive::<Reply>() {
                Ok((Reply::Log { lines }, _)) => {
                    lines.into_iter().for_each(crate::plugin::LogLine::emit)
                }
                other => break other,
            }
        });
        let answer = match answer {
            Ok((reply, _)) => Ok(reply),
            Err(e) => {
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) {
                    self.kill(
                        "killed:control_timeout",
                        format!(
                            "it did not answer within {} ms (isolation.control_timeout_ms)",
                            self.settings.control_timeout_ms
                        ),
                    );
                }
                // The process is gone or going: say how it ended, and doing what.
                let start = Instant::now();
                while self.is_up() && self.reap().is_none() {
                    if start.elapsed() > Duration::from_secs(5) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(CallError::new(
                    Status::Error,
                    format!(
                        "the isolated process `{}` failed: {}",
                        self.name,
                        self.last_exit.lock()
                    ),
                ))
            }
        };
        *self.control_phase.lock() = None;
        answer
    }

    /// Sends a request that has no answer.
    pub(super) fn tell(&self, request: &Request) {
        if let Some(incarnation) = self.current.lock().as_ref() {
            let _ = incarnation.control.send(request, None);
        }
    }

    /// Kills the current incarnation; the supervisor then reports it as `label` (a
    /// metric label) because of `why`, and restarts it.
    pub(super) fn kill(&self, label: &'static str, why: String) {
        let mut current = self.current.lock();
        if let Some(incarnation) = current.as_mut() {
            let mut reason = self.kill_reason.lock();
            if reason.is_none() {
                *reason = Some((label, why));
            }
            let _ = incarnation.process.kill();
        }
    }

    /// Loads a library in the child. The library is loaded again in every later
    /// incarnation. `taken`: names the router registered already, and by whom.
    pub fn load(
        &self,
        spec: &PluginSpec,
        image: Option<Arc<PluginImage>>,
        taken: Vec<(String, String)>,
    ) -> Result<IsolatedLibrary, LoadError> {
        let request = load_request(spec, taken.clone());
        let in_child = |message: String| LoadError::InChild {
            path: spec.path.clone(),
            message,
        };
        // Listed before it loads, so that a death while loading names it.
        self.libraries
            .lock()
            .push((spec.clone(), image.clone(), taken));
        let answer = self.request(&request, image.as_ref().map(|i| i.memfd()));
        if !matches!(answer, Ok(Reply::Loaded { .. })) {
            self.libraries.lock().pop();
        }
        match answer {
            Ok(Reply::Loaded {
                plugin,
                components,
                policies,
            }) => {
                Ok(IsolatedLibrary {
                    plugin: *plugin,
                    components,
                    policies,
                })
            }
            Ok(Reply::Refused { message }) => Err(in_child(message)),
            Ok(other) => Err(in_child(format!("unexpected answer {other:?}"))),
            Err(e) => Err(in_child(format!(
                "{}: {}. Loaded into the router, it would have taken the router down: fix the plugin",
                spec.path.display(),
                e.message
            ))),
        }
    }

    /// If the current incarnation has ended: marks the process down, breaks every
    /// channel, counts and logs the death; returns its cause in words.
    fn reap(&self) -> Option<String> {
        let mut current = self.current.lock();
        let status = current.as_mut()?.process.try_wait().ok()??;
        *current = None;
        let (cause, label) = match self.kill_reason.lock().take() {
            Some((label, why)) => (format!("was killed by the router: {why}"), label.to_owned()),
            None => (super::describe_exit(status, false), exit_label(status)),
        };
        // What it was doing and how it ended are recorded before the process is marked
        // down, under `current`: a request that sees it down returns at once, and its
        // caller (the probe's `death`) must find the death, not a process that is
        // neither up nor dead. Marked down first, a preempted reaper once let `check`
        // take a library that had crashed its probe for a good one, and load it.
        let phase = self.in_flight();
        let libraries = self.library_paths();
        *self.last_exit.lock() = format!("the process {cause}{phase}");
        *self.last_death.lock() = Some((
            cause.clone(),
            phase.trim_start_matches(" while ").to_owned(),
        ));
        self.up.store(false, Ordering::SeqCst);
        drop(current);
        *self.exits.lock().entry(label).or_default() += 1;
        for channel in live(&self.channels) {
            channel.break_off();
        }
        tracing::error!(
            process = %self.name,
            libraries = %libraries,
            pid = self.pid.load(Ordering::Relaxed),
            cause = %cause,
            phase = %phase.trim_start_matches(" while "),
            "isolated plugin process died; its calls fail (on_error) until it is restarted"
        );
        Some(cause)
    }

    fn library_paths(&self) -> String {
        self.libraries
            .lock()
            .iter()
            .map(|(spec, ..)| spec.path.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// What the process was doing: the control request and the calls in flight, in words.
    fn in_flight(&self) -> String {
        let calls: Vec<String> = self
            .control_phase
            .lock()
            .clone()
            .into_iter()
            .chain(live(&self.channels).iter().filter_map(|c| c.phase()))
            .collect();
        if calls.is_empty() {
            String::new()
        } else {
            format!(" while {}", calls.join(", "))
        }
    }

    /// Starts a new incarnation: loads every library again, reopens every live channel
    /// and rebuilds every live instance.
    fn restart(&self) -> Result<(), String> {
        self.spawn().map_err(|e| format!("cannot start: {e}"))?;
        let libraries = self.libraries.lock().clone();
        for (spec, image, taken) in libraries {
            // The image the library was first loaded from: the same checked bytes.
            let memfd = image.as_ref().map(|i| i.memfd());
            match self.request(&load_request(&spec, taken), memfd) {
                Ok(Reply::Loaded { .. }) => {}
                Ok(Reply::Refused { message }) => return Err(message),
                Ok(other) => {
                    return Err(format!(
                        "{}: unexpected answer {other:?}",
                        spec.path.display()
                    ))
                }
                Err(e) => return Err(e.message),
            }
        }
        for channel in live(&self.channels) {
            channel.reopen();
        }
        for unit in live(&self.units) {
            if let Err(e) = unit.rebuild() {
                tracing::error!(process = %self.name, error = %e, "an isolated instance could not be rebuilt after a restart; it keeps failing (on_error)");
            }
        }
        self.restarts.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(process = %self.name, pid = self.pid.load(Ordering::Relaxed), "isolated plugin process restarted; its instances are rebuilt");
        Ok(())
    }

    /// How the process last died and what it was doing then, if it ever died.
    pub fn death(&self) -> Option<(String, String)> {
        self.reap();
        self.last_death.lock().clone()
    }

    pub(super) fn add_channel(&self, channel: &Arc<impl SupervisedChannel + 'static>) {
        let mut channels = self.channels.lock();
        channels.retain(|c| c.strong_count() > 0);
        let channel: Arc<dyn SupervisedChannel> = channel.clone();
        channels.push(Arc::downgrade(&channel));
    }

    pub(super) fn add_unit(&self, unit: &Arc<impl RebuiltUnit + 'static>) {
        let mut units = self.units.lock();
        units.retain(|u| u.strong_count() > 0);
        let unit: Arc<dyn RebuiltUnit> = unit.clone();
        units.push(Arc::downgrade(&unit));
    }

    pub fn snapshot(&self) -> ProcessSnapshot {
        ProcessSnapshot {
            name: self.name.clone(),
            up: self.is_up(),
            restarts: self.restarts.load(Ordering::Relaxed),
            exits: self.exits.lock().clone(),
            deadline_misses: self.deadline_misses.load(Ordering::Relaxed),
            refused_calls: self.refused_calls.load(Ordering::Relaxed),
            calls: self.calls.load(Ordering::Relaxed),
        }
    }
}

impl Drop for IsolatedProcess {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(mut incarnation) = self.current.lock().take() {
            let _ = incarnation.process.kill();
            let _ = incarnation.process.wait();
        }
    }
}

fn load_request(spec: &PluginSpec, taken: Vec<(String, String)>) -> Request {
    Request::Load {
        path: spec.path.clone(),
        sha256: spec.sha256.clone(),
        revision: spec.revision,
        taken,
    }
}

/// What the supervisor does to a shared-memory channel of its process (`remote::Channel`),
/// seen through this trait so the supervisor does not depend on the isolated stages.
pub(super) trait SupervisedChannel: Send + Sync {
    /// The process died: every call waiting on the channel fails now.
    fn break_off(&self);
    /// The process is back: the channel carries calls again.
    fn reopen(&self);
    /// The call in flight, for death reports.
    fn phase(&self) -> Option<String>;
    /// The call in flight if it has run longer than `limit` past its deadline.
    fn stuck_longer_than(&self, limit: Duration) -> Option<String>;
}

/// An instance built in the process (`remote::BuildUnit`), built again after a restart.
pub(super) trait RebuiltUnit: Send + Sync {
    fn rebuild(&self) -> Result<(), CallError>;
}

fn live<T: ?Sized>(list: &Mutex<Vec<Weak<T>>>) -> Vec<Arc<T>> {
    list.lock().iter().filter_map(Weak::upgrade).collect()
}

/// A death's metric label: `signal:SIGSEGV`, `exit:0`.
fn exit_label(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.signal(), status.code()) {
        (Some(signal), _) => format!(
            "signal:{}",
            nix::sys::signal::Signal::try_from(signal)
                .map_or_else(|_| signal.to_string(), |s| s.as_str().to_owned())
        ),
        (None, Some(code)) => format!("exit:{code}"),
        _ => "unknown".into(),
    }
}

/// The supervisor: polls for a death and for stuck calls; restarts with backoff.
fn supervise(weak: &Weak<IsolatedProcess>) {
    let mut backoff = None::<Duration>;
    let mut up_since = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(5));
        let Some(process) = weak.upgrade() else {
            return;
        };
        if process.stop.load(Ordering::SeqCst) {
            return;
        }
        if process.is_up() {
            let kill_after = Duration::from_millis(process.settings.kill_after_ms);
            if let Some(stuck) = live(&process.channels)
                .iter()
                .find_map(|c| c.stuck_longer_than(kill_after))
            {
                process.kill(
                    "killed:deadline",
                    format!(
                        "{stuck} was still running {} ms past its deadline (isolation.kill_after_ms)",
                        process.settings.kill_after_ms
                    ),
                );
            }
            if process.reap().is_none() {
                continue;
            }
        }
        // Down: restart after the backoff, doubled while deaths come in a row.
        let settings = &process.settings;
        let wait = match backoff {
            Some(last) if up_since.elapsed() < Duration::from_secs(60) => {
                (last * 2).min(Duration::from_millis(settings.restart_backoff_max_ms))
            }
            _ => Duration::from_millis(settings.restart_backoff_ms),
        };
        backoff = Some(wait);
        drop(process);
        std::thread::sleep(wait);
        let Some(process) = weak.upgrade() else {
            return;
        };
        if process.stop.load(Ordering::SeqCst) {
            return;
        }
        match process.restart() {
            Ok(()) => up_since = Instant::now(),
            Err(e) => {
                tracing::error!(process = %process.name, error = %e, "restarting an isolated plugin process failed; trying again after the backoff");
                let e = format!("restarting failed: {e}");
                process.kill("killed:restart_failed", e);
            }
        }
    }
}
