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

/// A snapshot request, and its answers: every live booking of `replica`.
#[derive(Debug, Serialize, Deserialize)]
struct Snapshot {
    replica: String,
    bookings: Vec<BookingChange>,
}

/// Why sharing could not start.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    #[error("replicas.token_file {path}: {error}")]
    Token { path: String, error: std::io::Error },
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
    apply: std::sync::mpsc::Sender<Inbound>,
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

    /// This router's own bookings, read off the executor.
    async fn own_bookings(&self) -> Option<Snapshot> {
        let router = self.router.clone();
        let bookings = tokio::task::spawn_blocking(move || router.local_bookings())
            .await
            .ok()?;
        Some(Snapshot {
            replica: self.id.clone(),
            bookings,
        })
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

/// Starts sharing `router`'s load with the other replicas; returns this replica's id
/// once the others' bookings are in (or `snapshot_wait_ms` has passed). If the bus
/// cannot be reached, the router goes on alone and keeps trying.
pub async fn start(
    router: Arc<Router>,
    settings: ReplicaSettings,
    token_path: Option<std::path::PathBuf>,
) -> Result<String, ReplicaError> {
    let id = settings.id.clone().unwrap_or_else(default_id);
    let mut options = async_nats::ConnectOptions::new()
        .name(format!("switchyard {id}"))
        .retry_on_initial_connect()
        .connection_timeout(Duration::from_secs(2))
        .max_reconnects(None);
    if let Some(path) = &token_path {
        let token = std::fs::read_to_string(path).map_err(|error| ReplicaError::Token {
            path: path.display().to_string(),
            error,
        })?;
        options = options.token(token.trim().to_owned());
    }
    let (reconnected, mut reconnects) = tokio::sync::mpsc::unbounded_channel();
    let events_router = router.clone();
    options = options.event_callback(move |event| {
        let (router, reconnected) = (events_router.clone(), reconnected.clone());
        async move {
            let bus = &router.metrics.replicas.bus_up;
            match event {
                async_nats::Event::Connected => {
                    bus.store(1, Ordering::Relaxed);
                    tracing::info!("replicas: connected to the bus");
                    let _ = reconnected.send(());
                }
                async_nats::Event::Disconnected => {
                    bus.store(0, Ordering::Relaxed);
                    tracing::warn!("replicas: the bus is down; this replica routes on its own bookings until it is back");
                }
                other => tracing::debug!(event = %other, "replicas: bus event"),
            }
        }
    });
    let client = options
        .connect(&settings.nats)
        .await
        .map_err(|e| ReplicaError::Connect {
            url: settings.nats.clone(),
            error: e.to_string(),
        })?;

    let (apply, applied) = std::sync::mpsc::channel();
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
    let (feed, changes) = tokio::sync::mpsc::unbounded_channel();
    router.share_bookings(feed);
    tokio::spawn(publish_changes(shared.clone(), changes));
    tokio::spawn(receive(shared.clone(), bookings, heartbeats));
    tokio::spawn(answer_snapshots(shared.clone(), requests));
    tokio::spawn(heartbeat(shared.clone()));

    // The first `Connected` is the start; each later one, the bus coming back. Both ask
    // the others for their bookings; the first is awaited before serving.
    let first = tokio::time::timeout(
        Duration::from_millis(shared.settings.snapshot_wait_ms.max(1000)),
        reconnects.recv(),
    )
    .await;
    if first.is_ok() {
        exchange_snapshots(&shared).await;
    } else {
        tracing::warn!(nats = %shared.settings.nats, "replicas: the bus is not reachable; serving alone until it is");
    }
    tokio::spawn(async move {
        while reconnects.recv().await.is_some() {
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
            Inbound::Snapshot(Snapshot { replica, bookings }) => {
                router.replace_remote(&replica, &bookings);
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
    mut changes: tokio::sync::mpsc::UnboundedReceiver<BookingChange>,
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
    let counters = &shared.router.metrics.replicas;
    loop {
        tokio::select! {
            Some(message) = bookings.next() => {
                let Ok(changes) = serde_json::from_slice::<Changes>(&message.payload) else {
                    counters.malformed.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                if changes.replica == shared.id {
                    continue;
                }
                shared.heard(&changes.replica);
                counters.received.fetch_add(changes.changes.len() as u64, Ordering::Relaxed);
                let _ = shared.apply.send(Inbound::Changes(changes));
            }
            Some(message) = heartbeats.next() => {
                match serde_json::from_slice::<Hello>(&message.payload) {
                    Ok(hello) if hello.replica != shared.id => shared.heard(&hello.replica),
                    Ok(_) => {}
                    Err(_) => {
                        counters.malformed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            else => return,
        }
    }
}

/// Takes another replica's bookings from its snapshot request, and answers with this
/// router's.
async fn answer_snapshots(shared: Arc<Shared>, mut requests: async_nats::Subscriber) {
    while let Some(request) = requests.next().await {
        let Some(reply) = request.reply else { continue };
        let Ok(theirs) = serde_json::from_slice::<Snapshot>(&request.payload) else {
            shared
                .router
                .metrics
                .replicas
                .malformed
                .fetch_add(1, Ordering::Relaxed);
            continue;
        };
        if theirs.replica == shared.id {
            continue;
        }
        shared.heard(&theirs.replica);
        let _ = shared.apply.send(Inbound::Snapshot(theirs));
        let Some(ours) = shared.own_bookings().await else {
            continue;
        };
        if let Ok(payload) = serde_json::to_vec(&ours) {
            let _ = shared.client.publish(reply, Bytes::from(payload)).await;
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
    let Some(ours) = shared.own_bookings().await else {
        return;
    };
    let Ok(payload) = serde_json::to_vec(&ours) else {
        return;
    };
    if client
        .publish_with_reply(shared.subject("snapshot"), inbox, Bytes::from(payload))
        .await
        .is_err()
    {
        return;
    }
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(shared.settings.snapshot_wait_ms);
    let mut replicas = 0;
    while let Ok(Some(answer)) = tokio::time::timeout_at(deadline, answers.next()).await {
        let Ok(snapshot) = serde_json::from_slice::<Snapshot>(&answer.payload) else {
            shared
                .router
                .metrics
                .replicas
                .malformed
                .fetch_add(1, Ordering::Relaxed);
            continue;
        };
        shared.heard(&snapshot.replica);
        replicas += 1;
        let _ = shared.apply.send(Inbound::Snapshot(snapshot));
    }
    tracing::info!(
        replicas,
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
            let _ = shared.apply.send(Inbound::Lost(replica));
        }
    }
}
