//! The floor under `/v1/select`'s CPU per decision: a server on the router's HTTP stack
//! (tokio, hyper, axum) that reads the same request body and answers a fixed pick, and
//! decides nothing: no JSON parse, no block hashing, no KV lookup, no selection. What it
//! costs per request is what that stack and the kernel cost for the exchange, which no
//! decision API written on them can go under.
//!
//! The benchmark runs it as a child process of its own executable (`--floor-server`),
//! pinned like the servers it is compared with, so its CPU is read from /proc as theirs.

use axum::body::Bytes;
use axum::http::header::CONTENT_TYPE;

/// The flag that makes the benchmark's executable this server.
pub const FLAG: &str = "--floor-server";
/// What it prints, followed by its address, once it listens.
pub const ANNOUNCE: &str = "http floor listening on ";

/// Serves on a free loopback port until killed; announces `http://ADDRESS` on stdout.
pub fn serve() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        println!("{ANNOUNCE}http://{}", listener.local_addr().unwrap());
        let pick = |body: Bytes| async move {
            std::hint::black_box(body.len());
            (
                [(CONTENT_TYPE, "application/json")],
                r#"{"worker_id":0,"dp_rank":0}"#,
            )
        };
        let app = axum::Router::new().route("/v1/select", axum::routing::post(pick));
        axum::serve(listener, app)
            .await
            .expect("the floor server runs");
    });
}
