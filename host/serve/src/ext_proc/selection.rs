//! The Gateway API Inference Extension's test-only endpoint selection, which its
//! conformance suite steers requests with (`ext_proc.test_endpoint_selection`, off by
//! default): the request header `test-epp-endpoint-selection` names the endpoints the
//! request may go to, and the response carries the endpoint the gateway says served it in
//! `x-conformance-test-served-endpoint`. Parsed and reported as GIE's own picker does
//! (its `HeaderBasedTestingFilter` and `DestinationEndpointServedVerifier`, read at
//! gateway-api-inference-extension commit 1748e829d116).

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use rustc_hash::FxHashSet;

use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::google::protobuf::value::Kind;

use super::messages::{LB_NAMESPACE, SERVED_KEY};

/// The request header naming the endpoints: `IP` (any of its ports, every data-parallel
/// rank of a pod) or `IP:port` (that one), comma-separated; IPv6 with or without brackets.
pub const HEADER: &str = "test-epp-endpoint-selection";
/// The response header reporting the endpoint that served, as the gateway said it.
pub const SERVED_REPORT: &str = "x-conformance-test-served-endpoint";

/// The endpoints one request's header names.
#[derive(Clone, Debug)]
pub struct TestSelection {
    /// Entries without a port: every endpoint at the address. Sets: each candidate is
    /// looked up once, so a long header costs time linear in its length.
    hosts: FxHashSet<IpAddr>,
    /// Entries with a port: that endpoint only.
    endpoints: FxHashSet<SocketAddr>,
    /// The header as sent, for the refusal that says nothing matched.
    raw: String,
}

impl TestSelection {
    /// The selection a header value makes; None when it names nothing (empty, or only
    /// commas and spaces), which leaves the candidates as they were. An entry that is not
    /// an address names no endpoint, as in GIE's filter.
    pub fn parse(value: &str) -> Option<TestSelection> {
        let mut selection = TestSelection {
            hosts: FxHashSet::default(),
            endpoints: FxHashSet::default(),
            raw: value.trim().to_owned(),
        };
        let mut named = false;
        for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            named = true;
            if let Ok(endpoint) = entry.parse::<SocketAddr>() {
                selection.endpoints.insert(endpoint);
            } else if let Ok(host) = entry.trim_matches(['[', ']']).parse::<IpAddr>() {
                selection.hosts.insert(host);
            }
        }
        named.then_some(selection)
    }

    /// Whether the request may go to `endpoint`.
    pub fn admits(&self, endpoint: &SocketAddr) -> bool {
        self.endpoints.contains(endpoint) || self.hosts.contains(&endpoint.ip())
    }
}

impl fmt::Display for TestSelection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 200;
        match self.raw.char_indices().nth(SHOWN) {
            Some((cut, _)) => write!(f, "{}...", &self.raw[..cut]),
            None => f.write_str(&self.raw),
        }
    }
}

/// The `x-conformance-test-served-endpoint` value: the `envoy.lb` metadata's
/// `x-gateway-destination-endpoint-served` string, or GIE's words for what is missing.
pub fn served_report(metadata: Option<&Metadata>) -> String {
    let Some(lb) = metadata.and_then(|m| m.filter_metadata.get(LB_NAMESPACE)) else {
        return "fail: missing envoy lb metadata".to_owned();
    };
    match lb.fields.get(SERVED_KEY).and_then(|v| v.kind.as_ref()) {
        Some(Kind::StringValue(served)) => served.clone(),
        _ => "fail: missing destination endpoint served metadata".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_select_every_port_and_endpoints_one() {
        let selection =
            TestSelection::parse(" 10.0.0.7 , 10.0.0.8:3002,[fd00::1]:3000,fd00::2,[fd00::3],junk")
                .unwrap();
        assert!(selection.admits(&at("10.0.0.7:3000")));
        assert!(selection.admits(&at("10.0.0.7:3004")));
        assert!(selection.admits(&at("10.0.0.8:3002")));
        assert!(!selection.admits(&at("10.0.0.8:3000")));
        assert!(selection.admits(&at("[fd00::1]:3000")));
        assert!(!selection.admits(&at("[fd00::1]:3002")));
        assert!(selection.admits(&at("[fd00::2]:9")));
        assert!(selection.admits(&at("[fd00::3]:9")));
        assert!(!selection.admits(&at("10.0.0.9:3000")));
    }

    #[test]
    fn a_header_naming_nothing_selects_nothing() {
        for empty in ["", " ", ",", " , ,"] {
            assert!(TestSelection::parse(empty).is_none(), "{empty:?}");
        }
        let junk = TestSelection::parse("pod-a").unwrap();
        assert!(!junk.admits(&at("10.0.0.7:3000")));
    }

    #[test]
    fn the_served_report_says_what_is_missing() {
        use envoy_types::pb::google::protobuf::{Struct, Value};
        assert_eq!(served_report(None), "fail: missing envoy lb metadata");
        let mut metadata = Metadata::default();
        metadata
            .filter_metadata
            .insert(LB_NAMESPACE.into(), Struct::default());
        assert_eq!(
            served_report(Some(&metadata)),
            "fail: missing destination endpoint served metadata"
        );
        let served = Value {
            kind: Some(Kind::StringValue("10.0.0.7:3000".into())),
        };
        metadata
            .filter_metadata
            .get_mut(LB_NAMESPACE)
            .unwrap()
            .fields
            .insert(SERVED_KEY.into(), served);
        assert_eq!(served_report(Some(&metadata)), "10.0.0.7:3000");
    }
}
