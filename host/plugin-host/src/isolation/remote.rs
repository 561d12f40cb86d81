//! Isolated instances as the pipeline sees them: a [`RemoteInstance`] per stage, calling
//! through a shared-memory [`Channel`] into its process. The stages of one policy that
//! live in the same process share one channel (they are called by one thread at a time),
//! so a request's columns are copied into it once, and one call thread serves them all.
//!
//! Instances are rebuilt in every new incarnation of their process from their
//! [`BuildUnit`]'s recipe (a component type, or a policy type for a partition).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use switchyard_plugin_sdk::{Admission, Saturation, WorkerInputs};

use super::control::{Part, Partition, Reply, Request};
use super::region::{post, wait_for, Region};
use super::supervisor::IsolatedProcess;
use crate::component_call::Component;
use crate::plugin::shared_call::{CallLayout, Extra, Op, SharedCall, BROKEN};
use crate::plugin::{
    AbiRequest, CallError, Columns, ComponentKind, ErrorBuffer, Lifecycle, Outcome, PartitionKey,
    Status,
};

/// Bytes of labels one call may carry.
const LABEL_BYTES: usize = 4 << 20;

/// An instance id in one incarnation: `incarnation << 32 | id`, 0 when not built there.
#[derive(Default)]
pub struct InstanceSlot(AtomicU64);

impl InstanceSlot {
    fn set(&self, incarnation: u32, id: u32) {
        self.0.store(
            u64::from(incarnation) << 32 | u64::from(id),
            Ordering::SeqCst,
        );
    }

    fn id_in(&self, incarnation: u32) -> Option<u32> {
        let v = self.0.load(Ordering::SeqCst);
        ((v >> 32) as u32 == incarnation && v != 0).then_some(v as u32)
    }
}

/// How a set of instances is made, so that a new incarnation can make them again.
pub enum Recipe {
    Component {
        type_name: String,
        params: String,
        partition: PartitionKey,
    },
    Policy {
        type_name: String,
        params: String,
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

fn refused(reply: Reply) -> CallError {
    match reply {
        Reply::Failed { status, message } => CallError::new(Status::from_code(status), message),
        other => CallError::new(Status::Error, format!("unexpected answer {other:?}")),
    }
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
                    params: params.clone(),
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
                    params: params.clone(),
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
    params: &str,
    partition: &PartitionKey,
) -> Result<RemoteInstance, CallError> {
    let slot = Arc::new(InstanceSlot::default());
    let mut unit = BuildUnit {
        process: process.clone(),
        recipe: Recipe::Component {
            type_name: name.to_owned(),
            params: params.to_owned(),
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
    params: &str,
) -> Result<(), CallError> {
    let request = Request::Validate {
        type_name: type_name.to_owned(),
        params: params.to_owned(),
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
    params: &str,
    partition: &PartitionKey,
    registered: Vec<String>,
) -> Result<Vec<BuiltPart>, CallError> {
    let mut unit = BuildUnit {
        process: process.clone(),
        recipe: Recipe::Policy {
            type_name: type_name.to_owned(),
            params: params.to_owned(),
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

/// What a call hands back.
enum Answer<'a> {
    Keep(&'a mut [u8]),
    Costs(&'a mut [f64]),
    Row(&'a mut usize),
    Admission(&'a mut Option<Admission>),
    Nothing,
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

    fn isolated(&mut self) -> Option<&mut RemoteInstance> {
        Some(self)
    }
}

/// The instance a channel call is for.
struct Target<'a> {
    slot: &'a InstanceSlot,
    name: &'a Arc<str>,
    inputs: WorkerInputs,
}

/// Gives the isolated stages of one policy one channel per process.
pub fn share_channels<'a>(instances: impl Iterator<Item = &'a mut RemoteInstance>) {
    let mut channels: Vec<Arc<Channel>> = Vec::new();
    for instance in instances {
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

/// A shared-memory call channel into a process, and the call thread serving it there.
pub struct Channel {
    process: Arc<IsolatedProcess>,
    call: Mutex<Link>,
    /// The region in use, for the supervisor to break when the process dies.
    live: Mutex<Option<Arc<Region>>>,
    /// The call in flight, for death reports and the supervisor's deadline kills.
    in_flight: Mutex<InFlight>,
}

#[derive(Default)]
struct InFlight {
    /// The component and callback of the call in flight (kept after a missed deadline).
    call: Option<(Arc<str>, &'static str)>,
    /// When that call missed its deadline.
    stuck_since: Option<Instant>,
}

struct Link {
    incarnation: u32,
    region: Option<Arc<Region>>,
    call: Option<SharedCall>,
    seq: u32,
}

impl Channel {
    fn new(process: &Arc<IsolatedProcess>) -> Arc<Channel> {
        let channel = Arc::new(Channel {
            process: process.clone(),
            call: Mutex::new(Link {
                incarnation: 0,
                region: None,
                call: None,
                seq: 0,
            }),
            live: Mutex::new(None),
            in_flight: Mutex::default(),
        });
        process.add_channel(&channel);
        channel
    }

    /// Opens a region in the current incarnation (a call thread starts there).
    fn open(&self, link: &mut Link) -> Result<(), CallError> {
        let incarnation = self.process.incarnation();
        let layout = CallLayout::new(self.process.settings.max_candidates, LABEL_BYTES);
        let region = Region::create("switchyard-isolation", layout.size())
            .map_err(|e| CallError::new(Status::Error, format!("shared memory: {e}")))?;
        let reply = self.process.request(
            &Request::OpenChannel {
                rows: layout.rows(),
                label_bytes: LABEL_BYTES,
            },
            Some(region.fd()),
        )?;
        if !matches!(reply, Reply::Ok) {
            return Err(refused(reply));
        }
        let region = Arc::new(region);
        // SAFETY: the region is mapped, page-aligned, `layout.size()` bytes, and lives
        // in `link.region` as long as the call does.
        link.call = Some(unsafe { SharedCall::new(region.base(), layout) });
        link.region = Some(region.clone());
        link.seq = 0;
        link.incarnation = incarnation;
        *self.live.lock() = Some(region);
        *self.in_flight.lock() = InFlight::default();
        Ok(())
    }

    /// After a restart: a fresh region in the new incarnation.
    pub(super) fn reopen(&self) {
        let mut link = self.call.lock();
        // A call may have opened it in this incarnation already.
        if link.incarnation == self.process.incarnation() && link.call.is_some() {
            return;
        }
        if let Err(e) = self.open(&mut link) {
            tracing::error!(process = %self.process.name, error = %e, "reopening an isolation channel failed; it is retried at its next call");
        }
    }

    /// The process died: a caller waiting on this channel returns now.
    pub(super) fn break_off(&self) {
        if let Some(region) = self.live.lock().take() {
            // SAFETY: the region is mapped and laid out by a `CallLayout` (`open`).
            let call = unsafe {
                SharedCall::new(
                    region.base(),
                    CallLayout::new(self.process.settings.max_candidates, LABEL_BYTES),
                )
            };
            let sync = call.sync();
            post(&sync.done_seq, &sync.parent_waiting, BROKEN);
            super::region::futex_wake(&sync.done_seq);
        }
    }

    pub(super) fn phase(&self) -> Option<String> {
        self.in_flight
            .lock()
            .call
            .as_ref()
            .map(|(name, callback)| format!("running {callback} of `{name}`"))
    }

    /// The component of a call stuck longer than `limit` past its deadline, if any.
    pub(super) fn stuck_longer_than(&self, limit: Duration) -> Option<String> {
        let in_flight = self.in_flight.lock();
        match (&in_flight.call, in_flight.stuck_since) {
            (Some((name, _)), Some(since)) if since.elapsed() > limit => Some(format!("`{name}`")),
            _ => None,
        }
    }

    /// What the wait for call `seq` ended with: its answer, a broken process, or a
    /// missed deadline (the call stays in flight: `stuck_since`).
    fn finished(
        &self,
        name: &str,
        callback: &str,
        done: Option<u32>,
        seq: u32,
    ) -> Result<(), CallError> {
        let process = &self.process;
        let settings = &process.settings;
        match done {
            Some(d) if d == seq => {
                self.in_flight.lock().call = None;
                Ok(())
            }
            Some(BROKEN) => Err(process.down_error()),
            None => {
                process.deadline_misses.fetch_add(1, Ordering::Relaxed);
                self.in_flight.lock().stuck_since = Some(Instant::now());
                Err(CallError::new(
                Status::Error,
                format!(
                    "{callback} of `{}` in the isolated process `{}` missed its deadline of {} ms (isolation.call_deadline_ms); if it does not return within {} ms the process is killed and restarted",
                    name, process.name, settings.call_deadline_ms, settings.kill_after_ms
                ),
            ))
            }
            Some(other) => Err(CallError::new(
                Status::Error,
                format!(
                    "the isolated process `{}` answered call {other}, not {seq}",
                    process.name
                ),
            )),
        }
    }

    fn call(
        &self,
        instance: Target<'_>,
        op: Op,
        request: Option<&AbiRequest<'_>>,
        columns: Option<&Columns<'_>>,
        extra: Extra<'_>,
        answer: Answer<'_>,
    ) -> Result<(), CallError> {
        let process = &self.process;
        let mut link = self.call.lock();
        if !process.is_up() {
            return Err(process.down_error());
        }
        let incarnation = process.incarnation();
        if link.incarnation != incarnation || link.call.is_none() {
            self.open(&mut link)?;
        }
        let Some(id) = instance.slot.id_in(incarnation) else {
            process.refused_calls.fetch_add(1, Ordering::Relaxed);
            return Err(CallError::new(
                Status::Error,
                format!(
                    "`{}` is not built in the isolated process `{}` since its restart",
                    instance.name, process.name
                ),
            ));
        };
        let previous = link.seq;
        let Link {
            call, seq: posted, ..
        } = &mut *link;
        let Some(call) = call.as_mut() else {
            return Err(process.down_error());
        };
        idle(
            process,
            call.sync().done_seq.load(Ordering::Acquire),
            previous,
        )?;
        call.write_call(op, id, request, columns, instance.inputs, extra)?;
        let seq = match previous.wrapping_add(1) {
            BROKEN => 1,
            s => s,
        };
        let callback = callback_of(op);
        // A late call that has come back since is over: this one replaces it.
        *self.in_flight.lock() = InFlight {
            call: Some((instance.name.clone(), callback)),
            stuck_since: None,
        };
        process.calls.fetch_add(1, Ordering::Relaxed);
        let settings = &process.settings;
        let deadline = Instant::now() + Duration::from_secs_f64(settings.call_deadline_ms / 1e3);
        let sync = call.sync();
        post(&sync.call_seq, &sync.child_waiting, seq);
        *posted = seq;
        let done = wait_for(
            &sync.done_seq,
            &sync.parent_waiting,
            previous,
            Duration::from_micros(settings.spin_us),
            Some(deadline),
        );
        self.finished(instance.name, callback, done, seq)?;
        call.read_status()?;
        match answer {
            Answer::Keep(keep) => call.read_keep(keep),
            Answer::Costs(costs) => call.read_costs(costs),
            Answer::Row(row) => *row = call.read_row(),
            Answer::Admission(admission) => *admission = Some(call.read_admission()?),
            Answer::Nothing => {}
        }
        Ok(())
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        let mut link = self.call.lock();
        if link.incarnation != self.process.incarnation() || !self.process.is_up() {
            return;
        }
        let seq = link.seq.wrapping_add(1).max(1);
        if let Some(call) = link.call.as_mut() {
            if call
                .write_call(Op::Close, 0, None, None, WorkerInputs::NONE, Extra::None)
                .is_ok()
            {
                let sync = call.sync();
                post(&sync.call_seq, &sync.child_waiting, seq);
            }
        }
    }
}

impl super::supervisor::SupervisedChannel for Channel {
    fn break_off(&self) {
        Channel::break_off(self)
    }
    fn reopen(&self) {
        Channel::reopen(self)
    }
    fn phase(&self) -> Option<String> {
        Channel::phase(self)
    }
    fn stuck_longer_than(&self, limit: Duration) -> Option<String> {
        Channel::stuck_longer_than(self, limit)
    }
}

impl super::supervisor::RebuiltUnit for BuildUnit {
    fn rebuild(&self) -> Result<(), CallError> {
        BuildUnit::rebuild(self)
    }
}

/// A new call may be posted only once the last one is done (`done` is its sequence).
fn idle(process: &IsolatedProcess, done: u32, previous: u32) -> Result<(), CallError> {
    match done {
        done if done == previous => Ok(()),
        BROKEN => Err(process.down_error()),
        _ => {
            process.refused_calls.fetch_add(1, Ordering::Relaxed);
            Err(CallError::new(
                Status::Error,
                format!(
                    "the isolated process `{}` is still running a call that missed its deadline",
                    process.name
                ),
            ))
        }
    }
}

/// The plugin callback an operation runs, as error messages name it.
fn callback_of(op: Op) -> &'static str {
    match op {
        Op::Filter => "on_filter",
        Op::Score => "on_score",
        Op::Pick => "on_pick",
        Op::Admit => "on_admit",
        _ => "a lifecycle notification",
    }
}
