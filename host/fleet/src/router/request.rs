//! What a selection is asked (`RouteRequest`), what it answers (`RouteDecision`,
//! `RouteError`), and the checks and forms the request takes on its way to the policy.

use super::*;

fn yes() -> bool {
    true
}

/// A routing request.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouteRequest {
    pub model: String,
    #[serde(default)]
    pub worker_type: WorkerType,
    /// Instance to use instead of the default.
    #[serde(default)]
    pub instance: Option<String>,
    #[serde(default)]
    pub router_temperature: Option<f64>,
    /// The prompt as token ids (hashed into blocks by the router) ...
    #[serde(default)]
    pub token_ids: Option<Vec<u32>>,
    /// ... or as chained block hashes.
    #[serde(default)]
    pub block_hashes: Option<Vec<u64>>,
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
    /// `/v1/reserve` and `/v1/select` with `admission:`: whether a request finding every
    /// worker busy waits its turn (`/v1/reserve`'s default) or is answered 503 at once
    /// (`/v1/select`'s).
    #[serde(default)]
    pub wait: Option<bool>,
    /// What the request says about itself (ATTRIBUTES): tenant, LoRA adapter, headers.
    /// Its `model` and `request_id` default to the request's.
    #[serde(default)]
    pub attributes: Option<Arc<RequestAttributes>>,
    /// Only these workers are candidates (a gateway's subset hint, or the workers it can
    /// reach); an empty set leaves none.
    #[serde(skip)]
    pub only: Option<Arc<FxHashSet<WorkerId>>>,
    /// The other side of a disaggregated pair when it was chosen first: the lifecycle
    /// notifications name it (`switchyard_outcome.paired_worker_id`).
    #[serde(skip)]
    pub paired: Option<WorkerId>,
}

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

/// The request context components see.
pub(super) fn request_context(
    request: &RouteRequest,
    block_size: u32,
    request_blocks: u64,
) -> RequestContext {
    let mut context = RequestContext::new(block_size, request_blocks);
    context.tracks_prefill_tokens = request.tracks_prefill_tokens;
    context.expected_output_tokens = request.expected_output_tokens;
    context.priority_jump = request.priority_jump;
    context.strict_priority = request.strict_priority;
    context.router_temperature_override = request.router_temperature;
    context.session = request.session.clone();
    // Every serving path gives attributes (a reference count here); a direct caller of
    // the router that gives none gets none, and pays nothing.
    context.attributes = request.attributes.as_ref().map(|given| {
        let complete = !given.model.is_empty()
            && (!given.request_id.is_empty() || request.request_id.is_none());
        if complete {
            return given.clone();
        }
        let mut attributes = RequestAttributes::clone(given);
        if attributes.model.is_empty() {
            attributes.model.clone_from(&request.model);
        }
        if attributes.request_id.is_empty() {
            attributes.request_id = request.request_id.clone().unwrap_or_default();
        }
        Arc::new(attributes)
    });
    context
}
