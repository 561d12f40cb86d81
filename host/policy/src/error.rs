//! Why a policy instance could not be built: typed from the plugin's refusal up to
//! `Policy::new`, so callers (and tests) match on what happened, not on message text.

use switchyard_plugin_sdk::{PolicyError, Status};

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
