//! The KV-cache index: which worker holds which blocks, per tier (device, host, disk), fed
//! by KV events. For a request's block hashes it yields each worker's contiguous prefix
//! overlap per tier, and how far the prefix is cached anywhere in the fleet.
//!
//! Block hashes are chained (each one covers its block and every block before it), so a
//! hash names a whole prefix. Per tier the index keeps hash -> holders in 4 bytes: one
//! worker slot inline (most blocks are held by one worker), or the id of a holder set (a
//! sorted list, or a bitset once that is smaller) shared by every block with the same
//! holders and copied on write. The table is open addressing over two flat arrays, so a
//! (block, worker) pair costs 14 to 28 bytes whatever the fleet's size. There is no
//! per-worker list of hashes: removals name their hashes, and a worker that leaves is
//! swept out lazily (see `Slots`).
//!
//! A query walks the request's hashes once per tier and records runs of blocks with equal
//! holders (a shared system prompt is one run). With few runs, a worker's overlap is a
//! few membership tests; with many (a prompt many workers hold to different depths), the
//! runs are walked once for every slot (`held_runs`). The router asks for every
//! candidate at once, in its partition's row order (`query_rows`).

use rustc_hash::FxHashMap;

mod held_runs;

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

/// The slot of a worker that holds nothing.
pub const NO_SLOT: u32 = u32::MAX;

/// The row of a slot outside a partition.
const NO_ROW: u32 = u32::MAX;

/// A partition's rows as the index's slots, both ways: how `KvIndex::query_rows` writes
/// its answer in row order.
#[derive(Clone, Debug, Default)]
pub struct SlotRows {
    slot_of_row: Vec<u32>,
    /// Per slot up to the highest of the partition's, its row (`NO_ROW`: none).
    row_of_slot: Vec<u32>,
}

impl SlotRows {
    /// Rebuilds from each row's slot (`KvIndex::slot_of`; `NO_SLOT` for a worker that
    /// holds nothing).
    pub fn set(&mut self, slot_of_row: impl IntoIterator<Item = u32>) {
        self.slot_of_row.clear();
        self.slot_of_row.extend(slot_of_row);
        self.row_of_slot.clear();
        for (row, &slot) in self.slot_of_row.iter().enumerate() {
            if slot == NO_SLOT {
                continue;
            }
            if self.row_of_slot.len() <= slot as usize {
                self.row_of_slot.resize(slot as usize + 1, NO_ROW);
            }
            self.row_of_slot[slot as usize] = row as u32;
        }
    }

    pub fn len(&self) -> usize {
        self.slot_of_row.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slot_of_row.is_empty()
    }
}

/// Workers as dense slots: holder sets store slots, not worker ids.
///
/// A worker that leaves (or clears every tier) is not swept out of the tables at once:
/// its slot is marked dead, queries ignore it, and its pairs count as garbage until a
/// sweep, which runs when garbage outgrows the live pairs (so its cost is paid once per
/// cleared pair). Dead slots are reused only after that sweep.
#[derive(Default)]
struct Slots {
    by_worker: FxHashMap<WorkerId, u32>,
    count: u32,
    free: Vec<u32>,
    dead: Vec<bool>,
    /// Bit per live slot, for intersecting with bitset holder sets.
    live_bits: Vec<u64>,
    /// Per slot, the pairs it holds in each tier.
    pairs: Vec<[u64; 3]>,
    /// Per slot and tier, the most pairs it may hold (`u64::MAX`: no bound). A bound is a
    /// safety net, not a cache size: a worker past it is forgotten in that tier (see
    /// `KvIndex::forget_tier`), so the index keeps no eviction order (no bytes per pair).
    budget: Vec<[u64; 3]>,
    /// Changes whenever a worker gains or loses a slot.
    epoch: u64,
}

impl Slots {
    fn get_or_insert(&mut self, worker: WorkerId) -> u32 {
        if let Some(&slot) = self.by_worker.get(&worker) {
            return slot;
        }
        let slot = self.free.pop().unwrap_or_else(|| {
            self.count += 1;
            self.dead.push(false);
            self.pairs.push([0; 3]);
            self.budget.push([u64::MAX; 3]);
            self.count - 1
        });
        self.dead[slot as usize] = false;
        self.pairs[slot as usize] = [0; 3];
        self.budget[slot as usize] = [u64::MAX; 3];
        set_bit(&mut self.live_bits, slot);
        self.by_worker.insert(worker, slot);
        self.epoch += 1;
        slot
    }

    fn is_live(&self, slot: u32) -> bool {
        !self.dead.get(slot as usize).copied().unwrap_or(true)
    }
}

fn set_bit(bits: &mut Vec<u64>, slot: u32) {
    let word = (slot / 64) as usize;
    if bits.len() <= word {
        bits.resize(word + 1, 0);
    }
    bits[word] |= 1 << (slot % 64);
}

fn clear_bit(bits: &mut [u64], slot: u32) {
    if let Some(word) = bits.get_mut((slot / 64) as usize) {
        *word &= !(1 << (slot % 64));
    }
}

fn has_bit(bits: &[u64], slot: u32) -> bool {
    bits.get((slot / 64) as usize)
        .is_some_and(|w| w & (1 << (slot % 64)) != 0)
}

mod block_table;
mod holder_sets;
mod query;
mod tier;

use block_table::is_set;
use holder_sets::Members;
pub use query::{QueryResult, QueryScratch};
use tier::TierIndex;

pub struct KvIndex {
    slots: Slots,
    tiers: [TierIndex; 3],
    /// Live pairs per tier.
    live: [u64; 3],
    /// Pairs of dead slots still in the tables (swept once they outgrow the live ones).
    garbage: u64,
    /// Garbage below this is never swept (a sweep walks every table).
    sweep_floor: u64,
    sweeps: u64,
    /// A tier whose request path has more runs than this is answered densely.
    lazy_runs: usize,
    /// Budgets set for workers that hold no slot yet.
    pending_budgets: FxHashMap<WorkerId, [u64; 3]>,
    /// The most pairs per tier across every worker (`u64::MAX`: no bound).
    max_pairs: u64,
    /// Pairs dropped because a bound was passed, and each time it happened (drained by
    /// the router, which logs and counts them).
    evicted: u64,
    forgotten: Vec<Forgotten>,
}

/// Which bound a worker passed when the index forgot its blocks in one tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoundPassed {
    /// Its own budget (what it may hold in the tier).
    Worker,
    /// The fleet's: the index held more pairs in the tier than `max_pairs`, and this
    /// worker held the most.
    Fleet,
}

/// A worker's blocks in one tier, forgotten because a bound was passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Forgotten {
    pub worker: WorkerId,
    pub tier: Tier,
    /// The pairs it held there.
    pub pairs: u64,
    pub bound: BoundPassed,
}

/// Up to this many runs, a worker's overlap is read by testing its membership run by run;
/// beyond, the query writes each holder's depth once (a request many workers hold to
/// different depths).
const LAZY_RUNS: usize = 4;

/// How the index holds its pairs (tests and the memory benchmark read it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexShape {
    /// Blocks with one holder, stored inline.
    pub inline: usize,
    /// Holder sets held as sorted lists, and as bitsets.
    pub lists: usize,
    pub bitsets: usize,
    /// Sweeps of departed workers so far.
    pub sweeps: u64,
}

impl Default for KvIndex {
    fn default() -> Self {
        KvIndex::with_sweep_floor(4096)
    }
}

impl KvIndex {
    pub fn apply(&mut self, worker: WorkerId, event: &KvEvent) {
        match event {
            KvEvent::Stored {
                tier, block_hashes, ..
            } => {
                let slot = self.slots.get_or_insert(worker);
                if !self.pending_budgets.is_empty() {
                    if let Some(budget) = self.pending_budgets.remove(&worker) {
                        self.slots.budget[slot as usize] = budget;
                    }
                }
                self.store(slot, tier.index(), block_hashes);
            }
            KvEvent::Removed { tier, block_hashes } => {
                if let Some(&slot) = self.slots.by_worker.get(&worker) {
                    let t = tier.index();
                    let removed = self.tiers[t].remove(slot, block_hashes.iter().copied());
                    self.live[t] -= removed;
                    self.slots.pairs[slot as usize][t] -= removed;
                }
            }
            KvEvent::Cleared { tier: Some(tier) } => {
                if let Some(&slot) = self.slots.by_worker.get(&worker) {
                    let t = tier.index();
                    self.tiers[t].sweep(|s| s == slot);
                    self.live[t] -= std::mem::take(&mut self.slots.pairs[slot as usize][t]);
                }
            }
            KvEvent::Cleared { tier: None } => self.remove_worker(worker),
        }
    }

    /// An index that sweeps dead workers' pairs once they number more than `floor` and
    /// the live ones (tests use a small floor to exercise sweeps).
    pub fn with_sweep_floor(floor: u64) -> Self {
        KvIndex {
            slots: Slots::default(),
            tiers: Default::default(),
            live: [0; 3],
            garbage: 0,
            sweep_floor: floor,
            sweeps: 0,
            lazy_runs: LAZY_RUNS,
            pending_budgets: FxHashMap::default(),
            max_pairs: u64::MAX,
            evicted: 0,
            forgotten: Vec::new(),
        }
    }

    /// Answers tiers with more than `runs` runs densely (tests set 0 and a large value to
    /// check both ways against each other).
    #[doc(hidden)]
    pub fn set_lazy_runs(&mut self, runs: usize) {
        self.lazy_runs = runs;
    }

    /// Forgets everything a worker held (it left the fleet, or cleared every tier): its
    /// slot is dead at once, its pairs swept later (see `Slots`).
    pub fn remove_worker(&mut self, worker: WorkerId) {
        self.pending_budgets.remove(&worker);
        let Some(slot) = self.slots.by_worker.remove(&worker) else {
            return;
        };
        self.slots.epoch += 1;
        self.slots.dead[slot as usize] = true;
        clear_bit(&mut self.slots.live_bits, slot);
        let pairs = std::mem::take(&mut self.slots.pairs[slot as usize]);
        for (live, held) in self.live.iter_mut().zip(pairs) {
            *live -= held;
        }
        self.garbage += pairs.iter().sum::<u64>();
        if self.garbage > self.live.iter().sum::<u64>().max(self.sweep_floor) {
            self.sweep_dead();
        } else if self.garbage == 0 {
            self.slots.free.push(slot);
        }
    }

    /// Bounds what `worker` may hold per tier (device, host, disk). A worker already
    /// past a lowered budget is forgotten in that tier.
    pub fn set_budget(&mut self, worker: WorkerId, budget: [u64; 3]) {
        let Some(&slot) = self.slots.by_worker.get(&worker) else {
            self.pending_budgets.insert(worker, budget);
            return;
        };
        if self.slots.budget[slot as usize] != budget {
            self.slots.budget[slot as usize] = budget;
            for (t, &most) in budget.iter().enumerate() {
                if self.slots.pairs[slot as usize][t] > most {
                    self.forget_tier(slot, t, BoundPassed::Worker);
                }
            }
        }
    }

    /// Bounds the pairs each tier holds across the fleet (the index's memory).
    pub fn set_max_pairs(&mut self, max_pairs: u64) {
        self.max_pairs = max_pairs;
        for t in 0..3 {
            self.within_max_pairs(t);
        }
    }

    /// Pairs dropped so far because a bound was passed.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// The workers forgotten in a tier since the last call.
    pub fn take_forgotten(&mut self) -> Vec<Forgotten> {
        std::mem::take(&mut self.forgotten)
    }

    /// Stores `hashes` for `slot` in tier `t`, within its budget and the fleet's.
    ///
    /// A worker whose events store more than its budget has lost removals (or its engine
    /// lies): what the index holds of it is wrong somewhere, and without a per-pair store
    /// order there is no "oldest" to drop. It is forgotten in the tier, as after a gap in
    /// its events, and keeps the blocks this store names (a prefix, up to its budget), so
    /// its newest prefix still routes. Forgetting sweeps the tier's table, which happens
    /// at most once per budget's worth of its stores.
    fn store(&mut self, slot: u32, t: usize, hashes: &[u64]) {
        let s = slot as usize;
        let added = self.tiers[t].store(slot, hashes, self.slots.count);
        self.live[t] += added;
        self.slots.pairs[s][t] += added;
        let budget = self.slots.budget[s][t];
        if self.slots.pairs[s][t] > budget {
            self.forget_tier(slot, t, BoundPassed::Worker);
            let kept = &hashes[..hashes.len().min(budget as usize)];
            let added = self.tiers[t].store(slot, kept, self.slots.count);
            self.live[t] += added;
            self.slots.pairs[s][t] += added;
        }
        self.within_max_pairs(t);
    }

    /// While tier `t` holds more pairs than the fleet's bound, forgets the worker holding
    /// the most there (at least the average: each sweep frees a fair share).
    fn within_max_pairs(&mut self, t: usize) {
        while self.live[t] > self.max_pairs {
            let largest = (0..self.slots.count)
                .filter(|&slot| self.slots.is_live(slot))
                .max_by_key(|&slot| self.slots.pairs[slot as usize][t]);
            match largest {
                Some(slot) if self.slots.pairs[slot as usize][t] > 0 => {
                    self.forget_tier(slot, t, BoundPassed::Fleet)
                }
                _ => break,
            }
        }
    }

    /// Forgets what `slot` holds in tier `t`, counting the pairs as evicted.
    fn forget_tier(&mut self, slot: u32, t: usize, bound: BoundPassed) {
        let pairs = std::mem::take(&mut self.slots.pairs[slot as usize][t]);
        if pairs == 0 {
            return;
        }
        self.tiers[t].sweep(|s| s == slot);
        self.live[t] -= pairs;
        self.evicted += pairs;
        if let Some((&worker, _)) = self.slots.by_worker.iter().find(|(_, &s)| s == slot) {
            self.forgotten.push(Forgotten {
                worker,
                tier: Tier::ALL[t],
                pairs,
                bound,
            });
        }
    }

    /// Removes dead slots' pairs from every tier and frees the slots for reuse.
    fn sweep_dead(&mut self) {
        let dead = std::mem::take(&mut self.slots.dead);
        for tier in &mut self.tiers {
            tier.sweep(|s| dead.get(s as usize).copied().unwrap_or(false));
        }
        // Every dead slot is free now: the newly departed and those free already (free
        // slots are marked dead until reused). Pushing only onto the old list once gave
        // a free slot twice, to two workers, who then shared their blocks' holders.
        self.slots.free.clear();
        for (slot, &is_dead) in dead.iter().enumerate() {
            if is_dead {
                self.slots.free.push(slot as u32);
            }
        }
        self.slots.dead = vec![false; dead.len()];
        // Free slots are marked dead until reused, so queries never count them.
        for &slot in &self.slots.free {
            self.slots.dead[slot as usize] = true;
        }
        self.garbage = 0;
        self.sweeps += 1;
    }

    /// The worker's slot (`NO_SLOT` when it holds nothing): what `QueryResult::overlap_of_slot`
    /// takes.
    pub fn slot_of(&self, worker: WorkerId) -> u32 {
        self.slots
            .by_worker
            .get(&worker)
            .copied()
            .unwrap_or(NO_SLOT)
    }

    /// The blocks `worker` holds in `tier`.
    pub fn held(&self, worker: WorkerId, tier: Tier) -> u64 {
        self.slots
            .by_worker
            .get(&worker)
            .map_or(0, |&slot| self.slots.pairs[slot as usize][tier.index()])
    }

    /// Changes whenever some worker's `slot_of` does.
    pub fn slots_epoch(&self) -> u64 {
        self.slots.epoch
    }

    pub fn shape(&self) -> IndexShape {
        let mut shape = IndexShape {
            sweeps: self.sweeps,
            ..IndexShape::default()
        };
        for tier in &self.tiers {
            shape.inline += (0..tier.table.keys.len())
                .filter(|&i| tier.table.keys[i] != 0 && !is_set(tier.table.values[i]))
                .count()
                + usize::from(tier.table.zero.is_some_and(|h| !is_set(h)));
            for (refs, members) in &tier.sets.sets {
                match members {
                    _ if *refs == 0 => {}
                    Members::List(_) => shape.lists += 1,
                    Members::Bits { .. } => shape.bitsets += 1,
                }
            }
        }
        shape
    }

    /// Pairs held per tier, for metrics.
    pub fn blocks(&self) -> [usize; 3] {
        self.live.map(|pairs| pairs as usize)
    }

    /// Bytes the index has allocated (tables, holder sets, slots), for the memory
    /// benchmark; allocator overhead not included.
    pub fn heap_bytes(&self) -> usize {
        let slots = &self.slots;
        self.tiers.iter().map(TierIndex::heap_bytes).sum::<usize>()
            + slots.by_worker.capacity() * (std::mem::size_of::<(WorkerId, u32)>() + 1)
            + slots.free.capacity() * 4
            + slots.dead.capacity()
            + slots.live_bits.capacity() * 8
            + slots.pairs.capacity() * 24
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

#[cfg(test)]
mod prefix_tests {
    use super::*;

    /// Many workers each holding a prefix of one chain, stored in one event each: every
    /// worker's overlap is exactly its prefix, in both read modes. The longer chain has
    /// more distinct holder sets than the dense walk counts at once.
    #[test]
    fn prefixes_of_one_chain_read_back_exactly() {
        for (blocks, lazy_runs) in [(64, 0), (64, usize::MAX), (400, 0)] {
            let chain: Vec<u64> = (0..blocks).map(|i| 1_000 + i).collect();
            let mut index = KvIndex::default();
            index.set_lazy_runs(lazy_runs);
            let held = |w: u64| ((w * 7919) % (blocks + 1)) as usize;
            for w in 0..1024u64 {
                let event = KvEvent::Stored {
                    tier: Tier::Device,
                    parent_hash: None,
                    block_hashes: chain[..held(w)].to_vec(),
                };
                index.apply(
                    WorkerId {
                        worker_id: w,
                        dp_rank: 0,
                    },
                    &event,
                );
            }
            let mut scratch = QueryScratch::default();
            let result = index.query(&chain, &mut scratch);
            for w in 0..1024u64 {
                let overlap = result.overlap(WorkerId {
                    worker_id: w,
                    dp_rank: 0,
                });
                assert_eq!(overlap.tier(Tier::Device) as usize, held(w), "worker {w}");
            }
        }
    }
}
