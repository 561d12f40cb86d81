//! The floor under the endpoint picker's CPU per stream: a tonic ext_proc server that
//! answers each message as switchyard's picker does (the same answers, built by the
//! picker's own `messages`, on a one-thread runtime with `TCP_NODELAY`, as the picker's
//! default), and decides nothing: no body parse, no selection, no booking. What it costs
//! per stream is what tonic, h2, prost and the kernel cost for that exchange, which no
//! picker written on them can go under.
//!
//! The benchmark runs it as a child process of its own executable (`--floor-server`), so
//! its CPU is read from /proc like the router's.

use std::collections::VecDeque;
use std::pin::Pin;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use futures_util::{Stream, StreamExt};
use switchyard::serve::ext_proc::messages;
use tonic::{Status, Streaming};

/// The flag that makes the benchmark's executable this server.
pub const FLAG: &str = "--floor-server";
/// What it prints, followed by its port, once it listens.
pub const ANNOUNCE: &str = "ext_proc floor listening on port ";

type Answers = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

struct Floor;

#[tonic::async_trait]
impl ExternalProcessor for Floor {
    type ProcessStream = Answers;

    async fn process(
        &self,
        request: tonic::Request<Streaming<ProcessingRequest>>,
    ) -> Result<tonic::Response<Answers>, Status> {
        // The inbound stream, the answers not sent yet, and the request body so far (the
        // pick answers the request headers only once the body is whole, as switchyard's).
        let state = (request.into_inner(), VecDeque::new(), Vec::new());
        let answers =
            futures_util::stream::unfold(state, |(mut inbound, mut outbox, mut body)| async move {
                loop {
                    if let Some(answer) = outbox.pop_front() {
                        return Some((Ok(answer), (inbound, outbox, body)));
                    }
                    let message = inbound.message().await.ok()??;
                    outbox.extend(answer(message.request?, &mut body));
                }
            });
        Ok(tonic::Response::new(Box::pin(answers)))
    }
}

/// The answers to one message (none to the request headers: they wait for the body).
fn answer(request: Request, body: &mut Vec<u8>) -> Vec<ProcessingResponse> {
    match request {
        Request::RequestHeaders(_) => Vec::new(),
        Request::RequestBody(chunk) => {
            body.extend_from_slice(&chunk.body);
            if !chunk.end_of_stream {
                return Vec::new();
            }
            let mut answers = vec![messages::pick("127.0.0.1:9", None)];
            answers.extend(messages::body(&std::mem::take(body), true, true));
            answers
        }
        Request::RequestTrailers(_) => vec![messages::trailers(true)],
        Request::ResponseHeaders(_) => vec![messages::response_headers()],
        Request::ResponseBody(chunk) => messages::body(&chunk.body, chunk.end_of_stream, false),
        Request::ResponseTrailers(_) => vec![messages::trailers(false)],
    }
}

/// Serves on a free loopback port until killed; announces the port on stdout.
pub fn serve() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        println!("{ANNOUNCE}{}", listener.local_addr().unwrap().port());
        // Each accepted socket with TCP_NODELAY, as the picker sets it.
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(|socket| {
            socket.inspect(|socket| socket.set_nodelay(true).expect("TCP_NODELAY is set"))
        });
        tonic::transport::Server::builder()
            .add_service(ExternalProcessorServer::new(Floor))
            .serve_with_incoming(incoming)
            .await
            .expect("the floor server runs");
    });
}
