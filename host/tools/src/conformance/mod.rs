//! `switchyard plugin test LIB.so`: a conformance run for a plugin's vendor to put in CI.
//! Each registered type is exercised in a child process of its own (this binary's hidden
//! `__plugin-test` subcommand), so a crash is a finding with the phase it happened in, not
//! the end of the run:
//!
//! - parameters: the given ones (or `{}`) are accepted; an unknown key is refused;
//! - each component on fleets of 1, 2, 7, 64, 1,024 and 10,000 candidates, with the
//!   groups it declared and only those (an undeclared group is a NULL column, as in the
//!   router), with zeros, maxima and random values: a filter writes only 0 or 1, a
//!   scorer only finite costs, a picker a row in range;
//! - the same input twice gives the same output (unless `--allow-random`), and a call
//!   from another thread (one at a time, as the router calls) answers the same;
//! - policy types: built for prefill, decode and select, each selection in range;
//! - time per call and per candidate at 1,024 candidates.

pub use error::ConformanceError;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use switchyard_plugin_sdk::{Saturation, WorkerId, WorkerType};

use crate::plugin::{
    ComponentKind, EngineReport, EngineSample, ErrorBuffer, Labels, Lifecycle, Outcome,
    OwnedParams, PartitionKey, PluginSpec, PromptBlocks, RequestAttributes, RevisionRule,
    RouteRequest,
};
use crate::policy::{
    CandidateRow, Candidates, CandidatesFrom, Origin, Policy, PolicyFactory, RawOutput, Registry,
    RowExtras, Selector, Stage,
};

mod checks;
mod error;
mod inputs;
pub mod optimization;
use checks::{test_admitter, test_component, test_policy, unknown_parameters_refused};
use inputs::{
    conformance_request, engine_reports, labels, lifecycle_script, owned, params_hint,
    params_with_unknown, rows, saturations, GivenParams, CONFORMANCE_PROMPT,
};

/// The hidden subcommand a type is tested in.
pub const SUBCOMMAND: &str = "__plugin-test";
/// A key no plugin can mean: it must be refused.
const UNKNOWN_KEY: &str = "switchyard_conformance_unknown_key";
const FLEETS: [usize; 6] = [1, 2, 7, 64, 1024, 10_000];
/// How long one type's run may take before it counts as hung.
const TIME_LIMIT: Duration = Duration::from_secs(120);

/// What `plugin test` takes.
#[derive(clap::Args, Debug)]
pub struct TestArgs {
    /// The plugin library.
    pub file: PathBuf,
    /// Test only these types (repeat); every registered type by default.
    #[arg(long = "type")]
    pub types: Vec<String>,
    /// Parameters to build types with: `TYPE={...}` for one type (repeat for others), or a
    /// bare JSON object for every type without its own; `{}` by default.
    #[arg(long)]
    pub params: Vec<String>,
    /// Types that are random by design: different answers for the same input pass.
    #[arg(long)]
    pub allow_random: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// A switchyard config whose instances (and admitters) give the parameters of the
    /// types they use; `--params` given for a type wins over it.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// `TYPE={...}` for each type a config's instances and admitters use, with the
/// parameters of its first use, in the config's order.
fn config_params(path: &std::path::Path) -> Result<Vec<(String, String)>, ConformanceError> {
    let source =
        switchyard_config::ConfigSource::from_file(path).map_err(ConformanceError::Config)?;
    let config = source.config;
    let json = |map: &serde_json::Map<String, serde_json::Value>| {
        serde_json::Value::Object(map.clone()).to_string()
    };
    let mut uses: Vec<(String, String)> = Vec::new();
    for instance in &config.worker_selection.instances {
        if let Some(policy_type) = &instance.policy_type {
            uses.push((policy_type.clone(), json(&instance.parameters)));
        }
        let components = instance.filters.iter().chain(&instance.scorers);
        for c in components.chain(instance.picker.as_ref()) {
            uses.push((c.component_type.clone(), json(&c.parameters)));
        }
    }
    for admitter in config.admission.iter().flat_map(|a| &a.admitters) {
        uses.push((admitter.admitter_type.clone(), json(&admitter.parameters)));
    }
    let mut first: Vec<(String, String)> = Vec::new();
    for (type_name, params) in uses {
        if !first.iter().any(|(t, _)| *t == type_name) {
            first.push((type_name, params));
        }
    }
    Ok(first)
}

#[derive(Serialize, Deserialize)]
struct ChildInput {
    file: PathBuf,
    /// None: list the types.
    type_name: Option<String>,
    params: String,
    allow_random: bool,
}

/// One check's verdict.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Finding {
    pub check: String,
    pub ok: bool,
    pub detail: String,
}

/// What the child reports, one JSON object per line.
#[derive(Serialize, Deserialize)]
enum Line {
    Types(Vec<(String, String)>),
    /// The loader refused the library (no crash): why.
    Refused(String),
    Phase(String),
    Finding(Finding),
    Timing {
        ns_per_call: f64,
        ns_per_candidate: Option<f64>,
    },
    Done,
}

/// One type's results.
#[derive(Debug, Serialize)]
pub struct TypeReport {
    pub type_name: String,
    pub kind: String,
    pub findings: Vec<Finding>,
    pub ns_per_call: Option<f64>,
    pub ns_per_candidate: Option<f64>,
}

impl TypeReport {
    pub fn passed(&self) -> bool {
        self.findings.iter().all(|f| f.ok)
    }
}

fn emit(line: &Line) {
    println!("{}", serde_json::to_string(line).unwrap_or_default());
    let _ = std::io::stdout().flush();
}

/// A test child's data limit: a type that allocates without end is stopped there (and
/// reported as a crash), not by the kernel's OOM killer.
const CHILD_MEMORY_LIMIT_MB: u64 = 4096;

/// Runs the child for `input`; its lines, and how it ended if it did not finish.
fn child(input: &ChildInput) -> Result<(Vec<Line>, Option<String>), ConformanceError> {
    let exe = std::env::current_exe().map_err(ConformanceError::NoExecutable)?;
    let mut command = Command::new(exe);
    crate::isolation::child::name_parent(&mut command);
    crate::isolation::child::limit_memory(&mut command, CHILD_MEMORY_LIMIT_MB << 20);
    let mut child = command
        .arg(SUBCOMMAND)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(ConformanceError::Spawn)?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(serde_json::to_string(input).unwrap_or_default().as_bytes());
    }
    let stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        stdout.map_or_else(Vec::new, |out| {
            BufReader::new(out)
                .lines()
                .map_while(Result::ok)
                .filter_map(|l| serde_json::from_str::<Line>(&l).ok())
                .collect::<Vec<_>>()
        })
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() > TIME_LIMIT => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => break None,
        }
    };
    let lines = reader.join().unwrap_or_default();
    let finished = lines.iter().any(|l| matches!(l, Line::Done));
    let ended = match status {
        _ if finished => None,
        None => Some(format!("did not finish within {} s", TIME_LIMIT.as_secs())),
        Some(status) => Some(crate::isolation::describe_exit(status, false)),
    };
    Ok((lines, ended))
}

/// The conformance run: a report per type, or why it could not run.
pub fn run(args: &TestArgs) -> Result<Vec<TypeReport>, ConformanceError> {
    let mut given = GivenParams::parse(&args.params)?;
    let params = given.every.clone();
    let (lines, ended) = child(&ChildInput {
        file: args.file.clone(),
        type_name: None,
        params: params.clone(),
        allow_random: args.allow_random,
    })?;
    if let Some(reason) = lines.iter().find_map(|l| match l {
        Line::Refused(reason) => Some(reason.clone()),
        _ => None,
    }) {
        return Err(ConformanceError::Refused(reason));
    }
    let mut types = lines
        .into_iter()
        .find_map(|l| match l {
            Line::Types(types) => Some(types),
            _ => None,
        })
        .ok_or_else(|| match ended {
            Some(how) => ConformanceError::Crashed {
                file: args.file.clone(),
                how,
            },
            None => ConformanceError::NotLoaded(args.file.clone()),
        })?;
    let no_such_type = |flag, name: &str| ConformanceError::NoSuchType {
        flag,
        name: name.to_owned(),
        registered: types.iter().map(|(n, _)| n.clone()).collect(),
    };
    if let Some((missing, _)) = given
        .per_type
        .iter()
        .find(|(t, _)| !types.iter().any(|(n, _)| n == t))
    {
        return Err(no_such_type("--params", missing));
    }
    if !args.types.is_empty() {
        if let Some(missing) = args
            .types
            .iter()
            .find(|t| !types.iter().any(|(n, _)| n == *t))
        {
            return Err(no_such_type("--type", missing));
        }
        types.retain(|(n, _)| args.types.contains(n));
    }
    if let Some(path) = &args.config {
        // Before the flags' own (the last given for a type wins), and only for the
        // types this library registers: a config also uses built-ins and other plugins.
        let from_config = config_params(path)?
            .into_iter()
            .filter(|(t, _)| types.iter().any(|(n, _)| n == t));
        let mut per_type: Vec<(String, String)> = from_config.collect();
        per_type.append(&mut given.per_type);
        given.per_type = per_type;
    }
    types
        .into_iter()
        .map(|(type_name, kind)| test_type(args, &given, type_name, kind))
        .collect()
}

/// One registered type tested in a child process of its own.
fn test_type(
    args: &TestArgs,
    given: &GivenParams,
    type_name: String,
    kind: String,
) -> Result<TypeReport, ConformanceError> {
    let (lines, ended) = child(&ChildInput {
        file: args.file.clone(),
        type_name: Some(type_name.clone()),
        params: given.of(&type_name).to_owned(),
        allow_random: args.allow_random,
    })?;
    let mut report = TypeReport {
        type_name,
        kind,
        findings: Vec::new(),
        ns_per_call: None,
        ns_per_candidate: None,
    };
    let mut phase = String::from("starting");
    for line in lines {
        match line {
            Line::Phase(p) => phase = p,
            Line::Finding(f) => report.findings.push(f),
            Line::Timing {
                ns_per_call,
                ns_per_candidate,
            } => {
                report.ns_per_call = Some(ns_per_call);
                report.ns_per_candidate = ns_per_candidate;
            }
            Line::Types(_) | Line::Refused(_) | Line::Done => {}
        }
    }
    if let Some(how) = ended {
        report.findings.push(Finding {
            check: "no crash".into(),
            ok: false,
            detail: format!("the test process {how} while {phase}"),
        });
    }
    Ok(report)
}

/// What to say when `file` looks built without optimization (`optimization.rs`): its
/// calls may cost ten times an optimized build's, so its timings mislead.
pub fn optimization_warning(file: &std::path::Path) -> Option<String> {
    // A library larger than this is not read again for a warning.
    const MAX_BYTES: u64 = 1 << 30;
    if std::fs::metadata(file).ok()?.len() > MAX_BYTES {
        return None;
    }
    let spills = optimization::argument_spills(&std::fs::read(file).ok()?)?;
    spills.unoptimized().then(|| {
        format!(
            "{} looks built without optimization: {} of its {} functions store their arguments to the stack on entry, as -O0 and debug builds do, so each call may cost several times an optimized build's; build it optimized (-O2; CMake: -DCMAKE_BUILD_TYPE=Release; Cargo: --release)",
            file.display(),
            spills.spilling,
            spills.functions
        )
    })
}

/// The report as a table.
pub fn table(file: &std::path::Path, reports: &[TypeReport]) -> String {
    use std::fmt::Write as _;
    let mut out = format!("plugin test {}\n", file.display());
    for r in reports {
        let timing = match (r.ns_per_call, r.ns_per_candidate) {
            (Some(call), _) if r.kind == "admitter" => format!("  {:.1} us per call", call / 1e3),
            (Some(call), Some(candidate)) => {
                format!(
                    "  {:.1} us per call, {candidate:.1} ns per candidate at 1,024",
                    call / 1e3
                )
            }
            _ => String::new(),
        };
        let verdict = if r.passed() { "ok" } else { "FAIL" };
        let _ = writeln!(out, "{verdict:<5}{} {}{timing}", r.kind, r.type_name);
        for f in r.findings.iter().filter(|f| !f.ok) {
            let _ = writeln!(out, "       {}: {}", f.check, f.detail);
        }
    }
    let failed = reports.iter().filter(|r| !r.passed()).count();
    let _ = writeln!(out, "{} type(s), {failed} failed", reports.len());
    out
}

// ---- the child -------------------------------------------------------------------------

fn finding(check: &str, ok: bool, detail: impl Into<String>) {
    emit(&Line::Finding(Finding {
        check: check.into(),
        ok,
        detail: detail.into(),
    }));
}

/// Equal outputs; costs compare bit for bit (a NaN equals the same NaN: the non-finite
/// check reports it, not this one).
fn same(a: &RawOutput, b: &RawOutput) -> bool {
    match (a, b) {
        (RawOutput::Costs(a), RawOutput::Costs(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
        }
        _ => a == b,
    }
}

/// The plugin's own types (components and policies), with their kinds.
fn plugin_types(registry: &Registry) -> Vec<(String, String)> {
    let mut types: Vec<(String, String)> = registry
        .components()
        .filter(|c| matches!(c.origin, Origin::Plugin { .. }))
        .map(|c| (c.name.clone(), c.kind.as_str().to_owned()))
        .collect();
    types.extend(
        registry
            .policies()
            .filter(|p| matches!(p.origin, Origin::Plugin { .. }))
            .map(|p| (p.name.clone(), "policy".to_owned())),
    );
    types.sort();
    types
}

/// A policy type built for every worker type; the `select` build tested.
fn build_and_test(factory: &PolicyFactory, allow_random: bool) {
    for worker_type in WorkerType::ALL {
        emit(&Line::Phase(format!(
            "building it for {}",
            worker_type.as_str()
        )));
        let built = factory
            .build(&PartitionKey::new("conformance", worker_type))
            .and_then(Policy::new);
        match built {
            Ok(policy) if worker_type == WorkerType::Select => test_policy(policy, allow_random),
            Ok(_) => {}
            Err(e) => finding(
                "builds for every worker type",
                false,
                format!("{}: {e}", worker_type.as_str()),
            ),
        }
    }
}

/// The child: reads its input (library, type, parameters) on stdin, lists or tests one
/// type, one JSON line per phase and finding. Returns the exit code.
pub fn run_child() -> i32 {
    crate::isolation::child::exit_with_parent();
    let mut text = String::new();
    if std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).is_err() {
        return 2;
    }
    let Ok(input) = serde_json::from_str::<ChildInput>(&text) else {
        return 2;
    };
    emit(&Line::Phase("loading and registering the library".into()));
    let mut registry = Registry::with_builtins();
    let spec = PluginSpec {
        path: input.file.clone(),
        sha256: None,
        revision: RevisionRule::default(),
    };
    if let Err(e) = registry.load_plugin(&spec) {
        emit(&Line::Refused(e.to_string()));
        return 3;
    }
    let Some(type_name) = input.type_name else {
        emit(&Line::Types(plugin_types(&registry)));
        emit(&Line::Done);
        return 0;
    };
    let (Some(params), Some(unknown)) = (
        owned(&input.params),
        owned(&params_with_unknown(&input.params)),
    ) else {
        return 2;
    };
    let partition = PartitionKey::new("conformance", WorkerType::Select);
    if let Some(component) = registry.component(&type_name).cloned() {
        emit(&Line::Phase("creating it with the given parameters".into()));
        let stage = component.create(&params, &partition);
        emit(&Line::Phase("creating it with an unknown parameter".into()));
        let refused = component.create(&unknown, &partition).is_err();
        unknown_parameters_refused(refused);
        match stage {
            Ok(mut stage) => {
                finding("given parameters accepted", true, "");
                if stage.kind == ComponentKind::Admitter {
                    test_admitter(&mut stage, input.allow_random);
                } else {
                    test_component(&mut stage, input.allow_random);
                }
            }
            Err(e) => finding(
                "given parameters accepted",
                false,
                format!("{e} ({})", params_hint(&type_name, &input.params)),
            ),
        }
    } else if let Some(policy_type) = registry.policy(&type_name).cloned() {
        emit(&Line::Phase("validating the given parameters".into()));
        let factory = policy_type.validate(&params, &registry);
        let refused = policy_type.validate(&unknown, &registry).is_err();
        unknown_parameters_refused(refused);
        match factory {
            Ok(factory) => {
                finding("given parameters accepted", true, "");
                build_and_test(&factory, input.allow_random);
            }
            Err(e) => finding(
                "given parameters accepted",
                false,
                format!("{e} ({})", params_hint(&type_name, &input.params)),
            ),
        }
    } else {
        return 2;
    }
    emit(&Line::Done);
    0
}
