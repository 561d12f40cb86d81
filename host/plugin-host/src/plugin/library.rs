//! The loader: checksum, ELF check and manifest on the file's bytes, dlopen (RTLD_NOW |
//! RTLD_LOCAL) of that same open file, entry symbol, ABI checks, registration, and the
//! manifest compared with what registration did. Libraries stay loaded for the life of
//! the process.

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use sha2::{Digest, Sha256};
use switchyard_plugin_sdk::abi::*;

use super::abi_checks::{check_descriptor, PluginInfo, RevisionRule};
use super::elf_check;
use super::load_error::LoadError;
use super::manifest::{self, Manifest};
use super::registrar::{register, Registered, TakenBy};

/// A plugin to load, as the config names it.
#[derive(Clone, Debug)]
pub struct PluginSpec {
    /// Resolved (absolute, or relative to the working directory) path.
    pub path: PathBuf,
    pub sha256: Option<String>,
    pub revision: RevisionRule,
}

/// A library that passed every check.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct LoadedPlugin {
    pub path: PathBuf,
    #[serde(flatten)]
    pub info: PluginInfo,
    /// Of the file as it was loaded.
    pub sha256: String,
    pub types: Vec<String>,
    /// The static manifest; `None` for a library without one (a hand-written descriptor).
    /// Not sent back by an isolated child (it was checked there).
    #[serde(skip_deserializing)]
    pub manifest: Option<Manifest>,
    /// The isolated process it runs in (`isolation: process`); None: in the router's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolated_in: Option<String>,
}

/// What can be learned of a plugin file without loading it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PluginFile {
    pub path: PathBuf,
    pub sha256: String,
    pub manifest: Option<Manifest>,
    /// Why this router would refuse the library, judged from its manifest (`None`: it
    /// would take it, or there is no manifest to judge by).
    pub refused: Option<String>,
}

/// A library that passed every check, with the types it registered.
pub struct LoadedLibrary {
    pub plugin: LoadedPlugin,
    pub registered: Registered,
}

/// A library file: its canonical path and its identity on disk (device, inode). A new
/// version renamed over the old one has the same path and another inode.
type FileKey = (PathBuf, u64, u64);

/// Every library opened by this process, by file. Never unloaded: instances, defs and
/// strings of a plugin may live until exit (and a reload's old generation may still be
/// finishing requests).
fn libraries() -> &'static Mutex<HashMap<FileKey, &'static libloading::Library>> {
    static LIBRARIES: OnceLock<Mutex<HashMap<FileKey, &'static libloading::Library>>> =
        OnceLock::new();
    LIBRARIES.get_or_init(Default::default)
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn not_found(path: &Path) -> impl FnOnce(std::io::Error) -> LoadError + '_ {
    move |source| LoadError::FileNotFound {
        path: path.to_owned(),
        source,
    }
}

/// The canonical path of a plugin file, which identifies a library once loaded.
pub fn canonical(path: &Path) -> Result<PathBuf, LoadError> {
    std::fs::canonicalize(path).map_err(not_found(path))
}

/// Opens the library. A pinned library is opened through `file`, the open descriptor
/// whose bytes were hashed and checked, so a file replaced in between cannot slip past the
/// pin; the descriptor then stays open for the life of the process, because the dynamic
/// loader knows the library by that `/proc/self/fd/N` name and a reused number would name
/// another library. So is a new version of a library already loaded from the same path (a
/// reload after the file was renamed over): the dynamic loader would hand back the old one
/// for the old name. Otherwise the library is opened by its path, so that debuggers, which
/// find libraries by that name, see the real file.
fn open(
    path: &Path,
    file: std::fs::File,
    pinned: bool,
) -> Result<&'static libloading::Library, LoadError> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let canonical = canonical(path)?;
    let identity = file.metadata().map_err(not_found(path))?;
    let key = (canonical.clone(), identity.dev(), identity.ino());
    let mut libraries = libraries().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(library) = libraries.get(&key) {
        return Ok(library);
    }
    let replaced = libraries.keys().any(|(loaded, ..)| *loaded == canonical);
    let by_descriptor = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    // Without /proc (unusual on Linux), the path: the checks then cover the file as it
    // was a moment ago.
    let target = if (pinned || replaced) && by_descriptor.exists() {
        std::mem::forget(file);
        by_descriptor.clone()
    } else {
        canonical.clone()
    };
    // Eager binding makes an unresolved symbol fail here, by name, not at first call;
    // local symbols keep two plugins' internals apart.
    let flags = libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL;
    // SAFETY: running the library's initializers is what loading a plugin means.
    let library =
        unsafe { libloading::os::unix::Library::open(Some(&target), flags) }.map_err(|e| {
            let reason = e.to_string().replace(
                &*by_descriptor.to_string_lossy(),
                &canonical.to_string_lossy(),
            );
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
    libraries.insert(key, library);
    Ok(library)
}

fn entry(path: &Path, library: &libloading::Library) -> Result<switchyard_entry_fn, LoadError> {
    // SAFETY: the symbol's type is fixed by the ABI's name for it.
    let symbol = unsafe { library.get::<switchyard_entry_fn>(SWITCHYARD_ENTRY_SYMBOL.as_bytes()) };
    if let Ok(symbol) = symbol {
        return Ok(*symbol);
    }
    let other_major = (0..=32u16)
        .filter(|&m| m != SWITCHYARD_ABI_MAJOR)
        .find(|major| {
            let name = format!("switchyard_plugin_entry_v{major}");
            // SAFETY: only the symbol's presence is asked; it is never used.
            unsafe { library.get::<*const c_void>(name.as_bytes()) }.is_ok()
        });
    Err(LoadError::MissingEntry {
        path: path.to_owned(),
        other_major,
    })
}

/// Checks `bytes` (the plugin file at `spec.path`) against its `sha256:` pin, if it has
/// one; returns their sha256.
fn check_pin(spec: &PluginSpec, bytes: &[u8]) -> Result<String, LoadError> {
    let path = spec.path.as_path();
    if let Some(value) = &spec.sha256 {
        let value = value.trim();
        if value.len() != 64 || !value.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(LoadError::InvalidPin {
                path: path.to_owned(),
                value: value.to_owned(),
            });
        }
    }
    let found = sha256_hex(bytes);
    if let Some(expected) = &spec.sha256 {
        if !found.eq_ignore_ascii_case(expected.trim()) {
            return Err(LoadError::ChecksumMismatch {
                path: path.to_owned(),
                expected: expected.clone(),
                found,
            });
        }
    }
    Ok(found)
}

/// Checks the plugin file against its `sha256:` pin, if it has one.
pub fn verify_pin(spec: &PluginSpec) -> Result<String, LoadError> {
    let (_, bytes) = read_file(&spec.path)?;
    check_pin(spec, &bytes)
}

/// The largest plugin file read (the biggest shared libraries shipped, with debug
/// info, are a few hundred MB).
pub const MAX_PLUGIN_FILE_BYTES: u64 = 1 << 30;

/// Opens the plugin file and checks, before reading a byte, that it is a regular file of
/// a size a library can have: a character device (`/dev/zero`) or a `/proc` file would
/// be read without end, and opening a FIFO would wait for a writer (it is opened
/// non-blocking). Returns the open file and its size.
pub fn open_file(path: &Path) -> Result<(std::fs::File, u64), LoadError> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(not_found(path))?;
    let meta = file.metadata().map_err(not_found(path))?;
    let kind = meta.file_type();
    let found = if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_dir() {
        "a directory"
    } else if meta.len() == 0 {
        "an empty file (or one that reports no size, as /proc files do)"
    } else if meta.len() > MAX_PLUGIN_FILE_BYTES {
        return Err(LoadError::FileTooLarge {
            path: path.to_owned(),
            bytes: meta.len(),
            limit: MAX_PLUGIN_FILE_BYTES,
        });
    } else {
        return Ok((file, meta.len()));
    };
    Err(LoadError::NotARegularFile {
        path: path.to_owned(),
        found,
    })
}

/// Opens the plugin file and reads it whole, no more than the size it had when opened:
/// what the checks see and what is loaded are the same open file.
fn read_file(path: &Path) -> Result<(std::fs::File, Vec<u8>), LoadError> {
    use std::io::Read;
    let (file, size) = open_file(path)?;
    let mut bytes = Vec::with_capacity(size as usize);
    (&file)
        .take(size)
        .read_to_end(&mut bytes)
        .map_err(not_found(path))?;
    Ok((file, bytes))
}

/// What can be learned of a plugin file without loading it or running any of its code:
/// its ELF structure is checked, its sha256 computed and its manifest read.
pub fn examine(path: &Path) -> Result<PluginFile, LoadError> {
    let (_, bytes) = read_file(path)?;
    elf_check::check(path, &bytes)?;
    let manifest = manifest::read(path, &bytes)?;
    let refused = manifest.as_ref().and_then(|m| {
        super::abi_checks::refusal_of_declared(m.abi_major, m.abi_minor, &m.layout_fingerprint)
    });
    Ok(PluginFile {
        path: path.to_owned(),
        sha256: sha256_hex(&bytes),
        manifest,
        refused,
    })
}

/// Verifies the checksum pin, the file's ELF structure and its manifest, opens the
/// library, runs every check and its registration, and compares registration with the
/// manifest. `taken_by` says which already-registered type a name belongs to, if any.
pub fn load(spec: &PluginSpec, taken_by: TakenBy<'_>) -> Result<LoadedLibrary, LoadError> {
    let path = spec.path.as_path();
    let (file, bytes) = read_file(path)?;
    let sha256 = check_pin(spec, &bytes)?;
    elf_check::check(path, &bytes)?;
    let manifest = manifest::read(path, &bytes)?;
    drop(bytes);
    let library = open(path, file, spec.sha256.is_some())?;
    let entry = entry(path, library)?;
    // SAFETY: the entry symbol takes nothing and returns a pointer the checks validate.
    let info = unsafe { check_descriptor(path, entry(), spec.revision)? };
    let on_register = info
        .on_register
        .ok_or_else(|| LoadError::InvalidDescriptor {
            path: path.to_owned(),
            field: "on_register",
            problem: "is NULL",
        })?;
    // SAFETY: `on_register` is the checked descriptor's callback of this library.
    let registered = unsafe { register(path, &info, on_register, taken_by)? };
    if let Some(manifest) = &manifest {
        manifest::compare(path, manifest, &info, &registered)?;
    }
    Ok(LoadedLibrary {
        plugin: LoadedPlugin {
            path: path.to_owned(),
            info,
            sha256,
            types: registered.names.clone(),
            manifest,
            isolated_in: None,
        },
        registered,
    })
}
