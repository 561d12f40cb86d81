//! What a selection is asked (`RouteRequest`, the plugin host's: the one form a request
//! takes from the services to the boundary), what it answers (`RouteDecision`,
//! `RouteError`), and the checks the router makes of a request before the policy.

use super::*;

pub use switchyard_plugin_host::plugin::RouteRequest;

/// Where a request goes.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RouteDecision {
    pub worker_id: u64,
    pub dp_rank: u32,
    pub instance: String,
    /// True when the instance failed and the built-in policy routed the request.
    pub fallback: bool,
    pub request_blocks: u64,
    pub device_overlap_blocks: u32,
    /// Set for select-and-reserve.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("{0}")]
    BadRequest(String),
    #[error("unknown model `{0}`: no worker serves it; add workers with POST /v1/workers")]
    UnknownModel(String),
    #[error("unknown instance `{name}`; configured instances: {known}")]
    UnknownInstance { name: String, known: String },
    #[error("no eligible worker: {0}")]
    NoWorker(String),
    /// Every candidate is at or past an `admission.busy` threshold: the request may wait.
    #[error("every worker is busy: {0}")]
    Saturated(String),
    #[error("instance `{instance}` failed: {error}")]
    PolicyFailed {
        instance: String,
        error: SelectError,
    },
    #[error(transparent)]
    Accounting(#[from] AccountingError),
    #[error(transparent)]
    Worker(#[from] WorkerError),
    /// The partition a new worker joins could not get its policies (boxed: rare, and
    /// large).
    #[error(transparent)]
    Partition(Box<crate::generation::PartitionError>),
}

impl From<crate::generation::PartitionError> for RouteError {
    fn from(error: crate::generation::PartitionError) -> Self {
        RouteError::Partition(Box::new(error))
    }
}

/// Checks what serde cannot; returns the request id (required to reserve).
pub(super) fn validate(
    request: &RouteRequest,
    reserve: bool,
) -> Result<Option<String>, RouteError> {
    let request_id = match (&request.request_id, reserve) {
        (Some(id), _) if id.is_empty() => {
            return Err(RouteError::BadRequest(
                "`request_id` must not be empty".into(),
            ))
        }
        (None, true) => {
            return Err(RouteError::BadRequest(
                "select-and-reserve needs a `request_id`".into(),
            ))
        }
        (id, _) => id.clone(),
    };
    if let Some(t) = request.router_temperature {
        if !t.is_finite() || t < 0.0 {
            return Err(RouteError::BadRequest(format!(
                "`router_temperature` must be a finite number >= 0, got {t}"
            )));
        }
    }
    Ok(request_id)
}

/// The prompt's size in blocks and its chained block hashes: given hashes are used in
/// place, token ids are hashed into `scratch`.
pub(super) fn prompt_blocks<'a>(
    request: &'a RouteRequest,
    block_size: u32,
    scratch: &'a mut Vec<u64>,
) -> Result<(u64, &'a [u64]), RouteError> {
    match (&request.token_ids, &request.block_hashes) {
        (Some(_), Some(_)) => Err(RouteError::BadRequest(
            "give `token_ids` or `block_hashes`, not both".into(),
        )),
        (None, None) => Err(RouteError::BadRequest(
            "give the prompt as `token_ids` or `block_hashes`".into(),
        )),
        (Some(tokens), None) => {
            hash_tokens(tokens, block_size, scratch);
            let blocks = (tokens.len() as u64).div_ceil(u64::from(block_size));
            Ok((blocks, scratch))
        }
        (None, Some(given)) => Ok((given.len() as u64, given)),
    }
}
