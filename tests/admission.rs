//! Overload through the real frontend (`admission:`): engine-sim engines on loopback,
//! clients at three times the fleet's capacity. Every request is answered, with a worker
//! or with an OpenAI-shaped 429 / 503 and `Retry-After`; none is lost; bookings and the
//! queue are empty at the end; a client that hangs up while queued leaves the queue at
//! once; and a high-priority request overtakes the low-priority ones queued before it.

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

fn new_agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(30))
        .build()
}

fn chat(content: &str, max_tokens: u32) -> Value {
    json!({"model": "demo", "max_tokens": max_tokens,
           "messages": [{"role": "user", "content": content}]})
}

/// With every worker busy, a request queues; its client hangs up; it leaves the queue.
fn a_queued_client_that_hangs_up_leaves(agent: &ureq::Agent, base: &str) {
    let address = base.trim_start_matches("http://");
    let mut waiting = std::net::TcpStream::connect(address).unwrap();
    let body = chat("queued, then gone", 10).to_string();
    write!(
        waiting,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    wait_for("the request queued", || {
        metric(base, "switchyard_admission_waiting") == 1.0
    });
    let policies: Value = agent
        .get(&format!("{base}/v1/policies"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    let admission = &policies["admission"];
    assert_eq!(admission["waiting"], 1, "{admission}");
    assert_eq!(admission["busy"]["max_active_requests"], 2, "{admission}");
    assert_eq!(admission["queue"]["max_queued"], 4, "{admission}");
    let left_before = metric(base, "switchyard_admission_left_total");
    drop(waiting);
    wait_for("the hung-up request left the queue", || {
        metric(base, "switchyard_admission_waiting") == 0.0
    });
    assert!(metric(base, "switchyard_admission_left_total") > left_before);
}

/// One chat request: its status, `Retry-After` and body (status 0: no answer).
fn answer_of(agent: &ureq::Agent, base: &str, body: Value) -> (u16, Option<String>, String) {
    match agent
        .post(&format!("{base}/v1/chat/completions"))
        .send_json(body)
    {
        Ok(r) => (r.status(), None, String::new()),
        Err(ureq::Error::Status(code, r)) => {
            let retry = r.header("retry-after").map(str::to_owned);
            (code, retry, r.into_string().unwrap_or_default())
        }
        Err(e) => (0, None, e.to_string()),
    }
}

/// Every refusal is a 429 or 503 with `Retry-After` and an OpenAI-shaped error.
fn refusals_are_openai_shaped_with_retry_after(statuses: &[(u16, Option<String>, String)]) {
    for (status, retry, body) in statuses.iter().filter(|(s, ..)| *s != 200) {
        assert!(
            matches!(status, 429 | 503),
            "a refusal is 429 or 503: {status} {body}"
        );
        assert_eq!(retry.as_deref(), Some("1"), "with Retry-After: {body}");
        let error: Value = serde_json::from_str(body).unwrap();
        assert!(
            error["error"]["message"].is_string(),
            "OpenAI-shaped: {body}"
        );
    }
}

#[test]
fn three_times_capacity_every_request_answered_nothing_left_behind() {
    let dir = tempfile::tempdir().unwrap();
    // 10 tokens at 100 tokens/s: each request holds its worker for about 100 ms.
    let engines: Vec<Process> = (0..2)
        .map(|i| engine_sim(&format!("e{i}"), "127.0.0.1:0", &["--decode-tps", "100"]))
        .collect();
    let yaml = format!(
        "admission:\n  busy: {{max_active_requests: 2}}\n  queue: {{max_queued: 4, max_wait_ms: 1500}}\nworkers:\n{}",
        demo_workers(&engines, false)
    );
    let router = serve(&write_config(dir.path(), &yaml));
    let base = router.address.clone();
    let statuses = Arc::new(Mutex::new(Vec::new()));
    // Capacity 4 (2 workers x 2); 12 clients.
    let clients: Vec<_> = (0..12)
        .map(|c| {
            let (base, statuses) = (base.clone(), statuses.clone());
            std::thread::spawn(move || {
                let agent = new_agent();
                for n in 0..5 {
                    let body = chat(&format!("client {c} request {n}"), 10);
                    let answer = answer_of(&agent, &base, body);
                    statuses.lock().unwrap().push(answer);
                }
            })
        })
        .collect();
    for client in clients {
        client.join().unwrap();
    }
    let statuses = statuses.lock().unwrap();
    assert_eq!(statuses.len(), 60, "every request has an answer");
    let ok = statuses.iter().filter(|(s, ..)| *s == 200).count();
    refusals_are_openai_shaped_with_retry_after(&statuses);
    let agent = new_agent();
    let queued = metric(&base, "switchyard_admission_queued_total");
    println!(
        "60 requests at 3x capacity: {ok} served, {} refused; {queued} waited in the queue",
        60 - ok
    );
    assert!(ok >= 20, "most requests are served: {ok}");
    assert!(queued > 0.0, "some requests waited");
    // Nothing stays booked or queued.
    wait_for("bookings back to zero", || {
        active_requests(&base).iter().all(|&n| n == 0)
    });
    assert_eq!(metric(&base, "switchyard_admission_waiting"), 0.0);

    // A queued client that hangs up leaves the queue at once.
    // One at a time, each booked before the next is sent: sent together, two could be
    // placed on the same worker (both seeing it not yet busy), leaving the other worker
    // free for the request that must queue.
    let busy: Vec<_> = (0..4u64)
        .map(|i| {
            let base_of_thread = base.clone();
            let long = std::thread::spawn(move || {
                let _ = new_agent()
                    .post(&format!("{base_of_thread}/v1/chat/completions"))
                    .send_json(chat(&format!("long {i}"), 300));
            });
            wait_for("the long request booked", || {
                active_requests(&base).iter().sum::<u64>() > i
            });
            long
        })
        .collect();
    assert!(
        active_requests(&base).iter().all(|&n| n >= 2),
        "every worker busy: {:?}",
        active_requests(&base)
    );
    a_queued_client_that_hangs_up_leaves(&agent, &base);
    for b in busy {
        b.join().unwrap();
    }
}

#[test]
fn a_high_priority_request_overtakes_the_low_priority_queue() {
    let dir = tempfile::tempdir().unwrap();
    // One worker, one request at a time, 100 tokens/s.
    let engine = engine_sim("e0", "127.0.0.1:0", &["--decode-tps", "100"]);
    let yaml = format!(
        "request_attributes: {{priority_header: x-priority}}\nadmission:\n  busy: {{max_active_requests: 1}}\n  queue: {{max_wait_ms: 10000}}\nworkers:\n{}",
        demo_workers([&engine], false)
    );
    let router = serve(&write_config(dir.path(), &yaml));
    let base = router.address.clone();
    let finished = Arc::new(Mutex::new(Vec::new()));
    // The first request holds the worker for 2 s (200 tokens), long enough for the others
    // to queue behind it on a loaded machine; each of those then takes 200 ms.
    let send = |name: &'static str, priority: i32, tokens: u32| {
        let (base, finished) = (base.clone(), finished.clone());
        std::thread::spawn(move || {
            let status = new_agent()
                .post(&format!("{base}/v1/chat/completions"))
                .set("x-priority", &priority.to_string())
                .send_json(chat(name, tokens))
                .map(|r| r.status())
                .unwrap_or(0);
            finished.lock().unwrap().push((name, status));
        })
    };
    let mut threads = vec![send("first", 0, 200)];
    wait_for("the first request booked", || {
        metric(&base, "switchyard_admission_waiting") == 0.0 && active_requests(&base) == [1]
    });
    for (i, name) in ["low-1", "low-2", "low-3"].into_iter().enumerate() {
        threads.push(send(name, 0, 20));
        wait_for("the low request queued", || {
            metric(&base, "switchyard_admission_waiting") == (i + 1) as f64
        });
    }
    threads.push(send("high", 10, 20));
    wait_for("the high request queued", || {
        metric(&base, "switchyard_admission_waiting") == 4.0
    });
    for t in threads {
        t.join().unwrap();
    }
    let finished = finished.lock().unwrap();
    let order: Vec<&str> = finished.iter().map(|(n, _)| *n).collect();
    assert!(finished.iter().all(|(_, s)| *s == 200), "{finished:?}");
    assert_eq!(order, ["first", "high", "low-1", "low-2", "low-3"]);
    assert_eq!(
        metric(&base, "switchyard_admission_wait_seconds_count"),
        4.0,
        "the four that waited are in the wait histogram"
    );
}

/// The same queue behind a real Envoy: the picker holds the ext_proc stream while a
/// request waits, and a full queue reaches the client as 429.
#[test]
fn envoy_streams_wait_in_the_queue_and_a_full_queue_answers_429() {
    use support::real_envoy::Envoy;
    let dir = tempfile::tempdir().unwrap();
    // 30 tokens at 100 tokens/s: 300 ms each; one at a time; one may wait.
    let engine = engine_sim("e0", "127.0.0.1:0", &["--decode-tps", "100"]);
    let port = free_port();
    let yaml = format!(
        "admission:\n  busy: {{max_active_requests: 1}}\n  queue: {{max_queued: 1, max_wait_ms: 5000}}\nworkers:\n{}",
        demo_workers([&engine], true)
    );
    let config = write_config(dir.path(), &yaml);
    let _router = serve_with_picker(&config, port);
    let envoy = Envoy::start(dir.path(), port);
    let url = format!("{}/v1/chat/completions", envoy.base);
    wait_for("Envoy routes through the picker", || {
        new_agent().post(&url).send_json(chat("ready?", 1)).is_ok()
    });
    let threads: Vec<_> = (0..4u32)
        .map(|i| {
            let url = url.clone();
            std::thread::spawn(move || {
                // No outcome depends on the order: the assertions below count answers.
                pacing::arrive(i, Duration::from_millis(20));
                match new_agent().post(&url).send_json(chat(&format!("e{i}"), 30)) {
                    Ok(r) => r.status(),
                    Err(ureq::Error::Status(code, r)) => {
                        assert_eq!(r.header("retry-after"), Some("1"), "{code}");
                        code
                    }
                    Err(_) => 0,
                }
            })
        })
        .collect();
    let answers: Vec<u16> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let served = answers.iter().filter(|&&s| s == 200).count();
    assert!(
        served >= 2,
        "the running one and the waiting one: {answers:?}"
    );
    assert!(
        answers.iter().all(|&s| s == 200 || s == 429),
        "the others find the queue full: {answers:?}"
    );
    assert!(answers.contains(&429), "{answers:?}");
}

/// docs/admission.md's configs are ones `switchyard check` accepts (plugin paths are the
/// repo's built examples).
#[test]
fn the_admission_guide_configs_pass_check() {
    let markdown = std::fs::read_to_string(repo().join("docs/admission.md")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let examples = blocks(&markdown, "yaml");
    assert!(examples.len() >= 2, "the queue and the admitters");
    let plugins = format!("{}/", repo().join("target/plugins").display());
    for yaml in examples {
        check_passes(&write_config(
            dir.path(),
            &yaml.replace("target/plugins/", &plugins),
        ));
    }
}

/// `admission.rate_limits`: a tenant over its bucket gets 429 with `Retry-After` on the
/// frontend and `/v1/reserve`; another tenant is not affected; the bucket refills.
#[test]
fn a_tenant_over_its_rate_gets_429_and_others_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_sim("e0", "127.0.0.1:0", &[]);
    let yaml = format!(
        "request_attributes: {{tenant: ['header:x-tenant']}}\nadmission:\n  rate_limits:\n    noisy: {{requests_per_s: 1, request_burst: 2}}\nworkers:\n{}",
        demo_workers([&engine], false)
    );
    let router = serve(&write_config(dir.path(), &yaml));
    let post = |tenant: &str| match new_agent()
        .post(&format!("{}/v1/chat/completions", router.address))
        .set("x-tenant", tenant)
        .send_json(chat("hi", 1))
    {
        Ok(r) => (r.status(), None),
        Err(ureq::Error::Status(code, r)) => (code, r.header("retry-after").map(str::to_owned)),
        Err(e) => panic!("{e}"),
    };
    assert_eq!(post("noisy").0, 200);
    assert_eq!(post("noisy").0, 200, "the burst is two");
    let (status, retry) = post("noisy");
    assert_eq!((status, retry.as_deref()), (429, Some("1")));
    assert_eq!(post("quiet").0, 200, "another tenant has no limit");
    let reserve = new_agent()
        .post(&format!("{}/v1/reserve", router.address))
        .send_json(
            json!({"model": "demo", "block_hashes": [1], "request_id": "r1",
                          "attributes": {"tenant": "noisy"}}),
        );
    assert!(
        matches!(reserve, Err(ureq::Error::Status(429, _))),
        "{reserve:?}"
    );
    // A refused request takes nothing from the bucket: polling does not hold it empty.
    eventually(
        "the noisy tenant's bucket refills (1 request/s)",
        Duration::from_secs(5),
        || post("noisy").0 == 200,
    );
    assert!(metric(&router.address, "switchyard_admission_rate_limited_total") >= 2.0);
}

/// `max_active_prefill_tokens` asks whether the worker has room for this request's
/// uncached prefill: the worker holding the prompt's prefix has room first (so requests
/// released from the queue keep their cache affinity), a prompt that fits nowhere waits,
/// and an idle worker takes any.
#[test]
fn the_prefill_threshold_counts_the_request_uncached_tokens() {
    use std::collections::HashSet;
    use switchyard::fleet::router::{RouteError, RouteRequest, Router, Saturated};
    use switchyard_plugin_sdk::WorkerId;
    let dir = tempfile::tempdir().unwrap();
    // Blocks of 16 tokens; at most 64 prefill tokens booked per worker.
    let yaml = "models:\n  m: {kv_tracking: predicted}\nadmission:\n  busy: {max_active_prefill_tokens: 64}\nworkers:\n  - {model: m, worker_id: 1}\n  - {model: m, worker_id: 2}\n";
    let router = Router::new(start_yaml(dir.path(), yaml).unwrap()).unwrap();
    let worker = |id| WorkerId {
        worker_id: id,
        dp_rank: 0,
    };
    let request = |id: &str, blocks: Vec<u64>, only: Option<u64>| RouteRequest {
        model: "m".into(),
        block_hashes: Some(blocks.into()),
        request_id: Some(id.into()),
        tracks_prefill_tokens: true,
        only: only.map(|w| Arc::new(HashSet::from_iter([worker(w)]))),
        ..Default::default()
    };
    // Worker 2 holds the prefix 1..=8; each worker has 48 tokens (3 blocks) booked.
    router.predict_cached("m", worker(2), &(1..=8).collect::<Vec<_>>());
    router
        .select_and_reserve(&request("a", vec![101, 102, 103], Some(1)))
        .unwrap();
    router
        .select_and_reserve(&request("b", vec![201, 202, 203], Some(2)))
        .unwrap();
    // 9 blocks, 8 cached on worker 2: 48 + 16 fits there, 48 + 144 does not on worker 1.
    let cached = router
        .select(&request("x", (1..=9).collect(), None))
        .unwrap();
    assert_eq!(cached.worker_id, 2, "{cached:?}");
    // 9 uncached blocks fit neither: the request waits.
    let cold = request("y", (301..=309).collect(), None);
    assert!(
        matches!(
            router.select(&cold),
            Err(RouteError::Saturated(Saturated::EveryCandidate { ref model })) if model == "m"
        ),
        "{:?}",
        router.select(&cold)
    );
    // Worker 1 idle: it takes any prompt.
    router.free("a").unwrap();
    assert_eq!(router.select(&cold).unwrap().worker_id, 1);
}

/// Strict priority: while a request of a higher priority waits, a lower one that would
/// find a worker queues behind it instead; one of the waiter's own priority may book.
#[test]
fn no_request_books_while_a_higher_priority_one_waits() {
    use switchyard::fleet::router::{RouteError, RouteRequest, Router, Saturated};
    use switchyard::plugin::PartitionKey;
    use switchyard_plugin_sdk::WorkerType;
    let dir = tempfile::tempdir().unwrap();
    let yaml =
        "admission:\n  busy: {max_active_requests: 8}\nworkers:\n  - {model: m, worker_id: 1}\n";
    let router = Router::new(start_yaml(dir.path(), yaml).unwrap()).unwrap();
    let request = |id: &str, priority: i32| RouteRequest {
        model: "m".into(),
        block_hashes: Some(vec![1, 2].into()),
        request_id: Some(id.into()),
        strict_priority: priority,
        ..Default::default()
    };
    let partition = PartitionKey::new("m", WorkerType::Select);
    let waiter = router
        .admission
        .queue
        .enqueue(&partition, 10, "", 1, 16, None)
        .unwrap();
    let low = router.select_and_reserve(&request("low", 0));
    assert!(
        matches!(
            low,
            Err(RouteError::Saturated(Saturated::Behind {
                ahead: 1,
                priority: 0,
                ..
            }))
        ),
        "{low:?}"
    );
    assert!(
        router.select(&request("dry", 0)).is_ok(),
        "a dry run is not held back"
    );
    router.select_and_reserve(&request("peer", 10)).unwrap();
    drop(waiter);
    router.select_and_reserve(&request("low", 0)).unwrap();
}

/// `max_active_decode_blocks`: a worker whose booked decode footprint reached it is no
/// candidate.
#[test]
fn the_decode_threshold_takes_a_full_worker_out() {
    use std::collections::HashSet;
    use switchyard::fleet::router::{RouteError, RouteRequest, Router};
    use switchyard_plugin_sdk::WorkerId;
    let dir = tempfile::tempdir().unwrap();
    let yaml = "admission:\n  busy: {max_active_decode_blocks: 10}\nworkers:\n  - {model: m, worker_id: 1}\n  - {model: m, worker_id: 2}\n";
    let router = Router::new(start_yaml(dir.path(), yaml).unwrap()).unwrap();
    let one = Some(Arc::new(HashSet::from_iter([WorkerId {
        worker_id: 1,
        dp_rank: 0,
    }])));
    let request = |id: &str, blocks: u64| RouteRequest {
        model: "m".into(),
        block_hashes: Some((0..blocks).collect()),
        request_id: Some(id.into()),
        ..Default::default()
    };
    router
        .select_and_reserve(&RouteRequest {
            only: one.clone(),
            ..request("big", 12)
        })
        .unwrap();
    for n in 0..3 {
        let decision = router.select(&request(&format!("r{n}"), 1)).unwrap();
        assert_eq!(decision.worker_id, 2, "worker 1 is full: {decision:?}");
    }
    let only_full = router.select_and_reserve(&RouteRequest {
        only: one,
        ..request("more", 1)
    });
    assert!(
        matches!(only_full, Err(RouteError::Saturated(_))),
        "{only_full:?}"
    );
}

/// `admission.busy` is a hard cap under concurrency: many threads select-and-reserve at
/// once on 2 workers of at most 2 requests each; each round books exactly 4 and refuses
/// the rest (a pick another thread filled between its selection and its booking is made
/// again, or refused), and no worker ever holds more than 2.
#[test]
fn concurrent_selections_never_book_a_worker_past_its_busy_threshold() {
    use std::sync::Barrier;
    use switchyard::fleet::router::{RouteError, RouteRequest, Router};
    let dir = tempfile::tempdir().unwrap();
    let yaml = "models:\n  m: {kv_tracking: predicted}\nadmission:\n  busy: {max_active_requests: 2}\nworkers:\n  - {model: m, worker_id: 1}\n  - {model: m, worker_id: 2}\n";
    let router = Arc::new(Router::new(start_yaml(dir.path(), yaml).unwrap()).unwrap());
    const THREADS: usize = 8;
    for round in 0..25 {
        let barrier = Arc::new(Barrier::new(THREADS));
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (router, barrier) = (router.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let request = RouteRequest {
                        model: "m".into(),
                        block_hashes: Some(vec![round * 100 + t as u64].into()),
                        request_id: Some(format!("r{round}-{t}")),
                        ..Default::default()
                    };
                    barrier.wait();
                    router.select_and_reserve(&request)
                })
            })
            .collect();
        let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let booked: Vec<&str> = results
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .filter_map(|d| d.request_id.as_deref())
            .collect();
        for refused in results.iter().filter_map(|r| r.as_ref().err()) {
            assert!(matches!(refused, RouteError::Saturated(_)), "{refused}");
        }
        let active = active_requests_of(&router);
        assert!(
            active.iter().all(|&a| a <= 2),
            "round {round}: a worker past its cap: {active:?}"
        );
        assert_eq!(booked.len(), 4, "round {round}: {active:?}");
        for id in booked {
            router.free(id).unwrap();
        }
    }
}

/// Active requests per worker, as the router's load accounting holds them.
fn active_requests_of(router: &switchyard::fleet::router::Router) -> Vec<u32> {
    router
        .loads()
        .iter()
        .map(|(_, load)| load.active_requests)
        .collect()
}

/// One chat request as `tenant`: its status and body (status 0: no answer).
fn as_tenant(base: &str, tenant: &str, content: &str, max_tokens: u32) -> (u16, String) {
    match new_agent()
        .post(&format!("{base}/v1/chat/completions"))
        .set("x-tenant", tenant)
        .send_json(chat(content, max_tokens))
    {
        Ok(r) => (r.status(), String::new()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => (0, e.to_string()),
    }
}

/// Fair shares (the default): a tenant that filled the queue cannot keep another out. The
/// quiet tenant's request takes the flood's latest place (that one is answered 429, saying
/// why), waits its turn, and is served.
#[test]
fn a_flooding_tenant_cannot_keep_a_quiet_one_out_of_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_sim("e0", "127.0.0.1:0", &["--decode-tps", "100"]);
    let yaml = format!(
        "request_attributes: {{tenant: ['header:x-tenant']}}\nadmission:\n  busy: {{max_active_requests: 1}}\n  queue: {{max_queued: 4, max_wait_ms: 60000}}\nworkers:\n{}",
        demo_workers([&engine], false)
    );
    let router = serve(&write_config(dir.path(), &yaml));
    let base = router.address.clone();
    let send = |tenant: &'static str, tokens: u32| {
        let base = base.clone();
        std::thread::spawn(move || as_tenant(&base, tenant, tenant, tokens))
    };
    // The worker is held (800 tokens at 100/s) while the flood fills the queue.
    let mut flood = vec![send("flood", 800)];
    wait_for("the first request booked", || active_requests(&base) == [1]);
    for i in 1..=4 {
        flood.push(send("flood", 10));
        wait_for("the flood queued", || {
            metric(&base, "switchyard_admission_waiting") == f64::from(i)
        });
    }
    let (status, body) = as_tenant(&base, "flood", "one more", 10);
    assert_eq!(status, 429, "the flood holds every place: {body}");
    assert!(body.contains("4 of them this tenant's"), "{body}");
    let quiet = send("quiet", 10);
    wait_for("the quiet request placed or refused", || {
        metric(&base, "switchyard_admission_evicted_total")
            + metric(&base, "switchyard_admission_refused_full_total")
            >= 2.0
    });
    assert_eq!(
        metric(&base, "switchyard_admission_evicted_total"),
        1.0,
        "the quiet tenant took a place of the flood's"
    );
    assert_eq!(metric(&base, "switchyard_admission_waiting"), 4.0);
    let (status, body) = quiet.join().unwrap();
    assert_eq!(status, 200, "the quiet tenant is served: {body}");
    let answers: Vec<(u16, String)> = flood.into_iter().map(|t| t.join().unwrap()).collect();
    let displaced: Vec<&(u16, String)> = answers.iter().filter(|(s, _)| *s != 200).collect();
    assert_eq!(displaced.len(), 1, "{answers:?}");
    assert_eq!(displaced[0].0, 429, "{answers:?}");
    assert!(
        displaced[0].1.contains("fair_share"),
        "says why: {answers:?}"
    );
}
