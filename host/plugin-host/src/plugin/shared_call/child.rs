//! The child's side of a shared call: reading the posted call, running the instance on
//! views into the region, and writing the answer in place.

use super::*;
use crate::plugin::Component;

impl SharedCall {
    /// The posted call's op (None: not one this build knows) and instance id.
    pub fn posted(&mut self) -> (Option<Op>, u32) {
        let fields = self.fields();
        (Op::from_u32(fields.op), fields.instance)
    }

    /// Records a failure that is not the plugin's answer (an unknown instance, say).
    pub fn answer_error(&mut self, failure: &CallError) {
        let fields = self.fields();
        fields.status = failure.status.code();
        let bytes = failure.message.as_bytes();
        let len = bytes.len().min(ERROR_BYTES);
        fields.error[..len].copy_from_slice(&bytes[..len]);
        fields.error_len = len as u32;
    }

    /// Runs the posted call on `instance` and writes its answer into the region.
    pub fn run(&mut self, instance: &mut ComponentInstance, error: &mut ErrorBuffer) {
        let (op, _) = self.posted();
        let result = match op {
            Some(Op::Notify) => self.run_notify(instance, error),
            Some(Op::Admit) => self.run_admit(instance, error),
            Some(op @ (Op::Filter | Op::Score | Op::Pick)) => self.run_call(op, instance, error),
            _ => Err(CallError::new(Status::InvalidArgument, "unknown call")),
        };
        match result {
            Ok(()) => self.fields().status = Status::Ok.code(),
            Err(failure) => self.answer_error(&failure),
        }
        self.write_log_lines();
    }

    fn run_admit(
        &mut self,
        instance: &mut ComponentInstance,
        error: &mut ErrorBuffer,
    ) -> Result<(), CallError> {
        let saturation = Saturation::from_abi(&self.fields().saturation);
        let admission = self.with_request(|request| instance.admit(request, &saturation, error))?;
        let answer = &mut self.fields().admission;
        answer.has_priority = 0;
        answer.tenant_len = u32::MAX;
        answer.message_len = 0;
        match admission {
            Admission::Admit(placement) => {
                answer.verdict = SWITCHYARD_ADMIT;
                if let Some(priority) = placement.priority {
                    answer.has_priority = 1;
                    answer.priority = priority;
                }
                if let Some(tenant) = &placement.tenant {
                    // Checked to fit by `admit`.
                    let len = tenant.len().min(MAX_TENANT_BYTES);
                    answer.text[..len].copy_from_slice(&tenant.as_bytes()[..len]);
                    answer.tenant_len = len as u32;
                }
                answer.max_wait_ms = placement.max_wait_ms.unwrap_or(0);
            }
            Admission::Reject {
                status,
                retry_after_seconds,
                message,
            } => {
                answer.verdict = SWITCHYARD_REJECT;
                answer.status = u32::from(status);
                answer.retry_after_seconds = retry_after_seconds;
                let len = message.len().min(ERROR_BYTES);
                answer.text[MAX_TENANT_BYTES..MAX_TENANT_BYTES + len]
                    .copy_from_slice(&message.as_bytes()[..len]);
                answer.message_len = len as u32;
            }
        }
        Ok(())
    }

    fn run_notify(
        &mut self,
        instance: &mut ComponentInstance,
        error: &mut ErrorBuffer,
    ) -> Result<(), CallError> {
        let fields = self.fields();
        let outcome = Outcome::from_abi(&fields.outcome);
        let event = match fields.event {
            e if e == Lifecycle::Selected as u32 => Lifecycle::Selected,
            e if e == Lifecycle::PrefillComplete as u32 => Lifecycle::PrefillComplete,
            _ => Lifecycle::Finished,
        };
        self.with_request(|request| instance.notify(event, Some(request), &outcome, error))
    }

    fn run_call(
        &mut self,
        op: Op,
        instance: &mut ComponentInstance,
        error: &mut ErrorBuffer,
    ) -> Result<(), CallError> {
        let rows = self.layout.rows;
        let fields = self.fields();
        let count = (fields.count as usize).min(rows);
        let inputs = WorkerInputs::from_bits(fields.inputs);
        let labels = if inputs.contains(WorkerInputs::LABELS) {
            self.read_labels(count)
        } else {
            Vec::new()
        };
        let engine = if inputs.contains(WorkerInputs::ENGINE) {
            self.read_engine(count)
        } else {
            Vec::new()
        };
        let group = |g: WorkerInputs| if inputs.contains(g) { count } else { 0 };
        let (cache, load, routing) = (
            group(WorkerInputs::CACHE),
            group(WorkerInputs::LOAD),
            group(WorkerInputs::ROUTING),
        );
        let (base, layout) = (self.base, self.layout);
        // SAFETY: every view below is a distinct column of the region (`CallLayout`), so
        // the input views and the one output view never overlap; the parent leaves the
        // region alone until the answer is posted.
        let columns = unsafe {
            Columns {
                inputs,
                version: 0,
                worker_id: view(base, &layout, Col::WorkerId, count),
                dp_rank: view(base, &layout, Col::DpRank, count),
                device_overlap_blocks: view(base, &layout, Col::Device, cache),
                host_overlap_blocks: view(base, &layout, Col::Host, cache),
                disk_overlap_blocks: view(base, &layout, Col::Disk, cache),
                shared_beyond_device_blocks: view(base, &layout, Col::Shared, cache),
                active_prefill_tokens: view(base, &layout, Col::Prefill, load),
                decode_cost_blocks: view(base, &layout, Col::Decode, load),
                active_requests: view(base, &layout, Col::Active, load),
                preferred_taint_multiplier: view(base, &layout, Col::Taint, routing),
                labels: &labels,
                engine: &engine,
                costs: (op == Op::Pick).then(|| view(base, &layout, Col::Costs, count)),
            }
        };
        self.with_request(|request| match op {
            Op::Filter => {
                // SAFETY: as above.
                let keep = unsafe { view_mut(base, &layout, Col::Keep, count) };
                instance.filter(request, &columns, keep, error)
            }
            Op::Score => {
                // SAFETY: as above.
                let costs = unsafe { view_mut(base, &layout, Col::OutCosts, count) };
                costs.fill(f64::NAN);
                instance.score(request, &columns, costs, error)
            }
            _ => {
                let row = instance.pick(request, &columns, error)?;
                // SAFETY: as above; the row is a field no view covers.
                unsafe { (*fields_ptr(base)).row = row as u64 };
                Ok(())
            }
        })
    }

    fn read_labels(&mut self, count: usize) -> Vec<Arc<Labels>> {
        let capacity = self.layout.label_bytes;
        let ends: Vec<u32> = self.column::<u32>(Col::LabelEnds, count).to_vec();
        let bytes = self.column::<u8>(Col::LabelBytes, capacity);
        let mut start = 0usize;
        ends.iter()
            .map(|&end| {
                let end = (end as usize).clamp(start, capacity);
                let mut map = std::collections::BTreeMap::new();
                let mut at = start;
                let next = |at: &mut usize| -> Option<String> {
                    let len =
                        u32::from_le_bytes(bytes.get(*at..*at + 4)?.try_into().ok()?) as usize;
                    let s = bytes.get(*at + 4..*at + 4 + len)?;
                    *at += 4 + len;
                    Some(String::from_utf8_lossy(s).into_owned())
                };
                while at < end {
                    match (next(&mut at), next(&mut at)) {
                        (Some(k), Some(v)) => {
                            map.insert(k, v);
                        }
                        _ => break,
                    }
                }
                start = end;
                Labels::new(&map)
            })
            .collect()
    }

    fn read_engine(&mut self, count: usize) -> Vec<Arc<EngineReport>> {
        let capacity = self.layout.label_bytes;
        let records: Vec<EngineRow> = self.column::<EngineRow>(Col::Engine, count).to_vec();
        let ends: Vec<u32> = self.column::<u32>(Col::EngineEnds, count).to_vec();
        let bytes = self.column::<u8>(Col::EngineBytes, capacity);
        let mut start = 0usize;
        records
            .iter()
            .zip(ends)
            .map(|(record, end)| {
                let end = (end as usize).clamp(start, capacity);
                let mut reader = Reader {
                    bytes: &bytes[start..end],
                };
                start = end;
                if record[0] == 0.0 {
                    return EngineReport::none();
                }
                let mut list = || -> Option<Box<[Box<str>]>> {
                    let count = reader.u32()?;
                    (count != u32::MAX).then(|| {
                        (0..count)
                            .map_while(|_| reader.text())
                            .map(Box::from)
                            .collect()
                    })
                };
                let (running_adapters, waiting_adapters) = (list(), list());
                EngineReport::from_reading(EngineReading {
                    sample: Arc::new(EngineSample {
                        running_requests: record[2],
                        waiting_requests: record[3],
                        kv_cache_usage: record[4],
                        running_adapters,
                        waiting_adapters,
                        kv_capacity_tokens: None,
                    }),
                    age: std::time::Duration::try_from_secs_f64(record[1]).unwrap_or_default(),
                    fresh: record[0] == 1.0,
                })
            })
            .collect()
    }

    /// Runs `f` with the posted request as the ABI hands it to plugins.
    fn with_request<R>(&self, f: impl FnOnce(&AbiRequest<'_>) -> R) -> R {
        // SAFETY: see `fields_ptr`; only read here, and `f` writes no request field.
        let fields = unsafe { &*fields_ptr(self.base) };
        let flags = fields.flags;
        let on = |b: u32| u8::from(flags & b != 0);
        let id_len = (fields.session_id_len as usize).min(STRING_BYTES);
        let parent_len = if flags & HAS_PARENT_SESSION != 0 {
            (fields.parent_session_id_len as usize).min(STRING_BYTES - id_len)
        } else {
            0
        };
        let strings = fields.strings.as_ptr();
        let text = |at: usize, len: usize, present: bool| switchyard_str {
            ptr: if present {
                // `at + len <= STRING_BYTES` (clamped above): inside the strings field.
                strings.wrapping_add(at).cast()
            } else {
                ptr::null()
            },
            len,
        };
        let session = switchyard_session {
            session_id: text(0, id_len, true),
            parent_session_id: text(id_len, parent_len, flags & HAS_PARENT_SESSION != 0),
            input_trigger: fields.input_trigger,
            has_session_final: on(HAS_SESSION_FINAL),
            session_final: on(SESSION_FINAL),
            has_kv_hints: on(HAS_KV_HINTS),
            evict_session: on(EVICT_SESSION),
        };
        let attributes = (flags & HAS_ATTRIBUTES != 0)
            .then(|| {
                let at = (fields.attributes_at as usize).min(STRING_BYTES);
                let end = at
                    .saturating_add(fields.attributes_len as usize)
                    .min(STRING_BYTES);
                decode_attributes(&fields.strings[at..end])
            })
            .flatten();
        let attributes_abi = attributes.as_ref().map(|a| a.abi(&a.model, &a.request_id));
        let raw = switchyard_request {
            struct_size: std::mem::size_of::<switchyard_request>() as u32,
            block_size: fields.block_size,
            request_blocks: fields.request_blocks,
            expected_output_tokens: fields.expected_output_tokens,
            priority_jump: fields.priority_jump,
            router_temperature_override: fields.router_temperature_override,
            strict_priority: fields.strict_priority,
            tracks_prefill_tokens: on(TRACKS_PREFILL),
            has_expected_output_tokens: on(HAS_EXPECTED_OUTPUT),
            has_router_temperature_override: on(HAS_TEMPERATURE),
            reserved0: 0,
            session: if flags & HAS_SESSION != 0 {
                ptr::from_ref(&session)
            } else {
                ptr::null()
            },
            attributes: attributes_abi.as_ref().map_or(ptr::null(), ptr::from_ref),
            affinity_worker_id: fields.affinity_worker_id,
            affinity_dp_rank: fields.affinity_dp_rank,
            affinity_mode: fields.affinity_mode,
        };
        f(&AbiRequest::from_raw(raw))
    }
}
