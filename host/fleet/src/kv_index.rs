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

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

mod held_runs;
use held_runs::{HeldRuns, RunHolders};

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
    /// Per slot and tier, the blocks in the order they were stored (removed ones are
    /// skipped when reached, and dropped when they outnumber the held ones): the
    /// worker's oldest blocks, evicted first past its budget.
    order: Vec<[VecDeque<u64>; 3]>,
    /// Per slot and tier, the most pairs it may hold (`u64::MAX`: no bound).
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
            self.order.push(Default::default());
            self.budget.push([u64::MAX; 3]);
            self.count - 1
        });
        self.dead[slot as usize] = false;
        self.pairs[slot as usize] = [0; 3];
        self.order[slot as usize] = Default::default();
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

/// A block's holders, in 4 bytes: one slot, or (top bit set) the id of a holder set.
/// Equal values mean equal holder sets, which queries use to skip runs of blocks.
type Holders = u32;
const SET: u32 = 1 << 31;

fn is_set(holders: Holders) -> bool {
    holders & SET != 0
}

/// Block hash -> holders: open addressing with linear probing, keys and values in two
/// arrays (12 bytes a bucket, where a std map of (u64, u32) pads to 16 plus control
/// bytes). Key 0 marks an empty bucket; a real hash of 0 is kept on the side.
#[derive(Default)]
struct BlockTable {
    keys: Vec<u64>,
    values: Vec<Holders>,
    len: usize,
    zero: Option<Holders>,
}

impl BlockTable {
    fn home(&self, key: u64) -> usize {
        // Fibonacci hashing: API clients may send small consecutive hashes (1, 2, 3...).
        let bits = self.keys.len().trailing_zeros();
        (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - bits)) as usize
    }

    fn len(&self) -> usize {
        self.len + usize::from(self.zero.is_some())
    }

    /// The bucket holding `key`, if any (never for key 0).
    #[inline]
    fn find(&self, key: u64) -> Option<usize> {
        if self.keys.is_empty() {
            return None;
        }
        let mask = self.keys.len() - 1;
        let mut at = self.home(key);
        loop {
            match self.keys[at] {
                0 => return None,
                k if k == key => return Some(at),
                _ => at = (at + 1) & mask,
            }
        }
    }

    #[inline]
    fn get(&self, key: u64) -> Option<Holders> {
        if key == 0 {
            return self.zero;
        }
        self.find(key).map(|at| self.values[at])
    }

    /// Sets `key`'s holders (inserting it if new).
    fn set(&mut self, key: u64, holders: Holders) {
        if key == 0 {
            self.zero = Some(holders);
            return;
        }
        if let Some(at) = self.find(key) {
            self.values[at] = holders;
            return;
        }
        if (self.len + 1) * 8 > self.keys.len() * 7 {
            self.grow();
        }
        let mask = self.keys.len() - 1;
        let mut at = self.home(key);
        while self.keys[at] != 0 {
            at = (at + 1) & mask;
        }
        self.keys[at] = key;
        self.values[at] = holders;
        self.len += 1;
    }

    fn grow(&mut self) {
        let capacity = (self.keys.len() * 2).max(16);
        let keys = std::mem::replace(&mut self.keys, vec![0; capacity]);
        let values = std::mem::replace(&mut self.values, vec![0; capacity]);
        self.len = 0;
        for (key, holders) in keys.into_iter().zip(values) {
            if key != 0 {
                self.set(key, holders);
            }
        }
    }

    /// Removes `key`; backward-shift deletion keeps every probe chain unbroken without
    /// tombstones.
    fn remove(&mut self, key: u64) {
        if key == 0 {
            self.zero = None;
            return;
        }
        let Some(mut hole) = self.find(key) else {
            return;
        };
        let mask = self.keys.len() - 1;
        let mut at = hole;
        loop {
            at = (at + 1) & mask;
            let k = self.keys[at];
            if k == 0 {
                break;
            }
            let home = self.home(k);
            if (at.wrapping_sub(home) & mask) >= (at.wrapping_sub(hole) & mask) {
                self.keys[hole] = k;
                self.values[hole] = self.values[at];
                hole = at;
            }
        }
        self.keys[hole] = 0;
        self.len -= 1;
    }

    /// Replaces every entry's holders with `f`'s answer, removing those it answers None
    /// for, in place and in one pass: time linear in the table, whatever was removed.
    ///
    /// Rebuilding by re-inserting the keys in bucket order (as this once did) is
    /// quadratic: keys in that order arrive sorted by home, so a smaller table fills
    /// from its front with one ever-growing probe run (issue #28: 14 s at 400k blocks).
    fn retain(&mut self, mut f: impl FnMut(Holders) -> Option<Holders>) {
        self.zero = self.zero.and_then(&mut f);
        // An empty bucket before anything is removed: no probe run crosses it.
        let Some(start) = self.keys.iter().position(|&k| k == 0) else {
            return; // no table yet (a full one is never allowed)
        };
        let mut removed = false;
        for (key, holders) in self.keys.iter_mut().zip(self.values.iter_mut()) {
            if *key != 0 {
                match f(*holders) {
                    Some(kept) => *holders = kept,
                    None => {
                        *key = 0;
                        self.len -= 1;
                        removed = true;
                    }
                }
            }
        }
        if removed {
            self.close_gaps(start);
        }
    }

    /// Moves every key back toward its home across the buckets emptied by `retain`, so
    /// every probe run is unbroken again. `start` was empty before the removals, so no
    /// run crosses it and each run is walked front to back: a key moves to the first
    /// empty bucket from its home, never past where it was, and only buckets after it
    /// are emptied later. Cost: the table plus the keys' displacements.
    fn close_gaps(&mut self, start: usize) {
        let capacity = self.keys.len();
        let mask = capacity - 1;
        for step in 1..=capacity {
            let at = (start + step) & mask;
            let key = self.keys[at];
            if key == 0 {
                continue;
            }
            let mut to = self.home(key);
            while to != at && self.keys[to] != 0 {
                to = (to + 1) & mask;
            }
            if to != at {
                self.keys[to] = key;
                self.values[to] = self.values[at];
                self.keys[at] = 0;
            }
        }
    }

    fn heap_bytes(&self) -> usize {
        self.keys.capacity() * 8 + self.values.capacity() * 4
    }
}

/// A holder set of two or more slots: a sorted list while small, a bitset over slots
/// once the list would be the larger of the two.
#[derive(Clone, Debug)]
enum Members {
    List(Vec<u32>),
    Bits { words: Vec<u64>, len: u32 },
}

/// Lists longer than this become bitsets when the bitset is no larger.
const LIST_MIN: usize = 8;

impl Members {
    fn len(&self) -> usize {
        match self {
            Members::List(list) => list.len(),
            Members::Bits { len, .. } => *len as usize,
        }
    }

    #[inline]
    fn contains(&self, slot: u32) -> bool {
        match self {
            Members::List(list) => list.binary_search(&slot).is_ok(),
            Members::Bits { words, .. } => has_bit(words, slot),
        }
    }

    /// Adds `slot` (not a member). `slots`: the slot count, to size a bitset.
    fn insert(&mut self, slot: u32, slots: u32) {
        match self {
            Members::List(list) => {
                let at = list.binary_search(&slot).unwrap_or_else(|at| at);
                list.insert(at, slot);
                let words = slots.div_ceil(64) as usize;
                if list.len() > LIST_MIN && list.len() * 4 >= words * 8 {
                    let mut bits = vec![0; words];
                    for &s in list.iter() {
                        set_bit(&mut bits, s);
                    }
                    let len = list.len() as u32;
                    *self = Members::Bits { words: bits, len };
                }
            }
            Members::Bits { words, len } => {
                set_bit(words, slot);
                *len += 1;
            }
        }
    }

    /// Removes `slot` (a member).
    fn remove(&mut self, slot: u32) {
        match self {
            Members::List(list) => {
                if let Ok(at) = list.binary_search(&slot) {
                    list.remove(at);
                }
            }
            Members::Bits { words, len } => {
                clear_bit(words, slot);
                *len -= 1;
                if (*len as usize) <= LIST_MIN {
                    let mut list = Vec::with_capacity(*len as usize);
                    self.for_each(|s| list.push(s));
                    *self = Members::List(list);
                }
            }
        }
    }

    /// Calls `f` with each member, in order.
    fn for_each(&self, mut f: impl FnMut(u32)) {
        match self {
            Members::List(list) => list.iter().for_each(|&s| f(s)),
            Members::Bits { words, .. } => {
                for (i, &word) in words.iter().enumerate() {
                    let mut bits = word;
                    while bits != 0 {
                        f(i as u32 * 64 + bits.trailing_zeros());
                        bits &= bits - 1;
                    }
                }
            }
        }
    }

    fn first(&self) -> Option<u32> {
        let mut first = None;
        self.for_each(|s| {
            first.get_or_insert(s);
        });
        first
    }

    fn heap_bytes(&self) -> usize {
        match self {
            Members::List(list) => list.capacity() * 4,
            Members::Bits { words, .. } => words.capacity() * 8,
        }
    }
}

/// Holder sets, shared by every block whose holders are equal (the blocks of a prefix
/// stored together, such as a system prompt every worker holds), copied on write.
#[derive(Default)]
struct HolderSets {
    sets: Vec<(u32, Members)>,
    free: Vec<u32>,
}

impl HolderSets {
    fn get(&self, holders: Holders) -> &Members {
        &self.sets[(holders & !SET) as usize].1
    }

    fn add(&mut self, members: Members) -> Holders {
        match self.free.pop() {
            Some(id) => {
                self.sets[id as usize] = (1, members);
                id | SET
            }
            None => {
                self.sets.push((1, members));
                (self.sets.len() as u32 - 1) | SET
            }
        }
    }

    fn retain(&mut self, holders: Holders) {
        if is_set(holders) {
            self.sets[(holders & !SET) as usize].0 += 1;
        }
    }

    fn release(&mut self, holders: Holders) {
        if is_set(holders) {
            let id = holders & !SET;
            let entry = &mut self.sets[id as usize];
            entry.0 -= 1;
            if entry.0 == 0 {
                entry.1 = Members::List(Vec::new());
                self.free.push(id);
            }
        }
    }

    #[inline]
    fn contains(&self, holders: Holders, slot: u32) -> bool {
        if is_set(holders) {
            self.get(holders).contains(slot)
        } else {
            holders == slot
        }
    }

    /// `holders` plus `slot`, and whether `slot` was new; consumes the caller's reference
    /// to `holders` and returns one to the result.
    fn with(&mut self, holders: Holders, slot: u32, slots: u32) -> (Holders, bool) {
        if !is_set(holders) {
            if holders == slot {
                return (holders, false);
            }
            let (a, b) = (holders.min(slot), holders.max(slot));
            return (self.add(Members::List(vec![a, b])), true);
        }
        let id = (holders & !SET) as usize;
        if self.sets[id].1.contains(slot) {
            return (holders, false);
        }
        if self.sets[id].0 == 1 {
            self.sets[id].1.insert(slot, slots);
            return (holders, true);
        }
        let mut members = self.sets[id].1.clone();
        members.insert(slot, slots);
        self.sets[id].0 -= 1;
        (self.add(members), true)
    }

    /// `holders` minus `slot` (None when empty), and whether `slot` was a member; consumes
    /// the caller's reference as `with` does.
    fn without(&mut self, holders: Holders, slot: u32) -> (Option<Holders>, bool) {
        if !is_set(holders) {
            return if holders == slot {
                (None, true)
            } else {
                (Some(holders), false)
            };
        }
        let id = (holders & !SET) as usize;
        if !self.sets[id].1.contains(slot) {
            return (Some(holders), false);
        }
        let mut members = if self.sets[id].0 == 1 {
            std::mem::replace(&mut self.sets[id].1, Members::List(Vec::new()))
        } else {
            self.sets[id].1.clone()
        };
        self.release(holders);
        members.remove(slot);
        (Some(self.compact(members)), true)
    }

    /// A set of one becomes that slot; otherwise a new set (the caller holds nothing yet).
    fn compact(&mut self, members: Members) -> Holders {
        match members.first() {
            Some(only) if members.len() == 1 => only,
            _ => self.add(members),
        }
    }

    fn heap_bytes(&self) -> usize {
        self.sets.capacity() * std::mem::size_of::<(u32, Members)>()
            + self.sets.iter().map(|(_, m)| m.heap_bytes()).sum::<usize>()
            + self.free.capacity() * 4
    }
}

#[derive(Default)]
struct TierIndex {
    table: BlockTable,
    sets: HolderSets,
}

impl TierIndex {
    /// `run`'s holders as the counted walk reads them.
    fn run_holders<'a>(&'a self, run: &'a Run) -> RunHolders<'a> {
        match is_set(run.holders) {
            true => match self.sets.get(run.holders) {
                Members::Bits { words, .. } => RunHolders::Bits(words),
                Members::List(list) => RunHolders::Slots(list),
            },
            false => RunHolders::Slots(std::slice::from_ref(&run.holders)),
        }
    }

    /// Adds `slot` to each block's holders; returns how many pairs are new. Consecutive
    /// blocks whose holders were equal stay equal (one shared set, not a copy each).
    fn store(&mut self, slot: u32, hashes: &[u64], slots: u32, order: &mut VecDeque<u64>) -> u64 {
        let mut added = 0;
        // The previous block's holders before and after, and whether `slot` was new there.
        let mut last: Option<(Holders, Holders, bool)> = None;
        for &hash in hashes {
            let old = self.table.get(hash);
            let (new, was_added) = match (old, last) {
                (None, _) => (slot, true),
                (Some(old), Some((prev_old, prev_new, prev_added))) if old == prev_old => {
                    if prev_new != old {
                        self.sets.retain(prev_new);
                        self.sets.release(old);
                    }
                    (prev_new, prev_added)
                }
                (Some(old), _) => self.sets.with(old, slot, slots),
            };
            if old != Some(new) {
                self.table.set(hash, new);
            }
            last = old.map(|old| (old, new, was_added));
            if was_added {
                order.push_back(hash);
            }
            added += u64::from(was_added);
        }
        added
    }

    fn holds(&self, slot: u32, hash: u64) -> bool {
        self.table
            .get(hash)
            .is_some_and(|holders| self.sets.contains(holders, slot))
    }

    /// Removes `slot` from each block's holders; returns how many pairs it held.
    fn remove(&mut self, slot: u32, hashes: impl IntoIterator<Item = u64>) -> u64 {
        let mut removed = 0;
        for hash in hashes {
            let Some(old) = self.table.get(hash) else {
                continue;
            };
            let (new, was_member) = self.sets.without(old, slot);
            match new {
                Some(new) if new != old => self.table.set(hash, new),
                Some(_) => {}
                None => self.table.remove(hash),
            }
            removed += u64::from(was_member);
        }
        removed
    }

    /// Drops every slot `gone` says from every holder set: one pass over the sets (shared
    /// ones once) and one over the table.
    fn sweep(&mut self, gone: impl Fn(u32) -> bool) {
        for (refs, members) in &mut self.sets.sets {
            let mut any = false;
            members.for_each(|s| any |= gone(s));
            if *refs > 0 && any {
                let mut kept = Vec::with_capacity(members.len());
                members.for_each(|s| {
                    if !gone(s) {
                        kept.push(s)
                    }
                });
                let slots = kept.last().map_or(0, |s| s + 1);
                let mut rebuilt = Members::List(Vec::new());
                for s in kept {
                    rebuilt.insert(s, slots);
                }
                *members = rebuilt;
            }
        }
        let sets = &mut self.sets;
        self.table.retain(|holders| {
            if !is_set(holders) {
                return (!gone(holders)).then_some(holders);
            }
            let keep = match sets.get(holders).len() {
                0 => None,
                1 => sets.get(holders).first(),
                _ => return Some(holders),
            };
            sets.release(holders);
            keep
        });
    }

    fn heap_bytes(&self) -> usize {
        self.table.heap_bytes() + self.sets.heap_bytes()
    }
}

/// A run of consecutive request blocks with equal holders, ending at depth `end`.
#[derive(Clone, Copy, Debug)]
struct Run {
    holders: Holders,
    end: u32,
}

/// Reusable buffers for queries, so a lookup allocates nothing once warm.
#[derive(Default)]
pub struct QueryScratch {
    runs: [Vec<Run>; 3],
    walk: Walk,
    dense: Dense,
}

/// What walking one tier's runs needs: the slots still holding every block so far, as a
/// short list or (while wide) a bitset, and the counts of the dense walk.
#[derive(Default)]
struct Walk {
    few: Vec<u32>,
    bits: Vec<u64>,
    held: HeldRuns,
}

/// Per slot, the depths a query found, one column per tier: the result when some tier's
/// runs are too many to test per read. Every slot is written by each such query.
#[derive(Default)]
struct Dense {
    depth: [Vec<u32>; 3],
}

/// Where a dense answer is written: rows, each a slot.
trait SlotOrder {
    /// The rows in order, as slots (`NO_SLOT`: one that holds nothing).
    fn slots(&self) -> impl Iterator<Item = u32> + '_;
    /// The row of `slot` (`NO_ROW`: none).
    fn row_of_slot(&self, slot: u32) -> u32;
}

/// Every slot as its own row: the per-slot answer of `query`.
struct EverySlot;

impl SlotOrder for EverySlot {
    fn slots(&self) -> impl Iterator<Item = u32> + '_ {
        0..
    }
    #[inline]
    fn row_of_slot(&self, slot: u32) -> u32 {
        slot
    }
}

impl SlotOrder for SlotRows {
    fn slots(&self) -> impl Iterator<Item = u32> + '_ {
        self.slot_of_row.iter().copied()
    }
    #[inline]
    fn row_of_slot(&self, slot: u32) -> u32 {
        self.row_of_slot
            .get(slot as usize)
            .copied()
            .unwrap_or(NO_ROW)
    }
}

/// The result of a query, borrowed from the index and the scratch: per tier, the runs of
/// blocks with equal holders. A worker's overlap is read on demand, in a few membership
/// tests (one per run it holds, plus one), so the query's cost follows the request's
/// length, not the fleet's size.
pub struct QueryResult<'a> {
    index: &'a KvIndex,
    runs: [&'a [Run]; 3],
    /// Set when the answer is a dense per-slot result instead of the runs.
    dense: Option<&'a Dense>,
    /// The longest prefix of the request cached by any one worker in any tier.
    pub fleet_prefix: u32,
}

impl QueryResult<'_> {
    /// The worker's overlap; zero in every tier when it holds nothing of the prefix.
    #[inline]
    pub fn overlap(&self, worker: WorkerId) -> Overlap {
        self.overlap_of_slot(self.index.slot_of(worker))
    }

    /// The overlap of the worker in `slot`.
    #[inline]
    fn overlap_of_slot(&self, slot: u32) -> Overlap {
        if self.fleet_prefix == 0 || slot == NO_SLOT {
            return Overlap::default();
        }
        match self.dense {
            Some(dense) => Overlap {
                tiers: dense
                    .depth
                    .each_ref()
                    .map(|tier| tier.get(slot as usize).copied().unwrap_or(0)),
            },
            None => self.overlap_by_runs(slot),
        }
    }

    /// The overlap of `slot`, tested run by run (few runs).
    #[inline]
    fn overlap_by_runs(&self, slot: u32) -> Overlap {
        Overlap {
            tiers: [0, 1, 2].map(|t| self.index.depth_by_runs(t, self.runs[t], slot)),
        }
    }
}

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
    evicted: u64,
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
                let t = tier.index();
                let order = &mut self.slots.order[slot as usize][t];
                let added = self.tiers[t].store(slot, block_hashes, self.slots.count, order);
                self.live[t] += added;
                self.slots.pairs[slot as usize][t] += added;
                self.evict_past_budget(slot, t);
            }
            KvEvent::Removed { tier, block_hashes } => {
                if let Some(&slot) = self.slots.by_worker.get(&worker) {
                    let t = tier.index();
                    let removed = self.tiers[t].remove(slot, block_hashes.iter().copied());
                    self.live[t] -= removed;
                    self.slots.pairs[slot as usize][t] -= removed;
                    self.trim_order(slot, t);
                }
            }
            KvEvent::Cleared { tier: Some(tier) } => {
                if let Some(&slot) = self.slots.by_worker.get(&worker) {
                    let t = tier.index();
                    self.tiers[t].sweep(|s| s == slot);
                    self.live[t] -= std::mem::take(&mut self.slots.pairs[slot as usize][t]);
                    self.slots.order[slot as usize][t] = VecDeque::new();
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
            evicted: 0,
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
        self.slots.order[slot as usize] = Default::default();
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

    /// Bounds what `worker` may hold per tier (device, host, disk): its declared
    /// capacity, so no stream of events (lost removals, a lying engine) grows the index
    /// past what the fleet declared. Blocks already past a lowered budget are evicted.
    pub fn set_budget(&mut self, worker: WorkerId, budget: [u64; 3]) {
        let Some(&slot) = self.slots.by_worker.get(&worker) else {
            self.pending_budgets.insert(worker, budget);
            return;
        };
        if self.slots.budget[slot as usize] != budget {
            self.slots.budget[slot as usize] = budget;
            for t in 0..3 {
                self.evict_past_budget(slot, t);
            }
        }
    }

    /// Blocks evicted so far because a worker went past its budget.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Evicts `slot`'s oldest blocks in tier `t` until it holds no more than its budget.
    fn evict_past_budget(&mut self, slot: u32, t: usize) {
        let s = slot as usize;
        while self.slots.pairs[s][t] > self.slots.budget[s][t] {
            let Some(oldest) = self.slots.order[s][t].pop_front() else {
                break;
            };
            let removed = self.tiers[t].remove(slot, [oldest]);
            self.live[t] -= removed;
            self.slots.pairs[s][t] -= removed;
            self.evicted += removed;
        }
    }

    /// Drops from `slot`'s store order (tier `t`) the blocks it no longer holds, and all
    /// but the latest listing of each, once they outnumber the held ones: the order stays
    /// within twice the pairs held, and each trim pays for the removals before it.
    fn trim_order(&mut self, slot: u32, t: usize) {
        let s = slot as usize;
        if (self.slots.order[s][t].len() as u64) <= 2 * self.slots.pairs[s][t] + 1024 {
            return;
        }
        let tier = &self.tiers[t];
        let mut seen = rustc_hash::FxHashSet::default();
        let mut kept: Vec<u64> = self.slots.order[s][t]
            .iter()
            .rev()
            .copied()
            .filter(|&hash| tier.holds(slot, hash) && seen.insert(hash))
            .collect();
        kept.reverse();
        self.slots.order[s][t] = kept.into();
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

    /// Per-worker contiguous prefix overlap per tier for `hashes`.
    pub fn query<'a>(&'a self, hashes: &[u64], scratch: &'a mut QueryScratch) -> QueryResult<'a> {
        let dense = self.find_runs(hashes, &mut scratch.runs);
        let QueryScratch {
            runs,
            walk,
            dense: depths,
        } = scratch;
        let mut fleet_prefix = 0;
        for (t, column) in depths.depth.iter_mut().enumerate() {
            let out = dense.then(|| {
                column.resize(self.slots.count as usize, 0);
                (&EverySlot, &mut column[..])
            });
            fleet_prefix = fleet_prefix.max(self.walk_tier(t, &runs[t], walk, out));
        }
        let scratch: &'a QueryScratch = scratch;
        QueryResult {
            index: self,
            runs: [&scratch.runs[0], &scratch.runs[1], &scratch.runs[2]],
            dense: dense.then_some(&scratch.dense),
            fleet_prefix,
        }
    }

    /// The answer of `query` written in the order of `rows` (a partition's rows as
    /// slots): each row's depth per tier into `out`, one column per tier of `rows.len()`,
    /// every row written (zero where it holds nothing). Returns the fleet prefix. What a
    /// router that reads every candidate wants: no per-slot answer to gather from.
    pub fn query_rows(
        &self,
        hashes: &[u64],
        scratch: &mut QueryScratch,
        rows: &SlotRows,
        out: [&mut [u32]; 3],
    ) -> u32 {
        let dense = self.find_runs(hashes, &mut scratch.runs);
        let QueryScratch { runs, walk, .. } = scratch;
        let mut fleet_prefix = 0;
        for (t, column) in out.into_iter().enumerate() {
            if dense {
                let deepest = self.walk_tier(t, &runs[t], walk, Some((rows, &mut *column)));
                fleet_prefix = fleet_prefix.max(deepest);
                continue;
            }
            let deepest = self.walk_tier::<SlotRows>(t, &runs[t], walk, None);
            fleet_prefix = fleet_prefix.max(deepest);
            column.fill(0);
            if deepest > 0 {
                for (depth, &slot) in column.iter_mut().zip(&rows.slot_of_row) {
                    if slot != NO_SLOT {
                        *depth = self.depth_by_runs(t, &runs[t], slot);
                    }
                }
            }
        }
        fleet_prefix
    }

    /// Per tier, the runs of `hashes`' blocks with equal holders; true when some tier's
    /// runs are too many to test per read (the answer is then walked once, densely).
    fn find_runs(&self, hashes: &[u64], runs: &mut [Vec<Run>; 3]) -> bool {
        let mut most_runs = 0;
        for (tier, runs) in self.tiers.iter().zip(runs) {
            runs.clear();
            if tier.table.len() == 0 {
                continue;
            }
            for (depth, &hash) in hashes.iter().enumerate() {
                let Some(holders) = tier.table.get(hash) else {
                    break;
                };
                let end = depth as u32 + 1;
                match runs.last_mut() {
                    Some(run) if run.holders == holders => run.end = end,
                    _ => runs.push(Run { holders, end }),
                }
            }
            most_runs = most_runs.max(runs.len());
        }
        most_runs > self.lazy_runs
    }

    /// How deep `slot` holds along tier `t`'s runs, tested run by run (few runs).
    #[inline]
    fn depth_by_runs(&self, t: usize, runs: &[Run], slot: u32) -> u32 {
        let sets = &self.tiers[t].sets.sets;
        let mut depth = 0;
        for run in runs {
            let held = if run.holders & SET == 0 {
                run.holders == slot
            } else {
                match sets.get((run.holders & !SET) as usize) {
                    Some((_, Members::Bits { words, .. })) => has_bit(words, slot),
                    Some((_, Members::List(list))) => list.binary_search(&slot).is_ok(),
                    None => false,
                }
            };
            if !held {
                break;
            }
            depth = run.end;
        }
        depth
    }

    /// The deepest any live slot holds along tier `t`'s runs; with `dense`, also every
    /// row's depth, written into its column (the dense answer).
    fn walk_tier<O: SlotOrder>(
        &self,
        t: usize,
        runs: &[Run],
        walk: &mut Walk,
        dense: Option<(&O, &mut [u32])>,
    ) -> u32 {
        let tier = &self.tiers[t];
        let Some((order, out)) = dense else {
            return self.deepest_held(tier, runs, &mut walk.few, &mut walk.bits);
        };
        let deepest = self.materialize(tier, runs, walk, order, out);
        // Dead slots (departed workers not yet swept) must not count for the fleet; with
        // any about, the deepest live one is found by `deepest_held`.
        match self.garbage > 0 || !self.slots.free.is_empty() {
            true => self.deepest_held(tier, runs, &mut walk.few, &mut walk.bits),
            false => deepest,
        }
    }

    /// Writes every row's depth along `runs` into `out`: the end of the last run its slot
    /// holds, with every run before (0 for none). When the first run is held widely (a
    /// bitset), up to `MOST_RUNS` runs are counted at once (`HeldRuns`); otherwise, and
    /// past those, the set still holding every block so far (a list, or a bitset while
    /// wide) is walked run by run, and each slot that drops out gets the depth of the last
    /// run it held. Returns the deepest depth any slot reached, dead ones included.
    fn materialize<O: SlotOrder>(
        &self,
        tier: &TierIndex,
        runs: &[Run],
        walk: &mut Walk,
        order: &O,
        out: &mut [u32],
    ) -> u32 {
        let Walk { few, bits, held } = walk;
        few.clear();
        bits.clear();
        let Some(first) = runs.first() else {
            out.fill(0);
            return 0;
        };
        let record = |out: &mut [u32], slot: u32, depth: u32| {
            if let Some(d) = out.get_mut(order.row_of_slot(slot) as usize) {
                *d = depth;
            }
        };
        let bitset = |run: &Run| match is_set(run.holders).then(|| tier.sets.get(run.holders)) {
            Some(Members::Bits { words, .. }) => Some(&words[..]),
            _ => None,
        };
        let mut wide = false;
        let mut from = 1;
        let mut depth = first.end;
        match bitset(first) {
            // Held widely: up to `MOST_RUNS` runs counted at once.
            Some(words) if runs.len() > 1 => {
                bits.extend_from_slice(words);
                let counted = runs.len().min(held_runs::MOST_RUNS);
                let walked = held.walk(
                    bits,
                    runs[..counted]
                        .iter()
                        .map(|run| (tier.run_holders(run), run.end)),
                );
                held.write_depths(order.slots(), out);
                depth = runs[walked - 1].end;
                if walked < counted || counted == runs.len() {
                    return depth;
                }
                // Some slots hold every counted run: the walk goes on with them.
                wide = true;
                from = counted;
            }
            Some(words) => {
                out.fill(0);
                bits.extend_from_slice(words);
                wide = true;
            }
            None => {
                out.fill(0);
                match is_set(first.holders) {
                    true => {
                        if let Members::List(list) = tier.sets.get(first.holders) {
                            few.extend_from_slice(list);
                        }
                    }
                    false => few.push(first.holders),
                }
            }
        }
        // The walk ends where the last slots drop out: the deepest any slot holds (dead
        // ones included; `walk_tier` corrects for those).
        for run in &runs[from..] {
            if wide {
                match bitset(run) {
                    Some(words) => {
                        let mut any = false;
                        for (w, active) in bits.iter_mut().enumerate() {
                            let next = words.get(w).copied().unwrap_or(0);
                            let mut dropped = *active & !next;
                            while dropped != 0 {
                                let slot = w as u32 * 64 + dropped.trailing_zeros();
                                record(out, slot, depth);
                                dropped &= dropped - 1;
                            }
                            *active &= next;
                            any |= *active != 0;
                        }
                        if !any {
                            return depth;
                        }
                    }
                    None => {
                        // Narrowing to a list or one slot: keep those of them still held,
                        // record every other slot of the bitset.
                        for (w, &active) in bits.iter().enumerate() {
                            let mut each = active;
                            while each != 0 {
                                let slot = w as u32 * 64 + each.trailing_zeros();
                                if tier.sets.contains(run.holders, slot) {
                                    few.push(slot);
                                } else {
                                    record(out, slot, depth);
                                }
                                each &= each - 1;
                            }
                        }
                        wide = false;
                    }
                }
            } else {
                few.retain(|&slot| {
                    let still = tier.sets.contains(run.holders, slot);
                    if !still {
                        record(out, slot, depth);
                    }
                    still
                });
            }
            if !wide && few.is_empty() {
                return depth;
            }
            depth = run.end;
        }
        for &slot in few.iter() {
            record(out, slot, depth);
        }
        for (w, &active) in bits.iter().enumerate().filter(|_| wide) {
            let mut each = active;
            while each != 0 {
                record(out, w as u32 * 64 + each.trailing_zeros(), depth);
                each &= each - 1;
            }
        }
        depth
    }

    /// How deep along `runs` some one live slot holds every block: the holder sets of
    /// successive runs intersected, as a short list (`few`) or, while wide, a bitset.
    fn deepest_held(
        &self,
        tier: &TierIndex,
        runs: &[Run],
        few: &mut Vec<u32>,
        bits: &mut Vec<u64>,
    ) -> u32 {
        let Some(first) = runs.first() else {
            return 0;
        };
        few.clear();
        bits.clear();
        let mut wide = false;
        if !is_set(first.holders) {
            if self.slots.is_live(first.holders) {
                few.push(first.holders);
            }
        } else {
            match tier.sets.get(first.holders) {
                Members::Bits { words, .. } => {
                    bits.extend(words.iter().zip(&self.slots.live_bits).map(|(a, b)| a & b));
                    wide = bits.iter().any(|&w| w != 0);
                    if !wide {
                        return 0;
                    }
                }
                Members::List(list) => {
                    few.extend(list.iter().copied().filter(|&s| self.slots.is_live(s)))
                }
            }
        }
        if !wide && few.is_empty() {
            return 0;
        }
        let mut depth = first.end;
        for run in &runs[1..] {
            if wide {
                let members = is_set(run.holders).then(|| tier.sets.get(run.holders));
                match members {
                    Some(Members::Bits { words, .. }) => {
                        let mut any = false;
                        let others = words.iter().chain(std::iter::repeat(&0));
                        for (a, b) in bits.iter_mut().zip(others) {
                            *a &= b;
                            any |= *a != 0;
                        }
                        if !any {
                            return depth;
                        }
                    }
                    Some(members) => {
                        members.for_each(|s| {
                            if has_bit(bits, s) {
                                few.push(s)
                            }
                        });
                        wide = false;
                    }
                    None => {
                        if has_bit(bits, run.holders) {
                            few.push(run.holders);
                        }
                        wide = false;
                    }
                }
                if !wide && few.is_empty() {
                    return depth;
                }
            } else {
                few.retain(|&s| tier.sets.contains(run.holders, s));
                if few.is_empty() {
                    return depth;
                }
            }
            depth = run.end;
        }
        depth
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

    /// `retain` against a std map, over tables with long probe runs (small consecutive
    /// keys, key 0 included) and removals of every density: every kept key reads back
    /// its new value, every removed one is gone, and probing still finds them all.
    #[test]
    fn retain_matches_a_reference_map() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(28);
        for round in 0..60u32 {
            let mut table = BlockTable::default();
            let mut reference = std::collections::HashMap::new();
            let keys = rng.gen_range(1..5_000u64);
            for i in 0..keys {
                let key = if round % 2 == 0 { i } else { rng.gen() };
                let value = rng.gen_range(0..1_000u32);
                table.set(key, value);
                reference.insert(key, value);
            }
            let cut = rng.gen_range(0..=1_000u32);
            let keep = |v: u32| (v >= cut).then_some(v + 1);
            table.retain(keep);
            reference.retain(|_, v| *v >= cut);
            reference.values_mut().for_each(|v| *v += 1);
            assert_eq!(table.len(), reference.len(), "round {round}");
            for (&key, &value) in &reference {
                assert_eq!(table.get(key), Some(value), "round {round}: key {key}");
            }
            for key in 0..keys {
                if !reference.contains_key(&key) {
                    assert_eq!(table.get(key), None, "round {round}: removed key {key}");
                }
            }
        }
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
