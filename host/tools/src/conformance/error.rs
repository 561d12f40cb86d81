//! What stops a conformance run before any type is tested.

use std::path::PathBuf;

/// Why `switchyard plugin test` could not test a library (what it found wrong in one is
/// a finding of its report instead).
#[derive(Debug, thiserror::Error)]
pub enum ConformanceError {
    #[error("--params {name}=...: expected a JSON object, got `{found}`")]
    TypeParams { name: String, found: String },
    #[error("--params: expected a JSON object or TYPE={{...}}, got `{0}`")]
    Params(String),
    #[error("--config: {0}")]
    Config(switchyard_config::ConfigError),
    #[error("cannot find this executable: {0}")]
    NoExecutable(std::io::Error),
    #[error("cannot start the test process: {0}")]
    Spawn(std::io::Error),
    #[error("the library could not be loaded: {0}")]
    Refused(String),
    #[error("{}: the test process {how} while loading and registering the library", file.display())]
    Crashed { file: PathBuf, how: String },
    #[error("{}: the library could not be loaded", .0.display())]
    NotLoaded(PathBuf),
    #[error("{flag} {name}{}: the library registers no such type; it registers {}", if *flag == "--params" { "=..." } else { "" }, registered.join(", "))]
    NoSuchType {
        flag: &'static str,
        name: String,
        registered: Vec<String>,
    },
}
