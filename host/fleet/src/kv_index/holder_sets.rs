//! Holder sets: blocks held by two or more workers share one set of slots.

use super::block_table::{is_set, Holders, SET};
use super::{clear_bit, has_bit, set_bit};

/// A holder set of two or more slots: a sorted list while small, a bitset over slots
/// once the list would be the larger of the two.
#[derive(Clone, Debug)]
pub(super) enum Members {
    List(Vec<u32>),
    Bits { words: Vec<u64>, len: u32 },
}

/// Lists longer than this become bitsets when the bitset is no larger.
pub(super) const LIST_MIN: usize = 8;

impl Members {
    pub(super) fn len(&self) -> usize {
        match self {
            Members::List(list) => list.len(),
            Members::Bits { len, .. } => *len as usize,
        }
    }

    #[inline]
    pub(super) fn contains(&self, slot: u32) -> bool {
        match self {
            Members::List(list) => list.binary_search(&slot).is_ok(),
            Members::Bits { words, .. } => has_bit(words, slot),
        }
    }

    /// Adds `slot` (not a member). `slots`: the slot count, to size a bitset.
    pub(super) fn insert(&mut self, slot: u32, slots: u32) {
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
    pub(super) fn remove(&mut self, slot: u32) {
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
    pub(super) fn for_each(&self, mut f: impl FnMut(u32)) {
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

    pub(super) fn first(&self) -> Option<u32> {
        let mut first = None;
        self.for_each(|s| {
            first.get_or_insert(s);
        });
        first
    }

    pub(super) fn heap_bytes(&self) -> usize {
        match self {
            Members::List(list) => list.capacity() * 4,
            Members::Bits { words, .. } => words.capacity() * 8,
        }
    }
}

/// Holder sets, shared by every block whose holders are equal (the blocks of a prefix
/// stored together, such as a system prompt every worker holds), copied on write.
#[derive(Default)]
pub(super) struct HolderSets {
    pub(super) sets: Vec<(u32, Members)>,
    pub(super) free: Vec<u32>,
}

impl HolderSets {
    pub(super) fn get(&self, holders: Holders) -> &Members {
        &self.sets[(holders & !SET) as usize].1
    }

    pub(super) fn add(&mut self, members: Members) -> Holders {
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

    pub(super) fn retain(&mut self, holders: Holders) {
        if is_set(holders) {
            self.sets[(holders & !SET) as usize].0 += 1;
        }
    }

    pub(super) fn release(&mut self, holders: Holders) {
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
    pub(super) fn contains(&self, holders: Holders, slot: u32) -> bool {
        if is_set(holders) {
            self.get(holders).contains(slot)
        } else {
            holders == slot
        }
    }

    /// Appends the slots of `holders` to `few` when it is one slot or a list (a bitset
    /// appends nothing: the caller walks it as bits).
    #[inline]
    pub(super) fn list_into(&self, holders: Holders, few: &mut Vec<u32>) {
        if !is_set(holders) {
            few.push(holders);
        } else if let Members::List(list) = self.get(holders) {
            few.extend_from_slice(list);
        }
    }

    /// `holders` plus `slot`, and whether `slot` was new; consumes the caller's reference
    /// to `holders` and returns one to the result.
    pub(super) fn with(&mut self, holders: Holders, slot: u32, slots: u32) -> (Holders, bool) {
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
    pub(super) fn without(&mut self, holders: Holders, slot: u32) -> (Option<Holders>, bool) {
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
    pub(super) fn compact(&mut self, members: Members) -> Holders {
        match members.first() {
            Some(only) if members.len() == 1 => only,
            _ => self.add(members),
        }
    }

    pub(super) fn heap_bytes(&self) -> usize {
        self.sets.capacity() * std::mem::size_of::<(u32, Members)>()
            + self.sets.iter().map(|(_, m)| m.heap_bytes()).sum::<usize>()
            + self.free.capacity() * 4
    }
}
