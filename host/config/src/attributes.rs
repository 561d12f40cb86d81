//! What a request says about itself, as policies read it (`request_attributes:`, the
//! ATTRIBUTES input group), and how the router scrapes engines' own load
//! (`engine_metrics:`, the ENGINE group). docs/configuration.md has the reference.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::SectionInvalid;

/// Most headers an operator may list: every request copies each one it carries.
pub const MAX_LISTED_HEADERS: usize = 32;

/// The `request_attributes:` section.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RequestAttributeSettings {
    /// Request headers handed to policies, by name (case-insensitive). No other header
    /// reaches a plugin.
    #[serde(default)]
    pub headers: Vec<String>,
    /// Where the tenant comes from, first that answers wins: `key` (the client key's
    /// grant name), `user` (the OpenAI `user` field), or `header:NAME`. Default: key,
    /// then user.
    #[serde(default = "default_tenant")]
    pub tenant: Vec<String>,
    /// A header carrying the request's integer priority (larger first), read into the
    /// request's `strict_priority`; a value that is not an integer is refused with 400.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_header: Option<String>,
    /// A header carrying the request's session id (frontend and Envoy picker): the
    /// session policies read, and what `router.session_affinity` binds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_header: Option<String>,
    /// LoRA adapters and their base models: a request naming an adapter as its `model`
    /// is routed among the base model's workers, with the adapter in its attributes.
    #[serde(default)]
    pub lora_adapters: BTreeMap<String, String>,
    /// The longest header value kept; a longer one is refused with 400.
    #[serde(default = "default_max_value_bytes")]
    pub max_value_bytes: usize,
}

impl Default for RequestAttributeSettings {
    fn default() -> Self {
        RequestAttributeSettings {
            headers: Vec::new(),
            tenant: default_tenant(),
            priority_header: None,
            session_header: None,
            lora_adapters: BTreeMap::new(),
            max_value_bytes: default_max_value_bytes(),
        }
    }
}

fn default_tenant() -> Vec<String> {
    vec!["key".into(), "user".into()]
}
fn default_max_value_bytes() -> usize {
    1024
}

/// One place the tenant may come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TenantSource<'a> {
    Key,
    User,
    /// A header, by name as the config spells it (look it up case-insensitively).
    Header(&'a str),
}

impl RequestAttributeSettings {
    /// The tenant sources, in order (checked by `validate`). Read per request: nothing
    /// is allocated.
    pub fn tenant_sources(&self) -> impl Iterator<Item = TenantSource<'_>> {
        self.tenant.iter().filter_map(|s| match s.as_str() {
            "key" => Some(TenantSource::Key),
            "user" => Some(TenantSource::User),
            other => other
                .strip_prefix("header:")
                .map(|h| TenantSource::Header(h.trim())),
        })
    }

    /// Whether header `name` is one policies may read (ASCII case-insensitive).
    pub fn lists_header(&self, name: &str) -> bool {
        self.headers.iter().any(|h| h.eq_ignore_ascii_case(name))
    }

    /// Checks what serde cannot; the message names the setting.
    pub fn validate(&self) -> Result<(), SectionInvalid> {
        if self.headers.len() > MAX_LISTED_HEADERS {
            return Err(SectionInvalid::TooManyHeaders(self.headers.len()));
        }
        let token = |h: &str| {
            !h.is_empty()
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        };
        for header in self.headers.iter().chain(&self.priority_header) {
            if !token(header) {
                return Err(SectionInvalid::HeaderName(header.clone()));
            }
            if header.eq_ignore_ascii_case("authorization") || header.eq_ignore_ascii_case("cookie")
            {
                return Err(SectionInvalid::CredentialHeader(header.clone()));
            }
        }
        for source in &self.tenant {
            let ok = match source.as_str() {
                "key" | "user" => true,
                other => other
                    .strip_prefix("header:")
                    .is_some_and(|h| token(h.trim())),
            };
            if !ok {
                return Err(SectionInvalid::TenantSource(source.clone()));
            }
        }
        if self.max_value_bytes == 0 {
            return Err(SectionInvalid::MaxValueBytes);
        }
        for (adapter, base) in &self.lora_adapters {
            if adapter.is_empty() || base.is_empty() || adapter == base {
                return Err(SectionInvalid::AdapterMapping {
                    adapter: adapter.clone(),
                    base: base.clone(),
                });
            }
        }
        Ok(())
    }
}

/// The `engine_metrics:` section: scraping each engine's Prometheus `/metrics`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineMetricsSettings {
    /// How often each engine with a `url` is scraped; 0 (the default) scrapes none, and
    /// policies reading ENGINE see no samples.
    pub interval_ms: u64,
    /// One scrape's whole budget (connect, headers and body); a slower one fails.
    pub timeout_ms: u64,
    /// The largest `/metrics` body read; a larger one fails the scrape.
    pub max_bytes: usize,
    /// Scrapes in flight at once.
    pub concurrency: usize,
}

impl Default for EngineMetricsSettings {
    fn default() -> Self {
        EngineMetricsSettings {
            interval_ms: 0,
            timeout_ms: 1_000,
            max_bytes: 4 << 20,
            concurrency: 64,
        }
    }
}

impl EngineMetricsSettings {
    pub fn validate(&self) -> Result<(), SectionInvalid> {
        if self.interval_ms > 0
            && (self.timeout_ms == 0 || self.max_bytes == 0 || self.concurrency == 0)
        {
            return Err(SectionInvalid::EngineMetrics);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_headers_and_bad_sources_are_refused() {
        let mut s = RequestAttributeSettings {
            headers: vec!["X-Zone".into()],
            tenant: default_tenant(),
            max_value_bytes: 1,
            ..Default::default()
        };
        assert_eq!(s.validate(), Ok(()));
        assert!(s.lists_header("x-zone") && s.lists_header("X-ZONE") && !s.lists_header("x-zon"));
        s.headers.push("Authorization".into());
        assert_eq!(
            s.validate(),
            Err(SectionInvalid::CredentialHeader("Authorization".into()))
        );
        s.headers.pop();
        s.tenant = vec!["header:X-Tenant".into(), "key".into()];
        assert_eq!(
            s.tenant_sources().collect::<Vec<_>>(),
            [TenantSource::Header("X-Tenant"), TenantSource::Key]
        );
        s.tenant = vec!["ip".into()];
        assert_eq!(s.validate(), Err(SectionInvalid::TenantSource("ip".into())));
    }
}
