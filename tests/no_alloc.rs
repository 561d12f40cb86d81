//! The per-request path allocates nothing once warm: a counting global allocator watches
//! selections through the built-in policy and the Rust, C and C++ plugins (host side and
//! Rust plugin side; the C/C++ examples do not allocate in their callbacks either), over
//! columns filled from rows and over kept columns lent as the router does.

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use std::sync::Arc;
use support::*;

use switchyard::plugin::RequestContext;
use switchyard::policy::KeptColumns;

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

#[test]
fn warm_selections_do_not_allocate() {
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
    let mut kept = KeptColumns::default();
    for row in &candidates {
        kept.worker_id.push(row.worker.worker_id);
        kept.dp_rank.push(row.worker.dp_rank);
        kept.active_prefill_tokens
            .push(row.load.active_prefill_tokens);
        kept.active_decode_blocks.push(0);
        kept.active_requests.push(row.load.active_requests);
        kept.preferred_taint_multiplier.push(f64::NAN);
    }
    let kept = Arc::new(kept);
    let request = RequestContext::new(16, 64);
    for instance in ["builtin", "rust", "c", "cpp", "default"] {
        let mut selector = selector(&startup, instance);
        selector
            .select(&request, candidates.iter().copied())
            .unwrap(); // grows the buffers
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        for _ in 0..100 {
            selector
                .select(&request, candidates.iter().copied())
                .unwrap();
        }
        let allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
        assert_eq!(
            allocations, 0,
            "instance {instance}: {allocations} allocations in 100 warm selections"
        );
        let lent = |selector: &mut switchyard::policy::Selector| {
            selector
                .select_lent(&request, &kept, |[device, host, disk]| {
                    for (row, c) in candidates.iter().enumerate() {
                        device[row] = c.cache.device_overlap_blocks;
                        host[row] = c.cache.host_overlap_blocks;
                        disk[row] = c.cache.disk_overlap_blocks;
                    }
                    64
                })
                .unwrap()
        };
        lent(&mut selector); // grows the request's buffers
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        for _ in 0..100 {
            lent(&mut selector);
        }
        let allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
        assert_eq!(
            allocations, 0,
            "instance {instance}: {allocations} allocations in 100 warm selections over lent columns"
        );
    }
}
