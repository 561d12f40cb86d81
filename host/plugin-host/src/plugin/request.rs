//! A request as the router holds it, and its ABI view for one selection.

use std::marker::PhantomData;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use switchyard_plugin_sdk::abi::*;
use switchyard_plugin_sdk::{str_from_abi, str_to_abi, Status, WorkerInputs};

use super::error_buffer::host_guard;

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

    /// The ABI form, borrowing these attributes.
    pub(super) fn abi(&self) -> switchyard_request_attributes {
        switchyard_request_attributes {
            struct_size: std::mem::size_of::<switchyard_request_attributes>() as u32,
            reserved0: 0,
            request_id: str_to_abi(&self.request_id),
            model: str_to_abi(&self.model),
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

/// The request context every component sees.
#[derive(Clone, Debug)]
pub struct RequestContext {
    pub block_size: u32,
    pub request_blocks: u64,
    pub tracks_prefill_tokens: bool,
    pub expected_output_tokens: Option<u64>,
    pub priority_jump: f64,
    pub strict_priority: i32,
    pub router_temperature_override: Option<f64>,
    pub session: Option<SessionInfo>,
    /// ATTRIBUTES: what the request says about itself, when the policy declared the group.
    pub attributes: Option<Arc<RequestAttributes>>,
}

impl RequestContext {
    pub fn new(block_size: u32, request_blocks: u64) -> Self {
        RequestContext {
            block_size,
            request_blocks,
            tracks_prefill_tokens: true,
            expected_output_tokens: None,
            priority_jump: 0.0,
            strict_priority: 0,
            router_temperature_override: None,
            session: None,
            attributes: None,
        }
    }

    /// Runs `f` with the ABI view (borrowing this request; no allocation).
    pub fn with_abi<R>(&self, f: impl FnOnce(&AbiRequest<'_>) -> R) -> R {
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
        let attributes = self.attributes.as_deref().map(RequestAttributes::abi);
        let raw = switchyard_request {
            struct_size: std::mem::size_of::<switchyard_request>() as u32,
            block_size: self.block_size,
            request_blocks: self.request_blocks,
            expected_output_tokens: self.expected_output_tokens.unwrap_or(0),
            priority_jump: self.priority_jump,
            router_temperature_override: self.router_temperature_override.unwrap_or(0.0),
            strict_priority: self.strict_priority,
            tracks_prefill_tokens: u8::from(self.tracks_prefill_tokens),
            has_expected_output_tokens: u8::from(self.expected_output_tokens.is_some()),
            has_router_temperature_override: u8::from(self.router_temperature_override.is_some()),
            reserved0: 0,
            session: session
                .as_ref()
                .map_or(std::ptr::null(), std::ptr::from_ref),
            attributes: attributes
                .as_ref()
                .map_or(std::ptr::null(), std::ptr::from_ref),
        };
        f(&AbiRequest {
            raw,
            borrows: PhantomData,
        })
    }
}

/// The ABI form of a request, valid while the `RequestContext` it borrows is. Opaque
/// outside the boundary: the pipeline passes it from stage to stage.
pub struct AbiRequest<'a> {
    pub(super) raw: switchyard_request,
    borrows: PhantomData<&'a RequestContext>,
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

    /// The attributes this request carries (for the isolation channel).
    pub(super) fn attributes(&self) -> Option<&RequestAttributes> {
        // SAFETY: a non-NULL pointer borrows the live request's attributes (`with_abi`).
        unsafe { self.raw.attributes.as_ref() }
            .map(|raw| unsafe { RequestAttributes::from_abi(raw) })
    }

    /// A request whose pointers (the session) the caller keeps valid while it is used.
    pub(super) fn from_raw(raw: switchyard_request) -> Self {
        AbiRequest {
            raw,
            borrows: PhantomData,
        }
    }
}
