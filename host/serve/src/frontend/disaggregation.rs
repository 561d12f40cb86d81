//! Disaggregated serving (`models.NAME.disaggregation`, docs/disaggregation.md): each
//! request gets a prefill worker and a decode worker, selected by the configured policies
//! in their own partitions and booked separately, in the engine family's own protocol:
//!
//! - vLLM (as its disaggregated proxy does): the prefill worker is asked for one token,
//!   not streamed, with `kv_transfer_params` asking for remote decode; what it answers in
//!   `kv_transfer_params` goes, unchanged, with the original request to the decode worker,
//!   whose answer is relayed. The prefill booking ends with the prefill's answer.
//! - SGLang (as its PD router does): both workers get the request at once with the
//!   prefill worker's `bootstrap_host` and `bootstrap_port` and a fresh `bootstrap_room`;
//!   the decode worker's answer is relayed, the prefill's is read and dropped, and each
//!   booking ends with its own answer.
//!
//! A prefill worker that refuses the connection is marked unhealthy and another is tried
//! (`frontend.connect_retries`); any other prefill failure answers 502 (4xx: the engine's
//! status), and a decode failure is relayed as the aggregated path relays it. Nothing
//! stays booked: each booking is a `Lease`, freed when its answer ends or is dropped.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use switchyard_config::Disaggregation;
use switchyard_fleet::router::{RouteDecision, RouteError, RouteRequest};
use switchyard_plugin_host::plugin::PartitionKey;
use switchyard_plugin_sdk::WorkerId;
use switchyard_plugin_sdk::WorkerType;
use tokio::sync::OwnedSemaphorePermit;

use super::{describe, Frontend, Lease, OpenAiError};
use switchyard_engines::upstream::{Engine, Failure, Phase};

/// Says, once per worker, that a prefill engine answered without `kv_transfer_params`:
/// its engine hands no KV cache over (llama.cpp has no prefill/decode disaggregation; a
/// vLLM started without `--kv-transfer-config` neither), so the decode worker computes
/// the prompt again. The request is still served.
fn transfers_no_kv(worker: WorkerId, model: &str) {
    static TOLD: std::sync::Mutex<Vec<WorkerId>> = std::sync::Mutex::new(Vec::new());
    let mut told = TOLD
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if told.contains(&worker) || told.len() >= 4096 {
        return;
    }
    told.push(worker);
    tracing::warn!(
        worker = worker.worker_id,
        dp_rank = worker.dp_rank,
        model,
        "disaggregation does not apply: the prefill engine answered without kv_transfer_params, so it hands no KV cache to the decode engine, which computes the prompt again (llama.cpp has no prefill/decode disaggregation; vLLM needs --kv-transfer-config). Set `models.{model}.disaggregation: off` for engines that cannot transfer KV"
    );
}

/// One request to serve through a pair.
pub(super) struct Pair {
    /// The request, as one worker would be sent it.
    pub request: super::Upstream,
    /// The `x-request-id` both engines of the pair get, as vLLM's proxies and SGLang's
    /// router send one id to both sides (the KV connector may key the transfer by it).
    pub engine_request_id: String,
}

/// A booked worker of one side of the pair.
struct Side {
    decision: RouteDecision,
    lease: Lease,
    url: String,
}

impl Side {
    fn worker(&self) -> WorkerId {
        WorkerId {
            worker_id: self.decision.worker_id,
            dp_rank: self.decision.dp_rank,
        }
    }
}

/// Why one try at a side found no worker: a routing error (every worker busy among them:
/// the request waits), or another.
enum SideError {
    Route(RouteError),
    Other(OpenAiError),
}

fn bad_gateway(message: String) -> OpenAiError {
    OpenAiError::new(StatusCode::BAD_GATEWAY, "server_error", message)
}

impl Frontend {
    pub(super) async fn serve_pair(
        self: &Arc<Self>,
        mode: Disaggregation,
        pair: Pair,
        slot: OwnedSemaphorePermit,
    ) -> Response {
        let served = match mode {
            Disaggregation::Vllm => self.vllm_pair(&pair, slot).await,
            Disaggregation::Sglang => self.sglang_pair(&pair, slot).await,
            Disaggregation::Off => Err(OpenAiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "an aggregated model was sent down the disaggregated path",
            )),
        };
        served.unwrap_or_else(IntoResponse::into_response)
    }

    /// Selects and books a worker of `role`; while every worker of that side is busy
    /// (`admission:`), the request waits in the side's partition queue, as any request.
    async fn select_side(
        self: &Arc<Self>,
        pair: &Pair,
        role: WorkerType,
        paired: Option<WorkerId>,
    ) -> Result<Side, OpenAiError> {
        let first = self.try_side(pair, role, paired).await;
        let partition = PartitionKey::new(pair.request.prompt.model.clone(), role);
        let waited = self
            .router
            .queued(
                pair.request.described.place(partition),
                first,
                |e: &SideError| matches!(e, SideError::Route(RouteError::Saturated(_))),
                || self.try_side(pair, role, paired),
            )
            .await;
        waited.map_err(|waited| match waited {
            switchyard_fleet::router::Waited::Refused(refusal) => {
                self.router.metrics.record_shed();
                super::refusal_error(&refusal)
            }
            switchyard_fleet::router::Waited::Failed(SideError::Route(e)) => e.into(),
            switchyard_fleet::router::Waited::Failed(SideError::Other(e)) => e,
        })
    }

    /// One try at selecting and booking a worker of `role`, paired with the other side's
    /// worker when that was chosen first (off the executor: plugin code runs).
    async fn try_side(
        self: &Arc<Self>,
        pair: &Pair,
        role: WorkerType,
        paired: Option<WorkerId>,
    ) -> Result<Side, SideError> {
        let frontend = self.clone();
        let (prompt, route) = (pair.request.prompt.clone(), pair.request.route.clone());
        let inline = self.inline_ok(pair.request.body.len(), route.instance.as_deref());
        crate::off_executor::run(inline, move || {
            let id = frontend.next_request_id();
            // The request's side: its role, and the other side's worker once chosen.
            let request = RouteRequest {
                worker_type: role,
                paired,
                ..RouteRequest::clone(&route)
            };
            let decision = frontend
                .router
                .reserve_as(&request, &id)
                .map_err(SideError::Route)?;
            let lease = Lease::new(frontend.router.clone(), id);
            let worker = WorkerId {
                worker_id: decision.worker_id,
                dp_rank: decision.dp_rank,
            };
            let url = frontend.router.worker_url(worker).ok_or_else(|| {
                SideError::Other(OpenAiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "server_error",
                    format!(
                        "{} worker {} of model `{}` has no `url`: give every worker of a disaggregated model the address of its engine",
                        role.as_str(),
                        worker.worker_id,
                        prompt.model
                    ),
                ))
            })?;
            Ok(Side {
                decision,
                lease,
                url,
            })
        })
        .await
        .unwrap_or_else(|e| {
            Err(SideError::Other(OpenAiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                format!("the selection did not finish: {e}"),
            )))
        })
    }

    fn post(&self, side: &Side, pair: &Pair, body: &Map<String, Value>) -> reqwest::RequestBuilder {
        self.clients
            .pooled
            .post(format!(
                "{}{}",
                side.url.trim_end_matches('/'),
                pair.request.endpoint.path()
            ))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("x-request-id", &pair.engine_request_id)
            .timeout(Duration::from_secs(self.settings.request_timeout_secs))
            .body(Value::Object(body.clone()).to_string())
    }

    /// The engine's answer to a prefill it was sent, read whole; retries another prefill
    /// worker when one refuses the connection.
    async fn prefill(
        self: &Arc<Self>,
        pair: &Pair,
        body: &Map<String, Value>,
    ) -> Result<(Side, Value), OpenAiError> {
        let mut refused = 0;
        loop {
            let side = self.select_side(pair, WorkerType::Prefill, None).await?;
            let worker = side.worker();
            let sent = self.post(&side, pair, body).send().await;
            let answer = match sent {
                Err(error) if error.is_connect() && refused < self.settings.connect_retries => {
                    self.router.mark_unhealthy(
                        worker,
                        Duration::from_millis(self.settings.unhealthy_cooldown_ms),
                    );
                    self.router.metrics.record_upstream_retry();
                    tracing::warn!(worker = worker.worker_id, url = %side.url, error = describe(&error), "prefill engine refused the connection; marked unhealthy, selecting another");
                    refused += 1;
                    continue;
                }
                Err(error) => {
                    if error.is_connect() {
                        self.router.mark_unhealthy(
                            worker,
                            Duration::from_millis(self.settings.unhealthy_cooldown_ms),
                        );
                    }
                    self.router.metrics.record_upstream_error();
                    return Err(bad_gateway(format!(
                        "prefill worker {} ({}): {}",
                        worker.worker_id,
                        side.url,
                        describe(&error)
                    )));
                }
                Ok(answer) => answer,
            };
            let status = answer.status();
            let text = read_bounded(answer, MAX_PREFILL_ANSWER)
                .await
                .map_err(|e| {
                    self.router.metrics.record_upstream_error();
                    bad_gateway(format!("prefill worker {}: {e}", worker.worker_id))
                })?;
            if !status.is_success() {
                self.router.metrics.record_upstream_error();
                let status = StatusCode::from_u16(status.as_u16())
                    .ok()
                    .filter(StatusCode::is_client_error)
                    .unwrap_or(StatusCode::BAD_GATEWAY);
                return Err(OpenAiError::new(
                    status,
                    if status == StatusCode::BAD_GATEWAY {
                        "server_error"
                    } else {
                        "invalid_request_error"
                    },
                    format!(
                        "prefill worker {} answered {}: {}",
                        worker.worker_id,
                        answer_status(status),
                        String::from_utf8_lossy(&text)
                            .chars()
                            .take(512)
                            .collect::<String>()
                    ),
                ));
            }
            let answer: Value = serde_json::from_slice(&text).map_err(|e| {
                bad_gateway(format!(
                    "prefill worker {}'s answer is not JSON: {e}",
                    worker.worker_id
                ))
            })?;
            return Ok((side, answer));
        }
    }

    async fn vllm_pair(
        self: &Arc<Self>,
        pair: &Pair,
        slot: OwnedSemaphorePermit,
    ) -> Result<Response, OpenAiError> {
        let original = request_object(&pair.request.body)?;
        let (mut prefill, answer) = match self.prefill(pair, &vllm_prefill_body(&original)).await {
            Ok(done) => done,
            Err(failure) => return self.whole_on_decode(pair, None, failure, slot).await,
        };
        // Its prefill is done once it answered; the booking lasts until the decode worker
        // is chosen (the engine holds the KV meanwhile), so its `on_finished` names the
        // pair.
        prefill.lease.prefill_complete();
        let mut decode_body = original;
        match answer.get("kv_transfer_params").filter(|p| !p.is_null()) {
            Some(params) => {
                decode_body.insert("kv_transfer_params".into(), params.clone());
            }
            None => transfers_no_kv(prefill.worker(), &pair.request.prompt.model),
        }
        let decode = self
            .select_side(pair, WorkerType::Decode, Some(prefill.worker()))
            .await?;
        self.router
            .pair(prefill.lease.request_id(), Some(decode.worker()));
        prefill.lease.free();
        let upstream = self.post(&decode, pair, &decode_body).send().await;
        self.relay_decode(pair, decode, upstream, prefill.decision.worker_id, slot)
            .await
    }

    async fn sglang_pair(
        self: &Arc<Self>,
        pair: &Pair,
        slot: OwnedSemaphorePermit,
    ) -> Result<Response, OpenAiError> {
        let original = request_object(&pair.request.body)?;
        let decode = self.select_side(pair, WorkerType::Decode, None).await?;
        let mut refused = 0;
        loop {
            let chosen = self
                .select_side(pair, WorkerType::Prefill, Some(decode.worker()))
                .await;
            let prefill = match chosen {
                Ok(prefill) => prefill,
                Err(failure) => {
                    return self
                        .whole_on_decode(pair, Some(decode), failure, slot)
                        .await
                }
            };
            let prefill_worker = prefill.worker();
            self.router
                .pair(decode.lease.request_id(), Some(prefill_worker));
            let (body, room) = self.with_bootstrap(&original, &prefill)?;
            // The prefill runs beside the decode; its answer is read and dropped, and its
            // booking ends with it.
            let (failed, prefill_failed) = tokio::sync::oneshot::channel::<reqwest::Error>();
            let (sent, router) = (self.post(&prefill, pair, &body).send(), self.router.clone());
            tokio::spawn(async move {
                let mut prefill = prefill;
                match sent.await.and_then(reqwest::Response::error_for_status) {
                    Ok(answer) => {
                        // Drained, not kept: the answer is not the client's.
                        let mut chunks = answer.bytes_stream();
                        while let Some(Ok(_)) = futures_util::StreamExt::next(&mut chunks).await {}
                        prefill.lease.prefill_complete();
                    }
                    Err(error) => {
                        router.metrics.record_upstream_error();
                        let _ = failed.send(error);
                    }
                }
                prefill.lease.free();
            });
            let upstream = self.post(&decode, pair, &body).send();
            let error = tokio::select! {
                upstream = upstream => {
                    return self.relay_decode(pair, decode, upstream, prefill_worker.worker_id, slot).await
                }
                Ok(error) = prefill_failed => error,
            };
            if error.is_connect() {
                self.router.mark_unhealthy(
                    prefill_worker,
                    Duration::from_millis(self.settings.unhealthy_cooldown_ms),
                );
                if refused < self.settings.connect_retries {
                    // The decode waiting in room `room` is dropped; the pair starts again
                    // with another prefill worker and a fresh room.
                    tracing::warn!(worker = prefill_worker.worker_id, room, error = describe(&error), "prefill engine refused the connection; marked unhealthy, selecting another");
                    self.router.metrics.record_upstream_retry();
                    refused += 1;
                    continue;
                }
            }
            let failure = bad_gateway(format!(
                "prefill worker {} (bootstrap room {room}): {}",
                prefill_worker.worker_id,
                describe(&error)
            ));
            return self
                .whole_on_decode(pair, Some(decode), failure, slot)
                .await;
        }
    }

    /// The prefill side failed with `failure`: with `aggregated_fallback`, a decode
    /// worker (`decode`, or one selected now) serves the request whole; without, the
    /// client gets the failure.
    async fn whole_on_decode(
        self: &Arc<Self>,
        pair: &Pair,
        decode: Option<Side>,
        failure: OpenAiError,
        slot: OwnedSemaphorePermit,
    ) -> Result<Response, OpenAiError> {
        let generation = self.router.generation();
        let models = &generation.config().models;
        let fallback = models
            .get(&pair.request.prompt.model)
            .is_some_and(|m| m.aggregated_fallback);
        drop(generation);
        if !fallback {
            return Err(failure);
        }
        tracing::warn!(model = %pair.request.prompt.model, error = %failure.message, "the prefill side failed; a decode worker serves the request whole (aggregated_fallback)");
        let decode = match decode {
            Some(decode) => {
                self.router.pair(decode.lease.request_id(), None);
                decode
            }
            None => self.select_side(pair, WorkerType::Decode, None).await?,
        };
        let original = request_object(&pair.request.body)?;
        let upstream = self.post(&decode, pair, &original).send().await;
        let mut response = self.relay_decode(pair, decode, upstream, 0, slot).await?;
        response.headers_mut().insert(
            HeaderName::from_static("x-switchyard-prefill-worker"),
            HeaderValue::from_static("none"),
        );
        Ok(response)
    }

    /// The client's body with the prefill worker's bootstrap address and a fresh room.
    fn with_bootstrap(
        &self,
        original: &Map<String, Value>,
        prefill: &Side,
    ) -> Result<(Map<String, Value>, u64), OpenAiError> {
        let url = reqwest::Url::parse(&prefill.url)
            .map_err(|e| bad_gateway(format!("prefill worker url `{}`: {e}", prefill.url)))?;
        let port = self
            .router
            .worker_spec(prefill.worker())
            .and_then(|spec| spec.bootstrap_port)
            .or_else(|| url.port_or_known_default())
            .unwrap_or(8998);
        // SGLang draws rooms below 2^63.
        let room = rand::random::<u64>() >> 1;
        let mut body = original.clone();
        body.insert(
            "bootstrap_host".into(),
            json!(url.host_str().unwrap_or_default()),
        );
        body.insert("bootstrap_port".into(), json!(port));
        body.insert("bootstrap_room".into(), json!(room));
        Ok((body, room))
    }

    /// Relays the decode worker's answer (streamed or whole) as the aggregated path does,
    /// naming both workers in the answer's headers.
    async fn relay_decode(
        self: &Arc<Self>,
        pair: &Pair,
        decode: Side,
        upstream: Result<reqwest::Response, reqwest::Error>,
        prefill_worker: u64,
        slot: OwnedSemaphorePermit,
    ) -> Result<Response, OpenAiError> {
        let worker = decode.worker();
        let engine = Engine {
            worker,
            url: decode.url.clone(),
        };
        let upstream = upstream.map_err(|error| {
            let failure = Failure {
                engine: &engine,
                phase: Phase::Send,
                error: &error,
            };
            failure.record(&self.router, decode.lease.request_id(), "answered 502");
            if error.is_connect() {
                self.router.mark_unhealthy(
                    worker,
                    Duration::from_millis(self.settings.unhealthy_cooldown_ms),
                );
            }
            self.router.metrics.record_upstream_error();
            bad_gateway(format!(
                "decode worker {} ({}): {}",
                worker.worker_id,
                decode.url,
                describe(&error)
            ))
        })?;
        let mut lease = decode.lease;
        lease.hold(slot);
        let mut response = self
            .respond(
                &pair.request.prompt,
                decode.decision,
                lease,
                upstream,
                (pair.request.arrived, engine),
            )
            .await;
        response.headers_mut().insert(
            HeaderName::from_static("x-switchyard-prefill-worker"),
            HeaderValue::from(prefill_worker),
        );
        Ok(response)
    }
}

/// The most a prefill answer may take (it is one token and the KV connector's
/// parameters); a larger one is the engine's failure, not the router's memory.
const MAX_PREFILL_ANSWER: usize = 8 << 20;

/// `answer`'s body, refused past `limit` bytes.
async fn read_bounded(answer: reqwest::Response, limit: usize) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    let mut chunks = answer.bytes_stream();
    while let Some(chunk) = futures_util::StreamExt::next(&mut chunks).await {
        let chunk = chunk.map_err(|e| describe(&e))?;
        if body.len() + chunk.len() > limit {
            return Err(format!("its answer is over {limit} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn answer_status(status: StatusCode) -> String {
    status.as_u16().to_string()
}

/// The client's body as a JSON object (the prompt parser accepted it already).
fn request_object(body: &Bytes) -> Result<Map<String, Value>, OpenAiError> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(object)) => Ok(object),
        _ => Err(OpenAiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "the request body must be a JSON object",
        )),
    }
}

/// vLLM's prefill request: the client's, asking for remote decode, exactly one token
/// (`max_tokens` and `min_tokens` 1, as vllm-router sets them), not streamed
/// (`tests/fixtures/disaggregation/` holds what vllm-router sends).
fn vllm_prefill_body(original: &Map<String, Value>) -> Map<String, Value> {
    let mut body = original.clone();
    body.insert(
        "kv_transfer_params".into(),
        json!({
            "do_remote_decode": true,
            "do_remote_prefill": false,
            "remote_engine_id": null,
            "remote_block_ids": null,
            "remote_host": null,
            "remote_port": null,
        }),
    );
    body.insert("stream".into(), json!(false));
    body.insert("max_tokens".into(), json!(1));
    body.insert("min_tokens".into(), json!(1));
    if body.contains_key("max_completion_tokens") {
        body.insert("max_completion_tokens".into(), json!(1));
    }
    for key in ["stream_options", "min_completion_tokens"] {
        body.remove(key);
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vllm_prefill_body_is_what_vllm_proxy_sends() {
        let original = json!({"model": "m", "stream": true, "max_tokens": 50,
            "max_completion_tokens": 50, "stream_options": {"include_usage": true},
            "min_tokens": 3, "messages": []});
        let Value::Object(original) = original else {
            unreachable!()
        };
        let body = vllm_prefill_body(&original);
        assert_eq!(body["stream"], false);
        assert_eq!(body["max_tokens"], 1);
        assert_eq!(body["max_completion_tokens"], 1);
        assert!(!body.contains_key("stream_options"));
        assert_eq!(body["min_tokens"], 1);
        assert_eq!(body["kv_transfer_params"]["do_remote_decode"], true);
        assert_eq!(body["kv_transfer_params"]["remote_block_ids"], Value::Null);
        assert_eq!(body["messages"], json!([]));
    }
}
