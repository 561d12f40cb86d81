//! The router's state, by owner. Each owner holds the locks of what it owns and nothing
//! else; `Router` composes them, holds no lock of its own, and writes the order in which
//! locks of different owners are taken (on `Router`, the one place it is written).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use parking_lot::{Mutex, RwLock};
use switchyard_plugin_sdk::WorkerId;

use super::State;
use crate::admission::AdmissionQueue;
use crate::generation::Generation;
use crate::kept_columns::FleetColumns;
use crate::kv_events::hash_agreement::EngineBlocks;
use crate::kv_events::subscriber::Subscription;
use crate::kv_index::KvIndex;
use crate::load_accounting::{BookingChange, LoadAccounting};
use crate::predicted_kv::PredictedKv;
use crate::rate_limits::RateLimiter;

/// The loaded config serving now, and the right to change it.
pub(super) struct Generations {
    /// The config's plugins and instances now serving; swapped whole by a reload.
    pub(super) serving: RwLock<Arc<Generation>>,
    /// Held while a generation gains partitions or is replaced: a new partition is never
    /// built into a generation that a reload is about to retire.
    pub(super) changing: Mutex<()>,
}

/// Membership: the workers, their partitions and their health.
pub(super) struct Membership {
    /// The worker registry (and so each partition's members).
    pub(super) state: RwLock<State>,
    /// Workers whose engine refused a connection: no probe brings them back before this.
    /// A leaf: never held while another lock is taken.
    pub(super) cooldown_until: Mutex<HashMap<WorkerId, Instant>>,
    /// Per unhealthy worker, why its last probe failed (shown by `GET /v1/workers`). A leaf.
    pub(super) health_errors: Mutex<HashMap<WorkerId, String>>,
    /// Every address the router's listeners answer on: no worker may point at one. A leaf.
    pub(super) own_addresses: RwLock<Vec<std::net::SocketAddr>>,
}

/// KV state: the index of which worker holds which blocks, the engines' events that
/// feed it, and the predictions that stand in for events.
pub(super) struct KvState {
    pub(super) index: RwLock<KvIndex>,
    /// Predicted mode's record of what each worker was sent. A leaf.
    pub(super) predicted: Mutex<PredictedKv>,
    /// Per worker, its engine's block hashes -> the router's (KV events from engines). A
    /// leaf.
    pub(super) engine_blocks: Mutex<HashMap<WorkerId, EngineBlocks>>,
    /// Per worker, its engine's KV-event subscription, stopped when it is dropped. A leaf.
    pub(super) subscriptions: Mutex<HashMap<WorkerId, Subscription>>,
    /// Workers whose events went past their KV budget (each logged once). A leaf.
    pub(super) overruns: Mutex<HashSet<WorkerId>>,
}

/// Bookings: load accounting, each partition's candidate columns kept in step with it,
/// and the feed that shares booking changes with other replicas.
pub(super) struct Bookings {
    pub(super) load: RwLock<LoadAccounting>,
    /// Each partition's candidate columns, kept as bookings and members change. Taken
    /// after `load` when taken with it.
    pub(super) columns: Mutex<FleetColumns>,
    /// Where this router's booking changes go when replicas share load (`replicas:`).
    pub(super) feed: OnceLock<tokio::sync::mpsc::Sender<BookingChange>>,
}

/// Admission: requests waiting while every worker of their partition is busy, and the
/// tenants' rate limits. (The busy thresholds and admitters are the generation's.)
pub struct Admission {
    /// Requests waiting while every candidate of their partition is busy (`admission:`).
    pub queue: AdmissionQueue,
    /// Per-tenant token buckets (`admission.rate_limits`).
    pub rate_limits: RateLimiter,
}

impl Bookings {
    pub(super) fn new(expiry: std::time::Duration) -> Bookings {
        Bookings {
            load: RwLock::new(LoadAccounting::new(expiry)),
            columns: Mutex::new(FleetColumns::default()),
            feed: OnceLock::new(),
        }
    }

    /// Changes bookings and, under the same lock, the kept columns of the workers whose
    /// load changed.
    pub(super) fn book<R>(&self, change: impl FnOnce(&mut LoadAccounting) -> R) -> R {
        let mut load = self.load.write();
        let result = change(&mut load);
        let mut columns = self.columns.lock();
        load.for_each_changed(|worker, now| columns.set_load(worker, now));
        result
    }
}

impl Default for Membership {
    fn default() -> Membership {
        Membership {
            state: RwLock::new(State {
                workers: crate::workers::Workers::default(),
            }),
            cooldown_until: Mutex::new(HashMap::new()),
            health_errors: Mutex::new(HashMap::new()),
            own_addresses: RwLock::new(Vec::new()),
        }
    }
}

impl Default for KvState {
    fn default() -> KvState {
        KvState {
            index: RwLock::new(KvIndex::default()),
            predicted: Mutex::new(PredictedKv::default()),
            engine_blocks: Mutex::new(HashMap::new()),
            subscriptions: Mutex::new(HashMap::new()),
            overruns: Mutex::new(HashSet::new()),
        }
    }
}
