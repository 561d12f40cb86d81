//! ABI v1: the only contract between the switchyard router and a plugin.
//!
//! Everything here is plain `repr(C)` data with fixed-width fields, function pointers and
//! opaque handles. cbindgen turns this file into `include/switchyard/plugin.h`; the Rust,
//! C and C++ SDKs all go through it, and the host loads all three the same way.
//!
//! Conventions (see docs/ABI.md for the full text):
//! - `on_*` callbacks are implemented by the plugin and called by the host;
//!   `callback_*` functions are implemented by the host and called by the plugin.
//! - Every callback returns a `SWITCHYARD_STATUS_*` code. Out-parameters are written only
//!   when it returns `SWITCHYARD_STATUS_OK`. On failure the plugin writes a message into
//!   the host's `switchyard_error` buffer.
//! - Structs that the plugin hands to the host start with `struct_size`, which the plugin
//!   sets to `sizeof` the struct it was compiled with; the host copies that many bytes into
//!   a zeroed struct of its own, so a plugin built for ABI 1.k loads in a router of 1.m,
//!   m >= k. Fields are only ever appended within a major version.
//! - Structs that the host hands to the plugin also start with `struct_size`, set by the
//!   host; a plugin must not read fields past it.
#![allow(non_camel_case_types)]

mod v1_5;
pub use v1_5::*;

use core::ffi::{c_char, c_void};

#[cfg(feature = "layout")]
use abi_stable::StableAbi;

/// Major version of the plugin ABI. Changes only when existing fields change; the host
/// refuses a plugin of any other major.
pub const SWITCHYARD_ABI_MAJOR: u16 = 1;
/// Minor version of the plugin ABI. Grows when fields or callbacks are appended; the host
/// accepts plugins of any minor up to its own.
pub const SWITCHYARD_ABI_MINOR: u16 = 5;
/// Revision of the SDK that produced this header (the `switchyard-plugin-sdk` crate
/// version). Informational by default; `revision: exact` in the router config demands an
/// exact match.
/// (The header's `#define` is written by the generator from the same crate version.)
pub const SWITCHYARD_SDK_REVISION: &str = env!("CARGO_PKG_VERSION");
/// Fingerprint of this minor's layout (every struct's fields, sizes and alignments, every
/// callback's signature). A plugin compiled against a hand-edited or stale header reports
/// a different value and is refused.
pub const SWITCHYARD_LAYOUT_FINGERPRINT: u64 = 0x77b9_39a3_387d_2ef3;
/// Fingerprint of the ABI 1.4 layout, which the router keeps accepting from 1.4 plugins.
pub const SWITCHYARD_LAYOUT_FINGERPRINT_1_4: u64 = 0xcc03_2e84_ca1d_491f;
/// Fingerprint of the ABI 1.3 layout, which the router keeps accepting from 1.3 plugins.
pub const SWITCHYARD_LAYOUT_FINGERPRINT_1_3: u64 = 0xd4bc_34fa_9fb6_2e45;
/// Fingerprint of the ABI 1.2 layout, which the router keeps accepting from 1.2 plugins.
pub const SWITCHYARD_LAYOUT_FINGERPRINT_1_2: u64 = 0x0759_3cc8_96d2_9888;
/// Fingerprint of the ABI 1.1 layout, which the router keeps accepting from 1.1 plugins.
pub const SWITCHYARD_LAYOUT_FINGERPRINT_1_1: u64 = 0xdb3e_d4eb_ab9f_0480;
/// Fingerprint of the ABI 1.0 layout, which the router keeps accepting from 1.0 plugins.
pub const SWITCHYARD_LAYOUT_FINGERPRINT_1_0: u64 = 0x260e_a2ef_56f0_67f2;
/// Name of the one symbol a v1 plugin exports. Its type is `switchyard_entry_fn`.
pub const SWITCHYARD_ENTRY_SYMBOL: &str = "switchyard_plugin_entry_v1";

/// The call succeeded; out-parameters are written.
pub const SWITCHYARD_STATUS_OK: i32 = 0;
/// The call failed; the message is in the error buffer.
pub const SWITCHYARD_STATUS_ERROR: i32 = 1;
/// Parameters are missing, of the wrong type, out of range or unknown.
pub const SWITCHYARD_STATUS_INVALID_PARAMETERS: i32 = 2;
/// A panic or exception escaped the component in this call; the SDK caught it at the
/// boundary and poisoned the instance.
pub const SWITCHYARD_STATUS_PANIC: i32 = 3;
/// The instance panicked or threw in an earlier call and refuses all further calls.
pub const SWITCHYARD_STATUS_POISONED: i32 = 4;
/// Parameter accessor: no such key.
pub const SWITCHYARD_STATUS_NOT_FOUND: i32 = 5;
/// Parameter accessor: the key exists but holds another type.
pub const SWITCHYARD_STATUS_WRONG_TYPE: i32 = 6;
/// An index is out of range.
pub const SWITCHYARD_STATUS_OUT_OF_RANGE: i32 = 7;
/// Registrar: an argument is invalid (empty name, missing callback, bad size).
pub const SWITCHYARD_STATUS_INVALID_ARGUMENT: i32 = 8;
/// Registrar: the type name is already registered.
pub const SWITCHYARD_STATUS_DUPLICATE: i32 = 9;

/// Input group bit: prefix-cache overlap per tier.
pub const SWITCHYARD_INPUT_CACHE: u32 = 1;
/// Input group bit: active load on the worker.
pub const SWITCHYARD_INPUT_LOAD: u32 = 2;
/// Input group bit: routing constraints.
pub const SWITCHYARD_INPUT_ROUTING: u32 = 4;
/// Input group bit (ABI 1.1): each candidate's labels, read with `callback_get_label`.
pub const SWITCHYARD_INPUT_LABELS: u32 = 8;
/// Input group bit (ABI 1.2): the request's attributes (`request->attributes`): id,
/// model, LoRA adapter, tenant and the headers the operator lists.
pub const SWITCHYARD_INPUT_ATTRIBUTES: u32 = 16;
/// Input group bit (ABI 1.2): each candidate's engine-reported load and LoRA adapters, read
/// with `callback_get_engine` and `callback_get_adapter`.
pub const SWITCHYARD_INPUT_ENGINE: u32 = 32;
/// Every input group this ABI version defines (1.0 defined 7: CACHE, LOAD, ROUTING; 1.1
/// defined 15, adding LABELS).
pub const SWITCHYARD_INPUT_ALL: u32 = 63;

/// Engine sample (ABI 1.2): the last scrape of the engine's metrics succeeded.
pub const SWITCHYARD_ENGINE_FRESH: u32 = 1;
/// Engine sample (ABI 1.2): the last scrape failed; the values are those of the last
/// one that succeeded, `sample_age_seconds` old.
pub const SWITCHYARD_ENGINE_STALE: u32 = 2;

/// LoRA adapter state on an engine (ABI 1.2): requests for it are running.
pub const SWITCHYARD_ADAPTER_RUNNING: u32 = 1;
/// LoRA adapter state on an engine (ABI 1.2): requests for it wait, none runs.
pub const SWITCHYARD_ADAPTER_WAITING: u32 = 2;

/// Worker type of a partition: prefill workers of a disaggregated deployment.
pub const SWITCHYARD_WORKER_TYPE_PREFILL: u32 = 0;
/// Worker type of a partition: decode workers of a disaggregated deployment.
pub const SWITCHYARD_WORKER_TYPE_DECODE: u32 = 1;
/// Worker type of a partition: one pool of aggregated workers.
pub const SWITCHYARD_WORKER_TYPE_SELECT: u32 = 2;

/// Component kind: keeps or rejects each candidate (`on_filter`).
pub const SWITCHYARD_COMPONENT_FILTER: u32 = 0;
/// Component kind: one finite cost per candidate (`on_score`).
pub const SWITCHYARD_COMPONENT_SCORER: u32 = 1;
/// Component kind: picks one row (`on_pick`).
pub const SWITCHYARD_COMPONENT_PICKER: u32 = 2;
/// Component kind (ABI 1.3): decides, before any worker is selected, whether a request is
/// served, and with which priority, tenant and longest wait it queues (`on_admit`).
pub const SWITCHYARD_COMPONENT_ADMITTER: u32 = 3;

/// Admission verdict (ABI 1.3): the request goes on to worker selection (and waits in the
/// queue, as `switchyard_admission` places it, while every worker is busy).
pub const SWITCHYARD_ADMIT: u32 = 0;
/// Admission verdict (ABI 1.3): the request is answered at once with
/// `switchyard_admission.status` and `message`; no worker is selected.
pub const SWITCHYARD_REJECT: u32 = 1;

/// Session input trigger: not given.
pub const SWITCHYARD_TRIGGER_NONE: u32 = 0;
/// Session input trigger: a user message.
pub const SWITCHYARD_TRIGGER_USER_MESSAGE: u32 = 1;
/// Session input trigger: a tool result.
pub const SWITCHYARD_TRIGGER_TOOL_RESULT: u32 = 2;
/// Session input trigger: something else.
pub const SWITCHYARD_TRIGGER_OTHER: u32 = 3;

/// A borrowed UTF-8 string: `len` bytes at `ptr`, not NUL-terminated.
/// `ptr == NULL` means absent (as opposed to empty). Valid only as long as the struct or
/// call that handed it out says.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "layout", derive(StableAbi))]
pub struct switchyard_str {
    /// The first byte, or NULL when absent.
    pub ptr: *const c_char,
    /// Length in bytes.
    pub len: usize,
}

/// A host-owned buffer for an error message. The plugin writes at most `capacity - 1`
/// bytes of UTF-8 at `buffer` followed by a NUL (`switchyard_error_printf` does this).
/// Valid for the duration of the call it is passed to; never NULL.
#[repr(C)]
#[cfg_attr(feature = "layout", derive(StableAbi))]
pub struct switchyard_error {
    /// Host-owned bytes to write the message into.
    pub buffer: *mut c_char,
    /// Size of `buffer` in bytes, NUL included.
    pub capacity: usize,
}

/// A routing partition: one model and one worker type. Host-owned, valid for the call.
#[repr(C)]
#[cfg_attr(feature = "layout", derive(StableAbi))]
pub struct switchyard_partition {
    /// `sizeof(switchyard_partition)` as the host was compiled.
    pub struct_size: u32,
    /// `SWITCHYARD_WORKER_TYPE_*`.
    pub worker_type: u32,
    /// The model served by the partition.
    pub model: switchyard_str,
}

/// Session metadata of a request. Host-owned, valid for the call it is reached from.
#[repr(C)]
#[cfg_attr(feature = "layout", derive(StableAbi))]
pub struct switchyard_session {
    /// Stable reasoning or tool-session identifier.
    pub session_id: switchyard_str,
    /// Parent session for subagents; `ptr == NULL` when absent.
    pub parent_session_id: switchyard_str,
    /// `SWITCHYARD_TRIGGER_*`.
    pub input_trigger: u32,
    /// 1 if `session_final` is given.
    pub has_session_final: u8,
    /// Terminal marker for lifecycle-aware policies (0 or 1).
    pub session_final: u8,
    /// 1 if the request carries KV lifecycle hints.
    pub has_kv_hints: u8,
    /// KV hint: the request asks consumers to evict session state (0 or 1).
    pub evict_session: u8,
}

/// The request being routed. Host-owned, valid for the call it is passed to.
#[repr(C)]
#[derive(Clone, Copy)]
#[cfg_attr(feature = "layout", derive(StableAbi))]
pub struct switchyard_request {
    /// `sizeof(switchyard_request)` as the host was compiled.
    pub struct_size: u32,
    /// Tokens in one KV block.
    pub block_size: u32,
    /// Incoming prompt size in KV blocks.
    pub request_blocks: u64,
    /// Expected output length in tokens; meaningful when `has_expected_output_tokens`.
    pub expected_output_tokens: u64,
    /// Scheduler priority boost; queue policies treat negative values as zero.
    pub priority_jump: f64,
    /// Per-request router temperature; meaningful when `has_router_temperature_override`.
    pub router_temperature_override: f64,
    /// Strict integer priority; larger values first.
    pub strict_priority: i32,
    /// 1 if the request contributes to prefill-load tracking.
    pub tracks_prefill_tokens: u8,
    /// 1 if `expected_output_tokens` is given.
    pub has_expected_output_tokens: u8,
    /// 1 if `router_temperature_override` is given.
    pub has_router_temperature_override: u8,
    /// Zero; keeps the layout explicit.
    pub reserved0: u8,
    /// Session metadata; NULL when the request has none.
    pub session: *const switchyard_session,
    /// ATTRIBUTES (ABI 1.2): NULL unless the component declared the group, and absent
    /// (past `struct_size`) in an older router: check both, or use
    /// `switchyard_request_attrs`.
    pub attributes: *const switchyard_request_attributes,
    /// ABI 1.5: the worker the request's session is bound to (`router.session_affinity`),
    /// `SWITCHYARD_NO_WORKER` when none. Past `struct_size` in an older router: read it
    /// with `switchyard_request_affinity`. Advisory: when the router narrowed the
    /// candidates to it they hold that one worker; otherwise (a soft binding over its
    /// threshold, a busy or departed worker) it may be absent from the candidates.
    pub affinity_worker_id: u64,
    /// ABI 1.5: the bound worker's data-parallel rank (0 without a binding).
    pub affinity_dp_rank: u32,
    /// ABI 1.5: `SWITCHYARD_AFFINITY_*`; `SWITCHYARD_AFFINITY_NONE` without a binding.
    pub affinity_mode: u32,
}

/// What the request says about itself (ABI 1.2, the ATTRIBUTES group). Host-owned, valid
/// for the call. Absent strings have `ptr == NULL`. The request's priority is
/// `switchyard_request.strict_priority`, on every path.
#[repr(C)]
#[cfg_attr(feature = "layout", derive(StableAbi))]
pub struct switchyard_request_attributes {
    /// `sizeof(switchyard_request_attributes)` as the host was compiled.
    pub struct_size: u32,
    /// Zero; keeps the layout explicit.
    pub reserved0: u32,
    /// The request's id: the client's `x-request-id`, a gateway's, or one the router made
    /// up; stable for the request, a seed for randomized policies.
    pub request_id: switchyard_str,
    /// The model the request names (the partition's model; an adapter's base model).
    pub model: switchyard_str,
    /// The LoRA adapter the request asks for; absent for the base model.
    pub lora_adapter: switchyard_str,
    /// Who sends it: the client key's grant, a configured header or the OpenAI `user`
    /// field (`request_attributes.tenant`); absent when none says.
    pub tenant: switchyard_str,
    /// Host-private; the host reads it back in `callback_get_header`.
    pub host_data: *const c_void,
    /// Writes to `*out` the value of request header `name` (ASCII case-insensitive),
    /// borrowed for the call. Only the headers listed in the config's
    /// `request_attributes.headers` are kept; NOT_FOUND for any other or an absent one.
    pub callback_get_header: Option<
        unsafe extern "C" fn(
            attributes: *const switchyard_request_attributes,
            name: switchyard_str,
            out: *mut switchyard_str,
        ) -> i32,
    >,
}

/// One engine's own report of its load (ABI 1.2, the ENGINE group), scraped from its
/// metrics by the router. Written by `callback_get_engine` into the plugin's struct: the
/// plugin sets `struct_size` to its `sizeof`, the host writes no byte past it.
#[repr(C)]
#[cfg_attr(feature = "layout", derive(StableAbi))]
pub struct switchyard_engine_load {
    /// `sizeof(switchyard_engine_load)` as the plugin was compiled; set by the plugin.
    pub struct_size: u32,
    /// `SWITCHYARD_ENGINE_FRESH` or `SWITCHYARD_ENGINE_STALE`.
    pub state: u32,
    /// Seconds since the sample the values come from was taken.
    pub sample_age_seconds: f64,
    /// Requests the engine runs (vLLM `num_requests_running`, SGLang `num_running_reqs`).
    pub running_requests: f64,
    /// Requests waiting in the engine's queue (vLLM `num_requests_waiting`, SGLang
    /// `num_queue_reqs`).
    pub waiting_requests: f64,
    /// Fraction of the KV cache in use, 0 to 1; NaN when the engine does not say.
    pub kv_cache_usage: f64,
    /// LoRA adapters with running requests; NaN when the engine does not say.
    pub running_adapters: f64,
    /// LoRA adapters with waiting requests only; NaN when the engine does not say.
    pub waiting_adapters: f64,
}

/// The candidates of one call, as index-aligned arrays of `count` elements
/// (structure of arrays). Host-owned, valid for the call. Candidate order is unspecified.
///
/// Identity arrays are always present. The arrays of an input group are non-NULL exactly
/// when the component declared that group; an undeclared group is NULL even if another
/// component asked for it. `costs` is non-NULL only in `on_pick`.
#[repr(C)]
#[cfg_attr(feature = "layout", derive(StableAbi))]
pub struct switchyard_candidates {
    /// `sizeof(switchyard_candidates)` as the host was compiled.
    pub struct_size: u32,
    /// The `SWITCHYARD_INPUT_*` groups present in this view.
    pub inputs: u32,
    /// Rows in every non-NULL array.
    pub count: usize,
    /// Worker id per row; never NULL.
    pub worker_id: *const u64,
    /// Data-parallel rank per row; never NULL.
    pub dp_rank: *const u32,
    /// CACHE: device-resident prefix overlap in blocks.
    pub device_overlap_blocks: *const u32,
    /// CACHE: host-pinned prefix overlap in blocks.
    pub host_overlap_blocks: *const u32,
    /// CACHE: disk prefix overlap in blocks.
    pub disk_overlap_blocks: *const u32,
    /// CACHE: shared-cache hits beyond the device-resident prefix, in blocks.
    pub shared_beyond_device_blocks: *const u32,
    /// LOAD: tokens active in the worker's prefill stage.
    pub active_prefill_tokens: *const u64,
    /// LOAD: projected decode footprint including this request's additional blocks.
    pub decode_cost_blocks: *const u64,
    /// LOAD: requests active on the worker.
    pub active_requests: *const u32,
    /// ROUTING: cost multiplier from preferred routing constraints; NaN when none.
    pub preferred_taint_multiplier: *const f64,
    /// Picker only: the sum of all weighted scorer costs per row.
    pub costs: *const f64,
    /// LABELS (ABI 1.1): host-private; the host reads it back in `callback_get_label`.
    pub labels_host_data: *const c_void,
    /// LABELS (ABI 1.1): writes to `*out` the value of label `key` of the worker in `row`
    /// (borrowed for the call). NOT_FOUND when that worker has no such label (`out`
    /// untouched), OUT_OF_RANGE when `row >= count`. NULL when the component did not
    /// declare LABELS, and absent (past `struct_size`) in a 1.0 router: check both, or use
    /// `switchyard_candidate_label`.
    pub callback_get_label: Option<
        unsafe extern "C" fn(
            candidates: *const switchyard_candidates,
            row: usize,
            key: switchyard_str,
            out: *mut switchyard_str,
        ) -> i32,
    >,
    /// ENGINE (ABI 1.2): host-private; the host reads it back in the two callbacks below.
    pub engine_host_data: *const c_void,
    /// ENGINE (ABI 1.2): writes the engine-reported load of the worker in `row` to `*out`
    /// (at most `out->struct_size` bytes). NOT_FOUND when that engine has never been
    /// scraped (no `url`, scraping off, or no scrape succeeded yet), OUT_OF_RANGE when
    /// `row >= count`. NULL unless the component declared ENGINE; absent (past
    /// `struct_size`) in an older router.
    pub callback_get_engine: Option<
        unsafe extern "C" fn(
            candidates: *const switchyard_candidates,
            row: usize,
            out: *mut switchyard_engine_load,
        ) -> i32,
    >,
    /// ENGINE (ABI 1.2): writes to `*out_state` whether LoRA adapter `adapter` is
    /// `SWITCHYARD_ADAPTER_RUNNING` or `SWITCHYARD_ADAPTER_WAITING` on the worker in
    /// `row`, as of its last sample; NOT_FOUND when neither (or never scraped),
    /// OUT_OF_RANGE when `row >= count`. NULL and absent as `callback_get_engine`.
    pub callback_get_adapter: Option<
        unsafe extern "C" fn(
            candidates: *const switchyard_candidates,
            row: usize,
            adapter: switchyard_str,
            out_state: *mut u32,
        ) -> i32,
    >,
}

/// What became of a request a component helped route (ABI 1.1): handed to the lifecycle
/// notifications. Host-owned, valid for the call.
#[repr(C)]
#[cfg_attr(feature = "layout", derive(StableAbi))]
pub struct switchyard_outcome {
    /// `sizeof(switchyard_outcome)` as the host was compiled.
    pub struct_size: u32,
    /// Data-parallel rank of the picked worker.
    pub dp_rank: u32,
    /// The router's id for this routed request: the same in its `on_selected`,
    /// `on_prefill_complete` and `on_finished`, unique within the router's run.
    pub request_id: u64,
    /// The worker picked (or, after a gateway's retry, the one that served).
    pub worker_id: u64,
    /// Seconds from the selection to prefill completion (the first token); NaN until
    /// known.
    pub seconds_to_prefill_complete: f64,
    /// Seconds from the selection to the request's end; NaN until it ended.
    pub seconds_to_finish: f64,
    /// ABI 1.4: the other worker of a disaggregated pair (docs/disaggregation.md): the
    /// decode worker in the prefill side's notifications, the prefill worker in the
    /// decode side's; `SWITCHYARD_NO_WORKER` when the request is served whole, or while
    /// the other side is not chosen yet. `on_finished` always names it; `on_selected`
    /// does when the other side was chosen first. Past `struct_size` in an older router.
    pub paired_worker_id: u64,
    /// ABI 1.4: the paired worker's data-parallel rank (0 without a pair).
    pub paired_dp_rank: u32,
    /// Zero; keeps the layout explicit.
    pub reserved0: u32,
}

/// `switchyard_outcome.paired_worker_id` when there is no pair (ABI 1.4).
pub const SWITCHYARD_NO_WORKER: u64 = u64::MAX;

/// How loaded a partition is when a request arrives (ABI 1.3): what an admitter weighs.
/// Host-owned, valid for the call. Counts are this router's view (with `replicas:`, the
/// bookings of every replica).
#[repr(C)]
#[cfg_attr(feature = "layout", derive(StableAbi))]
pub struct switchyard_saturation {
    /// `sizeof(switchyard_saturation)` as the host was compiled.
    pub struct_size: u32,
    /// Zero; keeps the layout explicit.
    pub reserved0: u32,
    /// Healthy workers of the partition.
    pub workers: u64,
    /// Of those, the workers at or past an `admission.busy` threshold (0 without one).
    pub busy_workers: u64,
    /// Requests booked on the partition's workers.
    pub active_requests: u64,
    /// Prompt tokens booked in the prefill stage of the partition's workers.
    pub active_prefill_tokens: u64,
    /// Requests waiting in the partition's admission queue.
    pub queued: u64,
    /// Of those, the requests of this request's tenant (as the request says it).
    pub queued_tenant: u64,
    /// Requests the queue holds at most (`admission.queue.max_queued`); 0 when the
    /// config has no `admission:` section, and nothing ever waits.
    pub queue_capacity: u64,
}

/// An admitter's answer (ABI 1.3). Host-owned, valid for the call; zeroed by the host
/// but for `struct_size`, `message` and `verdict` (`SWITCHYARD_ADMIT`), so an admitter
/// that writes nothing admits the request as it is. The plugin writes no field past
/// `struct_size`.
#[repr(C)]
#[cfg_attr(feature = "layout", derive(StableAbi))]
pub struct switchyard_admission {
    /// `sizeof(switchyard_admission)` as the host was compiled.
    pub struct_size: u32,
    /// `SWITCHYARD_ADMIT` or `SWITCHYARD_REJECT`.
    pub verdict: u32,
    /// Admit: 1 if `priority` replaces the request's `strict_priority` (its place in the
    /// queue, and what later admitters and the policy see).
    pub has_priority: u8,
    /// Zero; keeps the layout explicit.
    pub reserved0: [u8; 3],
    /// Admit: the priority, when `has_priority` is 1. Larger is served first.
    pub priority: i32,
    /// Admit: the tenant the request queues as (its turn among tenants); plugin-owned,
    /// valid until the instance's next call (the host copies it when `on_admit` returns).
    /// `ptr == NULL` keeps the request's own.
    pub tenant: switchyard_str,
    /// Admit: the longest the request may wait in the queue, in milliseconds; 0 keeps
    /// `admission.queue.max_wait_ms`, which a value can only shorten.
    pub max_wait_ms: u64,
    /// Reject: the HTTP status, 400 to 599; 0 means 429.
    pub status: u32,
    /// Reject: seconds for the `Retry-After` header; 0 sends none.
    pub retry_after_seconds: u32,
    /// Reject: a host-owned buffer for the message the client reads (write it with
    /// `switchyard_error_printf`); empty: the router says which admitter refused.
    pub message: switchyard_error,
}

/// Parameters of a component or policy, as given in the config. Host-owned, valid for the
/// call it is passed to; strings it hands out are valid as long as the params are.
#[repr(C)]
#[cfg_attr(feature = "layout", derive(StableAbi))]
pub struct switchyard_params {
    /// `sizeof(switchyard_params)` as the host was compiled.
    pub struct_size: u32,
    /// The parameters object as JSON text (`{}` when the config gives none).
    pub json: switchyard_str,
    /// Host-private; pass the params pointer back to the callbacks.
    pub host_data: *const c_void,
    /// Reads a number. `key` is a top-level key, or a JSON Pointer (RFC 6901) into nested
    /// objects and arrays: `/limits/max`, `/weights/0`. NOT_FOUND or WRONG_TYPE leave `out`
    /// untouched.
    pub callback_get_number: Option<
        unsafe extern "C" fn(
            params: *const switchyard_params,
            key: switchyard_str,
            out: *mut f64,
        ) -> i32,
    >,
    /// Reads a boolean into `out` as 0 or 1 (`key` as for `callback_get_number`).
    pub callback_get_bool: Option<
        unsafe extern "C" fn(
            params: *const switchyard_params,
            key: switchyard_str,
            out: *mut u8,
        ) -> i32,
    >,
    /// Reads a string (`key` as for `callback_get_number`); `out` borrows from the params.
    pub callback_get_string: Option<
        unsafe extern "C" fn(
            params: *const switchyard_params,
            key: switchyard_str,
            out: *mut switchyard_str,
        ) -> i32,
    >,
    /// Number of top-level keys.
    pub callback_key_count: Option<unsafe extern "C" fn(params: *const switchyard_params) -> usize>,
    /// The key at `index` (0-based, config order); OUT_OF_RANGE past the end.
    pub callback_key_at: Option<
        unsafe extern "C" fn(
            params: *const switchyard_params,
            index: usize,
            out: *mut switchyard_str,
        ) -> i32,
    >,
    /// ABI 1.5: the router's built-in cost model as configured, read-only, valid as long
    /// as these params; NULL when the caller has none (and past `struct_size` in an older
    /// router): read it with `switchyard_params_router`.
    pub router: *const switchyard_router_settings,
    /// ABI 1.5: the router's log for what this call creates (`on_validate`'s factory,
    /// `on_create`'s instance): valid until that factory or instance is destroyed, usable
    /// from any thread. NULL when nothing is created (and past `struct_size` in an older
    /// router): read it with `switchyard_params_logger`.
    pub logger: *const switchyard_logger,
}

/// A component type: a filter, a scorer, a picker or (ABI 1.3) an admitter. Plugin-owned; the host copies
/// `struct_size` bytes during the call that receives it, and `type_name` with them.
/// `user_data` must stay valid as long as the library is loaded.
#[repr(C)]
#[derive(Clone, Copy)]
#[cfg_attr(feature = "layout", derive(StableAbi))]
pub struct switchyard_component_def {
    /// `sizeof(switchyard_component_def)` as the plugin was compiled.
    pub struct_size: u32,
    /// `SWITCHYARD_COMPONENT_*`.
    pub kind: u32,
    /// The `SWITCHYARD_INPUT_*` groups the component reads.
    pub inputs: u32,
    /// Zero; keeps the layout explicit.
    pub reserved0: u32,
    /// NUL-terminated, non-empty type name, e.g. `acme.min-device-overlap`.
    pub type_name: *const c_char,
    /// Passed back to `on_create`; plugin-owned, valid while the library is loaded.
    pub user_data: *mut c_void,
    /// Creates one instance for a partition; on OK writes `*out_instance` (plugin-owned,
    /// released by `on_destroy`; may be NULL for stateless components). Required when
    /// registered with the registrar; unused (may be NULL) for components a policy adds
    /// to its builder, which arrive already created.
    pub on_create: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            params: *const switchyard_params,
            partition: *const switchyard_partition,
            out_instance: *mut *mut c_void,
            error: *const switchyard_error,
        ) -> i32,
    >,
    /// Releases an instance; called once, after the last call on it. May be NULL.
    pub on_destroy: Option<unsafe extern "C" fn(instance: *mut c_void)>,
    /// Filters: `keep` has `candidates->count` bytes, all 1 on entry; set a byte to 0 to
    /// reject that row. Required for filters.
    pub on_filter: Option<
        unsafe extern "C" fn(
            instance: *mut c_void,
            request: *const switchyard_request,
            candidates: *const switchyard_candidates,
            keep: *mut u8,
            error: *const switchyard_error,
        ) -> i32,
    >,
    /// Scorers: `costs` has `candidates->count` doubles, NaN on entry; write one finite
    /// cost per row, lower is better. Required for scorers.
    pub on_score: Option<
        unsafe extern "C" fn(
            instance: *mut c_void,
            request: *const switchyard_request,
            candidates: *const switchyard_candidates,
            costs: *mut f64,
            error: *const switchyard_error,
        ) -> i32,
    >,
    /// Pickers: `candidates->costs` holds each row's total cost; on OK write the chosen
    /// row to `*out_row`. Required for pickers.
    pub on_pick: Option<
        unsafe extern "C" fn(
            instance: *mut c_void,
            request: *const switchyard_request,
            candidates: *const switchyard_candidates,
            out_row: *mut usize,
            error: *const switchyard_error,
        ) -> i32,
    >,
    /// Optional (ABI 1.1): the request this instance took part in was routed to
    /// `outcome->worker_id` and booked there (select-and-reserve, the frontend, the
    /// gateway picker; not a dry-run select). Called right after the pick, before the next
    /// selection of this instance, with the same one-thread-at-a-time discipline as
    /// `on_filter`/`on_score`/`on_pick`. A failure is counted and logged, and changes
    /// nothing. NULL: never called, and costs nothing.
    pub on_selected: Option<
        unsafe extern "C" fn(
            instance: *mut c_void,
            request: *const switchyard_request,
            outcome: *const switchyard_outcome,
            error: *const switchyard_error,
        ) -> i32,
    >,
    /// Optional (ABI 1.1): the request's prefill completed (its first token).
    /// `seconds_to_prefill_complete` is set. Called off the selection path, one thread
    /// at a time per instance, possibly after later selections.
    pub on_prefill_complete: Option<
        unsafe extern "C" fn(
            instance: *mut c_void,
            outcome: *const switchyard_outcome,
            error: *const switchyard_error,
        ) -> i32,
    >,
    /// Optional (ABI 1.1): the request ended (freed, cancelled, expired, or its worker
    /// removed); exactly once per `on_selected`. `seconds_to_finish` is set. Called as
    /// `on_prefill_complete` is.
    pub on_finished: Option<
        unsafe extern "C" fn(
            instance: *mut c_void,
            outcome: *const switchyard_outcome,
            error: *const switchyard_error,
        ) -> i32,
    >,
    /// Admitters (ABI 1.3): decides whether `request` is served, writing `*decision`
    /// (already holding "admit, as it is"). Called once per request, before its worker
    /// is selected, one thread at a time per instance. The request's `attributes` are
    /// given when the admitter declared `SWITCHYARD_INPUT_ATTRIBUTES`, the only input
    /// group an admitter may declare. A failure answers the request as the admitter's
    /// `on_error` says (503 by default). Required for admitters.
    pub on_admit: Option<
        unsafe extern "C" fn(
            instance: *mut c_void,
            request: *const switchyard_request,
            saturation: *const switchyard_saturation,
            decision: *mut switchyard_admission,
            error: *const switchyard_error,
        ) -> i32,
    >,
}

/// Handed to `on_build`: the policy adds its components here. Host-owned, valid for the
/// call.
#[repr(C)]
#[cfg_attr(feature = "layout", derive(StableAbi))]
pub struct switchyard_policy_builder {
    /// `sizeof(switchyard_policy_builder)` as the host was compiled.
    pub struct_size: u32,
    /// Host-private; pass the builder pointer back to the callback.
    pub host_data: *mut c_void,
    /// Adds one created component instance (with its def) to the policy being built:
    /// filters and scorers in call order, exactly one picker. `weight` applies to
    /// scorers (use 1.0). The host owns `instance` from this call on, whatever the
    /// status, and releases it with `def->on_destroy`.
    pub callback_add_component: Option<
        unsafe extern "C" fn(
            builder: *const switchyard_policy_builder,
            def: *const switchyard_component_def,
            instance: *mut c_void,
            weight: f64,
            error: *const switchyard_error,
        ) -> i32,
    >,
    /// ABI 1.1: adds an instance of a registered component type (a built-in such as
    /// `builtin.lowest-cost`, or any plugin's) created by the router from `type_name` and
    /// `params_json` (a JSON object; an empty string means `{}`), at this point of the
    /// pipeline, with `weight` for scorers. INVALID_ARGUMENT for an unknown type,
    /// INVALID_PARAMETERS when the type refuses the parameters; the message says which.
    /// Absent (past `struct_size`) in a 1.0 router.
    pub callback_add_registered: Option<
        unsafe extern "C" fn(
            builder: *const switchyard_policy_builder,
            type_name: switchyard_str,
            params_json: switchyard_str,
            weight: f64,
            error: *const switchyard_error,
        ) -> i32,
    >,
}

/// A policy type: validates its parameters once and builds its own components for each
/// partition. Plugin-owned; copied by the host like `switchyard_component_def`.
#[repr(C)]
#[derive(Clone, Copy)]
#[cfg_attr(feature = "layout", derive(StableAbi))]
pub struct switchyard_policy_def {
    /// `sizeof(switchyard_policy_def)` as the plugin was compiled.
    pub struct_size: u32,
    /// Zero; keeps the layout explicit.
    pub reserved0: u32,
    /// NUL-terminated, non-empty type name, e.g. `least-busy`.
    pub type_name: *const c_char,
    /// Passed back to `on_validate`; plugin-owned, valid while the library is loaded.
    pub user_data: *mut c_void,
    /// Parses and validates the parameters once at startup. On OK writes
    /// `*out_factory` (plugin-owned, released by `on_destroy_factory`).
    pub on_validate: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            params: *const switchyard_params,
            out_factory: *mut *mut c_void,
            error: *const switchyard_error,
        ) -> i32,
    >,
    /// Releases a factory; called once, when the router shuts the instance down.
    pub on_destroy_factory: Option<unsafe extern "C" fn(factory: *mut c_void)>,
    /// Builds the components for one partition through `builder`. Called once per
    /// partition, possibly from different threads, never concurrently for one factory.
    pub on_build: Option<
        unsafe extern "C" fn(
            factory: *mut c_void,
            partition: *const switchyard_partition,
            builder: *const switchyard_policy_builder,
            error: *const switchyard_error,
        ) -> i32,
    >,
}

/// Handed to `on_register`. Host-owned, valid for the call.
#[repr(C)]
#[cfg_attr(feature = "layout", derive(StableAbi))]
pub struct switchyard_registrar {
    /// `sizeof(switchyard_registrar)` as the host was compiled.
    pub struct_size: u32,
    /// The host's ABI minor version.
    pub host_abi_minor: u32,
    /// Host-private; pass the registrar pointer back to the callbacks.
    pub host_data: *mut c_void,
    /// Registers a component type. DUPLICATE if the name is taken, INVALID_ARGUMENT if the
    /// def is malformed; the message is written to `error`.
    pub callback_register_component: Option<
        unsafe extern "C" fn(
            registrar: *const switchyard_registrar,
            def: *const switchyard_component_def,
            error: *const switchyard_error,
        ) -> i32,
    >,
    /// Registers a policy type, with the same rules.
    pub callback_register_policy: Option<
        unsafe extern "C" fn(
            registrar: *const switchyard_registrar,
            def: *const switchyard_policy_def,
            error: *const switchyard_error,
        ) -> i32,
    >,
}

/// What a plugin is and what it was built against. Returned by the entry symbol; static,
/// valid as long as the library is loaded. Strings are NUL-terminated.
#[repr(C)]
#[cfg_attr(feature = "layout", derive(StableAbi))]
pub struct switchyard_plugin_descriptor {
    /// `sizeof(switchyard_plugin_descriptor)` as the plugin was compiled.
    pub struct_size: u32,
    /// `SWITCHYARD_ABI_MAJOR` of the header the plugin was compiled with.
    pub abi_major: u16,
    /// `SWITCHYARD_ABI_MINOR` of the header the plugin was compiled with.
    pub abi_minor: u16,
    /// `SWITCHYARD_LAYOUT_FINGERPRINT` of the header the plugin was compiled with.
    pub layout_fingerprint: u64,
    /// `sizeof` the plugin-to-host structs, as the plugin was compiled.
    pub component_def_size: u32,
    pub policy_def_size: u32,
    /// `SWITCHYARD_SDK_REVISION` of the header the plugin was compiled with.
    pub sdk_revision: *const c_char,
    /// The plugin's name, e.g. `acme-least-busy`; non-empty.
    pub plugin_name: *const c_char,
    /// The plugin's own version, e.g. `1.2.0`; non-empty.
    pub plugin_version: *const c_char,
    /// Who ships it; non-empty.
    pub plugin_vendor: *const c_char,
    /// Registers the plugin's types; required.
    pub on_register: Option<
        unsafe extern "C" fn(
            registrar: *const switchyard_registrar,
            error: *const switchyard_error,
        ) -> i32,
    >,
}

/// Type of the entry symbol `switchyard_plugin_entry_v1`.
pub type switchyard_entry_fn = unsafe extern "C" fn() -> *const switchyard_plugin_descriptor;
