//! `switchyard plugin test`: the conformance run catches, each in the type built for it, a
//! mask value of 2, a NaN cost, an out-of-range row, a read of an undeclared input group
//! (a crash, in the child, reported with its phase), nondeterminism and accepted unknown
//! parameters; the shipped example plugins of all three languages pass it.

mod support;

use std::collections::HashMap;
use std::process::Command;

use serde_json::Value;
use support::*;

/// Runs `plugin test ARGS --json`: exit code, and per type its failed checks' details.
fn plugin_test(args: &[&str]) -> (i32, HashMap<String, HashMap<String, String>>) {
    let output = Command::new(switchyard_bin())
        .args(["plugin", "test", "--json"])
        .args(args)
        .output()
        .unwrap();
    let reports: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    let failed = reports
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let findings = r["findings"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|f| f["ok"] == false)
                .map(|f| {
                    (
                        f["check"].as_str().unwrap().to_owned(),
                        f["detail"].as_str().unwrap().to_owned(),
                    )
                })
                .collect();
            (r["type_name"].as_str().unwrap().to_owned(), findings)
        })
        .collect();
    (output.status.code().unwrap(), failed)
}

#[test]
fn each_misbehaviour_is_found_in_the_type_built_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let library = broken_plugin(dir.path(), "fixture", &[]);
    let (code, failed) = plugin_test(&[library.to_str().unwrap()]);
    assert_eq!(code, 1);
    let detail = |type_name: &str, check: &str| -> String {
        failed[type_name]
            .get(check)
            .unwrap_or_else(|| panic!("{type_name}: no `{check}` finding: {:?}", failed[type_name]))
            .clone()
    };
    assert!(detail("fixture.mask-two", "filter mask is 0 or 1").contains("wrote 2 for worker 1"));
    assert!(detail("fixture.nan", "scorer costs are finite").contains("cost NaN for worker 2"));
    assert!(detail("fixture.out-of-range", "picker row in range")
        .contains("returned row 1 of 1 candidates"));
    let crash = detail("fixture.reads-undeclared", "no crash");
    assert!(
        crash.contains("SIGSEGV") && crash.contains("while calling it on 1 candidates"),
        "{crash}"
    );
    assert!(detail("fixture.random", "same input, same output").contains("--allow-random"));
    for (type_name, findings) in &failed {
        assert!(
            findings
                .get("unknown parameters refused")
                .is_some_and(|d| d.contains("switchyard_conformance_unknown_key")),
            "{type_name} ignores parameters: {findings:?}"
        );
    }
    // A well-behaved component has no other finding (the checks do not cry wolf).
    assert_eq!(
        failed["fixture.keep-all"].len(),
        1,
        "{:?}",
        failed["fixture.keep-all"]
    );
    assert!(
        !failed["fixture.nan"].contains_key("same input, same output"),
        "NaN is still the same NaN"
    );

    let (_, only) = plugin_test(&[
        library.to_str().unwrap(),
        "--type",
        "fixture.random",
        "--allow-random",
    ]);
    assert_eq!(only.len(), 1);
    assert!(
        !only["fixture.random"].contains_key("same input, same output"),
        "{only:?}"
    );
}

#[test]
fn the_example_plugins_of_all_three_languages_pass() {
    // The Rust example also registers an admitter.
    for (library, types) in [
        (rust_plugin("least_busy"), 5),
        (cmake_plugin("least_busy_c"), 4),
        (cmake_plugin("least_busy_cpp"), 4),
    ] {
        let output = Command::new(switchyard_bin())
            .args(["plugin", "test"])
            .arg(&library)
            .output()
            .unwrap();
        let table = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{}: {table}", library.display());
        assert!(
            table.contains(&format!("{types} type(s), 0 failed")),
            "{table}"
        );
        assert!(table.contains("ns per candidate at 1,024"), "{table}");
        if types == 5 {
            let admitter = table
                .lines()
                .find(|l| l.contains("admitter acme.shed-when-saturated"));
            assert!(
                admitter.is_some_and(|l| l.ends_with(" us per call")),
                "timed per call: {table}"
            );
        }
    }
}

/// A library built without optimization is named, with what to do (a C++ scorer built
/// as CMake leaves an empty build type cost 107.6 us per call against 9.6 us); an
/// optimized one, and the examples as `make plugins` builds them, are not.
#[test]
fn an_unoptimized_library_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let source = repo().join("plugins/c/least-busy/least_busy.c");
    let include = repo().join("include");
    let warned = |library: &std::path::Path| {
        let output = Command::new(switchyard_bin())
            .args(["plugin", "test", "--type", "c.least-busy"])
            .arg(library)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", library.display());
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        stderr
            .contains("looks built without optimization")
            .then_some(stderr)
    };
    for (name, flags) in [("plain", &[][..]), ("o0", &["-O0"][..])] {
        let library = compile_c_with(dir.path(), name, (&source, &include), &[], flags);
        let warning = warned(&library).unwrap_or_else(|| panic!("{flags:?}: no warning"));
        assert!(warning.contains("-DCMAKE_BUILD_TYPE=Release"), "{warning}");
    }
    for flags in [&["-O2"][..], &["-O2", "-fno-omit-frame-pointer"], &["-Os"]] {
        let library = compile_c_with(dir.path(), "optimized", (&source, &include), &[], flags);
        assert_eq!(warned(&library), None, "{flags:?}");
    }
    assert_eq!(warned(&cmake_plugin("least_busy_c")), None);
}

#[test]
fn bad_arguments_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let library = broken_plugin(dir.path(), "fixture", &[]);
    let run = |args: &[&str]| {
        let output = Command::new(switchyard_bin())
            .args(["plugin", "test"])
            .args(args)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let lib = library.to_str().unwrap();
    assert!(run(&[lib, "--type", "nope"])
        .contains("--type nope: the library registers no such type; it registers fixture."));
    assert!(
        run(&[lib, "--params", "[1]"]).contains("--params: expected a JSON object or TYPE={...}")
    );
    assert!(run(&[lib, "--params", "nope={}"])
        .contains("--params nope=...: the library registers no such type"));
    assert!(run(&["/nonexistent/lib.so"]).contains("could not be loaded"));
}

#[test]
fn lifecycle_notifications_are_delivered_and_a_failing_one_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let source = repo().join("tests/fixtures/lifecycle_plugin.c");
    let include = repo().join("include");
    let log = dir.path().join("log.txt");
    let params = format!("{{\"log\": \"{}\"}}", log.display());
    let good = compile_c(dir.path(), "lifecycle", &source, &include, &[]);
    let (code, failed) = plugin_test(&[good.to_str().unwrap(), "--params", &params]);
    assert_eq!(code, 0, "{failed:?}");
    let lines = std::fs::read_to_string(&log).unwrap();
    assert!(
        lines.contains("selected 1 1 -")
            && lines.contains("prefill 1 1 0.250000")
            && lines.contains("finished 2 1 nan 0.500000"),
        "every notification reached the component:\n{lines}"
    );

    let bad = compile_c(dir.path(), "failing", &source, &include, &["FAIL_SELECTED"]);
    let (code, failed) = plugin_test(&[bad.to_str().unwrap(), "--params", &params]);
    assert_eq!(code, 1);
    let detail = &failed["fixture.lifecycle-log"]["lifecycle notifications succeed"];
    assert!(
        detail.contains("on_selected") && detail.contains("deliberate on_selected failure"),
        "{detail}"
    );
}

/// `--params TYPE={...}` gives one type its parameters; a type refusing what it got is
/// told how to give it its own. The 1.2 example filter reads the generated labels and
/// request attributes (its `x-zone` header).
#[test]
fn params_per_type_and_the_header_filter_on_generated_fleets() {
    let lib = cmake_plugin("header_match_c");
    let lib = lib.to_str().unwrap();
    let (code, failed) = plugin_test(&[lib]);
    assert_eq!(code, 1);
    let detail = &failed["c.label-matches-header"]["given parameters accepted"];
    assert!(
        detail.contains("missing parameter `label`")
            && detail.contains("--params 'c.label-matches-header={...}'"),
        "{detail}"
    );
    let (code, failed) = plugin_test(&[
        lib,
        "--params",
        r#"c.label-matches-header={"label": "zone", "header": "x-zone"}"#,
    ]);
    assert_eq!(code, 0, "{failed:?}");
    let (code, failed) = plugin_test(&[cmake_plugin("lora_affinity_cpp").to_str().unwrap()]);
    assert_eq!(
        code, 0,
        "the C++ LoRA scorer on generated engine reports: {failed:?}"
    );
}

/// `--config F` takes each type's parameters from the instances of a config that uses it
/// (the config also names built-ins and other plugins' types: those are not this
/// library's and are left out); without them the type refuses `{}`.
#[test]
fn params_come_from_a_config_that_uses_the_types() {
    let dir = tempfile::tempdir().unwrap();
    let source = repo().join("tests/fixtures/lifecycle_plugin.c");
    let library = compile_c(
        dir.path(),
        "lifecycle",
        &source,
        &repo().join("include"),
        &[],
    );
    let log = dir.path().join("log.txt");
    let config = write_config(
        dir.path(),
        &format!(
            "plugins:\n  - path: {}\n\
             worker_selection:\n  instances:\n    - name: logged\n      \
             scorers: [{{type: builtin.active-requests}}, {{type: fixture.lifecycle-log, parameters: {{log: {}}}}}]\n      \
             picker: {{type: builtin.lowest-cost}}\n",
            library.display(),
            log.display()
        ),
    );
    let (code, failed) = plugin_test(&[library.to_str().unwrap()]);
    assert_eq!(code, 1, "`log` is required: {failed:?}");
    let (code, failed) = plugin_test(&[
        library.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{failed:?}");
    assert!(std::fs::read_to_string(&log).unwrap().contains("selected "));
}
