//! Admitters (ABI 1.3): the component kind that decides, before any worker is selected,
//! whether a request is served, and where it waits while every worker is busy. The
//! router's built-in admitters implement the same trait.

use crate::abi::{switchyard_admission, switchyard_saturation};
use crate::component::{PolicyError, WorkerInputs};
use crate::view::WorkerSelectionContext;

/// How loaded the request's partition is as it arrives (`switchyard_saturation`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Saturation {
    /// Healthy workers of the partition.
    pub workers: u64,
    /// Of those, the workers past an `admission.busy` threshold.
    pub busy_workers: u64,
    /// Requests booked on the partition's workers.
    pub active_requests: u64,
    /// Prompt tokens booked in their prefill stage.
    pub active_prefill_tokens: u64,
    /// Requests waiting in the partition's admission queue.
    pub queued: u64,
    /// Of those, the request's tenant's.
    pub queued_tenant: u64,
    /// Requests the queue holds at most; 0 when nothing ever waits.
    pub queue_capacity: u64,
}

impl Saturation {
    /// The host's view, as far as `raw.struct_size` reaches (all of it from a 1.3 host).
    pub fn from_abi(raw: &switchyard_saturation) -> Self {
        Saturation {
            workers: raw.workers,
            busy_workers: raw.busy_workers,
            active_requests: raw.active_requests,
            active_prefill_tokens: raw.active_prefill_tokens,
            queued: raw.queued,
            queued_tenant: raw.queued_tenant,
            queue_capacity: raw.queue_capacity,
        }
    }

    pub fn abi(&self) -> switchyard_saturation {
        switchyard_saturation {
            struct_size: core::mem::size_of::<switchyard_saturation>() as u32,
            reserved0: 0,
            workers: self.workers,
            busy_workers: self.busy_workers,
            active_requests: self.active_requests,
            active_prefill_tokens: self.active_prefill_tokens,
            queued: self.queued,
            queued_tenant: self.queued_tenant,
            queue_capacity: self.queue_capacity,
        }
    }
}

/// Where an admitted request waits while every worker is busy; `None` keeps the request's
/// own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// Replaces the request's strict priority (larger first).
    pub priority: Option<i32>,
    /// The tenant it takes turns as.
    pub tenant: Option<String>,
    /// The longest it may wait, in milliseconds (only ever shortens the queue's own).
    pub max_wait_ms: Option<u64>,
}

/// An admitter's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    Admit(Placement),
    Reject {
        /// An HTTP status from 400 to 599.
        status: u16,
        /// Seconds for `Retry-After`; 0 sends none.
        retry_after_seconds: u32,
        /// What the client reads; empty: the router names the admitter.
        message: String,
    },
}

impl Admission {
    /// Admit the request as it is.
    pub fn admit() -> Self {
        Admission::Admit(Placement::default())
    }

    /// Refuse it with 429 Too Many Requests.
    pub fn too_many(retry_after_seconds: u32, message: impl Into<String>) -> Self {
        Admission::Reject {
            status: 429,
            retry_after_seconds,
            message: message.into(),
        }
    }

    /// Writes this answer into the host's struct: only the fields the host has
    /// (`decision.struct_size`), the message truncated to its buffer.
    ///
    /// # Safety
    /// `decision` is the host's for this call, its `message` buffer writable.
    pub unsafe fn write_abi(&self, decision: &mut switchyard_admission) {
        match self {
            Admission::Admit(placement) => {
                decision.verdict = crate::abi::SWITCHYARD_ADMIT;
                if let Some(priority) = placement.priority {
                    decision.has_priority = 1;
                    decision.priority = priority;
                }
                if let Some(tenant) = &placement.tenant {
                    decision.tenant = crate::view::str_to_abi(tenant);
                }
                decision.max_wait_ms = placement.max_wait_ms.unwrap_or(0);
            }
            Admission::Reject {
                status,
                retry_after_seconds,
                message,
            } => {
                decision.verdict = crate::abi::SWITCHYARD_REJECT;
                decision.status = u32::from(*status);
                decision.retry_after_seconds = *retry_after_seconds;
                // SAFETY: per this function's contract.
                unsafe { crate::export::write_error(&decision.message, message) };
            }
        }
    }
}

/// Decides whether a request is served (`SWITCHYARD_COMPONENT_ADMITTER`). Called once
/// per request, before selection, one thread at a time per instance.
pub trait RequestAdmitter: Send {
    /// `WorkerInputs::ATTRIBUTES` (the only group an admitter may read) or none.
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::NONE
    }
    fn admit(
        &mut self,
        context: &WorkerSelectionContext<'_>,
        saturation: &Saturation,
    ) -> Result<Admission, PolicyError>;
}
