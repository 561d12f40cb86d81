//! Network services over the router: the HTTP API.

pub mod http_service;
