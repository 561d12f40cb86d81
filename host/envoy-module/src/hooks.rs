//! The hooks Envoy calls (`envoy_dynamic_module_on_*`, abi.h's HTTP filter section). Each
//! catches a panic before it could cross into Envoy: a panicking hook logs, answers 500
//! when it can, and returns what lets Envoy go on.
//!
//! Envoy requires the HTTP filter's hooks when a filter config loads (a missing one
//! rejects it), so the hooks of features this module does not use are defined too, and do
//! nothing: per-route configs, HTTP callouts and streams, config-level scheduling,
//! watermarks, local replies.

use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use crate::abi::{self, Buffer, ConfigEnvoyPtr, FilterEnvoyPtr};
use crate::envoy::Stream;
use crate::filter_config::FilterConfig;
use crate::stats::EnvoyStats;
use crate::stream::{ConfigRef, Filter};

/// Runs a hook's body; a panic is logged and `fallback` answers instead.
fn guarded<T>(hook: &str, fallback: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(answer) => answer,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(hook, panic = %what, "switchyard (Envoy module): a hook panicked; the stream goes on without it");
            fallback
        }
    }
}

/// The module's filter behind Envoy's pointer.
///
/// # Safety
/// `filter` is a pointer `on_http_filter_new` returned and `on_http_filter_destroy` has
/// not freed; Envoy calls a stream's hooks on one thread, one at a time.
unsafe fn filter<'a>(filter: *const c_void) -> &'a mut Filter {
    // SAFETY: the caller's promise.
    unsafe { &mut *(filter as *mut Filter) }
}

/// Answers 500 from a hook that panicked before it answered anything.
fn server_error(stream: Stream) {
    let _ = catch_unwind(|| {
        stream.reply(
            500,
            br#"{"error":{"message":"the switchyard module failed on this request","type":"server_error"}}"#,
            None,
        );
    });
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    guarded("program_init", std::ptr::null(), || {
        crate::init_process();
        abi::ABI_VERSION.as_ptr().cast()
    })
}

/// # Safety
/// Envoy's buffers are valid for the call.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    config_envoy: ConfigEnvoyPtr,
    _name: Buffer,
    config: Buffer,
) -> *const c_void {
    // SAFETY: Envoy's config bytes are valid during this call.
    let text = unsafe { config.bytes() };
    guarded("http_filter_config_new", std::ptr::null(), || {
        match FilterConfig::load(text) {
            Ok(mut config) => {
                // Envoy's stats are made now or never; the decisions go on without them.
                config.stats = EnvoyStats::define(config_envoy)
                    .map_err(|error| tracing::warn!(%error, "switchyard (Envoy module): no Envoy stats for this filter config (switchyard's /metrics has them)"))
                    .ok();
                Arc::into_raw(Arc::new(config)).cast()
            }
            Err(error) => {
                // Envoy says only that the module refused; the reason goes to its stderr.
                eprintln!("error: {error}");
                tracing::error!(%error, "switchyard (Envoy module): filter config refused");
                std::ptr::null()
            }
        }
    })
}

/// # Safety
/// `config` came from `on_http_filter_config_new`; Envoy destroys it once, after its
/// last stream.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: *const c_void) {
    guarded("http_filter_config_destroy", (), || {
        // SAFETY: the pointer Arc::into_raw made; released once.
        drop(unsafe { Arc::from_raw(config.cast::<FilterConfig>()) });
    });
}

/// # Safety
/// `config` came from `on_http_filter_config_new` and is not destroyed yet.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: *const c_void,
    _filter_envoy: FilterEnvoyPtr,
) -> *const c_void {
    guarded("http_filter_new", std::ptr::null(), || {
        let Some(config) = std::ptr::NonNull::new(config.cast_mut().cast::<FilterConfig>()) else {
            return std::ptr::null();
        };
        // SAFETY: the pointer config_new made (Arc::into_raw), and this filter is one of
        // that config's: Envoy destroys the config after it.
        let config = unsafe { ConfigRef::new(config) };
        Box::into_raw(Box::new(Filter::new(config)))
            .cast_const()
            .cast()
    })
}

/// # Safety
/// Envoy's filter and the module's, of a live stream.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    envoy: FilterEnvoyPtr,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    let stream = Stream(envoy);
    let answer = guarded("http_filter_request_headers", None, || {
        // SAFETY: the caller's promise.
        Some(unsafe { filter(module) }.request_headers(stream, end_of_stream))
    });
    answer.unwrap_or_else(|| {
        server_error(stream);
        abi::HEADERS_STOP_ITERATION
    })
}

/// # Safety
/// Envoy's filter and the module's, of a live stream.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    envoy: FilterEnvoyPtr,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    let stream = Stream(envoy);
    let answer = guarded("http_filter_request_body", None, || {
        // SAFETY: the caller's promise.
        Some(unsafe { filter(module) }.request_body(stream, end_of_stream))
    });
    answer.unwrap_or_else(|| {
        server_error(stream);
        abi::BODY_STOP_NO_BUFFER
    })
}

/// # Safety
/// Envoy's filter and the module's, of a live stream.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    envoy: FilterEnvoyPtr,
    module: *const c_void,
    _event_id: u64,
) {
    let stream = Stream(envoy);
    let done = guarded("http_filter_scheduled", false, || {
        // SAFETY: the caller's promise.
        unsafe { filter(module) }.scheduled(stream);
        true
    });
    if !done {
        server_error(stream);
    }
}

/// # Safety
/// Envoy's filter and the module's, of a live stream.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    envoy: FilterEnvoyPtr,
    module: *const c_void,
    _end_of_stream: bool,
) -> u32 {
    guarded(
        "http_filter_response_headers",
        abi::HEADERS_CONTINUE,
        || {
            // SAFETY: the caller's promise.
            unsafe { filter(module) }.response_headers(Stream(envoy))
        },
    )
}

/// # Safety
/// Envoy's filter and the module's, of a live stream.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    _envoy: FilterEnvoyPtr,
    module: *const c_void,
) {
    guarded("http_filter_stream_complete", (), || {
        // SAFETY: the caller's promise.
        unsafe { filter(module) }.complete();
    });
}

/// # Safety
/// `module` came from `on_http_filter_new`; Envoy destroys it once.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_destroy(module: *const c_void) {
    guarded("http_filter_destroy", (), || {
        // SAFETY: the Box made in on_http_filter_new, released once.
        drop(unsafe { Box::from_raw(module as *mut Filter) });
    });
}

/// # Safety
/// Envoy's filter and the module's, of a live stream.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    envoy: FilterEnvoyPtr,
    module: *const c_void,
) -> u32 {
    let stream = Stream(envoy);
    let answer = guarded("http_filter_request_trailers", None, || {
        // SAFETY: the caller's promise.
        Some(unsafe { filter(module) }.request_trailers(stream))
    });
    answer.unwrap_or_else(|| {
        server_error(stream);
        abi::TRAILERS_STOP_ITERATION
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    _envoy: FilterEnvoyPtr,
    _module: *const c_void,
    _end_of_stream: bool,
) -> u32 {
    abi::BODY_CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    _envoy: FilterEnvoyPtr,
    _module: *const c_void,
) -> u32 {
    abi::TRAILERS_CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_new(
    _name: Buffer,
    _config: Buffer,
) -> *const c_void {
    std::ptr::null()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_destroy(
    _config: *const c_void,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(
    _config_envoy: ConfigEnvoyPtr,
    _config: *const c_void,
    _event_id: u64,
) {
}

/// # Safety
/// Envoy's filter and the module's, of a live stream; `details` valid for the call.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_local_reply(
    envoy: FilterEnvoyPtr,
    module: *const c_void,
    _response_code: u32,
    details: Buffer,
    _reset_imminent: bool,
) -> u32 {
    guarded("http_filter_local_reply", (), || {
        // SAFETY: the caller's promise.
        unsafe { filter(module) }.local_reply(Stream(envoy), unsafe { details.bytes() });
    });
    abi::LOCAL_REPLY_CONTINUE
}

/// The hooks of HTTP callouts and streams the module never starts, and of watermarks it
/// does not act on: Envoy resolves them when a filter config loads and, since the module
/// starts no callout or stream, calls none of the callout ones. Their parameters (abi.h)
/// go unread, so they are declared without any (the C calling convention leaves
/// arguments to the caller).
macro_rules! unused_hooks {
    ($($name:ident),* $(,)?) => {
        $(
            #[no_mangle]
            pub extern "C" fn $name() {}
        )*
    };
}

unused_hooks!(
    envoy_dynamic_module_on_http_filter_http_callout_done,
    envoy_dynamic_module_on_http_filter_http_stream_headers,
    envoy_dynamic_module_on_http_filter_http_stream_data,
    envoy_dynamic_module_on_http_filter_http_stream_trailers,
    envoy_dynamic_module_on_http_filter_http_stream_complete,
    envoy_dynamic_module_on_http_filter_http_stream_reset,
    envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark,
    envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark,
    envoy_dynamic_module_on_http_filter_config_http_callout_done,
    envoy_dynamic_module_on_http_filter_config_http_stream_headers,
    envoy_dynamic_module_on_http_filter_config_http_stream_data,
    envoy_dynamic_module_on_http_filter_config_http_stream_trailers,
    envoy_dynamic_module_on_http_filter_config_http_stream_complete,
    envoy_dynamic_module_on_http_filter_config_http_stream_reset,
);
