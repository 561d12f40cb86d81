//! Load accounting: what each worker has been booked for by select-and-reserve.
//!
//! A booking holds the prefill tokens the worker must compute (not covered by its cache),
//! the decode blocks the request will occupy, and one active request. prefill-complete
//! releases the prefill part; free releases the rest. Bookings never freed expire. Every
//! release subtracts exactly what its booking added, once, so counts cannot go negative
//! whatever order calls arrive in.

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

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AccountingError {
    #[error("request `{0}` is already reserved; free it first or use another request id")]
    AlreadyReserved(String),
    #[error("no reserved request `{0}` (never reserved, already freed, or expired)")]
    UnknownRequest(String),
}

pub struct LoadAccounting {
    workers: FxHashMap<WorkerId, WorkerLoad>,
    bookings: FxHashMap<String, Booking>,
    expiry: Duration,
    /// Workers whose load changed since `for_each_changed` (repeats possible).
    changed: Vec<WorkerId>,
}

impl LoadAccounting {
    pub fn new(expiry: Duration) -> Self {
        LoadAccounting {
            workers: FxHashMap::default(),
            bookings: FxHashMap::default(),
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
        let booking = self
            .bookings
            .get_mut(request_id)
            .ok_or_else(|| AccountingError::UnknownRequest(request_id.to_owned()))?;
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
        let booking = *self
            .bookings
            .get(request_id)
            .ok_or_else(|| AccountingError::UnknownRequest(request_id.to_owned()))?;
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
        let booking = self
            .bookings
            .remove(request_id)
            .ok_or_else(|| AccountingError::UnknownRequest(request_id.to_owned()))?;
        self.release(&booking);
        Ok(booking)
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

    /// Frees bookings older than the expiry; returns how many.
    pub fn expire(&mut self, now: Instant) -> usize {
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
        expired.len()
    }

    /// Forgets a worker that left; its bookings are dropped.
    pub fn remove_worker(&mut self, worker: WorkerId) {
        self.workers.remove(&worker);
        self.bookings.retain(|_, b| b.worker != worker);
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
    fn expired_bookings_are_released() {
        let mut a = LoadAccounting::new(Duration::from_secs(10));
        a.reserve("old", W, 10, 1).unwrap();
        assert_eq!(a.expire(Instant::now()), 0);
        assert_eq!(a.expire(Instant::now() + Duration::from_secs(11)), 1);
        assert_eq!(a.load(W), WorkerLoad::default());
        assert!(a.free("old").is_err());
    }
}
