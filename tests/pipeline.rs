//! Pipeline failures: every worker filtered, a NaN cost, an out-of-range row, a panicking
//! Rust plugin (error status, instance poisoned, router still answering). And where a
//! request's pipeline runs: on the executor's thread only when all of it is the router's
//! own code.

mod support;

use support::*;
use switchyard::policy::SelectError;
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

fn fixture_startup(dir: &std::path::Path, instance: &str) -> switchyard::startup::Startup {
    let lib = broken_plugin(dir, "fixture", &[]);
    start_yaml(
        dir,
        &format!(
            "plugins:\n  - path: {}\nworker_selection:\n  instances:\n    - name: x\n{instance}",
            lib.display()
        ),
    )
    .expect("starts")
}

#[test]
fn every_worker_filtered_is_an_error_naming_the_filter() {
    let dir = tempfile::tempdir().unwrap();
    let startup = fixture_startup(dir.path(), "      filters: [{type: fixture.keep-all}, {type: fixture.reject-all}]\n      scorers: [{type: builtin.active-requests}]\n      picker: {type: builtin.lowest-cost}\n");
    let error = select(&mut selector(&startup, "x"), 4, &FLEET).unwrap_err();
    assert!(
        matches!(&error, SelectError::AllFiltered { component } if &**component == "fixture.reject-all"),
        "{error}"
    );
    assert_eq!(
        error.to_string(),
        "filter `fixture.reject-all` rejected every worker"
    );
}

#[test]
fn nan_cost_is_an_error_naming_scorer_and_worker() {
    let dir = tempfile::tempdir().unwrap();
    let startup = fixture_startup(dir.path(), "      scorers: [{type: builtin.active-requests}, {type: fixture.nan}]\n      picker: {type: builtin.lowest-cost}\n");
    let error = select(&mut selector(&startup, "x"), 4, &FLEET).unwrap_err();
    assert_eq!(error.to_string(), "scorer `fixture.nan` gave a non-finite cost NaN for worker 2 (dp_rank 0); scorers must return finite costs");
    // Without worker 2 the same scorer is fine.
    let fleet = [FLEET[0], FLEET[2]];
    assert_eq!(select(&mut selector(&startup, "x"), 4, &fleet).unwrap(), 1);
}

#[test]
fn out_of_range_row_is_an_error_naming_the_picker() {
    let dir = tempfile::tempdir().unwrap();
    let startup = fixture_startup(dir.path(), "      scorers: [{type: builtin.active-requests}]\n      picker: {type: fixture.out-of-range}\n");
    let error = select(&mut selector(&startup, "x"), 4, &FLEET).unwrap_err();
    assert_eq!(
        error.to_string(),
        "picker `fixture.out-of-range` returned row 3, but there are 3 candidates"
    );
}

#[test]
fn weighted_scores_are_summed() {
    let dir = tempfile::tempdir().unwrap();
    // cost = 1 * active + 3 * max(0, 4 - device): worker 1: 2 + 12, worker 2: 1 + 3, worker 3: 4 + 0.
    let startup = fixture_startup(dir.path(), "      scorers: [{type: builtin.active-requests}, {type: builtin.kv-overlap, weight: 3}]\n      picker: {type: builtin.lowest-cost, parameters: {tie_break: worker-id}}\n");
    let mut selector = selector(&startup, "x");
    assert_eq!(select(&mut selector, 4, &FLEET).unwrap(), 2);
    let mut costs = selector.policy.last_costs().to_vec();
    costs.sort_by(f64::total_cmp);
    assert_eq!(costs, vec![4.0, 4.0, 14.0]);
}

#[test]
fn panicking_rust_plugin_is_contained_and_poisoned() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "plugins:\n  - path: {}\nworker_selection:\n  instances:\n    - name: p\n      scorers: [{{type: panicky.scorer, parameters: {{panic_on_blocks: 13}}}}]\n      picker: {{type: builtin.lowest-cost}}\n",
        rust_plugin("panicky").display()
    );
    let startup = start_yaml(dir.path(), &config).unwrap();
    let mut poisoned = selector(&startup, "p");
    assert_eq!(
        select(&mut poisoned, 12, &FLEET).unwrap(),
        2,
        "fewest active requests"
    );

    assert_eq!(
        component_failure(select(&mut poisoned, 13, &FLEET).unwrap_err()),
        (
            "panicky.scorer".to_owned(),
            Status::Panic,
            "panicked: deliberate panic on a request of 13 blocks".to_owned()
        )
    );
    let (_, status, message) = component_failure(select(&mut poisoned, 12, &FLEET).unwrap_err());
    assert_eq!(status, Status::Poisoned);
    assert!(message.contains("poisoned"), "{message}");
    // The router keeps answering: a fresh instance of the same type, and other policies.
    assert_eq!(select(&mut selector(&startup, "p"), 12, &FLEET).unwrap(), 2);
    assert!(select(&mut selector(&startup, "default"), 12, &FLEET).is_ok());
}

#[test]
fn a_picker_that_answers_ok_without_a_row_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let lib = broken_plugin(dir.path(), "no_row", &["PICK_NO_ROW"]);
    let config = format!(
        "plugins:\n  - path: {}\nworker_selection:\n  instances:\n    - name: x\n      scorers: [{{type: builtin.active-requests}}]\n      picker: {{type: fixture.out-of-range}}\n",
        lib.display()
    );
    let startup = start_yaml(dir.path(), &config).expect("starts");
    let (component, status, message) =
        component_failure(select(&mut selector(&startup, "x"), 4, &FLEET).unwrap_err());
    assert_eq!(component, "fixture.out-of-range");
    assert_eq!(status, Status::OutOfRange);
    assert_eq!(
        message,
        "the picker returned OK with *out_row = SIZE_MAX: it wrote no row, or wrote SIZE_MAX; write a row below the candidate count (3)"
    );
}

#[test]
fn input_group_bits_the_abi_does_not_define_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let lib = broken_plugin(dir.path(), "bits", &["INPUTS=65"]);
    let error = start_error(
        dir.path(),
        &format!("plugins:\n  - path: {}\n", lib.display()),
    );
    assert!(
        error.contains("type `fixture.keep-all`: declares input groups 0x40 that ABI 1.5 does not define (known: 0x3f)"),
        "{error}"
    );
    // LABELS (8) came with 1.1: a plugin declaring ABI 1.0 may not use it.
    let lib = broken_plugin(
        dir.path(),
        "bits_1_0",
        &[
            "INPUTS=9",
            "DESC_MINOR=0",
            "DESC_FINGERPRINT=0x260ea2ef56f067f2ULL",
        ],
    );
    let error = start_error(
        dir.path(),
        &format!("plugins:\n  - path: {}\n", lib.display()),
    );
    assert!(
        error.contains("declares input groups 0x8 that ABI 1.0 does not define (known: 0x7)"),
        "{error}"
    );
    // ENGINE (32) came with 1.2: a plugin declaring ABI 1.1 may not use it.
    let lib = broken_plugin(
        dir.path(),
        "bits_1_1",
        &[
            "INPUTS=33",
            "DESC_MINOR=1",
            "DESC_FINGERPRINT=0xdb3ed4ebab9f0480ULL",
        ],
    );
    let error = start_error(
        dir.path(),
        &format!("plugins:\n  - path: {}\n", lib.display()),
    );
    assert!(
        error.contains("declares input groups 0x20 that ABI 1.1 does not define (known: 0xf)"),
        "{error}"
    );
}

/// With a plugin library loaded, a request whose instance and admitters are all built in
/// runs inline; one that meets the plugin's policy type, one of its components, or its
/// admitter goes to the blocking pool, as does an unknown instance or a large input.
#[test]
fn only_the_routers_own_code_runs_on_the_executors_threads() {
    use switchyard::fleet::router::Router;
    use switchyard::serve::off_executor::{inline_ok, INLINE_INPUT_BYTES};
    let dir = tempfile::tempdir().unwrap();
    let plugin = rust_plugin("least_busy");
    let instances = "worker_selection:\n  instances:\n\
        \x20   - {name: plugin-type, type: least-busy}\n\
        \x20   - {name: built-ins, scorers: [{type: builtin.active-requests}], picker: {type: builtin.lowest-cost}}\n\
        \x20   - {name: mixed, scorers: [{type: acme.active-requests}], picker: {type: builtin.lowest-cost}}\n";
    let router = |admitters: &str| {
        let yaml = format!(
            "plugins:\n  - path: {}\n{instances}{admitters}",
            plugin.display()
        );
        Router::new(start_yaml(dir.path(), &yaml).expect("starts")).unwrap()
    };
    let plain = router("");
    for (instance, inline) in [
        (None, true),
        (Some("default"), true),
        (Some("built-ins"), true),
        (Some("plugin-type"), false),
        (Some("mixed"), false),
        (Some("no-such-instance"), false),
    ] {
        assert_eq!(inline_ok(&plain, 512, instance), inline, "{instance:?}");
    }
    assert!(
        !inline_ok(&plain, INLINE_INPUT_BYTES + 1, None),
        "a large input"
    );
    let admitting = router(
        "admission:\n  admitters:\n    - {type: acme.shed-when-saturated, parameters: {keep_priority: 5}}\n",
    );
    assert!(
        !inline_ok(&admitting, 512, Some("built-ins")),
        "the plugin's admitter is in every request's path"
    );
}
