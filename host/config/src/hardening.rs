//! What `switchyard check` (and `serve`, at startup) warns about: settings that leave the
//! router open to whoever can reach it. Each warning names the setting and what to do;
//! docs/security.md has the hardened example.

use crate::auth::{readable_by_others, InstanceChoice};
use crate::ConfigSource;

/// The config's security warnings, most serious first.
pub fn warnings(source: &ConfigSource) -> Vec<String> {
    let config = &source.config;
    let auth = &config.auth;
    let mut out = Vec::new();
    if auth.insecure {
        out.push(
            "auth.insecure is on: serve starts on any address without keys; for a lab network only"
                .to_owned(),
        );
    }
    if auth.operators.is_empty() {
        out.push("no operator keys (auth.operators): whoever reaches the port can register workers (and so receive users' prompts), post KV events and reload; serve refuses non-loopback addresses without --insecure".to_owned());
    }
    if auth.clients.is_empty() {
        out.push("no client keys (auth.clients): the inference routes and /v1/select are open to whoever reaches the port".to_owned());
    }
    if config.router.remote_admin && auth.operators.is_empty() {
        out.push(
            "router.remote_admin is on without operator keys: any client may reload the config"
                .to_owned(),
        );
    }
    if config.router.worker_networks.is_empty() {
        out.push("router.worker_networks is empty: a worker may point at any host; list your engines' networks or names".to_owned());
    }
    if config.http.tls.is_none() {
        out.push("http.tls is not set: prompts and keys cross the network in clear text unless TLS ends in front of the router".to_owned());
    }
    if let Some(ext_proc) = &config.ext_proc {
        if ext_proc.tls.as_ref().is_none_or(|t| t.client_ca.is_none()) && auth.clients.is_empty() {
            out.push("ext_proc has neither mutual TLS (ext_proc.tls.client_ca) nor client keys: any gRPC client may ask for picks".to_owned());
        }
        if ext_proc.test_endpoint_selection {
            out.push("ext_proc.test_endpoint_selection is on: each request's `test-epp-endpoint-selection` header chooses its endpoints; for the Inference Extension's conformance tests only, turn it off in production".to_owned());
        }
    }
    if auth.choose_instance == InstanceChoice::Anyone {
        out.push("auth.choose_instance is `anyone`: every client may pick the policy its requests are routed with".to_owned());
    }
    for grant in auth.clients.iter().chain(&auth.operators) {
        if let Some(file) = &grant.key_file {
            let path = source.resolve(file);
            if readable_by_others(&path) {
                out.push(format!(
                    "key file {} (grant `{}`) can be read by other users; chmod 600 it",
                    path.display(),
                    grant.name
                ));
            }
        }
    }
    out
}
