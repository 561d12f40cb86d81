//! Queries: a request's block hashes against the index, answered run by run or densely
//! for every slot at once (`held_runs`).

use super::held_runs::{self, HeldRuns};
use switchyard_plugin_sdk::WorkerId;

use super::block_table::SET;
use super::holder_sets::Members;
use super::tier::{Run, TierIndex};
use super::{has_bit, is_set, KvIndex, Overlap, SlotRows, NO_ROW, NO_SLOT};

/// Reusable buffers for queries, so a lookup allocates nothing once warm.
#[derive(Default)]
pub struct QueryScratch {
    pub(super) runs: [Vec<Run>; 3],
    pub(super) walk: Walk,
    pub(super) dense: Dense,
}

/// What walking one tier's runs needs: the slots still holding every block so far, as a
/// short list or (while wide) a bitset, and the counts of the dense walk.
#[derive(Default)]
pub(super) struct Walk {
    pub(super) few: Vec<u32>,
    pub(super) bits: Vec<u64>,
    pub(super) held: HeldRuns,
}

/// Per slot, the depths a query found, one column per tier: the result when some tier's
/// runs are too many to test per read. Every slot is written by each such query.
#[derive(Default)]
pub(super) struct Dense {
    pub(super) depth: [Vec<u32>; 3],
}

/// Where a dense answer is written: rows, each a slot.
pub(super) trait SlotOrder {
    /// The rows in order, as slots (`NO_SLOT`: one that holds nothing).
    fn slots(&self) -> impl Iterator<Item = u32> + '_;
    /// The row of `slot` (`NO_ROW`: none).
    fn row_of_slot(&self, slot: u32) -> u32;
}

/// Every slot as its own row: the per-slot answer of `query`.
pub(super) struct EverySlot;

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
    pub(super) index: &'a KvIndex,
    pub(super) runs: [&'a [Run]; 3],
    /// Set when the answer is a dense per-slot result instead of the runs.
    pub(super) dense: Option<&'a Dense>,
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
    pub(super) fn overlap_of_slot(&self, slot: u32) -> Overlap {
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
    pub(super) fn overlap_by_runs(&self, slot: u32) -> Overlap {
        Overlap {
            tiers: [0, 1, 2].map(|t| self.index.depth_by_runs(t, self.runs[t], slot)),
        }
    }
}

impl KvIndex {
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
        let bitset = |run: &Run| bitset_of(tier, run);
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
                tier.sets.list_into(first.holders, few);
            }
        }
        walk_rest(tier, &runs[from..], few, bits, wide, depth, out, record)
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
}

/// Intersects the wide set `bits` with the next run's bitset `words`, calling `dropped`
/// for each slot that leaves it. Whether any slot is left.
#[inline(always)]
fn narrow_bits(bits: &mut [u64], words: &[u64], mut dropped: impl FnMut(u32)) -> bool {
    let mut any = false;
    for (w, active) in bits.iter_mut().enumerate() {
        let next = words.get(w).copied().unwrap_or(0);
        let mut leaving = *active & !next;
        while leaving != 0 {
            dropped(w as u32 * 64 + leaving.trailing_zeros());
            leaving &= leaving - 1;
        }
        *active &= next;
        any |= *active != 0;
    }
    any
}

/// Moves the slots of the wide set `bits` for which `keep` holds into the list `few`.
#[inline(always)]
fn bits_to_list(bits: &[u64], few: &mut Vec<u32>, mut keep: impl FnMut(u32) -> bool) {
    for (w, &active) in bits.iter().enumerate() {
        let mut each = active;
        while each != 0 {
            let slot = w as u32 * 64 + each.trailing_zeros();
            if keep(slot) {
                few.push(slot);
            }
            each &= each - 1;
        }
    }
}

/// The bitset of `run`'s holders, when they are one.
#[inline(always)]
fn bitset_of<'t>(tier: &'t TierIndex, run: &Run) -> Option<&'t [u64]> {
    match is_set(run.holders).then(|| tier.sets.get(run.holders)) {
        Some(Members::Bits { words, .. }) => Some(&words[..]),
        _ => None,
    }
}

/// `materialize` past its first runs: the set still holding every block so far (`few`,
/// or `bits` while `wide`) narrowed run by run; each slot that drops out is recorded at
/// `depth`, the end of the last run it held.
#[allow(clippy::too_many_arguments)] // the walk's state, passed as `materialize` holds it
#[inline(always)]
fn walk_rest(
    tier: &TierIndex,
    rest: &[Run],
    few: &mut Vec<u32>,
    bits: &mut [u64],
    mut wide: bool,
    mut depth: u32,
    out: &mut [u32],
    record: impl Fn(&mut [u32], u32, u32),
) -> u32 {
    // The walk ends where the last slots drop out: the deepest any slot holds (dead
    // ones included; `walk_tier` corrects for those).
    for run in rest {
        if wide {
            match bitset_of(tier, run) {
                Some(words) => {
                    if !narrow_bits(bits, words, |slot| record(out, slot, depth)) {
                        return depth;
                    }
                }
                None => {
                    // Narrowing to a list or one slot: keep those of them still held,
                    // record every other slot of the bitset.
                    bits_to_list(bits, few, |slot| {
                        let still = tier.sets.contains(run.holders, slot);
                        if !still {
                            record(out, slot, depth);
                        }
                        still
                    });
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
    if wide {
        bits_to_list(bits, few, |slot| {
            record(out, slot, depth);
            false
        });
    }
    depth
}
