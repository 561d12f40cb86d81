//! Every malformed-input class `switchyard serve` can be sent, each answered with its
//! status and a message that says what was wrong.

use crate::config;
use crate::support::*;
use serde_json::json;

/// Each malformed-input class: method, path, body, the status and part of the message.
const MALFORMED: &[(&str, &str, Option<&str>, u16, &str)] = &[
    (
        "POST",
        "/v1/select",
        Some("{\"model\": \"m\""),
        400,
        "invalid JSON body: EOF while parsing",
    ),
    (
        "POST",
        "/v1/select",
        Some(""),
        400,
        "the request body is empty",
    ),
    (
        "POST",
        "/v1/select",
        Some("{\"block_hashes\": [1]}"),
        400,
        "missing field `model`",
    ),
    (
        "POST",
        "/v1/select",
        Some("{\"model\": \"m\", \"block_hashes\": [1], \"colour\": 1}"),
        400,
        "unknown field `colour`",
    ),
    (
        "POST",
        "/v1/select",
        Some("{\"model\": \"m\", \"block_hashes\": \"x\"}"),
        400,
        "invalid type: string \"x\"",
    ),
    (
        "POST",
        "/v1/select",
        Some("{\"model\": \"m\", \"token_ids\": [5, 6, -7]}"),
        400,
        "token_ids[2]: expected a token id (a whole number from 0 to 4294967295), found `-7`",
    ),
    (
        "POST",
        "/v1/select",
        Some("{\"model\": \"m\"}"),
        400,
        "give the prompt as `token_ids` or `block_hashes`",
    ),
    (
        "POST",
        "/v1/select",
        Some("{\"model\": \"m\", \"block_hashes\": [1], \"token_ids\": [1]}"),
        400,
        "not both",
    ),
    (
        "POST",
        "/v1/select",
        Some("{\"model\": \"m\", \"block_hashes\": [1], \"router_temperature\": -1}"),
        400,
        "`router_temperature` must be a finite number >= 0",
    ),
    (
        "POST",
        "/v1/reserve",
        Some("{\"model\": \"m\", \"block_hashes\": [1]}"),
        400,
        "select-and-reserve needs a `request_id`",
    ),
    (
        "POST",
        "/v1/workers",
        Some("{\"model\": \"\", \"worker_id\": 9}"),
        400,
        "`model` must not be empty",
    ),
    (
        "POST",
        "/v1/kv_events",
        Some("{\"worker_id\": 1, \"events\": [{\"type\": \"moved\"}]}"),
        400,
        "unknown variant `moved`",
    ),
    (
        "DELETE",
        "/v1/workers/abc",
        None,
        400,
        "worker id must be a whole number",
    ),
    (
        "POST",
        "/v1/select",
        Some("{\"model\": \"gpt-9\", \"block_hashes\": [1]}"),
        404,
        "unknown model `gpt-9`",
    ),
    (
        "POST",
        "/v1/select",
        Some("{\"model\": \"m\", \"block_hashes\": [1], \"instance\": \"nope\"}"),
        404,
        "unknown instance `nope`; configured instances: default, least-busy",
    ),
    (
        "POST",
        "/v1/kv_events",
        Some("{\"worker_id\": 77, \"events\": []}"),
        404,
        "no worker 77 (dp_rank 0)",
    ),
    ("DELETE", "/v1/workers/77", None, 404, "no worker 77"),
    (
        "POST",
        "/v1/requests/ghost/free",
        None,
        404,
        "no reserved request `ghost`",
    ),
    (
        "POST",
        "/v1/requests/ghost/prefill_complete",
        None,
        404,
        "no reserved request `ghost`",
    ),
    ("GET", "/v2/everything", None, 404, "no such endpoint"),
    (
        "POST",
        "/v1/workers",
        Some("{\"model\": \"m\", \"worker_id\": 1}"),
        409,
        "already registered",
    ),
    (
        "POST",
        "/v1/select",
        Some("{\"model\": \"m\", \"worker_type\": \"prefill\", \"block_hashes\": [1]}"),
        503,
        "model `m` has no prefill workers",
    ),
    (
        "POST",
        "/v1/select",
        Some("{\"model\": \"m\", \"instance\": \"picky\", \"block_hashes\": [1]}"),
        503,
        "rejected every worker",
    ),
    (
        "POST",
        "/v1/select",
        Some("{\"model\": \"m\", \"instance\": \"fragile\", \"block_hashes\": [1]}"),
        500,
        "scorer `cpp.throwing-scorer` failed (panicked): threw: scorer state corrupted",
    ),
];

#[test]
fn every_malformed_input_class_gets_its_status_and_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(dir.path()));
    server.ok("/v1/workers", json!({"model": "m", "worker_id": 1}));
    server.ok(
        "/v1/workers",
        json!({"model": "m", "worker_id": 2, "worker_type": "decode"}),
    );
    for &(method, path, body, status, message) in MALFORMED {
        let (got, value) = server.call(method, path, body);
        let error = value["error"].as_str().unwrap_or_default();
        assert_eq!(got, status, "{method} {path} {body:?}: {value}");
        assert!(
            error.contains(message),
            "{method} {path} {body:?}: `{message}` not in `{error}`"
        );
    }
    let (_, value) = server.post(
        "/v1/select",
        json!({"model": "m", "instance": "fragile", "block_hashes": [1]}),
    );
    assert_eq!(value["component"], "cpp.throwing-scorer");
    assert!(
        value["error"].as_str().unwrap().contains("poisoned"),
        "{value}"
    );

    server.ok(
        "/v1/reserve",
        json!({"model": "m", "block_hashes": [1], "request_id": "dup"}),
    );
    let (status, value) = server.post(
        "/v1/reserve",
        json!({"model": "m", "block_hashes": [1], "request_id": "dup"}),
    );
    assert_eq!(status, 409, "{value}");

    // on_error: fallback routes with the built-in policy and counts it.
    let decision = server.ok(
        "/v1/select",
        json!({"model": "m", "instance": "resilient", "block_hashes": [1]}),
    );
    assert_eq!(decision["fallback"], true);
    assert_eq!(decision["worker_id"], 1);
    let metrics = server.metrics();
    assert!(
        metrics.contains("switchyard_fallbacks_total{instance=\"resilient\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("switchyard_selection_errors_total{instance=\"fragile\",component=\"cpp.throwing-scorer\"} 2"), "{metrics}");
    // The router still answers everyone else.
    assert_eq!(
        server.ok("/v1/select", json!({"model": "m", "block_hashes": [1]}))["worker_id"],
        1
    );
}
