//! `switchyard plugin new`: from an empty folder, each language's scaffold builds (Cargo
//! with the SDK; CMake against the installed package), loads, passes `check` and picks,
//! through the project's own `test.sh`, as a plugin author's CI would run it.

mod support;

use std::process::Command;

use support::*;

fn scaffold(dir: &std::path::Path, name: &str, lang: &str) -> std::process::Output {
    Command::new(switchyard_bin())
        .args(["plugin", "new", name, "--lang", lang, "--dir"])
        .arg(dir)
        .output()
        .unwrap()
}

#[test]
fn each_language_scaffold_builds_loads_and_picks() {
    let dir = tempfile::tempdir().unwrap();
    // The C and C++ scaffolds find switchyard as an installed CMake package.
    let prefix = dir.path().join("prefix");
    run(Command::new("cmake")
        .arg("--install")
        .arg(repo().join("target/cmake"))
        .arg("--prefix")
        .arg(&prefix));
    for lang in ["c", "cpp", "rust"] {
        let name = format!("acme-{lang}");
        let project = dir.path().join(&name);
        let made = scaffold(&project, &name, lang);
        assert!(
            made.status.success(),
            "{}",
            String::from_utf8_lossy(&made.stderr)
        );
        let output = Command::new(project.join("test.sh"))
            .env("SWITCHYARD", switchyard_bin())
            .env("CMAKE_PREFIX_PATH", &prefix)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{lang}: test.sh failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            stdout.contains(&format!("ok: {name} builds, loads and picks")),
            "{stdout}"
        );
        // Every type is in the project's namespace, in the registration and the manifest.
        for kind_and_type in [
            format!("policy  {name}.least-busy"),
            format!("filter  {name}.min-device-overlap  reads: CACHE"),
            format!("scorer  {name}.active-requests"),
            format!("picker  {name}.lowest-cost"),
        ] {
            assert!(
                stdout.contains(&kind_and_type),
                "{lang}: {kind_and_type} missing:\n{stdout}"
            );
        }
        let library = std::fs::read_to_string(project.join("switchyard.yaml"))
            .unwrap()
            .lines()
            .find_map(|l| l.trim().strip_prefix("- path: ").map(str::to_owned))
            .unwrap();
        let inspected = run(Command::new(switchyard_bin())
            .args(["plugin", "inspect"])
            .arg(project.join(library)));
        assert!(
            inspected.contains(&format!("{name}.least-busy")),
            "{inspected}"
        );
        assert!(
            !inspected.contains("acme-least-busy") && !inspected.contains("Acme Corp"),
            "{inspected}"
        );
    }
}

#[test]
fn bad_names_and_occupied_folders_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["Acme", "9lives", "acme_scorer", "acme-"] {
        let output = scaffold(&dir.path().join("x"), name, "c");
        assert_eq!(output.status.code(), Some(1), "{name}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("is not a plugin name"), "{stderr}");
    }
    std::fs::write(dir.path().join("keep.txt"), "mine").unwrap();
    let output = scaffold(dir.path(), "acme", "c");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("exists and is not empty; choose another --dir"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("keep.txt")).unwrap(),
        "mine"
    );
}
