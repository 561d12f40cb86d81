//! The load's own clock. A soak's length, a churn's rate, a probe's period and clients
//! arriving apart are the load a test puts on the router, not waits for a state (those
//! are `eventually`'s, which polls what it waits for): every one of them is here.
//!
//! A run's paced loops wait on its [`Stop`], not on a fixed sleep, so stopping takes no
//! longer than the work in hand; and a load thread started with [`Stop::spawn`] that
//! panics stops the whole run, so a broken soak fails in seconds, not after its length.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The end of a run, shared by its load threads and the test that runs them.
#[derive(Clone, Default)]
pub struct Stop(Arc<(Mutex<bool>, Condvar)>);

impl Stop {
    pub fn new() -> Stop {
        Stop::default()
    }

    /// Ends the run: every paced wait returns now.
    pub fn stop(&self) {
        let (stopped, changed) = &*self.0;
        *stopped.lock().unwrap_or_else(PoisonError::into_inner) = true;
        changed.notify_all();
    }

    pub fn stopped(&self) -> bool {
        *self.0 .0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Paces a loop or a run: `period`, or less when the run stops meanwhile; whether it
    /// has stopped.
    pub fn pause(&self, period: Duration) -> bool {
        let deadline = Instant::now() + period;
        let (stopped, changed) = &*self.0;
        let mut stopped = stopped.lock().unwrap_or_else(PoisonError::into_inner);
        while !*stopped {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            stopped = changed
                .wait_timeout(stopped, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        *stopped
    }

    /// The run's length (or a window of it) on the test's own thread: `pause`, and a
    /// failure when a load thread's panic stopped the run first (its message is above).
    pub fn run_for(&self, length: Duration) {
        assert!(
            !self.pause(length),
            "the run stopped early: a load thread failed (its panic is printed above)"
        );
    }

    /// `load` on a thread of its own, handed this run's `Stop`; a panic there stops the
    /// run (and `join` returns it).
    pub fn spawn<T: Send + 'static>(
        &self,
        load: impl FnOnce(&Stop) -> T + Send + 'static,
    ) -> JoinHandle<T> {
        let stop = self.clone();
        std::thread::spawn(move || {
            let _on_panic = StopOnPanic(&stop);
            load(&stop)
        })
    }
}

struct StopOnPanic<'a>(&'a Stop);

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.stop();
        }
    }
}

/// One period of a steady rate in a loop that ends at a deadline of its own, or the gap
/// between clients started one after another.
pub fn pace(period: Duration) {
    std::thread::sleep(period);
}

/// Client `i` of a group started together, arriving `gap` apart: it waits `i * gap`.
pub fn arrive(i: u32, gap: Duration) {
    pace(gap * i);
}
