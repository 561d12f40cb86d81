//! What a request booked through the picker (its gRPC stream or the Envoy module): the
//! lease (freed when dropped), where it went, and the destination header naming it.

use std::collections::HashMap;
use std::net::SocketAddr;

use switchyard_plugin_sdk::WorkerId;

use crate::frontend::{Frontend, Lease};

/// Writes `endpoint` as `ip:port` (`[ip]:port` for IPv6) onto `out`, as its `Display`
/// does: an IPv4 endpoint without `core::fmt`, whose code is the largest a decision would
/// otherwise run, per endpoint named.
fn push_endpoint(out: &mut String, endpoint: SocketAddr) {
    let SocketAddr::V4(v4) = endpoint else {
        use std::fmt::Write;
        let _ = write!(out, "{endpoint}");
        return;
    };
    let mut digits = itoa::Buffer::new();
    for (i, octet) in v4.ip().octets().into_iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        out.push_str(digits.format(octet));
    }
    out.push(':');
    out.push_str(digits.format(v4.port()));
}

/// What a request booked: the lease (freed when dropped) and where it went.
pub(super) struct Booked {
    pub(super) lease: Lease,
    pub(super) worker: WorkerId,
    pub(super) endpoint: SocketAddr,
    /// Where the gateway may retry, best first (`ext_proc.fallback_endpoints`).
    pub(super) fallbacks: Vec<SocketAddr>,
    pub(super) model: String,
    pub(super) prefilled: bool,
    /// A disaggregated model's prefill worker (llm-d's P/D convention: named to the
    /// decode endpoint's sidecar in `x-prefiller-host-port`), booked until the decode
    /// answers (the sidecar prefills first).
    pub(super) prefill: Option<(Lease, SocketAddr)>,
}

impl Booked {
    /// The destination header's value: the endpoint, then the fallbacks, comma-joined.
    pub(super) fn destination(&self) -> String {
        let mut destination = String::with_capacity(22 * (1 + self.fallbacks.len()));
        push_endpoint(&mut destination, self.endpoint);
        for fallback in &self.fallbacks {
            destination.push(',');
            push_endpoint(&mut destination, *fallback);
        }
        destination
    }

    /// The engine answers (the first response body chunk, or the response headers when
    /// no body is sent): prefill is complete, and a disaggregated pair's prefill worker
    /// is done.
    pub(super) fn answering(&mut self) {
        if !self.prefilled {
            self.prefilled = true;
            self.lease.prefill_complete();
        }
        // The decode answers: the sidecar's prefill is over.
        if let Some((mut lease, _)) = self.prefill.take() {
            lease.prefill_complete();
            lease.free();
        }
    }

    /// Envoy retried elsewhere: the load belongs to the endpoint that served (as the
    /// gateway says in the `envoy.lb` metadata, or, from a plain Envoy, in a response
    /// header of the same name its route adds: docs/envoy.md).
    pub(super) fn served_by(&mut self, router: &switchyard_fleet::router::Router, served: &str) {
        let Ok(served) = served.parse::<SocketAddr>() else {
            tracing::warn!(%served, "ext_proc: the gateway's served endpoint is not ip:port; the booking stays");
            return;
        };
        if served == self.endpoint {
            return;
        }
        let models: HashMap<WorkerId, String> = router
            .workers()
            .into_iter()
            .map(|w| (w.id(), w.model))
            .collect();
        let target = router
            .endpoints()
            .into_iter()
            .filter(|(_, endpoint)| *endpoint == served)
            .map(|(id, _)| id)
            .find(|id| models.get(id) == Some(&self.model));
        match target {
            Some(worker) => match router.rebook(self.lease.request_id(), worker) {
                Ok(()) => {
                    router.metrics.record_ext_proc_rebook();
                    self.endpoint = served;
                }
                Err(error) => tracing::warn!(%error, "ext_proc: moving the booking failed"),
            },
            None => {
                tracing::warn!(%served, model = %self.model, "ext_proc: the gateway served the request on an endpoint that is no worker of its model; the booking stays where it was picked")
            }
        }
    }

    /// Envoy could not reach the picked engine: out of the candidates for a cool-down,
    /// as the frontend does on a refused connection (health probes bring it back).
    pub(super) fn engine_failed(&self, frontend: &Frontend) {
        tracing::warn!(worker = self.worker.worker_id, endpoint = %self.endpoint, "ext_proc: Envoy could not reach the engine (upstream connect error); marked unhealthy");
        let cooldown = std::time::Duration::from_millis(frontend.settings().unhealthy_cooldown_ms);
        frontend.router().mark_unhealthy(self.worker, cooldown);
        frontend.router().metrics.record_upstream_error();
    }
}

#[cfg(test)]
mod tests {
    use super::push_endpoint;
    use std::net::SocketAddr;

    #[test]
    fn an_endpoint_is_written_as_its_display_writes_it() {
        for text in [
            "127.0.0.1:8000",
            "0.0.0.0:0",
            "255.255.255.255:65535",
            "10.2.30.144:9",
            "[::1]:8000",
            "[2001:db8::17]:443",
        ] {
            let endpoint: SocketAddr = text.parse().unwrap();
            let mut written = String::from("before,");
            push_endpoint(&mut written, endpoint);
            assert_eq!(written, format!("before,{endpoint}"));
        }
    }
}
