//! The router's side of sharing load with other replicas: its own booking changes go out
//! on a feed, the others' come in and count in every worker's load (`crate::replicas`
//! carries them over the bus).

use super::*;
use crate::load_accounting::Booking;

impl Router {
    /// From now on, every change to this router's bookings is sent on `feed` (bounded:
    /// a change that finds it full is dropped and counted, never waited for).
    pub fn share_bookings(&self, feed: tokio::sync::mpsc::Sender<BookingChange>) {
        let _ = self.bookings.feed.set(feed);
    }

    /// Sends a change on the feed, when load is shared (costs nothing otherwise).
    pub(super) fn announce(&self, change: impl FnOnce() -> BookingChange) {
        if let Some(feed) = self.bookings.feed.get() {
            if feed.try_send(change()).is_err() {
                self.metrics
                    .replicas
                    .dropped
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// Another replica's booking change.
    pub fn apply_remote(&self, replica: &str, change: &BookingChange) {
        self.bookings
            .book(|load| load.apply_remote(replica, change));
    }

    /// Another replica's bookings, whole (its snapshot).
    pub fn replace_remote(&self, replica: &str, changes: &[BookingChange]) {
        self.bookings.book(|load| {
            load.drop_replica(replica);
            for change in changes {
                load.apply_remote(replica, change);
            }
        });
    }

    /// Forgets a replica that went away; how many of its bookings were dropped.
    pub fn drop_replica(&self, replica: &str) -> usize {
        self.bookings.book(|load| load.drop_replica(replica))
    }

    /// This router's own bookings, as the changes that recreate them.
    pub fn local_bookings(&self) -> Vec<BookingChange> {
        self.bookings
            .load
            .read()
            .local_bookings()
            .iter()
            .map(|(id, booking): &(String, Booking)| BookingChange::reserve(id, booking))
            .collect()
    }

    /// Other replicas' bookings counted now.
    pub fn remote_bookings(&self) -> usize {
        self.bookings.load.read().remote_bookings()
    }
}
