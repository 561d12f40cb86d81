//! The router's booking calls off a request's path: a booking moved after a gateway's
//! retry, a disaggregated pair named, bookings expired, and the loads read for metrics.
//! (A booking is made, completes prefill and is freed in `router.rs`, on the path.)

use super::*;

impl Router {
    /// Moves a request's booking to the worker that actually served it.
    pub fn rebook(&self, request_id: &str, to: WorkerId) -> Result<(), RouteError> {
        if self.membership.state.read().workers.get(to).is_none() {
            return Err(WorkerError::Unknown(to).into());
        }
        self.bookings
            .book(|load| load.move_booking(request_id, to))?;
        self.announce(|| BookingChange::Move {
            id: request_id.to_owned(),
            worker_id: to.worker_id,
            dp_rank: to.dp_rank,
        });
        self.lifecycles.moved(request_id, to);
        Ok(())
    }

    /// Request `request_id` (one side of a disaggregated pair) is paired with `other`
    /// (`None`: served whole after all): its remaining lifecycle notifications name it.
    pub fn pair(&self, request_id: &str, other: Option<WorkerId>) {
        self.lifecycles.paired(request_id, other);
    }

    /// Releases reservations older than the configured expiry (the last safety net;
    /// counted in metrics).
    pub fn expire(&self) -> usize {
        let expired_ids = self.bookings.book(|load| load.expire(Instant::now()));
        let expired = expired_ids.len();
        for id in expired_ids {
            self.announce(|| BookingChange::Free { id });
        }
        self.metrics.record_expired(expired);
        if expired > 0 {
            self.capacity_freed();
            let load = self.bookings.load.read();
            self.lifecycles.finish_unbooked(|id| load.is_booked(id));
        }
        expired
    }

    /// (worker, load) of every registered worker, for metrics and tests.
    pub fn loads(&self) -> Vec<(WorkerId, crate::load_accounting::WorkerLoad)> {
        let state = self.membership.state.read();
        let load = self.bookings.load.read();
        state
            .workers
            .all()
            .map(|w| (w.id(), load.load(w.id())))
            .collect()
    }

    pub fn active_bookings(&self) -> usize {
        self.bookings.load.read().active_bookings()
    }
}
