//! The static manifest (format: `switchyard_plugin_sdk::manifest`), read from the file's
//! bytes without loading it, and compared with what the library's descriptor and
//! registration say once it is loaded: a library that says one thing in its manifest and
//! does another is refused.

use std::path::Path;

use object::{Object, ObjectSection};
use serde::Serialize;
use switchyard_plugin_sdk::manifest::{MANIFEST_HEADER, SECTION, TYPE_HEADER};
use switchyard_plugin_sdk::WorkerInputs;

use super::abi_checks::PluginInfo;
use super::load_error::LoadError;
use super::registrar::Registered;

/// What a library says of itself at compile time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Manifest {
    pub abi_major: u16,
    pub abi_minor: u16,
    /// As the descriptor's is shown: `0x` and 16 hex digits.
    pub layout_fingerprint: String,
    pub sdk_revision: String,
    pub name: String,
    pub version: String,
    pub vendor: String,
    /// Empty when the library declares none (then only its identity is compared).
    pub types: Vec<DeclaredType>,
}

/// A type the manifest says the library registers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeclaredType {
    /// `filter`, `scorer`, `picker` or `policy`.
    pub kind: String,
    pub name: String,
    /// Input group names; empty for none (and for policy types).
    pub inputs: Vec<&'static str>,
}

/// Reads the manifest from the plugin file's bytes, if it has one. `data` must have
/// passed `elf_check::check`.
pub fn read(path: &Path, data: &[u8]) -> Result<Option<Manifest>, LoadError> {
    let invalid = |problem: String| LoadError::InvalidManifest {
        path: path.to_owned(),
        problem,
    };
    let file = object::File::parse(data).map_err(|e| invalid(format!("unreadable ELF: {e}")))?;
    let Some(section) = file.section_by_name(SECTION) else {
        return Ok(None);
    };
    let bytes = section
        .data()
        .map_err(|e| invalid(format!("section {SECTION} is unreadable: {e}")))?;
    parse(bytes).map(Some).map_err(|e| invalid(e.to_string()))
}

/// What is malformed in a manifest section.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("a record is not UTF-8 text")]
    NotUtf8,
    #[error("the `{header}` record has no `{key}` line")]
    MissingLine { header: String, key: String },
    #[error("it has two `{MANIFEST_HEADER}` records: the export macro was used twice")]
    TwoManifests,
    #[error("`abi {0}` is not MAJOR.MINOR")]
    Abi(String),
    #[error("`fingerprint {0}` is not a number")]
    Fingerprint(String),
    #[error("type kind `{0}`: expected filter, scorer, picker, admitter or policy")]
    Kind(String),
    #[error("inputs `{text}`: `{token}` is not an input group")]
    Inputs { text: String, token: String },
    #[error("inputs `{0}` has bits no input group of this ABI defines")]
    UnknownBits(String),
    #[error("section {SECTION} has no `{MANIFEST_HEADER}` record")]
    NoManifest,
}

/// Parses the section's bytes; the error says what is malformed.
pub fn parse(bytes: &[u8]) -> Result<Manifest, ManifestError> {
    let mut manifest: Option<Manifest> = None;
    let mut types = Vec::new();
    // The linker may pad between records with NULs: empty records are skipped.
    for record in bytes.split(|&b| b == 0).filter(|r| !r.is_empty()) {
        let text = std::str::from_utf8(record).map_err(|_| ManifestError::NotUtf8)?;
        let mut lines = text.lines();
        let header = lines.next().unwrap_or_default();
        let fields: Vec<(&str, &str)> = lines
            .map(|line| line.split_once(' ').unwrap_or((line, "")))
            .collect();
        let field = |key: &str| -> Result<&str, ManifestError> {
            fields
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| *v)
                .ok_or_else(|| ManifestError::MissingLine {
                    header: header.to_owned(),
                    key: key.to_owned(),
                })
        };
        if header == MANIFEST_HEADER {
            if manifest.is_some() {
                return Err(ManifestError::TwoManifests);
            }
            let (major, minor) = field("abi")?
                .split_once('.')
                .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
                .ok_or_else(|| ManifestError::Abi(field("abi").unwrap_or("").to_owned()))?;
            let fingerprint = field("fingerprint")?;
            let fingerprint: u64 = fingerprint
                .trim_end_matches(['u', 'U', 'l', 'L'])
                .parse()
                .map_err(|_| ManifestError::Fingerprint(fingerprint.to_owned()))?;
            manifest = Some(Manifest {
                abi_major: major,
                abi_minor: minor,
                layout_fingerprint: format!("{fingerprint:#018x}"),
                sdk_revision: field("sdk")?.to_owned(),
                name: field("name")?.to_owned(),
                version: field("version")?.to_owned(),
                vendor: field("vendor")?.to_owned(),
                types: Vec::new(),
            });
        } else if header == TYPE_HEADER {
            let kind = field("kind")?;
            if !matches!(kind, "filter" | "scorer" | "picker" | "admitter" | "policy") {
                return Err(ManifestError::Kind(kind.to_owned()));
            }
            let inputs = parse_inputs(field("inputs")?)?;
            types.push(DeclaredType {
                kind: kind.to_owned(),
                name: field("name")?.to_owned(),
                inputs: inputs.names(),
            });
        }
        // Records of a later format are someone else's to read.
    }
    let mut manifest = manifest.ok_or(ManifestError::NoManifest)?;
    manifest.types = types;
    Ok(manifest)
}

/// An input-group mask as the C preprocessor stringifies it: integers and group names
/// (`SWITCHYARD_INPUT_LOAD` expands to `2`; C++ writes `inputs::load`) joined by `|`.
fn parse_inputs(text: &str) -> Result<WorkerInputs, ManifestError> {
    let mut bits = 0u32;
    for token in text.split('|') {
        let token = token.trim().trim_matches(['(', ')', ' ']);
        let name = token.rsplit("::").next().unwrap_or(token);
        let value =
            match name
                .to_ascii_lowercase()
                .trim_start_matches("switchyard_input_")
            {
                "none" => 0,
                "cache" => WorkerInputs::CACHE.bits(),
                "load" => WorkerInputs::LOAD.bits(),
                "routing" => WorkerInputs::ROUTING.bits(),
                "labels" => WorkerInputs::LABELS.bits(),
                "attributes" => WorkerInputs::ATTRIBUTES.bits(),
                "engine" => WorkerInputs::ENGINE.bits(),
                other => other.trim_end_matches(['u', 'l']).parse().map_err(|_| {
                    ManifestError::Inputs {
                        text: text.to_owned(),
                        token: token.to_owned(),
                    }
                })?,
            };
        bits |= value;
    }
    let inputs = WorkerInputs::from_bits(bits);
    if inputs.bits() != bits {
        return Err(ManifestError::UnknownBits(text.to_owned()));
    }
    Ok(inputs)
}

/// Compares the manifest with the checked descriptor and what registration registered.
pub fn compare(
    path: &Path,
    manifest: &Manifest,
    info: &PluginInfo,
    registered: &Registered,
) -> Result<(), LoadError> {
    let mismatch = |what: &str, manifest: String, library: String| LoadError::ManifestMismatch {
        path: path.to_owned(),
        what: what.to_owned(),
        manifest,
        library,
    };
    let pairs = [
        (
            "ABI version",
            format!("{}.{}", manifest.abi_major, manifest.abi_minor),
            format!("{}.{}", info.abi_major, info.abi_minor),
        ),
        (
            "layout fingerprint",
            manifest.layout_fingerprint.clone(),
            info.layout_fingerprint.clone(),
        ),
        (
            "SDK revision",
            manifest.sdk_revision.clone(),
            info.sdk_revision.clone(),
        ),
        ("name", manifest.name.clone(), info.name.clone()),
        ("version", manifest.version.clone(), info.version.clone()),
        ("vendor", manifest.vendor.clone(), info.vendor.clone()),
    ];
    for (what, declared, found) in pairs {
        if declared != found {
            return Err(mismatch(what, declared, found));
        }
    }
    if manifest.types.is_empty() {
        return Ok(());
    }
    let mut declared: Vec<String> = manifest.types.iter().map(describe_declared).collect();
    let mut found: Vec<String> = registered
        .components
        .iter()
        .map(|(name, def)| describe(def.kind().as_str(), name, &def.inputs().names()))
        .chain(
            registered
                .policies
                .iter()
                .map(|(name, _)| describe("policy", name, &[])),
        )
        .collect();
    declared.sort();
    found.sort();
    if declared != found {
        let missing: Vec<&String> = declared.iter().filter(|d| !found.contains(d)).collect();
        let extra: Vec<&String> = found.iter().filter(|f| !declared.contains(f)).collect();
        return Err(mismatch(
            "registered types",
            format!("declares but does not register: {}", list(&missing)),
            format!("registers but does not declare: {}", list(&extra)),
        ));
    }
    Ok(())
}

fn list(items: &[&String]) -> String {
    if items.is_empty() {
        "nothing".to_owned()
    } else {
        items
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn describe(kind: &str, name: &str, inputs: &[&str]) -> String {
    if kind == "policy" {
        format!("policy `{name}`")
    } else if inputs.is_empty() {
        format!("{kind} `{name}` (reads -)")
    } else {
        format!("{kind} `{name}` (reads {})", inputs.join("|"))
    }
}

fn describe_declared(t: &DeclaredType) -> String {
    describe(&t.kind, &t.name, &t.inputs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_c_and_cpp_input_spellings() {
        assert_eq!(
            parse_inputs("1 | 2").unwrap(),
            WorkerInputs::CACHE | WorkerInputs::LOAD
        );
        assert_eq!(parse_inputs("inputs::load").unwrap(), WorkerInputs::LOAD);
        assert_eq!(
            parse_inputs("switchyard::inputs::cache | inputs::routing").unwrap(),
            WorkerInputs::CACHE | WorkerInputs::ROUTING
        );
        assert_eq!(parse_inputs("(0)").unwrap(), WorkerInputs::NONE);
        assert_eq!(
            parse_inputs("inputs::labels | 2").unwrap(),
            WorkerInputs::LABELS | WorkerInputs::LOAD
        );
        assert_eq!(
            parse_inputs("inputs::attributes | SWITCHYARD_INPUT_ENGINE").unwrap(),
            WorkerInputs::ATTRIBUTES | WorkerInputs::ENGINE
        );
        assert!(matches!(
            parse_inputs("64"),
            Err(ManifestError::UnknownBits(text)) if text == "64"
        ));
        assert!(matches!(
            parse_inputs("inputs::gpu"),
            Err(ManifestError::Inputs { token, .. }) if token == "inputs::gpu"
        ));
    }

    #[test]
    fn refuses_records_without_the_library_record() {
        let err = parse(b"switchyard-type 1\nkind scorer\nname x\ninputs 0\n\0").unwrap_err();
        assert!(matches!(err, ManifestError::NoManifest), "{err}");
        let text = err.to_string();
        assert!(text.contains("no `switchyard-manifest 1` record"), "{text}");
        let err = parse(b"switchyard-type 1\nkind gadget\nname x\ninputs 0\n\0").unwrap_err();
        assert!(
            matches!(&err, ManifestError::Kind(kind) if kind == "gadget"),
            "{err}"
        );
    }
}
