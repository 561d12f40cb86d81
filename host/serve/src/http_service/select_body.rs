//! The JSON body of `/v1/select` and `/v1/reserve`: the HTTP API's form of a request to
//! route, read here (its `token_ids` by `token_ids.rs`'s one-pass parser) and turned into
//! the router's `RouteRequest`. The plugin boundary never sees JSON.

use std::sync::Arc;

use serde::Deserialize;
use switchyard_plugin_host::plugin::{RequestAttributes, RouteRequest, SessionInfo};
use switchyard_plugin_sdk::WorkerType;

/// A `/v1/select` or `/v1/reserve` body; unknown fields are refused.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelectBody {
    pub model: String,
    #[serde(default)]
    pub worker_type: WorkerType,
    /// Instance to use instead of the default.
    #[serde(default)]
    pub instance: Option<String>,
    #[serde(default)]
    pub router_temperature: Option<f64>,
    /// The prompt as token ids (hashed into blocks by the router) ...
    #[serde(default, deserialize_with = "super::token_ids::deserialize")]
    pub token_ids: Option<Vec<u32>>,
    /// ... or as chained block hashes.
    #[serde(default)]
    pub block_hashes: Option<Arc<[u64]>>,
    /// Required for select-and-reserve: the id later passed to prefill-complete and free.
    #[serde(default)]
    pub request_id: Option<String>,
    #[serde(default)]
    pub expected_output_tokens: Option<u64>,
    #[serde(default)]
    pub priority_jump: f64,
    #[serde(default)]
    pub strict_priority: i32,
    #[serde(default = "yes")]
    pub tracks_prefill_tokens: bool,
    #[serde(default)]
    pub session: Option<SessionInfo>,
    /// With `admission:`: whether a request finding every worker busy waits its turn
    /// (`/v1/reserve`'s default) or is answered 503 at once (`/v1/select`'s).
    #[serde(default)]
    pub wait: Option<bool>,
    /// What the request says about itself (ATTRIBUTES): tenant, LoRA adapter, headers.
    #[serde(default)]
    pub attributes: Option<Arc<RequestAttributes>>,
}

fn yes() -> bool {
    true
}

impl From<SelectBody> for RouteRequest {
    fn from(body: SelectBody) -> RouteRequest {
        RouteRequest {
            model: body.model,
            worker_type: body.worker_type,
            instance: body.instance,
            router_temperature: body.router_temperature,
            token_ids: body.token_ids,
            block_hashes: body.block_hashes,
            request_id: body.request_id,
            expected_output_tokens: body.expected_output_tokens,
            priority_jump: body.priority_jump,
            strict_priority: body.strict_priority,
            tracks_prefill_tokens: body.tracks_prefill_tokens,
            session: body.session,
            wait: body.wait,
            attributes: body.attributes,
            only: None,
            paired: None,
        }
    }
}

/// A body as the router reads it: JSON text to `RouteRequest`.
pub fn route_request(json: &[u8]) -> serde_json::Result<RouteRequest> {
    serde_json::from_slice::<SelectBody>(json).map(RouteRequest::from)
}
