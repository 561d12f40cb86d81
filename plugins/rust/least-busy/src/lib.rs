//! The reference's `least-busy` policy as a switchyard plugin: keep workers with at least
//! N device-resident overlap blocks, cost = active requests, pick the lowest cost (ties
//! to the lowest worker id, so the choice does not depend on candidate order).
//!
//! Registers the policy type `least-busy` and its components standalone as
//! `acme.min-device-overlap`, `acme.active-requests` and `acme.lowest-cost`; and an
//! admitter (ABI 1.3), `acme.shed-when-saturated`: with every worker busy, refuse at once
//! (instead of queueing) the requests below a priority.

use serde::Deserialize;
use switchyard_plugin_sdk::{
    export_plugin, Admission, Params, Partition, Placement, PolicyError, PolicyParts, Registrar,
    RequestAdmitter, Saturation, WorkerCandidate, WorkerCandidates, WorkerFilter, WorkerInputs,
    WorkerPicker, WorkerScorer, WorkerSelectionContext,
};

struct MinimumDeviceOverlapFilter {
    minimum_blocks: f64,
}

impl WorkerFilter for MinimumDeviceOverlapFilter {
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::CACHE
    }
    fn keep(
        &mut self,
        _context: &WorkerSelectionContext<'_>,
        candidate: &WorkerCandidate<'_>,
    ) -> Result<bool, PolicyError> {
        let cache = candidate.cache().ok_or("cache input unavailable")?;
        Ok(f64::from(cache.device_overlap_blocks) >= self.minimum_blocks)
    }
    // The batch form sees every candidate in one call: one tight loop over the column.
    fn keep_batch(
        &mut self,
        _context: &WorkerSelectionContext<'_>,
        candidates: &WorkerCandidates<'_>,
        keep: &mut [bool],
    ) -> Result<(), PolicyError> {
        let device = candidates
            .cache()
            .ok_or("cache input unavailable")?
            .device_overlap_blocks;
        switchyard_plugin_sdk::keep_at_least(device, self.minimum_blocks, keep);
        Ok(())
    }
}

struct ActiveRequestsScorer;

impl WorkerScorer for ActiveRequestsScorer {
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::LOAD
    }
    fn score(
        &mut self,
        _context: &WorkerSelectionContext<'_>,
        candidate: &WorkerCandidate<'_>,
    ) -> Result<f64, PolicyError> {
        let load = candidate.load().ok_or("load input unavailable")?;
        Ok(f64::from(load.active_requests))
    }
    fn score_batch(
        &mut self,
        _context: &WorkerSelectionContext<'_>,
        candidates: &WorkerCandidates<'_>,
        costs: &mut [f64],
    ) -> Result<(), PolicyError> {
        let active = candidates
            .load()
            .ok_or("load input unavailable")?
            .active_requests;
        for (cost, &n) in costs.iter_mut().zip(active) {
            *cost = f64::from(n);
        }
        Ok(())
    }
}

struct LowestCostPicker;

impl WorkerPicker for LowestCostPicker {
    fn pick(
        &mut self,
        _context: &WorkerSelectionContext<'_>,
        candidates: &WorkerCandidates<'_>,
    ) -> Result<usize, PolicyError> {
        // Ties to the lowest worker id: the SDK's helper, also the built-in picker's.
        candidates
            .lowest_cost_row()
            .ok_or_else(|| PolicyError::failed("no eligible worker"))
    }
}

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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FilterParameters {
    #[serde(default)]
    min_blocks: f64,
}

fn non_negative(name: &str, value: f64) -> Result<f64, PolicyError> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(PolicyError::failed(format!(
            "{name} must be a finite non-negative number, got {value}"
        )))
    }
}

fn no_parameters(params: &Params<'_>) -> Result<(), PolicyError> {
    params.reject_unknown_keys(&[])
}

fn register(registrar: &mut Registrar<'_>) -> Result<(), PolicyError> {
    registrar.policy("least-busy", |params| {
        let parameters: PolicyParameters = params.deserialize()?;
        let minimum_blocks = non_negative(
            "min_device_overlap_blocks",
            parameters.min_device_overlap_blocks,
        )?;
        Ok(move |_partition: &Partition<'_>| {
            Ok(PolicyParts::new(
                vec![Box::new(MinimumDeviceOverlapFilter { minimum_blocks })],
                vec![Box::new(ActiveRequestsScorer)],
                Box::new(LowestCostPicker),
            ))
        })
    })?;
    registrar.filter(
        "acme.min-device-overlap",
        WorkerInputs::CACHE,
        |params, _| {
            let parameters: FilterParameters = params.deserialize()?;
            Ok(MinimumDeviceOverlapFilter {
                minimum_blocks: non_negative("min_blocks", parameters.min_blocks)?,
            })
        },
    )?;
    registrar.scorer("acme.active-requests", WorkerInputs::LOAD, |params, _| {
        no_parameters(params)?;
        Ok(ActiveRequestsScorer)
    })?;
    registrar.picker("acme.lowest-cost", WorkerInputs::NONE, |params, _| {
        no_parameters(params)?;
        Ok(LowestCostPicker)
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
