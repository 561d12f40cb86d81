//! The router: workers, KV index, load accounting and one policy instance per partition,
//! tied together into select, select-and-reserve, prefill-complete and free.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashSet;
use serde::{Deserialize, Serialize};
use switchyard_plugin_sdk::WorkerId;

use super::generation::{Generation, SelectorSlot};
use super::kv_events::hash_agreement::Ignored;
use super::kv_events::subscriber;
use super::kv_events::wire::EngineEvent;
use super::kv_events::ApplyOutcome;
use super::kv_index::{hash_tokens, KvEvent, QueryScratch};
use super::lifecycle::Lifecycles;
use super::load_accounting::{AccountingError, BookingChange};
use super::metrics::Metrics;
use super::retire::Retirement;
use super::workers::{WorkerError, WorkerSpec, Workers};
use crate::admission::AdmissionQueue;
use crate::rate_limits::{OverRate, RateLimiter};
use switchyard_config::{BusyThresholds, KvTracking, OnError};
use switchyard_plugin_host::plugin::{Outcome, PartitionKey, PromptBlocks};
use switchyard_policy::busy::{mark_not_busy, mark_prefill_room, takes_booking, BusyInputs};
use switchyard_policy::histogram::Stopwatch;
use switchyard_policy::instances::role_word;
use switchyard_policy::startup::{Startup, BUILTIN_DEFAULT};
use switchyard_policy::{Candidates, CandidatesFrom, InstanceFactory, KeptColumns, SelectError};

mod admission;
mod bookings;
mod health;
mod kv;
mod membership;
mod owners;
mod reload;
mod replicas;
mod session_pin;
pub use admission::{is_saturated, Place, Refused, Waited};
pub use health::HealthFailure;
pub use owners::Admission;
use owners::{Bookings, Generations, KvState, Membership};
pub use reload::{ReloadError, ReloadOutcome};
use session_pin::Pin;

mod request;
use request::{prompt_blocks, validate};
pub use request::{BadRequest, NoWorker, RouteDecision, RouteError, RouteRequest, Saturated};

/// Selections a request makes at most when its picks keep filling up before they are
/// booked (each later one sees the bookings that filled the earlier picks).
const BOOKING_TRIES: usize = 4;

struct State {
    workers: Workers,
}

/// Takes `selector`, spinning up to `SELECTOR_SPIN` before sleeping on it. A selection
/// holds its instance's selector for microseconds (4.6 us over 1,024 workers), and two
/// threads deciding at once meet on it; sleeping at once made every meeting a futex sleep
/// and wake-up that cost more than the selection (at 1,024 workers two threads decided
/// fewer requests than one, docs/BENCHMARKS.md).
fn lock_spinning(
    selector: &Mutex<switchyard_policy::pipeline::Selector>,
) -> parking_lot::MutexGuard<'_, switchyard_policy::pipeline::Selector> {
    if let Some(guard) = selector.try_lock() {
        return guard; // the usual case: no clock read
    }
    let started = Instant::now();
    loop {
        for _ in 0..64 {
            std::hint::spin_loop();
        }
        if let Some(guard) = selector.try_lock() {
            return guard;
        }
        if started.elapsed() > SELECTOR_SPIN {
            return selector.lock();
        }
    }
}

/// How long a selection waits for its instance's selector before sleeping: a few
/// selections' length. Longer spins on a machine whose threads outnumber its cores would
/// waste the core the holder needs.
const SELECTOR_SPIN: Duration = Duration::from_micros(20);

/// The composer of the router's owners (`owners.rs`); it holds no lock of its own.
///
/// The locks, in the order they are taken when more than one is held (the one place the
/// order across owners is written): `generations.changing` (a reload or a partition being
/// built), then `membership.state`, then `kv.index`, then `bookings.load`, then
/// `bookings.columns`, then an instance's selector. `generations.serving` is only held to
/// clone its `Arc`; the owners' other locks (and `sessions`') are leaves, never held
/// while another is taken. Plugin code (a selector) runs holding none of them, only its own selector's
/// lock (`gather` releases the fleet's read locks first).
pub struct Router {
    generations: Generations,
    membership: Membership,
    kv: KvState,
    bookings: Bookings,
    /// Requests waiting for a worker, and the tenants' rate limits.
    pub admission: Admission,
    /// Sessions bound to the worker their last request went to (`router.session_affinity`).
    sessions: crate::sessions::Sessions,
    /// Requests whose policy asked for lifecycle notifications, and their delivery.
    lifecycles: Lifecycles,
    /// Where retired generations and partitions are dropped: never on a caller's thread.
    retirement: Arc<Retirement>,
    pub metrics: Metrics,
}

/// A selection whose policy was told `on_selected`: followed until the request ends.
struct Notified {
    slot: Arc<SelectorSlot>,
    outcome: Outcome,
    at: Instant,
}

/// Per-thread buffers of one request: nothing is allocated once warm.
#[derive(Default)]
struct Scratch {
    hashed: Vec<u64>,
    selection: SelectionScratch,
}

/// The buffers of one selection.
#[derive(Default)]
struct SelectionScratch {
    query: QueryScratch,
    /// The candidates: a partition's kept columns, lent, and the request's own, written
    /// under the fleet's locks and run by the policy without them.
    candidates: Candidates,
    /// Which candidates a gateway's subset hint allows.
    allowed: Vec<u8>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = Default::default();
}

/// Clears `allowed` for each candidate outside the request's `only` set (`narrowing`:
/// on top of the busy marks already there; else `allowed` is written afresh). Whether any
/// candidate is in the set.
fn mark_only(
    only: &FxHashSet<WorkerId>,
    columns: &switchyard_plugin_host::plugin::Columns<'_>,
    allowed: &mut Vec<u8>,
    narrowing: bool,
) -> bool {
    let ids = columns.worker_id.iter().zip(columns.dp_rank);
    let in_only =
        ids.map(|(&worker_id, &dp_rank)| u8::from(only.contains(&WorkerId { worker_id, dp_rank })));
    let mut any = 0;
    if narrowing {
        for (allowed, ok) in allowed.iter_mut().zip(in_only) {
            any |= ok;
            *allowed &= ok;
        }
    } else {
        allowed.clear();
        allowed.extend(in_only.inspect(|&ok| any |= ok));
    }
    any != 0
}

impl Router {
    /// A router over a started config, with the config's static workers.
    pub fn new(startup: Startup) -> Result<Self, RouteError> {
        // Before any request: the first selection must not wait for the calibration.
        Stopwatch::calibrate();
        let expiry = Duration::from_secs(startup.config().router.request_expiry_secs);
        let workers = startup.config().workers.clone();
        let metrics = Metrics::new(startup.instances.iter().map(|i| i.name.as_str()));
        let retirement = Arc::new(Retirement::new());
        let router = Router {
            generations: Generations {
                serving: RwLock::new(Arc::new(Generation::new(1, startup))),
                changing: Mutex::new(()),
            },
            membership: Membership::default(),
            kv: KvState::default(),
            bookings: Bookings::new(expiry),
            admission: Admission {
                queue: AdmissionQueue::new(metrics.admission.clone()),
                rate_limits: RateLimiter::default(),
            },
            sessions: crate::sessions::Sessions::default(),
            lifecycles: Lifecycles::new(),
            retirement,
            metrics,
        };
        for spec in workers {
            router.add_worker(spec)?;
        }
        let generation = router.generation();
        router
            .metrics
            .record_generation(generation.number, generation.loaded_at);
        Ok(router)
    }

    /// Changes the worker registry and, before any selection sees the change, the kept
    /// columns of the partitions it touched (under the registry's lock, so concurrent
    /// changes reach the columns in the order they happened).
    fn change_workers<R>(&self, change: impl FnOnce(&mut Workers) -> R) -> R {
        let mut state = self.membership.state.write();
        let result = change(&mut state.workers);
        let changed = state.workers.take_changed();
        if !changed.is_empty() {
            let load = self.bookings.load.read();
            let mut columns = self.bookings.columns.lock();
            for (partition, appended) in changed {
                columns.rebuild(&partition, &state.workers, &load, appended);
            }
        }
        result
    }

    /// Takes a request of `tokens` prompt tokens from `tenant`'s rate limit, if the
    /// config sets one for it (or `"*"` for any tenant).
    pub fn within_rate(&self, tenant: Option<&str>, tokens: u64) -> Result<(), OverRate> {
        let generation = self.generation();
        let Some(admission) = generation.config().admission.as_ref() else {
            return Ok(());
        };
        let tenant = tenant.unwrap_or("");
        let limits = &admission.rate_limits;
        let Some(limit) = limits.get(tenant).or_else(|| limits.get("*")) else {
            return Ok(());
        };
        let result = self.admission.rate_limits.take(tenant, tokens, limit);
        if result.is_err() {
            self.metrics
                .admission
                .rate_limited
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        result
    }

    /// The generation now serving (a selection holds on to the one it started with).
    pub fn generation(&self) -> Arc<Generation> {
        self.generations.serving.read().clone()
    }

    pub fn block_size(&self) -> u32 {
        self.generations.serving.read().config().router.block_size
    }

    /// Select only: where the request would go; nothing is booked.
    pub fn select(&self, request: &RouteRequest) -> Result<RouteDecision, RouteError> {
        let request_id = validate(request, false)?;
        self.route(request, false, request_id)
    }

    /// Select and book the request's load on the chosen worker, under its `request_id`.
    pub fn select_and_reserve(&self, request: &RouteRequest) -> Result<RouteDecision, RouteError> {
        let request_id = validate(request, true)?;
        self.route(request, true, request_id)
    }

    /// Select and book under `request_id`, the booking's id, not the request's: a host
    /// that built the request once selects it again under a new id per try (its retries,
    /// a wait in the queue) without rebuilding it.
    pub fn reserve_as(
        &self,
        request: &RouteRequest,
        request_id: &str,
    ) -> Result<RouteDecision, RouteError> {
        if request_id.is_empty() {
            return Err(BadRequest::EmptyRequestId.into());
        }
        validate(request, false)?;
        self.route(request, true, Some(request_id))
    }

    /// Shutdown: delivers the queued lifecycle notifications, drops the retired plugin
    /// state nothing holds any more (waiting up to `limit`), and stops both threads, so
    /// that no plugin code runs while the process exits. Call it off the executor, once
    /// the listeners have drained.
    pub fn finish_plugin_threads(&self, limit: Duration) {
        self.lifecycles.finish();
        self.retirement.finish(limit);
    }

    /// The candidate columns the next selection of `partition` would be lent (tests
    /// compare them with the registry and the bookings).
    #[doc(hidden)]
    pub fn kept_columns(&self, partition: &PartitionKey) -> Option<Arc<KeptColumns>> {
        let kv = self.kv.index.read();
        let lent = self.bookings.columns.lock().lend(partition, &kv)?;
        Some(lent.columns)
    }

    /// Selects (and with `reserve` books) a worker for `request`. A pick that another
    /// selection filled past a busy threshold before this one could book it is made
    /// again, over the columns that now show that booking, at most `BOOKING_TRIES` times.
    /// The booking's `request_id` was checked by the caller (`validate`).
    fn route(
        &self,
        request: &RouteRequest,
        reserve: bool,
        request_id: Option<&str>,
    ) -> Result<RouteDecision, RouteError> {
        for _ in 0..BOOKING_TRIES {
            if let Some(decision) = self.route_once(request, reserve, request_id)? {
                return Ok(decision);
            }
        }
        Err(Saturated::FilledFirst {
            model: request.model.clone(),
            tries: BOOKING_TRIES,
        }
        .into())
    }

    /// One selection (and booking); `None` when the pick filled up meanwhile.
    fn route_once(
        &self,
        request: &RouteRequest,
        reserve: bool,
        request_id: Option<&str>,
    ) -> Result<Option<RouteDecision>, RouteError> {
        let generation = self.generation();
        let instance = instance_for(&generation, request)?;
        // Decided inline for another generation (a reload came in between), and this
        // one's instance is a plugin's: not on the executor's thread.
        if crate::executor::is_inline() && !instance.runs_only_router_code() {
            return crate::executor::plugin_code(|| self.route_once(request, reserve, request_id));
        }
        let partition = PartitionKey::new(request.model.clone(), request.worker_type);
        let block_size = generation.config().router.block_size;
        // Strict priority: no request books while one of a higher priority waits (it
        // queues behind them; one of its own priority it may overtake while capacity
        // lasts). A try the queue granted is the highest waiting, so this holds it back
        // only when a higher one arrived since.
        if reserve {
            let ahead = self
                .admission
                .queue
                .waiting_above(&partition, request.strict_priority);
            if ahead > 0 {
                return Err(Saturated::Behind {
                    ahead,
                    model: request.model.clone(),
                    priority: request.strict_priority,
                }
                .into());
            }
        }

        SCRATCH.with(|scratch| {
            let scratch = &mut *scratch.borrow_mut();
            let (request_blocks, hashes) = prompt_blocks(request, block_size, &mut scratch.hashed)?;
            let pin = self.session_pin(&generation, request);
            let prompt = PromptBlocks::new(block_size, request_blocks)
                .with_affinity(pin.and_then(Pin::target));
            let query = Query {
                request,
                partition: &partition,
                hashes,
                request_blocks,
                pin,
            };
            let selected = self.select_with_fallback(
                &generation,
                instance,
                &query,
                prompt,
                reserve,
                &mut scratch.selection,
            );
            let candidates = &mut scratch.selection.candidates;
            let device_overlap = selected
                .as_ref()
                .map_or(0, |(chosen, ..)| candidates.device_overlap(*chosen));
            // Given back now: the booking below can then update the columns in place.
            candidates.release();
            let (chosen, fallback, notified) = selected?;
            if let (true, Some(id)) = (reserve, request_id) {
                let busy = generation.config().admission.as_ref();
                let busy = busy.map(|a| &a.busy).filter(|b| b.any());
                let booked =
                    self.reserve(request, id, chosen, (request_blocks, device_overlap), busy);
                if let Some(n) = notified {
                    // Told `on_selected`: exactly one `on_finished` follows, now if the
                    // booking failed.
                    self.lifecycles.track(id, n.slot, n.outcome, n.at);
                    if !matches!(booked, Ok(true)) {
                        self.lifecycles.finished(id);
                    }
                }
                if !booked? {
                    return Ok(None);
                }
            }
            self.session_dispatched(&generation, request, chosen);
            Ok(Some(RouteDecision {
                worker_id: chosen.worker_id,
                dp_rank: chosen.dp_rank,
                instance: instance.name.clone(),
                fallback,
                request_blocks,
                device_overlap_blocks: device_overlap,
                request_id: request_id.map(str::to_owned),
            }))
        })
    }

    /// Sets `scratch.candidates` up for the instance `name` under the fleet's read locks
    /// (released on return: plugin code never runs while they are held, so a slow
    /// component cannot stall the writers behind them, nor the readers behind those): the
    /// partition's kept columns, lent, and the request's cache overlaps. Returns the
    /// instance's selector.
    fn gather(
        &self,
        generation: &Generation,
        name: &str,
        query: &Query<'_>,
        scratch: &mut SelectionScratch,
    ) -> Result<Arc<SelectorSlot>, RouteError> {
        let state = self.membership.state.read();
        let kv = self.kv.index.read();
        let lent = self.bookings.columns.lock().lend(query.partition, &kv);
        let Some(lent) = lent.filter(|lent| !lent.columns.is_empty()) else {
            members_of(&state, query.request, query.partition)?;
            return Err(NoWorker::NoCandidatesYet(query.partition.clone()).into());
        };
        // Every partition with members has its policies in the current generation; an
        // older one (a reload happened meanwhile) may lack a partition added since.
        let slot = generation
            .selector(query.partition, name)
            .or_else(|| self.generation().selector(query.partition, name))
            .ok_or_else(|| NoWorker::NoPoliciesYet(query.partition.clone()))?;
        let busy = generation.config().admission.as_ref().map(|a| &a.busy);
        let busy = busy.filter(|b| b.any());
        // One byte per candidate, 1 where the worker may take the request: under every
        // busy threshold (computed here, from the kept columns) and in the request's
        // `only` set (below).
        if let Some(busy) = busy {
            // The prefill threshold is the request's own, below.
            mark_not_busy(
                busy,
                &busy_inputs(&lent.columns),
                &mut scratch.allowed,
                false,
            );
        }
        let candidates = &mut scratch.candidates;
        candidates.lend(slot.inputs, lent.columns);
        let query_scratch = &mut scratch.query;
        candidates.fill_request(query.request_blocks, |tiers| {
            kv.query_rows(query.hashes, query_scratch, &lent.slot_rows, tiers)
        });
        drop(kv);
        drop(state);
        if let Some(max) = busy.and_then(|b| b.max_active_prefill_tokens) {
            // Per request: released from the queue, a request goes where its cache is.
            mark_prefill_room(
                max,
                &candidates.kept().active_prefill_tokens,
                candidates.device_overlaps(),
                query.request_blocks,
                u64::from(generation.config().router.block_size),
                &mut scratch.allowed,
            );
        }
        if let Some(only) = &query.request.only {
            let columns = candidates.columns(None);
            if !mark_only(only, &columns, &mut scratch.allowed, busy.is_some()) {
                return Err(NoWorker::NoneAllowed {
                    model: query.request.model.clone(),
                }
                .into());
            }
        }
        let narrowed = query.request.only.is_some() || busy.is_some();
        let pinned = match query.pin {
            Some(pin) => pin.apply(candidates, &mut scratch.allowed, narrowed)?,
            None => false,
        };
        if narrowed || pinned {
            let kept = scratch
                .allowed
                .iter()
                .map(|&a| usize::from(a))
                .sum::<usize>();
            if kept == 0 {
                return Err(Saturated::EveryCandidate {
                    model: query.request.model.clone(),
                }
                .into());
            }
            // Nothing left out: the lent columns serve as they are.
            if kept < scratch.allowed.len() {
                candidates.retain(&scratch.allowed, slot.inputs);
            }
        }
        Ok(slot)
    }

    /// What a policy that asked for lifecycle notifications is told of its pick.
    fn selected_outcome(&self, worker: WorkerId, query: &Query<'_>) -> Outcome {
        Outcome {
            request_id: self.lifecycles.next_id(),
            worker,
            to_prefill_complete: None,
            to_finish: None,
            paired: query.request.paired,
        }
    }

    /// Runs `instance` over the partition's members; if it fails (not merely finding no
    /// worker) and its config says `on_error: fallback`, runs the built-in policy instead.
    /// Returns the chosen worker, whether the fallback chose it, and, when `booking` and
    /// the deciding policy asked for lifecycle notifications, what it was told.
    fn select_with_fallback(
        &self,
        generation: &Generation,
        instance: &InstanceFactory,
        query: &Query<'_>,
        prompt: PromptBlocks,
        booking: bool,
        scratch: &mut SelectionScratch,
    ) -> Result<(WorkerId, bool, Option<Notified>), RouteError> {
        let mut notified = None;
        let mut run =
            |name: &str| -> Result<(Result<WorkerId, SelectError>, Duration), RouteError> {
                let slot = self.gather(generation, name, query, scratch)?;
                let stopwatch = Stopwatch::start();
                let mut selector = lock_spinning(&slot.selector);
                let result = selector.select(
                    query.request,
                    prompt,
                    CandidatesFrom::Filled(&mut scratch.candidates),
                    None,
                );
                let elapsed = stopwatch.elapsed();
                if let (true, Ok(worker), true) = (booking, &result, selector.policy.notified()) {
                    // Before the lock is released: the instance hears of this pick before
                    // it makes its next one.
                    let outcome = self.selected_outcome(*worker, query);
                    // Failures are counted on the stage and logged; they change nothing.
                    let _ = selector.notify_selected(query.request, prompt, &outcome);
                    let (slot, at) = (slot.clone(), Instant::now());
                    notified = Some(Notified { slot, outcome, at });
                }
                drop(selector);
                self.metrics.record_selection(name, elapsed);
                Ok((result, elapsed))
            };
        let fallback_allowed =
            instance.on_error == OnError::Fallback && instance.name != BUILTIN_DEFAULT;
        // What the built-in policy's run, as the fallback, answers.
        let by_default = |result: Result<WorkerId, SelectError>| {
            result
                .map(|worker| (worker, true))
                .map_err(|error| RouteError::PolicyFailed {
                    instance: BUILTIN_DEFAULT.into(),
                    error,
                })
        };
        if fallback_allowed && instance.budget.is_some() && self.metrics.is_tripped(&instance.name)
        {
            // Tripped for being slow: the built-in policy routes until the cool-down ends.
            self.metrics.record_fallback(&instance.name);
            let picked = by_default(run(BUILTIN_DEFAULT)?.0)?;
            return Ok((picked.0, picked.1, notified));
        }
        let (result, elapsed) = run(&instance.name)?;
        if let Some(budget) = &instance.budget {
            if self.metrics.record_budget(&instance.name, elapsed, budget) {
                tracing::warn!(
                    instance = %instance.name,
                    budget_ms = budget.limit.as_secs_f64() * 1e3,
                    cooldown_s = budget.cooldown.as_secs(),
                    "instance over its call budget too often: tripped"
                );
            }
        }
        let error = match result {
            Ok(worker) => return Ok((worker, false, notified)),
            Err(error) => error,
        };
        self.metrics
            .record_error(&instance.name, error.component().unwrap_or("-"));
        if error.is_no_worker() {
            return Err(NoWorker::Policy(error).into());
        }
        tracing::warn!(
            instance = %instance.name,
            component = error.component().unwrap_or("-"),
            %error,
            "policy failed"
        );
        if !fallback_allowed {
            return Err(RouteError::PolicyFailed {
                instance: instance.name.clone(),
                error,
            });
        }
        self.metrics.record_fallback(&instance.name);
        let picked = by_default(run(BUILTIN_DEFAULT)?.0)?;
        Ok((picked.0, picked.1, notified))
    }

    /// Load went down (a booking freed, expired or left prefill): a waiting request, if
    /// any, gets its try.
    fn capacity_freed(&self) {
        self.admission.queue.release();
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

    /// Books the request's uncached prefill tokens and its decode blocks on `chosen`;
    /// `false` (nothing booked) when `chosen` is at an `admission.busy` threshold now.
    fn reserve(
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

    /// Renders Prometheus metrics.
    pub fn render_metrics(&self) -> String {
        let loads = self.loads();
        let generation = self.generation();
        let plugins = generation.startup.registry.plugins();
        let stages = generation.stages();
        let processes: Vec<_> = generation
            .startup
            .registry
            .processes()
            .map(|p| p.snapshot())
            .collect();
        let waiting = self.admission.queue.waiting_by_priority();
        self.metrics.render(
            &stages,
            &loads,
            self.kv_blocks(),
            plugins,
            &processes,
            &waiting,
        )
    }
}

/// The instance `request` is routed with: the one it names, else its role's default; an
/// error when there is no such instance or it does not serve the request's role.
fn instance_for<'g>(
    generation: &'g Generation,
    request: &RouteRequest,
) -> Result<&'g Arc<InstanceFactory>, RouteError> {
    let name = request
        .instance
        .as_deref()
        .unwrap_or_else(|| generation.startup.default_for(request.worker_type));
    let instance = generation
        .instance(name)
        .ok_or_else(|| RouteError::UnknownInstance {
            name: name.to_owned(),
            known: generation.instance_names(),
        })?;
    if !instance.serves(request.worker_type) {
        return Err(NoWorker::WrongRole {
            instance: instance.name.clone(),
            serves: instance.serves.clone(),
            wanted: request.worker_type,
        }
        .into());
    }
    Ok(instance)
}

/// What the busy thresholds read of a partition's columns.
fn busy_inputs(columns: &KeptColumns) -> BusyInputs<'_> {
    BusyInputs {
        active_requests: &columns.active_requests,
        active_prefill_tokens: &columns.active_prefill_tokens,
        active_decode_blocks: &columns.active_decode_blocks,
        engine: &columns.engine,
    }
}

/// The members of the request's partition; an error when it has none.
fn members_of<'s>(
    state: &'s State,
    request: &RouteRequest,
    partition: &PartitionKey,
) -> Result<&'s [WorkerId], RouteError> {
    let members = state.workers.members(partition);
    match members {
        members if !members.is_empty() => Ok(members),
        _ if state.workers.unhealthy_in(partition) > 0 => Err(NoWorker::AllUnhealthy {
            model: request.model.clone(),
            worker_type: request.worker_type,
            unhealthy: state.workers.unhealthy_in(partition),
        }
        .into()),
        _ if state.workers.has_model(&request.model) => Err(NoWorker::NoneOfType {
            model: request.model.clone(),
            worker_type: request.worker_type,
        }
        .into()),
        _ => Err(RouteError::UnknownModel(request.model.clone())),
    }
}

/// What one request asks of the fleet.
struct Query<'a> {
    request: &'a RouteRequest,
    partition: &'a PartitionKey,
    hashes: &'a [u64],
    request_blocks: u64,
    /// The worker the request's session is bound to, and how strongly.
    pin: Option<Pin>,
}
