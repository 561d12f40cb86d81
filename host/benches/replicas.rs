//! The NATS bus between replicas (`replicas:`): a real `nats-server` on loopback and two
//! routers in this process sharing load over it. Reports how long a booking made on one
//! takes to count on the other (p50 / p99 of 2,000, one at a time), and how many booking
//! changes a second one bus carries from one replica to another (reserve and free, as fast
//! as the router books them), beside what the same router books alone without a bus.
//!
//! `make bench-replicas` (or `cargo bench -p switchyard --bench replicas`). Needs
//! `nats-server` (`scripts/install-test-tools`). Loopback only; the server is killed when
//! the run ends.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard::config::ConfigSource;
use switchyard::fleet::router::{RouteRequest, Router};
use switchyard::startup::start;

struct Nats(Child);

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn router(nats_port: Option<u16>, id: &str) -> Arc<Router> {
    let replicas = nats_port
        .map(|p| {
            format!("replicas: {{nats: 'nats://127.0.0.1:{p}', id: {id}, snapshot_wait_ms: 200}}\n")
        })
        .unwrap_or_default();
    let yaml = format!("{replicas}workers:\n  - {{model: demo, worker_id: 1}}\n  - {{model: demo, worker_id: 2}}\n");
    let source = ConfigSource::parse(yaml, "<bench>".into(), std::path::PathBuf::new()).unwrap();
    Arc::new(Router::new(start(source).unwrap_or_else(|e| panic!("{e:?}"))).unwrap())
}

fn request(id: String) -> RouteRequest {
    RouteRequest {
        model: "demo".into(),
        block_hashes: Some(vec![1, 2, 3, 4].into()),
        request_id: Some(id),
        tracks_prefill_tokens: true,
        ..Default::default()
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e6
}

fn latency(a: &Router, b: &Router) {
    let mut latencies = Vec::new();
    for i in 0..2_000 {
        let id = format!("lat-{i}");
        let started = Instant::now();
        a.select_and_reserve(&request(id.clone())).unwrap();
        while b.remote_bookings() == 0 {
            std::hint::spin_loop();
        }
        latencies.push(started.elapsed());
        a.free(&id).unwrap();
        while b.remote_bookings() != 0 {
            std::hint::spin_loop();
        }
    }
    latencies.sort();
    println!(
        "a booking on replica A counted on replica B: p50 {:.0} us, p99 {:.0} us (2,000, one at a time)",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99)
    );
}

fn throughput(a: &Router, b: &Router) {
    let pairs = 100_000u64;
    let received = || {
        b.metrics
            .replicas
            .received
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = received();
    let started = Instant::now();
    for i in 0..pairs {
        let id = format!("tp-{i}");
        a.select_and_reserve(&request(id.clone())).unwrap();
        a.free(&id).unwrap();
    }
    let booked = started.elapsed();
    while received() < before + 2 * pairs {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "B received {} of {}",
            received() - before,
            2 * pairs
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let delivered = started.elapsed();
    let alone = router(None, "alone");
    let started = Instant::now();
    for i in 0..pairs {
        let id = format!("tp-{i}");
        alone.select_and_reserve(&request(id.clone())).unwrap();
        alone.free(&id).unwrap();
    }
    let booked_alone = started.elapsed();
    println!(
        "{pairs} reserve + free pairs: booked on A in {:.2} s ({:.0} changes/s; alone, without a bus: {:.2} s, ratio {:.2}); all {} on B after {:.2} s: {:.0} changes/s over one bus",
        booked.as_secs_f64(),
        2.0 * pairs as f64 / booked.as_secs_f64(),
        booked_alone.as_secs_f64(),
        booked_alone.as_secs_f64() / booked.as_secs_f64(),
        2 * pairs,
        delivered.as_secs_f64(),
        2.0 * pairs as f64 / delivered.as_secs_f64()
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let binary = ["/usr/sbin/nats-server", "/usr/bin/nats-server"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("nats-server: run scripts/install-test-tools");
    let _nats = Nats(
        Command::new(binary)
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(300));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let (a, b) = (router(Some(port), "a"), router(Some(port), "b"));
    runtime.block_on(async {
        for (r, id) in [(&a, "a"), (&b, "b")] {
            let settings = r
                .generation()
                .startup
                .source
                .config
                .replicas
                .clone()
                .unwrap();
            switchyard::fleet::replicas::start(r.clone(), settings, None)
                .await
                .unwrap();
            let _ = id;
        }
    });

    // Latency: one booking at a time, until the other replica counts it.
    latency(&a, &b);
    // Throughput: 100,000 reserve + free pairs on A as fast as it books them.
    throughput(&a, &b);
    drop(runtime);
}
