//! Block hash -> holders: the index's one big table, and what a holder value is.

/// A block's holders, in 4 bytes: one slot, or (top bit set) the id of a holder set.
/// Equal values mean equal holder sets, which queries use to skip runs of blocks.
pub(super) type Holders = u32;
pub(super) const SET: u32 = 1 << 31;

pub(super) fn is_set(holders: Holders) -> bool {
    holders & SET != 0
}

/// Block hash -> holders: open addressing with linear probing, keys and values in two
/// arrays (12 bytes a bucket, where a std map of (u64, u32) pads to 16 plus control
/// bytes). Key 0 marks an empty bucket; a real hash of 0 is kept on the side.
///
/// The table grows by half, not double, at 7/8 full, so a bucket is never less than 7/12
/// used: at most 20.6 bytes a block just after growing (doubling left it at 7/16 and 27
/// bytes). Any size works because a key's home is the high half of a 128-bit product
/// (multiply-shift), not its top bits.
#[derive(Default)]
pub(super) struct BlockTable {
    pub(super) keys: Vec<u64>,
    pub(super) values: Vec<Holders>,
    pub(super) len: usize,
    pub(super) zero: Option<Holders>,
}

impl BlockTable {
    pub(super) fn home(&self, key: u64) -> usize {
        // Fibonacci hashing first: API clients may send small consecutive hashes (1, 2,
        // 3...); then the product's high half maps it onto any number of buckets.
        let mixed = key.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        ((u128::from(mixed) * self.keys.len() as u128) >> 64) as usize
    }

    /// The bucket after `at`, wrapping around.
    #[inline]
    fn next(&self, at: usize) -> usize {
        if at + 1 == self.keys.len() {
            0
        } else {
            at + 1
        }
    }

    /// How many buckets after `from` (wrapping) `to` is.
    #[inline]
    fn distance(&self, from: usize, to: usize) -> usize {
        if to >= from {
            to - from
        } else {
            to + self.keys.len() - from
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len + usize::from(self.zero.is_some())
    }

    /// The bucket holding `key`, if any (never for key 0).
    #[inline]
    pub(super) fn find(&self, key: u64) -> Option<usize> {
        if self.keys.is_empty() {
            return None;
        }
        let mut at = self.home(key);
        loop {
            match self.keys[at] {
                0 => return None,
                k if k == key => return Some(at),
                _ => at = self.next(at),
            }
        }
    }

    #[inline]
    pub(super) fn get(&self, key: u64) -> Option<Holders> {
        if key == 0 {
            return self.zero;
        }
        self.find(key).map(|at| self.values[at])
    }

    /// Sets `key`'s holders (inserting it if new).
    pub(super) fn set(&mut self, key: u64, holders: Holders) {
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
        let mut at = self.home(key);
        while self.keys[at] != 0 {
            at = self.next(at);
        }
        self.keys[at] = key;
        self.values[at] = holders;
        self.len += 1;
    }

    pub(super) fn grow(&mut self) {
        let capacity = (self.keys.len() + self.keys.len() / 2).max(16);
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
    pub(super) fn remove(&mut self, key: u64) {
        if key == 0 {
            self.zero = None;
            return;
        }
        let Some(mut hole) = self.find(key) else {
            return;
        };
        let mut at = hole;
        loop {
            at = self.next(at);
            let k = self.keys[at];
            if k == 0 {
                break;
            }
            let home = self.home(k);
            if self.distance(home, at) >= self.distance(hole, at) {
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
    pub(super) fn retain(&mut self, mut f: impl FnMut(Holders) -> Option<Holders>) {
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
    pub(super) fn close_gaps(&mut self, start: usize) {
        let capacity = self.keys.len();
        for step in 1..=capacity {
            let at = (start + step) % capacity;
            let key = self.keys[at];
            if key == 0 {
                continue;
            }
            let mut to = self.home(key);
            while to != at && self.keys[to] != 0 {
                to = self.next(to);
            }
            if to != at {
                self.keys[to] = key;
                self.values[to] = self.values[at];
                self.keys[at] = 0;
            }
        }
    }

    pub(super) fn heap_bytes(&self) -> usize {
        self.keys.capacity() * 8 + self.values.capacity() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
