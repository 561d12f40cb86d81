//! The KV-cache index: which worker holds which blocks, per tier (device, host, disk), fed
//! by KV events. For a request's block hashes it yields each worker's contiguous prefix
//! overlap per tier, and how far the prefix is cached anywhere in the fleet.
//!
//! Block hashes are chained (each one covers its block and every block before it), so a
//! hash names a whole prefix; the index keeps, per tier, hash -> the set of workers holding
//! it (a bitset over dense worker slots) and, per worker, the hashes it holds (for removal
//! and clearing).

use rustc_hash::{FxHashMap, FxHashSet};

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

impl KvEvent {
    /// What a worker's device cache reports after making room: the evicted blocks
    /// removed, then the new ones stored.
    pub fn evicted_then_stored(removed: Vec<u64>, stored: Vec<u64>) -> [KvEvent; 2] {
        [
            KvEvent::Removed {
                tier: Tier::Device,
                block_hashes: removed,
            },
            KvEvent::Stored {
                tier: Tier::Device,
                parent_hash: None,
                block_hashes: stored,
            },
        ]
    }
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

/// Workers as dense slots, so holder sets are bitsets and query results are arrays.
#[derive(Default)]
struct Slots {
    by_worker: FxHashMap<WorkerId, u32>,
    count: u32,
    free: Vec<u32>,
}

impl Slots {
    fn get_or_insert(&mut self, worker: WorkerId) -> u32 {
        if let Some(&slot) = self.by_worker.get(&worker) {
            return slot;
        }
        let slot = self.free.pop().unwrap_or_else(|| {
            self.count += 1;
            self.count - 1
        });
        self.by_worker.insert(worker, slot);
        slot
    }
}

fn set_bit(bits: &mut Vec<u64>, slot: u32) {
    let word = (slot / 64) as usize;
    if bits.len() <= word {
        bits.resize(word + 1, 0);
    }
    bits[word] |= 1 << (slot % 64);
}

/// Clears a bit; true when no bit is left.
fn clear_bit(bits: &mut [u64], slot: u32) -> bool {
    if let Some(word) = bits.get_mut((slot / 64) as usize) {
        *word &= !(1 << (slot % 64));
    }
    bits.iter().all(|&w| w == 0)
}

#[derive(Default)]
struct TierIndex {
    /// block hash -> bitset of the slots holding it
    holders: FxHashMap<u64, Vec<u64>>,
    /// slot -> the hashes it holds (for removal and clearing)
    held: FxHashMap<u32, FxHashSet<u64>>,
}

impl TierIndex {
    fn store(&mut self, slot: u32, hashes: &[u64]) {
        let held = self.held.entry(slot).or_default();
        for &hash in hashes {
            if held.insert(hash) {
                set_bit(self.holders.entry(hash).or_default(), slot);
            }
        }
    }

    fn remove(&mut self, slot: u32, hashes: impl IntoIterator<Item = u64>) {
        let Some(held) = self.held.get_mut(&slot) else {
            return;
        };
        for hash in hashes {
            if held.remove(&hash) {
                if let Some(bits) = self.holders.get_mut(&hash) {
                    if clear_bit(bits, slot) {
                        self.holders.remove(&hash);
                    }
                }
            }
        }
    }

    fn clear(&mut self, slot: u32) {
        if let Some(held) = self.held.remove(&slot) {
            for hash in held {
                if let Some(bits) = self.holders.get_mut(&hash) {
                    if clear_bit(bits, slot) {
                        self.holders.remove(&hash);
                    }
                }
            }
        }
    }

    /// Walks the request's hashes keeping the bitset of slots that matched every block so
    /// far; a slot's prefix ends where it drops out. Cost: blocks x words, not blocks x
    /// workers. Writes `prefix[slot][tier]`; returns the longest prefix.
    fn prefixes(
        &self,
        hashes: &[u64],
        tier: usize,
        active: &mut Vec<u64>,
        prefix: &mut [[u32; 3]],
    ) -> u32 {
        active.clear();
        let Some(first) = hashes.first().and_then(|h| self.holders.get(h)) else {
            return 0;
        };
        active.extend_from_slice(first);
        let mut record = |word: usize, mut bits: u64, depth: u32| {
            while bits != 0 {
                prefix[word * 64 + bits.trailing_zeros() as usize][tier] = depth;
                bits &= bits - 1;
            }
        };
        let mut depth = 1u32;
        for hash in &hashes[1..] {
            let next = self.holders.get(hash).map_or(&[][..], Vec::as_slice);
            let mut any = false;
            for (word, bits) in active.iter_mut().enumerate() {
                let kept = *bits & next.get(word).copied().unwrap_or(0);
                record(word, *bits & !kept, depth);
                *bits = kept;
                any |= kept != 0;
            }
            if !any {
                return depth;
            }
            depth += 1;
        }
        for (word, &bits) in active.iter().enumerate() {
            record(word, bits, depth);
        }
        depth
    }

    fn blocks(&self) -> usize {
        self.held.values().map(FxHashSet::len).sum()
    }
}

/// Reusable buffers for queries, so a lookup allocates nothing once warm.
#[derive(Default)]
pub struct QueryScratch {
    prefix: Vec<[u32; 3]>,
    active: Vec<u64>,
}

/// The result of a query, borrowed from the index and the scratch.
pub struct QueryResult<'a> {
    slots: &'a Slots,
    prefix: &'a [[u32; 3]],
    /// The longest prefix of the request cached by any one worker in any tier.
    pub fleet_prefix: u32,
}

impl QueryResult<'_> {
    /// The worker's overlap; zero in every tier when it holds nothing of the prefix.
    pub fn overlap(&self, worker: WorkerId) -> Overlap {
        let slot = self.slots.by_worker.get(&worker);
        Overlap {
            tiers: slot
                .and_then(|&s| self.prefix.get(s as usize))
                .copied()
                .unwrap_or_default(),
        }
    }
    /// Blocks of the request beyond the worker's device prefix that are cached somewhere
    /// in the fleet (and could be fetched instead of recomputed).
    pub fn shared_beyond_device(&self, overlap: &Overlap) -> u32 {
        self.fleet_prefix.saturating_sub(overlap.tier(Tier::Device))
    }
}

#[derive(Default)]
pub struct KvIndex {
    slots: Slots,
    tiers: [TierIndex; 3],
}

impl KvIndex {
    pub fn apply(&mut self, worker: WorkerId, event: &KvEvent) {
        match event {
            KvEvent::Stored {
                tier, block_hashes, ..
            } => {
                let slot = self.slots.get_or_insert(worker);
                self.tiers[tier.index()].store(slot, block_hashes)
            }
            KvEvent::Removed { tier, block_hashes } => {
                if let Some(&slot) = self.slots.by_worker.get(&worker) {
                    self.tiers[tier.index()].remove(slot, block_hashes.iter().copied())
                }
            }
            KvEvent::Cleared { tier: Some(tier) } => {
                if let Some(&slot) = self.slots.by_worker.get(&worker) {
                    self.tiers[tier.index()].clear(slot)
                }
            }
            KvEvent::Cleared { tier: None } => self.remove_worker(worker),
        }
    }

    /// Forgets everything a worker held (it left the fleet, or cleared every tier).
    pub fn remove_worker(&mut self, worker: WorkerId) {
        if let Some(slot) = self.slots.by_worker.remove(&worker) {
            for tier in &mut self.tiers {
                tier.clear(slot);
            }
            self.slots.free.push(slot);
        }
    }

    /// Per-worker contiguous prefix overlap per tier for `hashes`.
    pub fn query<'a>(&'a self, hashes: &[u64], scratch: &'a mut QueryScratch) -> QueryResult<'a> {
        scratch.prefix.clear();
        scratch.prefix.resize(self.slots.count as usize, [0; 3]);
        let mut fleet_prefix = 0;
        for tier in Tier::ALL {
            let depth = self.tiers[tier.index()].prefixes(
                hashes,
                tier.index(),
                &mut scratch.active,
                &mut scratch.prefix,
            );
            fleet_prefix = fleet_prefix.max(depth);
        }
        QueryResult {
            slots: &self.slots,
            prefix: &scratch.prefix,
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

/// The parent of a prompt's first block.
pub const ROOT_HASH: u64 = 0x9e37_79b9_7f4a_7c15;

/// Mixes `value` into a 64-bit hash so that nearby inputs do not give nearby outputs.
pub fn mix(mut hash: u64) -> u64 {
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^ (hash >> 33)
}

/// The chained hash of one block: it covers `tokens` and, through `parent`, every block
/// before it. Every prompt token passes through here (requests and engine events alike),
/// so it takes two tokens per multiply (FxHash's step) rather than FNV's one byte: long
/// prompts hashed 6 times faster. `mix` finishes it; the length keeps `[a]` and `[a, 0]`
/// apart.
pub fn hash_block(parent: u64, tokens: &[u32]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut hash = parent ^ 0xcbf2_9ce4_8422_2325;
    let mut pairs = tokens.chunks_exact(2);
    for pair in &mut pairs {
        let word = u64::from(pair[0]) | u64::from(pair[1]) << 32;
        hash = (hash.rotate_left(5) ^ word).wrapping_mul(K);
    }
    if let [last] = pairs.remainder() {
        hash = (hash.rotate_left(5) ^ u64::from(*last)).wrapping_mul(K);
    }
    mix(hash ^ tokens.len() as u64)
}

/// Hashes token ids into chained block hashes: block i's hash covers tokens
/// [0, (i+1) * block_size), so equal hashes mean equal prefixes. A trailing partial block
/// is not hashed (it cannot be cached yet).
pub fn hash_tokens(tokens: &[u32], block_size: u32, out: &mut Vec<u64>) {
    out.clear();
    let mut parent = ROOT_HASH;
    for block in tokens.chunks_exact(block_size.max(1) as usize) {
        parent = hash_block(parent, block);
        out.push(parent);
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
