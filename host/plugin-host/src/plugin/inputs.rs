//! What a component call reads, and its ABI form: the request as the router holds it
//! (`RouteRequest`, the one form from the services to the boundary) with its ABI view for
//! one selection, and the candidate columns of one call, borrowed from the pipeline's
//! buffers. Built-in components read both through the SDK's views made from the very
//! same ABI structs, so a plugin and a built-in see identical data.

use std::borrow::Cow;
use std::marker::PhantomData;
use std::ptr;
use std::sync::Arc;

use rustc_hash::FxHashSet;

use serde::{Deserialize, Serialize};
use switchyard_plugin_sdk::abi::*;
use switchyard_plugin_sdk::{
    str_from_abi, str_to_abi, AffinityTarget, Status, WorkerCandidates, WorkerId, WorkerInputs,
    WorkerSelectionContext, WorkerType,
};

use super::engine::{self, EngineReport};
use super::error_buffer::host_guard;
use super::labels::{self, Labels};

/// Session metadata of a request (the reference's session context).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SessionInfo {
    pub session_id: String,
    #[serde(default)]
    pub parent_session_id: Option<String>,
    #[serde(default)]
    pub session_final: Option<bool>,
    /// KV lifecycle hint: evict the session's state.
    #[serde(default)]
    pub evict_session: Option<bool>,
    /// `user_message`, `tool_result` or `other`.
    #[serde(default)]
    pub input_trigger: Option<InputTriggerName>,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum InputTriggerName {
    UserMessage,
    ToolResult,
    Other,
}

/// What a request says about itself (the ATTRIBUTES group, ABI 1.2). Made once per
/// request, shared by reference; nothing here is computed for a policy that does not
/// declare the group.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RequestAttributes {
    /// The client's or gateway's `x-request-id`, or the router's own.
    #[serde(default)]
    pub request_id: String,
    /// The model the request names (an adapter's base model).
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub lora_adapter: Option<String>,
    #[serde(default)]
    pub tenant: Option<String>,
    /// The operator-listed headers the request carries: lower-case name, value. In
    /// JSON an object, `{"x-zone": "a"}`.
    #[serde(default, with = "header_map")]
    pub headers: Vec<(String, String)>,
}

/// Headers as a JSON object, names lower-cased on the way in.
mod header_map {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(headers: &[(String, String)], s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(headers.iter().map(|(k, v)| (k, v)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(String, String)>, D::Error> {
        let map = std::collections::BTreeMap::<String, String>::deserialize(d)?;
        Ok(map
            .into_iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v))
            .collect())
    }
}

impl RequestAttributes {
    /// The value of header `name` (ASCII case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// The ABI form, borrowing these attributes; an empty model or request id reads as
    /// the request's own, `model` and `request_id` (a direct caller of the router may
    /// give attributes without them; every serving path completes them).
    pub(super) fn abi(&self, model: &str, request_id: &str) -> switchyard_request_attributes {
        let or = |own: &str, request: &str| -> switchyard_str {
            str_to_abi(if own.is_empty() { request } else { own })
        };
        switchyard_request_attributes {
            struct_size: std::mem::size_of::<switchyard_request_attributes>() as u32,
            reserved0: 0,
            request_id: or(&self.request_id, request_id),
            model: or(&self.model, model),
            lora_adapter: optional(self.lora_adapter.as_deref()),
            tenant: optional(self.tenant.as_deref()),
            host_data: std::ptr::from_ref(self).cast(),
            callback_get_header: Some(get_header),
        }
    }

    /// # Safety
    /// `raw` is a host-made ABI form (`abi`) whose attributes are alive.
    pub(super) unsafe fn from_abi(raw: &switchyard_request_attributes) -> &RequestAttributes {
        // SAFETY: `host_data` of a host-made view points to the attributes it was made of.
        unsafe { &*raw.host_data.cast::<RequestAttributes>() }
    }
}

fn optional(s: Option<&str>) -> switchyard_str {
    s.map_or(
        switchyard_str {
            ptr: std::ptr::null(),
            len: 0,
        },
        str_to_abi,
    )
}

/// `callback_get_header`: the host side of a plugin's header look-up.
///
/// # Safety
/// Called by a plugin with the attributes of its current call.
unsafe extern "C" fn get_header(
    attributes: *const switchyard_request_attributes,
    name: switchyard_str,
    out: *mut switchyard_str,
) -> i32 {
    host_guard(None, Status::Error.code(), || {
        // SAFETY: the plugin passes the attributes of its current call.
        let Some(raw) = (unsafe { attributes.as_ref() }) else {
            return Status::InvalidArgument.code();
        };
        if raw.host_data.is_null() || out.is_null() {
            return Status::InvalidArgument.code();
        }
        // SAFETY: the host made `raw` from live attributes for this call.
        let attributes = unsafe { RequestAttributes::from_abi(raw) };
        // SAFETY: the plugin's name is `len` readable bytes (or NULL) for the call.
        let Some(value) = unsafe { str_from_abi(name) }.and_then(|name| attributes.header(name))
        else {
            return Status::NotFound.code();
        };
        // SAFETY: `out` is the plugin's writable slot; the value lives in the attributes.
        unsafe { *out = str_to_abi(value) };
        Status::Ok.code()
    })
}

/// A request to route: the one form a request takes from the services (the HTTP API's
/// body, the OpenAI frontend, the endpoint picker) to the plugin boundary, which alone
/// makes its ABI struct ([`RouteRequest::with_abi`]). The HTTP API's JSON form of it is
/// the service's own (`switchyard-serve`'s `SelectBody`).
#[derive(Clone, Debug)]
pub struct RouteRequest {
    pub model: String,
    pub worker_type: WorkerType,
    /// Instance to use instead of the default.
    pub instance: Option<String>,
    pub router_temperature: Option<f64>,
    /// The prompt as token ids (hashed into blocks by the router) ...
    pub token_ids: Option<Vec<u32>>,
    /// ... or as chained block hashes (shared: the frontend hands the prompt's own to
    /// every selection of a request without copying them).
    pub block_hashes: Option<Arc<[u64]>>,
    /// Required for select-and-reserve: the id later passed to prefill-complete and free.
    pub request_id: Option<String>,
    pub expected_output_tokens: Option<u64>,
    pub priority_jump: f64,
    pub strict_priority: i32,
    pub tracks_prefill_tokens: bool,
    pub session: Option<SessionInfo>,
    /// `/v1/reserve` and `/v1/select` with `admission:`: whether a request finding every
    /// worker busy waits its turn (`/v1/reserve`'s default) or is answered 503 at once
    /// (`/v1/select`'s).
    pub wait: Option<bool>,
    /// What the request says about itself (ATTRIBUTES): tenant, LoRA adapter, headers.
    /// An empty `model` or `request_id` in them reads as the request's own.
    pub attributes: Option<Arc<RequestAttributes>>,
    /// Only these workers are candidates (a gateway's subset hint, or the workers it can
    /// reach); an empty set leaves none.
    pub only: Option<Arc<FxHashSet<WorkerId>>>,
    /// The other side of a disaggregated pair when it was chosen first: the lifecycle
    /// notifications name it (`switchyard_outcome.paired_worker_id`).
    pub paired: Option<WorkerId>,
}

/// As the HTTP API makes it from `{"model": ""}`: prefill tokens tracked, as engines do.
impl Default for RouteRequest {
    fn default() -> Self {
        RouteRequest {
            model: String::new(),
            worker_type: WorkerType::default(),
            instance: None,
            router_temperature: None,
            token_ids: None,
            block_hashes: None,
            request_id: None,
            expected_output_tokens: None,
            priority_jump: 0.0,
            strict_priority: 0,
            tracks_prefill_tokens: true,
            session: None,
            wait: None,
            attributes: None,
            only: None,
            paired: None,
        }
    }
}

/// What the router measured and resolved of a request for its selection: the prompt's
/// block size and length in blocks, and (ABI 1.5) the worker its session is bound to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptBlocks {
    pub block_size: u32,
    pub request_blocks: u64,
    /// The session's binding (`router.session_affinity`), offered to policies.
    pub affinity: Option<AffinityTarget>,
}

impl PromptBlocks {
    pub const fn new(block_size: u32, request_blocks: u64) -> Self {
        PromptBlocks {
            block_size,
            request_blocks,
            affinity: None,
        }
    }

    /// The same, with the session's binding.
    #[must_use]
    pub const fn with_affinity(mut self, affinity: Option<AffinityTarget>) -> Self {
        self.affinity = affinity;
        self
    }
}

impl RouteRequest {
    /// Runs `f` with the ABI view of this request measured as `prompt` (borrowing the
    /// request; no allocation).
    pub fn with_abi<R>(&self, prompt: PromptBlocks, f: impl FnOnce(&mut AbiRequest<'_>) -> R) -> R {
        let session = self.session.as_ref().map(|s| switchyard_session {
            session_id: str_to_abi(&s.session_id),
            parent_session_id: s.parent_session_id.as_deref().map_or(
                switchyard_str {
                    ptr: std::ptr::null(),
                    len: 0,
                },
                str_to_abi,
            ),
            input_trigger: match s.input_trigger {
                None => SWITCHYARD_TRIGGER_NONE,
                Some(InputTriggerName::UserMessage) => SWITCHYARD_TRIGGER_USER_MESSAGE,
                Some(InputTriggerName::ToolResult) => SWITCHYARD_TRIGGER_TOOL_RESULT,
                Some(InputTriggerName::Other) => SWITCHYARD_TRIGGER_OTHER,
            },
            has_session_final: u8::from(s.session_final.is_some()),
            session_final: u8::from(s.session_final == Some(true)),
            has_kv_hints: u8::from(s.evict_session.is_some()),
            evict_session: u8::from(s.evict_session == Some(true)),
        });
        let attributes = self
            .attributes
            .as_deref()
            .map(|given| given.abi(&self.model, self.request_id.as_deref().unwrap_or_default()));
        let raw = switchyard_request {
            struct_size: std::mem::size_of::<switchyard_request>() as u32,
            block_size: prompt.block_size,
            request_blocks: prompt.request_blocks,
            expected_output_tokens: self.expected_output_tokens.unwrap_or(0),
            priority_jump: self.priority_jump,
            router_temperature_override: self.router_temperature.unwrap_or(0.0),
            strict_priority: self.strict_priority,
            tracks_prefill_tokens: u8::from(self.tracks_prefill_tokens),
            has_expected_output_tokens: u8::from(self.expected_output_tokens.is_some()),
            has_router_temperature_override: u8::from(self.router_temperature.is_some()),
            reserved0: 0,
            session: session
                .as_ref()
                .map_or(std::ptr::null(), std::ptr::from_ref),
            attributes: attributes
                .as_ref()
                .map_or(std::ptr::null(), std::ptr::from_ref),
            affinity_worker_id: prompt
                .affinity
                .map_or(SWITCHYARD_NO_WORKER, |a| a.worker.worker_id),
            affinity_dp_rank: prompt.affinity.map_or(0, |a| a.worker.dp_rank),
            affinity_mode: prompt
                .affinity
                .map_or(SWITCHYARD_AFFINITY_NONE, |a| a.mode.to_abi()),
        };
        f(&mut AbiRequest {
            raw,
            borrows: PhantomData,
        })
    }
}

/// The ABI form of a request, valid while the `RouteRequest` it borrows is. Opaque
/// outside the boundary: the pipeline passes it from stage to stage.
pub struct AbiRequest<'a> {
    pub(super) raw: switchyard_request,
    borrows: PhantomData<&'a RouteRequest>,
}

impl AbiRequest<'_> {
    /// The request as a component that declared `declared` sees it: the attributes only
    /// when it declared ATTRIBUTES.
    #[inline]
    pub(super) fn view(&self, declared: WorkerInputs) -> switchyard_request {
        let mut raw = self.raw;
        if !declared.contains(WorkerInputs::ATTRIBUTES) {
            raw.attributes = std::ptr::null();
        }
        raw
    }

    /// The attributes this request carries as a plugin reads them (for the isolation
    /// channel): copied only when the request's model or id filled an empty one.
    pub(super) fn attributes(&self) -> Option<Cow<'_, RequestAttributes>> {
        // SAFETY: a non-NULL pointer borrows the live request's attributes (`with_abi`).
        let raw = unsafe { self.raw.attributes.as_ref() }?;
        // SAFETY: as above; the view was made from these attributes.
        let given = unsafe { RequestAttributes::from_abi(raw) };
        // SAFETY: the view's strings borrow the live request or its attributes.
        let (model, request_id) =
            unsafe { (str_from_abi(raw.model), str_from_abi(raw.request_id)) };
        let (model, request_id) = (model.unwrap_or_default(), request_id.unwrap_or_default());
        if given.model == model && given.request_id == request_id {
            return Some(Cow::Borrowed(given));
        }
        let mut filled = given.clone();
        filled.model = model.to_owned();
        filled.request_id = request_id.to_owned();
        Some(Cow::Owned(filled))
    }

    /// Sets the priority later stages read (an admitter's placement, for the admitters
    /// after it).
    pub fn set_strict_priority(&mut self, priority: i32) {
        self.raw.strict_priority = priority;
    }

    /// A request whose pointers (the session) the caller keeps valid while it is used.
    pub(super) fn from_raw(raw: switchyard_request) -> Self {
        AbiRequest {
            raw,
            borrows: PhantomData,
        }
    }
}

/// Index-aligned candidate columns. A group's columns are handed to a component only when
/// the component declared the group, `inputs` holds it, and every column of it has one
/// value per candidate; otherwise they are NULL, so no plugin can read past a column.
#[derive(Clone, Copy, Default)]
pub struct Columns<'a> {
    /// The groups filled in these columns.
    pub inputs: WorkerInputs,
    /// Identifies these contents: the same version means the same values (0: unknown).
    /// An isolation channel copies columns once per version, not once per stage.
    pub version: u64,
    pub worker_id: &'a [u64],
    pub dp_rank: &'a [u32],
    pub device_overlap_blocks: &'a [u32],
    pub host_overlap_blocks: &'a [u32],
    pub disk_overlap_blocks: &'a [u32],
    pub shared_beyond_device_blocks: &'a [u32],
    pub active_prefill_tokens: &'a [u64],
    pub decode_cost_blocks: &'a [u64],
    pub active_requests: &'a [u32],
    pub preferred_taint_multiplier: &'a [f64],
    pub labels: &'a [Arc<Labels>],
    /// ENGINE: each row's engine report (shared cells the scraper writes).
    pub engine: &'a [Arc<EngineReport>],
    /// Picker calls only: the total cost per row.
    pub costs: Option<&'a [f64]>,
}

/// The input groups an ABI view carries.
struct Present {
    cache: bool,
    load: bool,
    routing: bool,
    labels: bool,
    engine: bool,
}

impl Columns<'_> {
    pub fn len(&self) -> usize {
        self.worker_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.worker_id.is_empty()
    }

    /// Which input groups the view carries: declared by the component, gathered by the
    /// router, and whole (a column per row).
    #[inline]
    fn present(&self, declared: WorkerInputs, count: usize) -> Present {
        let whole = |len: usize| len == count;
        let cache = declared.contains(WorkerInputs::CACHE)
            && self.inputs.contains(WorkerInputs::CACHE)
            && whole(self.device_overlap_blocks.len())
            && whole(self.host_overlap_blocks.len())
            && whole(self.disk_overlap_blocks.len())
            && whole(self.shared_beyond_device_blocks.len());
        let load = declared.contains(WorkerInputs::LOAD)
            && self.inputs.contains(WorkerInputs::LOAD)
            && whole(self.active_prefill_tokens.len())
            && whole(self.decode_cost_blocks.len())
            && whole(self.active_requests.len());
        let routing = declared.contains(WorkerInputs::ROUTING)
            && self.inputs.contains(WorkerInputs::ROUTING)
            && whole(self.preferred_taint_multiplier.len());
        let labels = declared.contains(WorkerInputs::LABELS)
            && self.inputs.contains(WorkerInputs::LABELS)
            && whole(self.labels.len());
        let engine = declared.contains(WorkerInputs::ENGINE)
            && self.inputs.contains(WorkerInputs::ENGINE)
            && whole(self.engine.len());
        Present {
            cache,
            load,
            routing,
            labels,
            engine,
        }
    }

    /// The ABI view for a component that declared `declared`.
    #[inline]
    pub(super) fn abi_view(&self, declared: WorkerInputs) -> switchyard_candidates {
        let count = self.worker_id.len().min(self.dp_rank.len());
        let whole = |len: usize| len == count;
        let Present {
            cache,
            load,
            routing,
            labels,
            engine,
        } = self.present(declared, count);
        fn group<T>(present: bool, values: &[T]) -> *const T {
            if present {
                values.as_ptr()
            } else {
                ptr::null()
            }
        }
        let present = [
            (cache, WorkerInputs::CACHE),
            (load, WorkerInputs::LOAD),
            (routing, WorkerInputs::ROUTING),
            (labels, WorkerInputs::LABELS),
            (engine, WorkerInputs::ENGINE),
            (
                declared.contains(WorkerInputs::ATTRIBUTES),
                WorkerInputs::ATTRIBUTES,
            ),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .fold(WorkerInputs::NONE, |acc, (_, group)| acc | group);
        switchyard_candidates {
            struct_size: std::mem::size_of::<switchyard_candidates>() as u32,
            inputs: present.bits(),
            count,
            worker_id: self.worker_id.as_ptr(),
            dp_rank: self.dp_rank.as_ptr(),
            device_overlap_blocks: group(cache, self.device_overlap_blocks),
            host_overlap_blocks: group(cache, self.host_overlap_blocks),
            disk_overlap_blocks: group(cache, self.disk_overlap_blocks),
            shared_beyond_device_blocks: group(cache, self.shared_beyond_device_blocks),
            active_prefill_tokens: group(load, self.active_prefill_tokens),
            decode_cost_blocks: group(load, self.decode_cost_blocks),
            active_requests: group(load, self.active_requests),
            preferred_taint_multiplier: group(routing, self.preferred_taint_multiplier),
            costs: match self.costs {
                Some(costs) if whole(costs.len()) => costs.as_ptr(),
                _ => ptr::null(),
            },
            labels_host_data: if labels {
                labels::host_data(self.labels)
            } else {
                ptr::null()
            },
            callback_get_label: if labels {
                Some(labels::get_label)
            } else {
                None
            },
            engine_host_data: if engine {
                engine::host_data(self.engine)
            } else {
                ptr::null()
            },
            callback_get_engine: if engine {
                Some(engine::get_engine)
            } else {
                None
            },
            callback_get_adapter: if engine {
                Some(engine::get_adapter)
            } else {
                None
            },
        }
    }
}

/// Runs `f` with the SDK's views of `request` and `columns`, as a built-in component
/// declaring `declared` sees them.
pub(crate) fn with_views<R>(
    request: &AbiRequest<'_>,
    columns: &Columns<'_>,
    declared: WorkerInputs,
    f: impl FnOnce(&WorkerSelectionContext<'_>, &WorkerCandidates<'_>) -> R,
) -> R {
    let raw = columns.abi_view(declared);
    let request = request.view(declared);
    // SAFETY: `request` borrows a live `RouteRequest` (see `AbiRequest`), and every
    // non-NULL array of `raw` holds `count` elements borrowed from `columns` for this call.
    let (context, view) = unsafe {
        (
            WorkerSelectionContext::from_abi(&request),
            WorkerCandidates::from_abi(&raw),
        )
    };
    f(&context, &view)
}

/// Runs `f` with the SDK's view of `request` alone (an admitter sees no candidates).
pub(crate) fn with_context<R>(
    request: &AbiRequest<'_>,
    declared: WorkerInputs,
    f: impl FnOnce(&WorkerSelectionContext<'_>) -> R,
) -> R {
    let raw = request.view(declared);
    // SAFETY: `raw` is the live request's ABI form (its session and attributes borrow
    // it), valid for this call.
    let context = unsafe { WorkerSelectionContext::from_abi(&raw) };
    f(&context)
}
