//! The per-request path allocates nothing once warm: a counting global allocator watches
//! selections through the built-in policy and the Rust, C and C++ plugins (host side and
//! Rust plugin side; the C/C++ examples do not allocate in their callbacks either), over
//! columns filled from rows and over kept columns lent as the router does; and KV-index
//! queries, per slot and in a partition's row order.

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use std::sync::Arc;
use support::*;

use switchyard::plugin::{PromptBlocks, RouteRequest};
use switchyard::policy::{CandidatesFrom, KeptColumns, RowExtras};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to the system allocator with the caller's arguments.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded under the caller's GlobalAlloc contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded under the caller's GlobalAlloc contract.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded under the caller's GlobalAlloc contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The counter is global: the tests here run one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Allocations made by `f`.
fn allocations_in(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    f();
    ALLOCATIONS.load(Ordering::Relaxed) - before
}

fn kept_columns(candidates: &[switchyard::policy::CandidateRow]) -> KeptColumns {
    let mut kept = KeptColumns::default();
    for row in candidates {
        kept.worker_id.push(row.worker.worker_id);
        kept.dp_rank.push(row.worker.dp_rank);
        kept.active_prefill_tokens
            .push(row.load.active_prefill_tokens);
        kept.active_decode_blocks.push(0);
        kept.active_requests.push(row.load.active_requests);
        kept.preferred_taint_multiplier.push(f64::NAN);
    }
    kept
}

#[test]
fn warm_selections_do_not_allocate() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "plugins:\n  - path: {}\n  - path: {}\n  - path: {}\nworker_selection:\n  builtin_default: {{seed: 1}}\n  instances:\n\
         \x20   - {{name: builtin, type: builtin.least-busy, parameters: {{min_device_overlap_blocks: 2}}}}\n\
         \x20   - {{name: rust, type: least-busy, parameters: {{min_device_overlap_blocks: 2}}}}\n\
         \x20   - {{name: c, type: c.least-busy, parameters: {{min_device_overlap_blocks: 2}}}}\n\
         \x20   - {{name: cpp, type: cpp.least-busy, parameters: {{min_device_overlap_blocks: 2}}}}\n",
        rust_plugin("least_busy").display(),
        cmake_plugin("least_busy_c").display(),
        cmake_plugin("least_busy_cpp").display()
    );
    let startup = start_yaml(dir.path(), &config).unwrap();
    let fleet: Vec<W> = (0..256)
        .map(|i| W {
            id: i,
            device: (i % 7) as u32,
            active: (i % 5) as u32,
        })
        .collect();
    let candidates = rows(&fleet);
    // The same fleet as a partition's kept columns, as the router lends them.
    let kept = Arc::new(kept_columns(&candidates));
    let (request, prompt) = (RouteRequest::default(), PromptBlocks::new(16, 64));
    for instance in ["builtin", "rust", "c", "cpp", "default"] {
        let mut selector = selector(&startup, instance);
        let extras = RowExtras::default();
        let mut from_rows = || {
            let from = CandidatesFrom::Rows(&candidates, &extras);
            selector.select(&request, prompt, from, None).unwrap()
        };
        from_rows(); // grows the buffers
        let allocations = allocations_in(|| {
            for _ in 0..100 {
                from_rows();
            }
        });
        assert_eq!(
            allocations, 0,
            "instance {instance}: {allocations} allocations in 100 warm selections"
        );
        let lent = |selector: &mut switchyard::policy::Selector| {
            selector
                .select(
                    &request,
                    prompt,
                    CandidatesFrom::Lent(&kept, &mut |[device, host, disk]| {
                        for (row, c) in candidates.iter().enumerate() {
                            device[row] = c.cache.device_overlap_blocks;
                            host[row] = c.cache.host_overlap_blocks;
                            disk[row] = c.cache.disk_overlap_blocks;
                        }
                        64
                    }),
                    None,
                )
                .unwrap()
        };
        lent(&mut selector); // grows the request's buffers
        let allocations = allocations_in(|| {
            (0..100).for_each(|_| {
                lent(&mut selector);
            })
        });
        assert_eq!(
            allocations, 0,
            "instance {instance}: {allocations} allocations in 100 warm selections over lent columns"
        );
    }
}

/// KV queries of both shapes allocate nothing once warm: a request many workers hold to
/// different depths (the dense walk, through bitsets and then lists, written per slot and
/// in a partition's row order) and one held by a few (run by run).
#[test]
fn warm_kv_queries_do_not_allocate() {
    use switchyard::fleet::kv_index::{KvEvent, KvIndex, QueryScratch, SlotRows, Tier};
    use switchyard_plugin_sdk::WorkerId;

    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let chain: Vec<u64> = (0..64).map(|i| 1_000 + i).collect();
    let few: Vec<u64> = (0..64).map(|i| 5_000 + i).collect();
    let mut index = KvIndex::default();
    let worker = |w: u64| WorkerId {
        worker_id: w,
        dp_rank: 0,
    };
    for w in 0..1024u64 {
        let held = ((w * 7919) % 65) as usize;
        let event = KvEvent::Stored {
            tier: Tier::Device,
            parent_hash: None,
            block_hashes: chain[..held].to_vec(),
        };
        index.apply(worker(w), &event);
    }
    for w in 0..2u64 {
        let event = KvEvent::Stored {
            tier: Tier::Host,
            parent_hash: None,
            block_hashes: few.to_vec(),
        };
        index.apply(worker(w), &event);
    }
    let mut rows = SlotRows::default();
    rows.set((0..1024u64).rev().map(|w| index.slot_of(worker(w))));
    let mut columns: [Vec<u32>; 3] = std::array::from_fn(|_| vec![0; 1024]);
    let mut scratch = QueryScratch::default();
    for (hashes, tier) in [(&chain, Tier::Device), (&few, Tier::Host)] {
        let mut query = || {
            let result = index.query(hashes, &mut scratch);
            std::hint::black_box(result.overlap(worker(3)));
            let [device, host, disk] = &mut columns;
            std::hint::black_box(index.query_rows(
                hashes,
                &mut scratch,
                &rows,
                [device, host, disk],
            ));
        };
        query(); // grows the scratch
        let allocations = allocations_in(|| (0..100).for_each(|_| query()));
        assert_eq!(
            allocations, 0,
            "{allocations} allocations in 100 warm queries"
        );
        assert!(
            columns[tier as usize].iter().any(|&d| d > 0),
            "the query found the prefixes in {tier:?}"
        );
    }
}
