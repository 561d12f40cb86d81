//! The Envoy endpoint picker against a client that does not follow the protocol: raw
//! HTTP/2 (the h2 crate) carrying gRPC frames that are not messages, streams that stop
//! before their request headers, more streams than a connection may hold, and header
//! values far past what a gateway sends. Each is answered with a gRPC status that says
//! what was wrong (never `OK`), or refused, within bounded time.

mod support;

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::time::Duration;

use axum::body::Bytes;
use envoy_types::pb::envoy::config::core::v3::HeaderMap;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_request::Request, processing_response::Response, HttpBody, HttpHeaders,
};
use support::envoy::*;
use support::*;

/// `switchyard serve` with one worker of model `demo` and the picker on a port of its
/// own, `ext_proc` settings from `settings` (a YAML flow mapping's inside).
fn picker(dir: &std::path::Path, settings: &str) -> (Process, u16) {
    let port = free_port();
    let config = write_config(
        dir,
        &format!(
            "ext_proc: {{listen: \"127.0.0.1:{port}\"{settings}}}\nworkers:\n  - {{model: demo, worker_id: 1, address: \"{}\"}}\n",
            listening_address()
        ),
    );
    (serve_with_picker(&config, port), port)
}

/// A TCP connection to the picker on `port`, retried while it starts (10 s at most).
async fn tcp(port: u16) -> tokio::net::TcpStream {
    eventually_ok_async(
        "the picker accepts connections",
        Duration::from_secs(10),
        || tokio::net::TcpStream::connect(("127.0.0.1", port)),
    )
    .await
}

/// An HTTP/2 connection to the picker (retried while it starts), driven on a task.
async fn connect(port: u16) -> h2::client::SendRequest<Bytes> {
    let (client, connection) = h2::client::handshake(tcp(port).await).await.unwrap();
    tokio::spawn(connection);
    client
}

/// A `Process` call's request head, as gRPC clients send it.
fn process_call(port: u16) -> axum::http::Request<()> {
    axum::http::Request::builder()
        .method("POST")
        .uri(format!(
            "http://127.0.0.1:{port}/envoy.service.ext_proc.v3.ExternalProcessor/Process"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap()
}

/// Sends `data` on a fresh `Process` stream (then ends it) and returns the call's
/// `grpc-status`, from a trailers-only answer or the trailers; fails after 30 s.
async fn grpc_status_of(
    client: &mut h2::client::SendRequest<Bytes>,
    port: u16,
    data: &[u8],
) -> u32 {
    let mut ready = client.clone().ready().await.unwrap();
    let (response, mut stream) = ready.send_request(process_call(port), false).unwrap();
    stream
        .send_data(Bytes::copy_from_slice(data), true)
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), status_of(response))
        .await
        .expect("the picker answers a malformed stream within 30 s")
}

async fn status_of(response: h2::client::ResponseFuture) -> u32 {
    let response = response.await.unwrap();
    let parse = |headers: &axum::http::HeaderMap| {
        headers
            .get("grpc-status")
            .map(|v| v.to_str().unwrap().parse::<u32>().unwrap())
    };
    if let Some(status) = parse(response.headers()) {
        return status;
    }
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = body.trailers().await.unwrap().expect("trailers");
    parse(&trailers).expect("a grpc-status trailer")
}

/// A gRPC length-prefixed frame: uncompressed, `declared` bytes long, carrying `body`.
fn grpc_frame(declared: u32, body: &[u8]) -> Vec<u8> {
    let mut frame = vec![0];
    frame.extend_from_slice(&declared.to_be_bytes());
    frame.extend_from_slice(body);
    frame
}

const INVALID_ARGUMENT: u32 = 3;
const DEADLINE_EXCEEDED: u32 = 4;
const RESOURCE_EXHAUSTED: u32 = 8;

#[test]
fn malformed_grpc_frames_are_answered_with_an_error_status_not_ok() {
    let dir = tempfile::tempdir().unwrap();
    let (_router, port) = picker(dir.path(), "");
    runtime().block_on(async {
        let mut client = connect(port).await;
        // Field 1 with wire type 7, which protobuf does not have.
        let not_protobuf = grpc_frame(3, &[0x0f, 0xff, 0x01]);
        assert_eq!(
            grpc_status_of(&mut client, port, &not_protobuf).await,
            INVALID_ARGUMENT,
            "bytes that are not a ProcessingRequest"
        );
        // A message declaring 4 GiB - 1 bytes, far over any limit.
        let huge = grpc_frame(u32::MAX, b"abc");
        assert_eq!(
            grpc_status_of(&mut client, port, &huge).await,
            RESOURCE_EXHAUSTED,
            "a frame declaring 4 GiB"
        );
        // A message declaring 100 bytes, the stream ending after 10.
        let truncated = grpc_frame(100, &[0; 10]);
        assert_eq!(
            grpc_status_of(&mut client, port, &truncated).await,
            INVALID_ARGUMENT,
            "a truncated message"
        );
        // The connection still serves a well-formed stream.
        let mut tonic_client = support::envoy::client(port).await;
        let mut envoy = Envoy::open(&mut tonic_client, None).await;
        let body = br#"{"model": "demo", "messages": [{"role": "user", "content": "hi"}]}"#;
        let answer = envoy.request("/v1/chat/completions", None, body, 1).await;
        assert!(matches!(answer, Answer::Picked(_)), "{answer:?}");
    });
}

#[test]
fn a_stream_without_its_request_headers_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let (_router, port) = picker(dir.path(), ", request_headers_timeout_ms: 300");
    runtime().block_on(async {
        let client = connect(port).await;
        let mut ready = client.ready().await.unwrap();
        // The HTTP/2 request head only: no ProcessingRequest ever follows.
        let (response, _stream) = ready.send_request(process_call(port), false).unwrap();
        let status = tokio::time::timeout(Duration::from_secs(30), status_of(response))
            .await
            .expect("a stream that never sends its request headers is ended");
        assert_eq!(status, DEADLINE_EXCEEDED);
    });
}

#[test]
fn a_connection_that_stops_inside_a_header_block_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let (_router, port) = picker(dir.path(), ", request_headers_timeout_ms: 300");
    runtime().block_on(async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tcp(port).await;
        // The preface, empty SETTINGS, then a HEADERS frame of stream 1 without
        // END_HEADERS (a CONTINUATION would have to follow, and nothing else may): the
        // header block never completes. One HPACK byte: `:method: POST` (index 3).
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        bytes.extend_from_slice(&[0, 0, 1, 1, 0, 0, 0, 0, 1, 0x83]);
        tcp.write_all(&bytes).await.unwrap();
        // Whatever the picker sends (its SETTINGS, pings), until it closes the connection.
        let closed = tokio::time::timeout(Duration::from_secs(60), async {
            let mut buffer = [0u8; 4096];
            while tcp.read(&mut buffer).await.is_ok_and(|n| n > 0) {}
        })
        .await;
        assert!(
            closed.is_ok(),
            "a connection stuck inside a header block is held"
        );
    });
}

#[test]
fn a_connection_is_told_how_many_streams_it_may_open() {
    let dir = tempfile::tempdir().unwrap();
    let (_router, port) = picker(dir.path(), ", max_streams_per_connection: 3");
    runtime().block_on(async {
        let tcp = tcp(port).await;
        let (_client, mut connection) = h2::client::handshake(tcp).await.unwrap();
        // The server's SETTINGS arrive as the connection is driven.
        let advertised = tokio::time::timeout(
            Duration::from_secs(10),
            poll_fn(|cx| {
                let _ = Pin::new(&mut connection).poll(cx);
                match connection.max_concurrent_send_streams() {
                    usize::MAX => std::task::Poll::Pending,
                    n => std::task::Poll::Ready(n),
                }
            }),
        )
        .await
        .expect("the picker's SETTINGS limit the streams of a connection");
        assert_eq!(advertised, 3);
    });
}

#[test]
fn a_request_header_of_megabytes_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (_router, port) = picker(dir.path(), "");
    runtime().block_on(async {
        let mut client = support::envoy::client(port).await;
        let mut envoy = Envoy::open(&mut client, None).await;
        let huge = "v".repeat(3 << 20);
        envoy
            .send(Request::RequestHeaders(HttpHeaders {
                headers: Some(HeaderMap {
                    headers: vec![
                        header(":method", "POST"),
                        header(":path", "/v1/chat/completions"),
                        header("x-switchyard-instance", &huge),
                    ],
                }),
                end_of_stream: false,
                ..Default::default()
            }))
            .await;
        let Some(Response::ImmediateResponse(refused)) = envoy.next().await.response else {
            panic!("expected an immediate response");
        };
        assert_eq!(refused.status.unwrap().code, 431);
        let body: serde_json::Value = serde_json::from_slice(&refused.body).unwrap();
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("max_header_bytes"),
            "{body}"
        );
    });
}

#[test]
fn a_message_over_the_message_limit_is_resource_exhausted() {
    let dir = tempfile::tempdir().unwrap();
    let (_router, port) = picker(dir.path(), ", max_message_bytes: 65536");
    runtime().block_on(async {
        let mut client = connect(port).await;
        // A well-formed length prefix of 1 MiB, the bytes following.
        let big = grpc_frame(1 << 20, &vec![0; 1 << 20]);
        assert_eq!(
            grpc_status_of(&mut client, port, &big).await,
            RESOURCE_EXHAUSTED
        );
    });
}

/// A chat request for model `demo` whose message is `size` bytes of text.
fn chat_of(size: usize) -> Vec<u8> {
    serde_json::json!({"model": "demo", "messages": [{"role": "user", "content": "x".repeat(size)}]})
        .to_string()
        .into_bytes()
}

#[test]
fn request_bodies_of_all_streams_together_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let (_router, port) = picker(dir.path(), ", max_buffered_bytes: 65536");
    runtime().block_on(async {
        let mut client = support::envoy::client(port).await;
        // Stream A holds 50 KB of its body, not finished yet.
        let held = chat_of(50_000);
        let (first, rest) = held.split_at(held.len() - 10);
        let mut a = Envoy::open(&mut client, None).await;
        a.send(Request::RequestHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![
                    header(":method", "POST"),
                    header(":path", "/v1/chat/completions"),
                ],
            }),
            ..Default::default()
        }))
        .await;
        let chunk = |body: &[u8], end_of_stream| {
            Request::RequestBody(HttpBody {
                body: body.to_vec(),
                end_of_stream,
                ..Default::default()
            })
        };
        a.send(chunk(first, false)).await;
        // Stream B's 30 KB would pass the 64 KiB all streams may hold: 503, retry later.
        let mut b = Envoy::open(&mut client, None).await;
        let Answer::Refused { status, body } = b
            .request("/v1/chat/completions", None, &chat_of(30_000), 1)
            .await
        else {
            panic!("stream B is refused while A holds the budget");
        };
        assert_eq!(status, 503, "{body}");
        assert!(body.to_string().contains("max_buffered_bytes"), "{body}");
        // A finishes and is picked; its bytes go back, and the next 30 KB is taken.
        a.send(chunk(rest, true)).await;
        let Some(Response::RequestHeaders(_)) = a.next().await.response else {
            panic!("stream A is picked");
        };
        drop(a);
        let mut c = Envoy::open(&mut client, None).await;
        let answer = c
            .request("/v1/chat/completions", None, &chat_of(30_000), 1)
            .await;
        assert!(matches!(answer, Answer::Picked(_)), "{answer:?}");
    });
}
