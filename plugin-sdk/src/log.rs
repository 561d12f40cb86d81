//! Plugin logging (ABI 1.5): [`Logger`], the router's log as one factory or instance is
//! handed it, and the `tracing` bridge: inside any call the router makes into a Rust
//! plugin (creation, validation, builds, filter/score/pick/admit, notifications), a
//! `tracing::info!` (or any level) goes to the router's log through the logger of the
//! factory or instance being called. Events outside a call (a thread of the plugin's own)
//! have no logger and are dropped; use a [`Logger`] kept from creation there.

use core::cell::Cell;
use std::fmt::Write as _;
use std::sync::Once;

use crate::abi::*;
use crate::view::str_to_abi;

/// A log level, as the ABI numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
    Trace = 5,
}

/// The router's log for one factory or instance (ABI 1.5): lines name the plugin and its
/// type and are rate-limited per logger. Valid until that factory or instance is
/// destroyed, from any thread.
#[derive(Clone, Copy, Debug)]
pub struct Logger {
    raw: *const switchyard_logger,
}

// SAFETY: the host's logger may be called from any thread while it is valid (docs/ABI.md).
unsafe impl Send for Logger {}
// SAFETY: as for Send; the struct is never written after the host made it.
unsafe impl Sync for Logger {}

impl Logger {
    /// # Safety
    /// `raw` must be NULL or a host logger, valid as long as this handle is used.
    pub unsafe fn from_abi(raw: *const switchyard_logger) -> Option<Logger> {
        // SAFETY: per this function's contract.
        let usable = unsafe { raw.as_ref() }.is_some_and(|l| l.callback_log.is_some());
        usable.then_some(Logger { raw })
    }

    /// Whether the router's log keeps lines of `level` (skip formatting otherwise).
    pub fn enabled(&self, level: LogLevel) -> bool {
        // SAFETY: a logger handle is only made from a live host logger.
        (level as u32) <= unsafe { (*self.raw).max_level }
    }

    pub fn log(&self, level: LogLevel, message: &str) {
        // SAFETY: as in `enabled`.
        let raw = unsafe { &*self.raw };
        if let (true, Some(log)) = (self.enabled(level), raw.callback_log) {
            // SAFETY: the host's callback with its own logger and a message valid for the
            // call.
            unsafe { log(self.raw, level as u32, str_to_abi(message)) };
        }
    }

    pub fn error(&self, message: &str) {
        self.log(LogLevel::Error, message);
    }
    pub fn warn(&self, message: &str) {
        self.log(LogLevel::Warn, message);
    }
    pub fn info(&self, message: &str) {
        self.log(LogLevel::Info, message);
    }
    pub fn debug(&self, message: &str) {
        self.log(LogLevel::Debug, message);
    }
    pub fn trace(&self, message: &str) {
        self.log(LogLevel::Trace, message);
    }
}

thread_local! {
    static CURRENT: Cell<Option<Logger>> = const { Cell::new(None) };
}

/// The logger of the factory or instance the router is calling on this thread, if any.
pub fn current() -> Option<Logger> {
    CURRENT.with(Cell::get)
}

/// While alive, `tracing` events on this thread go to a logger (the previous one after).
pub(crate) struct Entered(Option<Logger>);

impl Entered {
    pub(crate) fn new(logger: Option<Logger>) -> Entered {
        if logger.is_some() {
            install_bridge();
        }
        Entered(CURRENT.with(|current| current.replace(logger)))
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        CURRENT.with(|current| current.set(self.0));
    }
}

/// Makes the bridge this library's global `tracing` dispatcher, once; a plugin that set
/// its own keeps it.
fn install_bridge() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = tracing_core::dispatcher::set_global_default(tracing_core::Dispatch::new(Bridge));
    });
}

/// The `tracing` subscriber that hands events to the current call's logger.
struct Bridge;

fn level_of(level: &tracing_core::Level) -> LogLevel {
    match *level {
        tracing_core::Level::ERROR => LogLevel::Error,
        tracing_core::Level::WARN => LogLevel::Warn,
        tracing_core::Level::INFO => LogLevel::Info,
        tracing_core::Level::DEBUG => LogLevel::Debug,
        _ => LogLevel::Trace,
    }
}

/// An event's message, then its other fields as ` key=value`.
#[derive(Default)]
struct Line {
    message: String,
    fields: String,
}

impl tracing_core::field::Visit for Line {
    fn record_str(&mut self, field: &tracing_core::Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &tracing_core::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }
}

impl tracing_core::Subscriber for Bridge {
    fn register_callsite(
        &self,
        _: &'static tracing_core::Metadata<'static>,
    ) -> tracing_core::Interest {
        // Which logger (and so which level) applies changes from call to call.
        tracing_core::Interest::sometimes()
    }

    fn enabled(&self, metadata: &tracing_core::Metadata<'_>) -> bool {
        metadata.is_event()
            && current().is_some_and(|logger| logger.enabled(level_of(metadata.level())))
    }

    fn new_span(&self, _: &tracing_core::span::Attributes<'_>) -> tracing_core::span::Id {
        tracing_core::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing_core::span::Id, _: &tracing_core::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing_core::span::Id, _: &tracing_core::span::Id) {}

    fn event(&self, event: &tracing_core::Event<'_>) {
        let Some(logger) = current() else {
            return;
        };
        let mut line = Line::default();
        event.record(&mut line);
        line.message.push_str(&line.fields);
        logger.log(level_of(event.metadata().level()), &line.message);
    }

    fn enter(&self, _: &tracing_core::span::Id) {}

    fn exit(&self, _: &tracing_core::span::Id) {}
}
