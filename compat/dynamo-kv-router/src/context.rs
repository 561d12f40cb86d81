//! The request context a Dynamo component sees, read from the SDK's context.

use switchyard_plugin_sdk as sdk;

/// What caused a session turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WorkerSelectionInputTrigger {
    UserMessage,
    ToolResult,
    Other,
}

/// KV lifecycle hints of a session request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvHints {
    evict_session: bool,
}

impl KvHints {
    /// Whether the request asks consumers to evict session state.
    #[inline]
    pub fn evict_session(&self) -> bool {
        self.evict_session
    }
}

/// The session metadata of a request.
#[derive(Clone, Copy)]
pub struct SessionContext<'a> {
    raw: sdk::SessionContext<'a>,
    kv_hints: Option<KvHints>,
}

impl<'a> SessionContext<'a> {
    /// The stable reasoning or tool-session identifier.
    #[inline]
    pub fn session_id(&self) -> &'a str {
        self.raw.session_id()
    }

    /// The parent session of a subagent request.
    #[inline]
    pub fn parent_session_id(&self) -> Option<&'a str> {
        self.raw.parent_session_id()
    }

    /// `Some(true)`: the session ends; `Some(false)`: it continues; `None`: not said.
    #[inline]
    pub fn session_final(&self) -> Option<bool> {
        self.raw.session_final()
    }

    /// The KV lifecycle hints, when the request carries any.
    #[inline]
    pub fn kv_hints(&self) -> Option<&KvHints> {
        self.kv_hints.as_ref()
    }

    /// The event that caused this request, when supplied.
    #[inline]
    pub fn input_trigger(&self) -> Option<WorkerSelectionInputTrigger> {
        self.raw.input_trigger().map(|trigger| match trigger {
            sdk::InputTrigger::UserMessage => WorkerSelectionInputTrigger::UserMessage,
            sdk::InputTrigger::ToolResult => WorkerSelectionInputTrigger::ToolResult,
            sdk::InputTrigger::Other => WorkerSelectionInputTrigger::Other,
        })
    }
}

/// The request context every component sees.
#[derive(Clone, Copy)]
pub struct WorkerSelectionContext<'a> {
    raw: sdk::WorkerSelectionContext<'a>,
    session: Option<SessionContext<'a>>,
}

impl<'a> WorkerSelectionContext<'a> {
    /// Dynamo's context over the SDK's (what the adapters hand to a Dynamo component).
    #[inline]
    pub fn from_switchyard(raw: &sdk::WorkerSelectionContext<'a>) -> Self {
        let session = raw.session_context().map(|session| SessionContext {
            raw: session,
            kv_hints: session
                .evict_session()
                .map(|evict_session| KvHints { evict_session }),
        });
        WorkerSelectionContext { raw: *raw, session }
    }

    /// The SDK's context (switchyard addition: request attributes and the rest of what
    /// switchyard offers beyond Dynamo's accessors).
    #[inline]
    pub fn switchyard(&self) -> &sdk::WorkerSelectionContext<'a> {
        &self.raw
    }

    /// Incoming prompt size in KV blocks.
    #[inline]
    pub fn request_blocks(&self) -> u64 {
        self.raw.request_blocks()
    }

    /// Tokens in one KV block.
    #[inline]
    pub fn block_size(&self) -> u32 {
        self.raw.block_size()
    }

    /// Whether the request contributes to prefill-load tracking.
    #[inline]
    pub fn tracks_prefill_tokens(&self) -> bool {
        self.raw.tracks_prefill_tokens()
    }

    /// The session metadata supplied with this request.
    #[inline]
    pub fn session_context(&self) -> Option<&SessionContext<'a>> {
        self.session.as_ref()
    }

    /// The session-affinity target resolved by the router (`router.session_affinity`,
    /// ABI 1.5): advisory, it may be absent from the candidates.
    #[inline]
    pub fn affinity_target(&self) -> Option<crate::protocols::WorkerAffinityTarget> {
        self.raw.affinity_target().map(|target| {
            crate::protocols::WorkerAffinityTarget::new(
                target.worker.worker_id,
                Some(target.worker.dp_rank),
            )
        })
    }

    /// The expected output length in tokens (saturating at `u32::MAX`, Dynamo's type).
    #[inline]
    pub fn expected_output_tokens(&self) -> Option<u32> {
        self.raw
            .expected_output_tokens()
            .map(|tokens| u32::try_from(tokens).unwrap_or(u32::MAX))
    }

    /// Scheduler priority boost; queue policies treat negative values as zero.
    #[inline]
    pub fn priority_jump(&self) -> f64 {
        self.raw.priority_jump()
    }

    /// Strict integer priority, larger first (a negative switchyard priority reads 0).
    #[inline]
    pub fn strict_priority(&self) -> u32 {
        u32::try_from(self.raw.strict_priority()).unwrap_or(0)
    }

    /// The per-request router temperature override.
    #[inline]
    pub fn router_temperature_override(&self) -> Option<f64> {
        self.raw.router_temperature_override()
    }
}

#[cfg(test)]
mod tests {
    use core::ptr;

    use switchyard_plugin_sdk::abi::*;

    use super::*;

    /// Dynamo's context over a request with `priority`, `expected` output tokens and a
    /// session of trigger `trigger` whose KV hints ask to evict it.
    fn with_request<R>(
        priority: i32,
        expected: u64,
        trigger: u32,
        f: impl FnOnce(&WorkerSelectionContext<'_>) -> R,
    ) -> R {
        let session = switchyard_session {
            session_id: sdk::str_to_abi("s1"),
            parent_session_id: switchyard_str {
                ptr: ptr::null(),
                len: 0,
            },
            input_trigger: trigger,
            has_session_final: 1,
            session_final: 0,
            has_kv_hints: 1,
            evict_session: 1,
        };
        let raw = switchyard_request {
            struct_size: core::mem::size_of::<switchyard_request>() as u32,
            block_size: 16,
            request_blocks: 5,
            expected_output_tokens: expected,
            priority_jump: 0.5,
            router_temperature_override: 0.0,
            strict_priority: priority,
            tracks_prefill_tokens: 0,
            has_expected_output_tokens: 1,
            has_router_temperature_override: 0,
            reserved0: 0,
            session: &session,
            attributes: ptr::null(),
            affinity_worker_id: SWITCHYARD_NO_WORKER,
            affinity_dp_rank: 0,
            affinity_mode: SWITCHYARD_AFFINITY_NONE,
        };
        // SAFETY: `raw` and its session are complete and outlive the context.
        let context = unsafe { sdk::WorkerSelectionContext::from_abi(&raw) };
        f(&WorkerSelectionContext::from_switchyard(&context))
    }

    #[test]
    fn the_request_reads_in_dynamos_types() {
        with_request(7, 300, SWITCHYARD_TRIGGER_TOOL_RESULT, |context| {
            assert_eq!((context.request_blocks(), context.block_size()), (5, 16));
            assert!(!context.tracks_prefill_tokens());
            assert_eq!(context.expected_output_tokens(), Some(300));
            assert_eq!(
                (context.strict_priority(), context.priority_jump()),
                (7, 0.5)
            );
            assert_eq!(context.router_temperature_override(), None);
            let session = context.session_context().unwrap();
            assert_eq!(session.session_id(), "s1");
            assert_eq!(session.parent_session_id(), None);
            assert_eq!(session.session_final(), Some(false));
            assert!(session.kv_hints().unwrap().evict_session());
            assert_eq!(
                session.input_trigger(),
                Some(WorkerSelectionInputTrigger::ToolResult)
            );
        });
    }

    /// Dynamo's types are narrower: a negative priority reads 0, a huge output length
    /// saturates.
    #[test]
    fn values_out_of_dynamos_range_are_clamped() {
        with_request(-3, u64::MAX, SWITCHYARD_TRIGGER_NONE, |context| {
            assert_eq!(context.strict_priority(), 0);
            assert_eq!(context.expected_output_tokens(), Some(u32::MAX));
            assert_eq!(context.session_context().unwrap().input_trigger(), None);
        });
    }
}
