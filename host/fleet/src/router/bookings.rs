//! The router's bookings: a request's load booked on its worker at selection
//! (`reserve`), prefill complete, moved after a gateway's retry, freed, and expired; each
//! change announced to other replicas and told to lifecycle-aware plugins.

use super::*;

impl Router {
    /// Load went down (a booking freed, expired or left prefill): a waiting request, if
    /// any, gets its try.
    pub(super) fn capacity_freed(&self) {
        self.admission.queue.release();
    }

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

    pub fn prefill_complete(&self, request_id: &str) -> Result<(), RouteError> {
        self.bookings
            .book(|load| load.prefill_complete(request_id))?;
        self.announce(|| BookingChange::PrefillComplete {
            id: request_id.to_owned(),
        });
        self.lifecycles.prefill_complete(request_id);
        self.capacity_freed();
        Ok(())
    }

    pub fn free(&self, request_id: &str) -> Result<(), RouteError> {
        self.bookings.book(|load| load.free(request_id))?;
        self.announce(|| BookingChange::Free {
            id: request_id.to_owned(),
        });
        self.lifecycles.finished(request_id);
        self.capacity_freed();
        Ok(())
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

    /// Books the request's uncached prefill tokens and its decode blocks on `chosen`;
    /// `false` (nothing booked) when `chosen` is at an `admission.busy` threshold now.
    pub(super) fn reserve(
        &self,
        request: &RouteRequest,
        id: &str,
        chosen: WorkerId,
        (request_blocks, device_overlap): (u64, u32),
        busy: Option<&BusyThresholds>,
    ) -> Result<bool, RouteError> {
        let block_size = u64::from(self.block_size());
        let new_blocks = request_blocks.saturating_sub(u64::from(device_overlap));
        let prefill_tokens = if request.tracks_prefill_tokens {
            new_blocks * block_size
        } else {
            0
        };
        let output_blocks = request
            .expected_output_tokens
            .unwrap_or(0)
            .div_ceil(block_size);
        let decode_blocks = new_blocks + output_blocks;
        let uncached_tokens = new_blocks * block_size;
        let booked = self.bookings.book(|load| {
            let room = busy.is_none_or(|busy| {
                let now = load.load(chosen);
                takes_booking(
                    busy,
                    now.active_requests,
                    now.active_prefill_tokens,
                    now.active_decode_blocks,
                    uncached_tokens,
                )
            });
            room.then(|| load.reserve(id, chosen, prefill_tokens, decode_blocks))
                .transpose()
        })?;
        if booked.is_none() {
            return Ok(false);
        }
        self.announce(|| BookingChange::Reserve {
            id: id.to_owned(),
            worker_id: chosen.worker_id,
            dp_rank: chosen.dp_rank,
            prefill_tokens,
            decode_blocks,
            prefill_done: false,
        });
        Ok(true)
    }
}
