//! A pipeline stage's component: one of the three implementations of
//! [`Component`], held by value so the pipeline's calls dispatch statically (a built-in's
//! call inlines into the stage loop) while the pipeline still sees only the trait.

use switchyard_plugin_sdk::{Admission, Saturation};

use crate::isolation::RemoteInstance;
use crate::plugin::{
    AbiRequest, BuiltinInstance, CallError, Columns, Component, ComponentInstance, ComponentKind,
    ErrorBuffer, Lifecycle, Outcome,
};

/// A component as a stage holds it.
pub enum StageComponent {
    Builtin(BuiltinInstance),
    Plugin(ComponentInstance),
    Isolated(RemoteInstance),
}

impl From<BuiltinInstance> for StageComponent {
    fn from(c: BuiltinInstance) -> Self {
        Self::Builtin(c)
    }
}

impl From<ComponentInstance> for StageComponent {
    fn from(c: ComponentInstance) -> Self {
        Self::Plugin(c)
    }
}

impl From<RemoteInstance> for StageComponent {
    fn from(c: RemoteInstance) -> Self {
        Self::Isolated(c)
    }
}

impl StageComponent {
    /// The isolated instance, if this one runs in another process.
    pub fn isolated(&mut self) -> Option<&mut RemoteInstance> {
        match self {
            Self::Isolated(c) => Some(c),
            _ => None,
        }
    }
}

macro_rules! each {
    ($self:ident, $c:ident => $call:expr) => {
        match $self {
            StageComponent::Builtin($c) => $call,
            StageComponent::Plugin($c) => $call,
            StageComponent::Isolated($c) => $call,
        }
    };
}

impl Component for StageComponent {
    fn kind(&self) -> ComponentKind {
        each!(self, c => c.kind())
    }
    #[inline]
    fn filter(
        &mut self,
        request: &AbiRequest<'_>,
        columns: &Columns<'_>,
        keep: &mut [u8],
        error: &mut ErrorBuffer,
    ) -> Result<(), CallError> {
        each!(self, c => c.filter(request, columns, keep, error))
    }
    #[inline]
    fn score(
        &mut self,
        request: &AbiRequest<'_>,
        columns: &Columns<'_>,
        costs: &mut [f64],
        error: &mut ErrorBuffer,
    ) -> Result<(), CallError> {
        each!(self, c => c.score(request, columns, costs, error))
    }
    #[inline]
    fn pick(
        &mut self,
        request: &AbiRequest<'_>,
        columns: &Columns<'_>,
        error: &mut ErrorBuffer,
    ) -> Result<usize, CallError> {
        each!(self, c => c.pick(request, columns, error))
    }
    fn admit(
        &mut self,
        request: &AbiRequest<'_>,
        saturation: &Saturation,
        error: &mut ErrorBuffer,
    ) -> Result<Admission, CallError> {
        each!(self, c => c.admit(request, saturation, error))
    }
    fn notified(&self) -> bool {
        each!(self, c => c.notified())
    }
    fn notify(
        &mut self,
        event: Lifecycle,
        request: Option<&AbiRequest<'_>>,
        outcome: &Outcome,
        error: &mut ErrorBuffer,
    ) -> Result<(), CallError> {
        each!(self, c => c.notify(event, request, outcome, error))
    }
}
