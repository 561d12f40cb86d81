//! Session affinity in a selection (`router.session_affinity`): a request of a bound
//! session has its candidates narrowed to its worker before the policy runs, softly
//! (while the worker is under `soft_max_active_requests` and not busy) or hard (while the
//! worker is a candidate); after the pick the session is bound to the worker it went to.

use super::*;
use switchyard_config::AffinityMode;
use switchyard_plugin_sdk::{AffinityMode as SdkAffinityMode, AffinityTarget};
use switchyard_policy::Candidates;

/// The worker a request's session is bound to, and how strongly.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pin {
    worker: WorkerId,
    mode: AffinityMode,
    soft_max_active_requests: u32,
}

impl Pin {
    /// The binding as policies are offered it (ABI 1.5, `affinity_target`).
    pub(super) fn target(self) -> Option<AffinityTarget> {
        let mode = match self.mode {
            AffinityMode::Off => return None,
            AffinityMode::Soft => SdkAffinityMode::Soft,
            AffinityMode::Hard => SdkAffinityMode::Hard,
        };
        Some(AffinityTarget {
            worker: self.worker,
            mode,
        })
    }

    /// Narrows `allowed` to the bound worker's row (written afresh unless `narrowed`:
    /// busy marks or an `only` set are already there). Whether it did; a hard pin on a
    /// busy worker waits for it (`Saturated`) rather than move the session.
    pub(super) fn apply(
        self,
        candidates: &Candidates,
        allowed: &mut Vec<u8>,
        narrowed: bool,
    ) -> Result<bool, RouteError> {
        let columns = candidates.columns(None);
        let Some(row) = columns
            .worker_id
            .iter()
            .zip(columns.dp_rank)
            .position(|(&id, &rank)| id == self.worker.worker_id && rank == self.worker.dp_rank)
        else {
            return Ok(false); // left, or unhealthy: the session moves
        };
        let free = !narrowed || allowed.get(row) == Some(&1);
        match self.mode {
            AffinityMode::Hard if !free => {
                return Err(Saturated::SessionWorker {
                    worker_id: self.worker.worker_id,
                }
                .into())
            }
            AffinityMode::Soft
                if !free
                    || candidates.kept().active_requests[row] >= self.soft_max_active_requests =>
            {
                return Ok(false);
            }
            _ => {}
        }
        allowed.clear();
        allowed.resize(columns.worker_id.len(), 0);
        allowed[row] = 1;
        Ok(true)
    }
}

impl Router {
    /// The pin of `request`'s session, when sessions are bound and it has a binding.
    pub(super) fn session_pin(
        &self,
        generation: &Generation,
        request: &RouteRequest,
    ) -> Option<Pin> {
        let affinity = generation.config().router.session_affinity;
        let session = request.session.as_ref()?;
        if affinity.mode == AffinityMode::Off {
            return None;
        }
        let ttl = Duration::from_secs(affinity.ttl_secs);
        let worker = self
            .sessions
            .bound(&session.session_id, request.worker_type, ttl)?;
        Some(Pin {
            worker,
            mode: affinity.mode,
            soft_max_active_requests: affinity.soft_max_active_requests,
        })
    }

    /// Binds `request`'s session to `chosen`, the worker it was dispatched to (or forgets
    /// the session at its last request, or when asked to evict it).
    pub(super) fn session_dispatched(
        &self,
        generation: &Generation,
        request: &RouteRequest,
        chosen: WorkerId,
    ) {
        let affinity = generation.config().router.session_affinity;
        let Some(session) = request.session.as_ref() else {
            return;
        };
        if affinity.mode == AffinityMode::Off {
            return;
        }
        if session.session_final == Some(true) || session.evict_session == Some(true) {
            self.sessions.forget(&session.session_id);
        } else {
            self.sessions.bind(
                &session.session_id,
                request.worker_type,
                chosen,
                affinity.max_sessions,
            );
        }
    }

    /// Sessions bound now (`GET /v1/workers`' summary and tests).
    pub fn bound_sessions(&self) -> usize {
        self.sessions.len()
    }
}
