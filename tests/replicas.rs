//! Router replicas sharing load over a real NATS server (`nats-server`, started and stopped
//! by the tests on loopback): every replica counts every replica's bookings, a joining
//! replica has them before it serves, a killed replica's bookings are dropped, and the bus
//! going down fails no request, sharing resuming when it is back.

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use support::nats::Nats;
use support::real_envoy::{envoy_config, Envoy};
use support::*;

fn config(dir: &std::path::Path, nats: u16, id: &str) -> PathBuf {
    let path = dir.join(format!("{id}.yaml"));
    std::fs::write(
        &path,
        format!("replicas: {{nats: 'nats://127.0.0.1:{nats}', id: {id}, heartbeat_ms: 100, peer_ttl_ms: 800, snapshot_wait_ms: 300}}\nworkers:\n  - {{model: demo, worker_id: 1}}\n  - {{model: demo, worker_id: 2}}\n"),
    )
    .unwrap();
    path
}

fn replica(dir: &std::path::Path, nats: u16, id: &str) -> Process {
    serve(&config(dir, nats, id))
}

fn post(base: &str, path: &str, body: Value) -> (u16, Value) {
    match ureq::post(&format!("{base}{path}")).send_json(body) {
        Ok(r) | Err(ureq::Error::Status(_, r)) => {
            (r.status(), r.into_json().unwrap_or(Value::Null))
        }
        Err(e) => panic!("POST {path}: {e}"),
    }
}

fn reserve(base: &str, id: &str) -> u64 {
    let (status, decision) = post(
        base,
        "/v1/reserve",
        json!({"model": "demo", "request_id": id, "block_hashes": [1]}),
    );
    assert_eq!(status, 200, "{decision}");
    decision["worker_id"].as_u64().unwrap()
}

/// Active requests per worker id, as `GET /v1/workers` of `base` counts them.
fn active(base: &str) -> Vec<u64> {
    active_requests(base)
}

fn metric(base: &str, name: &str) -> f64 {
    let text = ureq::get(&format!("{base}/metrics"))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn replicas_count_each_others_bookings_a_joiner_has_them_and_a_killed_one_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let nats = Nats::start(free_port());
    let mut a = replica(dir.path(), nats.port, "a");
    let b = replica(dir.path(), nats.port, "b");
    let c = replica(dir.path(), nats.port, "c");

    // A books one request; B and C count it, and B's least-busy choice goes elsewhere.
    let booked = reserve(&a.address, "a-1");
    for other in [&b, &c] {
        eventually("A's booking seen", Duration::from_secs(5), || {
            active(&other.address).iter().sum::<u64>() == 1
        });
    }
    let (_, picked) = post(
        &b.address,
        "/v1/select",
        json!({"model": "demo", "block_hashes": [1]}),
    );
    assert_ne!(
        picked["worker_id"].as_u64().unwrap(),
        booked,
        "B routes around A's booking: {picked}"
    );
    reserve(&b.address, "b-1");
    reserve(&c.address, "c-1");
    for replica in [&a, &b, &c] {
        eventually("every booking everywhere", Duration::from_secs(5), || {
            active(&replica.address).iter().sum::<u64>() == 3
        });
    }
    // Spread: with every replica's bookings counted, neither worker takes all three.
    assert!(
        active(&a.address).iter().all(|&n| n <= 2),
        "{:?}",
        active(&a.address)
    );

    // Freed on A: gone everywhere.
    assert_eq!(post(&a.address, "/v1/requests/a-1/free", json!({})).0, 200);
    for replica in [&b, &c] {
        eventually("A's free seen", Duration::from_secs(5), || {
            active(&replica.address).iter().sum::<u64>() == 2
        });
    }

    // A replica that joins now has the others' bookings when it announces itself.
    let d = replica(dir.path(), nats.port, "d");
    assert_eq!(
        active(&d.address).iter().sum::<u64>(),
        2,
        "the snapshot arrives before D serves"
    );

    // A is killed with a booking: after peer_ttl_ms the others drop it.
    reserve(&a.address, "a-2");
    for replica in [&b, &c, &d] {
        eventually("A's second booking seen", Duration::from_secs(5), || {
            active(&replica.address).iter().sum::<u64>() == 3
        });
    }
    a.kill();
    for replica in [&b, &c, &d] {
        eventually("A's bookings dropped", Duration::from_secs(10), || {
            active(&replica.address).iter().sum::<u64>() == 2
        });
        assert!(metric(&replica.address, "switchyard_replica_peers_lost") >= 1.0);
    }
}

#[test]
fn the_bus_going_down_fails_no_request_and_sharing_resumes_when_it_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let nats = Nats::start(port);
    let a = replica(dir.path(), port, "a");
    let b = replica(dir.path(), port, "b");
    reserve(&a.address, "before");
    eventually("shared while the bus is up", Duration::from_secs(5), || {
        active(&b.address).iter().sum::<u64>() == 1
    });
    assert_eq!(metric(&b.address, "switchyard_replica_bus_up"), 1.0);

    drop(nats);
    eventually("B notices the bus is down", Duration::from_secs(10), || {
        metric(&b.address, "switchyard_replica_bus_up") == 0.0
    });
    // Routing goes on, alone: every request answered.
    for i in 0..20 {
        reserve(&b.address, &format!("down-{i}"));
        post(
            &b.address,
            &format!("/v1/requests/down-{i}/free"),
            json!({}),
        );
    }
    reserve(&b.address, "during");
    // A's booking is dropped on B once A is silent for peer_ttl_ms.
    eventually("B alone", Duration::from_secs(10), || {
        active(&b.address).iter().sum::<u64>() == 1
    });

    let _nats = Nats::start(port);
    for replica in [&a, &b] {
        eventually("reconnected", Duration::from_secs(30), || {
            metric(&replica.address, "switchyard_replica_bus_up") == 1.0
        });
    }
    // The exchange after the outage: each has the other's bookings, made before or during it.
    for replica in [&a, &b] {
        eventually(
            "bookings exchanged after the outage",
            Duration::from_secs(10),
            || active(&replica.address).iter().sum::<u64>() == 2,
        );
    }
}

/// Waits (20 s at most) until a request through Envoy is answered.
fn until_envoy_routes(agent: &ureq::Agent, url: &str) {
    eventually("Envoy routes", Duration::from_secs(20), || {
        agent.post(url).send_json(json!({"model": "demo", "max_tokens": 1, "messages": [{"role": "user", "content": "ready?"}]})).is_ok()
    });
}

/// A replica per picker port, sharing load over the NATS server at `nats`.
fn picker_replicas(
    dir: &std::path::Path,
    pickers: &[u16],
    nats: u16,
    workers: &str,
) -> Vec<Process> {
    pickers
        .iter()
        .enumerate()
        .map(|(i, port)| {
            let config = dir.join(format!("r{i}.yaml"));
            std::fs::write(&config, format!(
                "replicas: {{nats: 'nats://127.0.0.1:{}', id: r{i}, heartbeat_ms: 100, peer_ttl_ms: 800}}\n\
                 frontend: {{health_interval_ms: 100}}\nworkers:\n{workers}", nats)).unwrap();
            Process::start(
                Command::new(switchyard_bin())
                    .args(["serve", "--listen", "127.0.0.1:0", "--ext-proc", &format!("127.0.0.1:{port}"), "--config"])
                    .arg(&config)
                    .env("RUST_LOG", "warn"),
                "switchyard listening on ",
            )
        })
        .collect()
}

/// A real Envoy on docs/envoy.md's config, its picker cluster given every picker port.
fn envoy_with_pickers(dir: &std::path::Path, pickers: &[u16]) -> Envoy {
    let listen = free_port();
    let first = format!(
        "socket_address: {{ address: 127.0.0.1, port_value: {} }}",
        pickers[0]
    );
    let more: String = pickers[1..]
        .iter()
        .map(|p| format!("\n              - endpoint:\n                  address:\n                    socket_address: {{ address: 127.0.0.1, port_value: {p} }}"))
        .collect();
    let config = envoy_config(listen, pickers[0]).replace(&first, &format!("{first}{more}"));
    Envoy::start_with(dir, listen, &config)
}

/// Three replicas as the ext_proc cluster of one real Envoy (its config docs/envoy.md's,
/// with three picker endpoints), in front of two slow `engine-sim` engines. Envoy spreads
/// the streams over the pickers; each picker counts the others' bookings, so the engines
/// get equal shares. A replica killed mid-run: only streams it was picking for may fail;
/// the others drop its bookings, and every booking is gone at the end.
#[test]
fn three_replicas_behind_a_real_envoy_share_load_and_survive_one_killed() {
    let dir = tempfile::tempdir().unwrap();
    let nats = Nats::start(free_port());
    let engines: Vec<Process> = (0..2)
        .map(|i| engine_sim(&format!("e{i}"), "127.0.0.1:0", &["--decode-tps", "25"]))
        .collect();
    let workers = demo_workers(engines.iter(), true);
    let pickers: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut replicas = picker_replicas(dir.path(), &pickers, nats.port, &workers);
    // docs/envoy.md's config, its picker cluster given all three endpoints.
    let envoy = envoy_with_pickers(dir.path(), &pickers);
    let url = format!("{}/v1/chat/completions", envoy.base);
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(30))
        .build();
    until_envoy_routes(&agent, &url);

    // Eight long streams (50 tokens at 25 tokens/s), started 50 ms apart.
    let long = |i: usize| json!({"model": "demo", "stream": true, "max_tokens": 50, "messages": [{"role": "user", "content": format!("long stream {i}")}]});
    let mut streams = Vec::new();
    for i in 0..8 {
        let (url, agent, body) = (url.clone(), agent.clone(), long(i));
        streams.push(std::thread::spawn(move || post_json(&agent, &url, &body)));
        // The streams start 50 ms apart, as clients' do; the counts below are awaited.
        pacing::pace(Duration::from_millis(50));
    }
    // Every replica counts all eight, whichever picked them.
    for replica in &replicas {
        eventually(
            "all eight bookings on every replica",
            Duration::from_secs(5),
            || active(&replica.address).iter().sum::<u64>() == 8,
        );
    }
    let per_worker = active(&replicas[1].address);
    assert_eq!(
        per_worker,
        vec![4, 4],
        "the engines share the streams equally"
    );
    let picked_by: Vec<f64> = replicas
        .iter()
        .map(|r| metric(&r.address, "switchyard_ext_proc_picks"))
        .collect();
    assert!(
        picked_by.iter().filter(|&&p| p > 0.0).count() >= 2,
        "Envoy spread the streams over the pickers: {picked_by:?}"
    );

    // Replica 0 killed mid-run.
    replicas[0].kill();
    let answers: Vec<_> = streams.into_iter().map(|s| s.join().unwrap()).collect();
    let complete = answers
        .iter()
        .filter(|(status, _, body)| *status == 200 && body.trim_end().ends_with("data: [DONE]"))
        .count();
    let killed_picks = picked_by[0] as usize;
    assert!(complete >= 8 - killed_picks, "only streams the killed replica picked may fail: {complete} of 8 complete, it picked {killed_picks}");
    for replica in &replicas[1..] {
        eventually("no booking left", Duration::from_secs(10), || {
            active(&replica.address).iter().sum::<u64>() == 0
        });
    }
    // New requests still route, through the two replicas left. Envoy's health check takes
    // a few seconds to eject the dead picker; a request sent to it meanwhile fails
    // (failure_mode_allow: false): wait until one routes.
    until_envoy_routes(&agent, &url);
    let mut routed = 0;
    for i in 0..6 {
        let after = json!({"model": "demo", "max_tokens": 2, "messages": [{"role": "user", "content": format!("after {i}")}]});
        let (status, _, body) = post_json(&agent, &url, &after);
        if status != 200 {
            continue;
        }
        assert!(body.contains("choices"), "{body}");
        routed += 1;
    }
    assert!(routed >= 2, "the two replicas left route: {routed} of 6");
}

/// Three replicas behind their OpenAI frontends, a client spreading streams over them
/// round robin, two slow engines: each replica counts every stream, the engines share
/// them equally; a replica killed mid-run fails only its own clients' streams.
#[test]
fn three_frontend_replicas_spread_by_a_client_share_load_and_survive_one_killed() {
    let dir = tempfile::tempdir().unwrap();
    let nats = Nats::start(free_port());
    let engines: Vec<Process> = (0..2)
        .map(|i| engine_sim(&format!("e{i}"), "127.0.0.1:0", &["--decode-tps", "25"]))
        .collect();
    let workers = demo_workers(engines.iter(), false);
    let mut replicas: Vec<Process> = (0..3)
        .map(|i| {
            let config = dir.path().join(format!("f{i}.yaml"));
            std::fs::write(&config, format!("replicas: {{nats: 'nats://127.0.0.1:{}', id: f{i}, heartbeat_ms: 100, peer_ttl_ms: 800}}\nworkers:\n{workers}", nats.port)).unwrap();
            serve(&config)
        })
        .collect();
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(30))
        .build();
    let mut streams = Vec::new();
    for i in 0..9 {
        let url = format!("{}/v1/chat/completions", replicas[i % 3].address);
        let agent = agent.clone();
        let body = json!({"model": "demo", "stream": true, "max_tokens": 50, "messages": [{"role": "user", "content": format!("spread {i}")}]});
        streams.push(std::thread::spawn(move || {
            let (status, _, body) = post_json(&agent, &url, &body);
            (status, body)
        }));
        // The streams start 50 ms apart, as clients' do; the counts below are awaited.
        pacing::pace(Duration::from_millis(50));
    }
    for replica in &replicas {
        eventually(
            "all nine bookings on every replica",
            Duration::from_secs(5),
            || active(&replica.address).iter().sum::<u64>() == 9,
        );
    }
    let mut shares = active(&replicas[2].address);
    shares.sort();
    assert_eq!(shares, vec![4, 5], "the engines share the streams");
    replicas[0].kill();
    let answers: Vec<_> = streams.into_iter().map(|s| s.join().unwrap()).collect();
    for (i, (status, body)) in answers.iter().enumerate() {
        if i % 3 != 0 {
            assert_eq!(
                *status, 200,
                "stream {i}, on a replica left running: {body}"
            );
            assert!(
                body.trim_end().ends_with("data: [DONE]"),
                "stream {i} was cut: {body}"
            );
        }
    }
    for replica in &replicas[1..] {
        eventually("no booking left", Duration::from_secs(10), || {
            active(&replica.address).iter().sum::<u64>() == 0
        });
    }
}
