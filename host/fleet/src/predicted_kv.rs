//! `kv_tracking: predicted`: for engines that publish no KV events, the router assumes the
//! blocks of each prompt it routed are cached on the worker that served it. Per worker, a
//! bounded LRU of block hashes with a TTL says what is assumed; what falls out of it is
//! removed from the KV index, so the index never claims more than the bound.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use lru::LruCache;
use switchyard_plugin_sdk::WorkerId;

use super::kv_index::KvEvent;

/// What the router assumes each worker of predicted-tracking models caches.
#[derive(Default)]
pub struct PredictedKv {
    workers: HashMap<WorkerId, LruCache<u64, Instant>>,
}

impl PredictedKv {
    /// Records `hashes` as cached on `worker` now; returns the KV events that bring the
    /// index in line (evicted and expired blocks removed, the prompt's blocks stored).
    pub fn routed(
        &mut self,
        worker: WorkerId,
        hashes: &[u64],
        capacity: usize,
        ttl: Duration,
        now: Instant,
    ) -> [KvEvent; 2] {
        let capacity = NonZeroUsize::new(capacity.max(1)).expect("at least 1");
        let cache = self
            .workers
            .entry(worker)
            .or_insert_with(|| LruCache::new(capacity));
        let mut removed = Vec::new();
        while let Some((_, stored)) = cache.peek_lru() {
            if now.duration_since(*stored) < ttl {
                break;
            }
            if let Some((hash, _)) = cache.pop_lru() {
                removed.push(hash);
            }
        }
        for &hash in hashes {
            if let Some((evicted, _)) = cache.push(hash, now) {
                if evicted != hash {
                    removed.push(evicted);
                }
            }
        }
        removed.retain(|hash| !cache.contains(hash));
        KvEvent::evicted_then_stored(removed, hashes.to_vec())
    }

    pub fn remove_worker(&mut self, worker: WorkerId) {
        self.workers.remove(&worker);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: WorkerId = WorkerId {
        worker_id: 1,
        dp_rank: 0,
    };

    fn removed(events: &[KvEvent; 2]) -> Vec<u64> {
        match &events[0] {
            KvEvent::Removed { block_hashes, .. } => block_hashes.clone(),
            other => panic!("expected removals first, got {other:?}"),
        }
    }

    #[test]
    fn the_bound_evicts_the_least_recently_routed() {
        let mut kv = PredictedKv::default();
        let t = Instant::now();
        let ttl = Duration::from_secs(60);
        assert!(removed(&kv.routed(W, &[1, 2, 3], 4, ttl, t)).is_empty());
        assert!(removed(&kv.routed(W, &[1], 4, ttl, t)).is_empty());
        assert_eq!(removed(&kv.routed(W, &[4, 5], 4, ttl, t)), vec![2]);
    }

    #[test]
    fn expired_blocks_are_removed_unless_routed_again() {
        let mut kv = PredictedKv::default();
        let t = Instant::now();
        let ttl = Duration::from_secs(10);
        kv.routed(W, &[1, 2], 8, ttl, t);
        let later = t + Duration::from_secs(11);
        assert_eq!(removed(&kv.routed(W, &[2, 3], 8, ttl, later)), vec![1]);
    }
}
