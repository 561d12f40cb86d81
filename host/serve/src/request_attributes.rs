//! What a request says about itself, gathered once per request on every path (frontend,
//! ext_proc, `/v1/select`) into the ATTRIBUTES policies read: its id, model and LoRA
//! adapter, tenant, priority, and the headers the operator listed
//! (`request_attributes:`). Nothing else of a request reaches a plugin.

use std::sync::Arc;
use std::time::Duration;

use switchyard_config::{RequestAttributeSettings, TenantSource};
use switchyard_fleet::router::RouteRequest;
use switchyard_plugin_host::plugin::PartitionKey;
use switchyard_plugin_host::plugin::RequestAttributes;
use switchyard_plugin_sdk::Placement;

use crate::caller::Caller;

/// A request header (or body field) that cannot become an attribute: answered with 400.
#[derive(Debug, thiserror::Error)]
#[error("the `{name}` {} {what}", if *.field { "field" } else { "header" })]
pub struct BadHeader {
    pub name: String,
    pub what: String,
    /// A body field (OpenAI's `user`), not a header.
    pub field: bool,
}

/// The header a client or gateway names its request with.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// A request's attributes and what routing takes from them.
#[derive(Clone, Debug)]
pub struct Described {
    pub attributes: Arc<RequestAttributes>,
    /// The partition's model: the base model when the request names a LoRA adapter.
    pub partition_model: String,
    /// From `request_attributes.priority_header` (0 without one), or an admitter's.
    pub priority: i32,
    /// Where the admitters (`admission.admitters`) placed it in the queue.
    pub placement: Placement,
    /// The session id from `request_attributes.session_header`, if the request has one.
    pub session: Option<String>,
}

impl Described {
    /// Takes the admitters' placement: their priority becomes the request's.
    pub fn admitted(&mut self, placement: Placement) {
        if let Some(priority) = placement.priority {
            self.priority = priority;
        }
        self.placement = placement;
    }

    /// Where the request waits while every worker of `partition` is busy.
    pub fn place(&self, partition: PartitionKey) -> switchyard_fleet::router::Place<'_> {
        switchyard_fleet::router::Place {
            partition,
            priority: self.priority,
            tenant: self
                .placement
                .tenant
                .as_deref()
                .or(self.attributes.tenant.as_deref()),
            max_wait: self.placement.max_wait_ms.map(Duration::from_millis),
        }
    }
}

/// The headers of a request the router keeps (lower-case name, value): the listed ones,
/// the request id, and those the tenant and priority come from. `get` looks a header up
/// case-insensitively.
pub fn kept_headers<'h>(
    settings: &RequestAttributeSettings,
    get: impl Fn(&str) -> Option<&'h [u8]>,
) -> Result<Vec<(String, String)>, BadHeader> {
    let tenant_headers = settings.tenant_sources().filter_map(|s| match s {
        TenantSource::Header(h) => Some(h),
        _ => None,
    });
    let names = settings
        .headers
        .iter()
        .map(String::as_str)
        .chain(tenant_headers)
        .chain(settings.priority_header.as_deref())
        .chain(settings.session_header.as_deref())
        .chain([REQUEST_ID_HEADER]);
    let mut kept: Vec<(String, String)> = Vec::new();
    for name in names {
        if kept.iter().any(|(k, _)| k.eq_ignore_ascii_case(name)) {
            continue;
        }
        let Some(value) = get(name) else { continue };
        if value.len() > settings.max_value_bytes {
            return Err(bad_header(
                name,
                format!(
                    "is {} bytes, over the router's limit of {} (request_attributes.max_value_bytes)",
                    value.len(),
                    settings.max_value_bytes
                ),
            ));
        }
        let Ok(value) = std::str::from_utf8(value) else {
            return Err(bad_header(name, "is not UTF-8 text".into()));
        };
        kept.push((name.to_ascii_lowercase(), value.to_owned()));
    }
    Ok(kept)
}

#[cold]
fn bad_header(name: &str, what: String) -> BadHeader {
    BadHeader {
        name: name.to_owned(),
        what,
        field: false,
    }
}

/// The attributes of a request for `model` (as the client named it) with the `kept`
/// headers; `fallback_id` names it when no `x-request-id` does.
pub fn describe(
    settings: &RequestAttributeSettings,
    kept: Vec<(String, String)>,
    caller: Option<&Caller>,
    model: &str,
    user: Option<&str>,
    fallback_id: &str,
) -> Result<Described, BadHeader> {
    let header = |name: &str| {
        kept.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    if let Some(user) = user.filter(|u| u.len() > settings.max_value_bytes) {
        return Err(BadHeader {
            name: "user".into(),
            what: format!(
                "is {} bytes, over the router's limit of {} (request_attributes.max_value_bytes)",
                user.len(),
                settings.max_value_bytes
            ),
            field: true,
        });
    }
    let tenant = settings.tenant_sources().find_map(|source| match source {
        TenantSource::Key => caller
            .and_then(|c| c.grant.as_ref())
            .map(|g| g.name.clone()),
        TenantSource::User => user.filter(|u| !u.is_empty()).map(str::to_owned),
        TenantSource::Header(h) => header(h).filter(|v| !v.is_empty()).map(str::to_owned),
    });
    let priority = match &settings.priority_header {
        None => 0,
        Some(name) => match header(name) {
            None => 0,
            Some(value) => value.trim().parse::<i32>().map_err(|_| {
                bad_header(
                    name,
                    format!(
                        "`{value}` is not an integer priority (request_attributes.priority_header)"
                    ),
                )
            })?,
        },
    };
    let request_id = header(REQUEST_ID_HEADER)
        .filter(|v| !v.is_empty())
        .unwrap_or(fallback_id)
        .to_owned();
    let (partition_model, lora_adapter) = match settings.lora_adapters.get(model) {
        Some(base) => (base.clone(), Some(model.to_owned())),
        None => (model.to_owned(), None),
    };
    let session = settings
        .session_header
        .as_deref()
        .and_then(header)
        .filter(|v| !v.is_empty())
        .map(str::to_owned);
    let headers = kept
        .into_iter()
        .filter(|(name, _)| settings.lists_header(name))
        .collect();
    Ok(Described {
        attributes: Arc::new(RequestAttributes {
            request_id,
            model: partition_model.clone(),
            lora_adapter,
            tenant,
            headers,
        }),
        partition_model,
        priority,
        placement: Placement::default(),
        session,
    })
}

/// Completes the attributes a gateway sent in a `/v1/select` or `/v1/reserve` body
/// (`"attributes": {"tenant", "lora_adapter", "headers"}`) as the frontend would make
/// them: an adapter named as the model routes in its base model's partition, the tenant
/// defaults to the key's grant, and only the listed headers are kept.
pub fn complete(
    settings: &RequestAttributeSettings,
    caller: Option<&Caller>,
    request: &mut RouteRequest,
) {
    let mut attributes = request.attributes.as_deref().cloned().unwrap_or_default();
    if let Some(base) = settings.lora_adapters.get(&request.model) {
        attributes.lora_adapter = Some(std::mem::replace(&mut request.model, base.clone()));
    }
    attributes.model.clone_from(&request.model);
    if attributes.tenant.is_none() && settings.tenant_sources().any(|s| s == TenantSource::Key) {
        attributes.tenant = caller
            .and_then(|c| c.grant.as_ref())
            .map(|g| g.name.clone());
    }
    attributes
        .headers
        .retain(|(name, _)| settings.lists_header(name));
    if attributes.request_id.is_empty() {
        attributes.request_id = request.request_id.clone().unwrap_or_default();
    }
    request.attributes = Some(Arc::new(attributes));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_in_order_adapters_and_limits() {
        let settings = RequestAttributeSettings {
            headers: vec!["X-Zone".into()],
            tenant: vec!["header:x-tenant".into(), "user".into()],
            priority_header: Some("x-priority".into()),
            session_header: None,
            lora_adapters: [("sql".to_owned(), "llama".to_owned())].into(),
            max_value_bytes: 8,
        };
        let request = [
            ("x-zone", "a"),
            ("x-priority", "7"),
            ("x-other", "secret"),
            ("x-request-id", "r1"),
        ];
        let get = |name: &str| {
            request
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_bytes())
        };
        let Ok(kept) = kept_headers(&settings, get) else {
            panic!("the headers are within the limits")
        };
        assert!(kept.iter().all(|(k, _)| k != "x-other"));
        let Ok(d) = describe(&settings, kept, None, "sql", Some("u"), "fallback") else {
            panic!("a valid request")
        };
        assert_eq!(d.partition_model, "llama");
        assert_eq!(d.priority, 7);
        let a = &d.attributes;
        assert_eq!(a.lora_adapter.as_deref(), Some("sql"));
        assert_eq!(a.tenant.as_deref(), Some("u"), "no x-tenant: the user");
        assert_eq!(a.request_id, "r1");
        assert_eq!(a.headers, [("x-zone".to_owned(), "a".to_owned())]);
        let long = [("x-zone", "123456789")];
        let Err(err) = kept_headers(&settings, |n: &str| {
            long.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(n))
                .map(|(_, v)| v.as_bytes())
        }) else {
            panic!("a value over the limit is refused")
        };
        assert!(err.to_string().contains("max_value_bytes"), "{err}");
        let bad = vec![("x-priority".to_owned(), "high".to_owned())];
        assert!(describe(&settings, bad, None, "m", None, "f").is_err());
        let Err(long_user) = describe(&settings, Vec::new(), None, "m", Some("123456789"), "f")
        else {
            panic!("a `user` over max_value_bytes is refused")
        };
        assert!(
            long_user
                .to_string()
                .starts_with("the `user` field is 9 bytes"),
            "{long_user}"
        );
    }
}
