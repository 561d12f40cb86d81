//! The row of the lowest cost, ties to the lowest (worker id, dp rank): the picker most
//! policies end with, so it is written once here for the built-in one and Rust plugins.
//!
//! Two passes over the costs instead of one: the plain float minimum first (two costs per
//! instruction, no branch), then only the rows at that minimum are compared by
//! `f64::total_cmp` and id, and when many rows tie (idle workers) a quad of rows is
//! compared at once by its least id. One pass comparing keys row by row is bound by its
//! branches.

/// The row of the lowest cost in `f64::total_cmp`'s order, ties to the lowest
/// (id, rank); `None` when there are no rows. Reads `min(costs, ids, ranks)` rows.
pub(crate) fn lowest_cost_row(costs: &[f64], ids: &[u64], ranks: &[u32]) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    let vectors = std::arch::is_x86_feature_detected!("avx2");
    #[cfg(not(target_arch = "x86_64"))]
    let vectors = false;
    lowest_cost_row_by(costs, ids, ranks, vectors)
}

/// `lowest_cost_row`, with its second pass in 256-bit vectors when `vectors` (the CPU
/// has AVX2; tests run both ways).
fn lowest_cost_row_by(costs: &[f64], ids: &[u64], ranks: &[u32], vectors: bool) -> Option<usize> {
    let n = costs.len().min(ids.len()).min(ranks.len());
    let (costs, ids, ranks) = (&costs[..n], &ids[..n], &ranks[..n]);
    // NaN has no place in the float order; the total order then decides row by row.
    let Some(minimum) = plain_minimum(costs) else {
        return lowest_of(costs, ids, ranks, 0..n, None).map(|(row, _)| row);
    };
    #[cfg(target_arch = "x86_64")]
    if vectors {
        // The least cost in the total order is the minimum's bits, or at zero -0.0 if
        // some row has it.
        let targets = match minimum == 0.0 {
            true => [(-0.0f64).to_bits(), 0.0f64.to_bits()],
            false => [minimum.to_bits(); 2],
        };
        // SAFETY: the CPU has AVX2; the three columns have `n` rows.
        return unsafe { avx2::lowest_at(costs, ids, ranks, targets) };
    }
    let _ = vectors;
    // Four rows at a time, read only if one is at the minimum (-0.0 == 0.0, so both are;
    // the total order then puts -0.0 first).
    let whole = n / 4 * 4;
    let mut best: Option<(usize, Key)> = None;
    for (start, quad) in (0..whole).step_by(4).zip(costs.chunks_exact(4)) {
        if !holds(quad, minimum) {
            continue;
        }
        let at = |i: usize| quad[i] == minimum;
        // Ties (idle workers all cost the same): a quad whose rows at the best's exact
        // cost all have higher ids cannot hold a better row, which the least of four ids
        // tells without a branch per row. A row at the minimum with other bits (the other
        // zero) forces the row-by-row comparison, as does an equal id (ranks decide).
        if let Some((best_row, (_, best_id, _))) = best {
            let best_bits = costs[best_row].to_bits();
            let id = |i: usize| match (quad[i].to_bits() == best_bits, at(i)) {
                (true, _) => ids[start + i],
                (false, true) => 0,
                (false, false) => u64::MAX,
            };
            if id(0).min(id(1)).min(id(2).min(id(3))) > best_id {
                continue;
            }
        }
        best = lowest_of(costs, ids, ranks, start..start + 4, best);
    }
    lowest_of(costs, ids, ranks, whole..n, best).map(|(row, _)| row)
}

/// `total_cmp`'s order as plain integers, so the best key stays in registers.
#[inline]
fn order(cost: f64) -> i64 {
    let bits = cost.to_bits() as i64;
    bits ^ (((bits >> 63) as u64) >> 1) as i64
}

/// A row's place: (cost in the total order, worker id, dp rank).
type Key = (i64, u64, u32);

/// The lowest of `best` and `rows` by key.
#[inline]
fn lowest_of(
    costs: &[f64],
    ids: &[u64],
    ranks: &[u32],
    rows: core::ops::Range<usize>,
    mut best: Option<(usize, Key)>,
) -> Option<(usize, Key)> {
    for row in rows {
        let cost = order(costs[row]);
        // Ids are read only for rows that cost no more than the best so far.
        if best.is_none_or(|(_, lowest)| cost <= lowest.0) {
            let key = (cost, ids[row], ranks[row]);
            if best.is_none_or(|(_, lowest)| key < lowest) {
                best = Some((row, key));
            }
        }
    }
    best
}

/// Whether some of the four costs equals `minimum`: one test for the quad.
#[inline]
fn holds(quad: &[f64], minimum: f64) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: SSE2 is part of x86-64.
        unsafe { sse2::holds(quad, minimum) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        quad.iter()
            .fold(false, |any, &cost| any | (cost == minimum))
    }
}

/// The least cost by `<`, or `None` if some cost is NaN (or there are none).
fn plain_minimum(costs: &[f64]) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: SSE2 is part of x86-64.
        unsafe { sse2::plain_minimum(costs) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        least_of(*costs.first()?, costs)
    }
}

/// The least of `first` and `costs` by `<`, or `None` if one is NaN.
#[inline]
fn least_of<'a>(first: f64, costs: impl IntoIterator<Item = &'a f64>) -> Option<f64> {
    let mut minimum = first;
    for &cost in costs {
        if cost.is_nan() {
            return None;
        }
        minimum = if cost < minimum { cost } else { minimum };
    }
    Some(minimum)
}

#[cfg(target_arch = "x86_64")]
mod sse2 {
    use core::arch::x86_64::*;

    /// # Safety
    /// SSE2 is available (always, on x86-64); `quad` holds 4 costs.
    #[inline]
    #[target_feature(enable = "sse2")]
    pub(super) unsafe fn holds(quad: &[f64], minimum: f64) -> bool {
        let minimum = _mm_set1_pd(minimum);
        // SAFETY: the quad holds 4 values (the caller's contract).
        let (low, high) = unsafe {
            (
                _mm_loadu_pd(quad.as_ptr()),
                _mm_loadu_pd(quad.as_ptr().add(2)),
            )
        };
        let equal = _mm_or_pd(_mm_cmpeq_pd(low, minimum), _mm_cmpeq_pd(high, minimum));
        _mm_movemask_pd(equal) != 0
    }

    /// # Safety
    /// SSE2 is available (always, on x86-64).
    #[target_feature(enable = "sse2")]
    pub(super) unsafe fn plain_minimum(costs: &[f64]) -> Option<f64> {
        let first = *costs.first()?;
        // Four independent minimums of two lanes each, and NaN flags beside them, so no
        // instruction waits on the one before.
        let mut lanes = [_mm_set1_pd(first); 4];
        let mut unordered = [_mm_setzero_pd(); 4];
        let mut eights = costs.chunks_exact(8);
        for eight in &mut eights {
            for (pair, (lane, nan)) in lanes.iter_mut().zip(&mut unordered).enumerate() {
                // SAFETY: the chunk holds 8 values.
                let values = unsafe { _mm_loadu_pd(eight.as_ptr().add(2 * pair)) };
                *lane = _mm_min_pd(values, *lane);
                *nan = _mm_or_pd(*nan, _mm_cmpunord_pd(values, values));
            }
        }
        if unordered.iter().any(|&nan| _mm_movemask_pd(nan) != 0) {
            return None;
        }
        let mut minimums = [0.0; 8];
        for (pair, lane) in lanes.iter().enumerate() {
            // SAFETY: `minimums` holds 8 values.
            unsafe { _mm_storeu_pd(minimums.as_mut_ptr().add(2 * pair), *lane) };
        }
        super::least_of(first, minimums.iter().chain(eights.remainder()))
    }
}

/// The second pass four rows to a register: every row is compared, without a branch,
/// which costs less than skipping rows when many tie (idle workers).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use core::arch::x86_64::*;

    /// The row whose cost has the bits `targets[0]` (if some row has them, else
    /// `targets[1]`) with the lowest (id, rank); the first such row on a full tie.
    ///
    /// # Safety
    /// The CPU has AVX2; the three columns have the same length; some row's cost has
    /// one of the target bits.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn lowest_at(
        costs: &[f64],
        ids: &[u64],
        ranks: &[u32],
        targets: [u64; 2],
    ) -> Option<usize> {
        let n = costs.len();
        let whole = n / 4 * 4;
        // Ids with the sign bit flipped compare as unsigned under a signed compare.
        let flip = _mm256_set1_epi64x(i64::MIN);
        let none = _mm256_set1_epi64x(i64::MAX);
        let [first, second] = targets.map(|bits| _mm256_set1_epi64x(bits as i64));
        let (mut least_first, mut least_second) = (none, none);
        let mut any_first = _mm256_setzero_si256();
        let load = |column: *const u64, row: usize| {
            // SAFETY: rows row..row + 4 are below n (the loops' bounds).
            unsafe { _mm256_loadu_si256(column.add(row).cast()) }
        };
        for row in (0..whole).step_by(4) {
            let cost = load(costs.as_ptr().cast(), row);
            let id = _mm256_xor_si256(load(ids.as_ptr(), row), flip);
            let at_first = _mm256_cmpeq_epi64(cost, first);
            let at_second = _mm256_cmpeq_epi64(cost, second);
            any_first = _mm256_or_si256(any_first, at_first);
            let lower = |least: __m256i, at: __m256i| {
                let candidate = _mm256_blendv_epi8(none, id, at);
                _mm256_blendv_epi8(least, candidate, _mm256_cmpgt_epi64(least, candidate))
            };
            least_first = lower(least_first, at_first);
            least_second = lower(least_second, at_second);
        }
        let least = |lanes: __m256i, bits: u64| {
            let mut each = [0i64; 4];
            // SAFETY: `each` holds four lanes.
            unsafe { _mm256_storeu_si256(each.as_mut_ptr().cast(), lanes) };
            let vector = each.iter().map(|&id| id as u64 ^ (1 << 63)).min();
            let tail = (whole..n).filter(|&row| costs[row].to_bits() == bits);
            vector.into_iter().chain(tail.map(|row| ids[row])).min()
        };
        let first_held = _mm256_movemask_epi8(any_first) != 0
            || costs[whole..].iter().any(|c| c.to_bits() == targets[0]);
        let (target, best_id) = match first_held {
            true => (targets[0], least(least_first, targets[0])?),
            false => (targets[1], least(least_second, targets[1])?),
        };
        // The rows at the target with that id (one, unless dp ranks share it): the
        // lowest rank, the first row on a full tie.
        let (at, want) = (
            _mm256_set1_epi64x(target as i64),
            _mm256_set1_epi64x(best_id as i64),
        );
        let mut best: Option<(usize, u32)> = None;
        let mut consider = |row: usize| {
            if best.is_none_or(|(_, rank)| ranks[row] < rank) {
                best = Some((row, ranks[row]));
            }
        };
        for row in (0..whole).step_by(4) {
            let cost = load(costs.as_ptr().cast(), row);
            let id = load(ids.as_ptr(), row);
            let both = _mm256_and_si256(_mm256_cmpeq_epi64(cost, at), _mm256_cmpeq_epi64(id, want));
            let mut rows = _mm256_movemask_pd(_mm256_castsi256_pd(both));
            while rows != 0 {
                consider(row + rows.trailing_zeros() as usize);
                rows &= rows - 1;
            }
        }
        for row in whole..n {
            if costs[row].to_bits() == target && ids[row] == best_id {
                consider(row);
            }
        }
        best.map(|(row, _)| row)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `lowest_cost_row` over (cost, worker id) rows, dp rank 0, the same both ways.
    fn lowest(rows: &[(f64, u64)]) -> Option<usize> {
        let ranked: Vec<(f64, u64, u32)> = rows.iter().map(|&(c, id)| (c, id, 0)).collect();
        lowest_ranked(&ranked)
    }

    /// `lowest_cost_row` over (cost, worker id, dp rank) rows: the plain and the vector
    /// second pass give the same row.
    fn lowest_ranked(rows: &[(f64, u64, u32)]) -> Option<usize> {
        let costs: Vec<f64> = rows.iter().map(|r| r.0).collect();
        let ids: Vec<u64> = rows.iter().map(|r| r.1).collect();
        let ranks: Vec<u32> = rows.iter().map(|r| r.2).collect();
        let plain = lowest_cost_row_by(&costs, &ids, &ranks, false);
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let vector = lowest_cost_row_by(&costs, &ids, &ranks, true);
            assert_eq!(vector, plain, "{rows:?}");
        }
        plain
    }

    /// The lowest cost in `f64::total_cmp`'s order, ties to the lowest worker id,
    /// whatever the row order and length: checked against a sort.
    #[test]
    fn lowest_cost_row_is_the_total_order_minimum_with_ties_to_the_lowest_id() {
        assert_eq!(lowest(&[]), None);
        assert_eq!(lowest(&[(3.0, 9), (1.0, 8), (1.0, 2), (2.0, 1)]), Some(2));
        // -0.0 is below 0.0 in the total order, whatever the ids and the rows around.
        assert_eq!(lowest(&[(0.0, 1), (-0.0, 7)]), Some(1));
        assert_eq!(
            lowest(&[(0.0, 1), (1.0, 0), (2.0, 0), (3.0, 0), (4.0, 0), (-0.0, 7)]),
            Some(5)
        );
        // Infinities and NaN: the total order still decides.
        assert_eq!(lowest(&[(f64::INFINITY, 3), (f64::NAN, 1)]), Some(0));
        assert_eq!(lowest(&[(f64::NAN, 3), (f64::NAN, 1)]), Some(1));
        assert_eq!(lowest(&[(f64::NAN, 3), (-f64::NAN, 5), (1.0, 1)]), Some(1));
        assert_eq!(lowest(&[(f64::INFINITY, 3), (f64::INFINITY, 1)]), Some(1));
        let mut seed = 7u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let special = [
            f64::NAN,
            -f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            0.0,
            -0.0,
        ];
        for len in 1..200 {
            // Mixed costs, with and without the special values; then all tied (idle
            // workers) at 0.0 with a few -0.0 among them.
            for case in 0..3 {
                // Ids from a small range, so they repeat (dp ranks of one worker), and
                // some past 2^63 (compared unsigned).
                let rows: Vec<(f64, u64, u32)> = (0..len)
                    .map(|_| {
                        let cost = match case {
                            0 => (next() % 5) as f64 - 2.0,
                            1 if next() % 8 == 0 => special[(next() % 6) as usize],
                            1 => (next() % 5) as f64 - 2.0,
                            _ if next() % 64 == 0 => -0.0,
                            _ => 0.0,
                        };
                        let id = match next() % 8 {
                            0 => u64::MAX - next() % 3,
                            _ => next() % 50,
                        };
                        (cost, id, (next() % 4) as u32)
                    })
                    .collect();
                let expected = (0..len)
                    .min_by(|&a, &b| {
                        rows[a]
                            .0
                            .total_cmp(&rows[b].0)
                            .then(rows[a].1.cmp(&rows[b].1))
                            .then(rows[a].2.cmp(&rows[b].2))
                    })
                    .unwrap();
                let (cost, id, rank) = rows[expected];
                let got = lowest_ranked(&rows).unwrap();
                assert!(
                    rows[got].0.total_cmp(&cost).is_eq()
                        && rows[got].1 == id
                        && rows[got].2 == rank,
                    "len {len}: got row {got} {:?}, expected {expected} {:?}",
                    rows[got],
                    rows[expected]
                );
            }
        }
    }
}
