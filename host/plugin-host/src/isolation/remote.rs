//! Isolated instances as the pipeline sees them: a [`RemoteInstance`] per stage, calling
//! through a shared-memory [`Channel`] into its process. The stages of one policy that
//! live in the same process share one channel (they are called by one thread at a time),
//! so a request's columns are copied into it once, and one call thread serves them all.
//!
//! Instances are rebuilt in every new incarnation of their process from their
//! [`BuildUnit`]'s recipe (a component type, or a policy type for a partition).

use std::sync::Arc;

use switchyard_plugin_sdk::{Admission, Saturation, WorkerInputs};

use super::channel::{refused, Answer, Channel, InstanceSlot, Target};
use super::control::{Part, Partition, Reply, Request};
use super::supervisor::IsolatedProcess;
use crate::plugin::shared_call::{Extra, Op};
use crate::plugin::{
    AbiRequest, CallError, Columns, Component, ComponentKind, ErrorBuffer, Lifecycle, Outcome,
    OwnedParams, PartitionKey, Status,
};

/// How a set of instances is made, so that a new incarnation can make them again.
pub enum Recipe {
    Component {
        type_name: String,
        params: OwnedParams,
        partition: PartitionKey,
    },
    Policy {
        type_name: String,
        params: OwnedParams,
        partition: PartitionKey,
        /// Every component type the router has (for `add_registered`).
        registered: Vec<String>,
    },
}

/// The instances one recipe made in the process (destroyed there when dropped).
pub struct BuildUnit {
    process: Arc<IsolatedProcess>,
    recipe: Recipe,
    /// One per component the recipe makes in the process, in order.
    slots: Vec<Arc<InstanceSlot>>,
}

/// A component a policy build made, as the pipeline needs it.
pub enum BuiltPart {
    Own(RemoteInstance, f64),
    /// A registered type the router must create (a built-in, or another process's).
    Registered {
        type_name: String,
        params: String,
        weight: f64,
    },
}

impl BuildUnit {
    /// Runs the recipe in the current incarnation; the answer's parts.
    fn run(&self) -> Result<(u32, Vec<Part>), CallError> {
        let incarnation = self.process.incarnation();
        let reply = match &self.recipe {
            Recipe::Component {
                type_name,
                params,
                partition,
            } => self.process.request(
                &Request::Create {
                    type_name: type_name.clone(),
                    params: params.json().to_owned(),
                    router: params.router(),
                    partition: Partition::of(partition),
                },
                None,
            )?,
            Recipe::Policy {
                type_name,
                params,
                partition,
                registered,
            } => self.process.request(
                &Request::Build {
                    type_name: type_name.clone(),
                    params: params.json().to_owned(),
                    router: params.router(),
                    partition: Partition::of(partition),
                    registered: registered.clone(),
                },
                None,
            )?,
        };
        match reply {
            Reply::Created { id, notified } => Ok((
                incarnation,
                vec![Part::Own {
                    id,
                    name: String::new(),
                    kind: String::new(),
                    inputs: 0,
                    weight: 0.0,
                    notified,
                }],
            )),
            Reply::Built { parts } => Ok((incarnation, parts)),
            other => Err(refused(other)),
        }
    }

    /// Runs the recipe, again if the process restarted meanwhile (its answer would name
    /// instances of a process that is gone, and the restart's rebuild would not know it).
    fn run_in_current(&self) -> Result<(u32, Vec<Part>), CallError> {
        let mut tries = 0;
        loop {
            let (incarnation, parts) = self.run()?;
            tries += 1;
            if incarnation == self.process.incarnation() || tries == 3 {
                return Ok((incarnation, parts));
            }
        }
    }

    /// Builds the instances again in a new incarnation (same shape, or an error).
    pub(super) fn rebuild(&self) -> Result<(), CallError> {
        let (incarnation, parts) = self.run()?;
        let ids: Vec<u32> = parts
            .iter()
            .filter_map(|p| match p {
                Part::Own { id, .. } => Some(*id),
                Part::Registered { .. } => None,
            })
            .collect();
        if ids.len() != self.slots.len() {
            let message = format!(
                "the rebuilt policy has {} components of its own, not {}",
                ids.len(),
                self.slots.len()
            );
            self.process.tell(&Request::Destroy { ids });
            return Err(CallError::new(Status::Error, message));
        }
        for (slot, id) in self.slots.iter().zip(ids) {
            slot.set(incarnation, id);
        }
        Ok(())
    }
}

impl Drop for BuildUnit {
    fn drop(&mut self) {
        let incarnation = self.process.incarnation();
        let ids: Vec<u32> = self
            .slots
            .iter()
            .filter_map(|s| s.id_in(incarnation))
            .collect();
        if !ids.is_empty() && self.process.is_up() {
            self.process.tell(&Request::Destroy { ids });
        }
    }
}

/// Creates an instance of an isolated component type.
pub fn create_component(
    process: &Arc<IsolatedProcess>,
    name: &str,
    kind: ComponentKind,
    inputs: WorkerInputs,
    params: &OwnedParams,
    partition: &PartitionKey,
) -> Result<RemoteInstance, CallError> {
    let slot = Arc::new(InstanceSlot::default());
    let mut unit = BuildUnit {
        process: process.clone(),
        recipe: Recipe::Component {
            type_name: name.to_owned(),
            params: params.clone(),
            partition: partition.clone(),
        },
        slots: vec![slot.clone()],
    };
    let (incarnation, parts) = unit.run_in_current()?;
    let Some(Part::Own { id, notified, .. }) = parts.into_iter().next() else {
        unit.slots.clear();
        return Err(CallError::new(Status::Error, "no instance was created"));
    };
    slot.set(incarnation, id);
    let unit = Arc::new(unit);
    process.add_unit(&unit);
    Ok(RemoteInstance {
        unit,
        slot,
        name: Arc::from(name),
        kind,
        inputs,
        notified,
        channel: None,
    })
}

/// Validates parameters for an isolated policy type (in its process).
pub fn validate_policy(
    process: &Arc<IsolatedProcess>,
    type_name: &str,
    params: &OwnedParams,
) -> Result<(), CallError> {
    let request = Request::Validate {
        type_name: type_name.to_owned(),
        params: params.json().to_owned(),
        router: params.router(),
    };
    match process.request(&request, None)? {
        Reply::Ok => Ok(()),
        other => Err(refused(other)),
    }
}

/// Builds an isolated policy type for `partition`: its parts in pipeline order.
pub fn build_policy(
    process: &Arc<IsolatedProcess>,
    type_name: &str,
    params: &OwnedParams,
    partition: &PartitionKey,
    registered: Vec<String>,
) -> Result<Vec<BuiltPart>, CallError> {
    let mut unit = BuildUnit {
        process: process.clone(),
        recipe: Recipe::Policy {
            type_name: type_name.to_owned(),
            params: params.clone(),
            partition: partition.clone(),
            registered,
        },
        slots: Vec::new(),
    };
    let (incarnation, parts) = unit.run_in_current()?;
    // Slots first (the unit must hold them all before its instances share it).
    enum Pending {
        Own(Arc<InstanceSlot>, String, ComponentKind, u32, f64, bool),
        Registered(String, String, f64),
    }
    let pending: Vec<Pending> = parts
        .into_iter()
        .map(|part| match part {
            Part::Own {
                id,
                name,
                kind,
                inputs,
                weight,
                notified,
            } => {
                let slot = Arc::new(InstanceSlot::default());
                slot.set(incarnation, id);
                unit.slots.push(slot.clone());
                let kind = ComponentKind::from_name(&kind).ok_or_else(|| {
                    CallError::new(
                        Status::Error,
                        format!("the isolated process built a component of unknown kind `{kind}`"),
                    )
                })?;
                Ok(Pending::Own(slot, name, kind, inputs, weight, notified))
            }
            Part::Registered {
                type_name,
                params,
                weight,
            } => Ok(Pending::Registered(type_name, params, weight)),
        })
        .collect::<Result<_, CallError>>()?;
    let unit = Arc::new(unit);
    process.add_unit(&unit);
    Ok(pending
        .into_iter()
        .map(|p| match p {
            Pending::Own(slot, name, kind, inputs, weight, notified) => BuiltPart::Own(
                RemoteInstance {
                    unit: unit.clone(),
                    slot,
                    name: Arc::from(name.as_str()),
                    kind,
                    inputs: WorkerInputs::from_bits(inputs),
                    notified,
                    channel: None,
                },
                weight,
            ),
            Pending::Registered(type_name, params, weight) => BuiltPart::Registered {
                type_name,
                params,
                weight,
            },
        })
        .collect())
}

/// A component instance living in an isolated process.
pub struct RemoteInstance {
    unit: Arc<BuildUnit>,
    slot: Arc<InstanceSlot>,
    name: Arc<str>,
    kind: ComponentKind,
    inputs: WorkerInputs,
    notified: bool,
    channel: Option<Arc<Channel>>,
}

impl RemoteInstance {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn inputs(&self) -> WorkerInputs {
        self.inputs
    }

    pub fn process(&self) -> &Arc<IsolatedProcess> {
        &self.unit.process
    }

    /// Calls through `channel` from now on (shared with the policy's other stages there).
    pub fn attach(&mut self, channel: Arc<Channel>) {
        self.channel = Some(channel);
    }

    /// One call through this instance's channel (its own, until a policy shares one).
    fn call(
        &mut self,
        op: Op,
        request: Option<&AbiRequest<'_>>,
        columns: Option<&Columns<'_>>,
        extra: Extra<'_>,
        answer: Answer<'_>,
    ) -> Result<(), CallError> {
        let target = Target {
            slot: &self.slot,
            name: &self.name,
            inputs: self.inputs,
        };
        self.channel
            .get_or_insert_with(|| Channel::new(&self.unit.process))
            .call(target, op, request, columns, extra, answer)
    }

    /// A call of another kind is refused here, before it reaches the process: the
    /// child would refuse it too, after a round trip.
    fn called_as(&self, kind: ComponentKind) -> Result<(), CallError> {
        if self.kind == kind {
            Ok(())
        } else {
            Err(kind.wrongly_called(self.kind.as_str()))
        }
    }
}

impl Component for RemoteInstance {
    fn kind(&self) -> ComponentKind {
        self.kind
    }

    fn filter(
        &mut self,
        request: &AbiRequest<'_>,
        columns: &Columns<'_>,
        keep: &mut [u8],
        _error: &mut ErrorBuffer,
    ) -> Result<(), CallError> {
        self.called_as(ComponentKind::Filter)?;
        let answer = Answer::Keep(keep);
        self.call(
            Op::Filter,
            Some(request),
            Some(columns),
            Extra::None,
            answer,
        )
    }

    fn score(
        &mut self,
        request: &AbiRequest<'_>,
        columns: &Columns<'_>,
        costs: &mut [f64],
        _error: &mut ErrorBuffer,
    ) -> Result<(), CallError> {
        self.called_as(ComponentKind::Scorer)?;
        let answer = Answer::Costs(costs);
        self.call(Op::Score, Some(request), Some(columns), Extra::None, answer)
    }

    fn pick(
        &mut self,
        request: &AbiRequest<'_>,
        columns: &Columns<'_>,
        _error: &mut ErrorBuffer,
    ) -> Result<usize, CallError> {
        self.called_as(ComponentKind::Picker)?;
        let mut row = usize::MAX;
        let answer = Answer::Row(&mut row);
        self.call(Op::Pick, Some(request), Some(columns), Extra::None, answer)?;
        if row == usize::MAX {
            return Err(CallError::new(
                Status::OutOfRange,
                "the picker returned OK without writing a row to *out_row",
            ));
        }
        Ok(row)
    }

    fn admit(
        &mut self,
        request: &AbiRequest<'_>,
        saturation: &Saturation,
        _error: &mut ErrorBuffer,
    ) -> Result<Admission, CallError> {
        self.called_as(ComponentKind::Admitter)?;
        let mut admission = None;
        let answer = Answer::Admission(&mut admission);
        let extra = Extra::Saturation(saturation);
        self.call(Op::Admit, Some(request), None, extra, answer)?;
        admission.ok_or_else(|| CallError::new(Status::Error, "the admitter gave no answer"))
    }

    fn notified(&self) -> bool {
        self.notified
    }

    fn notify(
        &mut self,
        event: Lifecycle,
        request: Option<&AbiRequest<'_>>,
        outcome: &Outcome,
        _error: &mut ErrorBuffer,
    ) -> Result<(), CallError> {
        if !self.notified {
            return Ok(());
        }
        let notification = Extra::Notification(event, outcome);
        self.call(Op::Notify, request, None, notification, Answer::Nothing)
    }
}

/// Gives the isolated stages of one policy one channel per process (the others, built
/// in or in this process, have none to share).
pub fn share_channels<'a>(isolated: impl Iterator<Item = &'a mut RemoteInstance>) {
    let mut channels: Vec<Arc<Channel>> = Vec::new();
    for instance in isolated {
        let process = instance.unit.process.clone();
        let channel = match channels.iter().find(|c| Arc::ptr_eq(&c.process, &process)) {
            Some(channel) => channel.clone(),
            None => {
                let channel = Channel::new(&process);
                channels.push(channel.clone());
                channel
            }
        };
        instance.attach(channel);
    }
}

impl super::supervisor::RebuiltUnit for BuildUnit {
    fn rebuild(&self) -> Result<(), CallError> {
        BuildUnit::rebuild(self)
    }
}
