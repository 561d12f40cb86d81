//! Lifecycle notifications (ABI 1.1): which routed requests a policy asked to hear about,
//! and the thread that tells it when their prefill completes and when they end.
//!
//! Nothing here runs for a policy none of whose components set a notification callback:
//! the router asks `Policy::notified` and tracks only those requests. `on_selected` is
//! delivered by the selection itself (under the instance's lock, before its next
//! selection); `on_prefill_complete` and `on_finished` are queued to one thread of their
//! own, so neither the async executor nor the caller of `/v1/free` ever runs plugin code.
//! A followed request keeps its policy alive (its slot); the slots this module lets go of
//! are dropped on the notification thread (which may run plugin code), never on the
//! caller's. At shutdown [`Lifecycles::finish`] delivers what is queued and joins the
//! thread, so no notification runs while the process exits.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use switchyard_plugin_sdk::WorkerId;

use super::generation::SelectorSlot;
use switchyard_plugin_host::plugin::{Lifecycle, Outcome};

/// A routed request whose policy wants its notifications.
struct Tracked {
    slot: Arc<SelectorSlot>,
    outcome: Outcome,
    selected_at: Instant,
}

/// A notification to deliver (`event`), or with `None` only a slot to drop there.
struct Job {
    slot: Arc<SelectorSlot>,
    event: Option<Lifecycle>,
    outcome: Outcome,
}

pub struct Lifecycles {
    next_id: AtomicU64,
    /// By the client's request id.
    tracked: Mutex<HashMap<String, Tracked>>,
    /// `tracked.len()`, read without the lock: with no policy asking for notifications,
    /// prefill-complete and free pay one atomic load here and nothing else.
    count: AtomicUsize,
    /// `None` once finished (or when the thread could not start).
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Default for Lifecycles {
    fn default() -> Self {
        Self::new()
    }
}

impl Lifecycles {
    /// Starts the notification thread; it ends with [`Lifecycles::finish`] or when this
    /// is dropped. Each job's slot is dropped on that thread.
    pub fn new() -> Self {
        let (jobs, queue) = mpsc::channel::<Job>();
        let spawned = std::thread::Builder::new()
            .name("switchyard-lifecycle".into())
            .spawn(move || {
                for job in queue {
                    if let Some(event) = job.event {
                        // Failures are counted on the stage and logged by `notify`.
                        let _ = job
                            .slot
                            .selector
                            .lock()
                            .policy
                            .notify(event, None, &job.outcome);
                    }
                }
            });
        let thread = spawned
            .map_err(|e| tracing::error!(error = %e, "cannot start the lifecycle-notification thread; on_prefill_complete and on_finished will not be delivered"))
            .ok();
        Lifecycles {
            next_id: AtomicU64::new(1),
            tracked: Mutex::new(HashMap::new()),
            count: AtomicUsize::new(0),
            jobs: Mutex::new(thread.as_ref().map(|_| jobs)),
            thread: Mutex::new(thread),
        }
    }

    /// Delivers the notifications already queued and stops the thread (shutdown): no
    /// plugin code runs here afterwards; later events are not delivered.
    pub fn finish(&self) {
        drop(self.jobs.lock().take());
        if let Some(thread) = self.thread.lock().take() {
            let _ = thread.join();
        }
    }

    /// The id of the next routed request (the outcome's `request_id`).
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Follows request `request_id`, selected by `slot`'s policy (already told
    /// `on_selected`) at `selected_at`.
    pub fn track(
        &self,
        request_id: &str,
        slot: Arc<SelectorSlot>,
        outcome: Outcome,
        selected_at: Instant,
    ) {
        let mut tracked = self.tracked.lock();
        let replaced = tracked.insert(
            request_id.to_owned(),
            Tracked {
                slot,
                outcome,
                selected_at,
            },
        );
        self.count.store(tracked.len(), Ordering::Relaxed);
        drop(tracked);
        if let Some(replaced) = replaced {
            // A request id used again: the earlier one's slot is let go of there.
            self.send(replaced.slot, None, replaced.outcome);
        }
    }

    /// Queues `event` (or, with `None`, only the slot's drop) for the notification thread.
    /// Past [`Lifecycles::finish`] (shutdown) the slot is kept, not dropped here: it may be
    /// the last reference to a policy, and this may be an executor thread.
    fn send(&self, slot: Arc<SelectorSlot>, event: Option<Lifecycle>, outcome: Outcome) {
        let job = Job {
            slot,
            event,
            outcome,
        };
        let undelivered = match &*self.jobs.lock() {
            Some(jobs) => jobs.send(job).err().map(|e| e.0),
            None => Some(job),
        };
        if let Some(job) = undelivered {
            std::mem::forget(job.slot);
        }
    }

    /// The request's prefill completed (its first token).
    pub fn prefill_complete(&self, request_id: &str) {
        if self.count.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut tracked = self.tracked.lock();
        let Some(t) = tracked.get_mut(request_id) else {
            return;
        };
        t.outcome.to_prefill_complete = Some(t.selected_at.elapsed());
        let (slot, outcome) = (t.slot.clone(), t.outcome);
        drop(tracked);
        self.send(slot, Some(Lifecycle::PrefillComplete), outcome);
    }

    /// The request now runs on `worker` (a gateway's retry served it elsewhere).
    pub fn moved(&self, request_id: &str, worker: WorkerId) {
        if self.count.load(Ordering::Relaxed) == 0 {
            return;
        }
        if let Some(t) = self.tracked.lock().get_mut(request_id) {
            t.outcome.worker = worker;
        }
    }

    /// The request is one side of a disaggregated pair whose other side is `other`
    /// (`None`: no longer paired).
    pub fn paired(&self, request_id: &str, other: Option<WorkerId>) {
        if self.count.load(Ordering::Relaxed) == 0 {
            return;
        }
        if let Some(t) = self.tracked.lock().get_mut(request_id) {
            t.outcome.paired = other;
        }
    }

    /// The request ended: its one `on_finished`.
    pub fn finished(&self, request_id: &str) {
        if self.count.load(Ordering::Relaxed) == 0 {
            return;
        }
        let removed = {
            let mut tracked = self.tracked.lock();
            let removed = tracked.remove(request_id);
            self.count.store(tracked.len(), Ordering::Relaxed);
            removed
        };
        let Some(mut t) = removed else {
            return;
        };
        t.outcome.to_finish = Some(t.selected_at.elapsed());
        self.send(t.slot, Some(Lifecycle::Finished), t.outcome);
    }

    /// Ends every followed request that `still_booked` no longer knows (expired, or its
    /// worker was removed).
    pub fn finish_unbooked(&self, still_booked: impl Fn(&str) -> bool) {
        if self.count.load(Ordering::Relaxed) == 0 {
            return;
        }
        let gone: Vec<String> = self
            .tracked
            .lock()
            .keys()
            .filter(|id| !still_booked(id))
            .cloned()
            .collect();
        for id in gone {
            self.finished(&id);
        }
    }
}
