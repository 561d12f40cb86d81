//! Reading a request trace (Mooncake JSONL): one request per line, checked as read.

use super::*;

/// One request of a trace.
#[derive(Clone, Debug, Deserialize)]
pub struct TraceRequest {
    /// Arrival, in milliseconds.
    pub timestamp: u64,
    pub input_length: u64,
    pub output_length: u64,
    /// Prefix block hashes, one per block of `block_size` tokens.
    pub hash_ids: Vec<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("{}: cannot read the trace: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}:{line}: not a trace request: {message}. Each line must be a JSON object with timestamp (ms), input_length, output_length and hash_ids", path.display())]
    Parse {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{}: the trace has no requests", path.display())]
    Empty { path: PathBuf },
    #[error("{}:{line}: timestamps go backwards ({previous} ms, then {found} ms); sort the trace by timestamp", path.display())]
    Unsorted {
        path: PathBuf,
        line: usize,
        previous: u64,
        found: u64,
    },
    #[error("policy `{policy}`: {error}")]
    Route { policy: String, error: RouteError },
    #[error("{0}")]
    Arguments(&'static str),
    #[error("{flag} must be a positive number, got {value}")]
    NotPositive { flag: &'static str, value: f64 },
    #[error("{0}")]
    Config(#[from] switchyard_config::ConfigError),
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Startup(Vec<crate::policy::startup::StartupError>),
    #[error("--policy {name}: no such instance; available: {}", available.join(", "))]
    UnknownPolicy {
        name: String,
        available: Vec<String>,
    },
    #[error("{0}")]
    Router(RouteError),
    #[error("a simulated worker's spec is invalid: {0}")]
    WorkerSpec(serde_json::Error),
    #[error("cannot start the publishers' runtime: {0}")]
    Runtime(std::io::Error),
    #[error("cannot start a simulated worker's publisher: {0}")]
    Publisher(std::io::Error),
    #[error("cannot subscribe to KV events: {0}")]
    Subscribe(std::io::Error),
    #[error("simulated worker {worker}: the router applied {applied} of {published} KV event batches published on {endpoint} within {timeout_secs} s")]
    NotDelivered {
        worker: usize,
        applied: u64,
        published: u64,
        endpoint: String,
        timeout_secs: u64,
    },
    #[error("{}: cannot write the {what}: {source}", path.display())]
    Write {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Reads a JSON-lines trace; blank lines are skipped.
pub fn read_trace(path: &Path) -> Result<Vec<TraceRequest>, ReplayError> {
    let text = std::fs::read_to_string(path).map_err(|source| ReplayError::Read {
        path: path.to_owned(),
        source,
    })?;
    let mut requests: Vec<TraceRequest> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let request: TraceRequest = serde_json::from_str(line).map_err(|e| ReplayError::Parse {
            path: path.to_owned(),
            line: i + 1,
            message: e.to_string(),
        })?;
        if let Some(previous) = requests
            .last()
            .map(|r| r.timestamp)
            .filter(|&p| p > request.timestamp)
        {
            return Err(ReplayError::Unsorted {
                path: path.to_owned(),
                line: i + 1,
                previous,
                found: request.timestamp,
            });
        }
        requests.push(request);
    }
    if requests.is_empty() {
        return Err(ReplayError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(requests)
}
