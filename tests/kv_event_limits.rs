//! KV events from a publisher that does not play fair: a live message far over
//! `router.kv_events.max_frame_bytes`, a replay socket that never stops answering, one
//! batch of a million events. The "engine" here is a ZeroMQ peer written byte by byte on
//! loopback (ZMTP 3.0), so it can send what no real publisher would; the router is the
//! real `switchyard serve`. What is over a limit is dropped, counted and the router's
//! peak memory (VmHWM) stays within bounds a whole message would break. The subscriber
//! speaks ZMTP itself, so it is also checked against libzmq, the library vLLM's publisher
//! runs on (when the test venv, or python3, has pyzmq and msgpack).

mod support;

use support::*;
use switchyard::fleet::kv_events::wire::{encode, EngineEvent, EventForm, HashForm, StoredBlocks};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Writes one message of `frames`; a frame given as `Err(n)` is `n` zero bytes, written
/// in 1 MiB steps (the test never holds it).
async fn send(stream: &mut TcpStream, frames: &[Result<&[u8], u64>]) -> std::io::Result<()> {
    for (i, frame) in frames.iter().enumerate() {
        let more = u8::from(i + 1 < frames.len());
        let len = match frame {
            Ok(bytes) => bytes.len() as u64,
            Err(n) => *n,
        };
        let mut head = vec![more | 2];
        head.extend_from_slice(&len.to_be_bytes());
        stream.write_all(&head).await?;
        match frame {
            Ok(bytes) => stream.write_all(bytes).await?,
            Err(n) => {
                let zeros = vec![0u8; 1 << 20];
                let mut left = *n;
                while left > 0 {
                    let step = left.min(zeros.len() as u64) as usize;
                    stream.write_all(&zeros[..step]).await?;
                    left -= step as u64;
                }
            }
        }
    }
    stream.flush().await
}

/// Reads one message (commands skipped), its frames.
async fn receive(stream: &mut TcpStream) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    loop {
        let flags = stream.read_u8().await.unwrap();
        let len = if flags & 2 != 0 {
            stream.read_u64().await.unwrap()
        } else {
            u64::from(stream.read_u8().await.unwrap())
        };
        let mut frame = vec![0; len as usize];
        stream.read_exact(&mut frame).await.unwrap();
        if flags & 4 != 0 {
            continue;
        }
        frames.push(frame);
        if flags & 1 == 0 {
            return frames;
        }
    }
}

/// Accepts the router's connection on `listener` and greets it as a `socket_type`
/// socket; then reads its first message (the subscription, or the replay request).
async fn accept(listener: &TcpListener, socket_type: &str) -> (TcpStream, Vec<Vec<u8>>) {
    let (mut stream, _) = listener.accept().await.unwrap();
    let mut greeting = [0u8; 64];
    greeting[0] = 0xff;
    greeting[9] = 0x7f;
    greeting[10] = 3;
    greeting[12..16].copy_from_slice(b"NULL");
    stream.write_all(&greeting).await.unwrap();
    let mut ready = b"\x05READY\x0bSocket-Type".to_vec();
    ready.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    ready.extend_from_slice(socket_type.as_bytes());
    let mut command = vec![4, ready.len() as u8];
    command.extend_from_slice(&ready);
    stream.write_all(&command).await.unwrap();
    let mut theirs = [0u8; 64];
    stream.read_exact(&mut theirs).await.unwrap();
    let first = receive(&mut stream).await;
    (stream, first)
}

/// A batch storing one block of worker 1's (block size 16).
fn one_block() -> Vec<u8> {
    let stored = EngineEvent::Stored(StoredBlocks {
        block_hashes: vec![7],
        token_ids: (0..16).collect(),
        block_size: 16,
        ..Default::default()
    });
    encode(1.0, &[stored], Some(0), EventForm::Map, HashForm::Int)
}

/// The router's peak resident memory so far, in bytes.
fn peak_memory(router: &Process) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", router.pid())).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

/// A router following worker 1's events at `endpoint` (and `replay`), with the default
/// `router.kv_events` limits (16 MiB a message, 64 MiB a replay).
fn router(dir: &std::path::Path, endpoint: u16, replay: Option<u16>) -> Process {
    let replay = replay.map_or(String::new(), |port| {
        format!(", replay_endpoint: \"tcp://127.0.0.1:{port}\"")
    });
    let config = write_config(
        dir,
        &format!(
            "workers:\n  - {{model: demo, worker_id: 1, kv_events: {{endpoint: \"tcp://127.0.0.1:{endpoint}\"{replay}}}}}\n"
        ),
    );
    serve(&config)
}

const MIB: u64 = 1 << 20;

/// The sum over publishers of the counter `name` in the router's `/metrics`.
fn counter(router: &Process, name: &str) -> f64 {
    metric_sum(&router.address, name)
}

#[test]
fn a_live_message_over_the_limit_is_dropped_unkept_and_the_stream_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = runtime();
    let listener = runtime.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
    let port = listener.local_addr().unwrap().port();
    let router = router(dir.path(), port, None);
    let engine = runtime.spawn(async move {
        let (mut stream, _subscription) = accept(&listener, "PUB").await;
        let sequence = 0u64.to_be_bytes();
        // 160 MiB in one message: read past, never held.
        send(
            &mut stream,
            &[Ok(&b""[..]), Ok(&sequence[..]), Err(160 * MIB)],
        )
        .await
        .unwrap();
        send(
            &mut stream,
            &[Ok(&b""[..]), Ok(&sequence[..]), Ok(&one_block()[..])],
        )
        .await
        .unwrap();
        stream // kept open until the test ends
    });
    wait_for("the batch after the oversized message is applied", || {
        counter(&router, "switchyard_kv_events_applied_total") >= 1.0
    });
    assert_eq!(counter(&router, "switchyard_kv_event_oversized_total"), 1.0);
    let peak = peak_memory(&router);
    assert!(peak < 120 * MIB, "the router peaked at {} MiB", peak / MIB);
    drop(engine);
}

#[test]
fn a_replay_that_never_ends_is_given_up_at_max_replay_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = runtime();
    let live = runtime.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
    let replay = runtime.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
    let ports = (
        live.local_addr().unwrap().port(),
        replay.local_addr().unwrap().port(),
    );
    let router = router(dir.path(), ports.0, Some(ports.1));
    let publisher = runtime.spawn(async move { accept(&live, "PUB").await.0 });
    let flood = runtime.spawn(async move {
        let (mut stream, request) = accept(&replay, "ROUTER").await;
        assert_eq!(request.len(), 2, "[empty, start sequence]: {request:?}");
        // 1 MiB batches, at most 1 GiB of them, until the router hangs up: past the
        // 64 MiB replay limit (the router had 514 MB when it held them all).
        let mut sent = 0u64;
        for sequence in 0..1024u64 {
            let frames = [
                Ok(&b""[..]),
                Ok(&b""[..]),
                Ok(&sequence.to_be_bytes()[..]),
                Err(MIB),
            ];
            if send(&mut stream, &frames).await.is_err() {
                break;
            }
            sent += 1;
        }
        sent
    });
    wait_for("the replay is given up", || {
        counter(&router, "switchyard_kv_event_replays_oversized_total") >= 1.0
    });
    let sent = runtime.block_on(flood).unwrap();
    assert!(
        sent < 1024,
        "the router hung up on the flood ({sent} MiB sent)"
    );
    let peak = peak_memory(&router);
    assert!(peak < 160 * MIB, "the router peaked at {} MiB", peak / MIB);
    drop(publisher);
}

/// `[ts, [["AllBlocksCleared"] x n], 0]`, written directly: 18 bytes an event.
fn clears(n: u32) -> Vec<u8> {
    let mut payload = vec![0x93, 0xcb];
    payload.extend_from_slice(&2.0f64.to_be_bytes());
    payload.push(0xdd);
    payload.extend_from_slice(&n.to_be_bytes());
    for _ in 0..n {
        payload.extend_from_slice(b"\x91\xb0AllBlocksCleared");
    }
    payload.push(0);
    payload
}

#[test]
fn a_batch_of_800_000_events_costs_about_its_own_size() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = runtime();
    let listener = runtime.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
    let port = listener.local_addr().unwrap().port();
    let router = router(dir.path(), port, None);
    let (go, ready) = tokio::sync::oneshot::channel::<()>();
    let payload = clears(800_000);
    let size = payload.len() as u64;
    let engine = runtime.spawn(async move {
        let (mut stream, _subscription) = accept(&listener, "PUB").await;
        let first = [
            Ok(&b""[..]),
            Ok(&0u64.to_be_bytes()[..]),
            Ok(&one_block()[..]),
        ];
        send(&mut stream, &first).await.unwrap();
        ready.await.unwrap();
        let big = [Ok(&b""[..]), Ok(&1u64.to_be_bytes()[..]), Ok(&payload[..])];
        send(&mut stream, &big).await.unwrap();
        stream
    });
    wait_for("the first batch is applied", || {
        counter(&router, "switchyard_kv_events_applied_total") >= 1.0
    });
    let before = peak_memory(&router);
    go.send(()).unwrap();
    wait_for("the 800,000 clears are applied", || {
        counter(&router, "switchyard_kv_events_applied_total") >= 800_001.0
    });
    let grew = peak_memory(&router).saturating_sub(before);
    assert!(
        grew < 2 * size,
        "a batch of {} MiB raised the router's peak by {} MiB",
        size / MIB,
        grew / MIB
    );
    drop(engine);
}

/// The test venv's Python (scripts/install-test-tools puts pyzmq and msgpack there),
/// else the system's.
fn python() -> std::path::PathBuf {
    let venv = repo().join("target/test-venv/bin/python");
    if venv.exists() {
        venv
    } else {
        "python3".into()
    }
}

/// Whether that Python can import pyzmq and msgpack.
fn python_has_pyzmq() -> bool {
    std::process::Command::new(python())
        .args(["-c", "import zmq, msgpack"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

#[test]
fn a_libzmq_publisher_as_vllm_runs_it_is_followed_live_and_by_replay() {
    if !python_has_pyzmq() {
        eprintln!(
            "skipped: {} has no pyzmq and msgpack (scripts/install-test-tools installs them)",
            python().display()
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ports = (free_port(), free_port());
    let _engine = Process::start(
        std::process::Command::new(python())
            .arg(repo().join("tests/fixtures/kv_events/libzmq_publisher.py"))
            .args([ports.0.to_string(), ports.1.to_string()]),
        "publishing ",
    );
    let router = router(dir.path(), ports.0, Some(ports.1));
    wait_for("the six batches are applied", || {
        counter(&router, "switchyard_kv_events_applied_total") >= 6.0
    });
    assert!(counter(&router, "switchyard_kv_event_replays_total") >= 1.0);
    assert_eq!(
        counter(&router, "switchyard_kv_event_decode_errors_total"),
        0.0
    );
    assert_eq!(counter(&router, "switchyard_kv_event_oversized_total"), 0.0);
}
