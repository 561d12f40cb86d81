//! The columns one request writes over a partition's kept rows: the four cache-overlap
//! columns and the decode cost. Every selection writes them for every row before any
//! filter runs, so this is one pass with as few stores as the layout allows: overlaps
//! come one row at a time (one value of four tiers) and go out as four columns, so
//! four rows are transposed in registers and stored as one vector per column, and the
//! decode cost of those four rows is computed from the same registers.

use switchyard_plugin_sdk::CandidateCache;

/// The request-dependent columns, aligned with the kept rows.
#[derive(Default)]
pub(super) struct RequestColumns {
    /// Written for every request (the booking and the decode cost read it); handed to
    /// components only with the CACHE group.
    pub device_overlap_blocks: Vec<u32>,
    pub host_overlap_blocks: Vec<u32>,
    pub disk_overlap_blocks: Vec<u32>,
    pub shared_beyond_device_blocks: Vec<u32>,
    pub decode_cost_blocks: Vec<u64>,
}

/// Where one pass writes: the columns' buffers, `n` rows each (absent: not wanted).
struct Out {
    device: *mut u32,
    /// Host, disk and shared-beyond-device, when the CACHE group is wanted.
    tiers: Option<[*mut u32; 3]>,
    /// The booked decode blocks to add the request's uncached blocks to, and where the
    /// decode cost goes, when the LOAD group is wanted.
    decode: Option<(*const u64, *mut u64)>,
    request_blocks: u64,
}

impl RequestColumns {
    /// Writes rows `0..n`: each row's overlaps (from `overlap`, called once per row in
    /// order), all four tiers when `cache`, only the device one otherwise (the booking
    /// reads it); and with `booked` (the kept decode blocks, `n` of them) the decode cost:
    /// booked blocks plus the request's blocks not cached on the device.
    #[inline]
    pub fn write(
        &mut self,
        n: usize,
        cache: bool,
        booked: Option<&[u64]>,
        request_blocks: u64,
        overlap: impl FnMut(usize) -> CandidateCache,
    ) {
        let booked = booked.filter(|booked| booked.len() == n);
        let out = Out {
            device: room(&mut self.device_overlap_blocks, n),
            tiers: cache.then(|| {
                [
                    room(&mut self.host_overlap_blocks, n),
                    room(&mut self.disk_overlap_blocks, n),
                    room(&mut self.shared_beyond_device_blocks, n),
                ]
            }),
            decode: booked.map(|booked| (booked.as_ptr(), room(&mut self.decode_cost_blocks, n))),
            request_blocks,
        };
        if !cache {
            for column in [
                &mut self.host_overlap_blocks,
                &mut self.disk_overlap_blocks,
                &mut self.shared_beyond_device_blocks,
            ] {
                column.clear();
            }
        }
        if booked.is_none() {
            self.decode_cost_blocks.clear();
        }
        // SAFETY: every pointer in `out` has room for `n` rows (`room`), and `booked`
        // holds `n`.
        unsafe { write_rows(&out, n, overlap) };
        // SAFETY: rows 0..n of every wanted column were written above.
        unsafe {
            self.device_overlap_blocks.set_len(n);
            if cache {
                self.host_overlap_blocks.set_len(n);
                self.disk_overlap_blocks.set_len(n);
                self.shared_beyond_device_blocks.set_len(n);
            }
            if booked.is_some() {
                self.decode_cost_blocks.set_len(n);
            }
        }
    }
}

/// `column` emptied with room for `n` rows: they are written through the pointer and
/// committed with `set_len` once written.
fn room<T>(column: &mut Vec<T>, n: usize) -> *mut T {
    column.clear();
    column.reserve(n);
    column.as_mut_ptr()
}

/// The request's blocks not cached on a device holding `device` of them.
#[inline]
fn uncached(request_blocks: u64, device: u32) -> u64 {
    request_blocks.saturating_sub(u64::from(device))
}

/// # Safety
/// Every pointer in `out` is valid for `n` rows.
#[inline]
unsafe fn write_rows(out: &Out, n: usize, mut overlap: impl FnMut(usize) -> CandidateCache) {
    let mut row = 0;
    #[cfg(target_arch = "x86_64")]
    if out.request_blocks <= u64::from(u32::MAX) {
        while row + 4 <= n {
            let rows = [
                overlap(row),
                overlap(row + 1),
                overlap(row + 2),
                overlap(row + 3),
            ];
            // SAFETY: rows row..row + 4 are below n (the caller's contract).
            unsafe { sse2::write_4(out, row, rows) };
            row += 4;
        }
    }
    for row in row..n {
        let c = overlap(row);
        // SAFETY: `row` < n (the caller's contract).
        unsafe {
            out.device.add(row).write(c.device_overlap_blocks);
            if let Some([host, disk, shared]) = out.tiers {
                host.add(row).write(c.host_overlap_blocks);
                disk.add(row).write(c.disk_overlap_blocks);
                shared.add(row).write(c.shared_beyond_device_blocks);
            }
            if let Some((booked, decode)) = out.decode {
                let cost = booked
                    .add(row)
                    .read()
                    .wrapping_add(uncached(out.request_blocks, c.device_overlap_blocks));
                decode.add(row).write(cost);
            }
        }
    }
}

/// SSE2 is part of x86-64 itself: no detection needed.
#[cfg(target_arch = "x86_64")]
mod sse2 {
    use std::arch::x86_64::*;

    use super::{CandidateCache, Out};

    /// Four rows: transposed into one vector per tier, each stored at once, and their
    /// decode costs.
    ///
    /// # Safety
    /// Rows `row..row + 4` are within every column of `out`; `out.request_blocks` fits in
    /// 32 bits.
    #[inline]
    #[target_feature(enable = "sse2")]
    pub(super) unsafe fn write_4(out: &Out, row: usize, rows: [CandidateCache; 4]) {
        let [r0, r1, r2, r3] = rows.map(|c| {
            _mm_set_epi32(
                c.shared_beyond_device_blocks as i32,
                c.disk_overlap_blocks as i32,
                c.host_overlap_blocks as i32,
                c.device_overlap_blocks as i32,
            )
        });
        // (device, host) and (disk, shared) of rows 0-1 and of rows 2-3 ...
        let (low01, low23) = (_mm_unpacklo_epi32(r0, r1), _mm_unpacklo_epi32(r2, r3));
        let (high01, high23) = (_mm_unpackhi_epi32(r0, r1), _mm_unpackhi_epi32(r2, r3));
        // ... then each tier's four rows.
        let device = _mm_unpacklo_epi64(low01, low23);
        // SAFETY: rows row..row + 4 are within every column (the caller's contract).
        unsafe {
            _mm_storeu_si128(out.device.add(row).cast(), device);
            if let Some([host, disk, shared]) = out.tiers {
                _mm_storeu_si128(host.add(row).cast(), _mm_unpackhi_epi64(low01, low23));
                _mm_storeu_si128(disk.add(row).cast(), _mm_unpacklo_epi64(high01, high23));
                _mm_storeu_si128(shared.add(row).cast(), _mm_unpackhi_epi64(high01, high23));
            }
        }
        let Some((booked, decode)) = out.decode else {
            return;
        };
        // The request's uncached blocks, saturating at zero: a 32-bit unsigned compare
        // is a signed one with the sign bits flipped.
        let blocks = _mm_set1_epi32(out.request_blocks as u32 as i32);
        let flip = _mm_set1_epi32(i32::MIN);
        let beyond = _mm_cmpgt_epi32(_mm_xor_si128(device, flip), _mm_xor_si128(blocks, flip));
        let uncached = _mm_andnot_si128(beyond, _mm_sub_epi32(blocks, device));
        let zero = _mm_setzero_si128();
        // SAFETY: as above; `booked` holds as many rows as the columns.
        unsafe {
            let low = _mm_loadu_si128(booked.add(row).cast());
            let high = _mm_loadu_si128(booked.add(row + 2).cast());
            let low = _mm_add_epi64(low, _mm_unpacklo_epi32(uncached, zero));
            let high = _mm_add_epi64(high, _mm_unpackhi_epi32(uncached, zero));
            _mm_storeu_si128(decode.add(row).cast(), low);
            _mm_storeu_si128(decode.add(row + 2).cast(), high);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Every length around the vector width, with and without each group, request sizes
    /// on both sides of the overlaps and past 32 bits: equal to the row-by-row
    /// definition.
    #[test]
    fn written_columns_equal_the_row_by_row_definition() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let mut columns = RequestColumns::default();
        for n in (0..19).chain([1023, 1024]) {
            let rows: Vec<CandidateCache> = (0..n)
                .map(|_| CandidateCache {
                    device_overlap_blocks: rng.gen_range(0..80),
                    host_overlap_blocks: rng.gen(),
                    disk_overlap_blocks: rng.gen(),
                    shared_beyond_device_blocks: rng.gen(),
                })
                .collect();
            let booked: Vec<u64> = (0..n).map(|_| rng.gen_range(0..1 << 40)).collect();
            for request_blocks in [0, 40, 64, u64::from(u32::MAX), 1 << 33] {
                for (cache, load) in [(true, true), (true, false), (false, true), (false, false)] {
                    columns.write(
                        n,
                        cache,
                        load.then_some(&booked[..]),
                        request_blocks,
                        |row| rows[row],
                    );
                    let device: Vec<u32> = rows.iter().map(|c| c.device_overlap_blocks).collect();
                    assert_eq!(columns.device_overlap_blocks, device, "n {n}");
                    let tier = |f: fn(&CandidateCache) -> u32| -> Vec<u32> {
                        match cache {
                            true => rows.iter().map(f).collect(),
                            false => Vec::new(),
                        }
                    };
                    assert_eq!(columns.host_overlap_blocks, tier(|c| c.host_overlap_blocks));
                    assert_eq!(columns.disk_overlap_blocks, tier(|c| c.disk_overlap_blocks));
                    assert_eq!(
                        columns.shared_beyond_device_blocks,
                        tier(|c| c.shared_beyond_device_blocks)
                    );
                    let decode: Vec<u64> = match load {
                        true => booked
                            .iter()
                            .zip(&device)
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
}
