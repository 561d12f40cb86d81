//! Waiting for a worker that is not busy (`admission:`), the same on every path: a
//! selection refused because every candidate is busy queues the request in the router's
//! admission queue, and each try the queue grants selects again, until one books, the
//! queue refuses (429), or the wait ends (503); both answers carry `Retry-After`. The
//! future holds the request's ticket: a client that hangs up drops it and leaves the
//! queue at once.

use std::time::{Duration, Instant};

use switchyard_config::QueueOrder;
use switchyard_fleet::admission::{Capacity, QueueRefusal, Turn};
use switchyard_fleet::router::{RouteError, Router};
use switchyard_plugin_host::plugin::PartitionKey;

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

/// `first` is the request's first selection; while it and every later try (`attempt`)
/// are refused as `saturated`, the request waits its turn.
pub async fn queued<T, E, F>(
    router: &Router,
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
    let generation = router.generation();
    let Some(settings) = generation.config().admission.as_ref() else {
        return Err(Waited::Failed(refused));
    };
    let queue = &settings.queue;
    let tenant = place.tenant.unwrap_or("");
    let weight = queue.tenant_weights.get(tenant).copied().unwrap_or(1);
    let max_wait =
        Duration::from_millis(queue.max_wait_ms).min(place.max_wait.unwrap_or(Duration::MAX));
    let mut ticket = router
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

pub fn is_saturated(error: &RouteError) -> bool {
    matches!(error, RouteError::Saturated(_))
}
