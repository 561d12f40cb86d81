//! The repository's own rules, checked on its files: every integration test file runs,
//! the host's layers import only downwards, and only the plugin boundary implements
//! `extern "C"` functions.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_test_file_has_a_test_stanza() {
    let manifest = std::fs::read_to_string(repo().join("host/Cargo.toml")).unwrap();
    let declared: BTreeSet<String> = manifest
        .lines()
        .filter_map(|line| line.trim().strip_prefix("path = \"../tests/"))
        .filter_map(|rest| rest.strip_suffix('"'))
        .map(str::to_owned)
        .collect();
    let present: BTreeSet<String> = std::fs::read_dir(repo().join("tests"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".rs"))
        .collect();
    let missing: Vec<_> = present.difference(&declared).collect();
    assert!(
        missing.is_empty(),
        "tests/{missing:?} would never run: add a [[test]] stanza for each to host/Cargo.toml"
    );
    let stale: Vec<_> = declared.difference(&present).collect();
    assert!(
        stale.is_empty(),
        "host/Cargo.toml declares missing tests {stale:?}"
    );
}

/// The host's top-level modules, bottom layer first: each may use only itself and the
/// ones before it.
const LAYERS: [&str; 8] = [
    "plugin",
    "config",
    "isolation",
    "policy",
    "startup",
    "fleet",
    "serve",
    "tools",
];

/// The code of a file without comment lines.
fn code(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn host_layers_import_only_downwards() {
    let src = repo().join("host/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        let own = relative
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        let Some(own_layer) = LAYERS.iter().position(|l| *l == own) else {
            continue; // lib.rs and main.rs sit above every layer
        };
        let text = code(file);
        for (at, _) in text.match_indices("crate::") {
            let used: String = text[at + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            match LAYERS.iter().position(|l| *l == used) {
                Some(layer) if layer > own_layer => violations.push(format!(
                    "{} ({own}) uses crate::{used}, a layer above it",
                    relative.display()
                )),
                _ => {}
            }
        }
    }
    assert!(
        violations.is_empty(),
        "layering (bottom to top: {LAYERS:?}) broken:\n{}",
        violations.join("\n")
    );
}

#[test]
fn only_the_plugin_boundary_has_extern_c_functions() {
    let src = repo().join("host/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let outside: Vec<_> = files
        .iter()
        .filter(|f| !f.starts_with(src.join("plugin")))
        .filter(|f| code(f).contains("extern \"C\""))
        .collect();
    assert!(
        outside.is_empty(),
        "extern \"C\" outside host/src/plugin/: {outside:?}"
    );
    assert!(
        files
            .iter()
            .filter(|f| f.starts_with(src.join("plugin")))
            .any(|f| code(f).contains("extern \"C\"")),
        "the check would pass vacuously: the boundary has no extern \"C\" function"
    );
}
