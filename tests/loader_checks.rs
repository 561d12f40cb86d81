//! Every load-time check, each against a real library built for that case, through the
//! real loader. Each error must name the file and the cause.

mod support;

use std::path::PathBuf;

use support::*;
use switchyard::plugin::LoadError;
use switchyard::startup::StartupError;
use switchyard_plugin_sdk::Status;

fn plugin_config(path: &std::path::Path, extra: &str) -> String {
    format!("plugins:\n  - path: {}\n{extra}", path.display())
}

/// Loads `lib` from a config and returns the one error, checking it names the file.
fn load_error(dir: &std::path::Path, lib: &std::path::Path, extra: &str) -> String {
    let error = start_error(dir, &plugin_config(lib, extra));
    assert!(
        error.contains(&lib.display().to_string()),
        "error does not name the file {}: {error}",
        lib.display()
    );
    assert!(
        error.contains("config.yaml:2"),
        "error does not name the config line: {error}"
    );
    error
}

#[test]
fn valid_fixture_loads() {
    let dir = tempfile::tempdir().unwrap();
    let lib = broken_plugin(dir.path(), "valid", &[]);
    let startup =
        start_yaml(dir.path(), &plugin_config(&lib, "")).expect("the valid fixture loads");
    assert_eq!(startup.registry.plugins()[0].info.name, "broken-fixture");
    assert!(startup.registry.component("fixture.keep-all").is_some());
}

#[test]
fn missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let error = load_error(dir.path(), &dir.path().join("nope.so"), "");
    assert!(error.contains("plugin file not found"), "{error}");
}

#[test]
fn not_a_loadable_library() {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("text.so");
    std::fs::write(&lib, "this is not an ELF file\n").unwrap();
    let error = load_error(dir.path(), &lib, "");
    assert!(error.contains("not a loadable shared library"), "{error}");
}

#[test]
fn unresolved_symbol_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let lib = broken_plugin(dir.path(), "unresolved", &["UNRESOLVED"]);
    let error = load_error(dir.path(), &lib, "");
    assert!(
        error.contains("unresolved symbol `switchyard_fixture_symbol_nobody_defines`"),
        "{error}"
    );
}

#[test]
fn missing_entry_symbol() {
    let dir = tempfile::tempdir().unwrap();
    let lib = broken_plugin(dir.path(), "no_entry", &["NO_ENTRY"]);
    let error = load_error(dir.path(), &lib, "");
    assert!(
        error.contains("missing entry symbol `switchyard_plugin_entry_v1`"),
        "{error}"
    );
    assert!(error.contains("not a switchyard plugin"), "{error}");
}

#[test]
fn entry_symbol_of_another_major_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let lib = broken_plugin(
        dir.path(),
        "entry_v2",
        &["ENTRY_NAME=switchyard_plugin_entry_v2"],
    );
    let error = load_error(dir.path(), &lib, "");
    assert!(
        error.contains("exports `switchyard_plugin_entry_v2`, so it was built for ABI 2.x"),
        "{error}"
    );
}

#[test]
fn null_descriptor() {
    let dir = tempfile::tempdir().unwrap();
    let lib = broken_plugin(dir.path(), "null", &["NULL_DESCRIPTOR"]);
    assert!(load_error(dir.path(), &lib, "").contains("NULL descriptor"));
}

#[test]
fn abi_major_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let lib = broken_plugin(dir.path(), "major", &["DESC_MAJOR=2"]);
    let error = load_error(dir.path(), &lib, "");
    assert!(
        error
            .contains("ABI major mismatch: the router speaks ABI 1.x, the plugin declares ABI 2.x"),
        "{error}"
    );
}

#[test]
fn newer_minor_than_host() {
    let dir = tempfile::tempdir().unwrap();
    let lib = broken_plugin(dir.path(), "minor", &["DESC_MINOR=7"]);
    let error = load_error(dir.path(), &lib, "");
    assert!(
        error.contains("built for ABI 1.7, newer than this router's ABI 1.5"),
        "{error}"
    );
}

#[test]
fn truncated_descriptor() {
    let dir = tempfile::tempdir().unwrap();
    let lib = broken_plugin(dir.path(), "short", &["DESC_SIZE=24"]);
    let error = load_error(dir.path(), &lib, "");
    assert!(
        error.contains("switchyard_plugin_descriptor is 24 bytes, but ABI 1.5 requires at least"),
        "{error}"
    );
}

#[test]
fn truncated_component_def() {
    let dir = tempfile::tempdir().unwrap();
    let lib = broken_plugin(dir.path(), "short_def", &["DEF_SIZE=16"]);
    let error = load_error(dir.path(), &lib, "");
    assert!(
        error.contains("switchyard_component_def is 16 bytes, but ABI 1.5 requires at least"),
        "{error}"
    );
}

#[test]
fn layout_fingerprint_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let lib = broken_plugin(dir.path(), "fingerprint", &["DESC_FINGERPRINT=0x1234ull"]);
    let error = load_error(dir.path(), &lib, "");
    assert!(
        error.contains("layout fingerprint mismatch for ABI 1.5"),
        "{error}"
    );
    assert!(error.contains("found 0x0000000000001234"), "{error}");
}

#[test]
fn sdk_revision_compatible_by_default_exact_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let lib = broken_plugin(dir.path(), "revision", &["DESC_REVISION=\"0.0.1\""]);
    start_yaml(dir.path(), &plugin_config(&lib, ""))
        .expect("another revision is compatible by default");
    let config = format!(
        "plugins:\n  - path: {}\n    revision: exact\n",
        lib.display()
    );
    let error = start_error(dir.path(), &config);
    assert!(error.contains("SDK revision mismatch: `revision: exact` requires 0.6.0, the plugin was built with 0.0.1"), "{error}");
    assert!(error.contains(&lib.display().to_string()), "{error}");
}

#[test]
fn registration_failure_carries_the_plugins_message() {
    let dir = tempfile::tempdir().unwrap();
    let lib = broken_plugin(dir.path(), "regfail", &["REGISTER_FAIL"]);
    let error = load_error(dir.path(), &lib, "");
    assert!(
        error.contains("registration failed (status 1): license file /etc/acme/license not found"),
        "{error}"
    );
    let errors = start_typed(dir.path(), &plugin_config(&lib, ""))
        .err()
        .expect("refused");
    match &errors[..] {
        [StartupError::Plugin {
            error: LoadError::RegistrationFailed {
                status, message, ..
            },
            ..
        }] => {
            assert_eq!(*status, Status::Error);
            assert_eq!(message, "license file /etc/acme/license not found");
        }
        other => panic!("expected a registration failure, got {other:?}"),
    }
}

#[test]
fn duplicate_type_within_one_library() {
    let dir = tempfile::tempdir().unwrap();
    let lib = broken_plugin(dir.path(), "twice", &["REGISTER_TWICE"]);
    let error = load_error(dir.path(), &lib, "");
    assert!(
        error.contains(
            "duplicate type name `fixture.keep-all`: already registered by plugin `broken-fixture`"
        ),
        "{error}"
    );
}

#[test]
fn duplicate_type_across_libraries_and_with_builtins() {
    let dir = tempfile::tempdir().unwrap();
    let first = broken_plugin(dir.path(), "first", &[]);
    let second = broken_plugin(dir.path(), "second", &[]);
    let config = format!(
        "plugins:\n  - path: {}\n  - path: {}\n",
        first.display(),
        second.display()
    );
    let error = start_error(dir.path(), &config);
    assert!(error.contains(&second.display().to_string()), "{error}");
    assert!(
        error.contains(&format!(
            "already registered by plugin `broken-fixture` ({})",
            first.display()
        )),
        "{error}"
    );

    let shadow = broken_plugin(dir.path(), "shadow", &["TYPE_NAME=\"builtin.softmax\""]);
    let error = load_error(dir.path(), &shadow, "");
    assert!(
        error.contains(
            "duplicate type name `builtin.softmax`: already registered by the router (built-in)"
        ),
        "{error}"
    );
}

#[test]
fn empty_type_name() {
    let dir = tempfile::tempdir().unwrap();
    let lib = broken_plugin(dir.path(), "empty", &["TYPE_NAME=\"\""]);
    let error = load_error(dir.path(), &lib, "");
    assert!(
        error.contains("a filter was registered with an empty type name"),
        "{error}"
    );
}

#[test]
fn same_file_listed_twice_loads_once() {
    let dir = tempfile::tempdir().unwrap();
    let lib = broken_plugin(dir.path(), "once", &[]);
    let config = format!(
        "plugins:\n  - path: {}\n  - path: ./once.so\n",
        lib.display()
    );
    let startup = start_yaml(dir.path(), &config).expect("a file listed twice is loaded once");
    assert_eq!(startup.registry.plugins().len(), 1);
}

#[test]
fn sha256_is_checked_before_the_library_is_opened() {
    let dir = tempfile::tempdir().unwrap();
    let lib = broken_plugin(dir.path(), "pinned", &[]);
    let bytes = std::fs::read(&lib).unwrap();
    let good = {
        use sha2::Digest;
        sha2::Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let config = |sha: &str| format!("plugins:\n  - path: pinned.so\n    sha256: {sha}\n");
    start_yaml(dir.path(), &config(&good)).expect("the right checksum loads");

    // A library that would fail to load proves the checksum is checked first: the
    // library cut short (its ELF header, checked as the file is read, still sound).
    let text = dir.path().join("pinned.so");
    std::fs::remove_file(&text).unwrap();
    std::fs::write(&text, &bytes[..4096]).unwrap();
    let error = start_error(dir.path(), &config(&good));
    assert!(
        error.contains("sha256 mismatch: the config expects"),
        "{error}"
    );
    assert!(error.contains("pinned.so"), "{error}");
    assert!(
        error.contains("config.yaml:3:"),
        "the error points at the `sha256:` line, not the `path:` line: {error}"
    );

    // A pin that is not a sha256 at all says so, instead of "the file changed".
    let error = start_error(dir.path(), &config("3f1c..."));
    assert!(
        error.contains("`sha256: 3f1c...` is not a sha256: expected 64 hexadecimal digits, found 7 characters, not all hexadecimal"),
        "{error}"
    );
    assert!(error.contains("sha256sum"), "{error}");
}

/// Pinned libraries are opened through the descriptor whose bytes were hashed; each keeps
/// its own (the dynamic loader knows a library by that name: a reused descriptor number
/// would hand back the first library for the second).
#[test]
fn pinned_libraries_each_load_from_their_own_checked_descriptor() {
    let dir = tempfile::tempdir().unwrap();
    let sha = |path: &std::path::Path| {
        use sha2::Digest;
        sha2::Sha256::digest(std::fs::read(path).unwrap())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let first = rust_plugin("least_busy");
    let second = cmake_plugin("least_busy_c");
    let config = format!(
        "plugins:\n  - path: {}\n    sha256: {}\n  - path: {}\n    sha256: {}\n",
        first.display(),
        sha(&first),
        second.display(),
        sha(&second)
    );
    let startup = start_yaml(dir.path(), &config).expect("both pinned libraries load");
    let names: Vec<&str> = startup
        .registry
        .plugins()
        .iter()
        .map(|p| p.info.name.as_str())
        .collect();
    assert_eq!(names, ["acme-least-busy", "acme-least-busy-c"]);
    assert!(startup.registry.plugins()[1]
        .types
        .contains(&"c.least-busy".to_owned()));
}

#[test]
fn relative_paths_resolve_against_the_config_folder() {
    let dir = tempfile::tempdir().unwrap();
    broken_plugin(dir.path(), "relative", &[]);
    // The working directory (the crate's folder) does not hold relative.so.
    assert!(!std::path::Path::new("relative.so").exists());
    start_yaml(dir.path(), "plugins:\n  - path: relative.so\n")
        .expect("resolved against the config's folder");
}

#[test]
fn a_registrar_kept_and_called_after_registration_is_refused_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let lib = broken_plugin(dir.path(), "late", &["LATE_REGISTRAR"]);
    // Building the instance runs on_create, which calls the kept registrar: the router
    // must answer with an error (not read freed memory, not register the type).
    let config = plugin_config(
        &lib,
        "worker_selection:\n  instances:\n    - name: late\n      filters: [{type: fixture.keep-all}]\n      picker: {type: builtin.lowest-cost}\n",
    );
    let startup = start_yaml(dir.path(), &config).unwrap_or_else(|e| panic!("{e:#?}"));
    assert!(startup.registry.component("fixture.late").is_none());
}

/// Writes `bytes` as a new file `name` in `dir` (never rewriting a loaded library).
fn write_library(dir: &std::path::Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn a_library_cut_short_or_corrupted_is_refused_before_dlopen_maps_it() {
    let dir = tempfile::tempdir().unwrap();
    let valid = std::fs::read(broken_plugin(dir.path(), "whole", &[])).unwrap();
    // Cut short at several points: each would make the dynamic loader map past the end
    // of the file (SIGBUS in this test process) if it got that far.
    let empty = write_library(dir.path(), "cut0.so", &[]);
    let error = load_error(dir.path(), &empty, "");
    assert!(error.contains("it is an empty file"), "0 bytes: {error}");
    for len in [40, 100, 1_500, valid.len() / 2, valid.len() - 1] {
        let lib = write_library(dir.path(), &format!("cut{len}.so"), &valid[..len]);
        let error = load_error(dir.path(), &lib, "");
        assert!(
            error.contains("not a loadable shared library"),
            "{len}: {error}"
        );
        assert!(
            error.contains("cut short") || error.contains("corrupted"),
            "{len} bytes: {error}"
        );
    }
    // Header fields that say "not for this router".
    let patched = |offset: usize, value: u16, name: &str| {
        let mut bytes = valid.clone();
        bytes[offset..offset + 2].copy_from_slice(&value.to_le_bytes());
        load_error(dir.path(), &write_library(dir.path(), name, &bytes), "")
    };
    let executable = patched(16, 2, "exec.so"); // e_type = ET_EXEC
    assert!(
        executable.contains("its ELF type is 2, not a shared object"),
        "{executable}"
    );
    let foreign = if std::env::consts::ARCH == "x86_64" {
        183
    } else {
        62
    };
    let machine = patched(18, foreign, "foreign.so"); // e_machine
    assert!(
        machine.contains(&format!("built for ELF machine {foreign}")),
        "{machine}"
    );
    // The entry symbol is looked for in the file too: a library without it says so.
    let no_entry = std::fs::read(broken_plugin(dir.path(), "no_entry", &["NO_ENTRY"])).unwrap();
    let error = load_error(
        dir.path(),
        &write_library(dir.path(), "no_entry2.so", &no_entry),
        "",
    );
    assert!(error.contains("missing entry symbol"), "{error}");
}

#[test]
fn c_plugins_read_nested_parameters_through_json_pointers() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("nested.c");
    std::fs::write(
        &source,
        r#"#include <switchyard/plugin.h>
static switchyard_str s(const char *text) { switchyard_str out = {text, 0}; while (text[out.len]) out.len++; return out; }
static int32_t create(void *user_data, const switchyard_params *p, const switchyard_partition *partition,
                      void **out_instance, const switchyard_error *error) {
    (void)user_data; (void)partition;
    double max = 0, w0 = 0, w1 = 0, missing = -1; uint8_t strict = 0; switchyard_str zone = {0, 0};
    int32_t found = p->callback_get_number(p, s("/limits/max"), &max)
        | p->callback_get_number(p, s("/weights/0"), &w0) | p->callback_get_number(p, s("/weights/1"), &w1)
        | p->callback_get_bool(p, s("/limits/strict"), &strict) | p->callback_get_string(p, s("/zones/0"), &zone);
    int32_t past_end = p->callback_get_number(p, s("/weights/2"), &missing);
    int32_t wrong = p->callback_get_number(p, s("/zones/0"), &missing);
    if (found != SWITCHYARD_STATUS_OK || past_end != SWITCHYARD_STATUS_NOT_FOUND || wrong != SWITCHYARD_STATUS_WRONG_TYPE
        || max != 7 || w0 != 1.5 || w1 != 2.5 || !strict || zone.len != 1 || zone.ptr[0] != 'a') {
        switchyard_error_printf(error, "read max=%g w0=%g w1=%g strict=%d zone=%.*s past_end=%d wrong=%d", max, w0, w1,
                                strict, (int)zone.len, zone.ptr ? zone.ptr : "", past_end, wrong);
        return SWITCHYARD_STATUS_INVALID_PARAMETERS;
    }
    *out_instance = 0;
    return SWITCHYARD_STATUS_OK;
}
static int32_t score(void *instance, const switchyard_request *request, const switchyard_candidates *candidates,
                     double *costs, const switchyard_error *error) {
    (void)instance; (void)request; (void)error;
    for (size_t row = 0; row < candidates->count; row++) costs[row] = 0;
    return SWITCHYARD_STATUS_OK;
}
static int32_t register_types(const switchyard_registrar *registrar, const switchyard_error *error) {
    static const switchyard_component_def def = {sizeof(switchyard_component_def), SWITCHYARD_COMPONENT_SCORER, 0, 0,
                                                 "nested.scorer", 0, create, 0, 0, score, 0};
    return registrar->callback_register_component(registrar, &def, error);
}
SWITCHYARD_PLUGIN("nested", "0.1.0", "switchyard tests", register_types)
"#,
    )
    .unwrap();
    let library = compile_c(
        dir.path(),
        "libnested",
        &source,
        &repo().join("include"),
        &[],
    );
    let config = |params: &str| {
        format!(
            "plugins:\n  - path: {}\nworker_selection:\n  instances:\n    - name: n\n      scorers: [{{type: nested.scorer, parameters: {params}}}]\n      picker: {{type: builtin.lowest-cost}}\n",
            library.display()
        )
    };
    let good = "{limits: {max: 7, strict: true}, weights: [1.5, 2.5], zones: [a]}";
    assert!(start_yaml(dir.path(), &config(good)).is_ok());
    let error = start_error(
        dir.path(),
        &config("{limits: {max: 8, strict: true}, weights: [1.5, 2.5], zones: [a]}"),
    );
    assert!(
        error.contains("read max=8 w0=1.5 w1=2.5 strict=1 zone=a past_end=5 wrong=6"),
        "{error}"
    );
}

/// A `path:` that names no regular file (a character device, a FIFO, a /proc file) is
/// refused by `check` with what it is, before anything reads it: `/dev/zero` was once
/// read (and allocated) without end, and opening a FIFO would wait for a writer.
#[test]
fn a_path_to_a_device_fifo_or_proc_file_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("plugin.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo failed");
    for (path, found) in [
        (PathBuf::from("/dev/zero"), "it is a character device"),
        (fifo.clone(), "it is a FIFO (named pipe)"),
        (PathBuf::from("/proc/self/mem"), "it is an empty file"),
        (dir.path().to_owned(), "it is a directory"),
    ] {
        let config = write_config(
            dir.path(),
            &format!(
                "plugins:\n  - path: {}\nworker_selection:\n  default: default\n",
                path.display()
            ),
        );
        let started = std::time::Instant::now();
        let output = std::process::Command::new(switchyard_bin())
            .args(["check", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        eprintln!("{}: refused in {:?}", path.display(), started.elapsed());
        assert_eq!(
            output.status.code(),
            Some(1),
            "{}: {stderr}",
            path.display()
        );
        for expected in [
            &path.display().to_string(),
            found,
            "expected a regular file",
            "config.yaml:2",
        ] {
            assert!(stderr.contains(expected), "`{expected}` in {stderr}");
        }
    }
}
