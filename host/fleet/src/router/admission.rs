//! Admission of a request: before its selection, the tenant's rate
//! (`admission.rate_limits`), then the partition's admitters (`admission.admitters`),
//! which read its saturation (on the caller's thread, which is never an executor's:
//! admitters are plugin code); after a selection that found every worker busy, its wait
//! for a turn in the admission queue (`admission.queue`), the same on every path: each
//! try the queue grants selects again, until one books, the queue refuses (429), or the
//! wait ends (503).

use super::*;
use crate::admission::{Capacity, QueueRefusal, Turn};
use crate::rate_limits::OverRate;
use switchyard_config::QueueOrder;
use switchyard_plugin_sdk::{Placement, Saturation};
use switchyard_policy::Rejection;

/// Why a request is not served.
#[derive(Debug, Clone, PartialEq)]
pub enum Refused {
    OverRate(OverRate),
    Rejected(Rejection),
}

impl Router {
    /// Admits `request` (of `request_blocks` KV blocks, `prompt_tokens` prompt tokens; its
    /// block hashes are not read) or says why not. The placement says where it waits
    /// while every worker is busy (the request's own priority and tenant when no admitter
    /// changed them).
    pub fn admit(
        &self,
        request: &RouteRequest,
        request_blocks: u64,
        prompt_tokens: u64,
    ) -> Result<Placement, Refused> {
        let tenant = request
            .attributes
            .as_ref()
            .and_then(|a| a.tenant.as_deref());
        self.within_rate(tenant, prompt_tokens)
            .map_err(Refused::OverRate)?;
        let generation = self.generation();
        if generation.startup.admitters.is_empty() {
            return Ok(Placement::default());
        }
        let partition = PartitionKey::new(request.model.clone(), request.worker_type);
        let Some(admitters) = generation.admitters(&partition) else {
            return Ok(Placement::default());
        };
        let block_size = generation.config().router.block_size;
        let prompt = PromptBlocks::new(block_size, request_blocks);
        let saturation = self.saturation(&generation, &partition, tenant.unwrap_or(""));
        let plugins = generation.startup.admitters.iter().any(|a| {
            !matches!(
                a.component.origin,
                switchyard_policy::registry::Origin::Builtin
            )
        });
        let admit = || admitters.lock().admit(request, prompt, &saturation);
        // Decided inline for another generation (a reload came in between): a plugin's
        // admitter runs off the executor's thread.
        let admitted = if plugins {
            crate::executor::plugin_code(admit)
        } else {
            admit()
        };
        admitted.map_err(|rejection| {
            self.metrics
                .admission
                .rejected
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Refused::Rejected(rejection)
        })
    }

    /// How loaded `partition` is now, as an admitter sees it.
    pub fn saturation(
        &self,
        generation: &Generation,
        partition: &PartitionKey,
        tenant: &str,
    ) -> Saturation {
        let (queued, queued_tenant) = self.admission.queue.waiting_in(partition, tenant);
        let admission = generation.config().admission.as_ref();
        let mut saturation = Saturation {
            queued: queued as u64,
            queued_tenant: queued_tenant as u64,
            queue_capacity: admission.map_or(0, |a| a.queue.max_queued as u64),
            ..Saturation::default()
        };
        let lent = {
            let kv = self.kv.index.read();
            self.bookings.columns.lock().lend(partition, &kv)
        };
        let Some(lent) = lent else {
            return saturation;
        };
        let columns = &lent.columns;
        saturation.workers = columns.len() as u64;
        saturation.active_requests = columns.active_requests.iter().map(|&a| u64::from(a)).sum();
        saturation.active_prefill_tokens = columns.active_prefill_tokens.iter().sum();
        if let Some(busy) = admission.map(|a| &a.busy).filter(|b| b.any()) {
            // The thread's selection buffer (a selection runs after this, not during).
            SCRATCH.with(|scratch| {
                let not_busy = &mut scratch.borrow_mut().selection.allowed;
                mark_not_busy(busy, &busy_inputs(columns), not_busy, true);
                saturation.busy_workers = not_busy.iter().filter(|&&ok| ok == 0).count() as u64;
            });
        }
        saturation
    }
}

/// How often a waiter checks whether capacity freed without a booking freeing.
const TICK: Duration = Duration::from_millis(50);

/// Why a request that waited got no worker.
pub enum Waited<E> {
    /// The selection failed for another reason than busy workers.
    Failed(E),
    Refused(QueueRefusal),
}

/// Who is waiting: the partition, and the request's place in the queue's order.
pub struct Place<'a> {
    pub partition: PartitionKey,
    pub priority: i32,
    pub tenant: Option<&'a str>,
    /// An admitter's limit on the wait (shortens `admission.queue.max_wait_ms`).
    pub max_wait: Option<Duration>,
}

impl Router {
    /// `first` is the request's first selection; while it and every later try (`attempt`)
    /// are refused as `saturated`, the request waits its turn in the admission queue. The
    /// future holds the request's ticket: a client that hangs up drops it and leaves the
    /// queue at once.
    pub async fn queued<T, E, F>(
        &self,
        place: Place<'_>,
        first: Result<T, E>,
        saturated: impl Fn(&E) -> bool,
        mut attempt: impl FnMut() -> F,
    ) -> Result<T, Waited<E>>
    where
        F: std::future::Future<Output = Result<T, E>>,
    {
        let refused = match first {
            Err(e) if saturated(&e) => e,
            done => return done.map_err(Waited::Failed),
        };
        let generation = self.generation();
        let Some(settings) = generation.config().admission.as_ref() else {
            return Err(Waited::Failed(refused));
        };
        let queue = &settings.queue;
        let tenant = place.tenant.unwrap_or("");
        let weight = queue.tenant_weights.get(tenant).copied().unwrap_or(1);
        let max_wait =
            Duration::from_millis(queue.max_wait_ms).min(place.max_wait.unwrap_or(Duration::MAX));
        let mut ticket = self
            .admission
            .queue
            .enqueue(
                &place.partition,
                place.priority,
                tenant,
                weight,
                Capacity {
                    max_queued: queue.max_queued,
                    fair_share: queue.fair_share,
                },
                (queue.order == QueueOrder::Deadline).then_some(max_wait),
            )
            .map_err(Waited::Refused)?;
        drop(generation);
        let started = Instant::now();
        loop {
            let left = max_wait.saturating_sub(started.elapsed());
            let turn = if left.is_zero() {
                ticket.time_out();
                Turn::TimedOut
            } else {
                ticket.wait(left, TICK).await
            };
            match turn {
                Turn::Granted => {}
                Turn::TimedOut => {
                    return Err(Waited::Refused(QueueRefusal::TimedOut {
                        waited_ms: started.elapsed().as_millis() as u64,
                    }))
                }
                Turn::Evicted => return Err(Waited::Refused(QueueRefusal::Evicted)),
            }
            match attempt().await {
                Ok(done) => {
                    ticket.admitted();
                    return Ok(done);
                }
                Err(e) if saturated(&e) => ticket.requeue(),
                Err(e) => return Err(Waited::Failed(e)),
            }
        }
    }
}

/// Whether a selection failed only because every candidate is busy (`queued`'s test for
/// a route error).
pub fn is_saturated(error: &RouteError) -> bool {
    matches!(error, RouteError::Saturated(_))
}
