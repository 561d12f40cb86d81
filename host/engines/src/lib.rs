//! The engines behind the workers, as any host that embeds the router needs them: the
//! HTTP client that talks to engines and its TLS (`client`, `tls`), what an upstream
//! failure is and how it is logged and counted (`upstream`), health checks (`health`)
//! and the engines' own load scraped from their metrics (`engine_metrics`). Nothing here
//! serves HTTP: `switchyard-serve` is one host over this layer, an embedding one another.

pub mod client;
pub mod engine_metrics;
pub mod health;
pub mod tls;
pub mod upstream;

pub use client::{ClientError, EngineClients};
pub use upstream::describe;
