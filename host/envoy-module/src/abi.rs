//! The part of Envoy's dynamic-module ABI this module uses, declared by hand from the C
//! header `source/extensions/dynamic_modules/abi.h` of envoyproxy/envoy (the HTTP filter's
//! types and callbacks; hooks are defined in `hooks.rs`). Written against Envoy 1.40.0:
//! the names were checked against the symbols the 1.40.0 binary exports (`nm -D`, build
//! 9e5580933739775e8bce696a57a2e1bc99368f23) and the signatures against the header's
//! text as stored by the search index (commit 0034b6fd of the repository's history; the
//! v1.40.0 tag itself could not be fetched on this machine: no network, and a mirror of
//! the repository is over the size limit). `tests/envoy_module.rs` runs every call here
//! through the real 1.40.0 binary.
//!
//! The two `..._upstream_hosts_attempted` callbacks are newer than that stored header:
//! their signatures were read from the 1.40.0 binary's code (`objdump -d`): the size takes
//! the filter alone; the list takes the filter and an array of buffers, which it fills
//! with each attempted host's address string and answers true.
//!
//! The metrics callbacks are the label-aware ones (a counter's or histogram's label names at
//! its definition, the values at each add; this module uses none): their register use in
//! the 1.40.0 binary (`objdump -d`) matches that header, and Envoy answers `Frozen` (3)
//! to a definition made after the filter config's `config_new` hook.
//!
//! Envoy binds these lazily (`RTLD_LAZY`): a callback that does not exist fails at its
//! first call, not at load. The hooks Envoy requires are resolved when a filter config
//! loads, and a missing one rejects the config.

use std::ffi::{c_char, c_void};

/// What `envoy_dynamic_module_on_program_init` answers: the header's
/// `ENVOY_DYNAMIC_MODULES_ABI_VERSION`, which Envoy 1.40.0 logs as "matched" (it compares
/// the string and only warns on a mismatch).
pub const ABI_VERSION: &[u8] = b"v0.2.0\0";

/// `envoy_dynamic_module_type_envoy_buffer` and `..._module_buffer` (the same layout):
/// bytes, not NUL-terminated.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Buffer {
    pub ptr: *const c_char,
    pub length: usize,
}

impl Buffer {
    pub const NULL: Buffer = Buffer {
        ptr: std::ptr::null(),
        length: 0,
    };

    pub fn of(bytes: &[u8]) -> Buffer {
        Buffer {
            ptr: bytes.as_ptr().cast(),
            length: bytes.len(),
        }
    }

    /// The bytes an Envoy buffer points at.
    ///
    /// # Safety
    /// Envoy's buffer must be valid for `'a` (Envoy keeps it until the hook returns,
    /// unless a setter changes it).
    pub unsafe fn bytes<'a>(self) -> &'a [u8] {
        if self.ptr.is_null() || self.length == 0 {
            return &[];
        }
        // SAFETY: the caller's promise; Envoy gives pointer and length together.
        unsafe { std::slice::from_raw_parts(self.ptr.cast(), self.length) }
    }
}

/// `envoy_dynamic_module_type_module_http_header`: a header the module owns.
#[repr(C)]
pub struct ModuleHeader {
    pub key_ptr: *const c_char,
    pub key_length: usize,
    pub value_ptr: *const c_char,
    pub value_length: usize,
}

impl ModuleHeader {
    pub fn of(key: &[u8], value: &[u8]) -> ModuleHeader {
        ModuleHeader {
            key_ptr: key.as_ptr().cast(),
            key_length: key.len(),
            value_ptr: value.as_ptr().cast(),
            value_length: value.len(),
        }
    }
}

/// `envoy_dynamic_module_type_http_filter_envoy_ptr`: Envoy's filter, valid until the
/// module's filter is destroyed.
pub type FilterEnvoyPtr = *mut c_void;
/// `envoy_dynamic_module_type_http_filter_config_envoy_ptr`.
pub type ConfigEnvoyPtr = *mut c_void;
/// `envoy_dynamic_module_type_http_filter_scheduler_module_ptr`: made by Envoy, deleted
/// by the module.
pub type SchedulerPtr = *mut c_void;

/// `envoy_dynamic_module_type_http_header_type`.
pub const REQUEST_HEADER: u32 = 0;
pub const RESPONSE_HEADER: u32 = 2;

/// `envoy_dynamic_module_type_metadata_source_Dynamic`: the stream's dynamic metadata.
pub const METADATA_DYNAMIC: u32 = 0;

/// `envoy_dynamic_module_type_http_body_type`.
pub const RECEIVED_REQUEST_BODY: u32 = 0;
pub const BUFFERED_REQUEST_BODY: u32 = 1;

/// `envoy_dynamic_module_type_on_http_filter_request_headers_status` (and the response
/// headers' status, the same values).
pub const HEADERS_CONTINUE: u32 = 0;
pub const HEADERS_STOP_ITERATION: u32 = 1;

/// `envoy_dynamic_module_type_on_http_filter_request_body_status` (and the response
/// body's).
pub const BODY_CONTINUE: u32 = 0;
pub const BODY_STOP_AND_BUFFER: u32 = 1;
pub const BODY_STOP_AND_WATERMARK: u32 = 2;
pub const BODY_STOP_NO_BUFFER: u32 = 3;

/// `..._trailers_status_Continue` and `_StopIteration`.
pub const TRAILERS_CONTINUE: u32 = 0;
pub const TRAILERS_STOP_ITERATION: u32 = 1;
/// `envoy_dynamic_module_type_on_http_filter_local_reply_status_Continue`.
pub const LOCAL_REPLY_CONTINUE: u32 = 0;

/// `envoy_dynamic_module_type_metrics_result`: `Success`; the others (`MetricNotFound`,
/// `InvalidLabels`, `Frozen`) are failures the module reports by their number.
pub const METRICS_SUCCESS: u32 = 0;

/// `..._define_counter` and `..._define_histogram` (the same parameters).
pub type DefineMetric =
    unsafe extern "C" fn(ConfigEnvoyPtr, Buffer, *const Buffer, usize, *mut usize) -> u32;

/// `..._increment_counter` and `..._record_histogram_value` (the same parameters).
pub type AddToMetric =
    unsafe extern "C" fn(FilterEnvoyPtr, usize, *const Buffer, usize, u64) -> u32;

extern "C" {
    pub fn envoy_dynamic_module_callback_http_get_header(
        filter: FilterEnvoyPtr,
        header_type: u32,
        key: Buffer,
        result: *mut Buffer,
        index: usize,
        optional_size: *mut usize,
    ) -> bool;

    pub fn envoy_dynamic_module_callback_http_set_header(
        filter: FilterEnvoyPtr,
        header_type: u32,
        key: Buffer,
        value: Buffer,
    ) -> bool;

    pub fn envoy_dynamic_module_callback_http_send_response(
        filter: FilterEnvoyPtr,
        status_code: u32,
        headers: *mut ModuleHeader,
        headers_size: usize,
        body: Buffer,
        details: Buffer,
    );

    pub fn envoy_dynamic_module_callback_http_get_body_size(
        filter: FilterEnvoyPtr,
        body_type: u32,
    ) -> usize;

    pub fn envoy_dynamic_module_callback_http_get_body_chunks_size(
        filter: FilterEnvoyPtr,
        body_type: u32,
    ) -> usize;

    pub fn envoy_dynamic_module_callback_http_get_body_chunks(
        filter: FilterEnvoyPtr,
        body_type: u32,
        result: *mut Buffer,
    ) -> bool;

    pub fn envoy_dynamic_module_callback_http_received_buffered_request_body(
        filter: FilterEnvoyPtr,
    ) -> bool;

    /// The request goes to `host` (`ip:port`) among the routed cluster's hosts; with
    /// `strict`, a host the cluster does not have is a 503 rather than Envoy's own pick.
    pub fn envoy_dynamic_module_callback_http_set_upstream_override_host(
        filter: FilterEnvoyPtr,
        host: Buffer,
        strict: bool,
    ) -> bool;

    /// How many upstream hosts Envoy's router tried for the stream (each retry adds one).
    pub fn envoy_dynamic_module_callback_http_get_upstream_hosts_attempted_size(
        filter: FilterEnvoyPtr,
    ) -> usize;

    /// The hosts tried, in order (the last is the one that answered), each `ip:port`:
    /// `result` has room for `..._hosts_attempted_size` buffers, Envoy's bytes valid
    /// during the hook.
    pub fn envoy_dynamic_module_callback_http_get_upstream_hosts_attempted(
        filter: FilterEnvoyPtr,
        result: *mut Buffer,
    ) -> bool;

    pub fn envoy_dynamic_module_callback_http_get_metadata_string(
        filter: FilterEnvoyPtr,
        source: u32,
        namespace: Buffer,
        key: Buffer,
        result: *mut Buffer,
    ) -> bool;

    pub fn envoy_dynamic_module_callback_http_get_metadata_list_size(
        filter: FilterEnvoyPtr,
        source: u32,
        namespace: Buffer,
        key: Buffer,
        result: *mut usize,
    ) -> bool;

    pub fn envoy_dynamic_module_callback_http_get_metadata_list_string(
        filter: FilterEnvoyPtr,
        source: u32,
        namespace: Buffer,
        key: Buffer,
        index: usize,
        result: *mut Buffer,
    ) -> bool;

    pub fn envoy_dynamic_module_callback_http_get_buffer_limit(filter: FilterEnvoyPtr) -> u64;

    pub fn envoy_dynamic_module_callback_http_set_buffer_limit(filter: FilterEnvoyPtr, limit: u64);

    pub fn envoy_dynamic_module_callback_http_filter_continue_decoding(filter: FilterEnvoyPtr);

    pub fn envoy_dynamic_module_callback_http_filter_scheduler_new(
        filter: FilterEnvoyPtr,
    ) -> SchedulerPtr;

    /// Callable from any thread: `on_http_filter_scheduled` runs with `event_id` on the
    /// filter's worker thread (not at all once the stream is gone).
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_commit(
        scheduler: SchedulerPtr,
        event_id: u64,
    );

    pub fn envoy_dynamic_module_callback_http_filter_scheduler_delete(scheduler: SchedulerPtr);

    /// A counter in Envoy's stats (`label_names` none here), defined while the filter
    /// config is made (later, Envoy answers `Frozen`, 3); its id in `id`.
    pub fn envoy_dynamic_module_callback_http_filter_config_define_counter(
        config: ConfigEnvoyPtr,
        name: Buffer,
        label_names: *const Buffer,
        label_names_length: usize,
        id: *mut usize,
    ) -> u32;

    /// A histogram in Envoy's stats, as `..._define_counter`.
    pub fn envoy_dynamic_module_callback_http_filter_config_define_histogram(
        config: ConfigEnvoyPtr,
        name: Buffer,
        label_names: *const Buffer,
        label_names_length: usize,
        id: *mut usize,
    ) -> u32;

    /// Adds `value` to counter `id` of the stream's filter config.
    pub fn envoy_dynamic_module_callback_http_filter_increment_counter(
        filter: FilterEnvoyPtr,
        id: usize,
        label_values: *const Buffer,
        label_values_length: usize,
        value: u64,
    ) -> u32;

    /// Records `value` in histogram `id` of the stream's filter config.
    pub fn envoy_dynamic_module_callback_http_filter_record_histogram_value(
        filter: FilterEnvoyPtr,
        id: usize,
        label_values: *const Buffer,
        label_values_length: usize,
        value: u64,
    ) -> u32;
}
