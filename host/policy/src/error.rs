//! Why a policy instance could not be built (typed from the plugin's refusal up to
//! `Policy::new`) and why a selection failed, so callers (and tests) match on what
//! happened, not on message text.

use std::sync::Arc;

use switchyard_plugin_sdk::{PolicyError, Status, WorkerId};

use switchyard_plugin_host::plugin::CallError;

/// Who refused, and how: a plugin callback's status and message, or a built-in's message.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Refusal {
    #[error(transparent)]
    Plugin(CallError),
    #[error("{0}")]
    Builtin(String),
}

impl Refusal {
    /// The plugin's status, if a plugin refused.
    pub fn status(&self) -> Option<Status> {
        match self {
            Refusal::Plugin(call) => Some(call.status),
            Refusal::Builtin(_) => None,
        }
    }

    /// The refusing code's own message.
    pub fn message(&self) -> &str {
        match self {
            Refusal::Plugin(call) => &call.message,
            Refusal::Builtin(message) => message,
        }
    }
}

impl From<CallError> for Refusal {
    fn from(error: CallError) -> Self {
        Refusal::Plugin(error)
    }
}

impl From<PolicyError> for Refusal {
    fn from(error: PolicyError) -> Self {
        Refusal::Builtin(error.to_string())
    }
}

/// Why an instance's policy was not built.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum BuildError {
    /// The policy type refused the instance's parameters.
    #[error("{refusal}")]
    Validate {
        policy_type: String,
        refusal: Refusal,
    },
    /// The policy type failed to build its components for a partition.
    #[error("{refusal}")]
    Build {
        policy_type: String,
        refusal: Refusal,
    },
    /// A component type failed to create an instance.
    #[error("component `{component}`: {refusal}")]
    Create { component: String, refusal: Refusal },
    #[error("component `{component}` is not a {expected}")]
    WrongKind {
        component: String,
        expected: &'static str,
    },
    #[error("component `{component}` is an admitter: admitters decide before selection and are no pipeline stage; list it under `admission.admitters`")]
    AdmitterInPipeline { component: String },
    #[error("scorer `{component}` has a non-finite weight {weight}")]
    NonFiniteWeight { component: String, weight: f64 },
    #[error("a policy needs exactly one picker; {} {}{}", built_by.as_deref().unwrap_or("it"), if built_by.is_some() { "added " } else { "has " }, match found { 0 => "none".to_owned(), n => n.to_string() })]
    PickerCount {
        found: usize,
        /// The policy type whose build added them, and its library.
        built_by: Option<String>,
    },
}

impl BuildError {
    /// The refusal of plugin or built-in code, when that is why.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            BuildError::Validate { refusal, .. }
            | BuildError::Build { refusal, .. }
            | BuildError::Create { refusal, .. } => Some(refusal),
            _ => None,
        }
    }
}

/// Why a selection failed. Every variant names the component at fault, if any.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SelectError {
    #[error("no eligible worker in the partition")]
    NoCandidates,
    #[error("filter `{component}` rejected every worker")]
    AllFiltered { component: Arc<str> },
    #[error("{kind} `{component}` failed ({}): {message}", status.name())]
    ComponentFailed {
        component: Arc<str>,
        kind: &'static str,
        status: Status,
        message: String,
    },
    #[error("scorer `{component}` gave a non-finite {what} {value} for worker {} (dp_rank {}); scorers must return finite costs", worker.worker_id, worker.dp_rank)]
    NonFiniteCost {
        component: Arc<str>,
        what: &'static str,
        value: f64,
        worker: WorkerId,
    },
    #[error("picker `{component}` returned row {row}, but there are {count} candidates")]
    RowOutOfRange {
        component: Arc<str>,
        row: usize,
        count: usize,
    },
}

impl SelectError {
    /// The component at fault, if a component is.
    pub fn component(&self) -> Option<&str> {
        match self {
            SelectError::NoCandidates => None,
            SelectError::AllFiltered { component }
            | SelectError::ComponentFailed { component, .. }
            | SelectError::NonFiniteCost { component, .. }
            | SelectError::RowOutOfRange { component, .. } => Some(component),
        }
    }
    /// True when the request simply had nowhere to go (not a plugin fault).
    pub fn is_no_worker(&self) -> bool {
        matches!(
            self,
            SelectError::NoCandidates | SelectError::AllFiltered { .. }
        )
    }
}
