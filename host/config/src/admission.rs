//! Overload (`admission:`): when a worker counts as busy, and the queue a request waits in
//! while every candidate is (docs/admission.md). Absent: no worker is ever busy, nothing
//! waits, and selection costs what it did without it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::SectionInvalid;

/// The `admission:` section.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AdmissionSettings {
    #[serde(default)]
    pub busy: BusyThresholds,
    #[serde(default)]
    pub queue: QueueSettings,
    /// Token buckets per tenant, checked before a request is routed; over one: 429 with
    /// `Retry-After` (the seconds until the bucket holds enough again). The key `"*"`
    /// applies to every tenant not listed (and to requests without one).
    #[serde(default)]
    pub rate_limits: BTreeMap<String, RateLimit>,
    /// Admitter components (ABI 1.3), called in this order before a request's worker is
    /// selected; the first to reject answers it (docs/admission.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub admitters: Vec<AdmitterEntry>,
}

/// One admitter: a registered admitter type and its parameters.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AdmitterEntry {
    #[serde(rename = "type")]
    pub admitter_type: String,
    #[serde(default)]
    pub parameters: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    pub on_error: AdmitterOnError,
}

/// What a request gets when its admitter fails (an error, a panic, a missed deadline).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AdmitterOnError {
    /// 503 with `Retry-After: 1`: an admitter that enforces something fails closed.
    #[default]
    Reject,
    /// The admitter is passed over, as if it had admitted the request as it is.
    Admit,
}

impl AdmitterOnError {
    pub fn as_str(self) -> &'static str {
        match self {
            AdmitterOnError::Reject => "reject",
            AdmitterOnError::Admit => "admit",
        }
    }
}

/// Why `limit` is not a rate: every rate and burst given is a number above 0.
pub fn check_rate(tenant: &str, limit: &RateLimit) -> Result<(), SectionInvalid> {
    let rates = [
        limit.requests_per_s,
        limit.request_burst,
        limit.tokens_per_s,
        limit.token_burst,
    ];
    if rates.iter().flatten().any(|r| !(r.is_finite() && *r > 0.0)) {
        return Err(SectionInvalid::Rate(tenant.to_owned()));
    }
    Ok(())
}

/// One tenant's rate: requests and prompt tokens per second, each with its burst.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_s: Option<f64>,
    /// Requests taken at once from a full bucket; default: one second's worth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_burst: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_s: Option<f64>,
    /// Prompt tokens taken at once from a full bucket; default: one second's worth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_burst: Option<f64>,
}

/// A worker at or past any of these is busy: not a candidate. Unset: no limit.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BusyThresholds {
    /// Requests the router booked on the worker (every replica's, with `replicas:`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_active_requests: Option<u32>,
    /// Prompt tokens booked in the worker's prefill stage, this request's uncached ones
    /// included: a worker takes a request while its bookings plus the request's tokens not
    /// in its cache stay within this (an idle worker takes any), so the worker holding a
    /// prompt's prefix has room for it first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_active_prefill_tokens: Option<u64>,
    /// KV blocks booked for decode on the worker (the requests' projected footprints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_active_decode_blocks: Option<u64>,
    /// Requests waiting in the engine's own queue, as it reports (`engine_metrics:`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_engine_waiting: Option<f64>,
    /// The engine's reported KV-cache usage, 0 to 1 (`engine_metrics:`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_kv_cache_usage: Option<f64>,
}

impl BusyThresholds {
    pub fn any(&self) -> bool {
        self.max_active_requests.is_some()
            || self.max_active_prefill_tokens.is_some()
            || self.max_active_decode_blocks.is_some()
            || self.max_engine_waiting.is_some()
            || self.max_kv_cache_usage.is_some()
    }
}

/// The queue of requests waiting for a worker that is not busy.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueSettings {
    /// Requests waiting at once, per partition; one more is refused with 429.
    pub max_queued: usize,
    /// How long a request waits at most; then 503 with `Retry-After`. An admitter's
    /// `max_wait_ms` for a request can only shorten it.
    pub max_wait_ms: u64,
    /// Within a priority, tenants take turns in proportion to these weights (1 for a
    /// tenant not listed, and for requests without a tenant).
    pub tenant_weights: BTreeMap<String, u32>,
    /// Within a tenant: first come first served (`fifo`), or earliest deadline first
    /// (`deadline`: a request's deadline is its arrival plus the longest it may wait,
    /// `max_wait_ms` or an admitter's shorter one).
    pub order: QueueOrder,
    /// When the queue is full, a request of a tenant holding at least two places fewer
    /// than the tenant holding the most (in its priority) takes that tenant's last place,
    /// which is answered 429: no tenant crowds the others out. `false`: first come, first
    /// placed (a flooding tenant can fill the queue).
    pub fair_share: bool,
}

/// The order within a tenant's waiting requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueOrder {
    #[default]
    Fifo,
    Deadline,
}

impl Default for QueueSettings {
    fn default() -> Self {
        QueueSettings {
            max_queued: 1024,
            max_wait_ms: 30_000,
            tenant_weights: BTreeMap::new(),
            order: QueueOrder::default(),
            fair_share: true,
        }
    }
}

impl AdmissionSettings {
    pub fn validate(&self) -> Result<(), SectionInvalid> {
        let b = &self.busy;
        if b.max_engine_waiting
            .is_some_and(|w| !(w.is_finite() && w >= 0.0))
        {
            return Err(SectionInvalid::MaxEngineWaiting);
        }
        if b.max_kv_cache_usage
            .is_some_and(|u| !(0.0..=1.0).contains(&u))
        {
            return Err(SectionInvalid::MaxKvCacheUsage);
        }
        if self.queue.max_wait_ms == 0 {
            return Err(SectionInvalid::MaxWait);
        }
        for (tenant, limit) in &self.rate_limits {
            check_rate(tenant, limit).map_err(|e| SectionInvalid::RateLimits(Box::new(e)))?;
        }
        if let Some((tenant, _)) = self.queue.tenant_weights.iter().find(|(_, &w)| w == 0) {
            return Err(SectionInvalid::ZeroWeight(tenant.clone()));
        }
        Ok(())
    }
}
