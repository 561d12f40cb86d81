//! C and C++ specifics: exceptions contained and poisoning, C++ parameter errors, the
//! session-affinity scorer's state, and an out-of-tree project built against the
//! installed CMake package and loaded by the router.

mod support;

use std::process::Command;

use support::*;
use switchyard::plugin::{PromptBlocks, RouteRequest, SessionInfo};
use switchyard::policy::{BuildError, Refusal};
use switchyard::policy::{CandidatesFrom, RowExtras};
use switchyard::startup::StartupError;
use switchyard_plugin_sdk::Status;

const FLEET: [W; 3] = [
    W {
        id: 1,
        device: 0,
        active: 2,
    },
    W {
        id: 2,
        device: 3,
        active: 1,
    },
    W {
        id: 3,
        device: 5,
        active: 4,
    },
];

fn cpp_config(instances: &str) -> String {
    format!(
        "plugins:\n  - path: {}\n  - path: {}\nworker_selection:\n  instances:\n{instances}",
        cmake_plugin("least_busy_cpp").display(),
        cmake_plugin("session_affinity_cpp").display()
    )
}

#[test]
fn a_throwing_cpp_component_is_contained_and_poisoned() {
    let dir = tempfile::tempdir().unwrap();
    let config = cpp_config("    - name: t\n      scorers: [{type: cpp.throwing-scorer, parameters: {throw_after: 1}}]\n      picker: {type: cpp.lowest-cost}\n");
    let startup = start_yaml(dir.path(), &config).unwrap();
    let mut throwing = selector(&startup, "t");
    assert_eq!(
        select(&mut throwing, 4, &FLEET).unwrap(),
        1,
        "all costs equal: lowest id"
    );
    assert_eq!(
        component_failure(select(&mut throwing, 4, &FLEET).unwrap_err()),
        (
            "cpp.throwing-scorer".to_owned(),
            Status::Panic,
            "threw: scorer state corrupted (deliberate test exception)".to_owned()
        )
    );
    let (_, status, _) = component_failure(select(&mut throwing, 4, &FLEET).unwrap_err());
    assert_eq!(status, Status::Poisoned);
    assert!(
        select(&mut selector(&startup, "default"), 4, &FLEET).is_ok(),
        "the router keeps answering"
    );
}

#[test]
fn cpp_parameter_errors_reach_the_operator() {
    let dir = tempfile::tempdir().unwrap();
    let config = cpp_config("    - name: lb\n      type: cpp.least-busy\n      parameters: {min_device_overlap_blocks: 1, colour: red}\n");
    let errors = start_typed(dir.path(), &config).err().expect("refused");
    match errors[..] {
        [StartupError::InvalidParameters {
            ref instance,
            ref origin,
            error:
                BuildError::Validate {
                    refusal: Refusal::Plugin(ref call),
                    ..
                },
            ..
        }] => {
            assert_eq!(instance, "lb");
            assert!(
                origin.contains("libleast_busy_cpp.so"),
                "names the library: {origin}"
            );
            assert_eq!(call.status, Status::InvalidParameters);
            assert!(
                call.message.contains(
                    "unknown parameter `colour`; expected one of: min_device_overlap_blocks"
                ),
                "{}",
                call.message
            );
        }
        ref other => panic!("expected the plugin's parameter refusal, got {other:?}"),
    }
    let error = start_error(dir.path(), &config);
    assert!(
        error.contains("(status 2)"),
        "the operator sees the status: {error}"
    );
    let error = start_error(dir.path(), &cpp_config("    - name: lb\n      type: cpp.least-busy\n      parameters: {min_device_overlap_blocks: many}\n"));
    assert!(
        error.contains("parameter `min_device_overlap_blocks` must be a number"),
        "{error}"
    );
}

#[test]
fn session_affinity_sticks_and_forgets() {
    let dir = tempfile::tempdir().unwrap();
    let startup = start_yaml(dir.path(), &cpp_config("    - name: sticky\n      type: cpp.session-affinity\n      parameters: {affinity_weight: 3}\n")).unwrap();
    let mut sticky = selector(&startup, "sticky");
    let request = |id: &str, last: bool| RouteRequest {
        session: Some(SessionInfo {
            session_id: id.into(),
            session_final: last.then_some(true),
            ..Default::default()
        }),
        ..RouteRequest::default()
    };
    let pick = |s: &mut switchyard::policy::Selector, r: &RouteRequest, fleet: &[W]| {
        s.select(
            r,
            PromptBlocks::new(16, 4),
            CandidatesFrom::Rows(&rows(fleet), &RowExtras::default()),
            None,
        )
        .unwrap()
        .worker_id
    };
    // First turn: least busy (worker 2, 1 active).
    assert_eq!(pick(&mut sticky, &request("s1", false), &FLEET), 2);
    // Worker 2 is now busier than worker 1 by 2 < affinity weight 3: the session stays.
    let busier = [
        W {
            id: 1,
            device: 0,
            active: 1,
        },
        W {
            id: 2,
            device: 0,
            active: 3,
        },
        W {
            id: 3,
            device: 0,
            active: 5,
        },
    ];
    assert_eq!(pick(&mut sticky, &request("s1", false), &busier), 2);
    // Another session has no affinity and goes to the least busy.
    assert_eq!(pick(&mut sticky, &request("s2", false), &busier), 1);
    // The final turn routes without preference and forgets the session.
    assert_eq!(pick(&mut sticky, &request("s1", true), &busier), 1);
    let even = [
        W {
            id: 1,
            device: 0,
            active: 2,
        },
        W {
            id: 2,
            device: 0,
            active: 1,
        },
    ];
    assert_eq!(
        pick(&mut sticky, &request("s1", false), &even),
        2,
        "no stale affinity to worker 1"
    );
}

#[test]
fn out_of_tree_project_builds_against_the_installed_package_and_loads() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("prefix");
    let build = dir.path().join("build");
    // The in-tree CMake build dir is configured by `make test`; install it to a prefix.
    run(Command::new("cmake")
        .arg("--install")
        .arg(repo().join("target/cmake"))
        .arg("--prefix")
        .arg(&prefix));
    assert!(prefix.join("include/switchyard/plugin.hpp").exists());
    assert!(
        prefix.join("lib/pkgconfig/switchyard-plugin.pc").exists()
            || prefix.join("lib64/pkgconfig/switchyard-plugin.pc").exists()
    );
    run(Command::new("cmake")
        .arg("-S")
        .arg(repo().join("tests/out-of-tree"))
        .arg("-B")
        .arg(&build)
        .arg("-G")
        .arg("Ninja")
        .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display())));
    run(Command::new("cmake").arg("--build").arg(&build));
    // No build type was given: the package builds Release (CMake's empty build type
    // compiles without optimization).
    let cache = std::fs::read_to_string(build.join("CMakeCache.txt")).unwrap();
    assert!(
        cache.contains("CMAKE_BUILD_TYPE:STRING=Release"),
        "the out-of-tree project did not default to Release"
    );
    let config = write_config(
        dir.path(),
        "plugins:\n  - path: build/libqueue_depth.so\n  - path: build/libidle_only.so\nworker_selection:\n  default: oot\n  instances:\n    - name: oot\n      filters: [{type: oot.idle-only}]\n      scorers: [{type: oot.queue-depth, parameters: {decode_weight: 2}}]\n      picker: {type: builtin.lowest-cost}\n",
    );
    let output = Command::new(switchyard_bin())
        .arg("check")
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "check failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("oot-queue-depth 1.0.0"), "{stdout}");
    assert!(
        stdout.contains("scorer  oot.queue-depth  reads: LOAD"),
        "{stdout}"
    );
    assert!(
        stdout.contains("filter  oot.idle-only  reads: LOAD"),
        "{stdout}"
    );
    let output = Command::new(switchyard_bin())
        .args(["select", "--config"])
        .arg(&config)
        .args([
            "--worker", "1:0:2", "--worker", "2:0:0", "--worker", "3:0:1",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "worker 2 dp_rank 0\n",
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn pkg_config_points_into_the_prefix_it_was_installed_to() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("elsewhere");
    run(Command::new("cmake")
        .arg("--install")
        .arg(repo().join("target/cmake"))
        .arg("--prefix")
        .arg(&prefix));
    let pc_dir = ["lib/pkgconfig", "lib64/pkgconfig"]
        .iter()
        .map(|d| prefix.join(d))
        .find(|d| d.join("switchyard-plugin.pc").exists())
        .expect("the .pc file is installed");
    let cflags = run(Command::new("pkg-config")
        .args(["--cflags", "switchyard-plugin"])
        .env("PKG_CONFIG_PATH", &pc_dir));
    let include = cflags.trim().strip_prefix("-I").expect("-I flag");
    assert_eq!(
        std::fs::canonicalize(include).unwrap(),
        std::fs::canonicalize(prefix.join("include")).unwrap(),
        "pkg-config --cflags: {cflags}"
    );
    // A C plugin compiled with exactly those flags loads.
    let library = dir.path().join("libidle_only.so");
    run(Command::new("cc")
        .args(["-std=c11", "-shared", "-fPIC", "-Wall", "-Werror"])
        .args(cflags.split_whitespace())
        .arg(repo().join("tests/out-of-tree/idle_only.c"))
        .arg("-o")
        .arg(&library));
    let inspected = run(Command::new(switchyard_bin())
        .args(["plugin", "inspect"])
        .arg(&library));
    assert!(inspected.contains("oot.idle-only"), "{inspected}");
}

#[test]
fn a_component_needing_groups_its_registration_left_out_is_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("undeclared.cpp");
    std::fs::write(
        &source,
        r#"#include <switchyard/plugin.hpp>
using namespace switchyard;
namespace {
class Busy final : public Scorer {
public:
    Busy(const Params &, const Partition &) {}
    uint32_t required_inputs() const override { return inputs::load | inputs::cache; }
    double score(const Request &, const Candidate &c) override { return c.active_requests(); }
};
void register_types(Registrar &registrar) { registrar.scorer<Busy>("oops.busy", inputs::cache); }
}  // namespace
SWITCHYARD_CPP_PLUGIN("oops", "0.1.0", "switchyard tests", register_types)
"#,
    )
    .unwrap();
    let library = dir.path().join("liboops.so");
    run(Command::new("c++")
        .args(["-std=c++17", "-shared", "-fPIC", "-Wall", "-Werror", "-I"])
        .arg(repo().join("include"))
        .arg(&source)
        .arg("-o")
        .arg(&library));
    let error = start_error(
        dir.path(),
        &format!(
            "plugins:\n  - path: {}\nworker_selection:\n  instances:\n    - name: o\n      scorers: [{{type: oops.busy}}]\n      picker: {{type: builtin.lowest-cost}}\n",
            library.display()
        ),
    );
    assert!(
        error.contains("asks for cache, load but its type was registered with cache: register it with cache, load"),
        "{error}"
    );
}
