//! What `switchyard check` and `switchyard plugin inspect` print.

use std::fmt::Write;

use std::path::Path;
use switchyard_plugin_sdk::WorkerType;

use serde::Serialize;

use crate::plugin::library::{examine, PluginFile};
use crate::plugin::{LoadError, LoadedPlugin, Manifest, PartitionKey, PluginSpec};
use crate::policy::Registry;
use crate::startup::Startup;

/// One registered type, as summaries show it.
#[derive(Serialize)]
pub struct TypeSummary {
    pub name: String,
    /// `policy`, `filter`, `scorer` or `picker`.
    pub kind: &'static str,
    /// Input groups (components only).
    pub inputs: Vec<&'static str>,
}

fn types_of(registry: &Registry, plugin: &LoadedPlugin) -> Vec<TypeSummary> {
    plugin
        .types
        .iter()
        .map(|name| match registry.component(name) {
            Some(c) => TypeSummary {
                name: name.clone(),
                kind: c.kind.as_str(),
                inputs: c.inputs.names(),
            },
            None => TypeSummary {
                name: name.clone(),
                kind: "policy",
                inputs: Vec::new(),
            },
        })
        .collect()
}

/// One type line: kind, name and, for components, the input groups it reads.
fn write_type(out: &mut String, kind: &str, name: &str, inputs: &[&str]) {
    let reads = match (kind, inputs) {
        ("policy", _) => String::new(),
        (_, []) => "  reads: -".to_owned(),
        _ => format!("  reads: {}", inputs.join("|")),
    };
    let _ = writeln!(out, "    {kind:<7} {name}{reads}");
}

fn write_plugin(out: &mut String, registry: &Registry, plugin: &LoadedPlugin) {
    let info = &plugin.info;
    let _ = writeln!(out, "  {} {} ({})", info.name, info.version, info.vendor);
    let resolved = std::fs::canonicalize(&plugin.path).unwrap_or_else(|_| plugin.path.clone());
    let _ = writeln!(out, "    path:     {}", resolved.display());
    let _ = writeln!(out, "    sha256:   {}", plugin.sha256);
    if let Some(process) = &plugin.isolated_in {
        let _ = writeln!(
            out,
            "    isolated: in process `{process}` (isolation: process)"
        );
    }
    let _ = writeln!(
        out,
        "    ABI:      {}.{}, SDK revision {}, layout {}",
        info.abi_major, info.abi_minor, info.sdk_revision, info.layout_fingerprint
    );
    let manifest = match &plugin.manifest {
        Some(m) if m.types.is_empty() => "matches the library (declares no types)",
        Some(_) => "matches the library and its registration",
        None => "none (a hand-written descriptor): inspect needs --load to list its types",
    };
    let _ = writeln!(out, "    manifest: {manifest}");
    for t in types_of(registry, plugin) {
        write_type(out, t.kind, &t.name, &t.inputs);
    }
}

/// The `check` summary: plugins, their types, and each instance's components.
/// Instances reading a group nothing feeds: ENGINE while `engine_metrics.interval_ms` is
/// 0 (their components never see a sample). Printed by `check` and `serve`.
pub fn unfed_input_warnings(startup: &Startup) -> Vec<String> {
    if startup.config().engine_metrics.interval_ms > 0 {
        return Vec::new();
    }
    startup
        .instances
        .iter()
        .filter(|instance| {
            let partition = PartitionKey::new("check", instance.serves[0]);
            instance.build(&partition).is_ok_and(|policy| {
                policy
                    .inputs()
                    .contains(switchyard_plugin_sdk::WorkerInputs::ENGINE)
            })
        })
        .map(|instance| {
            format!(
                "instance `{}` reads engine-reported load (the ENGINE input group), but `engine_metrics.interval_ms` is 0: no engine is scraped, so it sees no samples; set engine_metrics.interval_ms (docs/engine-load.md)",
                instance.name
            )
        })
        .collect()
}

pub fn check_summary(startup: &Startup) -> String {
    let mut out = String::new();
    let registry = &startup.registry;
    let _ = writeln!(out, "config: {}", startup.source.name);
    let _ = writeln!(out, "plugins ({}):", registry.plugins().len());
    for plugin in registry.plugins() {
        write_plugin(&mut out, registry, plugin);
    }
    let _ = writeln!(
        out,
        "instances ({}), default: {}{}",
        startup.instances.len(),
        startup.default_instance(),
        role_defaults(startup)
    );
    for instance in &startup.instances {
        let roles = if instance.serves.len() == WorkerType::ALL.len() {
            String::new()
        } else {
            format!("; serves {}", instance.roles())
        };
        let _ = writeln!(
            out,
            "  {} ({}; on_error: {}{roles})",
            instance.name,
            instance.describe(),
            instance.on_error.as_str()
        );
        // Startup built every instance for the roles it serves; show the first's pipeline.
        if let Ok(policy) = instance.build(&PartitionKey::new("<check>", instance.serves[0])) {
            let weights: Vec<_> = policy.weights().collect();
            for stage in policy.stages() {
                let weight = weights
                    .iter()
                    .find(|(name, _)| *name == &*stage.name)
                    .map(|(_, w)| format!(" x{w}"))
                    .unwrap_or_default();
                let inputs = stage.inputs.names();
                let inputs = if inputs.is_empty() {
                    "-".to_owned()
                } else {
                    inputs.join("|")
                };
                let _ = writeln!(
                    out,
                    "    {:<7} {}{weight}  reads: {inputs}",
                    stage.kind.as_str(),
                    stage.name
                );
            }
        }
    }
    write_kv_bounds(&mut out, startup);
    let types: usize = registry.plugins().iter().map(|p| p.types.len()).sum();
    let _ = writeln!(
        out,
        "ok: {} plugin(s), {types} plugin type(s), {} instance(s), each built for the worker types it serves",
        registry.plugins().len(),
        startup.instances.len()
    );
    out
}

/// ` (aggregated); prefill: P, decode: D` when a role's requests get another instance
/// than aggregated ones (`worker_selection.prefill` / `decode`, or their variables).
fn role_defaults(startup: &Startup) -> String {
    let aggregated = startup.default_for(WorkerType::Select);
    let roles = [WorkerType::Prefill, WorkerType::Decode];
    if roles
        .iter()
        .all(|&role| startup.default_for(role) == aggregated)
    {
        return String::new();
    }
    let each: Vec<String> = roles
        .into_iter()
        .map(|role| format!("{}: {}", role.as_str(), startup.default_for(role)))
        .collect();
    format!(" (aggregated); {}", each.join(", "))
}

/// Each configured worker's KV index bound and where it came from. At run time an
/// engine that reports a larger cache (vLLM's `cache_config_info`) raises it;
/// `GET /v1/workers` shows the bound in force.
fn write_kv_bounds(out: &mut String, startup: &Startup) {
    let config = startup.config();
    if config.workers.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "KV index bound per worker (blocks; a safety net, raised at run time by a larger engine-reported cache):"
    );
    for spec in &config.workers {
        let bound = crate::fleet::kv_bound::kv_bound(config, spec, None);
        let source = serde_json::to_value(bound.source).unwrap_or_default();
        let _ = writeln!(
            out,
            "  {} worker {} rank {}: device {} ({}), host and disk {} each",
            spec.model,
            spec.worker_id,
            spec.dp_rank,
            bound.device_blocks,
            source.as_str().unwrap_or("?"),
            bound.offloaded_blocks
        );
    }
}

/// `plugin inspect --load` output for one library.
#[derive(Serialize)]
pub struct Inspection {
    #[serde(flatten)]
    pub plugin: LoadedPlugin,
    pub registered: Vec<TypeSummary>,
}

/// `plugin inspect --load`: loads the library into this process and runs its
/// registration.
pub fn inspect_loaded(path: &Path) -> Result<(Inspection, String), LoadError> {
    let mut registry = Registry::default();
    let spec = PluginSpec {
        path: path.to_owned(),
        sha256: None,
        revision: Default::default(),
    };
    registry.load_plugin(&spec)?;
    let plugin = registry.plugins()[0].clone();
    let mut text = String::new();
    write_plugin(&mut text, &registry, &plugin);
    let registered = types_of(&registry, &plugin);
    Ok((Inspection { plugin, registered }, text))
}

/// `plugin inspect`: what the file says of itself, read without loading it; no code of
/// the library runs.
pub fn inspect_file(path: &Path) -> Result<(PluginFile, String), LoadError> {
    let file = examine(path)?;
    let mut out = String::new();
    let resolved = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    match &file.manifest {
        Some(Manifest {
            name,
            version,
            vendor,
            abi_major,
            abi_minor,
            sdk_revision,
            layout_fingerprint,
            types,
        }) => {
            let _ = writeln!(out, "  {name} {version} ({vendor})");
            let _ = writeln!(out, "    path:     {}", resolved.display());
            let _ = writeln!(out, "    sha256:   {}", file.sha256);
            let _ = writeln!(
                out,
                "    ABI:      {abi_major}.{abi_minor}, SDK revision {sdk_revision}, layout {layout_fingerprint}"
            );
            let _ = match &file.refused {
                None => writeln!(
                    out,
                    "    verdict:  this router (ABI {}.{}) accepts this ABI and layout",
                    switchyard_plugin_sdk::abi::SWITCHYARD_ABI_MAJOR,
                    crate::plugin::HOST_ABI_MINOR
                ),
                Some(why) => writeln!(
                    out,
                    "    verdict:  REFUSED by this router (ABI {}.{}): {why}",
                    switchyard_plugin_sdk::abi::SWITCHYARD_ABI_MAJOR,
                    crate::plugin::HOST_ABI_MINOR
                ),
            };
            let _ = writeln!(
                out,
                "    manifest: read from the file; the library was not loaded{}",
                if types.is_empty() {
                    " (it declares no types: --load lists what it registers)"
                } else {
                    ""
                }
            );
            for t in types {
                write_type(&mut out, &t.kind, &t.name, &t.inputs);
            }
        }
        None => {
            let _ = writeln!(out, "  {} (no manifest)", resolved.display());
            let _ = writeln!(out, "    sha256:   {}", file.sha256);
            let _ = writeln!(
                out,
                "    manifest: none: the library was built without the SDK's export macro. \
                 `plugin inspect --load` loads it and runs its registration"
            );
        }
    }
    Ok((file, out))
}
