//! Where plugin state is dropped. Dropping a generation, a partition's policies or its
//! admitters runs plugin code (`on_destroy`, `on_destroy_factory`), and whichever thread
//! lets go of the last reference would run it: an HTTP handler on the async executor, an
//! in-flight request ending there after a reload, a `DELETE /v1/workers`. So what a
//! reload or a partition drop retires is handed here, and this thread drops each item
//! once it holds the only reference. Nobody can take a new reference to a retired item
//! (the router no longer lists it), so "only reference" stays true once seen.
//!
//! At shutdown [`Retirement::finish`] drops what is no longer held and joins the thread,
//! so that no plugin code of a retired item runs while the process exits (and its
//! libraries' destructors run).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Something whose drop may run plugin code: dropped when nothing else holds it. Retire
/// each item once: two retired clones of one `Arc` would each see the other, and neither
/// would ever be dropped.
pub trait Retiring: Send {
    fn only_holder(&self) -> bool;
}

impl<T: Send + Sync + ?Sized> Retiring for Arc<T> {
    fn only_holder(&self) -> bool {
        Arc::strong_count(self) == 1
    }
}

/// How often retired items are looked at.
const POLL: Duration = Duration::from_millis(50);

/// The retirement thread and the way to it.
pub struct Retirement {
    sender: Mutex<Option<mpsc::Sender<Box<dyn Retiring>>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Set when shutdown stops waiting: the thread then keeps what is left and ends.
    abandoned: Arc<AtomicBool>,
}

impl Default for Retirement {
    fn default() -> Self {
        Self::new()
    }
}

impl Retirement {
    pub fn new() -> Self {
        let (sender, receiver) = mpsc::channel::<Box<dyn Retiring>>();
        let abandoned = Arc::new(AtomicBool::new(false));
        let stop = abandoned.clone();
        let thread = std::thread::Builder::new()
            .name("switchyard-retire".into())
            .spawn(move || drop_when_unheld(&receiver, &stop));
        let thread = match thread {
            Ok(thread) => Some(thread),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the thread that drops retired plugin state; it is kept instead");
                None
            }
        };
        Retirement {
            sender: Mutex::new(thread.as_ref().map(|_| sender)),
            thread: Mutex::new(thread),
            abandoned,
        }
    }

    /// Hands `item` over, to be dropped on the retirement thread once it alone holds it.
    /// Without that thread (it could not start, or shutdown finished it), `item` is kept
    /// for the life of the process rather than dropped here.
    pub fn retire(&self, item: Box<dyn Retiring>) {
        let refused = match &*self.sender.lock() {
            Some(sender) => sender.send(item).err().map(|e| e.0),
            None => Some(item),
        };
        if let Some(item) = refused {
            std::mem::forget(item);
        }
    }

    /// Drops what nothing else holds (waiting up to `limit` for the last holders) and
    /// stops the thread; anything still held after that is kept, never dropped late.
    pub fn finish(&self, limit: Duration) {
        drop(self.sender.lock().take());
        let Some(thread) = self.thread.lock().take() else {
            return;
        };
        let deadline = Instant::now() + limit;
        while !thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(POLL);
        }
        if !thread.is_finished() {
            tracing::warn!("retired plugin state still held at shutdown; kept, not dropped");
            self.abandoned.store(true, Ordering::Relaxed);
        }
        let _ = thread.join();
    }
}

/// The retirement thread: receives items and drops each once it is the only holder;
/// ends when the sender is gone and nothing is pending.
fn drop_when_unheld(receiver: &mpsc::Receiver<Box<dyn Retiring>>, abandoned: &AtomicBool) {
    let mut pending: Vec<Box<dyn Retiring>> = Vec::new();
    let mut open = true;
    while open || !pending.is_empty() {
        if abandoned.load(Ordering::Relaxed) {
            pending.into_iter().for_each(std::mem::forget);
            return;
        }
        match receiver.recv_timeout(POLL) {
            Ok(item) => pending.push(item),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                open = false;
                if !pending.is_empty() {
                    std::thread::sleep(POLL);
                }
            }
        }
        pending.retain(|item| !item.only_holder());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records the thread it was dropped on.
    struct Probe(Arc<Mutex<Option<String>>>);

    impl Drop for Probe {
        fn drop(&mut self) {
            *self.0.lock() = std::thread::current().name().map(str::to_owned);
        }
    }

    #[test]
    fn an_item_is_dropped_on_the_retirement_thread_once_its_last_other_holder_lets_go() {
        let retirement = Retirement::new();
        let dropped_on = Arc::new(Mutex::new(None));
        let item = Arc::new(Probe(dropped_on.clone()));
        let holder = item.clone();
        retirement.retire(Box::new(item));
        // A wait for something not to happen: no state shows that the thread looked and
        // kept the item, so give it three of its polls to get it wrong.
        std::thread::sleep(POLL * 3);
        assert!(dropped_on.lock().is_none(), "dropped while still held");
        drop(holder);
        retirement.finish(Duration::from_secs(10));
        assert_eq!(dropped_on.lock().as_deref(), Some("switchyard-retire"));
    }

    #[test]
    fn what_is_still_held_at_the_end_is_kept_not_dropped_late() {
        let retirement = Retirement::new();
        let dropped = Arc::new(AtomicBool::new(false));
        struct Flag(Arc<AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let item = Arc::new(Flag(dropped.clone()));
        let holder = item.clone();
        retirement.retire(Box::new(item));
        retirement.finish(POLL * 2);
        retirement.retire(Box::new(Arc::new(Flag(dropped.clone()))));
        assert!(!dropped.load(Ordering::Relaxed));
        std::mem::forget(holder);
    }
}
