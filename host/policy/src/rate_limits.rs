//! Token buckets per tenant (`admission.rate_limits`): a request takes one request token
//! and its prompt's tokens from its tenant's buckets before it is routed, or is refused
//! with the time until the buckets hold enough. Buckets refill continuously at their
//! rate, up to their burst; O(1) per request under one lock.
//!
//! Tenants can come from a header, so their number is bounded: past [`MAX_TENANTS`]
//! buckets, those already refilled to their burst (indistinguishable from new ones) are
//! dropped, in a sweep at most once a second; until one makes room, new tenants share
//! one overflow bucket. So a flood of made-up tenants costs one linear sweep a second.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use switchyard_config::RateLimit;

#[derive(Clone, Copy)]
struct Bucket {
    level: f64,
    at: Instant,
}

impl Bucket {
    /// The level at `now`, refilled at `rate` up to `burst`.
    fn refilled(&self, rate: f64, burst: f64, now: Instant) -> f64 {
        (self.level + rate * now.saturating_duration_since(self.at).as_secs_f64()).min(burst)
    }
}

/// Why a request is over its tenant's rate, and when to retry.
#[derive(Debug, Clone, PartialEq)]
pub struct OverRate {
    pub tenant: String,
    pub what: &'static str,
    pub retry_after: Duration,
}

impl OverRate {
    /// Whose rate: the tenant, in words.
    pub fn who(&self) -> String {
        if self.tenant.is_empty() {
            "requests without a tenant".to_owned()
        } else {
            format!("tenant `{}`", self.tenant)
        }
    }
}

impl std::fmt::Display for OverRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is over its {} rate (admission.rate_limits); retry in {:.1} s",
            self.who(),
            self.what,
            self.retry_after.as_secs_f64()
        )
    }
}

/// One tenant's buckets; `None` until first used (a full bucket).
#[derive(Default)]
struct TenantBuckets {
    requests: Option<Bucket>,
    prompt: Option<Bucket>,
}

impl TenantBuckets {
    /// Whether both buckets have refilled to their burst under `limit` by `now`.
    fn full(&self, limit: &RateLimit, now: Instant) -> bool {
        let full =
            |bucket: &Option<Bucket>, rate: Option<f64>, burst: Option<f64>| match (bucket, rate) {
                (Some(b), Some(rate)) => {
                    let burst = burst.unwrap_or(rate);
                    b.refilled(rate, burst, now) >= burst
                }
                _ => true,
            };
        full(&self.requests, limit.requests_per_s, limit.request_burst)
            && full(&self.prompt, limit.tokens_per_s, limit.token_burst)
    }
}

/// Most tenants with buckets of their own.
pub const MAX_TENANTS: usize = 65_536;

/// The bucket of tenants that find no room of their own.
const OVERFLOW: &str = "\u{0}overflow";

/// Every tenant's buckets.
#[derive(Default)]
pub struct RateLimiter {
    buckets: Mutex<HashMap<String, TenantBuckets>>,
    last_sweep: Mutex<Option<Instant>>,
}

impl RateLimiter {
    /// Takes one request and `tokens` prompt tokens from `tenant`'s buckets under
    /// `limit`, or refuses without taking anything.
    pub fn take(&self, tenant: &str, tokens: u64, limit: &RateLimit) -> Result<(), OverRate> {
        let now = Instant::now();
        let mut buckets = self.buckets.lock();
        let mut key = tenant;
        if !buckets.contains_key(tenant) && buckets.len() >= MAX_TENANTS {
            let mut last_sweep = self.last_sweep.lock();
            if last_sweep.is_none_or(|at| now.duration_since(at) >= Duration::from_secs(1)) {
                *last_sweep = Some(now);
                buckets.retain(|_, b| !b.full(limit, now));
            }
            if buckets.len() >= MAX_TENANTS {
                key = OVERFLOW;
            }
        }
        let tenant_buckets = buckets.entry(key.to_owned()).or_default();
        let checks = [
            (
                tenant_buckets.requests,
                limit.requests_per_s,
                limit.request_burst,
                1.0,
                "request",
            ),
            (
                tenant_buckets.prompt,
                limit.tokens_per_s,
                limit.token_burst,
                tokens as f64,
                "prompt-token",
            ),
        ];
        let mut levels = [None, None];
        for (i, (bucket, rate, burst, need, what)) in checks.iter().enumerate() {
            let Some(rate) = *rate else { continue };
            let burst = burst.unwrap_or(rate);
            let level = bucket.map_or(burst, |b| b.refilled(rate, burst, now));
            // A request larger than the burst is let through when the bucket is full.
            let need = need.min(burst);
            if level < need {
                return Err(OverRate {
                    tenant: tenant.to_owned(),
                    what,
                    retry_after: Duration::from_secs_f64(((need - level) / rate).max(0.001)),
                });
            }
            levels[i] = Some(level - need);
        }
        let [requests_level, prompt_level] = levels;
        if let Some(level) = requests_level {
            tenant_buckets.requests = Some(Bucket { level, at: now });
        }
        if let Some(level) = prompt_level {
            tenant_buckets.prompt = Some(Bucket { level, at: now });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_refusal_with_the_time_to_retry() {
        let limiter = RateLimiter::default();
        let limit = RateLimit {
            requests_per_s: Some(2.0),
            request_burst: Some(3.0),
            tokens_per_s: None,
            token_burst: None,
        };
        for _ in 0..3 {
            assert!(limiter.take("a", 100, &limit).is_ok());
        }
        let over = limiter.take("a", 100, &limit).unwrap_err();
        assert_eq!(over.what, "request");
        assert!(over.retry_after <= Duration::from_millis(500), "{over}");
        assert!(
            limiter.take("b", 100, &limit).is_ok(),
            "tenants do not share"
        );
        let tokens = RateLimit {
            requests_per_s: None,
            request_burst: None,
            tokens_per_s: Some(1000.0),
            token_burst: None,
        };
        assert!(
            limiter.take("c", 5_000, &tokens).is_ok(),
            "larger than the burst: let through full"
        );
        assert_eq!(
            limiter.take("c", 10, &tokens).unwrap_err().what,
            "prompt-token"
        );
    }

    #[test]
    fn tenants_from_headers_stay_bounded() {
        let limiter = RateLimiter::default();
        let slow = RateLimit {
            requests_per_s: Some(1e-6),
            request_burst: Some(1.0),
            tokens_per_s: None,
            token_burst: None,
        };
        for i in 0..MAX_TENANTS + 10 {
            assert!(limiter.take(&format!("t{i}"), 1, &slow).is_ok() || i >= MAX_TENANTS);
        }
        // Every bucket is still draining: newcomers share the overflow bucket.
        assert_eq!(limiter.buckets.lock().len(), MAX_TENANTS + 1);
        let fast = RateLimit {
            requests_per_s: Some(1e9),
            ..slow.clone()
        };
        // Under a limit whose buckets refill at once, the full ones are swept, at most
        // once a second.
        *limiter.last_sweep.lock() = None;
        assert!(limiter.take("newcomer", 1, &fast).is_ok());
        assert!(
            limiter.buckets.lock().len() <= 2,
            "{}",
            limiter.buckets.lock().len()
        );
    }
}
