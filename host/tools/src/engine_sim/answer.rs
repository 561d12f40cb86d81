//! The simulated engine's answers: whole, or streamed one token at a time, in the chat or
//! completions form of the request.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::IntoResponse;
use serde_json::{json, Value};

use super::disaggregation;
use super::{Engine, FailMode, Occupancy};
use crate::serve::frontend::prompt::{Endpoint, Prompt};

/// The whole answer after prefill and every token; a prefill engine keeps the KV for its
/// decode engine to pull.
pub(super) async fn answer_whole(
    engine: &Engine,
    prompt: &Prompt,
    handoff: disaggregation::Handoff,
    chunk: Chunk,
    mut occupancy: Occupancy,
    (prefill, tokens): (Duration, u64),
) -> Value {
    use disaggregation::Handoff;
    let per_token = Duration::from_secs_f64(1.0 / engine.args.decode_tps);
    tokio::time::sleep(prefill).await;
    occupancy.run();
    tokio::time::sleep(per_token * tokens as u32).await;
    drop(occupancy);
    let mut answer = chunk.whole(tokens, prompt.request_blocks);
    match handoff {
        Handoff::VllmPrefill { id } => {
            let params = disaggregation::vllm_params(
                &engine.args.name,
                &id,
                prompt.request_blocks,
                engine.address,
            );
            engine.record(json!({"x-request-id": id, "answered_kv_transfer_params": params}));
            engine.transfers.keep(id, prompt.request_blocks);
            answer["kv_transfer_params"] = params;
        }
        Handoff::SglangPrefill { room } => {
            engine
                .transfers
                .keep(disaggregation::room_id(room), prompt.request_blocks);
        }
        _ => {}
    }
    answer
}

/// The answer as server-sent events, a token per `1 / --decode-tps`.
pub(super) fn answer_streamed(
    engine: &Engine,
    chunk: Chunk,
    mut occupancy: Occupancy,
    (prefill, tokens): (Duration, u64),
) -> impl IntoResponse {
    let per_token = Duration::from_secs_f64(1.0 / engine.args.decode_tps);
    let abort_at = (engine.args.fail == FailMode::AbortMidStream).then_some(tokens / 2);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    tokio::spawn(async move {
        tokio::time::sleep(prefill).await;
        occupancy.run();
        let mut next = tokio::time::Instant::now();
        for i in 0..tokens {
            if abort_at == Some(i) {
                let broken = std::io::Error::other("simulated engine abort mid-stream");
                let _ = tx.send(Err(broken)).await;
                return;
            }
            if tx.send(Ok(chunk.event(i, i + 1 == tokens))).await.is_err() {
                return; // the client went away
            }
            next += per_token;
            tokio::time::sleep_until(next).await;
        }
        let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
}

/// The fixed parts of one answer's chunks.
pub(super) struct Chunk {
    pub(super) endpoint: Endpoint,
    pub(super) id: u64,
    pub(super) created: u64,
    pub(super) model: String,
    pub(super) name: String,
}

impl Chunk {
    /// One SSE event with token `i`.
    fn event(&self, i: u64, last: bool) -> Bytes {
        let text = format!("tok{i} ");
        let finish = if last { json!("length") } else { json!(null) };
        let value = match self.endpoint {
            Endpoint::ChatCompletions => json!({
                "id": format!("chatcmpl-{}", self.id), "object": "chat.completion.chunk",
                "created": self.created, "model": self.model, "system_fingerprint": self.name,
                "choices": [{"index": 0, "delta": if i == 0 { json!({"role": "assistant", "content": text}) } else { json!({"content": text}) }, "finish_reason": finish}],
            }),
            Endpoint::Completions => json!({
                "id": format!("cmpl-{}", self.id), "object": "text_completion",
                "created": self.created, "model": self.model, "system_fingerprint": self.name,
                "choices": [{"index": 0, "text": text, "finish_reason": finish}],
            }),
        };
        Bytes::from(format!("data: {value}\n\n"))
    }

    /// The whole (non-streamed) answer.
    fn whole(&self, tokens: u64, prompt_blocks: u64) -> serde_json::Value {
        let text: String = (0..tokens).map(|i| format!("tok{i} ")).collect();
        let usage = json!({"prompt_tokens": prompt_blocks, "completion_tokens": tokens, "total_tokens": prompt_blocks + tokens});
        match self.endpoint {
            Endpoint::ChatCompletions => json!({
                "id": format!("chatcmpl-{}", self.id), "object": "chat.completion",
                "created": self.created, "model": self.model, "system_fingerprint": self.name,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
                "usage": usage,
            }),
            Endpoint::Completions => json!({
                "id": format!("cmpl-{}", self.id), "object": "text_completion",
                "created": self.created, "model": self.model, "system_fingerprint": self.name,
                "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                "usage": usage,
            }),
        }
    }
}
