//! `switchyard select`: one instance's decision over a fleet given on the command line
//! (`--worker`) or in a file (`--fleet`, every candidate field settable), without a router.
//! With `--explain`, what each stage did per worker: each filter's verdict, each scorer's
//! cost and the weighted total, and the pick.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use switchyard_plugin_sdk::{Saturation, WorkerId, WorkerType};

use crate::plugin::{
    EngineReading, EngineReport, EngineSample, InputTriggerName, Labels, PartitionKey,
    PromptBlocks, RequestAttributes, RouteRequest, SessionInfo,
};
use crate::policy::busy::{mark_not_busy, mark_prefill_room, BusyInputs};
use crate::policy::{Admitters, CandidateRow, CandidatesFrom, RowExtras, SelectTrace, Selector};
use crate::startup::Startup;

/// What `select` takes.
#[derive(clap::Args, Debug)]
pub struct SelectArgs {
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Instance name; the config's default when omitted.
    #[arg(long)]
    pub instance: Option<String>,
    /// Prompt size in KV blocks.
    #[arg(long, default_value_t = 16)]
    pub blocks: u64,
    /// A candidate as ID:DEVICE_OVERLAP_BLOCKS:ACTIVE_REQUESTS (repeat for each worker).
    #[arg(long = "worker", value_parser = parse_worker)]
    pub workers: Vec<CandidateRow>,
    /// The candidates as a YAML list, every field settable: worker_id, dp_rank,
    /// device/host/disk_overlap_blocks, shared_beyond_device_blocks,
    /// active_prefill_tokens, decode_cost_blocks, active_requests,
    /// preferred_taint_multiplier, labels (a map).
    #[arg(long)]
    pub fleet: Option<PathBuf>,
    /// Show each filter's verdict, each scorer's cost and the total per worker.
    #[arg(long)]
    pub explain: bool,
    /// A request header policies may read (ATTRIBUTES), as NAME=VALUE (repeat).
    #[arg(long = "header", value_parser = parse_header)]
    pub headers: Vec<(String, String)>,
    /// The request's tenant (ATTRIBUTES).
    #[arg(long)]
    pub tenant: Option<String>,
    /// The LoRA adapter the request asks for (ATTRIBUTES).
    #[arg(long)]
    pub lora_adapter: Option<String>,
    /// The request's id (ATTRIBUTES); `dry-run` by default.
    #[arg(long, default_value = "dry-run")]
    pub request_id: String,
    /// The workers' role: prefill, decode or aggregated (select); the instance is the
    /// role's default when --instance is not given.
    #[arg(long, value_parser = parse_worker_type, default_value = "aggregated")]
    pub worker_type: WorkerType,
    /// The request's session id (the session context policies read).
    #[arg(long)]
    pub session: Option<String>,
    /// What started the session's turn: user_message, tool_result or other.
    #[arg(long, requires = "session", value_parser = parse_input_trigger)]
    pub input_trigger: Option<InputTriggerName>,
}

fn parse_worker_type(text: &str) -> Result<WorkerType, String> {
    serde_json::from_value(serde_json::Value::String(text.to_owned()))
        .map_err(|_| format!("expected prefill, decode or aggregated (select), found `{text}`"))
}

fn parse_input_trigger(text: &str) -> Result<InputTriggerName, String> {
    serde_json::from_value(serde_json::Value::String(text.to_owned()))
        .map_err(|_| format!("expected user_message, tool_result or other, found `{text}`"))
}

/// The request `switchyard select` routes: its attributes, role and session.
fn request_of(args: &SelectArgs) -> RouteRequest {
    RouteRequest {
        attributes: Some(Arc::new(RequestAttributes {
            request_id: args.request_id.clone(),
            model: "dry-run".into(),
            lora_adapter: args.lora_adapter.clone(),
            tenant: args.tenant.clone(),
            headers: args.headers.clone(),
        })),
        worker_type: args.worker_type,
        session: args.session.as_ref().map(|id| SessionInfo {
            session_id: id.clone(),
            input_trigger: args.input_trigger,
            ..SessionInfo::default()
        }),
        ..RouteRequest::default()
    }
}

/// The instance the request is routed with (`--instance`, else its role's default),
/// built for the request's role.
fn policy_for(
    args: &SelectArgs,
    startup: &Startup,
) -> Result<(String, crate::policy::Policy), DryRunError> {
    let name = args
        .instance
        .clone()
        .unwrap_or_else(|| startup.default_for(args.worker_type).to_owned());
    let Some(factory) = startup.instance(&name) else {
        let known = startup.instances.iter().map(|i| i.name.clone()).collect();
        return Err(DryRunError::NoInstance { name, known });
    };
    let policy = factory
        .build(&PartitionKey::new("dry-run", args.worker_type))
        .map_err(|source| DryRunError::Build {
            name: name.clone(),
            source,
        })?;
    Ok((name, policy))
}

/// Why `switchyard select` gave no decision. Each names what was given and what to do.
#[derive(Debug, thiserror::Error)]
pub enum DryRunError {
    #[error("expected NAME=VALUE, found `{0}`")]
    Header(String),
    #[error("expected ID:DEVICE_OVERLAP_BLOCKS:ACTIVE_REQUESTS, found `{0}`")]
    WorkerShape(String),
    #[error("{field} must be a whole number, found `{found}` in `{worker}`")]
    WorkerNumber {
        field: &'static str,
        found: String,
        worker: String,
    },
    #[error("{}: cannot read the fleet: {source}", path.display())]
    FleetUnreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}{}: not a fleet: {problem}. A fleet is a YAML list of workers, e.g. `- {{worker_id: 1, device_overlap_blocks: 4, active_requests: 2}}`", path.display(), line.map_or(String::new(), |l| format!(":{l}")))]
    NotAFleet {
        path: PathBuf,
        line: Option<usize>,
        problem: String,
    },
    #[error("{}: the fleet has no workers", .0.display())]
    EmptyFleet(PathBuf),
    #[error("give the candidates with --worker ID:OVERLAP:ACTIVE (repeat) or --fleet FLEET.yaml")]
    NoCandidates,
    #[error("no instance `{name}`; the config has: {}", known.join(", "))]
    NoInstance { name: String, known: Vec<String> },
    #[error("instance `{name}` cannot be built: {source}")]
    Build {
        name: String,
        source: crate::policy::BuildError,
    },
    #[error("the admitters cannot be built: {0}")]
    Admitters(crate::policy::BuildError),
    #[error("no pick: every worker is busy (admission.busy); the request would wait in the admission queue")]
    AllBusy,
    #[error("refused by admitter `{}`: {} {}{}", .0.admitter, .0.status, .0.message, retry_after(.0.retry_after_seconds))]
    Refused(crate::policy::Rejection),
    #[error("instance `{name}`: {source}")]
    NoPick {
        name: String,
        source: crate::policy::SelectError,
    },
}

fn retry_after(seconds: u32) -> String {
    match seconds {
        0 => String::new(),
        s => format!(" (Retry-After: {s})"),
    }
}

fn parse_header(text: &str) -> Result<(String, String), DryRunError> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| DryRunError::Header(text.to_owned()))?;
    Ok((name.trim().to_ascii_lowercase(), value.to_owned()))
}

fn parse_worker(text: &str) -> Result<CandidateRow, DryRunError> {
    let fields: Vec<&str> = text.split(':').collect();
    let [id, device, active] = fields[..] else {
        return Err(DryRunError::WorkerShape(text.to_owned()));
    };
    let number = |field: &'static str, s: &str| {
        s.parse::<u64>().map_err(|_| DryRunError::WorkerNumber {
            field,
            found: s.to_owned(),
            worker: text.to_owned(),
        })
    };
    let mut row = CandidateRow::new(WorkerId {
        worker_id: number("ID", id)?,
        dp_rank: 0,
    });
    row.cache.device_overlap_blocks = number("DEVICE_OVERLAP_BLOCKS", device)? as u32;
    row.load.active_requests = number("ACTIVE_REQUESTS", active)? as u32;
    Ok(row)
}

/// One worker of a `--fleet` file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FleetWorker {
    worker_id: u64,
    #[serde(default)]
    dp_rank: u32,
    #[serde(default)]
    device_overlap_blocks: u32,
    #[serde(default)]
    host_overlap_blocks: u32,
    #[serde(default)]
    disk_overlap_blocks: u32,
    #[serde(default)]
    shared_beyond_device_blocks: u32,
    #[serde(default)]
    active_prefill_tokens: u64,
    #[serde(default)]
    decode_cost_blocks: u64,
    #[serde(default)]
    active_requests: u32,
    #[serde(default)]
    preferred_taint_multiplier: Option<f64>,
    #[serde(default)]
    labels: std::collections::BTreeMap<String, String>,
    /// What the worker's engine reports (ENGINE); none when absent.
    #[serde(default)]
    engine: Option<FleetEngine>,
}

/// A fleet worker's engine sample.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FleetEngine {
    #[serde(default)]
    running_requests: f64,
    #[serde(default)]
    waiting_requests: f64,
    #[serde(default = "unknown")]
    kv_cache_usage: f64,
    #[serde(default)]
    running_adapters: Option<Vec<String>>,
    #[serde(default)]
    waiting_adapters: Option<Vec<String>>,
    /// How old the sample is.
    #[serde(default)]
    age_ms: u64,
    /// The last scrape failed (the sample is the last good one).
    #[serde(default)]
    stale: bool,
}

fn unknown() -> f64 {
    f64::NAN
}

impl FleetEngine {
    fn report(self) -> Arc<EngineReport> {
        let names = |list: Option<Vec<String>>| {
            list.map(|l| l.into_iter().map(String::into_boxed_str).collect())
        };
        EngineReport::from_reading(EngineReading {
            sample: Arc::new(EngineSample {
                running_requests: self.running_requests,
                waiting_requests: self.waiting_requests,
                kv_cache_usage: self.kv_cache_usage,
                running_adapters: names(self.running_adapters),
                waiting_adapters: names(self.waiting_adapters),
                kv_capacity_tokens: None,
            }),
            age: std::time::Duration::from_millis(self.age_ms),
            fresh: !self.stale,
        })
    }
}

/// The fleet's rows, and each row's labels and engine report.
fn read_fleet(path: &Path) -> Result<(Vec<CandidateRow>, RowExtras), DryRunError> {
    let text = std::fs::read_to_string(path).map_err(|source| DryRunError::FleetUnreadable {
        path: path.to_owned(),
        source,
    })?;
    let workers: Vec<FleetWorker> =
        serde_yaml::from_str(&text).map_err(|e| DryRunError::NotAFleet {
            path: path.to_owned(),
            line: e.location().map(|l| l.line()),
            problem: e
                .to_string()
                .split(" at line ")
                .next()
                .unwrap_or_default()
                .to_owned(),
        })?;
    if workers.is_empty() {
        return Err(DryRunError::EmptyFleet(path.to_owned()));
    }
    let mut rows = Vec::with_capacity(workers.len());
    let mut extras = RowExtras::default();
    for (row, labels, engine) in workers.into_iter().map(|w| {
        let mut row = CandidateRow::new(WorkerId {
            worker_id: w.worker_id,
            dp_rank: w.dp_rank,
        });
        row.cache.device_overlap_blocks = w.device_overlap_blocks;
        row.cache.host_overlap_blocks = w.host_overlap_blocks;
        row.cache.disk_overlap_blocks = w.disk_overlap_blocks;
        row.cache.shared_beyond_device_blocks = w.shared_beyond_device_blocks;
        row.load.active_prefill_tokens = w.active_prefill_tokens;
        row.load.decode_cost_blocks = w.decode_cost_blocks;
        row.load.active_requests = w.active_requests;
        row.preferred_taint_multiplier = w.preferred_taint_multiplier.unwrap_or(f64::NAN);
        let engine = w
            .engine
            .map_or_else(EngineReport::none, FleetEngine::report);
        (row, Labels::new(&w.labels), engine)
    }) {
        rows.push(row);
        extras.labels.push(labels);
        extras.engine.push(engine);
    }
    Ok((rows, extras))
}

/// The decision (and with `--explain`, its table), or what went wrong.
pub fn run(args: &SelectArgs, startup: &Startup) -> Result<String, DryRunError> {
    let mut rows = args.workers.clone();
    let mut extras = RowExtras {
        labels: vec![Labels::none(); rows.len()],
        engine: vec![EngineReport::none(); rows.len()],
    };
    if let Some(path) = &args.fleet {
        let (fleet, fleet_extras) = read_fleet(path)?;
        rows.extend(fleet);
        extras.labels.extend(fleet_extras.labels);
        extras.engine.extend(fleet_extras.engine);
    }
    if rows.is_empty() {
        return Err(DryRunError::NoCandidates);
    }
    let (name, policy) = policy_for(args, startup)?;
    let prompt = PromptBlocks::new(startup.config().router.block_size, args.blocks);
    let mut request = request_of(args);
    let busy = busy_workers(startup, &rows, &extras, args.blocks);
    let mut admission = admit(startup, &rows, &mut request, prompt, busy.len())?;
    if !busy.is_empty() {
        let ids: Vec<String> = busy
            .iter()
            .map(|&r| rows[r].worker.worker_id.to_string())
            .collect();
        admission += &format!(
            "busy (admission.busy), not candidates: worker {}\n",
            ids.join(", ")
        );
        if busy.len() == rows.len() {
            return if args.explain {
                Ok(format!("{admission}{}\n", DryRunError::AllBusy))
            } else {
                Err(DryRunError::AllBusy)
            };
        }
        let mut is_busy = vec![false; rows.len()];
        for &row in &busy {
            is_busy[row] = true;
        }
        rows = without(&rows, &is_busy);
        extras = RowExtras {
            labels: without(&extras.labels, &is_busy),
            engine: without(&extras.engine, &is_busy),
        };
    }
    pick(
        args,
        &name,
        policy,
        (&request, prompt),
        &rows,
        &extras,
        admission,
    )
}

/// `items` but the rows `is_busy` marks.
fn without<T: Clone>(items: &[T], is_busy: &[bool]) -> Vec<T> {
    let kept = items.iter().zip(is_busy).filter(|(_, &busy)| !busy);
    kept.map(|(item, _)| item.clone()).collect()
}

/// The instance's decision over `rows`, after the lines `admission` says.
fn pick(
    args: &SelectArgs,
    name: &str,
    policy: crate::policy::Policy,
    (request, prompt): (&RouteRequest, PromptBlocks),
    rows: &[CandidateRow],
    extras: &RowExtras,
    admission: String,
) -> Result<String, DryRunError> {
    let picker_reads = policy
        .stages()
        .find(|stage| stage.kind == crate::plugin::ComponentKind::Picker)
        .map(|stage| (stage.name.clone(), stage.inputs));
    let mut selector = Selector::new(policy);
    let mut trace = SelectTrace::default();
    let result = selector.select(
        request,
        prompt,
        CandidatesFrom::Rows(rows, extras),
        Some(&mut trace),
    );
    let decision = match &result {
        Ok(worker) => format!("worker {} dp_rank {}\n", worker.worker_id, worker.dp_rank),
        Err(e) => format!("no pick: instance `{name}`: {e}\n"),
    };
    match (args.explain, result) {
        (true, result) => Ok(admission
            + &explain(rows, &trace, result.as_ref().ok())
            + &picker_read(rows, picker_reads.as_ref())
            + &decision),
        (false, Ok(_)) => Ok(decision),
        (false, Err(source)) => Err(DryRunError::NoPick {
            name: name.to_owned(),
            source,
        }),
    }
}

/// The rows at an `admission.busy` threshold for a request of `blocks` blocks, as the
/// router decides it (the same functions).
fn busy_workers(
    startup: &Startup,
    rows: &[CandidateRow],
    extras: &RowExtras,
    blocks: u64,
) -> Vec<usize> {
    let Some(busy) = startup
        .source
        .config
        .admission
        .as_ref()
        .map(|a| &a.busy)
        .filter(|b| b.any())
    else {
        return Vec::new();
    };
    let active: Vec<u32> = rows.iter().map(|r| r.load.active_requests).collect();
    let prefill: Vec<u64> = rows.iter().map(|r| r.load.active_prefill_tokens).collect();
    let decode: Vec<u64> = rows.iter().map(|r| r.load.decode_cost_blocks).collect();
    let overlaps: Vec<u32> = rows.iter().map(|r| r.cache.device_overlap_blocks).collect();
    let inputs = BusyInputs {
        active_requests: &active,
        active_prefill_tokens: &prefill,
        active_decode_blocks: &decode,
        engine: &extras.engine,
    };
    let mut allowed = Vec::new();
    mark_not_busy(busy, &inputs, &mut allowed, false);
    if let Some(max) = busy.max_active_prefill_tokens {
        let block_size = u64::from(startup.config().router.block_size);
        mark_prefill_room(max, &prefill, &overlaps, blocks, block_size, &mut allowed);
    }
    allowed
        .iter()
        .enumerate()
        .filter(|(_, &a)| a == 0)
        .map(|(r, _)| r)
        .collect()
}

/// The config's admitters on this request (`admission.admitters`): a line saying what they
/// decided, or the refusal (a priority they set becomes the request's). The partition is
/// the given fleet; nothing waits.
fn admit(
    startup: &Startup,
    rows: &[CandidateRow],
    request: &mut RouteRequest,
    prompt: PromptBlocks,
    busy: usize,
) -> Result<String, DryRunError> {
    if startup.admitters.is_empty() {
        return Ok(String::new());
    }
    let partition = PartitionKey::new("dry-run", WorkerType::Select);
    let mut admitters =
        Admitters::build(&startup.admitters, &partition).map_err(DryRunError::Admitters)?;
    let admission = startup.config().admission.as_ref();
    let saturation = Saturation {
        workers: rows.len() as u64,
        busy_workers: busy as u64,
        active_requests: rows.iter().map(|r| u64::from(r.load.active_requests)).sum(),
        active_prefill_tokens: rows.iter().map(|r| r.load.active_prefill_tokens).sum(),
        queue_capacity: admission.map_or(0, |a| a.queue.max_queued as u64),
        ..Saturation::default()
    };
    let names: Vec<&str> = admitters.stages().map(|s| &*s.name).collect();
    let names = names.join(" -> ");
    let admitted = admitters.admit(request, prompt, &saturation);
    if let Some(priority) = admitted.as_ref().ok().and_then(|p| p.priority) {
        request.strict_priority = priority;
    }
    match admitted {
        Ok(placement) => Ok(format!(
            "admission: admitted by {names} (priority {}{}{})\n",
            request.strict_priority,
            placement
                .tenant
                .map_or(String::new(), |t| format!(", queued as tenant `{t}`")),
            placement
                .max_wait_ms
                .map_or(String::new(), |ms| format!(", waiting at most {ms} ms")),
        )),
        Err(rejection) => Err(DryRunError::Refused(rejection)),
    }
}

/// One row per worker: each filter's verdict, each scorer's cost (with its weight in the
/// header), the weighted total, and the pick.
/// What the picker read besides the costs, per worker: the columns of the input groups it
/// declares (a picker-only policy decides on those alone).
fn picker_read(
    rows: &[CandidateRow],
    picker: Option<&(Arc<str>, switchyard_plugin_sdk::WorkerInputs)>,
) -> String {
    use switchyard_plugin_sdk::WorkerInputs;
    let Some((name, inputs)) = picker else {
        return String::new();
    };
    let groups = inputs.names();
    if groups.is_empty() {
        return String::new(); // the costs only: the table shows them
    }
    let mut out = format!(
        "picker {name} read {} besides the costs:\n",
        groups.join("|")
    );
    for row in rows {
        let mut read = Vec::new();
        if inputs.contains(WorkerInputs::CACHE) {
            let c = &row.cache;
            read.push(format!(
                "device/host/disk overlap {}/{}/{} blocks",
                c.device_overlap_blocks, c.host_overlap_blocks, c.disk_overlap_blocks
            ));
        }
        if inputs.contains(WorkerInputs::LOAD) {
            let l = &row.load;
            read.push(format!(
                "{} active requests, {} prefill tokens, {} decode blocks",
                l.active_requests, l.active_prefill_tokens, l.decode_cost_blocks
            ));
        }
        let _ = writeln!(
            out,
            "  worker {} dp {}: {}",
            row.worker.worker_id,
            row.worker.dp_rank,
            if read.is_empty() {
                "(groups shown by their own tools)".to_owned()
            } else {
                read.join("; ")
            }
        );
    }
    out
}

fn explain(rows: &[CandidateRow], trace: &SelectTrace, picked: Option<&WorkerId>) -> String {
    let mut header = vec!["worker".to_owned(), "dp".to_owned()];
    header.extend(
        trace
            .filters
            .iter()
            .map(|(name, _)| format!("filter {name}")),
    );
    header.extend(
        trace
            .scorers
            .iter()
            .map(|(name, weight, _)| format!("{name} x{weight}")),
    );
    header.push("total".into());
    let mut table: Vec<Vec<String>> = vec![header];
    for row in rows {
        let id = row.worker;
        let mut cells = vec![id.worker_id.to_string(), id.dp_rank.to_string()];
        let mut dropped_by = None;
        for (name, dropped) in &trace.filters {
            let verdict = if dropped_by.is_some() {
                "-".to_owned()
            } else if dropped.contains(&id) {
                dropped_by = Some(name.clone());
                "DROP".to_owned()
            } else {
                "keep".to_owned()
            };
            cells.push(verdict);
        }
        let mut total = 0.0;
        let mut scored = false;
        for (_, weight, costs) in &trace.scorers {
            match costs.iter().find(|(w, _)| *w == id) {
                Some((_, cost)) => {
                    total += weight * cost;
                    scored = true;
                    cells.push(format!("{cost:.3}"));
                }
                None => cells.push("-".into()),
            }
        }
        cells.push(if scored {
            format!("{total:.3}")
        } else {
            "-".into()
        });
        if picked == Some(&id) {
            let picker = trace.picker.as_deref().unwrap_or("the picker");
            cells.push(format!("<- picked by {picker}"));
        }
        table.push(cells);
    }
    let columns = table.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            table
                .iter()
                .filter_map(|r| r.get(c))
                .map(String::len)
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in &table {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, cell)| format!("{cell:<width$}", width = widths[c]))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    out
}
