//! Load accounting: what each worker has been booked for by select-and-reserve.
//!
//! A booking holds the prefill tokens the worker must compute (not covered by its cache),
//! the decode blocks the request will occupy, and one active request. prefill-complete
//! releases the prefill part; free releases the rest. Bookings never freed expire. Every
//! release subtracts exactly what its booking added, once, so counts cannot go negative
//! whatever order calls arrive in.
//!
//! Bookings of other router replicas (`replicas:`, learnt over the bus) are held beside
//! this router's own, keyed by replica: they count in every worker's load the same way,
//! and are dropped whole when their replica goes away.

use rustc_hash::FxHashMap;
use std::time::{Duration, Instant};

use switchyard_plugin_sdk::WorkerId;

/// Active load on one worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerLoad {
    pub active_prefill_tokens: u64,
    pub active_decode_blocks: u64,
    pub active_requests: u32,
}

/// What one reserved request holds on its worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Booking {
    pub worker: WorkerId,
    pub prefill_tokens: u64,
    pub decode_blocks: u64,
    pub prefill_done: bool,
    booked_at: Instant,
}

impl Booking {
    /// A booking as another replica reported it.
    pub fn remote(
        worker: WorkerId,
        prefill_tokens: u64,
        decode_blocks: u64,
        prefill_done: bool,
    ) -> Self {
        Booking {
            worker,
            prefill_tokens,
            decode_blocks,
            prefill_done,
            booked_at: Instant::now(),
        }
    }
}

/// One change to this router's bookings, as replicas tell each other (JSON on the bus).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum BookingChange {
    Reserve {
        id: String,
        worker_id: u64,
        dp_rank: u32,
        prefill_tokens: u64,
        decode_blocks: u64,
        #[serde(default)]
        prefill_done: bool,
    },
    PrefillComplete {
        id: String,
    },
    Move {
        id: String,
        worker_id: u64,
        dp_rank: u32,
    },
    Free {
        id: String,
    },
}

impl BookingChange {
    /// The `Reserve` that recreates `booking` (a snapshot's entry).
    pub fn reserve(id: &str, booking: &Booking) -> Self {
        BookingChange::Reserve {
            id: id.to_owned(),
            worker_id: booking.worker.worker_id,
            dp_rank: booking.worker.dp_rank,
            prefill_tokens: booking.prefill_tokens,
            decode_blocks: booking.decode_blocks,
            prefill_done: booking.prefill_done,
        }
    }
}

impl LoadAccounting {
    /// Applies another replica's change to its bookings here.
    pub fn apply_remote(&mut self, replica: &str, change: &BookingChange) {
        match change {
            BookingChange::Reserve {
                id,
                worker_id,
                dp_rank,
                prefill_tokens,
                decode_blocks,
                prefill_done,
            } => {
                let worker = WorkerId {
                    worker_id: *worker_id,
                    dp_rank: *dp_rank,
                };
                self.reserve_remote(
                    replica,
                    id,
                    Booking::remote(worker, *prefill_tokens, *decode_blocks, *prefill_done),
                );
            }
            BookingChange::PrefillComplete { id } => self.prefill_remote(replica, id),
            BookingChange::Move {
                id,
                worker_id,
                dp_rank,
            } => {
                self.move_remote(
                    replica,
                    id,
                    WorkerId {
                        worker_id: *worker_id,
                        dp_rank: *dp_rank,
                    },
                );
            }
            BookingChange::Free { id } => self.free_remote(replica, id),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AccountingError {
    #[error("request `{0}` is already reserved; free it first or use another request id")]
    AlreadyReserved(String),
    #[error("no reserved request `{0}` (never reserved, already freed, or expired)")]
    UnknownRequest(String),
    /// Its worker left the fleet (`DELETE /v1/workers`, a pod that left) while the request
    /// ran: its booking went with the worker. Expected once per such request, not a fault.
    #[error("request `{0}`: its worker left the fleet, and its booking with it")]
    WorkerLeft(String),
}

/// A map by request id (or replica id): ids a client (`x-request-id`) or a replica on the
/// bus chooses, so their hash is keyed at random per process. An unkeyed hash (FxHash)
/// lets crafted ids collide and turns each booking's insert and free into a scan of
/// every colliding booking.
type ById<V> = std::collections::HashMap<String, V, ahash::RandomState>;

pub struct LoadAccounting {
    workers: FxHashMap<WorkerId, WorkerLoad>,
    bookings: ById<Booking>,
    /// Other replicas' bookings, by replica, then request id.
    remote: ById<ById<Booking>>,
    /// Bookings dropped with their worker (`remove_worker`), by request id, with when they
    /// were made: their requests still end (and free) later, which is then expected, not
    /// a lost booking. Bounded as the bookings were; `expire` forgets them.
    left: ById<Instant>,
    expiry: Duration,
    /// Workers whose load changed since `for_each_changed` (repeats possible).
    changed: Vec<WorkerId>,
}

impl LoadAccounting {
    pub fn new(expiry: Duration) -> Self {
        LoadAccounting {
            workers: FxHashMap::default(),
            bookings: ById::default(),
            remote: ById::default(),
            left: ById::default(),
            expiry,
            changed: Vec::new(),
        }
    }

    pub fn load(&self, worker: WorkerId) -> WorkerLoad {
        self.workers.get(&worker).copied().unwrap_or_default()
    }

    /// Books `request_id` on `worker`.
    pub fn reserve(
        &mut self,
        request_id: &str,
        worker: WorkerId,
        prefill_tokens: u64,
        decode_blocks: u64,
    ) -> Result<(), AccountingError> {
        if self.bookings.contains_key(request_id) {
            return Err(AccountingError::AlreadyReserved(request_id.to_owned()));
        }
        let booking = Booking {
            worker,
            prefill_tokens,
            decode_blocks,
            prefill_done: false,
            booked_at: Instant::now(),
        };
        self.hold(&booking);
        self.bookings.insert(request_id.to_owned(), booking);
        Ok(())
    }

    /// Moves the request from prefill to decode: its prefill tokens are released.
    pub fn prefill_complete(&mut self, request_id: &str) -> Result<Booking, AccountingError> {
        let Some(booking) = self.bookings.get_mut(request_id) else {
            return Err(self.missing(request_id, false));
        };
        if !booking.prefill_done {
            booking.prefill_done = true;
            self.changed.push(booking.worker);
            let load = self.workers.entry(booking.worker).or_default();
            load.active_prefill_tokens = load
                .active_prefill_tokens
                .saturating_sub(booking.prefill_tokens);
        }
        Ok(*booking)
    }

    /// Moves a booking to another worker (the request was served elsewhere, e.g. after a
    /// gateway's retry): what it holds is released on the old worker and held on the new.
    pub fn move_booking(&mut self, request_id: &str, to: WorkerId) -> Result<(), AccountingError> {
        let Some(&booking) = self.bookings.get(request_id) else {
            return Err(self.missing(request_id, false));
        };
        if booking.worker == to {
            return Ok(());
        }
        self.release(&booking);
        self.hold(&Booking {
            worker: to,
            ..booking
        });
        if let Some(moved) = self.bookings.get_mut(request_id) {
            moved.worker = to;
        }
        Ok(())
    }

    /// Releases everything the request holds.
    pub fn free(&mut self, request_id: &str) -> Result<Booking, AccountingError> {
        let Some(booking) = self.bookings.remove(request_id) else {
            return Err(self.missing(request_id, true));
        };
        self.release(&booking);
        Ok(booking)
    }

    /// Why `request_id` has no booking: its worker left (forgotten when `ended`), or it
    /// is unknown.
    fn missing(&mut self, request_id: &str, ended: bool) -> AccountingError {
        let left = if ended {
            self.left.remove(request_id).is_some()
        } else {
            self.left.contains_key(request_id)
        };
        if left {
            AccountingError::WorkerLeft(request_id.to_owned())
        } else {
            AccountingError::UnknownRequest(request_id.to_owned())
        }
    }

    /// Adds what `booking` holds to its worker's load (`release` takes it off).
    fn hold(&mut self, booking: &Booking) {
        self.changed.push(booking.worker);
        let load = self.workers.entry(booking.worker).or_default();
        if !booking.prefill_done {
            load.active_prefill_tokens = load
                .active_prefill_tokens
                .saturating_add(booking.prefill_tokens);
        }
        load.active_decode_blocks = load
            .active_decode_blocks
            .saturating_add(booking.decode_blocks);
        load.active_requests = load.active_requests.saturating_add(1);
    }

    fn release(&mut self, booking: &Booking) {
        self.changed.push(booking.worker);
        let load = self.workers.entry(booking.worker).or_default();
        if !booking.prefill_done {
            load.active_prefill_tokens = load
                .active_prefill_tokens
                .saturating_sub(booking.prefill_tokens);
        }
        load.active_decode_blocks = load
            .active_decode_blocks
            .saturating_sub(booking.decode_blocks);
        load.active_requests = load.active_requests.saturating_sub(1);
    }

    /// Frees bookings older than the expiry; returns their request ids.
    pub fn expire(&mut self, now: Instant) -> Vec<String> {
        let expired: Vec<String> = self
            .bookings
            .iter()
            .filter(|(_, b)| now.saturating_duration_since(b.booked_at) >= self.expiry)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            if let Some(booking) = self.bookings.remove(id) {
                self.release(&booking);
            }
        }
        // Other replicas' bookings expire here too: a `free` lost on the bus must not
        // hold load forever.
        let expiry = self.expiry;
        let mut stale = Vec::new();
        for bookings in self.remote.values_mut() {
            bookings.retain(|_, b| {
                let keep = now.saturating_duration_since(b.booked_at) < expiry;
                if !keep {
                    stale.push(*b);
                }
                keep
            });
        }
        for booking in &stale {
            self.release(booking);
        }
        self.left
            .retain(|_, booked_at| now.saturating_duration_since(*booked_at) < expiry);
        expired
    }

    /// Forgets a worker that left; its bookings are dropped.
    pub fn remove_worker(&mut self, worker: WorkerId) {
        self.workers.remove(&worker);
        let left = &mut self.left;
        self.bookings.retain(|id, b| {
            let stays = b.worker != worker;
            if !stays {
                left.insert(id.clone(), b.booked_at);
            }
            stays
        });
        for bookings in self.remote.values_mut() {
            bookings.retain(|_, b| b.worker != worker);
        }
    }

    /// This router's own bookings (what a joining replica is sent).
    pub fn local_bookings(&self) -> Vec<(String, Booking)> {
        self.bookings
            .iter()
            .map(|(id, b)| (id.clone(), *b))
            .collect()
    }

    /// Another replica booked `id`; a repeat is ignored.
    pub fn reserve_remote(&mut self, replica: &str, id: &str, booking: Booking) {
        let bookings = self.remote.entry(replica.to_owned()).or_default();
        if bookings.contains_key(id) {
            return;
        }
        bookings.insert(id.to_owned(), booking);
        self.hold(&booking);
    }

    /// Another replica's request finished its prefill; unknown ids are ignored.
    pub fn prefill_remote(&mut self, replica: &str, id: &str) {
        let Some(booking) = self.remote.get_mut(replica).and_then(|b| b.get_mut(id)) else {
            return;
        };
        if booking.prefill_done {
            return;
        }
        let before = *booking;
        booking.prefill_done = true;
        self.release(&before);
        self.hold(&Booking {
            prefill_done: true,
            ..before
        });
    }

    /// Another replica moved its booking to `to`.
    pub fn move_remote(&mut self, replica: &str, id: &str, to: WorkerId) {
        let Some(booking) = self.remote.get_mut(replica).and_then(|b| b.get_mut(id)) else {
            return;
        };
        let before = *booking;
        booking.worker = to;
        self.release(&before);
        self.hold(&Booking {
            worker: to,
            ..before
        });
    }

    /// Another replica freed `id`; unknown ids are ignored.
    pub fn free_remote(&mut self, replica: &str, id: &str) {
        if let Some(booking) = self.remote.get_mut(replica).and_then(|b| b.remove(id)) {
            self.release(&booking);
        }
    }

    /// Drops every booking of `replica` (it went away); returns how many.
    pub fn drop_replica(&mut self, replica: &str) -> usize {
        let Some(bookings) = self.remote.remove(replica) else {
            return 0;
        };
        for booking in bookings.values() {
            self.release(booking);
        }
        bookings.len()
    }

    /// `replica`'s bookings are exactly `bookings` (its snapshot).
    pub fn replace_replica(&mut self, replica: &str, bookings: Vec<(String, Booking)>) {
        self.drop_replica(replica);
        for (id, booking) in bookings {
            self.reserve_remote(replica, &id, booking);
        }
    }

    /// Other replicas' bookings held now.
    pub fn remote_bookings(&self) -> usize {
        self.remote.values().map(ById::len).sum()
    }

    /// Calls `f` with each worker whose load changed since the last call, and its load
    /// now, in the order of the changes.
    pub fn for_each_changed(&mut self, mut f: impl FnMut(WorkerId, WorkerLoad)) {
        for worker in self.changed.drain(..) {
            f(
                worker,
                self.workers.get(&worker).copied().unwrap_or_default(),
            );
        }
    }

    pub fn is_booked(&self, request_id: &str) -> bool {
        self.bookings.contains_key(request_id)
    }

    pub fn active_bookings(&self) -> usize {
        self.bookings.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: WorkerId = WorkerId {
        worker_id: 1,
        dp_rank: 0,
    };

    #[test]
    fn reserve_prefill_free_returns_to_zero_in_any_order() {
        let mut a = LoadAccounting::new(Duration::from_secs(60));
        a.reserve("r1", W, 100, 10).unwrap();
        a.reserve("r2", W, 50, 5).unwrap();
        assert_eq!(
            a.load(W),
            WorkerLoad {
                active_prefill_tokens: 150,
                active_decode_blocks: 15,
                active_requests: 2
            }
        );
        assert_eq!(
            a.reserve("r1", W, 1, 1),
            Err(AccountingError::AlreadyReserved("r1".into()))
        );
        a.prefill_complete("r1").unwrap();
        a.prefill_complete("r1").unwrap();
        assert_eq!(
            a.load(W).active_prefill_tokens,
            50,
            "a second prefill-complete releases nothing more"
        );
        a.free("r2").unwrap(); // freed before its prefill completed
        assert!(a.prefill_complete("r2").is_err());
        assert!(a.free("r2").is_err());
        a.free("r1").unwrap();
        assert_eq!(a.load(W), WorkerLoad::default());
    }

    #[test]
    fn a_booking_that_left_with_its_worker_ends_without_a_fault() {
        let mut a = LoadAccounting::new(Duration::from_secs(10));
        a.reserve("running", W, 10, 1).unwrap();
        a.reserve("old", W, 10, 1).unwrap();
        a.remove_worker(W);
        let left = |id: &str| AccountingError::WorkerLeft(id.into());
        assert_eq!(a.prefill_complete("running"), Err(left("running")));
        assert_eq!(a.move_booking("running", W), Err(left("running")));
        assert_eq!(a.free("running"), Err(left("running")));
        // Told once: a second free is of an unknown request.
        assert_eq!(
            a.free("running"),
            Err(AccountingError::UnknownRequest("running".into()))
        );
        // Forgotten at the bookings' expiry, so the record is bounded.
        a.expire(Instant::now() + Duration::from_secs(11));
        assert_eq!(
            a.free("old"),
            Err(AccountingError::UnknownRequest("old".into()))
        );
        assert_eq!(a.load(W), WorkerLoad::default());
    }

    #[test]
    fn expired_bookings_are_released() {
        let mut a = LoadAccounting::new(Duration::from_secs(10));
        a.reserve("old", W, 10, 1).unwrap();
        assert!(a.expire(Instant::now()).is_empty());
        assert_eq!(
            a.expire(Instant::now() + Duration::from_secs(11)),
            vec!["old".to_owned()]
        );
        assert_eq!(a.load(W), WorkerLoad::default());
        assert!(a.free("old").is_err());
    }

    #[test]
    fn remote_bookings_count_and_leave_with_their_replica() {
        let mut a = LoadAccounting::new(Duration::from_secs(60));
        a.reserve("mine", W, 10, 1).unwrap();
        a.reserve_remote("b", "r1", Booking::remote(W, 100, 10, false));
        a.reserve_remote("b", "r1", Booking::remote(W, 100, 10, false)); // a repeat
        a.reserve_remote("c", "mine", Booking::remote(W, 5, 1, false)); // same id, other replica
        assert_eq!(
            a.load(W),
            WorkerLoad {
                active_prefill_tokens: 115,
                active_decode_blocks: 12,
                active_requests: 3
            }
        );
        a.prefill_remote("b", "r1");
        a.prefill_remote("b", "r1");
        assert_eq!(a.load(W).active_prefill_tokens, 15);
        a.free_remote("b", "nothing");
        assert_eq!(a.drop_replica("c"), 1);
        a.free("mine").unwrap();
        assert_eq!(
            a.load(W),
            WorkerLoad {
                active_prefill_tokens: 0,
                active_decode_blocks: 10,
                active_requests: 1
            }
        );
        a.replace_replica("b", vec![("r2".into(), Booking::remote(W, 7, 2, false))]);
        assert_eq!(
            a.load(W),
            WorkerLoad {
                active_prefill_tokens: 7,
                active_decode_blocks: 2,
                active_requests: 1
            }
        );
        a.free_remote("b", "r2");
        assert_eq!(a.load(W), WorkerLoad::default());
        assert_eq!(a.remote_bookings(), 0);
    }
}
