//! The reference's `least-busy` policy as a switchyard plugin: keep workers with at least
//! N device-resident overlap blocks, cost = active requests, pick the lowest cost (ties
//! to the lowest worker id, so the choice does not depend on candidate order).
//!
//! The filter, scorer and picker are the SDK's [`builtins`](switchyard_plugin_sdk::builtins),
//! the very types the router compiles in as `builtin.least-busy`: the plugin decides as
//! the built-in does, and only the C boundary differs (what the benchmarks compare).
//!
//! Registers the policy type `least-busy` and its components standalone as
//! `acme.min-device-overlap`, `acme.active-requests` and `acme.lowest-cost`; and an
//! admitter (ABI 1.3), `acme.shed-when-saturated`: with every worker busy, refuse at once
//! (instead of queueing) the requests below a priority.

use serde::Deserialize;
use switchyard_plugin_sdk::builtins::{
    finite_non_negative, ActiveRequests, LowestCostByWorkerId, MinDeviceOverlap,
};
use switchyard_plugin_sdk::{
    export_plugin, Admission, Params, Partition, Placement, PolicyError, PolicyParts, Registrar,
    RequestAdmitter, Saturation, WorkerInputs, WorkerSelectionContext,
};

/// Sheds instead of queueing: when every worker of the partition is busy, a request
/// below `keep_priority` is refused at once with `status` and `Retry-After: 1`; the others
/// are admitted to wait, queued as the tenant `lane` when given.
struct ShedWhenSaturated {
    keep_priority: i32,
    status: u16,
    lane: Option<String>,
}

impl RequestAdmitter for ShedWhenSaturated {
    fn admit(
        &mut self,
        context: &WorkerSelectionContext<'_>,
        saturation: &Saturation,
    ) -> Result<Admission, PolicyError> {
        let saturated = saturation.workers > 0 && saturation.busy_workers == saturation.workers;
        if saturated && context.strict_priority() < self.keep_priority {
            return Ok(Admission::Reject {
                status: self.status,
                retry_after_seconds: 1,
                message: format!(
                    "all {} workers are busy; requests below priority {} are shed",
                    saturation.workers, self.keep_priority
                ),
            });
        }
        Ok(Admission::Admit(Placement {
            tenant: self.lane.clone(),
            ..Placement::default()
        }))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ShedParameters {
    #[serde(default)]
    keep_priority: i32,
    #[serde(default = "service_unavailable")]
    status: u16,
    #[serde(default)]
    lane: Option<String>,
}

fn service_unavailable() -> u16 {
    503
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyParameters {
    #[serde(default)]
    min_device_overlap_blocks: f64,
}

fn no_parameters(params: &Params<'_>) -> Result<(), PolicyError> {
    params.reject_unknown_keys(&[])
}

fn register(registrar: &mut Registrar<'_>) -> Result<(), PolicyError> {
    registrar.policy("least-busy", |params| {
        let parameters: PolicyParameters = params.deserialize()?;
        let min_blocks = finite_non_negative(
            "min_device_overlap_blocks",
            parameters.min_device_overlap_blocks,
        )?;
        Ok(move |_partition: &Partition<'_>| {
            Ok(PolicyParts::new(
                vec![Box::new(MinDeviceOverlap::at_least(min_blocks))],
                vec![Box::new(ActiveRequests)],
                Box::new(LowestCostByWorkerId),
            ))
        })
    })?;
    registrar.filter(
        "acme.min-device-overlap",
        WorkerInputs::CACHE,
        |params, _| MinDeviceOverlap::from_params(params),
    )?;
    registrar.scorer("acme.active-requests", WorkerInputs::LOAD, |params, _| {
        no_parameters(params)?;
        Ok(ActiveRequests)
    })?;
    registrar.picker("acme.lowest-cost", WorkerInputs::NONE, |params, _| {
        no_parameters(params)?;
        Ok(LowestCostByWorkerId)
    })?;
    registrar.admitter(
        "acme.shed-when-saturated",
        WorkerInputs::NONE,
        |params, _| {
            let p: ShedParameters = params.deserialize()?;
            if !(400..=599).contains(&p.status) {
                return Err(PolicyError::failed(format!(
                    "status must be an HTTP status from 400 to 599, got {}",
                    p.status
                )));
            }
            Ok(ShedWhenSaturated {
                keep_priority: p.keep_priority,
                status: p.status,
                lane: p.lane,
            })
        },
    )
}

export_plugin! {
    name: "acme-least-busy",
    version: env!("CARGO_PKG_VERSION"),
    vendor: "Acme Corp (switchyard example)",
    register: register,
    types: [
        policy("least-busy"),
        filter("acme.min-device-overlap", WorkerInputs::CACHE),
        scorer("acme.active-requests", WorkerInputs::LOAD),
        picker("acme.lowest-cost", WorkerInputs::NONE),
        admitter("acme.shed-when-saturated", WorkerInputs::NONE),
    ],
}
