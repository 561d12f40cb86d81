//! The column kernels of a selection, the hot loops over a partition's kept rows.
//!
//! The columns one request writes over the rows (`RequestColumns`): the cache overlaps,
//! and what follows from them. Every selection writes them for every row before any
//! filter runs. The overlaps come as columns (the KV index writes its answer in row
//! order), so the rest is derived in plain passes over them, which the compiler
//! vectorizes.
//!
//! Compaction of columns by a filter's keep mask: the rows whose keep byte is non-zero,
//! in order. The hot loop of every filter that drops rows (one pass per column later
//! stages read), so the mask is read once into bits ([`KeepBits`]), and with AVX2 each
//! column moves 8 rows of 4 bytes, or 4 rows of 8 bytes, per instruction through a table
//! of lane permutations; elsewhere, and for the rows past the last whole byte of bits, a
//! branch-free scalar loop.

/// The request-dependent columns, aligned with the kept rows.
#[derive(Default)]
pub(super) struct RequestColumns {
    /// Written for every request (the booking and the decode cost read it); handed to
    /// components, with the host and disk ones, only with the CACHE group.
    pub device_overlap_blocks: Vec<u32>,
    pub host_overlap_blocks: Vec<u32>,
    pub disk_overlap_blocks: Vec<u32>,
    pub shared_beyond_device_blocks: Vec<u32>,
    pub decode_cost_blocks: Vec<u64>,
}

impl RequestColumns {
    /// Writes rows `0..n`: `overlaps` writes every row's device, host and disk overlaps
    /// into the three columns it is given (`n` rows each) and returns the fleet prefix
    /// (the longest prefix of the request cached anywhere). From those follow, with
    /// `cache`, each row's blocks shared beyond its device prefix, and with `booked` (the
    /// kept decode blocks, `n` of them) its decode cost: booked blocks plus the request's
    /// blocks not cached on the device.
    #[inline]
    pub fn write(
        &mut self,
        n: usize,
        cache: bool,
        booked: Option<&[u64]>,
        request_blocks: u64,
        overlaps: impl FnOnce([&mut [u32]; 3]) -> u32,
    ) {
        let (device, host, disk) = (
            &mut self.device_overlap_blocks,
            &mut self.host_overlap_blocks,
            &mut self.disk_overlap_blocks,
        );
        // Only grown rows are zeroed: `overlaps` writes every row.
        for column in [&mut *device, &mut *host, &mut *disk] {
            column.resize(n, 0);
        }
        let fleet_prefix = overlaps([&mut device[..], &mut host[..], &mut disk[..]]);
        let derived = Derived {
            device: &self.device_overlap_blocks,
            fleet_prefix,
            shared: &mut self.shared_beyond_device_blocks,
            cache,
            booked: booked.filter(|booked| booked.len() == n),
            request_blocks,
            decode: &mut self.decode_cost_blocks,
        };
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            unsafe { derived.write_avx2() };
            return;
        }
        derived.write();
    }
}

/// The columns that follow from the device overlaps.
struct Derived<'a> {
    device: &'a [u32],
    fleet_prefix: u32,
    shared: &'a mut Vec<u32>,
    cache: bool,
    booked: Option<&'a [u64]>,
    request_blocks: u64,
    decode: &'a mut Vec<u64>,
}

impl Derived<'_> {
    /// Plain passes over the columns, which the compiler vectorizes.
    #[inline(always)]
    fn write(self) {
        let (device, fleet_prefix) = (self.device, self.fleet_prefix);
        let n = device.len();
        self.shared.clear();
        if self.cache {
            fill(self.shared, n, device.as_ptr(), |row| {
                fleet_prefix.saturating_sub(device[row])
            });
        }
        self.decode.clear();
        let Some(booked) = self.booked else {
            return;
        };
        let request_blocks = self.request_blocks;
        match u32::try_from(request_blocks) {
            // In 32 bits, the common case: twice the lanes per vector.
            Ok(blocks) => fill(self.decode, n, booked.as_ptr(), |row| {
                booked[row].wrapping_add(u64::from(blocks.saturating_sub(device[row])))
            }),
            // Past every overlap: nothing saturates.
            Err(_) => fill(self.decode, n, booked.as_ptr(), |row| {
                booked[row].wrapping_add(request_blocks - u64::from(device[row]))
            }),
        }
    }

    /// The same passes with 256-bit vectors.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn write_avx2(self) {
        self.write()
    }
}

/// Sets `out` (empty) to `value(row)` for rows `0..n`, read in step with the column at
/// `from`: backwards when `out` starts a little past it modulo 4 KiB. Forwards, each load
/// would then match a store just made in the address bits the CPU compares first, and
/// wait for it (4K aliasing: measured, this pass 3x slower for one heap layout).
#[inline(always)]
fn fill<T, F>(out: &mut Vec<T>, n: usize, from: *const F, value: impl Fn(usize) -> T) {
    out.reserve(n);
    let gap = (out.as_ptr() as usize).wrapping_sub(from as usize) % 4096;
    write_rows(out, n, gap < 1024, value);
}

/// Sets `out` (empty, with room for `n`) to `value(row)` for rows `0..n`, walking the rows
/// forwards or backwards.
#[inline(always)]
fn write_rows<T>(out: &mut Vec<T>, n: usize, backwards: bool, value: impl Fn(usize) -> T) {
    let rows = &mut out.spare_capacity_mut()[..n];
    if backwards {
        for row in (0..n).rev() {
            rows[row].write(value(row));
        }
    } else {
        for (row, slot) in rows.iter_mut().enumerate() {
            slot.write(value(row));
        }
    }
    // SAFETY: rows 0..n were written above.
    unsafe { out.set_len(n) };
}

/// A keep mask as one bit per row (8 rows a byte, row 0 in bit 0), read once per filter
/// and used for every column. The buffer is reused.
#[derive(Default)]
pub struct KeepBits {
    bits: Vec<u8>,
    rows: usize,
}

impl KeepBits {
    /// Becomes `keep`'s mask: a row is kept when its byte is non-zero.
    pub fn read(&mut self, keep: &[u8]) {
        self.rows = keep.len();
        self.bits.clear();
        let done = read_16s(keep, &mut self.bits);
        self.bits.extend(keep[done..].chunks(8).map(|eight| {
            eight
                .iter()
                .enumerate()
                .fold(0u8, |bits, (row, &k)| bits | (u8::from(k != 0) << row))
        }));
    }

    /// Sets `to` to the rows of `from` this mask keeps, in order (rows past either's end
    /// are dropped). `to`'s buffer is reused.
    pub fn compact<T: Copy>(&self, to: &mut Vec<T>, from: &[T]) {
        let n = from.len().min(self.rows);
        to.clear();
        to.reserve(n);
        let out = to.as_mut_ptr();
        let whole = &self.bits[..n / 8];
        let (mut row, mut next) = vectorized(out, &from[..whole.len() * 8], whole);
        while row < n {
            let kept = (self.bits[row / 8] >> (row % 8)) & 1;
            // SAFETY: `next` <= `row` < n <= the capacity reserved above, and `T: Copy`
            // has nothing to drop.
            unsafe { out.add(next).write(from[row]) };
            next += usize::from(kept);
            row += 1;
        }
        // SAFETY: rows 0..next were written above (or by `vectorized`).
        unsafe { to.set_len(next) };
    }
}

/// Appends the bits of `keep`'s leading whole 16-row chunks to `bits`, 16 rows per
/// instruction; returns the rows read.
#[cfg(target_arch = "x86_64")]
fn read_16s(keep: &[u8], bits: &mut Vec<u8>) -> usize {
    use std::arch::x86_64::*;
    let sixteens = keep.chunks_exact(16);
    let done = keep.len() - sixteens.remainder().len();
    bits.extend(sixteens.flat_map(|sixteen| {
        // SAFETY: SSE2 is part of x86-64, and the chunk holds 16 bytes.
        let dropped = unsafe {
            let bytes = _mm_loadu_si128(sixteen.as_ptr().cast());
            _mm_movemask_epi8(_mm_cmpeq_epi8(bytes, _mm_setzero_si128()))
        };
        (!dropped as u16).to_le_bytes()
    }));
    done
}

#[cfg(not(target_arch = "x86_64"))]
fn read_16s(_: &[u8], _: &mut Vec<u8>) -> usize {
    0
}

/// Compacts `from` (8 rows per byte of `bits`) into `out` where the CPU can; returns the
/// rows done and the rows written.
#[cfg(target_arch = "x86_64")]
fn vectorized<T: Copy>(out: *mut T, from: &[T], bits: &[u8]) -> (usize, usize) {
    if !std::arch::is_x86_feature_detected!("avx2")
        || !std::arch::is_x86_feature_detected!("popcnt")
    {
        return (0, 0);
    }
    // SAFETY: AVX2 and POPCNT are available (checked above); `out` has room for `from.len()`
    // elements (the caller's contract), `from` holds 8 rows per byte of `bits`, and
    // elements of 4 or 8 bytes are moved as plain bits, which is a copy of a `Copy` value.
    unsafe {
        match std::mem::size_of::<T>() {
            4 => avx2::compact_4(out.cast(), from.as_ptr().cast(), bits),
            8 => avx2::compact_8(out.cast(), from.as_ptr().cast(), bits),
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

    /// # Safety
    /// AVX2 and POPCNT are available; `from` holds 8 elements of 4 bytes per byte of
    /// `bits`; `out` has room for as many.
    #[target_feature(enable = "avx2,popcnt")]
    pub unsafe fn compact_4(out: *mut u32, from: *const u32, bits: &[u8]) -> (usize, usize) {
        let mut next = 0;
        for (eight, &mask) in bits.iter().enumerate() {
            let row = eight * 8;
            // SAFETY: rows row..row + 8 exist in `from`, and `next` <= `row`, so the 8
            // lanes stored at `next` stay within `out`'s room; the table row holds 8 lanes.
            unsafe {
                let values = _mm256_loadu_si256(from.add(row).cast());
                let order = _mm256_loadu_si256(LANES_4[mask as usize].as_ptr().cast());
                let packed = _mm256_permutevar8x32_epi32(values, order);
                _mm256_storeu_si256(out.add(next).cast(), packed);
            }
            next += mask.count_ones() as usize;
        }
        (bits.len() * 8, next)
    }

    /// # Safety
    /// As `compact_4`, for elements of 8 bytes.
    #[target_feature(enable = "avx2,popcnt")]
    pub unsafe fn compact_8(out: *mut u64, from: *const u64, bits: &[u8]) -> (usize, usize) {
        let mut next = 0;
        // One byte of bits, two permutations of 4 rows.
        for (eight, &mask) in bits.iter().enumerate() {
            let row = eight * 8;
            for (half, offset) in [(mask & 0xf, 0), (mask >> 4, 4)] {
                // SAFETY: as in `compact_4`: rows row..row + 8 exist, and each half's 4
                // lanes are stored at or before its own rows.
                unsafe {
                    let values = _mm256_loadu_si256(from.add(row + offset).cast());
                    let order = _mm256_loadu_si256(LANES_8[half as usize].as_ptr().cast());
                    let packed = _mm256_permutevar8x32_epi32(values, order);
                    _mm256_storeu_si256(out.add(next).cast(), packed);
                }
                next += half.count_ones() as usize;
            }
        }
        (bits.len() * 8, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn rows_written_backwards_equal_rows_written_forwards() {
        for n in [0, 1, 5, 1024] {
            let (mut forwards, mut backwards) = (Vec::new(), Vec::new());
            forwards.reserve(n);
            backwards.reserve(n);
            write_rows(&mut forwards, n, false, |row| row as u64 * 3);
            write_rows(&mut backwards, n, true, |row| row as u64 * 3);
            assert_eq!(forwards, (0..n as u64).map(|r| r * 3).collect::<Vec<_>>());
            assert_eq!(backwards, forwards);
        }
    }

    /// Lengths growing and shrinking, with and without each group, request sizes on
    /// both sides of the overlaps and past 32 bits: equal to the row-by-row definition.
    #[test]
    fn derived_columns_equal_the_row_by_row_definition() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let mut columns = RequestColumns::default();
        for n in [0, 1, 7, 1024, 3, 1023, 16] {
            let tiers: [Vec<u32>; 3] =
                std::array::from_fn(|_| (0..n).map(|_| rng.gen_range(0..80)).collect());
            let fleet_prefix = rng.gen_range(0..90);
            let booked: Vec<u64> = (0..n).map(|_| rng.gen_range(0..1 << 40)).collect();
            for request_blocks in [0, 40, 64, u64::from(u32::MAX), 1 << 33] {
                for (cache, load) in [(true, true), (true, false), (false, true), (false, false)] {
                    columns.write(
                        n,
                        cache,
                        load.then_some(&booked[..]),
                        request_blocks,
                        |out| {
                            for (column, tier) in out.into_iter().zip(&tiers) {
                                assert_eq!(column.len(), n);
                                column.copy_from_slice(tier);
                            }
                            fleet_prefix
                        },
                    );
                    assert_eq!(columns.device_overlap_blocks, tiers[0], "n {n}");
                    assert_eq!(columns.host_overlap_blocks, tiers[1]);
                    assert_eq!(columns.disk_overlap_blocks, tiers[2]);
                    let shared: Vec<u32> = match cache {
                        true => tiers[0]
                            .iter()
                            .map(|&d| fleet_prefix.saturating_sub(d))
                            .collect(),
                        false => Vec::new(),
                    };
                    assert_eq!(columns.shared_beyond_device_blocks, shared);
                    let decode: Vec<u64> = match load {
                        true => booked
                            .iter()
                            .zip(&tiers[0])
                            .map(|(&b, &d)| b + request_blocks.saturating_sub(u64::from(d)))
                            .collect(),
                        false => Vec::new(),
                    };
                    assert_eq!(
                        columns.decode_cost_blocks, decode,
                        "n {n} request {request_blocks}"
                    );
                }
            }
        }
    }

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
        let mut bits = KeepBits::default();
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
                bits.read(&keep);
                bits.compact(&mut out32, &a);
                bits.compact(&mut out64, &b);
                bits.compact(&mut outf, &c);
                assert_eq!(out32, reference(&a, &keep), "len {len} density {density}");
                assert_eq!(out64, reference(&b, &keep), "len {len} density {density}");
                assert_eq!(outf, reference(&c, &keep), "len {len} density {density}");
                // A shorter column keeps its own rows only.
                bits.compact(&mut out64, &b[..len / 2]);
                assert_eq!(out64, reference(&b[..len / 2], &keep));
            }
        }
    }
}
