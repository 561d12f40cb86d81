//! Plugin logging (ABI 1.5): the host side of `switchyard_logger`. The router makes one
//! logger per factory or instance it has a plugin create, each rate-limited on its own
//! (`router.plugin_log_lines_per_second`); lines go to the router's log (`tracing`,
//! target `switchyard::plugin`) with the plugin's name and type. In an isolated child
//! they are queued instead, bounded, and the router logs them when it next hears from the
//! child: after each call (in the call's region) and before each control answer.

use std::collections::VecDeque;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Instant;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use switchyard_plugin_sdk::abi::*;
use switchyard_plugin_sdk::Status;

use super::error_buffer::host_guard;

/// Lines per second each logger may log when the config does not say.
pub const DEFAULT_LINES_PER_SECOND: u32 = 20;
/// A longer message is cut here.
const MAX_MESSAGE: usize = 4096;
/// Lines an isolated child holds for the router at most; more are counted and dropped.
const QUEUE_LINES: usize = 256;

static LINES_PER_SECOND: AtomicU32 = AtomicU32::new(DEFAULT_LINES_PER_SECOND);
/// Set in an isolated child: lines are queued for the router, not logged here.
static FORWARD: AtomicBool = AtomicBool::new(false);
/// The most detailed level an isolated child's loggers pass (the router's, at spawn).
static CHILD_MAX_LEVEL: AtomicU32 = AtomicU32::new(SWITCHYARD_LOG_TRACE);

static QUEUE: Mutex<Queue> = Mutex::new(Queue {
    lines: VecDeque::new(),
    overflowed: 0,
});

struct Queue {
    lines: VecDeque<LogLine>,
    overflowed: u64,
}

/// The rate every logger made from now on keeps to (`router.plugin_log_lines_per_second`;
/// 0: plugins' lines are dropped).
pub fn set_lines_per_second(lines: u32) {
    LINES_PER_SECOND.store(lines, Ordering::Relaxed);
}

pub fn lines_per_second() -> u32 {
    LINES_PER_SECOND.load(Ordering::Relaxed)
}

/// In an isolated child: queue lines for the router, passing those up to `max_level`.
pub fn forward_to_parent(max_level: u32) {
    CHILD_MAX_LEVEL.store(max_level, Ordering::Relaxed);
    FORWARD.store(true, Ordering::Relaxed);
}

/// The most detailed `SWITCHYARD_LOG_*` the router's log keeps now (0: none).
pub fn router_max_level() -> u32 {
    if FORWARD.load(Ordering::Relaxed) {
        return CHILD_MAX_LEVEL.load(Ordering::Relaxed);
    }
    use tracing::level_filters::LevelFilter;
    match LevelFilter::current() {
        LevelFilter::OFF => 0,
        LevelFilter::ERROR => SWITCHYARD_LOG_ERROR,
        LevelFilter::WARN => SWITCHYARD_LOG_WARN,
        LevelFilter::INFO => SWITCHYARD_LOG_INFO,
        LevelFilter::DEBUG => SWITCHYARD_LOG_DEBUG,
        _ => SWITCHYARD_LOG_TRACE,
    }
}

/// One plugin line, as it crosses from an isolated child.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LogLine {
    /// `plugin/type`.
    pub origin: String,
    pub level: u32,
    pub message: String,
}

impl LogLine {
    /// Logs the line into the router's log (or, in an isolated child, queues it).
    pub fn emit(self) {
        if FORWARD.load(Ordering::Relaxed) {
            let mut queue = QUEUE.lock();
            if queue.lines.len() < QUEUE_LINES {
                queue.lines.push_back(self);
            } else {
                queue.overflowed += 1;
            }
            return;
        }
        let (origin, message) = (self.origin.as_str(), self.message.as_str());
        match self.level {
            SWITCHYARD_LOG_ERROR => {
                tracing::error!(target: "switchyard::plugin", plugin = origin, "{message}")
            }
            SWITCHYARD_LOG_WARN => {
                tracing::warn!(target: "switchyard::plugin", plugin = origin, "{message}")
            }
            SWITCHYARD_LOG_INFO => {
                tracing::info!(target: "switchyard::plugin", plugin = origin, "{message}")
            }
            SWITCHYARD_LOG_DEBUG => {
                tracing::debug!(target: "switchyard::plugin", plugin = origin, "{message}")
            }
            _ => tracing::trace!(target: "switchyard::plugin", plugin = origin, "{message}"),
        }
    }
}

/// In an isolated child: the queued lines, oldest first, as many as `fits` accepts (it
/// is asked with each line in turn); a report of lines the queue had to drop comes first.
pub fn drain_queued(mut fits: impl FnMut(&LogLine) -> bool) -> Vec<LogLine> {
    let mut queue = QUEUE.lock();
    if queue.overflowed > 0 {
        let report = LogLine {
            origin: "switchyard".into(),
            level: SWITCHYARD_LOG_WARN,
            message: format!(
                "an isolated process dropped {} plugin log lines: more were waiting for the router than it holds ({QUEUE_LINES})",
                queue.overflowed
            ),
        };
        queue.overflowed = 0;
        queue.lines.push_front(report);
    }
    let mut out = Vec::new();
    while let Some(line) = queue.lines.front() {
        if !fits(line) {
            break;
        }
        out.extend(queue.lines.pop_front());
    }
    out
}

/// One factory's or instance's logger: the ABI struct the plugin holds, and its budget,
/// in one allocation that does not move.
pub struct PluginLogger {
    cell: Box<LoggerCell>,
}

struct LoggerCell {
    raw: switchyard_logger,
    state: LogState,
}

// SAFETY: the raw struct only points into its own cell, whose state is Sync; the plugin
// may call the logger from any thread (docs/ABI.md).
unsafe impl Send for PluginLogger {}
// SAFETY: as for Send; nothing in the raw struct changes after it is made.
unsafe impl Sync for PluginLogger {}

struct LogState {
    origin: String,
    budget: Mutex<Budget>,
}

/// A token bucket of `rate` lines a second, holding at most `rate`.
struct Budget {
    rate: u32,
    tokens: f64,
    at: Instant,
    dropped: u64,
}

impl PluginLogger {
    /// A logger whose lines name `origin` (`plugin/type`).
    pub fn new(origin: &str) -> Self {
        let rate = lines_per_second();
        let mut cell = Box::new(LoggerCell {
            raw: switchyard_logger {
                struct_size: std::mem::size_of::<switchyard_logger>() as u32,
                max_level: router_max_level(),
                host_data: ptr::null(),
                callback_log: Some(log),
            },
            state: LogState {
                origin: origin.to_owned(),
                budget: Mutex::new(Budget {
                    rate,
                    tokens: f64::from(rate),
                    at: Instant::now(),
                    dropped: 0,
                }),
            },
        });
        cell.raw.host_data = ptr::from_ref(&cell.state).cast();
        PluginLogger { cell }
    }

    /// The struct handed to the plugin; valid as long as this logger.
    pub fn abi(&self) -> *const switchyard_logger {
        ptr::from_ref(&self.cell.raw)
    }
}

impl Drop for PluginLogger {
    fn drop(&mut self) {
        let dropped = std::mem::take(&mut self.cell.state.budget.lock().dropped);
        if dropped > 0 {
            self.cell.state.report_dropped(dropped);
        }
    }
}

impl LogState {
    /// Whether a line may be logged now; a report of the lines dropped before it, if any,
    /// is logged first.
    fn admit(&self) -> bool {
        let mut budget = self.budget.lock();
        let now = Instant::now();
        let rate = f64::from(budget.rate);
        let refill = now.duration_since(budget.at).as_secs_f64() * rate;
        budget.tokens = (budget.tokens + refill).min(rate);
        budget.at = now;
        if budget.tokens < 1.0 {
            budget.dropped += 1;
            return false;
        }
        budget.tokens -= 1.0;
        let dropped = std::mem::take(&mut budget.dropped);
        drop(budget);
        if dropped > 0 {
            self.report_dropped(dropped);
        }
        true
    }

    fn report_dropped(&self, dropped: u64) {
        LogLine {
            origin: self.origin.clone(),
            level: SWITCHYARD_LOG_WARN,
            message: format!(
                "{dropped} log lines of this plugin were dropped: more than {} a second (router.plugin_log_lines_per_second)",
                lines_per_second()
            ),
        }
        .emit();
    }
}

/// `callback_log`: the host side of a plugin's log line.
///
/// # Safety
/// Called by a plugin with a logger the router handed it, while it is alive.
unsafe extern "C" fn log(
    logger: *const switchyard_logger,
    level: u32,
    message: switchyard_str,
) -> i32 {
    host_guard(None, Status::Error.code(), || {
        // SAFETY: the plugin passes a live logger of the router's.
        let Some(raw) = (unsafe { logger.as_ref() }) else {
            return Status::InvalidArgument.code();
        };
        if !(SWITCHYARD_LOG_ERROR..=SWITCHYARD_LOG_TRACE).contains(&level) {
            return Status::InvalidArgument.code();
        }
        if level > raw.max_level || raw.host_data.is_null() {
            return Status::Ok.code();
        }
        // SAFETY: `host_data` of a router-made logger points to its live state.
        let state = unsafe { &*raw.host_data.cast::<LogState>() };
        if !state.admit() {
            return Status::Ok.code();
        }
        // SAFETY: the plugin's message is `len` readable bytes (or NULL) for the call.
        let text = unsafe { message_bytes(message) };
        let text = String::from_utf8_lossy(&text[..text.len().min(MAX_MESSAGE)]);
        LogLine {
            origin: state.origin.clone(),
            level,
            message: text.into_owned(),
        }
        .emit();
        Status::Ok.code()
    })
}

/// The message's bytes; the str helper checks UTF-8, which a log line need not be.
///
/// # Safety
/// `message` is NULL or `len` readable bytes.
unsafe fn message_bytes<'a>(message: switchyard_str) -> &'a [u8] {
    if message.ptr.is_null() {
        return &[];
    }
    // SAFETY: per this function's contract.
    unsafe { std::slice::from_raw_parts(message.ptr.cast::<u8>(), message.len) }
}
