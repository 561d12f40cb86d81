//! Worker labels as components read them (the LABELS input group, ABI 1.1): one immutable
//! sorted list per worker, shared by reference into each request's candidate column, and
//! the host callback `callback_get_label` that answers a plugin's look-up.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use switchyard_plugin_sdk::abi::{switchyard_candidates, switchyard_str};
use switchyard_plugin_sdk::{str_from_abi, str_to_abi, Status};

use super::error_buffer::host_guard;

/// A worker's labels, sorted by key.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Labels(Box<[(Box<str>, Box<str>)]>);

impl Labels {
    pub fn new(labels: &BTreeMap<String, String>) -> Arc<Labels> {
        if labels.is_empty() {
            return Labels::none();
        }
        Arc::new(Labels(
            labels
                .iter()
                .map(|(k, v)| (k.as_str().into(), v.as_str().into()))
                .collect(),
        ))
    }

    /// The shared empty set (no allocation per label-less worker or row).
    pub fn none() -> Arc<Labels> {
        static NONE: OnceLock<Arc<Labels>> = OnceLock::new();
        NONE.get_or_init(Arc::default).clone()
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.0[i].1)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }
}

/// The `labels_host_data` of a candidate view over `column` (one entry per row).
pub(super) fn host_data(column: &[Arc<Labels>]) -> *const c_void {
    column.as_ptr().cast()
}

/// `callback_get_label`: the host side of a plugin's label look-up.
///
/// # Safety
/// Called by a plugin with the candidates it was handed, during that call.
pub(super) unsafe extern "C" fn get_label(
    candidates: *const switchyard_candidates,
    row: usize,
    key: switchyard_str,
    out: *mut switchyard_str,
) -> i32 {
    host_guard(None, Status::Error.code(), || {
        // SAFETY: the plugin passes the candidates of its current call.
        let Some(candidates) = (unsafe { candidates.as_ref() }) else {
            return Status::InvalidArgument.code();
        };
        if candidates.labels_host_data.is_null() || out.is_null() {
            return Status::InvalidArgument.code();
        }
        if row >= candidates.count {
            return Status::OutOfRange.code();
        }
        // SAFETY: `labels_host_data` is `host_data` of a column of `count` rows that
        // outlives the call; `row < count`.
        let labels = unsafe { &*candidates.labels_host_data.cast::<Arc<Labels>>().add(row) };
        // SAFETY: the plugin's key is `len` readable bytes (or NULL) for the call.
        let Some(value) = unsafe { str_from_abi(key) }.and_then(|key| labels.get(key)) else {
            return Status::NotFound.code();
        };
        // SAFETY: `out` is the plugin's writable slot; the value lives in the column.
        unsafe { *out = str_to_abi(value) };
        Status::Ok.code()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_find_exact_keys_only() {
        let map: BTreeMap<String, String> = [("zone", "a"), ("gpu", "h100"), ("z", "x")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let labels = Labels::new(&map);
        assert_eq!(labels.get("zone"), Some("a"));
        assert_eq!(labels.get("gpu"), Some("h100"));
        assert_eq!(labels.get("zon"), None);
        assert_eq!(Labels::none().get("zone"), None);
        assert!(Arc::ptr_eq(&Labels::new(&BTreeMap::new()), &Labels::none()));
    }
}
