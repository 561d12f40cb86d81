//! `switchyard serve` on a loopback port as a test drives it over HTTP: calls answered
//! with their status and JSON (or text), stopped by PID when dropped.

use std::path::Path;

use serde_json::Value;

use super::{serve_logging, Process};

pub struct Server {
    pub process: Process,
    pub base: String,
}

impl Server {
    pub fn start(config: &Path) -> Server {
        Server::start_logging(config, "warn")
    }

    pub fn start_logging(config: &Path, level: &str) -> Server {
        let process = serve_logging(config, level);
        let base = process.address.clone();
        Server { process, base }
    }

    /// Any call: its status and body (JSON, or the text as a JSON string).
    pub fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let request = ureq::request(method, &format!("{}{path}", self.base));
        let response = match body {
            Some(body) => request
                .set("content-type", "application/json")
                .send_string(body),
            None => request.call(),
        };
        let response = match response {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("{method} {path}: {e}"),
        };
        let status = response.status();
        let text = response.into_string().unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call("POST", path, Some(&body.to_string()))
    }

    /// A POST that must succeed: its answer.
    pub fn ok(&self, path: &str, body: Value) -> Value {
        let (status, value) = self.post(path, body.clone());
        assert!(status < 300, "POST {path} {body} -> {status} {value}");
        value
    }

    /// A DELETE that must succeed.
    pub fn delete(&self, path: &str) {
        let (status, value) = self.call("DELETE", path, None);
        assert!(status < 300, "DELETE {path} -> {status} {value}");
    }

    pub fn metrics(&self) -> String {
        let (status, text) = self.call("GET", "/metrics", None);
        assert_eq!(status, 200);
        text.as_str().unwrap().to_owned()
    }
}
