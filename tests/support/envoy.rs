//! An Envoy stand-in for the endpoint picker's tests and benchmark: a gRPC client that
//! drives an ext_proc stream exactly as Envoy's filter does in `FULL_DUPLEX_STREAMED`
//! mode (protocol config on the first message, the same filter metadata on every
//! message, request headers, the body in chunks, then the response path).
#![allow(dead_code)]

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation::Mutation, processing_request::Request, processing_response::Response, HttpBody,
    HttpHeaders, ProcessingRequest, ProcessingResponse, ProtocolConfiguration,
};
use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value};
use serde_json::Value as Json;
use tokio::sync::mpsc;
use tonic::transport::Channel;

pub type Client = ExternalProcessorClient<Channel>;

/// Connects to the picker, retrying while it starts (10 s at most).
pub async fn client(port: u16) -> Client {
    super::eventually::eventually_ok_async(
        &format!("the ext_proc service on port {port} comes up"),
        Duration::from_secs(10),
        || ExternalProcessorClient::connect(format!("http://127.0.0.1:{port}")),
    )
    .await
}

pub fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.into())),
    }
}

pub fn metadata(namespace: &str, key: &str, value: Value) -> Metadata {
    let mut inner = Struct::default();
    inner.fields.insert(key.into(), value);
    let mut metadata = Metadata::default();
    metadata.filter_metadata.insert(namespace.into(), inner);
    metadata
}

pub fn subset_hint(endpoints: &[&str]) -> Metadata {
    let list = ListValue {
        values: endpoints.iter().map(|e| string(e)).collect(),
    };
    metadata(
        "envoy.lb.subset_hint",
        "x-gateway-destination-endpoint-subset",
        Value {
            kind: Some(Kind::ListValue(list)),
        },
    )
}

pub fn served(endpoint: &str) -> Metadata {
    metadata(
        "envoy.lb",
        "x-gateway-destination-endpoint-served",
        string(endpoint),
    )
}

/// What the picker answered a request with.
#[derive(Debug)]
pub enum Answer {
    Picked(String),
    Refused { status: i32, body: Json },
}

/// One HTTP request's ext_proc stream, driven as Envoy drives it.
pub struct Envoy {
    to_picker: Option<mpsc::Sender<ProcessingRequest>>,
    from_picker: tonic::Streaming<ProcessingResponse>,
    /// Envoy attaches the same filter metadata to every message.
    metadata: Option<Metadata>,
    first: bool,
    /// The headers the last pick set besides the destination (llm-d's P/D prefiller).
    pub pick_headers: Vec<(String, String)>,
}

impl Envoy {
    pub async fn open(client: &mut Client, metadata: Option<Metadata>) -> Envoy {
        Envoy::open_with_key(client, metadata, None).await.unwrap()
    }

    /// A stream whose gRPC metadata carries `authorization: Bearer KEY`, as Envoy's
    /// `grpc_service.initial_metadata` sends it; the picker's refusal if it refuses.
    pub async fn open_with_key(
        client: &mut Client,
        metadata: Option<Metadata>,
        key: Option<&str>,
    ) -> Result<Envoy, tonic::Status> {
        let (to_picker, outbound) = mpsc::channel(16);
        let mut request =
            tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(outbound));
        if let Some(key) = key {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {key}").parse().unwrap());
        }
        let from_picker = client.process(request).await?.into_inner();
        Ok(Envoy {
            to_picker: Some(to_picker),
            from_picker,
            metadata,
            first: true,
            pick_headers: Vec::new(),
        })
    }

    pub async fn send(&mut self, request: Request) {
        let protocol_config = std::mem::take(&mut self.first).then(|| ProtocolConfiguration {
            request_body_mode: BodySendMode::FullDuplexStreamed as i32,
            response_body_mode: BodySendMode::FullDuplexStreamed as i32,
            ..Default::default()
        });
        let message = ProcessingRequest {
            metadata_context: self.metadata.clone(),
            protocol_config,
            request: Some(request),
            ..Default::default()
        };
        self.to_picker
            .as_ref()
            .unwrap()
            .send(message)
            .await
            .unwrap();
    }

    pub async fn next(&mut self) -> ProcessingResponse {
        tokio::time::timeout(Duration::from_secs(10), self.from_picker.message())
            .await
            .expect("the picker answers within 10 s")
            .expect("the stream is healthy")
            .expect("the picker did not end the stream")
    }

    /// The pick in the request headers answer, checked: header and metadata equal,
    /// route cache cleared, only the destination (and llm-d's prefiller) set.
    fn checked_pick(
        &mut self,
        headers: envoy_types::pb::envoy::service::ext_proc::v3::HeadersResponse,
        metadata: Option<Struct>,
    ) -> String {
        let common = headers.response.unwrap();
        assert!(common.clear_route_cache);
        let set = common.header_mutation.unwrap().set_headers;
        assert!(!set.is_empty(), "{set:?}");
        self.pick_headers = set[1..]
            .iter()
            .map(|h| h.header.clone().unwrap())
            .map(|h| (h.key, String::from_utf8(h.raw_value).unwrap()))
            .collect();
        assert!(
            self.pick_headers
                .iter()
                .all(|(k, _)| k == "x-prefiller-host-port"),
            "only the destination, and llm-d's prefiller for P/D: {set:?}"
        );
        let header = set[0].header.clone().unwrap();
        assert_eq!(header.key, "x-gateway-destination-endpoint");
        assert!(header.value.is_empty(), "raw_value only, never both");
        let in_header = String::from_utf8(header.raw_value).unwrap();
        let metadata = metadata.unwrap();
        let Some(Kind::StructValue(lb)) = &metadata.fields["envoy.lb"].kind else {
            panic!("envoy.lb must be a struct: {metadata:?}");
        };
        let Some(Kind::StringValue(in_metadata)) =
            &lb.fields["x-gateway-destination-endpoint"].kind
        else {
            panic!("the metadata pick must be a string: {lb:?}");
        };
        assert_eq!(&in_header, in_metadata, "header and metadata must agree");
        in_header
    }

    /// The request body the picker passed back, whole.
    async fn echoed_body(&mut self) -> Vec<u8> {
        let mut echoed = Vec::new();
        loop {
            let Some(Response::RequestBody(body)) = self.next().await.response else {
                panic!("expected request body answers");
            };
            let Some(Mutation::StreamedResponse(chunk)) =
                body.response.unwrap().body_mutation.unwrap().mutation
            else {
                panic!("full-duplex body answers are streamed responses");
            };
            echoed.extend_from_slice(&chunk.body);
            if chunk.end_of_stream {
                break;
            }
        }
        echoed
    }

    /// Request headers, then `body` in `chunks` pieces; the pick (checked: header and
    /// metadata equal, route cache cleared, the body passed back whole) or the refusal.
    pub async fn request(
        &mut self,
        path: &str,
        instance: Option<&str>,
        body: &[u8],
        chunks: usize,
    ) -> Answer {
        let mut headers = vec![
            header(":method", "POST"),
            header(":path", path),
            header("content-type", "application/json"),
        ];
        if let Some(instance) = instance {
            headers.push(header("x-switchyard-instance", instance));
        }
        self.send(Request::RequestHeaders(HttpHeaders {
            headers: Some(HeaderMap { headers }),
            end_of_stream: false,
            ..Default::default()
        }))
        .await;
        let size = body.len().div_ceil(chunks).max(1);
        let pieces: Vec<&[u8]> = body.chunks(size).collect();
        for (i, piece) in pieces.iter().enumerate() {
            self.send(Request::RequestBody(HttpBody {
                body: piece.to_vec(),
                end_of_stream: i + 1 == pieces.len(),
                ..Default::default()
            }))
            .await;
        }
        let first = self.next().await;
        let picked = match first.response {
            Some(Response::RequestHeaders(headers)) => {
                self.checked_pick(headers, first.dynamic_metadata)
            }
            Some(Response::ImmediateResponse(immediate)) => {
                return Answer::Refused {
                    status: immediate.status.unwrap().code,
                    body: serde_json::from_slice(&immediate.body).unwrap(),
                }
            }
            other => panic!("expected the request headers answer, got {other:?}"),
        };
        let echoed = self.echoed_body().await;
        assert_eq!(echoed, body, "the body goes upstream unchanged");
        Answer::Picked(picked)
    }

    /// The response path: headers (with the served endpoint), then body chunks; each is
    /// answered, the body passed back unchanged.
    pub async fn response_headers(&mut self, served_by: Option<&str>) {
        if let Some(endpoint) = served_by {
            self.metadata = Some(served(endpoint));
        }
        self.send(Request::ResponseHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![
                    header(":status", "200"),
                    header("content-type", "text/event-stream"),
                ],
            }),
            ..Default::default()
        }))
        .await;
        assert!(matches!(
            self.next().await.response,
            Some(Response::ResponseHeaders(_))
        ));
    }

    pub async fn response_chunk(&mut self, data: &[u8], end_of_stream: bool) {
        self.send(Request::ResponseBody(HttpBody {
            body: data.to_vec(),
            end_of_stream,
            ..Default::default()
        }))
        .await;
        let Some(Response::ResponseBody(body)) = self.next().await.response else {
            panic!("expected a response body answer");
        };
        let Some(Mutation::StreamedResponse(chunk)) =
            body.response.unwrap().body_mutation.unwrap().mutation
        else {
            panic!("full-duplex body answers are streamed responses");
        };
        assert_eq!(chunk.body, data);
        assert_eq!(chunk.end_of_stream, end_of_stream);
    }

    /// Envoy half-closes after the last response.
    pub fn half_close(&mut self) {
        self.to_picker = None;
    }
}

pub fn header(key: &str, value: &str) -> HeaderValue {
    HeaderValue {
        key: key.into(),
        raw_value: value.as_bytes().to_vec(),
        ..Default::default()
    }
}
