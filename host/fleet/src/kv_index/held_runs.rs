//! How many of a stretch of runs each slot holds: the dense walk of a request many
//! workers hold to different depths. The first run's holders are a bitset; later runs
//! held by a few slots are intersected as bitsets too.
//!
//! Walking the runs with the set of slots still holding every block so far gives nested
//! sets `a_0 ⊇ a_1 ⊇ ...`, and a slot held `c` runs is in exactly `a_0 .. a_{c-1}`. Bit
//! `p` of `c` is then the parity of the sets it is in among `a_{2^p - 1}, a_{2*2^p - 1},
//! ...`, so each bit plane of every slot's count is an XOR of whole words, with no
//! per-slot work and no branch on the data. Recording each slot as it drops out (the
//! plain walk) costs a mispredicted branch per slot, since where slots drop out is data
//! the predictor cannot learn. The planes become one byte per slot at the end (AVX2
//! where the CPU has it), and a slot's depth is the end of its last run held.

/// Counts stay in a byte: past this many runs the walk goes on slot by slot.
pub(super) const MOST_RUNS: usize = 255;

/// A run's holders as the walk reads them.
#[derive(Clone, Copy)]
pub(super) enum RunHolders<'a> {
    /// A bitset over slots (missing words are empty).
    Bits(&'a [u64]),
    /// A few slots.
    Slots(&'a [u32]),
}

/// Scratch for the walk, reused across queries.
pub(super) struct HeldRuns {
    /// `planes[p * words + w]`: bit `p` of the counts of the slots of word `w`.
    planes: Vec<u64>,
    /// Per slot, how many runs of the stretch it holds.
    counts: Vec<u8>,
    /// `table[c]`: the depth of a slot that holds `c` runs (0 for none, and past the
    /// runs walked).
    table: [u32; MOST_RUNS + 1],
    /// The slots still held after a run of `RunHolders::Slots`.
    kept: Vec<u64>,
}

impl Default for HeldRuns {
    fn default() -> Self {
        HeldRuns {
            planes: Vec::new(),
            counts: Vec::new(),
            table: [0; MOST_RUNS + 1],
            kept: Vec::new(),
        }
    }
}

impl HeldRuns {
    /// Walks `runs` (each run's holders and the depth it ends at, at most `MOST_RUNS`)
    /// with `active` starting as the first run's holders and ending as the slots that
    /// hold every run walked. Stops early when no slot holds the next run; returns how
    /// many runs were walked.
    pub fn walk<'a>(
        &mut self,
        active: &mut [u64],
        runs: impl ExactSizeIterator<Item = (RunHolders<'a>, u32)>,
    ) -> usize {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            return unsafe { self.walk_avx2(active, runs) };
        }
        self.walk_planes(active, runs)
    }

    /// `walk` with 256-bit vectors for its passes over words, and for the spread.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn walk_avx2<'a>(
        &mut self,
        active: &mut [u64],
        runs: impl ExactSizeIterator<Item = (RunHolders<'a>, u32)>,
    ) -> usize {
        self.walk_planes(active, runs)
    }

    #[inline(always)]
    fn walk_planes<'a>(
        &mut self,
        active: &mut [u64],
        runs: impl ExactSizeIterator<Item = (RunHolders<'a>, u32)>,
    ) -> usize {
        let words = active.len();
        let bits = (usize::BITS - runs.len().leading_zeros()).max(1) as usize;
        self.planes.clear();
        self.planes.resize(bits * words, 0);
        let mut walked = 0;
        for (j, (holders, end)) in runs.enumerate().take(MOST_RUNS) {
            if j > 0 && !self.intersect(active, holders) {
                break;
            }
            self.table[j + 1] = end;
            walked = j + 1;
            // Run j is the (j + 1)-th: it counts in every plane p whose step 2^p divides
            // j + 1.
            let top = ((j + 1).trailing_zeros() as usize).min(bits - 1);
            // By index, not `chunks_exact`: that divides per run.
            for p in 0..=top {
                let plane = &mut self.planes[p * words..(p + 1) * words];
                for (x, a) in plane.iter_mut().zip(active.iter()) {
                    *x ^= a;
                }
            }
        }
        self.table[walked + 1..].fill(0);
        self.spread(words, bits);
        walked
    }

    /// `active &= holders`; false when nothing is left.
    #[inline(always)]
    fn intersect(&mut self, active: &mut [u64], holders: RunHolders<'_>) -> bool {
        let holders = match holders {
            RunHolders::Bits(words) => words,
            RunHolders::Slots(slots) => {
                self.kept.clear();
                self.kept.resize(active.len(), 0);
                for &slot in slots {
                    let (w, bit) = ((slot / 64) as usize, 1 << (slot % 64));
                    if let Some(word) = self.kept.get_mut(w) {
                        *word |= bit;
                    }
                }
                &self.kept[..]
            }
        };
        let held = holders.len().min(active.len());
        let (both, beyond) = active.split_at_mut(held);
        beyond.fill(0);
        let mut any = 0;
        for (a, h) in both.iter_mut().zip(holders) {
            *a &= h;
            any |= *a;
        }
        any != 0
    }

    /// The depth `slot` holds to along the runs walked (0: not even the first).
    #[inline]
    pub fn depth(&self, slot: u32) -> u32 {
        let count = self.counts.get(slot as usize).copied().unwrap_or(0);
        self.table[usize::from(count)]
    }

    /// Each row's depth into `out`, the rows given as their slots.
    #[inline]
    pub fn write_depths(&self, slots: impl Iterator<Item = u32>, out: &mut [u32]) {
        for (depth, slot) in out.iter_mut().zip(slots) {
            *depth = self.depth(slot);
        }
    }

    /// The planes as one count byte per slot.
    fn spread(&mut self, words: usize, bits: usize) {
        self.counts.clear();
        self.counts.resize(words * 64, 0);
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present; `counts` holds 64 bytes per word and `planes`
            // `bits` planes of `words` words.
            unsafe { avx2::spread(&self.planes, words, bits, &mut self.counts) };
            return;
        }
        spread_scalar(&self.planes, words, bits, &mut self.counts);
    }
}

/// Bit i of each byte of `x` spread to bytes: 8 lanes of 0 or 1.
const LOW_BITS: u64 = 0x0101_0101_0101_0101;

fn spread_scalar(planes: &[u64], words: usize, bits: usize, counts: &mut [u8]) {
    for (w, out) in counts.chunks_exact_mut(64).enumerate().take(words) {
        for (byte, out) in out.chunks_exact_mut(8).enumerate() {
            let mut lanes = 0u64;
            for p in 0..bits {
                let x = (planes[p * words + w] >> (8 * byte)) & 0xff;
                // Byte i keeps bit i of x; adding 0x7f carries it into the byte's top bit.
                let kept = (x * LOW_BITS) & 0x8040_2010_0804_0201;
                let set = ((kept + 0x7f7f_7f7f_7f7f_7f7f) >> 7) & LOW_BITS;
                lanes |= set << p;
            }
            out.copy_from_slice(&lanes.to_le_bytes());
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU has AVX2; `counts` holds `64 * words` bytes and `planes` `bits * words`
    /// words.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn spread(planes: &[u64], words: usize, bits: usize, counts: &mut [u8]) {
        // Byte i of the word to lanes 8i..8i+8, each lane testing its own bit.
        let low = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        );
        let high = _mm256_setr_epi8(
            4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7,
            7, 7, 7,
        );
        let lane_bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
        for w in 0..words {
            let (mut first, mut second) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            for p in 0..bits {
                let word = _mm256_set1_epi64x(planes[p * words + w] as i64);
                let weight = _mm256_set1_epi8((1u8 << p) as i8);
                let set = |bytes: __m256i| {
                    let lanes = _mm256_and_si256(_mm256_shuffle_epi8(word, bytes), lane_bit);
                    _mm256_and_si256(_mm256_cmpeq_epi8(lanes, lane_bit), weight)
                };
                first = _mm256_or_si256(first, set(low));
                second = _mm256_or_si256(second, set(high));
            }
            // SAFETY: bytes 64w..64w + 64 are within `counts` (the caller's contract).
            unsafe {
                let out = counts.as_mut_ptr().add(64 * w);
                _mm256_storeu_si256(out.cast(), first);
                _mm256_storeu_si256(out.add(32).cast(), second);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Random nested holder sets (each slot holding a random number of runs, some none,
    /// some every run), stretches from 1 run to `MOST_RUNS`, sets shorter than the first:
    /// every slot's depth is the end of the last run it holds, and the walk stops where
    /// nobody holds on.
    #[test]
    fn every_slot_gets_the_depth_of_its_last_run_held() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut held = HeldRuns::default();
        for (slots, runs) in [
            (1usize, 1usize),
            (64, 3),
            (130, 64),
            (1024, 64),
            (700, MOST_RUNS),
            (64, 2),
        ] {
            let holds: Vec<usize> = (0..slots).map(|_| rng.gen_range(0..=runs)).collect();
            let words = slots.div_ceil(64);
            let sets: Vec<Vec<u64>> = (0..runs)
                .map(|r| {
                    let mut set = vec![0u64; words];
                    for (slot, &h) in holds.iter().enumerate() {
                        if h > r {
                            set[slot / 64] |= 1 << (slot % 64);
                        }
                    }
                    // Trailing empty words dropped, as a holder set's bitset may be.
                    while set.last() == Some(&0) && set.len() > 1 {
                        set.pop();
                    }
                    set
                })
                .collect();
            // Runs held by few slots also come as their slots, as lists and single
            // slots do.
            let lists: Vec<Vec<u32>> = (0..runs)
                .map(|r| {
                    (0..slots as u32)
                        .filter(|&s| holds[s as usize] > r)
                        .collect()
                })
                .collect();
            let holders = |r: usize| match lists[r].len() {
                0..=8 if r > 0 => RunHolders::Slots(&lists[r]),
                _ => RunHolders::Bits(&sets[r]),
            };
            let ends: Vec<u32> = (0..runs as u32).map(|r| 3 * r + 2).collect();
            let mut active = sets[0].clone();
            active.resize(words, 0);
            let walked = held.walk(&mut active, (0..runs).map(|r| (holders(r), ends[r])));
            let deepest = holds.iter().copied().max().unwrap_or(0);
            assert_eq!(
                walked,
                deepest.max(1).min(runs),
                "slots {slots} runs {runs}"
            );
            for (slot, &h) in holds.iter().enumerate() {
                let expected = if h == 0 { 0 } else { ends[h - 1] };
                assert_eq!(held.depth(slot as u32), expected, "slot {slot} holds {h}");
            }
            assert_eq!(held.depth(slots as u32 + 64), 0, "past the last word");
            let expected: Vec<u32> = (0..slots as u32).rev().map(|s| held.depth(s)).collect();
            let mut out = vec![u32::MAX; slots];
            held.write_depths((0..slots as u32).rev(), &mut out);
            assert_eq!(out, expected, "rows in another order");
        }
    }

    /// Both ways of spreading the planes into bytes agree on random planes.
    #[test]
    fn scalar_and_vector_spreads_agree() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(6);
        for (words, bits) in [(1, 1), (3, 8), (16, 7), (5, 4)] {
            let planes: Vec<u64> = (0..words * bits).map(|_| rng.gen()).collect();
            let mut scalar = vec![0u8; 64 * words];
            spread_scalar(&planes, words, bits, &mut scalar);
            for (slot, &count) in scalar.iter().enumerate() {
                let expected: u32 = (0..bits)
                    .map(|p| ((planes[p * words + slot / 64] >> (slot % 64)) as u32 & 1) << p)
                    .sum();
                assert_eq!(u32::from(count), expected, "slot {slot}");
            }
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                let mut vector = vec![0u8; 64 * words];
                // SAFETY: AVX2 is present; the buffers have the sizes `spread` needs.
                unsafe { avx2::spread(&planes, words, bits, &mut vector) };
                assert_eq!(vector, scalar);
            }
        }
    }
}
