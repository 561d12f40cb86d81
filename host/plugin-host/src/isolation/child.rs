//! The isolated child: `switchyard __isolated-plugins`, started by the router with the
//! control connection as fd 3. It loads the libraries the router names, creates and builds
//! their instances, and runs one thread per call channel that serves component calls from
//! shared memory. Whatever a plugin does to this process, the router only sees it die.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use switchyard_plugin_sdk::RouterSettings;

use super::control::{ComponentInfo, Connection, Part, Reply, Request};
use super::region::{post, wait_for, Region};
use crate::plugin::shared_call::{CallLayout, Op, SharedCall};
use crate::plugin::Component;
use crate::plugin::{
    self, Built, CallError, ComponentDef, ComponentInstance, ErrorBuffer, OwnedParams, PluginImage,
    PluginSpec, PolicyDef, Status,
};

/// The hidden subcommand's name.
pub const SUBCOMMAND: &str = "__isolated-plugins";
/// The fd the control connection is inherited as.
pub const CONTROL_FD: i32 = 3;
/// How long a call thread spins for the next call before it sleeps (environment of the
/// child, set by the router from `isolation.spin_us`).
pub const SPIN_ENV: &str = "SWITCHYARD_ISOLATION_SPIN_US";
/// Set to `1` when the child must filter its system calls (`isolation.seccomp`).
pub const SECCOMP_ENV: &str = "SWITCHYARD_ISOLATION_SECCOMP";
/// Plugin log lines a second per logger (`router.plugin_log_lines_per_second`).
pub const LOG_RATE_ENV: &str = "SWITCHYARD_PLUGIN_LOG_RATE";
/// The most detailed plugin log level the router keeps (`SWITCHYARD_LOG_*`).
pub const LOG_LEVEL_ENV: &str = "SWITCHYARD_PLUGIN_LOG_LEVEL";

type Instances = Arc<Mutex<HashMap<u32, Arc<Mutex<ComponentInstance>>>>>;

struct Child {
    components: HashMap<String, ComponentDef>,
    policies: HashMap<String, Arc<PolicyDef>>,
    /// Who registered each name (this child's libraries, and the router's).
    taken: HashMap<String, String>,
    instances: Instances,
    next_id: u32,
    spin: Duration,
}

/// The parent's pid, passed to every child the router starts (isolated plugins, probes,
/// conformance runs), so the child can end with it.
pub const PARENT_ENV: &str = "SWITCHYARD_PARENT_PID";

/// Marks `command` as a child of this process for [`exit_with_parent`].
pub fn name_parent(command: &mut std::process::Command) {
    command.env(PARENT_ENV, std::process::id().to_string());
}

/// Starts `command`'s process with its data limit (RLIMIT_DATA: heap, private mappings,
/// thread stacks) already at `bytes`, before it runs any plugin code.
pub fn limit_memory(command: &mut std::process::Command, bytes: u64) {
    use std::os::unix::process::CommandExt;
    let limit = libc::rlimit {
        rlim_cur: bytes as libc::rlim_t,
        rlim_max: bytes as libc::rlim_t,
    };
    // SAFETY: between fork and exec only setrlimit runs, which is async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_DATA, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Ends this process as soon as the one that started it (named by [`PARENT_ENV`]) is
/// gone, even while plugin code keeps every other thread busy: a child must never
/// outlive a killed `check` or router. `PR_SET_PDEATHSIG` is not enough: it fires when
/// the spawning *thread* ends, and the router starts children from pooled threads.
pub fn exit_with_parent() {
    let Some(parent) = std::env::var(PARENT_ENV)
        .ok()
        .and_then(|pid| pid.parse::<i32>().ok())
    else {
        return;
    };
    let orphaned = move || nix::unistd::getppid().as_raw() != parent;
    // The thread's start registers its thread-local destructors under the dynamic
    // loader's lock: started while a plugin's constructor holds that lock (in dlopen), it
    // would wait forever. So the caller waits until it runs, before any library loads.
    let (started, running) = std::sync::mpsc::sync_channel(0);
    let watch = move || {
        let _ = started.send(());
        loop {
            if orphaned() {
                // SAFETY: _exit ends the process at once, without running atexit handlers
                // or destructors that plugin threads could still be using.
                unsafe { libc::_exit(137) };
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    match std::thread::Builder::new()
        .name("parent-watch".into())
        .spawn(watch)
    {
        Ok(_) => {
            let _ = running.recv();
        }
        Err(_) if orphaned() => {
            // SAFETY: as above.
            unsafe { libc::_exit(137) };
        }
        Err(_) => {}
    }
}

/// The child's main: serves the control connection until the router closes it.
pub fn run() -> i32 {
    // Before the seccomp filter: the watch is a thread of its own.
    exit_with_parent();
    // SAFETY: the router passed the control connection as fd 3 (`Supervisor::spawn`), and
    // nothing else in this process uses that fd.
    let control = unsafe { Connection::inherited(CONTROL_FD) };
    if std::env::var(SECCOMP_ENV).is_ok_and(|v| v == "1") {
        if let Err(e) = super::seccomp::install() {
            eprintln!("switchyard: the isolated process cannot install its seccomp filter ({e}); set `isolation.seccomp: false` on this machine");
            return 4;
        }
    }
    let log_env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u32>().ok());
    if let Some(rate) = log_env(LOG_RATE_ENV) {
        plugin::logger::set_lines_per_second(rate);
    }
    plugin::logger::forward_to_parent(
        log_env(LOG_LEVEL_ENV).unwrap_or(switchyard_plugin_sdk::abi::SWITCHYARD_LOG_INFO),
    );
    let spin = std::env::var(SPIN_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_micros(50), Duration::from_micros);
    let mut child = Child {
        components: HashMap::new(),
        policies: HashMap::new(),
        taken: HashMap::new(),
        instances: Arc::default(),
        next_id: 1,
        spin,
    };
    loop {
        let (request, fd) = match control.receive::<Request>() {
            Ok(message) => message,
            // The router closed the connection (or is gone): nothing more to serve.
            Err(_) => return 0,
        };
        let Some(reply) = child.handle(request, fd) else {
            continue;
        };
        if send_log_lines(&control)
            .and_then(|()| control.send(&reply, None))
            .is_err()
        {
            return 0;
        }
    }
}

/// The plugin log lines queued so far, ahead of an answer (at most 256 KiB of them: the
/// rest go with the next answer or call).
fn send_log_lines(control: &Connection) -> std::io::Result<()> {
    let mut room = 256 * 1024usize;
    let lines = plugin::logger::drain_queued(|line| {
        let need = 6 * (line.origin.len() + line.message.len()) + 64;
        let fits = need <= room;
        room = room.saturating_sub(need);
        fits
    });
    if lines.is_empty() {
        return Ok(());
    }
    control.send(&Reply::Log { lines }, None)
}

fn failed(e: &CallError) -> Reply {
    Reply::Failed {
        status: e.status.code(),
        message: e.message.clone(),
    }
}

impl Child {
    /// The answer to `request` (None for `Destroy`, which has none).
    fn handle(&mut self, request: Request, fd: Option<OwnedFd>) -> Option<Reply> {
        let reply = match request {
            Request::Load {
                path,
                sha256,
                revision,
                taken,
            } => {
                // The router's sealed copy of the bytes it checked, never the file as it
                // is now (it may have been overwritten since).
                let image = match fd.map(|fd| PluginImage::received(&path, fd)).transpose() {
                    Ok(image) => image,
                    Err(e) => {
                        return Some(Reply::Refused {
                            message: e.to_string(),
                        })
                    }
                };
                let spec = PluginSpec {
                    path,
                    sha256,
                    revision,
                };
                self.load(&spec, image.as_ref(), taken)
            }
            Request::Create {
                type_name,
                params,
                router,
                partition,
            } => self.create(&type_name, (&params, router), &partition.key()),
            Request::Validate {
                type_name,
                params,
                router,
            } => match self.factory(&type_name, (&params, router)) {
                Ok(_) => Reply::Ok,
                Err(e) => failed(&e),
            },
            Request::Build {
                type_name,
                params,
                router,
                partition,
                registered,
            } => self.build(&type_name, (&params, router), &partition.key(), &registered),
            Request::OpenChannel { rows, label_bytes } => match fd {
                Some(fd) => self.open_channel(fd, rows, label_bytes),
                None => failed(&CallError::new(Status::InvalidArgument, "no region")),
            },
            Request::Destroy { ids } => {
                let mut instances = self.instances.lock().unwrap_or_else(|e| e.into_inner());
                for id in ids {
                    instances.remove(&id);
                }
                return None;
            }
        };
        Some(reply)
    }

    /// An instance of `type_name` for `partition`, kept under a new id.
    fn create(
        &mut self,
        type_name: &str,
        params: (&str, Option<RouterSettings>),
        partition: &plugin::PartitionKey,
    ) -> Reply {
        let Some(def) = self.components.get(type_name) else {
            return failed(&unknown(type_name));
        };
        let params = match parse_params(params) {
            Ok(p) => p,
            Err(e) => return failed(&e),
        };
        match def.create(&params, partition) {
            Ok(instance) => {
                let notified = instance.notified();
                Reply::Created {
                    id: self.keep(instance),
                    notified,
                }
            }
            Err(e) => failed(&e),
        }
    }

    /// Serves calls over the shared region `fd` on a thread of their own.
    fn open_channel(&mut self, fd: OwnedFd, rows: usize, label_bytes: usize) -> Reply {
        match Region::map(fd) {
            Ok(region) if region.len() >= CallLayout::new(rows, label_bytes).size() => {
                let layout = CallLayout::new(rows, label_bytes);
                let instances = self.instances.clone();
                let spin = self.spin;
                let spawned = std::thread::Builder::new()
                    .name("isolated-calls".into())
                    .spawn(move || serve_channel(region, layout, instances, spin));
                match spawned {
                    Ok(_) => Reply::Ok,
                    Err(e) => failed(&CallError::new(Status::Error, e.to_string())),
                }
            }
            Ok(_) => failed(&CallError::new(
                Status::InvalidArgument,
                "the region is smaller than its layout",
            )),
            Err(e) => failed(&CallError::new(Status::Error, e.to_string())),
        }
    }

    fn load(
        &mut self,
        spec: &PluginSpec,
        image: Option<&Arc<PluginImage>>,
        taken: Vec<(String, String)>,
    ) -> Reply {
        self.taken.extend(taken);
        let taken = self.taken.clone();
        let taken_by = |name: &str| taken.get(name).cloned();
        let loaded = match plugin::library::load_from(spec, image, &taken_by) {
            Ok(loaded) => loaded,
            Err(e) => {
                return Reply::Refused {
                    message: e.to_string(),
                }
            }
        };
        let origin = format!(
            "plugin `{}` ({})",
            loaded.plugin.info.name,
            loaded.plugin.path.display()
        );
        let mut components = Vec::new();
        for (name, def) in loaded.registered.components {
            components.push(ComponentInfo {
                name: name.clone(),
                kind: def.kind().as_str().to_owned(),
                inputs: def.inputs().bits(),
            });
            self.taken.insert(name.clone(), origin.clone());
            self.components.insert(name, def);
        }
        let mut policies = Vec::new();
        for (name, def) in loaded.registered.policies {
            policies.push(name.clone());
            self.taken.insert(name.clone(), origin.clone());
            self.policies.insert(name, def);
        }
        Reply::Loaded {
            plugin: Box::new(loaded.plugin),
            components,
            policies,
        }
    }

    fn keep(&mut self, instance: ComponentInstance) -> u32 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        self.instances
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, Arc::new(Mutex::new(instance)));
        id
    }

    fn factory(
        &self,
        type_name: &str,
        params: (&str, Option<RouterSettings>),
    ) -> Result<plugin::PluginPolicyFactory, CallError> {
        let def = self
            .policies
            .get(type_name)
            .ok_or_else(|| unknown(type_name))?;
        let params = parse_params(params)?;
        def.validate(&params)
    }

    fn build(
        &mut self,
        type_name: &str,
        params: (&str, Option<RouterSettings>),
        partition: &plugin::PartitionKey,
        registered: &[String],
    ) -> Reply {
        let factory = match self.factory(type_name, params) {
            Ok(f) => f,
            Err(e) => return failed(&e),
        };
        // A registered type of this child's own libraries is created here; any other the
        // router creates (it may be a built-in, or live in another process).
        enum Registered {
            Own(ComponentInstance, String),
            Router(String, String),
        }
        let components = &self.components;
        let create = |name: &str, params: &OwnedParams| -> Result<Registered, CallError> {
            if let Some(def) = components.get(name) {
                return def
                    .create(params, partition)
                    .map(|i| Registered::Own(i, name.to_owned()));
            }
            if registered.iter().any(|r| r == name) {
                return Ok(Registered::Router(
                    name.to_owned(),
                    params.json().to_owned(),
                ));
            }
            Err(CallError::new(
                Status::InvalidArgument,
                format!(
                    "callback_add_registered: no component type `{name}`; registered: {}",
                    registered.join(", ")
                ),
            ))
        };
        let built = match factory.build(partition, &create) {
            Ok(built) => built,
            Err(e) => return failed(&e),
        };
        let mut parts = Vec::new();
        for item in built {
            parts.push(match item {
                Built::Plugin(c) => {
                    let notified = c.instance.notified();
                    Part::Own {
                        id: self.keep(c.instance),
                        name: c.name,
                        kind: c.kind.as_str().to_owned(),
                        inputs: c.inputs.bits(),
                        weight: c.weight,
                        notified,
                    }
                }
                Built::Registered {
                    component: Registered::Own(instance, name),
                    weight,
                } => {
                    let def = &self.components[&name];
                    let (kind, inputs) = (def.kind(), def.inputs());
                    let notified = instance.notified();
                    Part::Own {
                        id: self.keep(instance),
                        name,
                        kind: kind.as_str().to_owned(),
                        inputs: inputs.bits(),
                        weight,
                        notified,
                    }
                }
                Built::Registered {
                    component: Registered::Router(type_name, params),
                    weight,
                } => Part::Registered {
                    type_name,
                    params,
                    weight,
                },
            });
        }
        Reply::Built { parts }
    }
}

fn unknown(type_name: &str) -> CallError {
    CallError::new(
        Status::InvalidArgument,
        format!("no type `{type_name}` in this isolated process"),
    )
}

/// The parameters the router sent, with its cost-model knobs.
fn parse_params((json, router): (&str, Option<RouterSettings>)) -> Result<OwnedParams, CallError> {
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(serde_json::Value::Object(map)) => Ok(OwnedParams::new(map).with_router(router)),
        _ => Err(CallError::new(
            Status::InvalidParameters,
            "parameters are not a JSON object",
        )),
    }
}

/// One call channel: waits for a call, runs it, posts the answer; until `Close`.
fn serve_channel(region: Region, layout: CallLayout, instances: Instances, spin: Duration) {
    // SAFETY: the region is mapped for this thread's whole life and laid out by `layout`
    // (its size was checked against it).
    let mut call = unsafe { SharedCall::new(region.base(), layout) };
    let mut error = ErrorBuffer::new();
    // A fresh region starts at 0, and the first call may be posted before this thread
    // runs: it must not take that call's number for the last one served.
    let mut last = 0;
    loop {
        let sync = call.sync();
        let Some(seq) = wait_for(&sync.call_seq, &sync.child_waiting, last, spin, None) else {
            continue;
        };
        last = seq;
        let (op, id) = call.posted();
        if op == Some(Op::Close) {
            return;
        }
        let instance = instances
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned();
        match instance {
            Some(instance) => {
                let mut instance = instance.lock().unwrap_or_else(|e| e.into_inner());
                call.run(&mut instance, &mut error);
            }
            None => call.answer_error(&CallError::new(
                Status::InvalidArgument,
                format!("no instance {id} in the isolated process"),
            )),
        }
        let sync = call.sync();
        post(&sync.done_seq, &sync.parent_waiting, seq);
    }
}
