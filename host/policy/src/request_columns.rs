//! The columns one request writes over a partition's kept rows: the cache overlaps, and
//! what follows from them. Every selection writes them for every row before any filter
//! runs. The overlaps come as columns (the KV index writes its answer in row order), so
//! the rest is derived in plain passes over them, which the compiler vectorizes.

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
}
