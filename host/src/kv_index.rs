//! The KV-cache index: which worker holds which blocks, per tier (device, host, disk), fed
//! by KV events. For a request's block hashes it yields each worker's contiguous prefix
//! overlap per tier, and how far the prefix is cached anywhere in the fleet.
//!
//! Block hashes are chained (each one covers its block and every block before it), so a
//! hash names a whole prefix; the index keeps, per tier, hash -> holders and, per worker,
//! the hashes it holds (for removal and clearing).

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};
use switchyard_plugin_sdk::WorkerId;

/// A cache tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    Device,
    Host,
    Disk,
}

impl Tier {
    pub const ALL: [Tier; 3] = [Tier::Device, Tier::Host, Tier::Disk];
    fn index(self) -> usize {
        self as usize
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Device => "device",
            Tier::Host => "host",
            Tier::Disk => "disk",
        }
    }
}

/// One KV event from a worker.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum KvEvent {
    /// Blocks stored, in prefix order; `parent_hash` is the block before the first one.
    Stored {
        #[serde(default = "device")]
        tier: Tier,
        #[serde(default)]
        parent_hash: Option<u64>,
        block_hashes: Vec<u64>,
    },
    /// Blocks removed from a tier.
    Removed {
        #[serde(default = "device")]
        tier: Tier,
        block_hashes: Vec<u64>,
    },
    /// Every block of the worker removed, in every tier (or one tier if given).
    Cleared {
        #[serde(default)]
        tier: Option<Tier>,
    },
}

fn device() -> Tier {
    Tier::Device
}

/// Overlap of one worker with one request, in blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Overlap {
    /// Contiguous prefix length per tier (device, host, disk).
    pub tiers: [u32; 3],
}

impl Overlap {
    pub fn tier(&self, tier: Tier) -> u32 {
        self.tiers[tier.index()]
    }
}

#[derive(Default)]
struct TierIndex {
    holders: HashMap<u64, HashSet<WorkerId>>,
    held: HashMap<WorkerId, HashSet<u64>>,
}

impl TierIndex {
    fn store(&mut self, worker: WorkerId, hashes: &[u64]) {
        let held = self.held.entry(worker).or_default();
        for &hash in hashes {
            if held.insert(hash) {
                self.holders.entry(hash).or_default().insert(worker);
            }
        }
    }

    fn remove(&mut self, worker: WorkerId, hashes: impl IntoIterator<Item = u64>) {
        for hash in hashes {
            if let Some(set) = self.holders.get_mut(&hash) {
                set.remove(&worker);
                if set.is_empty() {
                    self.holders.remove(&hash);
                }
            }
            if let Some(held) = self.held.get_mut(&worker) {
                held.remove(&hash);
            }
        }
    }

    fn clear(&mut self, worker: WorkerId) {
        if let Some(held) = self.held.remove(&worker) {
            self.remove(worker, held);
        }
    }

    /// Walks the request's hashes keeping the set of workers that matched every block so
    /// far; a worker's prefix ends where it drops out. `out` gets each worker's length.
    fn prefixes(
        &self,
        hashes: &[u64],
        active: &mut Vec<WorkerId>,
        next: &mut Vec<WorkerId>,
        mut out: impl FnMut(WorkerId, u32),
    ) -> u32 {
        active.clear();
        let Some(first) = hashes.first().and_then(|h| self.holders.get(h)) else {
            return 0;
        };
        active.extend(first.iter().copied());
        let mut depth = 1u32;
        for hash in &hashes[1..] {
            let Some(holders) = self.holders.get(hash) else {
                break;
            };
            next.clear();
            for &worker in active.iter() {
                if holders.contains(&worker) {
                    next.push(worker);
                } else {
                    out(worker, depth);
                }
            }
            std::mem::swap(active, next);
            if active.is_empty() {
                break;
            }
            depth += 1;
        }
        for &worker in active.iter() {
            out(worker, depth);
        }
        depth
    }

    fn blocks(&self) -> usize {
        self.held.values().map(HashSet::len).sum()
    }
}

/// Reusable buffers for queries, so a lookup allocates nothing once warm.
#[derive(Default)]
pub struct QueryScratch {
    pub overlaps: HashMap<WorkerId, Overlap>,
    active: Vec<WorkerId>,
    next: Vec<WorkerId>,
}

/// The result of a query, borrowed from the scratch.
pub struct QueryResult<'a> {
    overlaps: &'a HashMap<WorkerId, Overlap>,
    /// The longest prefix of the request cached anywhere (any worker, any tier).
    pub fleet_prefix: u32,
}

impl QueryResult<'_> {
    /// The worker's overlap; zero in every tier when it holds nothing of the prefix.
    pub fn overlap(&self, worker: WorkerId) -> Overlap {
        self.overlaps.get(&worker).copied().unwrap_or_default()
    }
    /// Blocks of the request beyond the worker's device prefix that are cached somewhere
    /// in the fleet (and could be fetched instead of recomputed).
    pub fn shared_beyond_device(&self, worker: WorkerId) -> u32 {
        self.fleet_prefix
            .saturating_sub(self.overlap(worker).tier(Tier::Device))
    }
}

#[derive(Default)]
pub struct KvIndex {
    tiers: [TierIndex; 3],
}

impl KvIndex {
    pub fn apply(&mut self, worker: WorkerId, event: &KvEvent) {
        match event {
            KvEvent::Stored {
                tier, block_hashes, ..
            } => self.tiers[tier.index()].store(worker, block_hashes),
            KvEvent::Removed { tier, block_hashes } => {
                self.tiers[tier.index()].remove(worker, block_hashes.iter().copied())
            }
            KvEvent::Cleared { tier: Some(tier) } => self.tiers[tier.index()].clear(worker),
            KvEvent::Cleared { tier: None } => self.remove_worker(worker),
        }
    }

    /// Forgets everything a worker held (it left the fleet).
    pub fn remove_worker(&mut self, worker: WorkerId) {
        for tier in &mut self.tiers {
            tier.clear(worker);
        }
    }

    /// Per-worker contiguous prefix overlap per tier for `hashes`.
    pub fn query<'a>(&self, hashes: &[u64], scratch: &'a mut QueryScratch) -> QueryResult<'a> {
        scratch.overlaps.clear();
        let mut fleet_prefix = 0;
        for tier in Tier::ALL {
            let overlaps = &mut scratch.overlaps;
            let depth = self.tiers[tier.index()].prefixes(
                hashes,
                &mut scratch.active,
                &mut scratch.next,
                |worker, len| {
                    overlaps.entry(worker).or_default().tiers[tier.index()] = len;
                },
            );
            fleet_prefix = fleet_prefix.max(depth);
        }
        QueryResult {
            overlaps: &scratch.overlaps,
            fleet_prefix,
        }
    }

    /// Blocks held per tier, for metrics.
    pub fn blocks(&self) -> [usize; 3] {
        [
            self.tiers[0].blocks(),
            self.tiers[1].blocks(),
            self.tiers[2].blocks(),
        ]
    }
}

/// Hashes token ids into chained block hashes: block i's hash covers tokens
/// [0, (i+1) * block_size), so equal hashes mean equal prefixes. A trailing partial block
/// is not hashed (it cannot be cached yet).
pub fn hash_tokens(tokens: &[u32], block_size: u32, out: &mut Vec<u64>) {
    out.clear();
    let mut parent = 0x9e37_79b9_7f4a_7c15u64;
    for block in tokens.chunks_exact(block_size.max(1) as usize) {
        let mut hash = parent ^ 0xcbf2_9ce4_8422_2325;
        for &token in block {
            for byte in token.to_le_bytes() {
                hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        // A final avalanche so nearby token sequences do not give nearby hashes.
        hash ^= hash >> 33;
        hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
        hash ^= hash >> 33;
        out.push(hash);
        parent = hash;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chained_hashes_name_prefixes() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        hash_tokens(&[1, 2, 3, 4, 5, 6, 7], 2, &mut a);
        hash_tokens(&[1, 2, 3, 9, 5, 6], 2, &mut b);
        assert_eq!(a.len(), 3);
        assert_eq!(a[0], b[0]);
        assert_ne!(a[1], b[1]);
        assert_ne!(a[2], b[2], "a later block differs when an earlier one does");
    }
}
