//! The plugin loader: checksum, dlopen (RTLD_NOW | RTLD_LOCAL), entry symbol, ABI checks,
//! registration. Libraries stay loaded for the life of the process.

use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use sha2::{Digest, Sha256};
use switchyard_plugin_sdk::abi::*;
use switchyard_plugin_sdk::{write_error, WorkerInputs};

use crate::abi_checks::{self, check_descriptor, copy_sized, PluginInfo, RevisionRule};
use crate::registry::{ComponentKind, Origin, PluginComponentDef, PluginPolicyDef, Registry};

/// One failed load-time check. Every message names the file, what was expected, what was
/// found and what to do.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{}: plugin file not found ({source}). Check the `path:` in the config; relative paths are resolved against the config file's folder", path.display())]
    FileNotFound {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: sha256 mismatch: the config expects {expected}, the file has {found}. The file changed since it was pinned: verify where it came from, then update `sha256:` in the config", path.display())]
    ChecksumMismatch {
        path: PathBuf,
        expected: String,
        found: String,
    },
    #[error("{}: not a loadable shared library: {reason}. Point `path:` at a .so built for this platform (a cdylib, or a C/C++ MODULE library)", path.display())]
    NotLoadable { path: PathBuf, reason: String },
    #[error("{}: unresolved symbol `{symbol}`: the library needs a symbol that neither it nor its dependencies define. Link the library that provides `{symbol}` into the plugin, or remove the reference ({reason})", path.display())]
    UnresolvedSymbol {
        path: PathBuf,
        symbol: String,
        reason: String,
    },
    #[error("{}: missing entry symbol `{}`{}", path.display(), SWITCHYARD_ENTRY_SYMBOL, match other_major {
        Some(major) => format!(": the library exports `switchyard_plugin_entry_v{major}`, so it was built for ABI {major}.x; this router speaks ABI {SWITCHYARD_ABI_MAJOR}.x. Rebuild the plugin against switchyard-plugin-sdk {SWITCHYARD_SDK_REVISION} (ABI {SWITCHYARD_ABI_MAJOR}.x)"),
        None => ". This is not a switchyard plugin, or it was built without the export macro (SWITCHYARD_PLUGIN in C/C++, export_plugin! in Rust) or with hidden visibility on it".to_owned(),
    })]
    MissingEntry {
        path: PathBuf,
        other_major: Option<u16>,
    },
    #[error("{}: the entry symbol returned a NULL descriptor; it must return a pointer to a static switchyard_plugin_descriptor (use the SDK's export macro)", path.display())]
    NullDescriptor { path: PathBuf },
    #[error("{}: ABI major mismatch: the router speaks ABI {expected}.x, the plugin declares ABI {found}.x. Rebuild the plugin against switchyard-plugin-sdk {} (ABI {expected}.x)", path.display(), SWITCHYARD_SDK_REVISION)]
    AbiMajorMismatch {
        path: PathBuf,
        found: u16,
        expected: u16,
    },
    #[error("{}: the plugin was built for ABI 1.{found}, newer than this router's ABI 1.{host}. Upgrade the router, or rebuild the plugin against an SDK of ABI 1.{host} or older", path.display())]
    NewerMinor {
        path: PathBuf,
        found: u16,
        host: u16,
    },
    #[error("{}: {what} is {found} bytes, but ABI 1.{minor} requires at least {required}. The plugin was compiled against a truncated or edited header; rebuild it against the SDK's unmodified include/switchyard/plugin.h", path.display())]
    TruncatedStruct {
        path: PathBuf,
        what: &'static str,
        found: usize,
        required: usize,
        minor: u16,
    },
    #[error("{}: layout fingerprint mismatch for ABI 1.{minor}: expected {expected:#018x}, found {found:#018x}. The plugin was compiled against a stale or hand-edited plugin.h; rebuild it against the header shipped with switchyard-plugin-sdk {}", path.display(), SWITCHYARD_SDK_REVISION)]
    LayoutMismatch {
        path: PathBuf,
        found: u64,
        expected: u64,
        minor: u16,
    },
    #[error("{}: SDK revision mismatch: `revision: exact` requires {expected}, the plugin was built with {found}. Rebuild the plugin against switchyard-plugin-sdk {expected}, or set `revision: compatible`", path.display())]
    RevisionMismatch {
        path: PathBuf,
        found: String,
        expected: String,
    },
    #[error("{}: invalid descriptor: `{field}` {problem}. Define the descriptor with the SDK's export macro", path.display())]
    InvalidDescriptor {
        path: PathBuf,
        field: &'static str,
        problem: &'static str,
    },
    #[error("{}: registration failed (status {status}): {message}. Fix the plugin's register function", path.display())]
    RegistrationFailed {
        path: PathBuf,
        status: i32,
        message: String,
    },
    #[error("{}: duplicate type name `{name}`: already registered by {first}. Type names are global; rename one of them (prefix with your vendor, e.g. `acme.{name}`)", path.display())]
    DuplicateType {
        path: PathBuf,
        name: String,
        first: String,
    },
    #[error("{}: a {kind} was registered with an empty type name. Give every type a stable, unique, non-empty name", path.display())]
    EmptyTypeName { path: PathBuf, kind: &'static str },
    #[error("{}: type `{name}`: {problem}", path.display())]
    InvalidDefinition {
        path: PathBuf,
        name: String,
        problem: String,
    },
}

/// A plugin to load, as the config names it.
#[derive(Clone, Debug)]
pub struct PluginSpec {
    /// Resolved (absolute, or relative to the working directory) path.
    pub path: PathBuf,
    pub sha256: Option<String>,
    pub revision: RevisionRule,
}

/// A library that passed every check.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LoadedPlugin {
    pub path: PathBuf,
    #[serde(flatten)]
    pub info: PluginInfo,
    pub types: Vec<String>,
}

/// Every library opened by this process, by canonical path. Never unloaded: instances,
/// defs and strings of a plugin may live until exit.
fn libraries() -> &'static Mutex<HashMap<PathBuf, &'static libloading::Library>> {
    static LIBRARIES: OnceLock<Mutex<HashMap<PathBuf, &'static libloading::Library>>> =
        OnceLock::new();
    LIBRARIES.get_or_init(Default::default)
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn open(path: &Path) -> Result<&'static libloading::Library, LoadError> {
    let canonical = std::fs::canonicalize(path).map_err(|source| LoadError::FileNotFound {
        path: path.to_owned(),
        source,
    })?;
    let mut libraries = libraries().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(library) = libraries.get(&canonical) {
        return Ok(library);
    }
    // Eager binding makes an unresolved symbol fail here, by name, not at first call;
    // local symbols keep two plugins' internals apart.
    let flags = libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL;
    // SAFETY: running the library's initializers is what loading a plugin means.
    let library =
        unsafe { libloading::os::unix::Library::open(Some(&canonical), flags) }.map_err(|e| {
            let reason = e.to_string();
            match reason.split("undefined symbol: ").nth(1) {
                Some(rest) => LoadError::UnresolvedSymbol {
                    path: path.to_owned(),
                    symbol: rest
                        .split([' ', ',', ')'])
                        .next()
                        .unwrap_or(rest)
                        .to_owned(),
                    reason,
                },
                None => LoadError::NotLoadable {
                    path: path.to_owned(),
                    reason,
                },
            }
        })?;
    let library: &'static libloading::Library = Box::leak(Box::new(library.into()));
    libraries.insert(canonical, library);
    Ok(library)
}

fn entry(path: &Path, library: &libloading::Library) -> Result<switchyard_entry_fn, LoadError> {
    // SAFETY: the symbol's type is fixed by the ABI's name for it.
    if let Ok(symbol) =
        unsafe { library.get::<switchyard_entry_fn>(SWITCHYARD_ENTRY_SYMBOL.as_bytes()) }
    {
        return Ok(*symbol);
    }
    let other_major = (0..=32u16)
        .filter(|&m| m != SWITCHYARD_ABI_MAJOR)
        .find(|major| {
            let name = format!("switchyard_plugin_entry_v{major}");
            unsafe { library.get::<*const c_void>(name.as_bytes()) }.is_ok()
        });
    Err(LoadError::MissingEntry {
        path: path.to_owned(),
        other_major,
    })
}

/// Opens one library, runs every check and its registration into `registry`. A file
/// already loaded into this registry is skipped (its checksum is still verified).
pub fn load_into(registry: &mut Registry, spec: &PluginSpec) -> Result<(), LoadError> {
    let path = spec.path.as_path();
    if let Some(expected) = &spec.sha256 {
        let bytes = std::fs::read(path).map_err(|source| LoadError::FileNotFound {
            path: path.to_owned(),
            source,
        })?;
        let found = sha256_hex(&bytes);
        if !found.eq_ignore_ascii_case(expected.trim()) {
            return Err(LoadError::ChecksumMismatch {
                path: path.to_owned(),
                expected: expected.clone(),
                found,
            });
        }
    }
    let canonical = std::fs::canonicalize(path).map_err(|source| LoadError::FileNotFound {
        path: path.to_owned(),
        source,
    })?;
    if registry
        .plugins()
        .iter()
        .any(|p| std::fs::canonicalize(&p.path).ok().as_ref() == Some(&canonical))
    {
        tracing::info!(path = %path.display(), "plugin listed more than once; loaded once");
        return Ok(());
    }
    let library = open(path)?;
    let entry = entry(path, library)?;
    // SAFETY: the entry symbol takes nothing and returns a pointer the checks validate.
    let info = unsafe { check_descriptor(path, entry(), spec.revision)? };
    let on_register = info.on_register.expect("checked non-NULL");

    let mut context = RegistrationContext {
        registry,
        path,
        plugin: &info,
        errors: Vec::new(),
        types: Vec::new(),
    };
    let registrar = switchyard_registrar {
        struct_size: std::mem::size_of::<switchyard_registrar>() as u32,
        host_abi_minor: u32::from(abi_checks::HOST_ABI_MINOR),
        host_data: std::ptr::from_mut(&mut context).cast(),
        callback_register_component: register_component,
        callback_register_policy: register_policy,
    };
    let mut buffer = ErrorBuffer::new();
    let status = on_register(&registrar, &buffer.as_abi());
    let RegistrationContext { errors, types, .. } = context;
    if let Some(first) = errors.into_iter().next() {
        return Err(first);
    }
    if status != SWITCHYARD_STATUS_OK {
        return Err(LoadError::RegistrationFailed {
            path: path.to_owned(),
            status,
            message: buffer.message(),
        });
    }
    registry.add_plugin(LoadedPlugin {
        path: path.to_owned(),
        info,
        types,
    });
    Ok(())
}

/// A host-owned error buffer handed to plugin callbacks.
pub struct ErrorBuffer {
    bytes: [u8; 1024],
}

impl ErrorBuffer {
    pub fn new() -> Self {
        ErrorBuffer { bytes: [0; 1024] }
    }
    pub fn as_abi(&mut self) -> switchyard_error {
        self.bytes[0] = 0;
        switchyard_error {
            buffer: self.bytes.as_mut_ptr().cast(),
            capacity: self.bytes.len(),
        }
    }
    /// The message a plugin wrote (always NUL-terminated within the buffer).
    pub fn message(&self) -> String {
        let end = self
            .bytes
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.bytes.len());
        match String::from_utf8_lossy(&self.bytes[..end]) {
            m if m.is_empty() => "(the plugin gave no message)".to_owned(),
            m => m.into_owned(),
        }
    }
}

impl Default for ErrorBuffer {
    fn default() -> Self {
        Self::new()
    }
}

struct RegistrationContext<'a> {
    registry: &'a mut Registry,
    path: &'a Path,
    plugin: &'a PluginInfo,
    errors: Vec<LoadError>,
    types: Vec<String>,
}

impl RegistrationContext<'_> {
    /// Records `error` for the load result and tells the plugin about it too.
    fn refuse(&mut self, error: LoadError, status: i32, out: *const switchyard_error) -> i32 {
        // SAFETY: `out` is the error buffer the plugin passed to the registrar callback.
        unsafe { write_error(out, &error.to_string()) };
        self.errors.push(error);
        status
    }

    fn check_name(&self, kind: &'static str, name: String) -> Result<String, LoadError> {
        if name.trim().is_empty() {
            return Err(LoadError::EmptyTypeName {
                path: self.path.to_owned(),
                kind,
            });
        }
        if let Some(first) = self.registry.origin_of(&name) {
            return Err(LoadError::DuplicateType {
                path: self.path.to_owned(),
                name,
                first: first.to_string(),
            });
        }
        Ok(name)
    }

    fn origin(&self) -> Origin {
        Origin::Plugin {
            path: self.path.to_owned(),
            plugin: self.plugin.name.clone(),
        }
    }
}

/// # Safety
/// `ptr` must be NULL or a NUL-terminated string.
unsafe fn c_string(ptr: *const std::os::raw::c_char) -> String {
    if ptr.is_null() {
        String::new()
    } else {
        CStr::from_ptr(ptr).to_string_lossy().into_owned()
    }
}

fn status_of(error: &LoadError) -> i32 {
    match error {
        LoadError::DuplicateType { .. } => SWITCHYARD_STATUS_DUPLICATE,
        _ => SWITCHYARD_STATUS_INVALID_ARGUMENT,
    }
}

/// Validates and copies a component def handed over by a plugin; used by the registrar
/// and by policy builders.
///
/// # Safety
/// `def` must be NULL or point to at least its declared `struct_size` bytes.
pub unsafe fn read_component_def(
    path: &Path,
    abi_minor: u16,
    def: *const switchyard_component_def,
    needs_create: bool,
) -> Result<(String, PluginComponentDef), LoadError> {
    let invalid = |name: &str, problem: String| LoadError::InvalidDefinition {
        path: path.to_owned(),
        name: name.to_owned(),
        problem,
    };
    let Some(head) = def.as_ref() else {
        return Err(invalid("?", "the component def pointer is NULL".into()));
    };
    let required = abi_checks::min_component_def_size(abi_minor);
    if (head.struct_size as usize) < required {
        return Err(LoadError::TruncatedStruct {
            path: path.to_owned(),
            what: "switchyard_component_def",
            found: head.struct_size as usize,
            required,
            minor: abi_minor,
        });
    }
    let def = copy_sized(def, head.struct_size as usize);
    let name = c_string(def.type_name);
    let kind = ComponentKind::from_abi(def.kind).ok_or_else(|| {
        invalid(
            &name,
            format!(
                "unknown component kind {}; expected 0 (filter), 1 (scorer) or 2 (picker)",
                def.kind
            ),
        )
    })?;
    let callback_missing = match kind {
        ComponentKind::Filter => def.on_filter.is_none(),
        ComponentKind::Scorer => def.on_score.is_none(),
        ComponentKind::Picker => def.on_pick.is_none(),
    };
    if callback_missing {
        return Err(invalid(
            &name,
            format!("a {} must set `on_{}`", kind.as_str(), kind.callback()),
        ));
    }
    if needs_create && def.on_create.is_none() {
        return Err(invalid(
            &name,
            "a registered component must set `on_create`".into(),
        ));
    }
    let inputs = WorkerInputs::from_bits(def.inputs);
    Ok((name, PluginComponentDef::new(def, inputs, kind)))
}

extern "C" fn register_component(
    registrar: *const switchyard_registrar,
    def: *const switchyard_component_def,
    error: *const switchyard_error,
) -> i32 {
    // SAFETY: `registrar` is the one load_into built; host_data is its context.
    let context = unsafe { &mut *(*registrar).host_data.cast::<RegistrationContext<'_>>() };
    let minor = context.plugin.abi_minor;
    let result = unsafe { read_component_def(context.path, minor, def, true) }
        .and_then(|(name, def)| Ok((context.check_name(def.kind().as_str(), name)?, def)));
    match result {
        Ok((name, def)) => {
            let origin = context.origin();
            context
                .registry
                .add_plugin_component(name.clone(), origin, def);
            context.types.push(name);
            SWITCHYARD_STATUS_OK
        }
        Err(e) => {
            let status = status_of(&e);
            context.refuse(e, status, error)
        }
    }
}

extern "C" fn register_policy(
    registrar: *const switchyard_registrar,
    def: *const switchyard_policy_def,
    error: *const switchyard_error,
) -> i32 {
    let context = unsafe { &mut *(*registrar).host_data.cast::<RegistrationContext<'_>>() };
    let path = context.path.to_owned();
    let result = (|| {
        let head = unsafe { def.as_ref() }.ok_or_else(|| LoadError::InvalidDefinition {
            path: path.clone(),
            name: "?".into(),
            problem: "the policy def pointer is NULL".into(),
        })?;
        let required = abi_checks::min_policy_def_size(context.plugin.abi_minor);
        if (head.struct_size as usize) < required {
            return Err(LoadError::TruncatedStruct {
                path: path.clone(),
                what: "switchyard_policy_def",
                found: head.struct_size as usize,
                required,
                minor: context.plugin.abi_minor,
            });
        }
        let def = unsafe { copy_sized(def, head.struct_size as usize) };
        let name = context.check_name("policy", unsafe { c_string(def.type_name) })?;
        if def.on_validate.is_none() || def.on_build.is_none() {
            return Err(LoadError::InvalidDefinition {
                path: path.clone(),
                name,
                problem: "a policy must set `on_validate` and `on_build`".into(),
            });
        }
        Ok((name, def))
    })();
    match result {
        Ok((name, def)) => {
            let origin = context.origin();
            let minor = context.plugin.abi_minor;
            context.registry.add_plugin_policy(
                name.clone(),
                origin,
                PluginPolicyDef::new(def, minor, path),
            );
            context.types.push(name);
            SWITCHYARD_STATUS_OK
        }
        Err(e) => {
            let status = status_of(&e);
            context.refuse(e, status, error)
        }
    }
}
