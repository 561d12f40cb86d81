//! Session affinity owned by the router (issue 51, item 3): `router.session_affinity`
//! binds a session to the worker its last request was dispatched to. Soft: its next
//! request returns there while the worker is under `soft_max_active_requests`, and moves
//! (rebinding) when over it. Hard: it returns there whatever the load. Sessions come from
//! `/v1/reserve`'s `session` and, on the frontend, from `request_attributes.session_header`.

mod support;

use serde_json::json;
use support::{engine_sim, post_json, reserve_in_session, write_config};

/// A router over two workers (no engines: `/v1/reserve` only) with `affinity`.
fn router(dir: &std::path::Path, affinity: &str) -> support::Process {
    support::serve(&write_config(
        dir,
        &format!(
            "router: {{session_affinity: {affinity}}}\n\
             workers:\n  - {{model: m, worker_id: 1}}\n  - {{model: m, worker_id: 2}}\n"
        ),
    ))
}

#[test]
fn a_soft_session_returns_under_the_threshold_and_moves_over_it() {
    let dir = tempfile::tempdir().unwrap();
    let router = router(dir.path(), "{mode: soft, soft_max_active_requests: 2}");
    let base = &router.address;
    let first = reserve_in_session(base, "r1", Some("s"));
    let other = 3 - first;
    // The least busy worker would be the other one: the session keeps to its own.
    assert_eq!(
        reserve_in_session(base, "r2", Some("s")),
        first,
        "under the threshold"
    );
    // Its worker has 2 active requests now: the session moves, and is bound there.
    assert_eq!(
        reserve_in_session(base, "r3", Some("s")),
        other,
        "over the threshold"
    );
    assert_eq!(
        reserve_in_session(base, "r4", Some("s")),
        other,
        "bound to where it went"
    );
    // The first worker's requests end: a new session goes where load says, the first.
    for id in ["r1", "r2"] {
        let answer = ureq::delete(&format!("{base}/v1/requests/{id}")).call();
        assert!(answer.is_ok(), "{answer:?}");
    }
    assert_eq!(
        reserve_in_session(base, "r5", Some("t")),
        first,
        "a new session: least busy"
    );
}

#[test]
fn a_hard_session_returns_whatever_the_load_and_a_final_request_unbinds_it() {
    let dir = tempfile::tempdir().unwrap();
    let router = router(dir.path(), "{mode: hard}");
    let base = &router.address;
    let first = reserve_in_session(base, "r1", Some("s"));
    for turn in 2..6 {
        assert_eq!(
            reserve_in_session(base, &format!("r{turn}"), Some("s")),
            first,
            "turn {turn}"
        );
    }
    // Its last request (`session_final`) unbinds it: the next goes where load says.
    let body = json!({"model": "m", "block_hashes": [7], "request_id": "last",
                      "session": {"session_id": "s", "session_final": true}});
    let (status, _, text) = post_json(&ureq::Agent::new(), &format!("{base}/v1/reserve"), &body);
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        reserve_in_session(base, "after", Some("s")),
        3 - first,
        "the least busy now"
    );
}

/// Through the frontend: the session header binds a conversation to one engine, where
/// the built-in picker's random tie-break would otherwise spread its turns.
#[test]
fn the_frontend_binds_sessions_by_header() {
    let dir = tempfile::tempdir().unwrap();
    let engines: Vec<_> = (0..2)
        .map(|i| engine_sim(&format!("e{i}"), "127.0.0.1:0", &[]))
        .collect();
    let config = write_config(
        dir.path(),
        &format!(
            "router: {{session_affinity: {{mode: hard}}}}\n\
             request_attributes: {{session_header: x-session-id}}\n\
             worker_selection:\n  default: spread\n  instances:\n    - name: spread\n      \
             scorers: [{{type: builtin.active-requests}}]\n      \
             picker: {{type: builtin.lowest-cost, parameters: {{tie_break: random, seed: 7}}}}\n\
             workers:\n  - {{model: demo, worker_id: 1, url: \"{}\"}}\n  - {{model: demo, worker_id: 2, url: \"{}\"}}\n",
            engines[0].address, engines[1].address
        ),
    );
    let router = support::serve(&config);
    let url = format!("{}/v1/chat/completions", router.address);
    let workers = |session: Option<&str>| -> Vec<String> {
        (0..12)
            .map(|turn| {
                let mut request = ureq::post(&url).set("content-type", "application/json");
                if let Some(session) = session {
                    request = request.set("x-session-id", session);
                }
                let body = json!({"model": "demo", "max_tokens": 2,
                                  "messages": [{"role": "user", "content": format!("turn {turn}")}]});
                let answer = request.send_string(&body.to_string()).unwrap();
                answer.header("x-switchyard-worker").unwrap().to_owned()
            })
            .collect()
    };
    let bound = workers(Some("conversation-1"));
    assert!(bound.iter().all(|w| *w == bound[0]), "{bound:?}");
    // The control: without a session, the random tie-break uses both engines (12 draws
    // all on one worker: 1 in 2,048).
    let spread = workers(None);
    assert!(spread.iter().any(|w| *w != spread[0]), "{spread:?}");
}
