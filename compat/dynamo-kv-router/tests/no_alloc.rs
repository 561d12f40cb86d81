//! Selection through the adapters allocates nothing once warm: a counting global allocator
//! watches selections of a guide-shaped and a current-shaped policy (filter, scorer and a
//! picker reading the LOAD rows), through the same SDK calls the router makes.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use dynamo_kv_router::plugins::worker_selection as current;
use dynamo_kv_router::testing::{Row, Selection};
use dynamo_kv_router::{
    KvRouterConfig, WorkerCandidate, WorkerFilter, WorkerInputView, WorkerInputs, WorkerPicker,
    WorkerScorer, WorkerSelectionContext, WorkerSelectionPolicy, WorkerSelectionPolicyError,
};
use switchyard_plugin_sdk::PolicyParts;

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Set on the thread whose selections are watched: the test harness's other threads
    /// allocate when they will (under load, while a selection runs), which is not the
    /// adapters' doing.
    static WATCHED: Cell<bool> = const { Cell::new(false) };
}

/// Counts an allocation made on the watched thread.
fn count() {
    if WATCHED.with(Cell::get) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to the system allocator with the caller's arguments.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded under the caller's GlobalAlloc contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded under the caller's GlobalAlloc contract.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: forwarded under the caller's GlobalAlloc contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

struct CachedAtLeast(f64);

impl WorkerFilter for CachedAtLeast {
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::CACHE
    }
    fn keep(
        &mut self,
        _: &WorkerSelectionContext<'_>,
        candidate: &WorkerCandidate,
    ) -> Result<bool, WorkerSelectionPolicyError> {
        Ok(candidate.cache().map(|c| c.device_overlap_blocks()) >= Some(self.0))
    }
}

struct Active;

impl WorkerScorer for Active {
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::LOAD
    }
    fn score(
        &mut self,
        _: &WorkerSelectionContext<'_>,
        candidate: &WorkerCandidate,
    ) -> Result<f64, WorkerSelectionPolicyError> {
        Ok(candidate.load().map_or(0, |l| l.active_requests()) as f64)
    }
}

struct LeastLoaded;

impl WorkerPicker for LeastLoaded {
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::LOAD
    }
    fn pick(
        &mut self,
        _: &WorkerSelectionContext<'_>,
        input: WorkerInputView<'_>,
    ) -> Result<usize, WorkerSelectionPolicyError> {
        let load = input
            .load()
            .ok_or_else(|| WorkerSelectionPolicyError::failed("no load"))?;
        (0..load.len())
            .min_by_key(|&row| {
                (
                    load[row].active_requests(),
                    input.candidates()[row].worker(),
                )
            })
            .ok_or_else(|| WorkerSelectionPolicyError::failed("no eligible worker"))
    }
}

struct CurrentCachedAtLeast(f64);

impl current::WorkerFilter for CurrentCachedAtLeast {
    fn required_worker_inputs(&self) -> current::WorkerInputs {
        current::WorkerInputs::CACHE
    }
    fn keep(
        &mut self,
        _: &WorkerSelectionContext<'_>,
        candidate: current::WorkerCandidate<'_>,
    ) -> Result<bool, WorkerSelectionPolicyError> {
        Ok(candidate.cache().map(|c| c.device_overlap_blocks()) >= Some(self.0))
    }
}

struct CurrentActive;

impl current::WorkerScorer for CurrentActive {
    fn required_worker_inputs(&self) -> current::WorkerInputs {
        current::WorkerInputs::LOAD
    }
    fn score(
        &mut self,
        _: &WorkerSelectionContext<'_>,
        candidates: current::WorkerCandidates<'_>,
        costs: &mut [f64],
    ) -> Result<(), WorkerSelectionPolicyError> {
        for (cost, candidate) in costs.iter_mut().zip(candidates.iter()) {
            *cost = candidate.load().map_or(0, |l| l.active_requests()) as f64;
        }
        Ok(())
    }
}

struct CurrentLeastLoaded;

impl current::WorkerPicker for CurrentLeastLoaded {
    fn required_worker_inputs(&self) -> current::WorkerInputs {
        current::WorkerInputs::LOAD
    }
    fn pick(
        &mut self,
        _: &WorkerSelectionContext<'_>,
        input: current::WorkerInputView<'_>,
    ) -> Result<usize, WorkerSelectionPolicyError> {
        let load = input
            .load()
            .ok_or_else(|| WorkerSelectionPolicyError::failed("no load"))?;
        (0..load.len())
            .min_by_key(|&row| {
                (
                    load[row].active_requests(),
                    input.candidates()[row].worker(),
                )
            })
            .ok_or_else(|| WorkerSelectionPolicyError::failed("no eligible worker"))
    }
}

fn rows() -> Vec<Row> {
    (1..=256u64)
        .map(|id| Row {
            device_overlap_blocks: (id % 16) as u32,
            active_requests: (id * 7 % 32) as u32,
            ..Row::worker(id)
        })
        .collect()
}

/// Allocations over 100 selections after 3 warm ones.
fn allocations_when_warm(mut parts: PolicyParts) -> usize {
    let mut selection = Selection::new(&rows());
    for _ in 0..3 {
        selection.select(&mut parts, 64).unwrap();
    }
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    WATCHED.with(|watched| watched.set(true));
    for _ in 0..100 {
        std::hint::black_box(selection.select(&mut parts, 64).unwrap());
    }
    WATCHED.with(|watched| watched.set(false));
    ALLOCATIONS.load(Ordering::Relaxed) - before
}

#[test]
fn warm_selections_through_the_adapters_allocate_nothing() {
    let guide = WorkerSelectionPolicy::new_with_filters(
        KvRouterConfig::default(),
        "select",
        vec![Box::new(CachedAtLeast(4.0))],
        vec![Box::new(Active)],
        Box::new(LeastLoaded),
    );
    assert_eq!(allocations_when_warm(guide.into_parts()), 0, "guide shape");
    let current = current::WorkerSelectionPolicy::new_with_filters(
        KvRouterConfig::default(),
        "aggregated",
        vec![Box::new(CurrentCachedAtLeast(4.0))],
        vec![Box::new(CurrentActive)],
        Box::new(CurrentLeastLoaded),
    );
    assert_eq!(
        allocations_when_warm(current.into_parts()),
        0,
        "current shape"
    );
}
