//! A request as the router holds it, and its ABI view for one selection.

use std::marker::PhantomData;

use serde::{Deserialize, Serialize};
use switchyard_plugin_sdk::abi::*;
use switchyard_plugin_sdk::str_to_abi;

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
    /// A request whose pointers (the session) the caller keeps valid while it is used.
    pub(super) fn from_raw(raw: switchyard_request) -> Self {
        AbiRequest {
            raw,
            borrows: PhantomData,
        }
    }
}
