//! Compaction of one column by a filter's keep mask: the rows whose keep byte is
//! non-zero, in order. The hot loop of every filter that drops rows (one pass per column
//! later stages read), so with AVX2 it moves 8 rows of 4 bytes, or 4 rows of 8 bytes,
//! per instruction through a table of lane permutations; elsewhere, and for the rows
//! past the last whole vector, a branch-free scalar loop.

/// Sets `to` to the rows of `from` whose `keep` byte is non-zero, in order (rows past
/// either's end are dropped). `to`'s buffer is reused.
pub fn compact_into<T: Copy>(to: &mut Vec<T>, from: &[T], keep: &[u8]) {
    let n = from.len().min(keep.len());
    to.clear();
    to.reserve(n);
    let out = to.as_mut_ptr();
    let (done, mut next) = vectorized(out, &from[..n], &keep[..n]);
    for (value, &k) in from[done..n].iter().zip(&keep[done..n]) {
        // SAFETY: `next` <= the row's index < n <= the capacity reserved above, and
        // `T: Copy` has nothing to drop.
        unsafe { out.add(next).write(*value) };
        next += usize::from(k != 0);
    }
    // SAFETY: rows 0..next were written above (or by `vectorized`).
    unsafe { to.set_len(next) };
}

/// Compacts the leading whole vectors of `from` into `out` where the CPU can; returns
/// the rows done and the rows written.
#[cfg(target_arch = "x86_64")]
fn vectorized<T: Copy>(out: *mut T, from: &[T], keep: &[u8]) -> (usize, usize) {
    if !std::arch::is_x86_feature_detected!("avx2")
        || !std::arch::is_x86_feature_detected!("popcnt")
    {
        return (0, 0);
    }
    // SAFETY: AVX2 and POPCNT are available (checked above); `out` has room for `from.len()`
    // elements (the caller's contract), and elements of 4 or 8 bytes are moved as plain
    // bits, which is a copy of a `Copy` value.
    unsafe {
        match std::mem::size_of::<T>() {
            4 => avx2::compact_4(out.cast(), from.as_ptr().cast(), keep),
            8 => avx2::compact_8(out.cast(), from.as_ptr().cast(), keep),
            _ => (0, 0),
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn vectorized<T: Copy>(_: *mut T, _: &[T], _: &[u8]) -> (usize, usize) {
    (0, 0)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// For each mask of 8 rows, the 32-bit lanes of its set bits in order (then zeros).
    static LANES_4: [[u32; 8]; 256] = lanes(8, 1);
    /// For each mask of 4 rows of 8 bytes, the pairs of 32-bit lanes of its set bits.
    static LANES_8: [[u32; 8]; 16] = {
        let wide = lanes(4, 2);
        let mut table = [[0; 8]; 16];
        let mut mask = 0;
        while mask < 16 {
            table[mask] = wide[mask];
            mask += 1;
        }
        table
    };

    /// The permutation table for `rows` rows of `width` 32-bit lanes each.
    const fn lanes(rows: usize, width: usize) -> [[u32; 8]; 256] {
        let mut table = [[0; 8]; 256];
        let mut mask = 0;
        while mask < (1 << rows) {
            let mut at = 0;
            let mut row = 0;
            while row < rows {
                if mask & (1 << row) != 0 {
                    let mut lane = 0;
                    while lane < width {
                        table[mask][at] = (row * width + lane) as u32;
                        at += 1;
                        lane += 1;
                    }
                }
                row += 1;
            }
            mask += 1;
        }
        table
    }

    /// One bit per byte of `bytes`, set where the byte is non-zero (a kept row).
    #[target_feature(enable = "avx2")]
    fn kept_bits(bytes: __m128i) -> u32 {
        !(_mm_movemask_epi8(_mm_cmpeq_epi8(bytes, _mm_setzero_si128())) as u32)
    }

    /// # Safety
    /// AVX2 and POPCNT are available; `from` holds `keep.len()` elements of 4 bytes; `out` has room
    /// for as many.
    #[target_feature(enable = "avx2,popcnt")]
    pub unsafe fn compact_4(out: *mut u32, from: *const u32, keep: &[u8]) -> (usize, usize) {
        let (mut row, mut next) = (0, 0);
        while row + 8 <= keep.len() {
            // SAFETY: rows row..row + 8 exist in `keep` and `from`, and `next` <= `row`,
            // so the 8 lanes stored at `next` stay within `out`'s room.
            let (bytes, values) = unsafe {
                (
                    _mm_loadl_epi64(keep.as_ptr().add(row).cast()),
                    _mm256_loadu_si256(from.add(row).cast()),
                )
            };
            let mask = kept_bits(bytes) & 0xff;
            // SAFETY: the table row holds 8 lanes.
            let order = unsafe { _mm256_loadu_si256(LANES_4[mask as usize].as_ptr().cast()) };
            let packed = _mm256_permutevar8x32_epi32(values, order);
            // SAFETY: as above.
            unsafe { _mm256_storeu_si256(out.add(next).cast(), packed) };
            next += mask.count_ones() as usize;
            row += 8;
        }
        (row, next)
    }

    /// # Safety
    /// As `compact_4`, for elements of 8 bytes.
    #[target_feature(enable = "avx2,popcnt")]
    pub unsafe fn compact_8(out: *mut u64, from: *const u64, keep: &[u8]) -> (usize, usize) {
        let (mut row, mut next) = (0, 0);
        // 8 rows a step, one mask for two permutations, then 4 at a time.
        while row + 8 <= keep.len() {
            // SAFETY: as in `compact_4`: rows row..row + 8 exist, and each half's 4
            // lanes are stored at or before its own rows.
            let (bytes, low, high) = unsafe {
                (
                    _mm_loadl_epi64(keep.as_ptr().add(row).cast()),
                    _mm256_loadu_si256(from.add(row).cast()),
                    _mm256_loadu_si256(from.add(row + 4).cast()),
                )
            };
            let mask = kept_bits(bytes) & 0xff;
            for (half, values) in [(mask & 0xf, low), (mask >> 4, high)] {
                // SAFETY: the table row holds 8 lanes; the store as above.
                unsafe {
                    let order = _mm256_loadu_si256(LANES_8[half as usize].as_ptr().cast());
                    let packed = _mm256_permutevar8x32_epi32(values, order);
                    _mm256_storeu_si256(out.add(next).cast(), packed);
                }
                next += half.count_ones() as usize;
            }
            row += 8;
        }
        while row + 4 <= keep.len() {
            // SAFETY: as in `compact_4`, with 4 rows.
            let (word, values) = unsafe {
                (
                    keep.as_ptr().add(row).cast::<i32>().read_unaligned(),
                    _mm256_loadu_si256(from.add(row).cast()),
                )
            };
            let mask = kept_bits(_mm_cvtsi32_si128(word)) & 0xf;
            // SAFETY: the table row holds 8 lanes.
            let order = unsafe { _mm256_loadu_si256(LANES_8[mask as usize].as_ptr().cast()) };
            let packed = _mm256_permutevar8x32_epi32(values, order);
            // SAFETY: as above.
            unsafe { _mm256_storeu_si256(out.add(next).cast(), packed) };
            next += mask.count_ones() as usize;
            row += 4;
        }
        (row, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn reference<T: Copy>(from: &[T], keep: &[u8]) -> Vec<T> {
        from.iter()
            .zip(keep)
            .filter(|(_, &k)| k != 0)
            .map(|(v, _)| *v)
            .collect()
    }

    /// Every length around the vector widths, every density, every element width the
    /// columns use: equal to the obvious filter.
    #[test]
    fn compaction_keeps_exactly_the_kept_rows_in_order() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut out32 = Vec::new();
        let mut out64 = Vec::new();
        let mut outf = Vec::new();
        for len in (0..70).chain([1023, 1024, 1025, 10_000]) {
            for density in [0.0, 0.05, 0.5, 0.94, 1.0] {
                let keep: Vec<u8> = (0..len)
                    .map(|_| {
                        if rng.gen_bool(density) {
                            rng.gen_range(1..=255)
                        } else {
                            0
                        }
                    })
                    .collect();
                let a: Vec<u32> = (0..len).map(|_| rng.gen()).collect();
                let b: Vec<u64> = (0..len).map(|_| rng.gen()).collect();
                let c: Vec<f64> = (0..len).map(|_| rng.gen::<f64>() - 0.5).collect();
                compact_into(&mut out32, &a, &keep);
                compact_into(&mut out64, &b, &keep);
                compact_into(&mut outf, &c, &keep);
                assert_eq!(out32, reference(&a, &keep), "len {len} density {density}");
                assert_eq!(out64, reference(&b, &keep), "len {len} density {density}");
                assert_eq!(outf, reference(&c, &keep), "len {len} density {density}");
                // A shorter mask drops the rows past it.
                let short = &keep[..len / 2];
                compact_into(&mut out64, &b, short);
                assert_eq!(out64, reference(&b[..len / 2], short));
            }
        }
    }
}
