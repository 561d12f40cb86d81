//! Router replicas sharing load over a real NATS server (`nats-server`, started and stopped
//! by the tests on loopback): every replica counts every replica's bookings, a joining
//! replica has them before it serves, a killed replica's bookings are dropped, and the bus
//! going down fails no request, sharing resuming when it is back.

mod support;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;

/// A `nats-server` on a loopback port; killed when dropped.
struct Nats {
    child: Child,
    port: u16,
}

fn nats_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SWITCHYARD_NATS_SERVER") {
        return path.into();
    }
    for candidate in [
        "/usr/sbin/nats-server",
        "/usr/bin/nats-server",
        "/usr/local/bin/nats-server",
    ] {
        if std::path::Path::new(candidate).exists() {
            return candidate.into();
        }
    }
    panic!(
        "no nats-server: apt-get install nats-server (.ci/run does), or set SWITCHYARD_NATS_SERVER"
    )
}

impl Nats {
    fn start(port: u16) -> Nats {
        let mut child = Command::new(nats_binary())
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("nats-server starts");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        loop {
            let line = lines.next().expect("nats-server says it is ready").unwrap();
            if line.contains("Server is ready") {
                break;
            }
        }
        std::thread::spawn(move || for _ in lines {});
        Nats { child, port }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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
    let workers: Value = ureq::get(&format!("{base}/v1/workers"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    workers
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["load"]["active_requests"].as_u64().unwrap())
        .collect()
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(25));
    }
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
        wait_for("A's booking seen", Duration::from_secs(5), || {
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
        wait_for("every booking everywhere", Duration::from_secs(5), || {
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
        wait_for("A's free seen", Duration::from_secs(5), || {
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
        wait_for("A's second booking seen", Duration::from_secs(5), || {
            active(&replica.address).iter().sum::<u64>() == 3
        });
    }
    a.kill();
    for replica in [&b, &c, &d] {
        wait_for("A's bookings dropped", Duration::from_secs(10), || {
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
    wait_for("shared while the bus is up", Duration::from_secs(5), || {
        active(&b.address).iter().sum::<u64>() == 1
    });
    assert_eq!(metric(&b.address, "switchyard_replica_bus_up"), 1.0);

    drop(nats);
    wait_for("B notices the bus is down", Duration::from_secs(10), || {
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
    wait_for("B alone", Duration::from_secs(10), || {
        active(&b.address).iter().sum::<u64>() == 1
    });

    let _nats = Nats::start(port);
    for replica in [&a, &b] {
        wait_for("reconnected", Duration::from_secs(30), || {
            metric(&replica.address, "switchyard_replica_bus_up") == 1.0
        });
    }
    // The exchange after the outage: each has the other's bookings, made before or during it.
    for replica in [&a, &b] {
        wait_for(
            "bookings exchanged after the outage",
            Duration::from_secs(10),
            || active(&replica.address).iter().sum::<u64>() == 2,
        );
    }
}
