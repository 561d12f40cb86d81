//! The candidate columns of one call, borrowed from the pipeline's buffers, and their ABI
//! form. Built-in components read them through the SDK's views made from the very same
//! ABI struct, so a plugin and a built-in see identical data.

use std::ptr;
use std::sync::Arc;

use switchyard_plugin_sdk::abi::switchyard_candidates;
use switchyard_plugin_sdk::{WorkerCandidates, WorkerInputs, WorkerSelectionContext};

use super::engine::{self, EngineReport};
use super::labels::{self, Labels};
use super::request::AbiRequest;

/// Index-aligned candidate columns. A group's columns are handed to a component only when
/// the component declared the group, `inputs` holds it, and every column of it has one
/// value per candidate; otherwise they are NULL, so no plugin can read past a column.
#[derive(Clone, Copy, Default)]
pub struct Columns<'a> {
    /// The groups filled in these columns.
    pub inputs: WorkerInputs,
    /// Identifies these contents: the same version means the same values (0: unknown).
    /// An isolation channel copies columns once per version, not once per stage.
    pub version: u64,
    pub worker_id: &'a [u64],
    pub dp_rank: &'a [u32],
    pub device_overlap_blocks: &'a [u32],
    pub host_overlap_blocks: &'a [u32],
    pub disk_overlap_blocks: &'a [u32],
    pub shared_beyond_device_blocks: &'a [u32],
    pub active_prefill_tokens: &'a [u64],
    pub decode_cost_blocks: &'a [u64],
    pub active_requests: &'a [u32],
    pub preferred_taint_multiplier: &'a [f64],
    pub labels: &'a [Arc<Labels>],
    /// ENGINE: each row's engine report (shared cells the scraper writes).
    pub engine: &'a [Arc<EngineReport>],
    /// Picker calls only: the total cost per row.
    pub costs: Option<&'a [f64]>,
}

/// The input groups an ABI view carries.
struct Present {
    cache: bool,
    load: bool,
    routing: bool,
    labels: bool,
    engine: bool,
}

impl Columns<'_> {
    pub fn len(&self) -> usize {
        self.worker_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.worker_id.is_empty()
    }

    /// Which input groups the view carries: declared by the component, gathered by the
    /// router, and whole (a column per row).
    #[inline]
    fn present(&self, declared: WorkerInputs, count: usize) -> Present {
        let whole = |len: usize| len == count;
        let cache = declared.contains(WorkerInputs::CACHE)
            && self.inputs.contains(WorkerInputs::CACHE)
            && whole(self.device_overlap_blocks.len())
            && whole(self.host_overlap_blocks.len())
            && whole(self.disk_overlap_blocks.len())
            && whole(self.shared_beyond_device_blocks.len());
        let load = declared.contains(WorkerInputs::LOAD)
            && self.inputs.contains(WorkerInputs::LOAD)
            && whole(self.active_prefill_tokens.len())
            && whole(self.decode_cost_blocks.len())
            && whole(self.active_requests.len());
        let routing = declared.contains(WorkerInputs::ROUTING)
            && self.inputs.contains(WorkerInputs::ROUTING)
            && whole(self.preferred_taint_multiplier.len());
        let labels = declared.contains(WorkerInputs::LABELS)
            && self.inputs.contains(WorkerInputs::LABELS)
            && whole(self.labels.len());
        let engine = declared.contains(WorkerInputs::ENGINE)
            && self.inputs.contains(WorkerInputs::ENGINE)
            && whole(self.engine.len());
        Present {
            cache,
            load,
            routing,
            labels,
            engine,
        }
    }

    /// The ABI view for a component that declared `declared`.
    #[inline]
    pub(super) fn abi_view(&self, declared: WorkerInputs) -> switchyard_candidates {
        let count = self.worker_id.len().min(self.dp_rank.len());
        let whole = |len: usize| len == count;
        let Present {
            cache,
            load,
            routing,
            labels,
            engine,
        } = self.present(declared, count);
        fn group<T>(present: bool, values: &[T]) -> *const T {
            if present {
                values.as_ptr()
            } else {
                ptr::null()
            }
        }
        let present = [
            (cache, WorkerInputs::CACHE),
            (load, WorkerInputs::LOAD),
            (routing, WorkerInputs::ROUTING),
            (labels, WorkerInputs::LABELS),
            (engine, WorkerInputs::ENGINE),
            (
                declared.contains(WorkerInputs::ATTRIBUTES),
                WorkerInputs::ATTRIBUTES,
            ),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .fold(WorkerInputs::NONE, |acc, (_, group)| acc | group);
        switchyard_candidates {
            struct_size: std::mem::size_of::<switchyard_candidates>() as u32,
            inputs: present.bits(),
            count,
            worker_id: self.worker_id.as_ptr(),
            dp_rank: self.dp_rank.as_ptr(),
            device_overlap_blocks: group(cache, self.device_overlap_blocks),
            host_overlap_blocks: group(cache, self.host_overlap_blocks),
            disk_overlap_blocks: group(cache, self.disk_overlap_blocks),
            shared_beyond_device_blocks: group(cache, self.shared_beyond_device_blocks),
            active_prefill_tokens: group(load, self.active_prefill_tokens),
            decode_cost_blocks: group(load, self.decode_cost_blocks),
            active_requests: group(load, self.active_requests),
            preferred_taint_multiplier: group(routing, self.preferred_taint_multiplier),
            costs: match self.costs {
                Some(costs) if whole(costs.len()) => costs.as_ptr(),
                _ => ptr::null(),
            },
            labels_host_data: if labels {
                labels::host_data(self.labels)
            } else {
                ptr::null()
            },
            callback_get_label: if labels {
                Some(labels::get_label)
            } else {
                None
            },
            engine_host_data: if engine {
                engine::host_data(self.engine)
            } else {
                ptr::null()
            },
            callback_get_engine: if engine {
                Some(engine::get_engine)
            } else {
                None
            },
            callback_get_adapter: if engine {
                Some(engine::get_adapter)
            } else {
                None
            },
        }
    }
}

/// Runs `f` with the SDK's views of `request` and `columns`, as a built-in component
/// declaring `declared` sees them.
pub(crate) fn with_views<R>(
    request: &AbiRequest<'_>,
    columns: &Columns<'_>,
    declared: WorkerInputs,
    f: impl FnOnce(&WorkerSelectionContext<'_>, &WorkerCandidates<'_>) -> R,
) -> R {
    let raw = columns.abi_view(declared);
    let request = request.view(declared);
    // SAFETY: `request` borrows a live `RouteRequest` (see `AbiRequest`), and every
    // non-NULL array of `raw` holds `count` elements borrowed from `columns` for this call.
    let (context, view) = unsafe {
        (
            WorkerSelectionContext::from_abi(&request),
            WorkerCandidates::from_abi(&raw),
        )
    };
    f(&context, &view)
}

/// Runs `f` with the SDK's view of `request` alone (an admitter sees no candidates).
pub(crate) fn with_context<R>(
    request: &AbiRequest<'_>,
    declared: WorkerInputs,
    f: impl FnOnce(&WorkerSelectionContext<'_>) -> R,
) -> R {
    let raw = request.view(declared);
    // SAFETY: `raw` is the live request's ABI form (its session and attributes borrow
    // it), valid for this call.
    let context = unsafe { WorkerSelectionContext::from_abi(&raw) };
    f(&context)
}
