//! The safe component traits: the reference's filter, scorer and picker, each with a
//! per-candidate method and a batch method (the batch method is what crosses the ABI; its
//! default loops over the per-candidate method).

use core::fmt;
use core::ops::BitOr;

use crate::abi::{
    SWITCHYARD_INPUT_ATTRIBUTES, SWITCHYARD_INPUT_CACHE, SWITCHYARD_INPUT_ENGINE,
    SWITCHYARD_INPUT_LABELS, SWITCHYARD_INPUT_LOAD, SWITCHYARD_INPUT_ROUTING,
};
use crate::view::{Outcome, WorkerCandidate, WorkerCandidates, WorkerSelectionContext};

/// The optional input groups a component reads. Request context and worker identity are
/// always available; the host computes a group only when some component declares it, and
/// a component sees only the groups it declared.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WorkerInputs(u32);

impl WorkerInputs {
    pub const NONE: Self = Self(0);
    pub const CACHE: Self = Self(SWITCHYARD_INPUT_CACHE);
    pub const LOAD: Self = Self(SWITCHYARD_INPUT_LOAD);
    pub const ROUTING: Self = Self(SWITCHYARD_INPUT_ROUTING);
    /// Each candidate's labels (ABI 1.1): `WorkerCandidate::label`.
    pub const LABELS: Self = Self(SWITCHYARD_INPUT_LABELS);
    /// The request's attributes (ABI 1.2): `WorkerSelectionContext::attributes`.
    pub const ATTRIBUTES: Self = Self(SWITCHYARD_INPUT_ATTRIBUTES);
    /// Each candidate's engine-reported load and adapters (ABI 1.2):
    /// `WorkerCandidate::engine`, `WorkerCandidate::adapter`.
    pub const ENGINE: Self = Self(SWITCHYARD_INPUT_ENGINE);
    const KNOWN: u32 = SWITCHYARD_INPUT_CACHE
        | SWITCHYARD_INPUT_LOAD
        | SWITCHYARD_INPUT_ROUTING
        | SWITCHYARD_INPUT_LABELS
        | SWITCHYARD_INPUT_ATTRIBUTES
        | SWITCHYARD_INPUT_ENGINE;

    /// Keeps the known bits; unknown bits (from a newer ABI minor) are dropped.
    pub const fn from_bits(bits: u32) -> Self {
        Self(bits & Self::KNOWN)
    }
    pub const fn bits(self) -> u32 {
        self.0
    }
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }
    /// Group names, for summaries and errors: `["CACHE", "LOAD"]`.
    pub fn names(self) -> Vec<&'static str> {
        [
            (Self::CACHE, "CACHE"),
            (Self::LOAD, "LOAD"),
            (Self::ROUTING, "ROUTING"),
            (Self::LABELS, "LABELS"),
            (Self::ATTRIBUTES, "ATTRIBUTES"),
            (Self::ENGINE, "ENGINE"),
        ]
        .into_iter()
        .filter(|(group, _)| self.contains(*group))
        .map(|(_, name)| name)
        .collect()
    }
}

impl BitOr for WorkerInputs {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        self.union(rhs)
    }
}

impl fmt::Debug for WorkerInputs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = self.names();
        if names.is_empty() {
            f.write_str("NONE")
        } else {
            f.write_str(&names.join("|"))
        }
    }
}

/// The lifecycle notifications a component asks for (ABI 1.1).
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct Notifications(u8);

impl Notifications {
    pub const NONE: Self = Self(0);
    /// `Lifecycle::on_selected`.
    pub const SELECTED: Self = Self(1);
    /// `Lifecycle::on_prefill_complete`.
    pub const PREFILL_COMPLETE: Self = Self(2);
    /// `Lifecycle::on_finished`.
    pub const FINISHED: Self = Self(4);
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }
}

impl BitOr for Notifications {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        self.union(rhs)
    }
}

/// What became of the requests a component helped route (ABI 1.1; docs/ABI.md says when
/// each is called). Implement it beside `WorkerFilter` / `WorkerScorer` / `WorkerPicker`
/// and return `Some(self)` from their `lifecycle`; only the notifications `notifications`
/// names are delivered, and a component without any costs the router nothing.
pub trait Lifecycle: Send {
    /// Which notifications to deliver.
    fn notifications(&self) -> Notifications;
    /// The request this instance helped route was booked on `outcome.worker()`; called
    /// before the instance's next selection.
    fn on_selected(
        &mut self,
        _context: &WorkerSelectionContext<'_>,
        _outcome: &Outcome<'_>,
    ) -> Result<(), PolicyError> {
        Ok(())
    }
    /// The request's first token arrived.
    fn on_prefill_complete(&mut self, _outcome: &Outcome<'_>) -> Result<(), PolicyError> {
        Ok(())
    }
    /// The request ended; exactly once per `on_selected`.
    fn on_finished(&mut self, _outcome: &Outcome<'_>) -> Result<(), PolicyError> {
        Ok(())
    }
}

/// An error a component returns; its message reaches the operator through the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyError {
    message: String,
}

impl PolicyError {
    pub fn failed(message: impl Into<String>) -> Self {
        PolicyError {
            message: message.into(),
        }
    }
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for PolicyError {}

impl From<String> for PolicyError {
    fn from(message: String) -> Self {
        PolicyError { message }
    }
}

impl From<&str> for PolicyError {
    fn from(message: &str) -> Self {
        PolicyError::failed(message)
    }
}

/// A hard requirement: keep or reject each host-eligible worker.
pub trait WorkerFilter: Send {
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::NONE
    }
    fn keep(
        &mut self,
        context: &WorkerSelectionContext<'_>,
        candidate: &WorkerCandidate<'_>,
    ) -> Result<bool, PolicyError>;
    /// `keep` is all `true` on entry. Override to process every candidate at once.
    fn keep_batch(
        &mut self,
        context: &WorkerSelectionContext<'_>,
        candidates: &WorkerCandidates<'_>,
        keep: &mut [bool],
    ) -> Result<(), PolicyError> {
        for (row, slot) in keep.iter_mut().enumerate() {
            *slot = self.keep(context, &candidates.row(row))?;
        }
        Ok(())
    }
    /// Its lifecycle notifications, if it wants any (see `Lifecycle`).
    fn lifecycle(&mut self) -> Option<&mut dyn Lifecycle> {
        None
    }
}

/// A preference: one finite cost per worker, lower is better.
pub trait WorkerScorer: Send {
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::NONE
    }
    fn score(
        &mut self,
        context: &WorkerSelectionContext<'_>,
        candidate: &WorkerCandidate<'_>,
    ) -> Result<f64, PolicyError>;
    /// `costs` is all NaN on entry. Override to score every candidate at once.
    fn score_batch(
        &mut self,
        context: &WorkerSelectionContext<'_>,
        candidates: &WorkerCandidates<'_>,
        costs: &mut [f64],
    ) -> Result<(), PolicyError> {
        for (row, cost) in costs.iter_mut().enumerate() {
            *cost = self.score(context, &candidates.row(row))?;
        }
        Ok(())
    }
    /// Its lifecycle notifications, if it wants any (see `Lifecycle`).
    fn lifecycle(&mut self) -> Option<&mut dyn Lifecycle> {
        None
    }
}

/// The final choice: one row of the scored candidates (`candidates.costs()` is present).
pub trait WorkerPicker: Send {
    fn required_worker_inputs(&self) -> WorkerInputs {
        WorkerInputs::NONE
    }
    fn pick(
        &mut self,
        context: &WorkerSelectionContext<'_>,
        candidates: &WorkerCandidates<'_>,
    ) -> Result<usize, PolicyError>;
    /// Its lifecycle notifications, if it wants any (see `Lifecycle`).
    fn lifecycle(&mut self) -> Option<&mut dyn Lifecycle> {
        None
    }
}

/// The components a policy builds for one partition.
pub struct PolicyParts {
    pub filters: Vec<Box<dyn WorkerFilter>>,
    /// Scorers with their weights; the host sums `weight * cost`.
    pub scorers: Vec<(Box<dyn WorkerScorer>, f64)>,
    pub picker: Box<dyn WorkerPicker>,
}

impl PolicyParts {
    pub fn new(
        filters: Vec<Box<dyn WorkerFilter>>,
        scorers: Vec<Box<dyn WorkerScorer>>,
        picker: Box<dyn WorkerPicker>,
    ) -> Self {
        PolicyParts {
            filters,
            scorers: scorers.into_iter().map(|s| (s, 1.0)).collect(),
            picker,
        }
    }
}
