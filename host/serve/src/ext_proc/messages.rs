//! The Envoy messages the endpoint picker reads and writes (envoy-types' compiled
//! `external_processor.proto`), as the endpoint-picker protocol of the Gateway API
//! Inference Extension and Envoy's ext_proc filter use them:
//!
//! - the pick travels twice, equal: header `x-gateway-destination-endpoint` (in
//!   `raw_value`: Envoy ignores `value` in some paths and refuses both) and dynamic
//!   metadata `envoy.lb` / `x-gateway-destination-endpoint`, on the request-headers
//!   response, with `clear_route_cache` so a route that depends on the header is chosen
//!   again;
//! - in `FULL_DUPLEX_STREAMED` mode every body response is a `streamed_response` body
//!   mutation, the last with `end_of_stream` (an empty body response is an error to Envoy,
//!   a missing end hangs the request); chunks are kept at or under 64 KiB;
//! - an `ImmediateResponse` always sets its status (otherwise the client sees 200).

use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption, Metadata};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation::Mutation, processing_response::Response, BodyMutation, BodyResponse,
    CommonResponse, HeaderMutation, HeadersResponse, HttpHeaders, ImmediateResponse,
    ProcessingResponse, StreamedBodyResponse, TrailersResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};

/// The header and metadata key of the pick.
pub const DESTINATION: &str = "x-gateway-destination-endpoint";
/// The metadata namespace of the pick and of the served endpoint.
pub const LB_NAMESPACE: &str = "envoy.lb";
/// Where the gateway says which endpoints a request may go to.
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
pub const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
/// Where the gateway says which endpoint actually served (after its retries).
pub const SERVED_KEY: &str = "x-gateway-destination-endpoint-served";
/// The largest body chunk sent back to Envoy.
pub const MAX_CHUNK: usize = 64 * 1024;

/// A header's value: `raw_value` when set (Envoy sends that), else `value`.
pub fn header<'a>(headers: &'a HttpHeaders, name: &str) -> Option<&'a [u8]> {
    headers
        .headers
        .as_ref()?
        .headers
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| {
            if h.raw_value.is_empty() {
                h.value.as_bytes()
            } else {
                &h.raw_value[..]
            }
        })
}

/// The bytes of every header's name and value together (`value` and `raw_value` both).
pub fn headers_size(headers: &HttpHeaders) -> usize {
    headers.headers.as_ref().map_or(0, |map| {
        map.headers
            .iter()
            .map(|h| h.key.len() + h.value.len() + h.raw_value.len())
            .sum()
    })
}

fn metadata_value<'a>(
    metadata: Option<&'a Metadata>,
    namespace: &str,
    key: &str,
) -> Option<&'a Kind> {
    metadata?
        .filter_metadata
        .get(namespace)?
        .fields
        .get(key)?
        .kind
        .as_ref()
}

/// `ip:port` strings of a metadata value that is a list of strings or one comma-joined
/// string (gateways send either).
fn endpoints(kind: &Kind) -> Vec<String> {
    let split = |s: &str| -> Vec<String> {
        s.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };
    match kind {
        Kind::StringValue(s) => split(s),
        Kind::ListValue(list) => list
            .values
            .iter()
            .filter_map(|v| match &v.kind {
                Some(Kind::StringValue(s)) => Some(split(s)),
                _ => None,
            })
            .flatten()
            .collect(),
        _ => Vec::new(),
    }
}

/// The subset hint: None when the gateway sets none, else the endpoints it allows.
pub fn subset(metadata: Option<&Metadata>) -> Option<Vec<String>> {
    metadata_value(metadata, SUBSET_NAMESPACE, SUBSET_KEY).map(endpoints)
}

/// The endpoint that served the request, if the gateway says.
pub fn served(metadata: Option<&Metadata>) -> Option<String> {
    metadata_value(metadata, LB_NAMESPACE, SERVED_KEY)
        .map(endpoints)?
        .into_iter()
        .next()
}

fn string(value: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(value.to_owned())),
    }
}

/// The request-headers response that carries the pick.
/// llm-d's P/D convention: the header its decode sidecar reads the prefill worker from.
pub const PREFILLER: &str = "x-prefiller-host-port";

/// The pick: `endpoint` in the destination header and metadata, and, for a
/// disaggregated model, the prefill worker's `host:port` in [`PREFILLER`].
pub fn pick(endpoint: &str, prefiller: Option<&str>) -> ProcessingResponse {
    let mut inner = Struct::default();
    inner.fields.insert(DESTINATION.into(), string(endpoint));
    let mut metadata = Struct::default();
    metadata.fields.insert(
        LB_NAMESPACE.into(),
        Value {
            kind: Some(Kind::StructValue(inner)),
        },
    );
    ProcessingResponse {
        dynamic_metadata: Some(metadata),
        response: Some(Response::RequestHeaders(HeadersResponse {
            response: Some(CommonResponse {
                header_mutation: Some(HeaderMutation {
                    set_headers: std::iter::once((DESTINATION, endpoint))
                        .chain(prefiller.map(|p| (PREFILLER, p)))
                        .map(|(key, value)| HeaderValueOption {
                            header: Some(HeaderValue {
                                key: key.into(),
                                raw_value: value.as_bytes().to_vec(),
                                ..Default::default()
                            }),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                }),
                clear_route_cache: true,
                ..Default::default()
            }),
        })),
        ..Default::default()
    }
}

/// Body responses passing `body` on unchanged, in chunks of at most `MAX_CHUNK`, the last
/// one carrying `end_of_stream` (an empty body still gets one response).
pub fn body(body: &[u8], end_of_stream: bool, request: bool) -> Vec<ProcessingResponse> {
    let mut chunks: Vec<&[u8]> = body.chunks(MAX_CHUNK).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    let last = chunks.len() - 1;
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, chunk)| {
            let response = BodyResponse {
                response: Some(CommonResponse {
                    body_mutation: Some(BodyMutation {
                        mutation: Some(Mutation::StreamedResponse(StreamedBodyResponse {
                            body: chunk.to_vec(),
                            end_of_stream: end_of_stream && i == last,
                            ..Default::default()
                        })),
                    }),
                    ..Default::default()
                }),
            };
            ProcessingResponse {
                response: Some(if request {
                    Response::RequestBody(response)
                } else {
                    Response::ResponseBody(response)
                }),
                ..Default::default()
            }
        })
        .collect()
}

/// The response-headers response: nothing changed.
pub fn response_headers() -> ProcessingResponse {
    response_headers_with(None)
}

/// The response-headers response: nothing changed, or the one header `set` added.
pub fn response_headers_with(set: Option<(&str, &str)>) -> ProcessingResponse {
    let header_mutation = set.map(|(key, value)| HeaderMutation {
        set_headers: vec![HeaderValueOption {
            header: Some(HeaderValue {
                key: key.into(),
                raw_value: value.as_bytes().to_vec(),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    });
    ProcessingResponse {
        response: Some(Response::ResponseHeaders(HeadersResponse {
            response: Some(CommonResponse {
                header_mutation,
                ..Default::default()
            }),
        })),
        ..Default::default()
    }
}

/// A trailers response: nothing changed.
pub fn trailers(request: bool) -> ProcessingResponse {
    let response = TrailersResponse::default();
    ProcessingResponse {
        response: Some(if request {
            Response::RequestTrailers(response)
        } else {
            Response::ResponseTrailers(response)
        }),
        ..Default::default()
    }
}

/// An immediate (error) response to the client: `status`, a JSON body.
pub fn immediate(
    status: u16,
    json: &serde_json::Value,
    retry_after: Option<u64>,
) -> ProcessingResponse {
    let header = |key: &str, value: &[u8]| HeaderValueOption {
        header: Some(HeaderValue {
            key: key.into(),
            raw_value: value.to_vec(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut set_headers = vec![header("content-type", b"application/json")];
    // Overload and shedding answers say when to come back, as the frontend's do.
    if matches!(status, 429 | 503) {
        let seconds = retry_after.unwrap_or(1).to_string();
        set_headers.push(header("retry-after", seconds.as_bytes()));
    }
    ProcessingResponse {
        response: Some(Response::ImmediateResponse(ImmediateResponse {
            status: Some(HttpStatus {
                code: i32::from(status),
            }),
            headers: Some(HeaderMutation {
                set_headers,
                ..Default::default()
            }),
            body: json.to_string().into_bytes(),
            details: format!("switchyard_endpoint_picker_{status}"),
            ..Default::default()
        })),
        ..Default::default()
    }
}
