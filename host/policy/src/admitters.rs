//! Admitters (ABI 1.3, `admission.admitters`): the chain of components that decide,
//! before a request's worker is selected, whether it is served and where it waits while
//! every worker is busy. Built per partition like a policy; called in config order, one
//! thread at a time; the first rejection answers the request. Each admitter sees the
//! priority the ones before it set.
//!
//! Built-ins: `builtin.rate-limit` (token buckets per tenant) and
//! `builtin.strict-priority` (a priority per tenant).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use switchyard_config::{AdmitterOnError, RateLimit};
use switchyard_plugin_host::plugin::{
    AbiRequest, ComponentKind, ErrorBuffer, OwnedParams, PartitionKey, PromptBlocks, RouteRequest,
};
use switchyard_plugin_sdk::{
    Admission, Params, Placement, PolicyError, RequestAdmitter, Saturation, WorkerInputs,
    WorkerSelectionContext,
};

use super::error::BuildError;
use super::pipeline::Stage;
use super::rate_limits::RateLimiter;
use super::registry::{ComponentType, Registry};
use switchyard_plugin_host::plugin::Builtin;

/// One entry of `admission.admitters`, resolved to its type.
pub struct AdmitterUse {
    pub component: Arc<ComponentType>,
    pub params: OwnedParams,
    pub on_error: AdmitterOnError,
}

impl AdmitterUse {
    fn create(&self, partition: &PartitionKey) -> Result<Stage, BuildError> {
        self.component.create(&self.params, partition)
    }
}

/// Why a request is not served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// The admitter that refused (its type name).
    pub admitter: Arc<str>,
    pub status: u16,
    pub retry_after_seconds: u32,
    pub message: String,
}

/// One partition's admitters, in config order.
pub struct Admitters {
    stages: Vec<(Stage, AdmitterOnError)>,
    error: ErrorBuffer,
}

impl Admitters {
    /// Creates every admitter of `uses` for `partition`.
    pub fn build(uses: &[AdmitterUse], partition: &PartitionKey) -> Result<Self, BuildError> {
        let stages = uses
            .iter()
            .map(|u| Ok((u.create(partition)?, u.on_error)))
            .collect::<Result<_, BuildError>>()?;
        Ok(Admitters {
            stages,
            error: ErrorBuffer::new(),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }

    pub fn stages(&self) -> impl Iterator<Item = &Stage> {
        self.stages.iter().map(|(s, _)| s)
    }

    /// Runs the chain for `request` (its `strict_priority` becomes the placement's, for
    /// the admitters after the one that set it, and for the policy). An admitter that
    /// fails answers 503 (`on_error: reject`, the default) or is passed over
    /// (`on_error: admit`); either way it is counted on its stage and logged.
    pub fn admit(
        &mut self,
        request: &RouteRequest,
        prompt: PromptBlocks,
        saturation: &Saturation,
    ) -> Result<Placement, Rejection> {
        request.with_abi(prompt, |raw| self.admit_abi(raw, saturation))
    }

    fn admit_abi(
        &mut self,
        request: &mut AbiRequest<'_>,
        saturation: &Saturation,
    ) -> Result<Placement, Rejection> {
        let mut placement = Placement::default();
        for (stage, on_error) in &mut self.stages {
            match stage.admit(request, saturation, &mut self.error) {
                Ok(Admission::Admit(p)) => {
                    if let Some(priority) = p.priority {
                        placement.priority = Some(priority);
                        request.set_strict_priority(priority);
                    }
                    if p.tenant.is_some() {
                        placement.tenant = p.tenant;
                    }
                    placement.max_wait_ms = match (placement.max_wait_ms, p.max_wait_ms) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                Ok(Admission::Reject {
                    status,
                    retry_after_seconds,
                    message,
                }) => {
                    let message = if message.is_empty() {
                        format!("admitter `{}` refused the request", stage.name)
                    } else {
                        message
                    };
                    return Err(Rejection {
                        admitter: stage.name.clone(),
                        status,
                        retry_after_seconds,
                        message,
                    });
                }
                Err(failure) => {
                    // Logged at the first failure and then at powers of two, so a broken
                    // admitter under load cannot flood the log.
                    let errors = stage.stats.errors();
                    if errors.is_power_of_two() {
                        tracing::error!(admitter = %stage.name, errors, error = %failure, on_error = on_error.as_str(), "an admitter failed");
                    }
                    if *on_error == AdmitterOnError::Reject {
                        return Err(Rejection {
                            admitter: stage.name.clone(),
                            status: 503,
                            retry_after_seconds: 1,
                            message: format!(
                                "admitter `{}` failed ({failure}); the request is refused (its on_error is `reject`)",
                                stage.name
                            ),
                        });
                    }
                }
            }
        }
        Ok(placement)
    }
}

/// Why an `admission.admitters` entry cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AdmitterInvalid {
    #[error("unknown admitter type `{type_name}`. Registered admitters: {}. Load the plugin that provides it under `plugins:`", registered.join(", "))]
    UnknownType {
        type_name: String,
        registered: Vec<String>,
    },
    #[error("`{type_name}` is {}, not an admitter; list it in {}", kind.with_article(), kind.config_place())]
    NotAnAdmitter {
        type_name: String,
        kind: ComponentKind,
    },
    #[error("admitter `{type_name}` (from {origin}) refused its parameters {params}: {error}")]
    Parameters {
        type_name: String,
        origin: String,
        params: String,
        error: Box<BuildError>,
    },
}

/// Resolves one `admission.admitters` entry: the type must be a registered admitter.
pub fn resolve(
    registry: &Registry,
    type_name: &str,
    params: OwnedParams,
    on_error: AdmitterOnError,
) -> Result<AdmitterUse, AdmitterInvalid> {
    let Some(component) = registry.component(type_name) else {
        let registered = registry.names_of(Some(ComponentKind::Admitter));
        return Err(AdmitterInvalid::UnknownType {
            type_name: type_name.to_owned(),
            registered: registered.into_iter().map(str::to_owned).collect(),
        });
    };
    if component.kind != ComponentKind::Admitter {
        return Err(AdmitterInvalid::NotAnAdmitter {
            type_name: type_name.to_owned(),
            kind: component.kind,
        });
    }
    Ok(AdmitterUse {
        component: component.clone(),
        params,
        on_error,
    })
}

pub fn register(registry: &mut Registry) {
    registry.add_builtin_component(
        "builtin.rate-limit",
        ComponentKind::Admitter,
        WorkerInputs::ATTRIBUTES,
        |p, _| {
            Ok(Builtin::Admitter(Box::new(TenantRateLimit::from_params(
                p,
            )?)))
        },
    );
    registry.add_builtin_component(
        "builtin.strict-priority",
        ComponentKind::Admitter,
        WorkerInputs::ATTRIBUTES,
        |p, _| Ok(Builtin::Admitter(Box::new(StrictPriority::from_params(p)?))),
    );
}

/// `builtin.rate-limit`: `{limits: {TENANT: {requests_per_s, request_burst, tokens_per_s,
/// token_burst}, "*": ...}}`, as `admission.rate_limits` but per partition and in the
/// chain's order. Prompt tokens are counted in whole KV blocks (what the request carries
/// to an admitter).
struct TenantRateLimit {
    limits: BTreeMap<String, RateLimit>,
    buckets: RateLimiter,
}

impl TenantRateLimit {
    fn from_params(p: &Params<'_>) -> Result<Self, PolicyError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Shape {
            limits: BTreeMap<String, RateLimit>,
        }
        let shape: Shape = p.deserialize()?;
        for (tenant, limit) in &shape.limits {
            switchyard_config::admission::check_rate(tenant, limit)
                .map_err(|e| PolicyError::failed(format!("`limits.{tenant}`: {e}")))?;
        }
        Ok(TenantRateLimit {
            limits: shape.limits,
            buckets: RateLimiter::default(),
        })
    }
}

impl RequestAdmitter for TenantRateLimit {
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::ATTRIBUTES
    }

    fn admit(
        &mut self,
        context: &WorkerSelectionContext<'_>,
        _: &Saturation,
    ) -> Result<Admission, PolicyError> {
        let tenant = context.attributes().and_then(|a| a.tenant()).unwrap_or("");
        let Some(limit) = self.limits.get(tenant).or_else(|| self.limits.get("*")) else {
            return Ok(Admission::admit());
        };
        let tokens = context.request_blocks() * u64::from(context.block_size());
        Ok(match self.buckets.take(tenant, tokens, limit) {
            Ok(()) => Admission::admit(),
            Err(over) => Admission::too_many(
                over.retry_after.as_secs_f64().ceil().max(1.0) as u32,
                format!(
                    "{} is over its {} rate (builtin.rate-limit); retry in {:.1} s",
                    over.who(),
                    over.what,
                    over.retry_after.as_secs_f64()
                ),
            ),
        })
    }
}

/// `builtin.strict-priority`: `{priorities: {TENANT: N}, default: N, trust_request:
/// bool}`. A listed tenant's requests wait at its priority; others at `default` (when
/// given), or at their own (`x-switchyard-priority`) when `trust_request` is true (the
/// default), else at 0.
struct StrictPriority {
    priorities: BTreeMap<String, i32>,
    default: Option<i32>,
    trust_request: bool,
}

impl StrictPriority {
    fn from_params(p: &Params<'_>) -> Result<Self, PolicyError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Shape {
            #[serde(default)]
            priorities: BTreeMap<String, i32>,
            #[serde(default)]
            default: Option<i32>,
            #[serde(default = "yes")]
            trust_request: bool,
        }
        fn yes() -> bool {
            true
        }
        let shape: Shape = p.deserialize()?;
        Ok(StrictPriority {
            priorities: shape.priorities,
            default: shape.default,
            trust_request: shape.trust_request,
        })
    }
}

impl RequestAdmitter for StrictPriority {
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::ATTRIBUTES
    }

    fn admit(
        &mut self,
        context: &WorkerSelectionContext<'_>,
        _: &Saturation,
    ) -> Result<Admission, PolicyError> {
        let tenant = context.attributes().and_then(|a| a.tenant());
        let listed = tenant.and_then(|t| self.priorities.get(t)).copied();
        let priority = listed
            .or(self.default)
            .or_else(|| (!self.trust_request).then_some(0));
        Ok(Admission::Admit(Placement {
            priority: priority.or(Some(context.strict_priority())),
            ..Placement::default()
        }))
    }
}
