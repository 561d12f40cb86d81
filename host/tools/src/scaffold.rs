//! `switchyard plugin new NAME --lang rust|c|cpp`: a plugin project that builds out of the
//! box. Its source is the shipped `least-busy` example of that language (a filter, a
//! scorer, a picker and a policy type composing them) with every type renamed into the
//! project's own namespace (`NAME.`), so the scaffold is always code this repository
//! builds and tests; beside it a build file (Cargo with the SDK, or CMake with
//! `find_package(Switchyard)`), a config using both the policy type and the components
//! composed, and `test.sh`, which builds the plugin and runs `switchyard check`,
//! `switchyard plugin test` and `switchyard select` on it.

use std::path::{Path, PathBuf};

/// The example sources the scaffolds are made from.
const RUST_EXAMPLE: &str = include_str!("../../../plugins/rust/least-busy/src/lib.rs");
const C_EXAMPLE: &str = include_str!("../../../plugins/c/least-busy/least_busy.c");
const CPP_EXAMPLE: &str = include_str!("../../../plugins/cpp/least-busy/least_busy.cpp");

/// Where the Rust SDK of the checkout this binary was built from is.
const BUILT_SDK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../plugin-sdk");

const VENDOR: &str = "TODO: your company";

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Rust,
    C,
    Cpp,
}

/// What `plugin new` takes.
#[derive(clap::Args, Debug)]
pub struct NewArgs {
    /// The plugin's name: lowercase letters, digits and `-`, starting with a letter. Its
    /// types are named `NAME.least-busy`, `NAME.active-requests`, ...
    pub name: String,
    #[arg(long, value_enum)]
    pub lang: Lang,
    /// The folder to create (default: ./NAME). It must not exist, or be empty.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Rust only: the switchyard-plugin-sdk crate's folder (default: the one this
    /// switchyard was built from).
    #[arg(long)]
    pub sdk: Option<PathBuf>,
}

fn valid_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-')
}

/// Renames the example's types and library into `name`'s.
fn renamed(source: &str, prefix: &str, library: &str, name: &str) -> String {
    source
        .replace(&format!("\"{prefix}."), &format!("\"{name}."))
        .replace(&format!("`{prefix}."), &format!("`{name}."))
        .replace(&format!("\"{library}\""), &format!("\"{name}\""))
        .replace("Acme Corp (switchyard example)", VENDOR)
}

/// How a C or C++ scaffold builds: configure and build as two commands, so that under
/// `set -e` a failed configure (switchyard's CMake package not found) stops there with its
/// own message. `SWITCHYARD_PREFIX` names where switchyard is installed.
const CMAKE_BUILD: &str = "cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${SWITCHYARD_PREFIX:+-DCMAKE_PREFIX_PATH=\"$SWITCHYARD_PREFIX\"} \\\n    || { echo \"cmake could not configure the plugin: is switchyard installed? Set SWITCHYARD_PREFIX to its install prefix (cmake --install of its build)\" >&2; exit 1; }\ncmake --build build";

/// The files of a scaffold: (relative path, contents).
fn files(args: &NewArgs, sdk: Option<&Path>) -> Vec<(String, String)> {
    let name = args.name.as_str();
    let ident = name.replace('-', "_");
    let (source_file, source, build, library) = match args.lang {
        Lang::Rust => {
            // The Rust example names its policy type without a prefix.
            let source = renamed(RUST_EXAMPLE, "acme", "acme-least-busy", name)
                .replace(
                    "policy(\"least-busy\"",
                    &format!("policy(\"{name}.least-busy\""),
                )
                .replace("type `least-busy`", &format!("type `{name}.least-busy`"));
            (
                "src/lib.rs".to_owned(),
                source,
                "cargo build --release".to_owned(),
                format!("target/release/lib{ident}.so"),
            )
        }
        Lang::C => (
            format!("{ident}.c"),
            renamed(C_EXAMPLE, "c", "acme-least-busy-c", name),
            CMAKE_BUILD.to_owned(),
            format!("build/lib{ident}.so"),
        ),
        Lang::Cpp => (
            format!("{ident}.cpp"),
            renamed(CPP_EXAMPLE, "cpp", "acme-least-busy-cpp", name),
            CMAKE_BUILD.to_owned(),
            format!("build/lib{ident}.so"),
        ),
    };
    let mut out = vec![(source_file.clone(), source)];
    match (args.lang, sdk) {
        (Lang::Rust, Some(sdk)) => out.push((
            "Cargo.toml".into(),
            format!(
                "[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[lib]\nname = \"{ident}\"\ncrate-type = [\"cdylib\"]\n\n\
                 [dependencies]\nswitchyard-plugin-sdk = {{ path = \"{}\" }}\nserde = {{ version = \"1\", features = [\"derive\"] }}\n\n\
                 # A project of its own, even inside another workspace.\n[workspace]\n",
                sdk.display()
            ),
        )),
        (lang, _) => {
            let language = if lang == Lang::C { "C" } else { "CXX" };
            out.push((
                "CMakeLists.txt".into(),
                format!(
                    "# Builds against an installed switchyard (cmake --install of its build, or a\n\
                     # package): configure with -DCMAKE_PREFIX_PATH=<its prefix> if it is not found.\n\
                     cmake_minimum_required(VERSION 3.16)\nproject({ident} LANGUAGES {language})\n\n\
                     find_package(Switchyard {version} CONFIG REQUIRED)\n\n\
                     switchyard_add_plugin({ident} SOURCES {source_file})\n",
                    version = sdk_major_minor()
                ),
            ));
        }
    }
    out.extend(common_files(args, &build, &library));
    out
}

/// The files every language's scaffold has: its config, test script and README.
fn common_files(args: &NewArgs, build: &str, library: &str) -> Vec<(String, String)> {
    let name = args.name.as_str();
    let mut out = Vec::new();
    out.push((
        "switchyard.yaml".into(),
        format!(
            "# The plugin, as a policy type and as components composed. Build it first:\n#   {commented}\n\
             # then: switchyard check --config switchyard.yaml\n\
             plugins:\n  - path: {library}\nworker_selection:\n  default: {name}\n  instances:\n\
             \x20   - name: {name}\n      type: {name}.least-busy\n\
             \x20   - name: {name}-composed\n      filters: [{{type: {name}.min-device-overlap}}]\n      scorers: [{{type: {name}.active-requests}}]\n      picker: {{type: {name}.lowest-cost}}\n\
             workers:\n  - {{model: demo, worker_id: 1}}\n  - {{model: demo, worker_id: 2}}\n",
            commented = build.replace('\n', "\n#   ")
        ),
    ));
    out.push((
        "test.sh".into(),
        format!(
            "#!/bin/sh\n# Builds the plugin and checks it with switchyard: put this in the plugin's CI.\n\
             # SWITCHYARD names the switchyard binary (default: the one on PATH).\n\
             set -eu\ncd \"$(dirname \"$0\")\"\nSWITCHYARD=${{SWITCHYARD:-switchyard}}\n{build}\n\
             \"$SWITCHYARD\" check --config switchyard.yaml\n\
             # The conformance run: every type on generated fleets (exit 1 on any finding).\n\
             \"$SWITCHYARD\" plugin test {library}\n\
             # The example policy's own decisions: worker 1 is busy (2 active requests), worker 2\n\
             # idle, so both instances pick worker 2. Change these with your policy (a fleet\n\
             # with labels: --fleet FILE, see `switchyard select --help`).\n\
             for instance in {name} {name}-composed; do\n\
             \x20   picked=$(\"$SWITCHYARD\" select --config switchyard.yaml --instance \"$instance\" --worker 1:0:2 --worker 2:0:0)\n\
             \x20   [ \"$picked\" = \"worker 2 dp_rank 0\" ] || {{ echo \"$instance picked $picked, where the example policy picks worker 2: update this check in test.sh to your policy's decisions\" >&2; exit 1; }}\n\
             done\necho \"ok: {name} builds, loads and picks\"\n"
        ),
    ));
    out.push((
        "README.md".into(),
        format!(
            "# {name}\n\nA switchyard policy plugin ({lang:?}), made by `switchyard plugin new`. It registers\n\
             `{name}.least-busy` (a policy type) and its components `{name}.min-device-overlap`,\n\
             `{name}.active-requests` and `{name}.lowest-cost`: keep workers with enough cached\n\
             blocks, prefer the least busy. Change them into your own.\n\n\
             ```sh\n{build}\nswitchyard check --config switchyard.yaml\n./test.sh   # build, check, the conformance run, two decisions\n```\n\n\
             Set the vendor in the source (`{VENDOR}`). The ABI and the guides: switchyard's\n\
             `docs/ABI.md` and `docs/writing-plugins-*.md`.\n",
            lang = args.lang
        ),
    ));
    out
}

/// `MAJOR.MINOR` of this switchyard, the CMake package version a scaffold asks for.
fn sdk_major_minor() -> String {
    let version = switchyard_plugin_sdk::abi::SWITCHYARD_SDK_REVISION;
    version.splitn(3, '.').take(2).collect::<Vec<_>>().join(".")
}

/// Why `switchyard plugin new` wrote nothing (or stopped writing).
#[derive(Debug, thiserror::Error)]
pub enum ScaffoldError {
    #[error("`{0}` is not a plugin name: use lowercase letters, digits and `-`, starting with a letter (e.g. acme-scorer)")]
    Name(String),
    #[error("{} exists and is not empty; choose another --dir", .0.display())]
    NotEmpty(PathBuf),
    #[error("the Rust plugin SDK is not at {} (this switchyard was built elsewhere): pass --sdk PATH to the plugin-sdk folder of a switchyard checkout", .0.display())]
    NoSdk(PathBuf),
    #[error("{}: cannot create it: {source}", path.display())]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: cannot write it: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Writes the scaffold; returns its folder.
pub fn new_plugin(args: &NewArgs) -> Result<PathBuf, ScaffoldError> {
    if !valid_name(&args.name) {
        return Err(ScaffoldError::Name(args.name.clone()));
    }
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(&args.name));
    if std::fs::read_dir(&dir).is_ok_and(|mut entries| entries.next().is_some()) {
        return Err(ScaffoldError::NotEmpty(dir));
    }
    let sdk = match args.lang {
        Lang::Rust => {
            let sdk = args.sdk.clone().unwrap_or_else(|| PathBuf::from(BUILT_SDK));
            let found = std::fs::canonicalize(&sdk)
                .ok()
                .filter(|s| s.join("Cargo.toml").exists());
            let sdk = found.ok_or(ScaffoldError::NoSdk(sdk))?;
            Some(sdk)
        }
        Lang::C | Lang::Cpp => None,
    };
    for (path, contents) in files(args, sdk.as_deref()) {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| ScaffoldError::Create {
                path: parent.to_owned(),
                source,
            })?;
        }
        std::fs::write(&path, contents).map_err(|source| ScaffoldError::Write {
            path: path.clone(),
            source,
        })?;
        #[cfg(unix)]
        if path.extension().is_some_and(|e| e == "sh") {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755));
        }
    }
    Ok(dir)
}
