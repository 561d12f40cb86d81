//! The admission queue: requests wait here while every candidate of their partition is
//! busy (`admission:`, docs/admission.md), and leave it in order as capacity frees.
//!
//! Order: the highest priority first; within a priority, tenants take turns by deficit
//! round robin (a tenant of weight w is served w times per turn); within a tenant, first
//! come first served. A waiter is *granted* a try when capacity frees (a booking freed or
//! moved out of prefill): it selects again, books and leaves, or, still refused, goes back
//! to its place (it keeps its arrival number). At most one try is under way per partition,
//! so requests book in the queue's order; one that books hands the next a try at once, and
//! a waiter's timer tick starts one when capacity freed without a booking freeing. A
//! dropped ticket (a client that hung up)
//! leaves the queue at once.
//!
//! Who gets in: a full partition queue refuses a new request, unless it makes room by
//! priority (it outranks the lowest band waiting: that band's latest arrival leaves) or,
//! with `fair_share` (the default), by share: within its own band, the tenant holding the
//! most places holds at least two more than the new request's tenant, so that tenant's
//! last place goes to the new request. A quiet tenant therefore always gets a place while
//! another tenant holds two or more, and a flooding tenant keeps at most one place more than
//! any other tenant of its band that asks for one. Every operation is O(log n) in the
//! waiters of a partition, except a full queue's share check: O(tenants waiting in the
//! band).

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use switchyard_plugin_host::plugin::PartitionKey;
use tokio::sync::oneshot;

/// Why a request could not wait.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueRefusal {
    #[error("{queued} requests already wait for a worker of this model (admission.queue.max_queued), {of_tenant} of them this tenant's, and none of a lower priority or of a tenant holding two places more than this one (admission.queue.fair_share) could give up its place; retry later")]
    Full { queued: usize, of_tenant: usize },
    #[error(
        "every worker stayed busy for {waited_ms} ms (admission.queue.max_wait_ms); retry later"
    )]
    TimedOut { waited_ms: u64 },
    #[error(
        "another request took this request's place in the full queue: one of higher priority, or of a tenant holding fewer places than this request's (admission.queue.fair_share); retry later"
    )]
    Evicted,
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// The request may select again.
    Granted,
    TimedOut,
    /// A higher-priority request took its place.
    Evicted,
}

/// How many may wait in a partition, and whether tenants share the places fairly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Requests waiting at once in the partition (`admission.queue.max_queued`).
    pub max_queued: usize,
    /// A full queue makes room for a tenant holding fewer places than another of the
    /// same priority (`admission.queue.fair_share`).
    pub fair_share: bool,
}

impl From<usize> for Capacity {
    /// `max_queued` places, shared fairly (the default).
    fn from(max_queued: usize) -> Self {
        Capacity {
            max_queued,
            fair_share: true,
        }
    }
}

/// A waiter's place within its tenant: its deadline in microseconds of the queue's clock
/// (0 in first-come-first-served order), then its arrival number.
type Place = (u64, u64);

#[derive(Default)]
struct TenantQueue {
    /// Place (deadline, then arrival) -> the waiter's grant.
    waiters: BTreeMap<Place, oneshot::Sender<()>>,
    /// Tries left in this tenant's current turn.
    deficit: u32,
}

#[derive(Default)]
struct Band {
    tenants: HashMap<String, TenantQueue>,
    /// The tenants with waiters, in turn order.
    ring: VecDeque<String>,
}

#[derive(Default)]
struct PartitionQueue {
    /// Priority (higher first) -> its band.
    bands: BTreeMap<Reverse<i32>, Band>,
    len: usize,
    /// Grants handed out whose waiter has not come back (booked, re-queued or left).
    outstanding: usize,
}

#[derive(Default)]
struct QueueState {
    partitions: HashMap<PartitionKey, PartitionQueue>,
    next_arrival: u64,
}

/// The router's queue of waiting requests, per partition.
#[derive(Default)]
pub struct AdmissionQueue {
    state: Arc<Mutex<QueueState>>,
    counters: Arc<QueueCounters>,
    /// The clock deadlines are counted on.
    epoch: Epoch,
}

/// When the queue was made (deadlines are microseconds since).
struct Epoch(std::time::Instant);

impl Default for Epoch {
    fn default() -> Self {
        Epoch(std::time::Instant::now())
    }
}

impl Epoch {
    fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }
}

/// What `/metrics` reports of the queue.
#[derive(Default, Debug)]
pub struct QueueCounters {
    /// Waiting now.
    pub waiting: std::sync::atomic::AtomicU64,
    pub queued: std::sync::atomic::AtomicU64,
    pub admitted: std::sync::atomic::AtomicU64,
    pub refused_full: std::sync::atomic::AtomicU64,
    pub timed_out: std::sync::atomic::AtomicU64,
    pub evicted: std::sync::atomic::AtomicU64,
    /// Requests refused by a tenant's rate limit (`admission.rate_limits`).
    pub rate_limited: std::sync::atomic::AtomicU64,
    /// Requests an admitter rejected (`admission.admitters`).
    pub rejected: std::sync::atomic::AtomicU64,
    pub left: std::sync::atomic::AtomicU64,
    /// How long requests waited before a worker took them, or the wait ended.
    pub wait: switchyard_policy::histogram::LatencyHistogram,
}

/// Where a waiting request stands; leaving the queue when dropped.
pub struct Ticket {
    state: Arc<Mutex<QueueState>>,
    counters: Arc<QueueCounters>,
    partition: PartitionKey,
    priority: i32,
    tenant: String,
    weight: u32,
    place: Place,
    grant: Option<oneshot::Receiver<()>>,
    /// Whether the ticket holds one of its partition's outstanding grants.
    granted: bool,
    done: bool,
    /// Its end is already counted (timed out), so dropping it is not a client leaving.
    counted: bool,
    queued_at: std::time::Instant,
}

impl AdmissionQueue {
    /// A queue counting into `counters` (the router's metrics).
    pub fn new(counters: Arc<QueueCounters>) -> Self {
        AdmissionQueue {
            state: Arc::default(),
            counters,
            epoch: Epoch::default(),
        }
    }

    pub fn counters(&self) -> &QueueCounters {
        &self.counters
    }

    /// Requests waiting now, in all partitions.
    pub fn len(&self) -> usize {
        self.state.lock().partitions.values().map(|p| p.len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Requests waiting now per priority, over every partition (highest first).
    pub fn waiting_by_priority(&self) -> Vec<(i32, usize)> {
        if self.counters.waiting.load(Relaxed) == 0 {
            return Vec::new();
        }
        let state = self.state.lock();
        let mut by_priority: BTreeMap<Reverse<i32>, usize> = BTreeMap::new();
        for queue in state.partitions.values() {
            for (priority, band) in &queue.bands {
                let waiting: usize = band.tenants.values().map(|t| t.waiters.len()).sum();
                *by_priority.entry(*priority).or_default() += waiting;
            }
        }
        by_priority
            .into_iter()
            .map(|(Reverse(p), n)| (p, n))
            .collect()
    }

    /// Requests waiting for `partition` at a priority above `priority`: a new arrival of
    /// that priority queues behind them instead of taking the capacity they wait for.
    pub fn waiting_above(&self, partition: &PartitionKey, priority: i32) -> usize {
        if self.counters.waiting.load(Relaxed) == 0 {
            return 0;
        }
        let state = self.state.lock();
        state.partitions.get(partition).map_or(0, |queue| {
            queue
                .bands
                .range(..Reverse(priority))
                .flat_map(|(_, band)| band.tenants.values())
                .map(|tenant| tenant.waiters.len())
                .sum()
        })
    }

    /// Requests waiting for `partition`, and of those `tenant`'s: O(priority bands).
    pub fn waiting_in(&self, partition: &PartitionKey, tenant: &str) -> (usize, usize) {
        if self.counters.waiting.load(Relaxed) == 0 {
            return (0, 0);
        }
        let state = self.state.lock();
        let Some(queue) = state.partitions.get(partition) else {
            return (0, 0);
        };
        let of_tenant = queue
            .bands
            .values()
            .filter_map(|band| band.tenants.get(tenant))
            .map(|t| t.waiters.len())
            .sum();
        (queue.len, of_tenant)
    }

    /// Queues a request for `partition`; refused when `capacity` wait there already and
    /// no waiter gives up its place to it (the module's comment says who does).
    /// With a `deadline` (how long it may wait: `admission.queue.order: deadline`) it
    /// goes ahead of its tenant's requests due later; without, behind every earlier one.
    pub fn enqueue(
        &self,
        partition: &PartitionKey,
        priority: i32,
        tenant: &str,
        weight: u32,
        capacity: impl Into<Capacity>,
        deadline: Option<Duration>,
    ) -> Result<Ticket, QueueRefusal> {
        let capacity = capacity.into();
        let mut state = self.state.lock();
        let queued = state.partitions.get(partition).map_or(0, |p| p.len);
        if queued >= capacity.max_queued {
            // Full: a request of higher priority than the lowest waiting one takes the
            // place of that band's latest arrival; with fair shares, one of a tenant
            // holding two fewer places than the band's largest holder takes that holder's
            // last place; any other is refused.
            let queue = state.partitions.get_mut(partition);
            let made_room = queue.is_some_and(|queue| {
                queue.evict_below(priority, &self.counters)
                    || (capacity.fair_share
                        && queue.evict_for_share(priority, tenant, &self.counters))
            });
            if !made_room {
                self.counters.refused_full.fetch_add(1, Relaxed);
                let of_tenant = state
                    .partitions
                    .get(partition)
                    .map_or(0, |queue| queue.held_by(tenant));
                return Err(QueueRefusal::Full { queued, of_tenant });
            }
        }
        let arrival = state.next_arrival;
        state.next_arrival += 1;
        let due = deadline.map_or(0, |wait| {
            let due = self.epoch.elapsed().saturating_add(wait);
            u64::try_from(due.as_micros()).unwrap_or(u64::MAX).max(1)
        });
        let mut ticket = Ticket {
            state: self.state.clone(),
            counters: self.counters.clone(),
            partition: partition.clone(),
            priority,
            tenant: tenant.to_owned(),
            weight: weight.max(1),
            place: (due, arrival),
            queued_at: std::time::Instant::now(),
            grant: None,
            granted: false,
            done: false,
            counted: false,
        };
        ticket.insert(&mut state);
        self.counters.queued.fetch_add(1, Relaxed);
        Ok(ticket)
    }

    /// Capacity freed somewhere: the next waiter of every partition without a try under
    /// way gets one. (A partition with a try under way passes the turn on when that try
    /// books: tries run one at a time, so they book in the queue's order.)
    pub fn release(&self) {
        // Every free and prefill completion calls this: without waiters it takes no lock.
        if self.counters.waiting.load(Relaxed) == 0 {
            return;
        }
        let mut state = self.state.lock();
        for queue in state.partitions.values_mut() {
            if queue.outstanding == 0 {
                queue.grant_next(&self.counters);
            }
        }
    }
}

use std::sync::atomic::Ordering::Relaxed;

impl PartitionQueue {
    /// Drops the latest arrival of the lowest band if that band's priority is below
    /// `priority`; its waiter sees `Turn::Evicted`. True when one was dropped.
    fn evict_below(&mut self, priority: i32, counters: &QueueCounters) -> bool {
        let Some(mut entry) = self.bands.last_entry() else {
            return false;
        };
        if entry.key().0 >= priority {
            return false;
        }
        let band = entry.get_mut();
        let latest = band
            .tenants
            .iter()
            .filter_map(|(t, q)| q.waiters.last_key_value().map(|(a, _)| (*a, t.clone())))
            .max();
        let Some((arrival, tenant)) = latest else {
            return false;
        };
        let queue = band.tenants.get_mut(&tenant).expect("just found");
        queue.waiters.remove(&arrival);
        if queue.waiters.is_empty() {
            band.tenants.remove(&tenant);
            band.ring.retain(|t| *t != tenant);
        }
        if band.ring.is_empty() {
            entry.remove();
        }
        self.len -= 1;
        counters.waiting.fetch_sub(1, Relaxed);
        counters.evicted.fetch_add(1, Relaxed);
        true
    }

    /// Places held by `tenant`, over every band.
    fn held_by(&self, tenant: &str) -> usize {
        self.bands
            .values()
            .filter_map(|band| band.tenants.get(tenant))
            .map(|t| t.waiters.len())
            .sum()
    }

    /// Fair share in `priority`'s band: when the tenant holding the most places there
    /// holds at least two more than `tenant`, its last place (in its order) is dropped and
    /// its waiter sees `Turn::Evicted`. True when one was dropped.
    fn evict_for_share(&mut self, priority: i32, tenant: &str, counters: &QueueCounters) -> bool {
        let Some(band) = self.bands.get_mut(&Reverse(priority)) else {
            return false;
        };
        let held = band.tenants.get(tenant).map_or(0, |t| t.waiters.len());
        let largest = band
            .tenants
            .iter()
            .map(|(name, queue)| (queue.waiters.len(), name))
            .max();
        let Some((_, holder)) = largest.filter(|(most, _)| *most >= held + 2) else {
            return false;
        };
        // It held two or more: it keeps at least one, and its place in the ring.
        let holder = holder.clone();
        let Some(queue) = band.tenants.get_mut(&holder) else {
            return false;
        };
        queue.waiters.pop_last();
        self.len -= 1;
        counters.waiting.fetch_sub(1, Relaxed);
        counters.evicted.fetch_add(1, Relaxed);
        true
    }

    /// Grants the next waiter in order a try; false when none waits.
    fn grant_next(&mut self, counters: &QueueCounters) -> bool {
        loop {
            let Some(mut entry) = self.bands.first_entry() else {
                return false;
            };
            let band = entry.get_mut();
            let Some(tenant) = band.ring.front().cloned() else {
                entry.remove();
                continue;
            };
            let queue = band
                .tenants
                .get_mut(&tenant)
                .expect("a tenant in the ring has a queue");
            let Some((_, grant)) = queue.waiters.pop_first() else {
                band.ring.pop_front();
                band.tenants.remove(&tenant);
                continue;
            };
            queue.deficit = queue.deficit.saturating_sub(1);
            if queue.waiters.is_empty() {
                band.ring.pop_front();
                band.tenants.remove(&tenant);
            } else if queue.deficit == 0 {
                band.ring.rotate_left(1);
            }
            if band.ring.is_empty() {
                entry.remove();
            }
            self.len -= 1;
            counters.waiting.fetch_sub(1, Relaxed);
            // A waiter that left meanwhile dropped its receiver: try the next one.
            if grant.send(()).is_ok() {
                self.outstanding += 1;
                return true;
            }
        }
    }
}

impl Ticket {
    fn insert(&mut self, state: &mut QueueState) {
        let (grant, receive) = oneshot::channel();
        self.grant = Some(receive);
        let queue = state.partitions.entry(self.partition.clone()).or_default();
        let band = queue.bands.entry(Reverse(self.priority)).or_default();
        let tenant = band.tenants.entry(self.tenant.clone()).or_insert_with(|| {
            band.ring.push_back(self.tenant.clone());
            TenantQueue {
                waiters: BTreeMap::new(),
                deficit: self.weight,
            }
        });
        if tenant.deficit == 0 {
            tenant.deficit = self.weight;
        }
        tenant.waiters.insert(self.place, grant);
        queue.len += 1;
        self.counters.waiting.fetch_add(1, Relaxed);
    }

    /// Waits for this request's turn (`true`), or until `timeout` passes (`false`). Every
    /// `tick` without a grant, the next waiter of the partition is granted a try if no
    /// grant is out: capacity may have freed without a booking freeing (a worker added, an
    /// engine's queue drained).
    pub async fn wait(&mut self, timeout: Duration, tick: Duration) -> Turn {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let Some(grant) = self.grant.as_mut() else {
                return Turn::Evicted;
            };
            let next_tick = (tokio::time::Instant::now() + tick).min(deadline);
            tokio::select! {
                granted = grant => {
                    self.grant = None;
                    if granted.is_ok() {
                        self.granted = true;
                        return Turn::Granted;
                    }
                    // The queue dropped this waiter's grant: evicted.
                    self.done = true;
                    return Turn::Evicted;
                }
                _ = tokio::time::sleep_until(next_tick) => {
                    if tokio::time::Instant::now() >= deadline {
                        self.time_out();
                        return Turn::TimedOut;
                    }
                    let mut state = self.state.lock();
                    if let Some(queue) = state.partitions.get_mut(&self.partition) {
                        if queue.outstanding == 0 {
                            queue.grant_next(&self.counters);
                        }
                    }
                }
            }
        }
    }

    /// Whether this ticket was granted a try, without waiting (for a simulation that runs
    /// in its own time: replay).
    pub fn try_granted(&mut self) -> Option<Turn> {
        let Some(grant) = self.grant.as_mut() else {
            return self.granted.then_some(Turn::Granted);
        };
        match grant.try_recv() {
            Ok(()) => {
                self.grant = None;
                self.granted = true;
                Some(Turn::Granted)
            }
            Err(oneshot::error::TryRecvError::Closed) => {
                self.grant = None;
                self.done = true;
                Some(Turn::Evicted)
            }
            Err(oneshot::error::TryRecvError::Empty) => None,
        }
    }

    /// The wait ran out: counted as timed out (not as a client leaving) when dropped.
    pub fn time_out(&mut self) {
        if !self.counted {
            self.counters.timed_out.fetch_add(1, Relaxed);
            self.record_wait();
            self.counted = true;
        }
    }

    fn record_wait(&self) {
        let waited = self.queued_at.elapsed().as_nanos();
        self.counters
            .wait
            .record(u64::try_from(waited).unwrap_or(u64::MAX));
    }

    /// The try failed (still busy): back to its place, ahead of later arrivals.
    pub fn requeue(&mut self) {
        let state = self.state.clone();
        let mut state = state.lock();
        self.give_back_grant(&mut state);
        self.insert(&mut state);
    }

    /// The request was booked: it leaves the queue, and the next in line gets a try
    /// (more capacity may be free).
    pub fn admitted(mut self) {
        self.counters.admitted.fetch_add(1, Relaxed);
        self.record_wait();
        self.done = true;
        let state = self.state.clone();
        let mut state = state.lock();
        self.give_back_grant(&mut state);
        self.forget(&mut state);
        if let Some(queue) = state.partitions.get_mut(&self.partition) {
            if queue.outstanding == 0 {
                queue.grant_next(&self.counters);
            }
        }
    }

    fn give_back_grant(&mut self, state: &mut QueueState) {
        if std::mem::take(&mut self.granted) {
            if let Some(queue) = state.partitions.get_mut(&self.partition) {
                queue.outstanding = queue.outstanding.saturating_sub(1);
            }
        }
    }

    /// Removes this ticket's waiter if it is still queued, and an emptied partition.
    fn forget(&mut self, state: &mut QueueState) {
        let Some(queue) = state.partitions.get_mut(&self.partition) else {
            return;
        };
        if self.grant.take().is_some() {
            if let Some(band) = queue.bands.get_mut(&Reverse(self.priority)) {
                if let Some(tenant) = band.tenants.get_mut(&self.tenant) {
                    if tenant.waiters.remove(&self.place).is_some() {
                        queue.len -= 1;
                        self.counters.waiting.fetch_sub(1, Relaxed);
                    }
                    if tenant.waiters.is_empty() {
                        band.tenants.remove(&self.tenant);
                        band.ring.retain(|t| *t != self.tenant);
                    }
                }
                if band.ring.is_empty() {
                    queue.bands.remove(&Reverse(self.priority));
                }
            }
        }
        if queue.len == 0 && queue.outstanding == 0 {
            state.partitions.remove(&self.partition);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if !self.counted {
            self.counters.left.fetch_add(1, Relaxed);
        }
        let state = self.state.clone();
        let mut state = state.lock();
        let held = self.granted;
        self.give_back_grant(&mut state);
        self.forget(&mut state);
        // A grant this ticket held (its try was under way) goes to the next in line.
        if held {
            if let Some(queue) = state.partitions.get_mut(&self.partition) {
                queue.grant_next(&self.counters);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_plugin_sdk::WorkerType;

    fn partition() -> PartitionKey {
        PartitionKey::new("m", WorkerType::Select)
    }

    /// The order grants are handed out in, for tickets queued as `(priority, tenant)`.
    fn order(queued: &[(i32, &str, u32)]) -> Vec<usize> {
        let queue = AdmissionQueue::default();
        let mut tickets: Vec<Ticket> = queued
            .iter()
            .map(|&(p, t, w)| queue.enqueue(&partition(), p, t, w, 100, None).unwrap())
            .collect();
        let mut granted = Vec::new();
        for _ in 0..queued.len() {
            queue.release();
            let i = tickets
                .iter_mut()
                .position(|t| t.grant.as_mut().is_some_and(|g| g.try_recv().is_ok()))
                .expect("one grant per release");
            tickets[i].grant = None;
            tickets[i].granted = true;
            granted.push(i);
            // Booked: its grant is no longer outstanding.
            let state = tickets[i].state.clone();
            tickets[i].give_back_grant(&mut state.lock());
        }
        granted
    }

    #[test]
    fn priority_first_then_tenants_by_weight_then_arrival() {
        // Two low-priority requests, then tenant a (weight 2) and b (weight 1) at high.
        let queued = [
            (0, "batch", 1),
            (0, "batch", 1),
            (5, "a", 2),
            (5, "a", 2),
            (5, "a", 2),
            (5, "b", 1),
            (5, "b", 1),
        ];
        assert_eq!(order(&queued), [2, 3, 5, 4, 6, 0, 1]);
    }

    #[test]
    fn full_queue_refuses_and_a_dropped_ticket_leaves_at_once() {
        let queue = AdmissionQueue::default();
        let first = queue.enqueue(&partition(), 0, "t", 1, 2, None).unwrap();
        let _second = queue.enqueue(&partition(), 0, "t", 1, 2, None).unwrap();
        assert_eq!(
            queue.enqueue(&partition(), 0, "t", 1, 2, None).err(),
            Some(QueueRefusal::Full {
                queued: 2,
                of_tenant: 2
            })
        );
        drop(first);
        assert_eq!(queue.len(), 1, "the hung-up request left");
        assert_eq!(queue.counters().left.load(Relaxed), 1);
        let mut late = queue.enqueue(&partition(), 0, "t", 1, 3, None).unwrap();
        late.time_out();
        drop(late);
        assert_eq!(queue.len(), 1, "a timed-out request leaves too");
        assert_eq!(
            queue.counters().left.load(Relaxed),
            1,
            "counted once, as timed out"
        );
        assert_eq!(queue.counters().timed_out.load(Relaxed), 1);
        assert!(queue.enqueue(&partition(), 0, "t", 1, 2, None).is_ok());
    }

    #[test]
    fn a_full_queue_makes_room_for_higher_priority_only() {
        let queue = AdmissionQueue::default();
        let mut low = queue.enqueue(&partition(), 0, "batch", 1, 2, None).unwrap();
        let _high = queue.enqueue(&partition(), 5, "a", 1, 2, None).unwrap();
        assert_eq!(
            queue.enqueue(&partition(), 0, "batch", 1, 2, None).err(),
            Some(QueueRefusal::Full {
                queued: 2,
                of_tenant: 1
            }),
            "the same priority waits no place"
        );
        let _higher = queue.enqueue(&partition(), 9, "a", 1, 2, None).unwrap();
        assert_eq!(low.try_granted(), Some(Turn::Evicted));
        assert_eq!(queue.len(), 2);
    }

    #[test]
    fn a_quiet_tenant_takes_a_place_from_the_tenant_holding_the_most() {
        let queue = AdmissionQueue::default();
        let mut flood: Vec<Ticket> = (0..4)
            .map(|_| queue.enqueue(&partition(), 0, "flood", 1, 4, None).unwrap())
            .collect();
        let _quiet = queue.enqueue(&partition(), 0, "quiet", 1, 4, None).unwrap();
        assert_eq!(
            flood[3].try_granted(),
            Some(Turn::Evicted),
            "the flood's latest gave up its place"
        );
        assert_eq!(flood[0].try_granted(), None, "its earlier ones wait on");
        let _second = queue.enqueue(&partition(), 0, "quiet", 1, 4, None).unwrap();
        assert_eq!(flood[2].try_granted(), Some(Turn::Evicted));
        assert_eq!(
            queue.enqueue(&partition(), 0, "quiet", 1, 4, None).err(),
            Some(QueueRefusal::Full {
                queued: 4,
                of_tenant: 2
            }),
            "two places each: an even share"
        );
        assert_eq!(queue.len(), 4);
        let unfair = Capacity {
            max_queued: 4,
            fair_share: false,
        };
        assert!(
            queue
                .enqueue(&partition(), 0, "third", 1, unfair, None)
                .is_err(),
            "without fair shares a full queue is full"
        );
        // A new tenant takes a place of one holding two (ties go by name: quiet's).
        let _third = queue.enqueue(&partition(), 0, "third", 1, 4, None).unwrap();
        flood.clear();
        assert_eq!(queue.len(), 2, "the flood's two tickets left");
    }

    #[test]
    fn deadline_order_serves_the_earliest_due_first_within_a_tenant() {
        let queue = AdmissionQueue::default();
        let secs = |s| Some(Duration::from_secs(s));
        let mut patient = queue
            .enqueue(&partition(), 0, "t", 1, 10, secs(60))
            .unwrap();
        let mut urgent = queue.enqueue(&partition(), 0, "t", 1, 10, secs(1)).unwrap();
        let mut fifo = queue.enqueue(&partition(), 0, "u", 1, 10, None).unwrap();
        queue.release();
        assert_eq!(
            urgent.try_granted(),
            Some(Turn::Granted),
            "due first, though later"
        );
        assert_eq!(patient.try_granted(), None);
        urgent.admitted();
        assert_eq!(
            fifo.try_granted(),
            Some(Turn::Granted),
            "tenants still take turns"
        );
        fifo.admitted();
        assert_eq!(patient.try_granted(), Some(Turn::Granted));
    }

    #[test]
    fn a_requeued_try_keeps_its_place() {
        let queue = AdmissionQueue::default();
        let mut early = queue.enqueue(&partition(), 0, "t", 1, 10, None).unwrap();
        let mut late = queue.enqueue(&partition(), 0, "t", 1, 10, None).unwrap();
        queue.release();
        assert!(early.grant.as_mut().unwrap().try_recv().is_ok());
        early.grant = None;
        early.granted = true;
        early.requeue();
        queue.release();
        assert!(
            early.grant.as_mut().unwrap().try_recv().is_ok(),
            "still first"
        );
        assert!(late.grant.as_mut().unwrap().try_recv().is_err());
    }
}
