//! What the picker decides for one request: the endpoints a gateway can send to, the
//! selection and booking (a disaggregated model's pair included), the busy answer that
//! makes a request wait, and the fallback endpoints.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rustc_hash::FxHashSet;
use switchyard_config::Disaggregation;
use switchyard_fleet::router::{RouteError, RouteRequest, Router};
use switchyard_plugin_host::plugin::PartitionKey;
use switchyard_plugin_sdk::WorkerId;
use switchyard_plugin_sdk::WorkerType;

use super::selection::{TestSelection, HEADER};
use super::{Booked, EndpointPicker};
use crate::caller::Caller;
use crate::frontend::no_endpoint;
use crate::frontend::prompt::{self, Endpoint};
use crate::frontend::{Lease, OpenAiError};
use crate::request_attributes;

/// The workers a gateway can send to, within `subset` (`ip:port` strings) when given.
pub(super) fn eligible(router: &Router, subset: Option<&[String]>) -> Vec<(WorkerId, SocketAddr)> {
    eligible_of_all(router, subset).0
}

/// `eligible`, and whether it is every worker of the router (none without an endpoint,
/// none outside the subset).
fn eligible_of_all(
    router: &Router,
    subset: Option<&[String]>,
) -> (Vec<(WorkerId, SocketAddr)>, bool) {
    let (mut endpoints, workers) = router.endpoints_and_workers();
    if let Some(subset) = subset {
        let subset: FxHashSet<SocketAddr> = subset.iter().filter_map(|e| e.parse().ok()).collect();
        endpoints.retain(|(_, endpoint)| subset.contains(endpoint));
    }
    let all = endpoints.len() == workers;
    (endpoints, all)
}

/// `eligible` kept to the endpoints of the request's `test-epp-endpoint-selection`
/// header (`ext_proc.test_endpoint_selection`); 503 when it names none of them.
pub(super) fn selected(
    mut eligible: Vec<(WorkerId, SocketAddr)>,
    selection: Option<&TestSelection>,
) -> Result<Vec<(WorkerId, SocketAddr)>, OpenAiError> {
    let Some(selection) = selection else {
        return Ok(eligible);
    };
    eligible.retain(|(_, endpoint)| selection.admits(endpoint));
    if eligible.is_empty() {
        return Err(no_endpoint(format!(
            "none of the endpoints the request's {HEADER} header names ({selection}) is an eligible switchyard worker"
        )));
    }
    Ok(eligible)
}

/// The endpoints one try may pick among.
pub(super) enum Eligible {
    /// Every worker of the router, each with an endpoint: nothing narrows the selection,
    /// and nothing is listed per request (a fleet of thousands is not copied per pick).
    Every,
    /// These: the fleet narrowed by a subset hint, a test selection, a per-worker limit
    /// or a worker without an endpoint; `all` when it left none out after all.
    Listed {
        endpoints: Vec<(WorkerId, SocketAddr)>,
        all: bool,
    },
}

impl Eligible {
    /// The endpoint the gateway reaches `worker` at.
    fn endpoint(&self, router: &Router, worker: WorkerId) -> Result<SocketAddr, OpenAiError> {
        let found = match self {
            Eligible::Every => router.endpoint_of(worker),
            Eligible::Listed { endpoints, .. } => endpoints
                .iter()
                .find(|(id, _)| *id == worker)
                .map(|(_, endpoint)| *endpoint),
        };
        found.ok_or_else(|| no_endpoint(format!("worker {} has no endpoint", worker.worker_id)))
    }

    /// The workers the selection is narrowed to: none when it is every worker.
    fn only(&self) -> Option<FxHashSet<WorkerId>> {
        match self {
            Eligible::Listed {
                endpoints,
                all: false,
            } => Some(endpoints.iter().map(|(id, _)| *id).collect()),
            _ => None,
        }
    }

    /// The eligible workers' ids, listed (for the fallbacks, which the default leaves off).
    fn ids(&self, router: &Router) -> Vec<WorkerId> {
        match self {
            Eligible::Every => router.endpoints().into_iter().map(|(id, _)| id).collect(),
            Eligible::Listed { endpoints, .. } => endpoints.iter().map(|(id, _)| *id).collect(),
        }
    }
}

/// A pick that found every worker busy, and where the request waits.
pub(super) enum Attempt {
    Busy(BusyPlace),
    Failed(OpenAiError),
}

/// Where a request that found every worker busy waits: its partition, priority and
/// tenant.
#[derive(Clone)]
pub(super) struct BusyPlace {
    pub(super) partition: PartitionKey,
    pub(super) priority: i32,
    pub(super) tenant: Option<String>,
    pub(super) max_wait: Option<std::time::Duration>,
}

/// What the stream's headers asked for.
#[derive(Clone)]
pub(super) struct Wanted {
    pub(super) endpoint: Endpoint,
    pub(super) instance: Option<String>,
    pub(super) subset: Option<Vec<String>>,
    /// The request's test-only endpoint selection, when the picker takes it.
    pub(super) selection: Option<TestSelection>,
    pub(super) kept: Vec<(String, String)>,
    /// The request's admission (rate limit and admitters), made at its first try and
    /// kept by the later ones of a queued request.
    pub(super) admitted: Arc<std::sync::OnceLock<switchyard_plugin_sdk::Placement>>,
}

/// `request` selected and booked; when every worker of its partition is busy, `busy`
/// says where it waits (that partition: a disaggregated side waits in its own).
fn booked_or_busy(
    router: &Router,
    request: &RouteRequest,
    described: &request_attributes::Described,
    busy: &mut Option<BusyPlace>,
) -> Result<switchyard_fleet::router::RouteDecision, OpenAiError> {
    match router.select_and_reserve(request) {
        Err(RouteError::Saturated(why)) => {
            let partition = PartitionKey::new(request.model.clone(), request.worker_type);
            let place = described.place(partition.clone());
            *busy = Some(BusyPlace {
                partition,
                priority: place.priority,
                tenant: place.tenant.map(str::to_owned),
                max_wait: place.max_wait,
            });
            Err(RouteError::Saturated(why).into())
        }
        other => Ok(other?),
    }
}

/// Up to `count` endpoints for the gateway to retry on after `picked`, in the policy's
/// order: each is its choice once the ones before are out (a selection that books
/// nothing). Fewer when the eligible workers run out or the policy finds none.
fn fallbacks(
    router: &Router,
    request: &RouteRequest,
    eligible: &Eligible,
    picked: WorkerId,
    count: u8,
) -> Vec<SocketAddr> {
    if count == 0 {
        // The default: nothing to allocate or copy on the pick's path.
        return Vec::new();
    }
    let mut left: FxHashSet<WorkerId> = eligible
        .ids(router)
        .into_iter()
        .filter(|id| *id != picked)
        .collect();
    let mut probe = request.clone();
    probe.paired = None;
    let mut found = Vec::new();
    while found.len() < usize::from(count) && !left.is_empty() {
        probe.only = Some(Arc::new(left.clone()));
        let Ok(next) = router.select(&probe) else {
            break;
        };
        let next = WorkerId {
            worker_id: next.worker_id,
            dp_rank: next.dp_rank,
        };
        // A policy answering outside `only` would loop; the router keeps to it, but
        // stop rather than trust that here.
        if !left.remove(&next) {
            break;
        }
        if let Ok(endpoint) = eligible.endpoint(router, next) {
            found.push(endpoint);
        }
    }
    found
}

/// The endpoints the request may go to: within the gateway's subset hint, then the
/// request's test selection, and under `ext_proc.max_requests_per_worker`; and whether
/// that is every worker of the router (nothing to narrow the selection to).
fn eligible_within_limits(
    picker: &EndpointPicker,
    subset: Option<&[String]>,
    selection: Option<&TestSelection>,
) -> Result<Eligible, OpenAiError> {
    let router = picker.frontend.router();
    let narrowed =
        subset.is_some() || selection.is_some() || picker.max_requests_per_worker.is_some();
    if !narrowed && router.every_worker_has_an_endpoint() {
        return Ok(Eligible::Every);
    }
    let (eligible, all) = eligible_of_all(router, subset);
    let offered = eligible.len();
    if subset.is_some() && eligible.is_empty() {
        return Err(no_endpoint(
            "none of the endpoints in the gateway's subset hint is a switchyard worker",
        ));
    }
    let mut eligible = selected(eligible, selection)?;
    if let Some(limit) = picker.max_requests_per_worker {
        let loads: HashMap<WorkerId, u64> = router
            .loads()
            .into_iter()
            .map(|(id, load)| (id, u64::from(load.active_requests)))
            .collect();
        let before = eligible.len();
        eligible.retain(|(id, _)| loads.get(id).copied().unwrap_or(0) < limit);
        if before > 0 && eligible.is_empty() {
            return Err(OpenAiError::new(
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_exceeded",
                format!("every eligible worker has {limit} active requests (ext_proc.max_requests_per_worker); retry later"),
            ));
        }
    }
    let all = all && eligible.len() == offered;
    Ok(Eligible::Listed {
        endpoints: eligible,
        all,
    })
}

/// Selects and books the prefill worker of a disaggregated request in its own partition;
/// `request` becomes the decode half, paired with it.
fn book_prefill(
    router: &Arc<Router>,
    request: &mut RouteRequest,
    described: &crate::request_attributes::Described,
    eligible: &Eligible,
    busy: &mut Option<BusyPlace>,
) -> Result<(Lease, SocketAddr, WorkerId), OpenAiError> {
    let request_id = request.request_id.clone().unwrap_or_default();
    let id = format!("{request_id}-prefill");
    let mut prefill = request.clone();
    prefill.request_id = Some(id.clone());
    prefill.worker_type = WorkerType::Prefill;
    let chosen = booked_or_busy(router, &prefill, described, busy)?;
    let lease = Lease::new(router.clone(), id);
    let worker = WorkerId {
        worker_id: chosen.worker_id,
        dp_rank: chosen.dp_rank,
    };
    let at = eligible.endpoint(router, worker)?;
    request.worker_type = WorkerType::Decode;
    request.paired = Some(worker);
    Ok((lease, at, worker))
}

/// The request parsed, allowed for the caller, described (`request_attributes:`) and
/// admitted (once per request, not per try of a queued one); what the router is asked
/// for it, under its request id, shared by its admission and every try.
fn parsed_and_admitted(
    picker: &EndpointPicker,
    caller: &Caller,
    (endpoint, instance): (Endpoint, Option<&str>),
    kept: Vec<(String, String)>,
    admitted: &std::sync::OnceLock<switchyard_plugin_sdk::Placement>,
    body: &[u8],
) -> Result<
    (
        prompt::Prompt,
        crate::request_attributes::Described,
        RouteRequest,
    ),
    OpenAiError,
> {
    let frontend = &picker.frontend;
    let router = frontend.router();
    let mut prompt = prompt::parse(endpoint, body, router.block_size(), |model| {
        frontend.tokenizer(model)
    })?;
    caller
        .check_route(&prompt.model, instance)
        .map_err(crate::frontend::forbidden)?;
    let request_id = {
        let mut digits = itoa::Buffer::new();
        let number = digits.format(picker.next_request.fetch_add(1, Ordering::Relaxed));
        let mut id = String::with_capacity(picker.id_prefix.len() + 1 + number.len());
        id.push_str(&picker.id_prefix);
        id.push('-');
        id.push_str(number);
        id
    };
    let mut described = request_attributes::describe(
        &router.generation().config().request_attributes,
        kept,
        Some(caller),
        &prompt.model,
        prompt.user.as_deref(),
        &request_id,
    )?;
    // From here on the prompt's model is the partition's (an adapter's base).
    prompt.model.clone_from(&described.partition_model);
    let mut request = frontend.route_request(&prompt, &described, instance.map(str::to_owned));
    request.request_id = Some(request_id);
    let placement = match admitted.get() {
        Some(placement) => placement.clone(),
        None => {
            let placement = router.admit(
                &request,
                prompt.block_hashes.len() as u64,
                prompt.tokens.len() as u64,
            )?;
            admitted.get_or_init(|| placement).clone()
        }
    };
    described.admitted(placement);
    request.strict_priority = described.priority;
    Ok((prompt, described, request))
}

/// A request parsed, allowed for its caller, described and admitted: made once, however
/// many tries its selection takes (a queued request tries again as capacity frees).
pub(super) struct Prepared {
    prompt: prompt::Prompt,
    described: crate::request_attributes::Described,
    request: RouteRequest,
    subset: Option<Vec<String>>,
    selection: Option<TestSelection>,
}

/// Parses the body and selects and books a worker among the eligible endpoints
/// (blocking: tokenizers and plugin code run here).
pub(super) fn decide(
    picker: &EndpointPicker,
    caller: &Caller,
    wanted: Wanted,
    body: &[u8],
    busy: &mut Option<BusyPlace>,
) -> Result<Booked, OpenAiError> {
    book(picker, &prepare(picker, caller, wanted, body)?, busy)
}

/// The request of `body` as `wanted` asks for it, prepared for its tries (blocking:
/// tokenizers and admitters run here).
pub(super) fn prepare(
    picker: &EndpointPicker,
    caller: &Caller,
    wanted: Wanted,
    body: &[u8],
) -> Result<Prepared, OpenAiError> {
    let Wanted {
        endpoint,
        instance,
        subset,
        selection,
        kept,
        admitted,
    } = wanted;
    let (prompt, described, request) = parsed_and_admitted(
        picker,
        caller,
        (endpoint, instance.as_deref()),
        kept,
        &admitted,
        body,
    )?;
    Ok(Prepared {
        prompt,
        described,
        request,
        subset,
        selection,
    })
}

/// One try: selects and books a worker for `prepared` among the endpoints eligible now
/// (blocking: plugin code runs here).
pub(super) fn book(
    picker: &EndpointPicker,
    prepared: &Prepared,
    busy: &mut Option<BusyPlace>,
) -> Result<Booked, OpenAiError> {
    let Prepared {
        prompt,
        described,
        request,
        subset,
        selection,
    } = prepared;
    let frontend = &picker.frontend;
    let router = frontend.router();
    let eligible = eligible_within_limits(picker, subset.as_deref(), selection.as_ref())?;
    // A disaggregated model: the destination is a decode worker, and its prefill worker
    // is selected (and booked) in its own partition.
    let disaggregated = frontend.disaggregation(&prompt.model) != Disaggregation::Off;
    // The prepared request as it is, unless this try narrows it (to the endpoints
    // eligible now) or pairs it: with every worker eligible (no hint, selection, limit
    // or missing address left one out) there is nothing to copy or build per try.
    let request_id = request.request_id.clone().unwrap_or_default();
    let mut request = std::borrow::Cow::Borrowed(request);
    if let Some(only) = eligible.only() {
        request.to_mut().only = Some(Arc::new(only));
    }
    let prefill = if disaggregated {
        Some(book_prefill(
            router,
            request.to_mut(),
            described,
            &eligible,
            busy,
        )?)
    } else {
        None
    };
    let decision = booked_or_busy(router, &request, described, busy)?;
    let lease = Lease::new(router.clone(), request_id);
    let worker = WorkerId {
        worker_id: decision.worker_id,
        dp_rank: decision.dp_rank,
    };
    let endpoint = eligible.endpoint(router, worker)?;
    router.predict_cached(&prompt.model, worker, &prompt.block_hashes);
    let fallbacks = fallbacks(
        router,
        &request,
        &eligible,
        worker,
        picker.fallback_endpoints,
    );
    let prefill = prefill.map(|(prefill, at, _)| {
        router.pair(prefill.request_id(), Some(worker));
        (prefill, at)
    });
    Ok(Booked {
        lease,
        worker,
        endpoint,
        fallbacks,
        model: prompt.model.clone(),
        prefilled: false,
        prefill,
    })
}
