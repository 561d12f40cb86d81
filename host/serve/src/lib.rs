//! Network services over the router: the HTTP API, the OpenAI-compatible frontend, and
//! the endpoint picker for Envoy gateways (ext_proc).

pub mod caller;
pub mod errors;
pub mod ext_proc;
pub mod frontend;
pub mod guards;
pub mod http_service;
pub mod listener;
pub mod off_executor;
pub mod parse_errors;
pub mod reload;
pub mod request_attributes;
pub mod socket;
