//! `switchyard send-trace`: sends a request trace (Mooncake JSONL) to an OpenAI-compatible
//! server at the trace's times, as streamed `/v1/completions`, and reports each request's
//! time to first token. What `make bench-peers` replays through each router in front of
//! the same engines; any router (or an engine itself) can be the target.
//!
//! A trace names each prompt's blocks by hash id: equal ids are equal blocks. Each id
//! becomes `block_tokens` tokens' worth of text (4 bytes a token, what routers without a
//! tokenizer and `engine-sim` count; 2,048 bytes at 512 tokens), the same text for the
//! same id, so prompts share exactly the prefixes the trace's requests share. The prompt
//! is cut to the request's `input_length`; `max_tokens` is its `output_length` (capped by
//! `--max-output-tokens`).
//!
//! Bounded: every request has a deadline (`--request-timeout-secs`), the run ends when
//! the last request has, and nothing is retried.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde::Serialize;
use serde_json::json;

use crate::replay::{read_trace, ReplayError, TraceRequest};
use crate::serve::frontend::prompt::BYTES_PER_TOKEN;

/// What `switchyard send-trace` takes.
#[derive(clap::Args, Clone, Debug)]
pub struct SendTraceArgs {
    /// The trace: one JSON object per line with timestamp (ms), input_length,
    /// output_length and hash_ids.
    #[arg(long)]
    pub trace: PathBuf,
    /// The server's base URL, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    pub url: String,
    /// The model every request names.
    #[arg(long, default_value = "demo")]
    pub model: String,
    /// Send only the trace's first N requests.
    #[arg(long)]
    pub requests: Option<usize>,
    /// Arrivals this many times faster than the trace's timestamps.
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Tokens per block of the trace's hash_ids.
    #[arg(long, default_value_t = 512)]
    pub block_tokens: usize,
    /// The most tokens a request asks to generate.
    #[arg(long, default_value_t = 64)]
    pub max_output_tokens: u64,
    /// How long one request may take, from its send to its last byte.
    #[arg(long, default_value_t = 120)]
    pub request_timeout_secs: u64,
    /// Where to write one CSV line per request (arrival, TTFT, total, status).
    #[arg(long)]
    pub csv: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum SendTraceError {
    #[error(transparent)]
    Trace(#[from] ReplayError),
    #[error("--time-scale must be a positive number, found {0}")]
    TimeScale(f64),
    #[error("--url {url}: {message}; give the server's base URL, e.g. http://127.0.0.1:8080")]
    Url { url: String, message: String },
    #[error("cannot start the client's runtime: {0}")]
    Runtime(std::io::Error),
    #[error("{}: cannot write the CSV: {source}", path.display())]
    Csv {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// One request's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Sent {
    /// Its place in the trace.
    pub index: usize,
    /// When it was sent, from the run's start (ms).
    pub sent_ms: f64,
    /// Time to the first generated text (ms); None when it failed first.
    pub ttft_ms: Option<f64>,
    /// Time to its last byte (ms).
    pub total_ms: f64,
    /// The HTTP status, 0 when no answer came; or why it failed.
    pub status: u16,
    pub error: Option<String>,
}

/// The summary `send-trace` prints.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub requests: usize,
    pub failures: usize,
    pub ttft_p50_ms: f64,
    pub ttft_p90_ms: f64,
    pub ttft_p99_ms: f64,
    pub seconds: f64,
}

/// The text of hash id `id`: `bytes` bytes (a multiple of 4), the same for the same id.
fn block_text(id: u64, bytes: usize, out: &mut String) {
    let unit = format!("{id:015x}|");
    let start = out.len();
    while out.len() - start + unit.len() <= bytes {
        out.push_str(&unit);
    }
    while out.len() - start < bytes {
        out.push('.');
    }
}

/// The prompt of one trace request: its blocks' text, cut to its input length.
pub fn prompt_text(request: &TraceRequest, block_tokens: usize) -> String {
    let block_bytes = block_tokens * BYTES_PER_TOKEN;
    let mut text = String::with_capacity(request.hash_ids.len() * block_bytes);
    for &id in &request.hash_ids {
        block_text(id, block_bytes, &mut text);
    }
    let wanted = (request.input_length as usize).saturating_mul(BYTES_PER_TOKEN);
    text.truncate(wanted.min(text.len()));
    text
}

/// The most of one SSE line kept while looking for the first text: a server that never
/// ends a line cannot grow the client without bound.
const MAX_LINE_BYTES: usize = 1 << 20;

/// Whether streamed bytes so far hold a chunk with generated text.
fn has_text(seen: &[u8]) -> bool {
    seen.split(|&b| b == b'\n').any(|line| {
        // The value's first byte must have arrived, and not close an empty string.
        line.starts_with(b"data: {")
            && memfind(line, b"\"text\":\"")
                .is_some_and(|at| line.get(at + 8).is_some_and(|&b| b != b'"'))
    })
}

fn memfind(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Sends one request; its outcome.
async fn send_one(
    client: reqwest::Client,
    url: Arc<str>,
    body: Vec<u8>,
    index: usize,
    started: Instant,
    timeout: Duration,
) -> Sent {
    let sent = Instant::now();
    let mut outcome = Sent {
        index,
        sent_ms: (sent - started).as_secs_f64() * 1e3,
        ttft_ms: None,
        total_ms: 0.0,
        status: 0,
        error: None,
    };
    let result = tokio::time::timeout(timeout, async {
        let response = client
            .post(&*url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        outcome.status = response.status().as_u16();
        if !response.status().is_success() {
            return Err(format!("status {}", outcome.status));
        }
        let mut stream = response.bytes_stream();
        // Only what follows the last complete line is kept between chunks.
        let mut seen: Vec<u8> = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| e.to_string())?;
            if outcome.ttft_ms.is_none() {
                seen.extend_from_slice(&chunk);
                if has_text(&seen) {
                    outcome.ttft_ms = Some(sent.elapsed().as_secs_f64() * 1e3);
                    seen = Vec::new();
                } else if let Some(last) = seen.iter().rposition(|&b| b == b'\n') {
                    seen.drain(..=last);
                }
                if seen.len() > MAX_LINE_BYTES {
                    return Err(format!(
                        "an answer line went past {MAX_LINE_BYTES} bytes with no text"
                    ));
                }
            }
        }
        Ok(())
    })
    .await;
    outcome.total_ms = sent.elapsed().as_secs_f64() * 1e3;
    outcome.error = match result {
        Err(_) => Some(format!("no answer within {} s", timeout.as_secs())),
        Ok(Err(e)) => Some(e),
        Ok(Ok(())) if outcome.ttft_ms.is_none() => Some("the answer had no text".into()),
        Ok(Ok(())) => None,
    };
    outcome
}

/// Sends the trace's requests at their (scaled) times; every request's outcome, in
/// trace order.
pub async fn send(args: &SendTraceArgs) -> Result<Vec<Sent>, SendTraceError> {
    if !(args.time_scale > 0.0 && args.time_scale.is_finite()) {
        return Err(SendTraceError::TimeScale(args.time_scale));
    }
    let base = reqwest::Url::parse(&args.url).map_err(|e| SendTraceError::Url {
        url: args.url.clone(),
        message: e.to_string(),
    })?;
    if !matches!(base.scheme(), "http" | "https") {
        return Err(SendTraceError::Url {
            url: args.url.clone(),
            message: format!("the scheme is `{}`, not http or https", base.scheme()),
        });
    }
    let mut trace = read_trace(&args.trace)?;
    if let Some(n) = args.requests {
        trace.truncate(n);
    }
    let url: Arc<str> = format!("{}/v1/completions", args.url.trim_end_matches('/')).into();
    switchyard_engines::tls::install_default_provider();
    let client = reqwest::Client::builder()
        .build()
        .map_err(|e| SendTraceError::Url {
            url: args.url.clone(),
            message: format!("cannot build a client: {e}"),
        })?;
    let timeout = Duration::from_secs(args.request_timeout_secs);
    let first = trace.first().map_or(0, |r| r.timestamp);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(trace.len());
    for (index, request) in trace.iter().enumerate() {
        let at =
            Duration::from_secs_f64((request.timestamp - first) as f64 / 1e3 / args.time_scale);
        // Bodies are made just before they are due: a 40k-token prompt is 160 KB.
        tokio::time::sleep_until((started + at).into()).await;
        let body = serde_json::to_vec(&json!({
            "model": args.model,
            "prompt": prompt_text(request, args.block_tokens),
            "max_tokens": request.output_length.clamp(1, args.max_output_tokens.max(1)),
            "stream": true,
        }))
        .expect("a JSON object serializes");
        tasks.push(tokio::spawn(send_one(
            client.clone(),
            url.clone(),
            body,
            index,
            started,
            timeout,
        )));
    }
    let mut sent = Vec::with_capacity(tasks.len());
    for (index, task) in tasks.into_iter().enumerate() {
        sent.push(task.await.unwrap_or_else(|e| Sent {
            index,
            sent_ms: 0.0,
            ttft_ms: None,
            total_ms: 0.0,
            status: 0,
            error: Some(format!("the request's task failed: {e}")),
        }));
    }
    if let Some(path) = &args.csv {
        write_csv(path, &sent)?;
    }
    Ok(sent)
}

/// `--csv`: a row per request.
fn write_csv(path: &std::path::Path, sent: &[Sent]) -> Result<(), SendTraceError> {
    let mut text = String::from("index,sent_ms,ttft_ms,total_ms,status,error\n");
    for s in sent {
        text.push_str(&format!(
            "{},{:.3},{},{:.3},{},{}\n",
            s.index,
            s.sent_ms,
            s.ttft_ms.map_or(String::new(), |t| format!("{t:.3}")),
            s.total_ms,
            s.status,
            s.error.as_deref().unwrap_or("").replace([',', '\n'], " ")
        ));
    }
    std::fs::write(path, text).map_err(|source| SendTraceError::Csv {
        path: path.to_owned(),
        source,
    })
}

/// TTFT quantiles over the requests that got text; failures counted.
pub fn summarize(sent: &[Sent]) -> Summary {
    let mut ttfts: Vec<f64> = sent.iter().filter_map(|s| s.ttft_ms).collect();
    ttfts.sort_by(f64::total_cmp);
    let quantile = |q: f64| {
        if ttfts.is_empty() {
            f64::NAN
        } else {
            ttfts[((ttfts.len() - 1) as f64 * q).round() as usize]
        }
    };
    Summary {
        requests: sent.len(),
        failures: sent.iter().filter(|s| s.error.is_some()).count(),
        ttft_p50_ms: quantile(0.5),
        ttft_p90_ms: quantile(0.9),
        ttft_p99_ms: quantile(0.99),
        seconds: sent
            .iter()
            .map(|s| s.sent_ms + s.total_ms)
            .fold(0.0, f64::max)
            / 1e3,
    }
}

/// `switchyard send-trace`: sends the trace, prints the summary as one JSON line.
pub fn run(args: &SendTraceArgs) -> Result<Summary, SendTraceError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(SendTraceError::Runtime)?;
    let sent = runtime.block_on(send(args))?;
    Ok(summarize(&sent))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_hash_ids_give_equal_prefixes_and_the_length_is_the_input_length() {
        let a = TraceRequest {
            timestamp: 0,
            input_length: 1000,
            output_length: 4,
            hash_ids: vec![7, 8],
        };
        let b = TraceRequest {
            hash_ids: vec![7, 9],
            ..a.clone()
        };
        let (ta, tb) = (prompt_text(&a, 512), prompt_text(&b, 512));
        assert_eq!(ta.len(), 4000);
        assert_eq!(ta[..2048], tb[..2048]);
        assert_ne!(ta[2048..], tb[2048..]);
    }

    #[test]
    fn text_is_found_in_a_data_line_and_not_in_an_empty_one() {
        assert!(!has_text(b"data: {\"choices\":[{\"text\":\"\"}]}\n\n"));
        assert!(has_text(b"data: {\"choices\":[{\"text\":\"hi\"}]}\n\n"));
        assert!(!has_text(b"data: [DONE]\n\n"));
        // Cut right after the opening quote: not known yet.
        assert!(!has_text(b"data: {\"choices\":[{\"text\":\""));
    }
}
