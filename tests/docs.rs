//! The walk-throughs in the docs actually work: the README's first Rust plugin, and the C
//! and C++ guides (built out of tree against the installed CMake package), are extracted
//! from the Markdown, built, and loaded by `switchyard check` and `switchyard select`.

mod support;

use std::path::Path;
use std::process::Command;

use support::*;

fn check_and_select(dir: &Path, workers: &[&str]) -> String {
    let summary = run(Command::new(switchyard_bin()).current_dir(dir).args([
        "check",
        "--config",
        "switchyard.yaml",
    ]));
    assert!(summary.contains("ok: 1 plugin(s)"), "{summary}");
    let mut select = Command::new(switchyard_bin());
    select
        .current_dir(dir)
        .args(["select", "--config", "switchyard.yaml"]);
    for w in workers {
        select.args(["--worker", w]);
    }
    run(&mut select)
}

#[test]
fn readme_first_rust_plugin() {
    // The README's commands as a user pastes them: the shell blocks run in bash, with
    // only /tmp/my-policy moved into a temporary folder and the release binary replaced
    // by this build's. The second block runs as in a fresh terminal: SWITCHYARD_REPO
    // given, nothing else carried over.
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let section = readme
        .split("## Write your first Rust plugin")
        .nth(1)
        .expect("the section exists");
    let dir = tempfile::tempdir().unwrap();
    let krate = dir.path().join("my-policy");
    let shell = blocks(section, "sh");
    let localize = |script: &str| {
        script
            .replace("/tmp/my-policy", &krate.display().to_string())
            .replace(
                "\"$SWITCHYARD_REPO/target/release/switchyard\"",
                &format!("\"{}\"", switchyard_bin().display()),
            )
    };
    let bash = |script: String| {
        let output = Command::new("bash")
            .args(["-c", &script])
            .current_dir(repo())
            .env("SWITCHYARD_REPO", repo())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{script}\nfailed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    bash(localize(&shell[0]));
    std::fs::write(krate.join("src/lib.rs"), &blocks(section, "rust")[0]).unwrap();
    let chosen = bash(localize(&shell[1]));
    let promised = shell[1]
        .lines()
        .find_map(|l| l.strip_prefix("# "))
        .expect("the README says what select prints");
    assert!(chosen.contains("ok: 1 plugin(s)"), "{chosen}");
    assert!(
        chosen.trim_end().ends_with(promised),
        "the README promises `{promised}`, select printed `{chosen}`"
    );

    // A failed first step stops the chain: nothing is appended to another Cargo.toml.
    let occupied = localize(&shell[0]);
    let before = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let output = Command::new("bash")
        .args(["-c", &occupied])
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(
        !output.status.success(),
        "cargo new into an existing folder must fail"
    );
    assert_eq!(
        std::fs::read_to_string(repo().join("Cargo.toml")).unwrap(),
        before
    );
}

/// Installs the CMake package once per test into `prefix`.
fn install(prefix: &Path) {
    run(Command::new("cmake")
        .arg("--install")
        .arg(repo().join("target/cmake"))
        .arg("--prefix")
        .arg(prefix));
}

fn guide(doc: &str, source_lang: &str, source_name: &str, workers: &[&str], expected: &str) {
    let markdown = std::fs::read_to_string(repo().join("docs").join(doc)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("prefix");
    install(&prefix);
    let project = dir.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(
        project.join(source_name),
        &blocks(&markdown, source_lang)[0],
    )
    .unwrap();
    std::fs::write(
        project.join("CMakeLists.txt"),
        &blocks(&markdown, "cmake")[0],
    )
    .unwrap();
    std::fs::write(
        project.join("switchyard.yaml"),
        &blocks(&markdown, "yaml")[0],
    )
    .unwrap();
    run(Command::new("cmake")
        .arg("-S")
        .arg(&project)
        .arg("-B")
        .arg(project.join("build"))
        .args(["-G", "Ninja"])
        .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display())));
    run(Command::new("cmake")
        .arg("--build")
        .arg(project.join("build")));
    assert_eq!(check_and_select(&project, workers).trim(), expected);
}

#[test]
fn c_guide() {
    guide(
        "writing-plugins-c.md",
        "c",
        "idle_first.c",
        &["1:0:4", "2:0:1"],
        "worker 2 dp_rank 0",
    );
}

#[test]
fn cpp_guide() {
    guide(
        "writing-plugins-cpp.md",
        "cpp",
        "queue_depth.cpp",
        &["1:0:4", "2:0:1"],
        "worker 1 dp_rank 0",
    );
}
