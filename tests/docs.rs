//! The walk-throughs in the docs actually work: the README's first Rust plugin, and the C
//! and C++ guides (built out of tree against the installed CMake package), are extracted
//! from the Markdown, built, and loaded by `switchyard check` and `switchyard select`.

mod support;

use std::path::Path;
use std::process::Command;

use support::*;

/// The fenced blocks of `lang` in a Markdown file, in order.
fn blocks(markdown: &str, lang: &str) -> Vec<String> {
    let fence = format!("```{lang}\n");
    markdown
        .split(&fence)
        .skip(1)
        .map(|rest| rest.split("```").next().unwrap_or_default().to_owned())
        .collect()
}

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
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let section = readme
        .split("## Write your first Rust plugin")
        .nth(1)
        .expect("the section exists");
    let dir = tempfile::tempdir().unwrap();
    let krate = dir.path().join("my-policy");
    std::fs::create_dir_all(krate.join("src")).unwrap();
    // What `cargo new --lib` and the README's `cat >> Cargo.toml` produce.
    std::fs::write(
        krate.join("Cargo.toml"),
        format!(
            "[package]\nname = \"my-policy\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\nswitchyard-plugin-sdk = {{ path = \"{}\" }}\n\n[lib]\ncrate-type = [\"cdylib\"]\n\n[workspace]\n",
            repo().join("plugin-sdk").display()
        ),
    )
    .unwrap();
    std::fs::copy(repo().join("Cargo.lock"), krate.join("Cargo.lock")).unwrap();
    std::fs::write(krate.join("src/lib.rs"), &blocks(section, "rust")[0]).unwrap();
    let built = build_plugin_crate(&krate);

    let shell = blocks(section, "sh").join("\n");
    let config = shell
        .split("cat > switchyard.yaml <<EOF\n")
        .nth(1)
        .and_then(|c| c.split("\nEOF").next())
        .expect("the config heredoc");
    let config = config.replace(
        "target/release/libmy_policy.so",
        &built.join("libmy_policy.so").display().to_string(),
    );
    std::fs::write(dir.path().join("switchyard.yaml"), config).unwrap();
    let chosen = check_and_select(dir.path(), &["1:0:5", "2:0:1"]);
    assert!(
        shell.contains(&format!("# {}", chosen.trim())),
        "the README promises another answer than `{chosen}`"
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
