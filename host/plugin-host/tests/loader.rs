//! The plugin host's loader on its own, through its public API: the C fixture
//! `tests/fixtures/broken_plugin.c`, compiled here with `cc` (valid, or broken by a
//! define), loaded or refused with a typed error before any of its code runs where it
//! can be.

use std::path::{Path, PathBuf};
use std::process::Command;

use switchyard_plugin_host::plugin::library::examine;
use switchyard_plugin_host::plugin::{load, LoadError, PluginSpec, RevisionRule};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The fixture compiled with `defines` into `dir/name.so`.
fn fixture(dir: &Path, name: &str, defines: &[&str]) -> PathBuf {
    let out = dir.join(format!("{name}.so"));
    let status = Command::new("cc")
        .args(["-std=c11", "-shared", "-fPIC", "-Wall", "-Werror"])
        .args(["-Wno-unused-function", "-Wno-missing-field-initializers"])
        .arg("-I")
        .arg(repo().join("include"))
        .args(defines.iter().map(|d| format!("-D{d}")))
        .arg(repo().join("tests/fixtures/broken_plugin.c"))
        .arg("-o")
        .arg(&out)
        .status()
        .expect("cc runs");
    assert!(status.success(), "compiling the fixture with {defines:?}");
    out
}

fn spec(path: &Path, sha256: Option<&str>) -> PluginSpec {
    PluginSpec {
        path: path.to_owned(),
        sha256: sha256.map(str::to_owned),
        revision: RevisionRule::Compatible,
    }
}

#[test]
fn a_valid_library_loads_and_registers_its_types() {
    let dir = tempfile::tempdir().unwrap();
    let path = fixture(dir.path(), "valid", &[]);
    let loaded = load(&spec(&path, None), &|_| None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(loaded.plugin.info.name, "broken-fixture");
    assert!(
        loaded.plugin.types.iter().any(|t| t == "fixture.keep-all"),
        "{:?}",
        loaded.plugin.types
    );
    // Pinned to what it is, it loads again.
    let pinned = spec(&path, Some(&loaded.plugin.sha256));
    load(&pinned, &|_| None).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_pin_the_file_does_not_match_is_refused_before_loading() {
    let dir = tempfile::tempdir().unwrap();
    let path = fixture(dir.path(), "pinned", &[]);
    let wrong = "0".repeat(64);
    match load(&spec(&path, Some(&wrong)), &|_| None) {
        Err(LoadError::ChecksumMismatch {
            expected, found, ..
        }) => {
            assert_eq!(expected, wrong);
            assert_eq!(found, examine(&path).unwrap().sha256);
        }
        Err(other) => panic!("expected a checksum mismatch, got {other}"),
        Ok(_) => panic!("a wrong pin loaded"),
    }
}

#[test]
fn another_abi_major_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let path = fixture(dir.path(), "major", &["DESC_MAJOR=2"]);
    match load(&spec(&path, None), &|_| None) {
        Err(LoadError::AbiMajorMismatch {
            found, expected, ..
        }) => assert_eq!((found, expected), (2, 1)),
        Err(other) => panic!("expected an ABI major mismatch, got {other}"),
        Ok(_) => panic!("a plugin of ABI 2.x loaded"),
    }
}

#[test]
fn a_file_that_is_no_library_is_refused_without_loading() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("text.so");
    std::fs::write(&path, "this is not an ELF file\n").unwrap();
    match examine(&path) {
        Err(error @ LoadError::NotLoadable { .. }) => {
            assert!(
                error.to_string().contains(&path.display().to_string()),
                "{error}"
            );
        }
        Err(other) => panic!("expected NotLoadable, got {other}"),
        Ok(_) => panic!("a text file passed as a library"),
    }
}
