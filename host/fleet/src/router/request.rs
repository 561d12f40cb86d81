//! What a selection is asked (`RouteRequest`, the plugin host's: the one form a request
//! takes from the services to the boundary), what it answers (`RouteDecision`,
//! `RouteError`), and the checks the router makes of a request before the policy.

use super::*;
use switchyard_plugin_sdk::WorkerType;
use switchyard_policy::instances::role_words;

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
    #[error(transparent)]
    BadRequest(#[from] BadRequest),
    #[error("unknown model `{0}`: no worker serves it; add workers with POST /v1/workers")]
    UnknownModel(String),
    #[error("unknown instance `{name}`; configured instances: {}", known.join(", "))]
    UnknownInstance { name: String, known: Vec<String> },
    #[error("no eligible worker: {0}")]
    NoWorker(#[from] NoWorker),
    /// Every candidate is at or past an `admission.busy` threshold: the request may wait.
    #[error("every worker is busy: {0}")]
    Saturated(#[from] Saturated),
    #[error("instance `{instance}` failed: {error}")]
    PolicyFailed {
        instance: String,
        error: SelectError,
    },
    /// The router's own code for the request panicked (`why`, its message) or its
    /// blocking task ended: the router's fault, not the request's or a plugin's (a
    /// plugin's panic is a `PolicyFailed`).
    #[error("the {what} did not finish: {why}")]
    Unfinished { what: &'static str, why: String },
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

/// What a request asks that cannot be routed as asked (400).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BadRequest {
    #[error("`request_id` must not be empty")]
    EmptyRequestId,
    #[error("select-and-reserve needs a `request_id`")]
    NoRequestId,
    #[error("`router_temperature` must be a finite number >= 0, got {0}")]
    Temperature(f64),
    #[error("give `token_ids` or `block_hashes`, not both")]
    TokensAndHashes,
    #[error("give the prompt as `token_ids` or `block_hashes`")]
    NoPrompt,
}

/// Why no worker can take a request now (503): none is a candidate, or none is left.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NoWorker {
    /// Workers joined, and their partition's columns are not made yet.
    #[error("partition {0} has no candidates yet; retry")]
    NoCandidatesYet(PartitionKey),
    /// A reload is making the partition's policies.
    #[error("partition {0} has no policies yet; retry")]
    NoPoliciesYet(PartitionKey),
    /// The request's `only` set (a gateway's subset, the endpoints it can reach) names
    /// no candidate.
    #[error("model `{model}`: none of the endpoints the request may use is an eligible worker")]
    NoneAllowed { model: String },
    /// The policy had no candidate, or a filter left none (`SelectError::is_no_worker`).
    #[error(transparent)]
    Policy(SelectError),
    #[error("instance `{instance}` serves {} workers (its worker_types), not {role} ones: route {role} requests with an instance that serves them (worker_selection.{})", role_words(serves), switchyard_config::WorkerSelection::role_key(*wanted), role = role_word(*wanted))]
    WrongRole {
        instance: String,
        serves: Vec<WorkerType>,
        wanted: WorkerType,
    },
    #[error("model `{model}`: every {} worker is unhealthy ({unhealthy} out of the candidates)", worker_type.as_str())]
    AllUnhealthy {
        model: String,
        worker_type: WorkerType,
        unhealthy: usize,
    },
    #[error("model `{model}` has no {} workers", worker_type.as_str())]
    NoneOfType {
        model: String,
        worker_type: WorkerType,
    },
}

/// Why every worker a request may use is busy (`admission.busy`): it may wait its turn.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Saturated {
    #[error("model `{model}`: each of {tries} picks was filled to an admission.busy threshold by other requests before it could be booked")]
    FilledFirst { model: String, tries: usize },
    #[error("{ahead} requests of model `{model}` above priority {priority} wait for a worker; this one waits behind them")]
    Behind {
        ahead: usize,
        model: String,
        priority: i32,
    },
    #[error("every candidate of model `{model}` is at an admission.busy threshold")]
    EveryCandidate { model: String },
    #[error("the session's worker {worker_id} is at an admission.busy threshold (session_affinity: hard); the request waits for it")]
    SessionWorker { worker_id: u64 },
}

/// Checks what serde cannot; returns the request id (required to reserve).
pub(super) fn validate(request: &RouteRequest, reserve: bool) -> Result<Option<&str>, RouteError> {
    let request_id = match (request.request_id.as_deref(), reserve) {
        (Some(""), _) => return Err(BadRequest::EmptyRequestId.into()),
        (None, true) => return Err(BadRequest::NoRequestId.into()),
        (id, _) => id,
    };
    if let Some(t) = request.router_temperature {
        if !t.is_finite() || t < 0.0 {
            return Err(BadRequest::Temperature(t).into());
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
        (Some(_), Some(_)) => Err(BadRequest::TokensAndHashes.into()),
        (None, None) => Err(BadRequest::NoPrompt.into()),
        (Some(tokens), None) => {
            hash_tokens(tokens, block_size, scratch);
            let blocks = (tokens.len() as u64).div_ceil(u64::from(block_size));
            Ok((blocks, scratch))
        }
        (None, Some(given)) => Ok((given.len() as u64, given)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The errors carry values; their text is what callers have always read (the HTTP
    /// API's `error`, OpenAI's `message`), so a value changing shape cannot change it.
    #[test]
    fn route_errors_read_as_their_values_say() {
        let wrong_role = RouteError::from(NoWorker::WrongRole {
            instance: "pd".into(),
            serves: vec![WorkerType::Prefill, WorkerType::Decode],
            wanted: WorkerType::Select,
        });
        assert_eq!(
            wrong_role.to_string(),
            "no eligible worker: instance `pd` serves prefill, decode workers (its worker_types), not aggregated ones: route aggregated requests with an instance that serves them (worker_selection.aggregated)"
        );
        let unhealthy = RouteError::from(NoWorker::AllUnhealthy {
            model: "m".into(),
            worker_type: WorkerType::Decode,
            unhealthy: 3,
        });
        assert_eq!(
            unhealthy.to_string(),
            "no eligible worker: model `m`: every decode worker is unhealthy (3 out of the candidates)"
        );
        let behind = RouteError::from(Saturated::Behind {
            ahead: 2,
            model: "m".into(),
            priority: -1,
        });
        assert_eq!(
            behind.to_string(),
            "every worker is busy: 2 requests of model `m` above priority -1 wait for a worker; this one waits behind them"
        );
        let unknown = RouteError::UnknownInstance {
            name: "x".into(),
            known: vec!["default".into(), "pd".into()],
        };
        assert_eq!(
            unknown.to_string(),
            "unknown instance `x`; configured instances: default, pd"
        );
        assert_eq!(
            RouteError::from(BadRequest::Temperature(f64::NAN)).to_string(),
            "`router_temperature` must be a finite number >= 0, got NaN"
        );
    }
}
