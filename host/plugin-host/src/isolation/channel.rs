//! The shared-memory call channel into an isolated process: one per process and policy,
//! posting one call at a time into its region and waiting for the answer, with the
//! deadlines and the supervisor's view of a call in flight.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use switchyard_plugin_sdk::{Admission, WorkerInputs};

use super::control::{Reply, Request};
use super::region::{post, wait_for, Region};
use super::supervisor::IsolatedProcess;
use crate::plugin::shared_call::{CallLayout, Extra, Op, SharedCall, BROKEN};
use crate::plugin::{AbiRequest, CallError, Columns, Status};

/// An instance id in one incarnation: `incarnation << 32 | id`, 0 when not built there.
#[derive(Default)]
pub struct InstanceSlot(AtomicU64);

impl InstanceSlot {
    pub(super) fn set(&self, incarnation: u32, id: u32) {
        self.0.store(
            u64::from(incarnation) << 32 | u64::from(id),
            Ordering::SeqCst,
        );
    }

    pub(super) fn id_in(&self, incarnation: u32) -> Option<u32> {
        let v = self.0.load(Ordering::SeqCst);
        ((v >> 32) as u32 == incarnation && v != 0).then_some(v as u32)
    }
}

pub(super) fn refused(reply: Reply) -> CallError {
    match reply {
        Reply::Failed { status, message } => CallError::new(Status::from_code(status), message),
        other => CallError::new(Status::Error, format!("unexpected answer {other:?}")),
    }
}

/// Bytes of labels one call may carry.
const LABEL_BYTES: usize = 4 << 20;

/// What a call hands back.
pub(super) enum Answer<'a> {
    Keep(&'a mut [u8]),
    Costs(&'a mut [f64]),
    Row(&'a mut usize),
    Admission(&'a mut Option<Admission>),
    Nothing,
}

/// The instance a channel call is for.
pub(super) struct Target<'a> {
    pub(super) slot: &'a InstanceSlot,
    pub(super) name: &'a Arc<str>,
    pub(super) inputs: WorkerInputs,
}

/// A shared-memory call channel into a process, and the call thread serving it there.
pub struct Channel {
    pub(super) process: Arc<IsolatedProcess>,
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
    pub(super) fn new(process: &Arc<IsolatedProcess>) -> Arc<Channel> {
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

    pub(super) fn call(
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
        call.read_log_lines();
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

/// A new call may be posted only once the last one is done (`done` is its sequence).
pub(super) fn idle(process: &IsolatedProcess, done: u32, previous: u32) -> Result<(), CallError> {
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
pub(super) fn callback_of(op: Op) -> &'static str {
    match op {
        Op::Filter => "on_filter",
        Op::Score => "on_score",
        Op::Pick => "on_pick",
        Op::Admit => "on_admit",
        _ => "a lifecycle notification",
    }
}
