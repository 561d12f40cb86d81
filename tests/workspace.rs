//! The repository's own rules, checked on its files where cargo cannot: every
//! integration test file runs, each layer crate has tests of its own, the host's layer
//! crates depend only downwards in the documented order, only the plugin boundary
//! implements `extern "C"` functions, no source file is over 800 lines, tests sleep only
//! in their pacing and polling helpers, and the measurement patches the benchmarks name
//! still apply.

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

/// The host's layer crates, bottom first. Cargo refuses a dependency cycle, but not a
/// layer that reaches past the documented order: each may depend only on crates before
/// it here (docs/ARCHITECTURE.md).
const LAYERS: [(&str, &str); 10] = [
    ("switchyard-plugin-host", "host/plugin-host"),
    ("switchyard-config", "host/config"),
    ("switchyard-policy", "host/policy"),
    ("switchyard-fleet", "host/fleet"),
    ("switchyard-engines", "host/engines"),
    ("switchyard-discovery", "host/discovery"),
    ("switchyard-serve", "host/serve"),
    ("switchyard-tools", "host/tools"),
    ("switchyard-envoy", "host/envoy-module"),
    ("switchyard", "host"),
];

/// Layer crates not yet tested beside themselves, each with why (docs/ARCHITECTURE.md,
/// "Tests"): the Envoy module is tested only through a real Envoy, tests/envoy_module.rs.
const LAYERS_TESTED_ELSEWHERE: [&str; 1] = ["switchyard-envoy"];

/// Each layer crate tests itself through its public API in its own `tests/`, which
/// `cargo test --workspace` runs; tests/ holds what needs the binary.
#[test]
fn every_layer_crate_has_its_own_tests() {
    let has_tests = |dir: &str| {
        std::fs::read_dir(repo().join(dir).join("tests")).is_ok_and(|entries| {
            entries
                .filter_map(Result::ok)
                .any(|e| e.path().extension().is_some_and(|x| x == "rs"))
        })
    };
    let untested: Vec<&str> = LAYERS
        .iter()
        .filter(|(name, dir)| *name != "switchyard" && repo().join(dir).is_dir())
        .filter(|(name, _)| !LAYERS_TESTED_ELSEWHERE.contains(name))
        .filter(|(_, dir)| !has_tests(dir))
        .map(|(_, dir)| *dir)
        .collect();
    assert!(
        untested.is_empty(),
        "layer crates without tests of their own: {untested:?}; add DIR/tests/*.rs that exercise the crate through its public API"
    );
}

/// The binary crate holds the CLI and its wiring; the tools live in their own crate, so
/// the paths a reader follows first start in the router, not in replay or engine-sim.
#[test]
fn the_binary_crate_is_thin() {
    let mut files = Vec::new();
    rust_files(&repo().join("host/src"), &mut files);
    let lines: usize = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap().lines().count())
        .sum();
    assert!(!files.is_empty(), "no source found under host/src");
    assert!(
        lines <= 1_500,
        "host/src holds {lines} lines (at most 1,500): move what is not CLI wiring into a layer or host/tools"
    );
}

/// The workspace crates a manifest's `[dependencies]` names.
fn layer_dependencies(manifest: &str) -> Vec<String> {
    let mut in_dependencies = false;
    let mut out = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_dependencies = line == "[dependencies]";
        } else if in_dependencies {
            let name = line.split(['.', ' ', '=']).next().unwrap_or("");
            if LAYERS.iter().any(|(layer, _)| *layer == name) {
                out.push(name.to_owned());
            }
        }
    }
    out
}

#[test]
fn host_layer_crates_depend_only_downwards() {
    let mut violations = Vec::new();
    for (at, (name, dir)) in LAYERS.iter().enumerate() {
        let manifest = std::fs::read_to_string(repo().join(dir).join("Cargo.toml")).unwrap();
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "{dir}/Cargo.toml is not {name}"
        );
        for used in layer_dependencies(&manifest) {
            let layer = LAYERS.iter().position(|(l, _)| *l == used).unwrap();
            if layer >= at {
                violations.push(format!("{name} depends on {used}, a layer above it"));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "layering (bottom to top: {:?}) broken:\n{}",
        LAYERS.map(|(name, _)| name),
        violations.join("\n")
    );
    let root = std::fs::read_to_string(repo().join("host/fleet/Cargo.toml")).unwrap();
    assert!(
        layer_dependencies(&root).contains(&"switchyard-policy".to_owned()),
        "the check would pass vacuously: it found no layer dependency in host/fleet"
    );
}

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
fn only_the_plugin_boundary_has_extern_c_functions() {
    let boundary = repo().join("host/plugin-host/src/plugin");
    // Envoy's dynamic-module ABI is the other boundary: its declarations and the hooks.
    let envoy_boundary =
        ["abi.rs", "hooks.rs"].map(|f| repo().join("host/envoy-module/src").join(f));
    let mut files = Vec::new();
    rust_files(&repo().join("host"), &mut files);
    let outside: Vec<_> = files
        .iter()
        .filter(|f| !f.starts_with(&boundary) && !envoy_boundary.contains(f))
        .filter(|f| code(f).contains("extern \"C\""))
        .collect();
    assert!(
        outside.is_empty(),
        "extern \"C\" outside host/plugin-host/src/plugin/ and host/envoy-module/src/{{abi,hooks}}.rs: {outside:?}"
    );
    assert!(
        files
            .iter()
            .filter(|f| f.starts_with(&boundary))
            .any(|f| code(f).contains("extern \"C\"")),
        "the check would pass vacuously: the boundary has no extern \"C\" function"
    );
}

/// A crate's module tree: each `.rs` file under `src/` by its module path (`lib.rs` and
/// `mod.rs` name their folder's module).
fn modules(src: &Path) -> Vec<(Vec<String>, PathBuf)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files
        .into_iter()
        .map(|file| {
            let relative = file.strip_prefix(src).unwrap().with_extension("");
            let mut path: Vec<String> = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                path.last().map(String::as_str),
                Some("lib" | "mod" | "main")
            ) {
                path.pop();
            }
            (path, file)
        })
        .collect()
}

/// The paths a file names with `crate::` or `super::` (each resolved to the deepest
/// module of the crate it reaches).
fn module_references(
    own: &[String],
    code: &str,
    known: &BTreeSet<Vec<String>>,
) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for (prefix, base) in [
        ("crate::", Vec::new()),
        ("super::", own[..own.len().saturating_sub(1)].to_vec()),
    ] {
        for (at, _) in code.match_indices(prefix) {
            if code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
                continue; // `super::super::`, or a path that only ends in these letters
            }
            let mut path = base.clone();
            let mut best = None;
            for part in code[at + prefix.len()..].split("::") {
                let name: String = part
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if name.is_empty() {
                    break;
                }
                path.push(name.clone());
                if known.contains(&path) {
                    best = Some(path.clone());
                }
                if name.len() != part.len() {
                    break;
                }
            }
            found.extend(best);
        }
    }
    found
}

/// No two sibling modules of a host crate import each other, directly or around a loop
/// (cargo sees only crates; `super::` and `crate::` paths between modules are checked
/// here). An edge between two files counts for the sibling modules holding them.
#[test]
fn no_module_imports_another_in_a_cycle() {
    let mut cycles = Vec::new();
    let mut edges_seen = 0;
    for (_, dir) in LAYERS {
        let src = repo().join(dir).join("src");
        let tree = modules(&src);
        let known: BTreeSet<Vec<String>> = tree.iter().map(|(p, _)| p.clone()).collect();
        let mut edges: BTreeSet<(Vec<String>, Vec<String>)> = BTreeSet::new();
        for (own, file) in &tree {
            for target in module_references(own, &code(file), &known) {
                let common = own.iter().zip(&target).take_while(|(a, b)| a == b).count();
                if common == own.len() || common == target.len() {
                    continue; // a module and its own ancestor or descendant
                }
                edges.insert((own[..=common].to_vec(), target[..=common].to_vec()));
            }
        }
        edges_seen += edges.len();
        for (from, to) in &edges {
            // A cycle through `from -> to`: a path back from `to` to `from`.
            let mut stack = vec![to.clone()];
            let mut visited = BTreeSet::new();
            while let Some(at) = stack.pop() {
                if &at == from {
                    cycles.push(format!(
                        "{dir}: {} -> {} -> ... -> {}",
                        from.join("::"),
                        to.join("::"),
                        from.join("::")
                    ));
                    break;
                }
                if visited.insert(at.clone()) {
                    stack.extend(
                        edges
                            .iter()
                            .filter(|(a, _)| *a == at)
                            .map(|(_, b)| b.clone()),
                    );
                }
            }
        }
    }
    assert!(
        edges_seen > 20,
        "the check would pass vacuously: only {edges_seen} module edges found"
    );
    assert!(
        cycles.is_empty(),
        "module import cycles:\n{}",
        cycles.join("\n")
    );
}

/// Lines a source file may have (docs/ARCHITECTURE.md, "Function size"): past that, a
/// file holds more than one concern, and gets split by them.
const MAX_FILE_LINES: usize = 800;

#[test]
fn no_source_file_is_over_800_lines() {
    let mut files = Vec::new();
    for dir in ["host", "plugin-sdk", "plugins", "tests", "fuzz"] {
        let dir = repo().join(dir);
        if dir.is_dir() {
            rust_files(&dir, &mut files);
        }
    }
    let too_long: Vec<String> = files
        .iter()
        .filter(|path| !path.components().any(|c| c.as_os_str() == "target"))
        .filter_map(|path| {
            let lines = std::fs::read_to_string(path).ok()?.lines().count();
            (lines > MAX_FILE_LINES).then(|| format!("{} ({lines} lines)", path.display()))
        })
        .collect();
    assert!(
        too_long.is_empty(),
        "over {MAX_FILE_LINES} lines, split each by its concerns: {too_long:?}"
    );
}

/// Settings are read through `Startup::config()` / `Generation::config()`, never by
/// reaching through the config source (which also carries the file it came from): one
/// way in, so a setting's readers can be found by one search.
#[test]
fn no_code_reaches_through_the_config_source() {
    let mut files = Vec::new();
    for dir in ["host", "tests"] {
        rust_files(&repo().join(dir), &mut files);
    }
    let this_file = repo().join("tests/workspace.rs");
    let reaching: Vec<String> = files
        .iter()
        .filter(|f| !f.starts_with(repo().join("host/config")) && **f != this_file)
        .filter(|f| code(f).contains("startup.source.config"))
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        files.len() > 100,
        "the search found too few files to mean anything"
    );
    assert!(
        reaching.is_empty(),
        "use startup.config() (or generation.config()) instead of startup.source.config in: {reaching:?}"
    );
}

/// Tests wait for what they can observe (`support::eventually` polls it); the load's own
/// clock (a churn's rate, a soak's length) is `support::pacing`'s. A sleep anywhere else
/// in the integration tests is a fixed wait for something that could have been observed.
#[test]
fn integration_tests_sleep_only_in_the_pacing_and_polling_helpers() {
    let mut files = Vec::new();
    rust_files(&repo().join("tests"), &mut files);
    for crate_dir in std::fs::read_dir(repo().join("host")).unwrap() {
        let tests = crate_dir.unwrap().path().join("tests");
        if tests.is_dir() {
            rust_files(&tests, &mut files);
        }
    }
    let allowed = [
        repo().join("tests/support/pacing.rs"),
        repo().join("tests/support/eventually.rs"),
        repo().join("tests/workspace.rs"),
    ];
    // A fixture is a plugin under test: its sleeps are its behaviour (a slow scorer).
    let fixtures = repo().join("tests/fixtures");
    let sleeping: Vec<String> = files
        .iter()
        .filter(|f| !allowed.contains(f) && !f.starts_with(&fixtures))
        .filter(|f| {
            let code = code(f);
            code.contains("thread::sleep") || code.contains("time::sleep")
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        files.len() > 50,
        "the search found too few files to mean anything"
    );
    assert!(
        sleeping.is_empty(),
        "wait with support::eventually (or pace load with support::pacing) instead of sleeping in: {sleeping:?}"
    );
}

/// The measurement patches docs/BENCHMARKS.md tells readers to `git apply` still apply to
/// the tree, so its figures stay reproducible after the code they patch moves on.
#[test]
fn the_documented_measurement_patches_still_apply() {
    let profiles = repo().join("docs/profiles");
    let mut patches: Vec<PathBuf> = std::fs::read_dir(&profiles)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "patch"))
        .collect();
    patches.sort();
    assert!(!patches.is_empty(), "no patches in {}", profiles.display());
    let benchmarks = std::fs::read_to_string(repo().join("docs/BENCHMARKS.md")).unwrap();
    for patch in patches {
        let name = patch.strip_prefix(repo()).unwrap().display().to_string();
        assert!(
            benchmarks.contains(&name),
            "{name} is not named in docs/BENCHMARKS.md: say what it measures there, or remove it"
        );
        // `--check` reads the working tree and writes nothing; git works outside a
        // checkout too (a source tarball).
        let checked = std::process::Command::new("git")
            .args(["apply", "--check"])
            .arg(&patch)
            .current_dir(repo())
            .output()
            .expect("git runs");
        assert!(
            checked.status.success(),
            "{name} no longer applies to the tree: make the same change by hand, then `git diff > {name}` (and revert)\n{}",
            String::from_utf8_lossy(&checked.stderr)
        );
    }
}
