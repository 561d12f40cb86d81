//! The floor under the frontend's CPU per streamed request: a proxy on the router's HTTP
//! stack (tokio, hyper, axum, reqwest) that passes each chat completion to one engine and
//! relays its body chunk by chunk as it arrives, as the router's relay does, and does
//! nothing else: no parse, no tokens hashed, no selection, no booking, no metrics. What it
//! costs per request is what that stack and the kernel cost to relay the stream, which no
//! proxy written on them can go under.
//!
//! The benchmark runs it as a child process of its own executable (`--floor-server URL`),
//! so its CPU is read from /proc as the router's.

use axum::body::{Body, Bytes};
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// The flag that makes the benchmark's executable this server; the engine's URL follows.
pub const FLAG: &str = "--floor-server";
/// What it prints, followed by its address, once it listens.
pub const ANNOUNCE: &str = "relay floor listening on ";

/// Relays to the engine at `engine` (`http://host:port`) until killed; announces its own
/// `http://ADDRESS` on stdout.
pub fn serve(engine: String) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        println!("{ANNOUNCE}http://{}", listener.local_addr().unwrap());
        switchyard::engines::tls::install_default_provider();
        let client = reqwest::Client::builder()
            .tcp_nodelay(true)
            .build()
            .unwrap();
        let url = format!("{engine}/v1/chat/completions");
        let relay = move |body: Bytes| {
            let (client, url) = (client.clone(), url.clone());
            async move {
                let upstream = client
                    .post(url)
                    .header(CONTENT_TYPE, "application/json")
                    .body(body)
                    .send()
                    .await;
                match upstream {
                    Ok(answer) => Response::builder()
                        .status(answer.status().as_u16())
                        .header(CONTENT_TYPE, "text/event-stream")
                        .body(Body::from_stream(answer.bytes_stream()))
                        .unwrap(),
                    Err(error) => (StatusCode::BAD_GATEWAY, error.to_string()).into_response(),
                }
            }
        };
        let app = axum::Router::new().route("/v1/chat/completions", axum::routing::post(relay));
        axum::serve(listener, app)
            .await
            .expect("the floor server runs");
    });
}
