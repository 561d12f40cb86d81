//! What the selection and isolation benchmarks share: where the example plugins are, and
//! the synthetic fleet both measure on.

use std::path::PathBuf;

use rand::{Rng, SeedableRng};
use std::sync::Arc;

use switchyard::policy::{CandidateRow, KeptColumns};
use switchyard_plugin_sdk::CandidateCache;
use switchyard_plugin_sdk::WorkerId;

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// The three languages' least-busy example libraries (Rust from this build's output
/// folder, C and C++ from CMake's), as config paths; `make` names the target that
/// builds them.
pub fn least_busy_plugins(make: &str) -> [String; 3] {
    let out = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_owned();
    [
        out.join("libleast_busy.so"),
        repo().join("target/plugins/libleast_busy_c.so"),
        repo().join("target/plugins/libleast_busy_cpp.so"),
    ]
    .map(|path| {
        assert!(
            path.exists(),
            "{} is missing: run `make {make}` (it builds the plugins first)",
            path.display()
        );
        path.display().to_string()
    })
}

/// The request-independent columns of `rows`, as the router keeps them per partition
/// (booked decode blocks: the rows' decode cost less a 64-block request's uncached part).
pub fn kept(rows: &[CandidateRow]) -> Arc<KeptColumns> {
    let mut kept = KeptColumns::default();
    for row in rows {
        let uncached = 64u64.saturating_sub(u64::from(row.cache.device_overlap_blocks));
        kept.worker_id.push(row.worker.worker_id);
        kept.dp_rank.push(row.worker.dp_rank);
        kept.active_prefill_tokens
            .push(row.load.active_prefill_tokens);
        kept.active_decode_blocks
            .push(row.load.decode_cost_blocks.saturating_sub(uncached));
        kept.active_requests.push(row.load.active_requests);
        kept.preferred_taint_multiplier
            .push(row.preferred_taint_multiplier);
    }
    Arc::new(kept)
}

/// The request's cache overlaps, one column per tier as the KV index writes them.
pub struct Overlaps {
    tiers: [Vec<u32>; 3],
    fleet_prefix: u32,
}

impl Overlaps {
    /// What the router's KV query does per request: every row's overlaps written into
    /// the candidates' columns; returns the fleet prefix.
    pub fn write(&self, out: [&mut [u32]; 3]) -> u32 {
        for (column, tier) in out.into_iter().zip(&self.tiers) {
            // Backwards when the column starts a little past the copy's source modulo 4
            // KiB: a forward copy then stalls every load on the store just made (4K
            // aliasing), which made one variant's selections 1.4x slower for one heap
            // layout, in this copy the router does not make.
            let gap = (column.as_ptr() as usize).wrapping_sub(tier.as_ptr() as usize) % 4096;
            match gap < 1024 {
                true => {
                    for (to, from) in column.iter_mut().zip(tier).rev() {
                        *to = *from;
                    }
                }
                false => column.copy_from_slice(tier),
            }
        }
        self.fleet_prefix
    }
}

pub fn overlaps(rows: &[CandidateRow]) -> Overlaps {
    let column = |tier: fn(&CandidateCache) -> u32| rows.iter().map(|r| tier(&r.cache)).collect();
    let tiers: [Vec<u32>; 3] = [
        column(|c| c.device_overlap_blocks),
        column(|c| c.host_overlap_blocks),
        column(|c| c.disk_overlap_blocks),
    ];
    let fleet_prefix = tiers.iter().flatten().copied().max().unwrap_or(0);
    Overlaps {
        tiers,
        fleet_prefix,
    }
}

/// A fixed synthetic fleet: device overlap 0..64 blocks, 0..32 active requests.
pub fn fleet(size: usize) -> Vec<CandidateRow> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(size as u64);
    (0..size)
        .map(|i| {
            let mut row = CandidateRow::new(WorkerId {
                worker_id: i as u64,
                dp_rank: 0,
            });
            let device = rng.gen_range(0..64);
            row.cache.device_overlap_blocks = device;
            row.cache.host_overlap_blocks = device + rng.gen_range(0..8);
            row.cache.disk_overlap_blocks = row.cache.host_overlap_blocks;
            row.load.active_requests = rng.gen_range(0..32);
            row.load.active_prefill_tokens = u64::from(row.load.active_requests) * 512;
            row.load.decode_cost_blocks = u64::from(row.load.active_requests) * 40;
            row
        })
        .collect()
}
