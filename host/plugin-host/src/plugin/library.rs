//! The loader: the file read once through the file gate, checksum, ELF check and manifest
//! on those bytes, dlopen (RTLD_NOW | RTLD_LOCAL) of a sealed private copy of the same
//! bytes (`image.rs`), entry symbol, ABI checks, registration, and the manifest compared
//! with what registration did. Libraries stay loaded for the life of the process.

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use sha2::{Digest, Sha256};
use switchyard_plugin_sdk::abi::*;

use super::abi_checks::{check_descriptor, PluginInfo, RevisionRule};
use super::elf_check;
use super::image::PluginImage;
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

/// A library: its file's canonical path and the sha256 of the bytes mapped. The same
/// bytes loaded again from the same file (a reload of an unchanged file) are the same
/// library; a new version, renamed over or written in place, is another.
type LibraryKey = (PathBuf, String);

/// Every library opened by this process, with the sealed image it was mapped from. Never
/// unloaded: instances, defs and strings of a plugin may live until exit (and a reload's
/// old generation may still be finishing requests). The image's memfd stays open as long:
/// the dynamic loader knows the library by its `/proc/self/fd/N` name, and a reused
/// number would name another library.
type Libraries = HashMap<LibraryKey, (&'static libloading::Library, Arc<PluginImage>)>;

fn libraries() -> &'static Mutex<Libraries> {
    static LIBRARIES: OnceLock<Mutex<Libraries>> = OnceLock::new();
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

/// The dynamic loader's refusal of the library at `path`, which it was asked to open as
/// `opened`: the message names `path`, never the memfd's name.
fn refusal(path: &Path, opened: &Path, error: &libloading::Error) -> LoadError {
    let reason = error
        .to_string()
        .replace(&*opened.to_string_lossy(), &path.to_string_lossy());
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
}

/// Opens the library from its sealed image (`sha256`: of the image's bytes), or hands
/// back the one already loaded from the same bytes of the same file. What is mapped is
/// the copy that was checked: the file itself may be overwritten in place meanwhile, and
/// nothing the router runs changes until a reload reads it again. (Debuggers and
/// profilers see the library as `/memfd:switchyard-plugin:FILE`; `plugin inspect` and
/// the logs name the file.)
fn open(
    path: &Path,
    image: &Arc<PluginImage>,
    sha256: &str,
) -> Result<&'static libloading::Library, LoadError> {
    // A child restarted after the file was removed still loads the image it was passed.
    let canonical = canonical(path).unwrap_or_else(|_| path.to_owned());
    let key = (canonical, sha256.to_owned());
    let mut libraries = libraries().lock().unwrap_or_else(|e| e.into_inner());
    if let Some((library, _)) = libraries.get(&key) {
        return Ok(library);
    }
    let target = image.proc_path();
    if !target.exists() {
        return Err(LoadError::Unsealable {
            path: path.to_owned(),
            what: format!("open its sealed copy as {}", target.display()),
            error: std::io::Error::from(std::io::ErrorKind::NotFound),
        });
    }
    // Eager binding makes an unresolved symbol fail here, by name, not at first call;
    // local symbols keep two plugins' internals apart.
    let flags = libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL;
    // SAFETY: running the library's initializers is what loading a plugin means.
    let library = unsafe { libloading::os::unix::Library::open(Some(&target), flags) }
        .map_err(|e| refusal(path, &target, &e))?;
    let library: &'static libloading::Library = Box::leak(Box::new(library.into()));
    libraries.insert(key, (library, image.clone()));
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
    let found = sha256_hex(bytes);
    check_pin_of(spec, &found)?;
    Ok(found)
}

/// Checks the sha256 `found` of the plugin's bytes against its `sha256:` pin, if any.
fn check_pin_of(spec: &PluginSpec, found: &str) -> Result<(), LoadError> {
    let path = spec.path.as_path();
    let Some(expected) = &spec.sha256 else {
        return Ok(());
    };
    let value = expected.trim();
    if value.len() != 64 || !value.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(LoadError::InvalidPin {
            path: path.to_owned(),
            value: value.to_owned(),
        });
    }
    if !found.eq_ignore_ascii_case(value) {
        return Err(LoadError::ChecksumMismatch {
            path: path.to_owned(),
            expected: expected.clone(),
            found: found.to_owned(),
        });
    }
    Ok(())
}

/// Checks `bytes` against the pin of `spec`, if it has one: for a plugin listed twice,
/// whose bytes were loaded for its first entry.
pub fn verify_pin(spec: &PluginSpec, bytes_sha256: &str) -> Result<(), LoadError> {
    check_pin_of(spec, bytes_sha256).map(drop)
}

/// What can be learned of a plugin file without loading it or running any of its code:
/// its ELF structure is checked, its sha256 computed and its manifest read.
pub fn examine(path: &Path) -> Result<PluginFile, LoadError> {
    let image = PluginImage::read(path)?;
    let bytes = image.map()?;
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
    load_from(spec, None, taken_by)
}

/// `load`, from `image` when given: the bytes of `spec.path` read once before (a
/// startup reads each file once, so that its probe, its isolated children and its
/// in-process load all check and map the same bytes).
pub fn load_from(
    spec: &PluginSpec,
    image: Option<&Arc<PluginImage>>,
    taken_by: TakenBy<'_>,
) -> Result<LoadedLibrary, LoadError> {
    let path = spec.path.as_path();
    let image = match image {
        Some(image) => image.clone(),
        None => PluginImage::read(path)?,
    };
    let bytes = image.map()?;
    let sha256 = check_pin(spec, &bytes)?;
    elf_check::check(path, &bytes)?;
    let manifest = manifest::read(path, &bytes)?;
    drop(bytes);
    let library = open(path, &image, &sha256)?;
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
