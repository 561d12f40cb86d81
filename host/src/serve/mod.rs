//! Network services over the router: the HTTP API and the OpenAI-compatible frontend.

pub mod frontend;
pub mod http_service;
