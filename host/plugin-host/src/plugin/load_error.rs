//! `LoadError`: one variant per load-time check. Every message names the file, what was
//! expected, what was found and what to do.

use std::path::PathBuf;

use switchyard_plugin_sdk::abi::{
    SWITCHYARD_ABI_MAJOR, SWITCHYARD_ENTRY_SYMBOL, SWITCHYARD_SDK_REVISION,
};
use switchyard_plugin_sdk::Status;

/// One failed load-time check. Every message names the file, what was expected, what was
/// found and what to do.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// What an isolated child process reported of a library it was asked to load (the
    /// loader's own message there, or how the plugin killed the child).
    #[error("{message}")]
    InChild { path: PathBuf, message: String },
    #[error("{}: plugin file not found ({source}). Check the `path:` in the config; relative paths are resolved against the config file's folder", path.display())]
    FileNotFound {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: not a plugin library: it is {found}; expected a regular file (a .so). Point `path:` at the built library", path.display())]
    NotARegularFile { path: PathBuf, found: &'static str },
    #[error("{}: the file has {bytes} bytes, more than the {limit} a plugin library may have. Point `path:` at the built library (strip its debug info if it really is one)", path.display())]
    FileTooLarge {
        path: PathBuf,
        bytes: u64,
        limit: u64,
    },
    #[error("{}: the plugin file {error}. Point `path:` at the built library", path.display())]
    Unreadable {
        path: PathBuf,
        error: crate::file_gate::FileRefused,
    },
    /// The private, sealed copy the library is loaded from could not be made or read.
    #[error("{}: cannot {what} ({error}); the router loads a plugin from a sealed private copy of the bytes it checked (memfd_create, Linux 3.17 or later, with /proc mounted)", path.display())]
    Unsealable {
        path: PathBuf,
        what: String,
        error: std::io::Error,
    },
    #[error("{}: sha256 mismatch: the config expects {expected}, the file has {found}. The file changed since it was pinned: verify where it came from, then update `sha256:` in the config", path.display())]
    ChecksumMismatch {
        path: PathBuf,
        expected: String,
        found: String,
    },
    #[error("{}: `sha256: {value}` is not a sha256: expected 64 hexadecimal digits, found {} characters{}. Pin the file with the output of `sha256sum {}`", path.display(), value.chars().count(), if value.chars().all(|c| c.is_ascii_hexdigit()) { "" } else { ", not all hexadecimal" }, path.display())]
    InvalidPin { path: PathBuf, value: String },
    #[error("{}: not a loadable shared library: {reason}. Point `path:` at a .so built for this platform (a cdylib, or a C/C++ MODULE library)", path.display())]
    NotLoadable { path: PathBuf, reason: String },
    #[error("{}: unresolved symbol `{symbol}`: the library needs a symbol that neither it nor its dependencies define. Link the library that provides `{symbol}` into the plugin, or remove the reference ({reason})", path.display())]
    UnresolvedSymbol {
        path: PathBuf,
        symbol: String,
        reason: String,
    },
    #[error("{}: missing entry symbol `{}`{}", path.display(), SWITCHYARD_ENTRY_SYMBOL, match other_major {
        Some(major) => format!(": the library exports `switchyard_plugin_entry_v{major}`, so it was built for ABI {major}.x; this router speaks ABI {SWITCHYARD_ABI_MAJOR}.x. Rebuild the plugin against switchyard SDK {SWITCHYARD_SDK_REVISION} (ABI {SWITCHYARD_ABI_MAJOR}.x: C and C++ include its include/switchyard/plugin.h, Rust depends on the switchyard-plugin-sdk crate)"),
        None => ". This is not a switchyard plugin, or it was built without the export macro (SWITCHYARD_PLUGIN in C/C++, export_plugin! in Rust) or with hidden visibility on it".to_owned(),
    })]
    MissingEntry {
        path: PathBuf,
        other_major: Option<u16>,
    },
    #[error("{}: its manifest (section .switchyard_manifest) is malformed: {problem}. Rebuild the plugin with the SDK's export macro (SWITCHYARD_PLUGIN in C/C++, export_plugin! in Rust) and do not edit the section", path.display())]
    InvalidManifest { path: PathBuf, problem: String },
    #[error("{}: the library's manifest and what it does differ in its {what}: the manifest says {manifest}, the library {library}. The manifest is written at compile time (export_plugin!'s `types:`, SWITCHYARD_DECLARE_* in C/C++): make it match what the register function registers, or remove the declarations", path.display())]
    ManifestMismatch {
        path: PathBuf,
        what: String,
        manifest: String,
        library: String,
    },
    #[error("{}: the entry symbol returned a NULL descriptor; it must return a pointer to a static switchyard_plugin_descriptor (use the SDK's export macro)", path.display())]
    NullDescriptor { path: PathBuf },
    #[error("{}: ABI major mismatch: the router speaks ABI {expected}.x, the plugin declares ABI {found}.x. Rebuild the plugin against switchyard SDK {} (ABI {expected}.x: C and C++ include its include/switchyard/plugin.h, Rust depends on the switchyard-plugin-sdk crate)", path.display(), SWITCHYARD_SDK_REVISION)]
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
    #[error("{}: layout fingerprint mismatch for ABI 1.{minor}: expected {expected:#018x}, found {found:#018x}. The plugin was compiled against a stale or hand-edited plugin.h; rebuild it against the header of switchyard SDK {} (include/switchyard/plugin.h; Rust: the switchyard-plugin-sdk crate)", path.display(), SWITCHYARD_SDK_REVISION)]
    LayoutMismatch {
        path: PathBuf,
        found: u64,
        expected: u64,
        minor: u16,
    },
    #[error("{}: SDK revision mismatch: `revision: exact` requires {expected}, the plugin was built with {found}. Rebuild the plugin against switchyard SDK {expected} (include/switchyard/plugin.h, or the Rust crate switchyard-plugin-sdk), or set `revision: compatible`", path.display())]
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
    #[error("{}: registration failed ({status}): {message}. Fix the plugin's register function", path.display())]
    RegistrationFailed {
        path: PathBuf,
        status: Status,
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
