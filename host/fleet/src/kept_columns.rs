//! Candidate columns kept per partition: each partition's healthy members with their
//! identity, booked load, routing multiplier, labels and engine reports, as the columns a selection
//! reads, kept up to date as bookings change instead of rebuilt per request.
//!
//! Plugin code reads the columns without the fleet's locks, so columns lent to a
//! selection are never written: they are versioned buffers. A booking change only
//! appends `(row, load)` to the partition's change log. The next selection takes the
//! latest buffer, brought up to date by replaying the log into it when no selection holds
//! it (in place: O(changes)), or else into another buffer none holds (a copy of the
//! latest, then the replay). With selections one at a time, a request costs O(changes);
//! only selections that overlap cost a copy, and buffers never outnumber the selections
//! running at once.
//!
//! Membership, health or spec changes (rare) rebuild a partition's columns whole.

use std::sync::Arc;

use rustc_hash::FxHashMap;
use switchyard_plugin_sdk::WorkerId;

use super::kv_index::{KvIndex, SlotRows};
use super::load_accounting::{LoadAccounting, WorkerLoad};
use super::workers::Workers;
use switchyard_plugin_host::plugin::PartitionKey;
use switchyard_policy::KeptColumns;

/// Spare buffers beyond this many are dropped once no selection holds them.
const MOST_BUFFERS: usize = 4;

/// One version of a partition's columns.
struct Buffer {
    columns: Arc<KeptColumns>,
    /// The row layout (rebuild) these columns follow.
    layout: u64,
    /// Changes applied: the log's sequence number this buffer is at.
    applied: u64,
}

impl Buffer {
    fn is_lent(&self) -> bool {
        Arc::strong_count(&self.columns) > 1
    }
}

/// What a selection borrows of a partition: its columns, and its rows as KV-index slots.
pub struct Lent {
    pub columns: Arc<KeptColumns>,
    pub slot_rows: Arc<SlotRows>,
}

/// One partition's columns: versioned buffers and the changes not yet in all of them.
struct PartitionColumns {
    buffers: Vec<Buffer>,
    /// Index of the buffer with the most changes applied (in the current layout).
    latest: usize,
    layout: u64,
    /// Booking changes since `log_start`, each a row's new load.
    log: Vec<(u32, WorkerLoad)>,
    log_start: u64,
    /// Each row's slot in the KV index, for the layout and index slot epoch in `kv_for`.
    slot_rows: Arc<SlotRows>,
    kv_for: Option<(u64, u64)>,
}

impl Default for PartitionColumns {
    fn default() -> Self {
        PartitionColumns {
            buffers: vec![Buffer {
                columns: Arc::default(),
                layout: 0,
                applied: 0,
            }],
            latest: 0,
            layout: 0,
            log: Vec::new(),
            log_start: 0,
            slot_rows: Arc::default(),
            kv_for: None,
        }
    }
}

impl PartitionColumns {
    fn seq(&self) -> u64 {
        self.log_start + self.log.len() as u64
    }

    fn rows(&self) -> usize {
        self.buffers[self.latest].columns.len()
    }

    /// Records a row's new load; it reaches the columns at the next `catch_up`.
    fn set_load(&mut self, row: u32, load: WorkerLoad) {
        self.log.push((row, load));
        // A log longer than the partition costs more to replay than a copy: fold it in.
        if self.log.len() > self.rows().max(64) {
            self.catch_up();
            self.log_start = self.seq();
            self.log.clear();
        }
    }

    /// A buffer no selection holds, for writing: the freshest in the current layout, or
    /// a new one when every buffer is lent. Spare buffers beyond `MOST_BUFFERS` go.
    fn free_buffer(&mut self) -> usize {
        while self.buffers.len() > MOST_BUFFERS {
            let spare =
                (0..self.buffers.len()).find(|&i| i != self.latest && !self.buffers[i].is_lent());
            let Some(i) = spare else { break };
            self.buffers.swap_remove(i);
            if self.latest == self.buffers.len() {
                self.latest = i;
            }
        }
        let layout = self.layout;
        let free = (0..self.buffers.len())
            .filter(|&i| !self.buffers[i].is_lent())
            .max_by_key(|&i| {
                let b = &self.buffers[i];
                (b.layout == layout, b.applied)
            });
        free.unwrap_or_else(|| {
            self.buffers.push(Buffer {
                columns: Arc::default(),
                layout: u64::MAX,
                applied: 0,
            });
            self.buffers.len() - 1
        })
    }

    /// The latest buffer with every change, one no selection holds (a copy if the latest
    /// is lent); returns its index.
    fn unlent_latest(&mut self) -> usize {
        let latest = self.catch_up();
        if !self.buffers[latest].is_lent() {
            return latest;
        }
        let i = self.free_buffer();
        // `free_buffer` may have moved buffers; `self.latest` follows.
        let latest = &self.buffers[self.latest];
        let (source, layout, applied) = (latest.columns.clone(), latest.layout, latest.applied);
        Arc::make_mut(&mut self.buffers[i].columns).copy_from(&source);
        let b = &mut self.buffers[i];
        (b.layout, b.applied) = (layout, applied);
        self.latest = i;
        i
    }

    /// Makes the latest buffer hold every change; returns its index.
    fn catch_up(&mut self) -> usize {
        let seq = self.seq();
        if self.buffers[self.latest].applied == seq {
            return self.latest;
        }
        let i = self.free_buffer();
        let (layout, log_start) = (self.layout, self.log_start);
        let from = {
            let b = &self.buffers[i];
            if b.layout == layout && b.applied >= log_start {
                b.applied
            } else {
                // Too far behind to replay: a copy of the latest, then its missing changes.
                let latest = &self.buffers[self.latest];
                let (source, applied) = (latest.columns.clone(), latest.applied);
                Arc::make_mut(&mut self.buffers[i].columns).copy_from(&source);
                applied
            }
        };
        let b = &mut self.buffers[i];
        // Not lent (see `free_buffer`): written in place.
        let columns = Arc::make_mut(&mut b.columns);
        for &(row, load) in &self.log[(from - log_start) as usize..] {
            columns.set_load(
                row as usize,
                load.active_prefill_tokens,
                load.active_decode_blocks,
                load.active_requests,
            );
        }
        b.applied = seq;
        b.layout = layout;
        self.latest = i;
        i
    }
}

/// Every partition's kept columns.
#[derive(Default)]
pub struct FleetColumns {
    partitions: Vec<PartitionColumns>,
    index: FxHashMap<PartitionKey, usize>,
    /// Each member's partition and row.
    rows: FxHashMap<WorkerId, (usize, u32)>,
}

impl FleetColumns {
    /// Brings `partition`'s columns in line with its healthy members (in `workers`'
    /// order) and their bookings. When members were only `appended`, the new ones are
    /// added as rows (so a fleet of N workers joining one by one costs O(N), not O(N^2));
    /// otherwise the columns are rebuilt whole.
    pub fn rebuild(
        &mut self,
        partition: &PartitionKey,
        workers: &Workers,
        load: &LoadAccounting,
        appended: bool,
    ) {
        let index = match self.index.get(partition) {
            Some(&index) => index,
            None => {
                self.partitions.push(PartitionColumns::default());
                self.index
                    .insert(partition.clone(), self.partitions.len() - 1);
                self.partitions.len() - 1
            }
        };
        let p = &mut self.partitions[index];
        let members = workers.members(partition);
        let i = p.catch_up();
        let old = &p.buffers[i].columns;
        let kept = old.len();
        let keep_rows = appended
            && kept <= members.len()
            && (kept == 0 || old.worker(kept - 1) == members[kept - 1]);
        if !keep_rows {
            for row in 0..kept {
                let id = old.worker(row);
                if self.rows.get(&id).is_some_and(|&(at, _)| at == index) {
                    self.rows.remove(&id);
                }
            }
        }
        let i = if keep_rows {
            p.unlent_latest()
        } else {
            p.free_buffer()
        };
        let columns = Arc::make_mut(&mut p.buffers[i].columns);
        let first = if keep_rows {
            kept
        } else {
            columns.clear();
            0
        };
        let labels = Arc::make_mut(&mut columns.labels);
        let engine = Arc::make_mut(&mut columns.engine);
        for (row, &id) in members.iter().enumerate().skip(first) {
            let booked = load.load(id);
            columns.worker_id.push(id.worker_id);
            columns.dp_rank.push(id.dp_rank);
            columns
                .active_prefill_tokens
                .push(booked.active_prefill_tokens);
            columns
                .active_decode_blocks
                .push(booked.active_decode_blocks);
            columns.active_requests.push(booked.active_requests);
            columns.preferred_taint_multiplier.push(
                workers
                    .get(id)
                    .and_then(|w| w.preferred_taint_multiplier)
                    .unwrap_or(f64::NAN),
            );
            labels.push(workers.labels(id));
            engine.push(workers.engine(id));
            self.rows.insert(id, (index, row as u32));
        }
        // Every other buffer is now of an older layout, and the log has nothing for this
        // one.
        p.layout += 1;
        p.log_start = p.seq();
        p.log.clear();
        p.kv_for = None;
        let b = &mut p.buffers[i];
        b.layout = p.layout;
        b.applied = p.log_start;
        p.latest = i;
    }

    /// A worker's booked load changed (a worker in no partition's columns is ignored).
    pub fn set_load(&mut self, worker: WorkerId, load: WorkerLoad) {
        if let Some(&(index, row)) = self.rows.get(&worker) {
            self.partitions[index].set_load(row, load);
        }
    }

    /// Lends `partition`'s up-to-date columns to a selection (`None`: the partition was
    /// never built). Held by the caller, they are never written; give them back soon, so
    /// the next booking changes can be applied in place.
    pub fn lend(&mut self, partition: &PartitionKey, kv: &KvIndex) -> Option<Lent> {
        let p = &mut self.partitions[*self.index.get(partition)?];
        let latest = p.catch_up();
        let columns = p.buffers[latest].columns.clone();
        let kv_for = (p.layout, kv.slots_epoch());
        if p.kv_for != Some(kv_for) {
            Arc::make_mut(&mut p.slot_rows)
                .set((0..columns.len()).map(|row| kv.slot_of(columns.worker(row))));
            p.kv_for = Some(kv_for);
        }
        Some(Lent {
            columns,
            slot_rows: p.slot_rows.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::WorkerSpec;
    use rand::{Rng, SeedableRng};
    use std::time::Duration;

    fn spec(id: u64) -> WorkerSpec {
        serde_json::from_value(serde_json::json!({"model": "m", "worker_id": id})).unwrap()
    }

    fn partition() -> PartitionKey {
        PartitionKey::new("m", switchyard_plugin_sdk::WorkerType::Select)
    }

    /// The columns a rebuild from scratch would give now.
    fn expected(workers: &Workers, load: &LoadAccounting) -> Vec<(WorkerId, WorkerLoad)> {
        workers
            .members(&partition())
            .iter()
            .map(|&id| (id, load.load(id)))
            .collect()
    }

    fn seen(columns: &KeptColumns) -> Vec<(WorkerId, WorkerLoad)> {
        (0..columns.len())
            .map(|row| {
                (
                    columns.worker(row),
                    WorkerLoad {
                        active_prefill_tokens: columns.active_prefill_tokens[row],
                        active_decode_blocks: columns.active_decode_blocks[row],
                        active_requests: columns.active_requests[row],
                    },
                )
            })
            .collect()
    }

    /// A booking (`roll` < 40), a free (< 60) or a prefill completion.
    fn book_at_random(
        rng: &mut rand::rngs::StdRng,
        roll: u32,
        step: usize,
        workers: &Workers,
        load: &mut LoadAccounting,
        booked: &mut Vec<String>,
    ) {
        if roll < 40 {
            let members = workers.members(&partition()).to_vec();
            if let Some(&worker) = members.get(rng.gen_range(0..members.len().max(1))) {
                let id = format!("r{step}");
                load.reserve(&id, worker, rng.gen_range(0..500), rng.gen_range(1..9))
                    .unwrap();
                booked.push(id);
            }
        } else if !booked.is_empty() && roll < 60 {
            let id = booked.swap_remove(rng.gen_range(0..booked.len()));
            // Gone with its worker, if that left.
            let _ = load.free(&id);
        } else if !booked.is_empty() {
            let id = &booked[rng.gen_range(0..booked.len())];
            let _ = load.prefill_complete(id);
        }
    }

    /// A health change (`roll` 70), a join (71) or a departure (72); the next new id.
    fn change_fleet_at_random(
        rng: &mut rand::rngs::StdRng,
        roll: u32,
        mut next_id: u64,
        workers: &mut Workers,
        load: &mut LoadAccounting,
    ) -> u64 {
        let id = WorkerId {
            worker_id: rng.gen_range(0..next_id),
            dp_rank: 0,
        };
        match roll {
            70 => {
                workers.set_healthy(id, rng.gen_bool(0.5));
            }
            71 => {
                workers.add(spec(next_id)).unwrap();
                next_id += 1;
            }
            _ => {
                if workers.remove(id).is_ok() {
                    load.remove_worker(id);
                }
            }
        }
        next_id
    }

    /// Random bookings, frees, health changes, joins and departures, with selections
    /// holding lent columns across them: every lend equals a rebuild from scratch, and
    /// what a selection holds never changes under it.
    #[test]
    fn lent_columns_equal_a_rebuild_and_never_change_while_held() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut workers = Workers::default();
        let mut load = LoadAccounting::new(Duration::from_secs(3600));
        let mut fleet = FleetColumns::default();
        let kv = KvIndex::default();
        for id in 0..40 {
            workers.add(spec(id)).unwrap();
        }
        fleet.rebuild(&partition(), &workers, &load, true);
        // Columns a selection holds, and what they held when lent.
        type Held = (Arc<KeptColumns>, Vec<(WorkerId, WorkerLoad)>);
        let mut held: Vec<Held> = Vec::new();
        let mut booked: Vec<String> = Vec::new();
        let mut next_id = 40;
        let mut most_held = 0;
        for step in 0..20_000 {
            match rng.gen_range(0..100) {
                roll @ 0..=69 => {
                    book_at_random(&mut rng, roll, step, &workers, &mut load, &mut booked)
                }
                roll @ 70..=72 => {
                    next_id =
                        change_fleet_at_random(&mut rng, roll, next_id, &mut workers, &mut load);
                }
                73..=84 => {
                    let lent = fleet.lend(&partition(), &kv).unwrap();
                    assert_eq!(
                        seen(&lent.columns),
                        expected(&workers, &load),
                        "step {step}"
                    );
                    assert_eq!(lent.slot_rows.len(), lent.columns.len());
                    let snapshot = seen(&lent.columns);
                    held.push((lent.columns, snapshot));
                }
                85..=94 if !held.is_empty() => {
                    let (columns, snapshot) = held.swap_remove(rng.gen_range(0..held.len()));
                    assert_eq!(
                        seen(&columns),
                        snapshot,
                        "step {step}: lent columns changed"
                    );
                }
                _ => {}
            }
            load.for_each_changed(|worker, now| fleet.set_load(worker, now));
            for (partition, appended) in workers.take_changed() {
                fleet.rebuild(&partition, &workers, &load, appended);
            }
            most_held = most_held.max(held.len());
            assert!(fleet.partitions[0].buffers.len() <= most_held + MOST_BUFFERS + 1);
        }
        for (columns, snapshot) in held {
            assert_eq!(seen(&columns), snapshot);
        }
    }
}
