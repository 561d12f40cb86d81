//! Engine-reported load as components read it (the ENGINE input group, ABI 1.2): one
//! shared cell per worker that the metrics scraper writes and every request's candidate
//! column borrows by reference, and the host callbacks `callback_get_engine` and
//! `callback_get_adapter` that answer a plugin's look-ups.

use std::ffi::c_void;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use switchyard_plugin_sdk::abi::{
    switchyard_candidates, switchyard_engine_load, switchyard_str, SWITCHYARD_ADAPTER_RUNNING,
    SWITCHYARD_ADAPTER_WAITING, SWITCHYARD_ENGINE_FRESH, SWITCHYARD_ENGINE_STALE,
};
use switchyard_plugin_sdk::{str_from_abi, Status};

use super::error_buffer::host_guard;

/// What one scrape of an engine's metrics said. Immutable once made.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineSample {
    pub running_requests: f64,
    pub waiting_requests: f64,
    /// 0 to 1; NaN when the engine does not say.
    pub kv_cache_usage: f64,
    /// Adapters with running requests; `None` when the engine does not say.
    pub running_adapters: Option<Box<[Box<str>]>>,
    /// Adapters with waiting requests only.
    pub waiting_adapters: Option<Box<[Box<str>]>>,
    /// The engine's whole KV cache in tokens (vLLM's `vllm:cache_config_info`
    /// `num_gpu_blocks` x `block_size`), when it says: what sizes the worker's KV index
    /// bound. For the router, not handed to policies.
    pub kv_capacity_tokens: Option<u64>,
}

impl EngineSample {
    fn adapter(&self, name: &str) -> Option<u32> {
        let has = |list: &Option<Box<[Box<str>]>>| {
            list.as_ref()
                .is_some_and(|list| list.iter().any(|a| &**a == name))
        };
        if has(&self.running_adapters) {
            Some(SWITCHYARD_ADAPTER_RUNNING)
        } else if has(&self.waiting_adapters) {
            Some(SWITCHYARD_ADAPTER_WAITING)
        } else {
            None
        }
    }
}

#[derive(Clone, Debug)]
struct Latest {
    sample: Arc<EngineSample>,
    taken: Instant,
    fresh: bool,
}

/// A worker's latest engine sample, shared between the scraper (writer) and the
/// candidate columns (readers). Empty until a scrape succeeds.
#[derive(Debug, Default)]
pub struct EngineReport {
    latest: RwLock<Option<Latest>>,
    /// Why the last scrape failed; `None` after a success. For operators
    /// (`GET /v1/workers`), never for policies.
    failure: RwLock<Option<Box<str>>>,
}

/// A sample as a reader sees it: the values, their age, and whether the last scrape
/// succeeded.
#[derive(Clone, Debug)]
pub struct EngineReading {
    pub sample: Arc<EngineSample>,
    pub age: Duration,
    pub fresh: bool,
}

impl EngineReport {
    pub fn new() -> Arc<EngineReport> {
        Arc::default()
    }

    /// The shared empty report, for workers the scraper never visits (no `url`).
    pub fn none() -> Arc<EngineReport> {
        static NONE: OnceLock<Arc<EngineReport>> = OnceLock::new();
        NONE.get_or_init(Arc::default).clone()
    }

    /// A scrape succeeded, at `taken`.
    pub fn record(&self, sample: EngineSample, taken: Instant) {
        let latest = Latest {
            sample: Arc::new(sample),
            taken,
            fresh: true,
        };
        *self.latest.write().unwrap_or_else(|e| e.into_inner()) = Some(latest);
        *self.failure.write().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// A scrape failed (`why`): the last values stay, marked stale, and keep ageing.
    pub fn mark_failed(&self, why: &str) {
        *self.failure.write().unwrap_or_else(|e| e.into_inner()) = Some(why.into());
        if let Some(latest) = self
            .latest
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            latest.fresh = false;
        }
    }

    /// Why the last scrape failed, if it did.
    pub fn failure(&self) -> Option<String> {
        self.failure
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_deref()
            .map(str::to_owned)
    }

    /// Runs `f` on the latest sample (its values, age and freshness) under the read lock,
    /// without taking a reference to it: what per-candidate reads use.
    pub fn peek<R>(&self, f: impl FnOnce(&EngineSample, Duration, bool) -> R) -> Option<R> {
        let latest = self.latest.read().unwrap_or_else(|e| e.into_inner());
        latest
            .as_ref()
            .map(|l| f(&l.sample, l.taken.elapsed(), l.fresh))
    }

    /// The latest sample, if any scrape ever succeeded.
    pub fn read(&self) -> Option<EngineReading> {
        let latest = self.latest.read().unwrap_or_else(|e| e.into_inner());
        latest.as_ref().map(|l| EngineReading {
            sample: l.sample.clone(),
            age: l.taken.elapsed(),
            fresh: l.fresh,
        })
    }

    /// A report holding `reading` (how an isolated child rebuilds what the parent read).
    pub fn from_reading(reading: EngineReading) -> Arc<EngineReport> {
        let taken = Instant::now()
            .checked_sub(reading.age)
            .unwrap_or_else(Instant::now);
        Arc::new(EngineReport {
            latest: RwLock::new(Some(Latest {
                sample: reading.sample,
                taken,
                fresh: reading.fresh,
            })),
            failure: RwLock::new(None),
        })
    }
}

/// The `engine_host_data` of a candidate view over `column` (one entry per row).
pub(super) fn host_data(column: &[Arc<EngineReport>]) -> *const c_void {
    column.as_ptr().cast()
}

/// The report of `row`, after the checks every ENGINE callback makes.
///
/// # Safety
/// `candidates` is NULL or the candidates of the plugin's current call.
unsafe fn report_of<'a>(
    candidates: *const switchyard_candidates,
    row: usize,
) -> Result<&'a EngineReport, i32> {
    // SAFETY: per this function's contract.
    let Some(candidates) = (unsafe { candidates.as_ref() }) else {
        return Err(Status::InvalidArgument.code());
    };
    if candidates.engine_host_data.is_null() {
        return Err(Status::InvalidArgument.code());
    }
    if row >= candidates.count {
        return Err(Status::OutOfRange.code());
    }
    // SAFETY: `engine_host_data` is `host_data` of a column of `count` rows that outlives
    // the call; `row < count`.
    Ok(unsafe {
        &**candidates
            .engine_host_data
            .cast::<Arc<EngineReport>>()
            .add(row)
    })
}

/// `callback_get_engine`.
///
/// # Safety
/// Called by a plugin with the candidates it was handed, during that call.
pub(super) unsafe extern "C" fn get_engine(
    candidates: *const switchyard_candidates,
    row: usize,
    out: *mut switchyard_engine_load,
) -> i32 {
    host_guard(None, Status::Error.code(), || {
        // SAFETY: per this function's contract.
        let report = match unsafe { report_of(candidates, row) } {
            Ok(report) => report,
            Err(code) => return code,
        };
        if out.is_null() {
            return Status::InvalidArgument.code();
        }
        let count =
            |list: &Option<Box<[Box<str>]>>| list.as_ref().map_or(f64::NAN, |l| l.len() as f64);
        let Some(full) = report.peek(|s, age, fresh| switchyard_engine_load {
            struct_size: std::mem::size_of::<switchyard_engine_load>() as u32,
            state: if fresh {
                SWITCHYARD_ENGINE_FRESH
            } else {
                SWITCHYARD_ENGINE_STALE
            },
            sample_age_seconds: age.as_secs_f64(),
            running_requests: s.running_requests,
            waiting_requests: s.waiting_requests,
            kv_cache_usage: s.kv_cache_usage,
            running_adapters: count(&s.running_adapters),
            waiting_adapters: count(&s.waiting_adapters),
        }) else {
            return Status::NotFound.code();
        };
        // SAFETY: `out` is the plugin's struct of `struct_size` bytes (at least the size
        // word, which it set); no byte past it nor past ours is written.
        unsafe {
            let wanted = (*out).struct_size as usize;
            let n = wanted.min(std::mem::size_of::<switchyard_engine_load>());
            if n < std::mem::size_of::<u32>() {
                return Status::InvalidArgument.code();
            }
            std::ptr::copy_nonoverlapping(
                std::ptr::from_ref(&full).cast::<u8>().add(4),
                out.cast::<u8>().add(4),
                n - 4,
            );
        }
        Status::Ok.code()
    })
}

/// `callback_get_adapter`.
///
/// # Safety
/// As `get_engine`.
pub(super) unsafe extern "C" fn get_adapter(
    candidates: *const switchyard_candidates,
    row: usize,
    adapter: switchyard_str,
    out_state: *mut u32,
) -> i32 {
    host_guard(None, Status::Error.code(), || {
        // SAFETY: per this function's contract.
        let report = match unsafe { report_of(candidates, row) } {
            Ok(report) => report,
            Err(code) => return code,
        };
        if out_state.is_null() {
            return Status::InvalidArgument.code();
        }
        // SAFETY: the plugin's name is `len` readable bytes (or NULL) for the call.
        let Some(name) = (unsafe { str_from_abi(adapter) }) else {
            return Status::NotFound.code();
        };
        match report.peek(|s, _, _| s.adapter(name)).flatten() {
            Some(state) => {
                // SAFETY: the plugin's writable slot.
                unsafe { *out_state = state };
                Status::Ok.code()
            }
            None => Status::NotFound.code(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_scrape_keeps_the_values_and_marks_them_stale() {
        let report = EngineReport::new();
        assert!(report.read().is_none());
        report.mark_failed("refused");
        assert!(report.read().is_none(), "nothing to mark before a success");
        assert_eq!(report.failure().as_deref(), Some("refused"));
        let sample = EngineSample {
            running_requests: 3.0,
            waiting_requests: 1.0,
            kv_cache_usage: 0.5,
            running_adapters: Some(vec!["sql".into()].into()),
            waiting_adapters: Some(vec!["chat".into()].into()),
            kv_capacity_tokens: None,
        };
        report.record(sample.clone(), Instant::now());
        assert!(report.read().unwrap().fresh);
        assert_eq!(report.failure(), None);
        report.mark_failed("timed out");
        let reading = report.read().unwrap();
        assert!(!reading.fresh);
        assert_eq!(*reading.sample, sample);
        assert_eq!(sample.adapter("sql"), Some(SWITCHYARD_ADAPTER_RUNNING));
        assert_eq!(sample.adapter("chat"), Some(SWITCHYARD_ADAPTER_WAITING));
        assert_eq!(sample.adapter("sq"), None);
    }
}
