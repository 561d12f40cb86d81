//! Router replicas that share load over NATS (`replicas:`; docs/replicas.md).
//!
//! Each replica publishes the changes to its own bookings (reserve, prefill complete,
//! move, free, expiry) on `SUBJECT.bookings`, and counts every other replica's in its
//! workers' load. Only load crosses the bus: each replica learns KV state from the
//! engines' own event streams. Besides:
//!
//! - `SUBJECT.heartbeat`: every `heartbeat_ms`. A replica not heard from for
//!   `peer_ttl_ms` is gone, and its bookings are dropped.
//! - `SUBJECT.snapshot`: a replica that starts (or reconnects after the bus was down, or
//!   hears again from a replica it had given up on) sends all of its live bookings, and
//!   every other takes them and answers with all of its own; the asker waits
//!   `snapshot_wait_ms` for the answers before it serves. Both directions in one
//!   exchange: after an outage, whichever replica reconnects first, each ends with the
//!   other's bookings.
//!
//! Without the bus (down, or not up yet) a replica routes alone on its own bookings, and
//! says so in the log and in `switchyard_replica_bus_up`. Remote bookings also expire
//! like local ones (`router.request_expiry_secs`): a lost `free` cannot hold load forever.
//! Applying changes takes the load lock, so it runs on a thread of its own, never on the
//! async executor.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use switchyard_config::ReplicaSettings;

use crate::load_accounting::BookingChange;
use crate::router::Router;

/// Changes sent in one message at most.
const BATCH: usize = 256;
/// Bookings in one snapshot message at most: a part stays well under NATS's default
/// 1 MiB payload limit however many bookings a replica holds.
const SNAPSHOT_PART: usize = 2_000;
/// Changes queued for the bus, and received messages queued for the apply thread, at
/// most. Past it a change is dropped and counted (`direction="dropped"`): the bus is down
/// or slower than the router books; the snapshot exchange when it recovers, and expiry,
/// make the counts whole again.
pub const QUEUE: usize = 65_536;

/// What a replica publishes on `SUBJECT.bookings`.
#[derive(Debug, Serialize, Deserialize)]
struct Changes {
    replica: String,
    changes: Vec<BookingChange>,
}

/// `SUBJECT.heartbeat`.
#[derive(Debug, Serialize, Deserialize)]
struct Hello {
    replica: String,
}

/// A snapshot request, and its answers: the live bookings of `replica`, in parts of at
/// most `SNAPSHOT_PART`. The `first` part replaces what was known of `replica`, the others
/// add to it; a sender's parts go on one subject, so they arrive in order.
#[derive(Debug, Serialize, Deserialize)]
struct Snapshot {
    replica: String,
    first: bool,
    bookings: Vec<BookingChange>,
}

/// `replica`'s bookings as the snapshot messages that carry them (at least one).
fn snapshot_parts(replica: &str, bookings: &[BookingChange]) -> Vec<Bytes> {
    let mut chunks: Vec<&[BookingChange]> = bookings.chunks(SNAPSHOT_PART).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    chunks
        .into_iter()
        .enumerate()
        .filter_map(|(i, part)| {
            let part = Snapshot {
                replica: replica.to_owned(),
                first: i == 0,
                bookings: part.to_vec(),
            };
            serde_json::to_vec(&part).ok().map(Bytes::from)
        })
        .collect()
}

/// Why sharing could not start.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    #[error("replicas.token_file {path}: {error}")]
    Token {
        path: String,
        error: switchyard_plugin_host::file_gate::FileRefused,
    },
    #[error("replicas.nats {url}: {error}")]
    Connect { url: String, error: String },
}

/// What the apply thread is given.
enum Inbound {
    Changes(Changes),
    Snapshot(Snapshot),
    Lost(String),
}

struct Shared {
    router: Arc<Router>,
    settings: ReplicaSettings,
    id: String,
    /// Each other replica, when it was last heard from.
    peers: Mutex<HashMap<String, Instant>>,
    /// Replicas given up on (silent past `peer_ttl_ms`): heard again, they are asked
    /// for their bookings.
    lost: Mutex<std::collections::HashSet<String>>,
    client: async_nats::Client,
    apply: std::sync::mpsc::SyncSender<Inbound>,
}

impl Shared {
    fn subject(&self, name: &str) -> String {
        format!("{}.{name}", self.settings.subject)
    }

    fn heard(self: &Arc<Self>, replica: &str) {
        let known = self
            .peers
            .lock()
            .insert(replica.to_owned(), Instant::now())
            .is_some();
        if known {
            return;
        }
        if self.lost.lock().remove(replica) {
            // Its bookings were dropped when it went silent: exchange them again.
            tracing::info!(
                replica,
                "replicas: a replica given up on is back; exchanging bookings"
            );
            let shared = self.clone();
            tokio::spawn(async move { exchange_snapshots(&shared).await });
        } else {
            tracing::info!(replica, "replicas: a new replica on the bus");
        }
    }

    /// This router's own bookings, read off the executor, as snapshot parts.
    async fn own_snapshot(&self) -> Option<Vec<Bytes>> {
        let router = self.router.clone();
        let bookings = tokio::task::spawn_blocking(move || router.local_bookings())
            .await
            .ok()?;
        Some(snapshot_parts(&self.id, &bookings))
    }

    /// A message off the bus, decoded; one that does not decode is counted and dropped.
    fn decode<T: serde::de::DeserializeOwned>(&self, payload: &[u8]) -> Option<T> {
        let decoded = serde_json::from_slice(payload).ok();
        if decoded.is_none() {
            self.router
                .metrics
                .replicas
                .malformed
                .fetch_add(1, Ordering::Relaxed);
        }
        decoded
    }

    /// Queues `message` for the apply thread; dropped and counted when it is full.
    fn apply(&self, message: Inbound) {
        if self.apply.try_send(message).is_err() {
            self.router
                .metrics
                .replicas
                .dropped
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A name for this replica: the host's, the process id and a random suffix.
fn default_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "switchyard".to_owned());
    format!(
        "{host}-{}-{:04x}",
        std::process::id(),
        rand::random::<u16>()
    )
}

/// How this replica connects to the bus: its name, token, and the callback that tracks
/// the connection (`connected` is told at each `Connected`).
fn connect_options(
    id: &str,
    token_path: Option<&std::path::Path>,
    router: &Arc<Router>,
    connected: Arc<tokio::sync::Notify>,
) -> Result<async_nats::ConnectOptions, ReplicaError> {
    let mut options = async_nats::ConnectOptions::new()
        .name(format!("switchyard {id}"))
        .retry_on_initial_connect()
        .connection_timeout(Duration::from_secs(2))
        .max_reconnects(None);
    if let Some(path) = token_path {
        use switchyard_plugin_host::file_gate::{read_text, FileKind};
        let token = read_text(path, FileKind::Token).map_err(|error| ReplicaError::Token {
            path: path.display().to_string(),
            error,
        })?;
        options = options.token(token.trim().to_owned());
    }
    let (events_router, reconnected) = (router.clone(), connected);
    Ok(options.event_callback(move |event| {
        let (router, reconnected) = (events_router.clone(), reconnected.clone());
        async move {
            let bus = &router.metrics.replicas.bus_up;
            match event {
                async_nats::Event::Connected => {
                    bus.store(1, Ordering::Relaxed);
                    tracing::info!("replicas: connected to the bus");
                    reconnected.notify_one();
                }
                async_nats::Event::Disconnected => {
                    bus.store(0, Ordering::Relaxed);
                    tracing::warn!("replicas: the bus is down; this replica routes on its own bookings until it is back");
                }
                other => tracing::debug!(event = %other, "replicas: bus event"),
            }
        }
    }))
}

/// Starts sharing `router`'s load with the other replicas; returns this replica's id
/// once the others' bookings are in (or `snapshot_wait_ms` has passed). If the bus
/// cannot be reached, the router goes on alone and keeps trying.
pub async fn start(
    router: Arc<Router>,
    settings: ReplicaSettings,
    token_path: Option<std::path::PathBuf>,
) -> Result<String, ReplicaError> {
    let id = settings.id.clone().unwrap_or_else(default_id);
    // Told at each `Connected`: the first is the start, each later one the bus coming back.
    let connected = Arc::new(tokio::sync::Notify::new());
    let options = connect_options(&id, token_path.as_deref(), &router, connected.clone())?;
    let client = options
        .connect(&settings.nats)
        .await
        .map_err(|e| ReplicaError::Connect {
            url: settings.nats.clone(),
            error: e.to_string(),
        })?;

    let (apply, applied) = std::sync::mpsc::sync_channel(QUEUE);
    let shared = Arc::new(Shared {
        router: router.clone(),
        settings,
        id: id.clone(),
        peers: Mutex::new(HashMap::new()),
        lost: Mutex::new(std::collections::HashSet::new()),
        client: client.clone(),
        apply,
    });
    let apply_router = router.clone();
    std::thread::Builder::new()
        .name("replica-apply".into())
        .spawn(move || apply_forever(&apply_router, &applied))
        .map_err(|e| ReplicaError::Connect {
            url: shared.settings.nats.clone(),
            error: format!("cannot start the apply thread: {e}"),
        })?;

    let subscribe = |name: &str| {
        let (client, subject) = (client.clone(), shared.subject(name));
        async move { client.subscribe(subject).await }
    };
    let connect_error = |e: async_nats::SubscribeError| ReplicaError::Connect {
        url: shared.settings.nats.clone(),
        error: e.to_string(),
    };
    let bookings = subscribe("bookings").await.map_err(connect_error)?;
    let heartbeats = subscribe("heartbeat").await.map_err(connect_error)?;
    let requests = subscribe("snapshot").await.map_err(connect_error)?;

    // From here on this router's own changes queue for the bus.
    let (feed, changes) = tokio::sync::mpsc::channel(QUEUE);
    router.share_bookings(feed);
    tokio::spawn(publish_changes(shared.clone(), changes));
    tokio::spawn(receive(shared.clone(), bookings, heartbeats));
    tokio::spawn(answer_snapshots(shared.clone(), requests));
    tokio::spawn(heartbeat(shared.clone()));

    // The first `Connected` is the start; each later one, the bus coming back. Both ask
    // the others for their bookings; the first is awaited before serving.
    let first = tokio::time::timeout(
        Duration::from_millis(shared.settings.snapshot_wait_ms.max(1000)),
        connected.notified(),
    )
    .await;
    if first.is_ok() {
        exchange_snapshots(&shared).await;
    } else {
        tracing::warn!(nats = %shared.settings.nats, "replicas: the bus is not reachable; serving alone until it is");
    }
    tokio::spawn(async move {
        loop {
            connected.notified().await;
            exchange_snapshots(&shared).await;
        }
    });
    Ok(id)
}

/// Applies what came over the bus, in order, off the executor.
fn apply_forever(router: &Router, inbound: &std::sync::mpsc::Receiver<Inbound>) {
    while let Ok(message) = inbound.recv() {
        match message {
            Inbound::Changes(Changes { replica, changes }) => {
                for change in &changes {
                    router.apply_remote(&replica, change);
                }
            }
            Inbound::Snapshot(Snapshot {
                replica,
                first: true,
                bookings,
            }) => router.replace_remote(&replica, &bookings),
            Inbound::Snapshot(Snapshot {
                replica, bookings, ..
            }) => {
                for change in &bookings {
                    router.apply_remote(&replica, change);
                }
            }
            Inbound::Lost(replica) => {
                let dropped = router.drop_replica(&replica);
                tracing::warn!(
                    replica,
                    dropped,
                    "replicas: a replica went silent; its bookings are dropped"
                );
            }
        }
        let remote = router.remote_bookings() as u64;
        router
            .metrics
            .replicas
            .remote_bookings
            .store(remote, Ordering::Relaxed);
    }
}

/// Sends this router's changes, batched as they queue up.
async fn publish_changes(
    shared: Arc<Shared>,
    mut changes: tokio::sync::mpsc::Receiver<BookingChange>,
) {
    let subject = shared.subject("bookings");
    let mut batch = Vec::with_capacity(BATCH);
    while changes.recv_many(&mut batch, BATCH).await > 0 {
        let count = batch.len() as u64;
        let message = Changes {
            replica: shared.id.clone(),
            changes: std::mem::take(&mut batch),
        };
        let Ok(payload) = serde_json::to_vec(&message) else {
            continue;
        };
        // While the bus is down the client buffers, then refuses; the others drop this
        // replica's bookings meanwhile and take its snapshot when it is back.
        if shared
            .client
            .publish(subject.clone(), Bytes::from(payload))
            .await
            .is_ok()
        {
            shared
                .router
                .metrics
                .replicas
                .sent
                .fetch_add(count, Ordering::Relaxed);
        }
    }
}

/// Other replicas' changes and heartbeats.
async fn receive(
    shared: Arc<Shared>,
    mut bookings: async_nats::Subscriber,
    mut heartbeats: async_nats::Subscriber,
) {
    loop {
        tokio::select! {
            Some(message) = bookings.next() => {
                let Some(changes) = shared.decode::<Changes>(&message.payload) else { continue };
                if changes.replica == shared.id {
                    continue;
                }
                shared.heard(&changes.replica);
                let count = changes.changes.len() as u64;
                shared.router.metrics.replicas.received.fetch_add(count, Ordering::Relaxed);
                shared.apply(Inbound::Changes(changes));
            }
            Some(message) = heartbeats.next() => {
                if let Some(hello) = shared.decode::<Hello>(&message.payload) {
                    if hello.replica != shared.id {
                        shared.heard(&hello.replica);
                    }
                }
            }
            else => return,
        }
    }
}

/// Takes other replicas' snapshot parts; answers a first part that asks (it carries a
/// reply inbox) with this router's.
async fn answer_snapshots(shared: Arc<Shared>, mut requests: async_nats::Subscriber) {
    while let Some(request) = requests.next().await {
        let Some(theirs) = shared.decode::<Snapshot>(&request.payload) else {
            continue;
        };
        if theirs.replica == shared.id {
            continue;
        }
        shared.heard(&theirs.replica);
        shared.apply(Inbound::Snapshot(theirs));
        let Some(reply) = request.reply else { continue };
        let Some(parts) = shared.own_snapshot().await else {
            continue;
        };
        for part in parts {
            let _ = shared.client.publish(reply.clone(), part).await;
        }
    }
}

/// Sends this router's bookings to every other replica, and takes the answers that
/// arrive within `snapshot_wait_ms`.
async fn exchange_snapshots(shared: &Arc<Shared>) {
    let client = &shared.client;
    let inbox = client.new_inbox();
    let Ok(mut answers) = client.subscribe(inbox.clone()).await else {
        return;
    };
    let Some(parts) = shared.own_snapshot().await else {
        return;
    };
    let subject = shared.subject("snapshot");
    for (i, part) in parts.into_iter().enumerate() {
        // The first part asks for the others' bookings; the rest only carry ours.
        let sent = if i == 0 {
            client
                .publish_with_reply(subject.clone(), inbox.clone(), part)
                .await
        } else {
            client.publish(subject.clone(), part).await
        };
        if sent.is_err() {
            return;
        }
    }
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(shared.settings.snapshot_wait_ms);
    let mut parts = 0;
    while let Ok(Some(answer)) = tokio::time::timeout_at(deadline, answers.next()).await {
        let Some(snapshot) = shared.decode::<Snapshot>(&answer.payload) else {
            continue;
        };
        shared.heard(&snapshot.replica);
        parts += 1;
        shared.apply(Inbound::Snapshot(snapshot));
    }
    tracing::info!(
        parts,
        "replicas: bookings exchanged with the other replicas"
    );
}

/// Says this replica is alive; drops replicas that stopped saying so.
async fn heartbeat(shared: Arc<Shared>) {
    let every = Duration::from_millis(shared.settings.heartbeat_ms);
    let ttl = Duration::from_millis(shared.settings.peer_ttl_ms);
    let subject = shared.subject("heartbeat");
    let Ok(hello) = serde_json::to_vec(&Hello {
        replica: shared.id.clone(),
    }) else {
        return;
    };
    let hello = Bytes::from(hello);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let _ = shared.client.publish(subject.clone(), hello.clone()).await;
        let lost: Vec<String> = {
            let mut peers = shared.peers.lock();
            let lost = peers
                .iter()
                .filter(|(_, seen)| seen.elapsed() > ttl)
                .map(|(replica, _)| replica.clone())
                .collect::<Vec<_>>();
            for replica in &lost {
                peers.remove(replica);
            }
            shared.lost.lock().extend(lost.iter().cloned());
            shared
                .router
                .metrics
                .replicas
                .peers
                .store(peers.len() as u64, Ordering::Relaxed);
            lost
        };
        for replica in lost {
            shared
                .router
                .metrics
                .replicas
                .peers_lost
                .fetch_add(1, Ordering::Relaxed);
            shared.apply(Inbound::Lost(replica));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// However many bookings, a snapshot goes in parts under NATS's 1 MiB payload limit,
    /// the first replacing, the rest adding, nothing lost.
    #[test]
    fn snapshots_go_in_parts_under_the_payload_limit() {
        let bookings: Vec<BookingChange> = (0..4_500)
            .map(|i| BookingChange::Reserve {
                id: format!("a-long-request-id-from-some-gateway-{i:08}"),
                worker_id: i % 64,
                dp_rank: 0,
                prefill_tokens: 123_456,
                decode_blocks: 789,
                prefill_done: false,
            })
            .collect();
        let parts = snapshot_parts("replica-a", &bookings);
        assert_eq!(parts.len(), 3);
        let decoded: Vec<Snapshot> = parts
            .iter()
            .map(|p| {
                assert!(p.len() < 1 << 20, "a part of {} bytes", p.len());
                serde_json::from_slice(p).unwrap()
            })
            .collect();
        assert_eq!(
            decoded.iter().map(|s| s.first).collect::<Vec<_>>(),
            [true, false, false]
        );
        let all: Vec<&BookingChange> = decoded.iter().flat_map(|s| &s.bookings).collect();
        assert_eq!(all, bookings.iter().collect::<Vec<_>>());
        let empty = snapshot_parts("replica-a", &[]);
        assert_eq!(
            empty.len(),
            1,
            "no bookings: still one part, which replaces"
        );
    }
}
