//! One tier's index: the block table and the holder sets it points into.

use super::block_table::{is_set, BlockTable, Holders};
use super::held_runs::RunHolders;
use super::holder_sets::{HolderSets, Members};

#[derive(Default)]
pub(super) struct TierIndex {
    pub(super) table: BlockTable,
    pub(super) sets: HolderSets,
}

impl TierIndex {
    /// `run`'s holders as the counted walk reads them.
    pub(super) fn run_holders<'a>(&'a self, run: &'a Run) -> RunHolders<'a> {
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
    pub(super) fn store(&mut self, slot: u32, hashes: &[u64], slots: u32) -> u64 {
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
            added += u64::from(was_added);
        }
        added
    }

    /// Removes `slot` from each block's holders; returns how many pairs it held.
    pub(super) fn remove(&mut self, slot: u32, hashes: impl IntoIterator<Item = u64>) -> u64 {
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
    pub(super) fn sweep(&mut self, gone: impl Fn(u32) -> bool) {
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

    pub(super) fn heap_bytes(&self) -> usize {
        self.table.heap_bytes() + self.sets.heap_bytes()
    }
}

/// A run of consecutive request blocks with equal holders, ending at depth `end`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Run {
    pub(super) holders: Holders,
    pub(super) end: u32,
}
