//! Session binding (`router.session_affinity`): each session, per worker type, is bound
//! to the worker its last request was dispatched to. A binding unused for `ttl_secs` is
//! forgotten when next looked up; past `max_sessions` the least recently used session is
//! forgotten. Memory is bounded by the setting, one entry per session.

use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use lru::LruCache;
use parking_lot::Mutex;
use switchyard_plugin_sdk::{WorkerId, WorkerType};

/// One session's bindings, by worker type (a disaggregated session has a prefill and a
/// decode worker).
#[derive(Clone, Copy, Default)]
struct Bound([Option<(WorkerId, Instant)>; 3]);

fn role(worker_type: WorkerType) -> usize {
    match worker_type {
        WorkerType::Prefill => 0,
        WorkerType::Decode => 1,
        WorkerType::Select => 2,
    }
}

/// The router's session bindings. Its lock is a leaf: never held while another is taken.
pub struct Sessions {
    bound: Mutex<LruCache<String, Bound>>,
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions {
            bound: Mutex::new(LruCache::unbounded()),
        }
    }
}

impl Sessions {
    /// The worker `session`'s requests to `worker_type` workers are bound to, unless the
    /// binding is older than `ttl` (then it is forgotten).
    pub fn bound(&self, session: &str, worker_type: WorkerType, ttl: Duration) -> Option<WorkerId> {
        let mut bound = self.bound.lock();
        let slot = &mut bound.get_mut(session)?.0[role(worker_type)];
        match *slot {
            Some((worker, at)) if at.elapsed() < ttl => Some(worker),
            Some(_) => {
                *slot = None;
                None
            }
            None => None,
        }
    }

    /// Binds `session`'s `worker_type` requests to `worker`, keeping at most `max`
    /// sessions (the least recently used goes first).
    pub fn bind(&self, session: &str, worker_type: WorkerType, worker: WorkerId, max: usize) {
        let mut bound = self.bound.lock();
        if let Some(cap) = NonZeroUsize::new(max) {
            if bound.cap() != cap {
                bound.resize(cap);
            }
        }
        let now = Some((worker, Instant::now()));
        match bound.get_mut(session) {
            Some(entry) => entry.0[role(worker_type)] = now,
            None => {
                let mut entry = Bound::default();
                entry.0[role(worker_type)] = now;
                bound.push(session.to_owned(), entry);
            }
        }
    }

    /// Forgets `session` (its last request, or a client asking to evict it).
    pub fn forget(&self, session: &str) {
        self.bound.lock().pop(session);
    }

    /// Sessions bound now.
    pub fn len(&self) -> usize {
        self.bound.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(id: u64) -> WorkerId {
        WorkerId {
            worker_id: id,
            dp_rank: 0,
        }
    }

    #[test]
    fn bound_per_role_expired_and_bounded() {
        let sessions = Sessions::default();
        let long = Duration::from_secs(60);
        sessions.bind("a", WorkerType::Prefill, w(1), 2);
        sessions.bind("a", WorkerType::Decode, w(2), 2);
        assert_eq!(sessions.bound("a", WorkerType::Prefill, long), Some(w(1)));
        assert_eq!(sessions.bound("a", WorkerType::Decode, long), Some(w(2)));
        assert_eq!(sessions.bound("a", WorkerType::Select, long), None);
        assert_eq!(
            sessions.bound("a", WorkerType::Prefill, Duration::ZERO),
            None
        );
        assert_eq!(
            sessions.bound("a", WorkerType::Prefill, long),
            None,
            "forgotten"
        );
        sessions.bind("b", WorkerType::Select, w(3), 2);
        sessions.bind("c", WorkerType::Select, w(4), 2);
        assert_eq!(sessions.len(), 2, "at most max_sessions");
        assert_eq!(
            sessions.bound("a", WorkerType::Decode, long),
            None,
            "the oldest went"
        );
        sessions.forget("c");
        assert_eq!(sessions.bound("c", WorkerType::Select, long), None);
    }
}
