//! Plugin code never runs on an async executor thread. The services decide before a
//! selection whether it may run inline (only the router's own code: `off_executor` in the
//! serve crate), but a reload can swap the generation between that decision and the
//! selection, and the instance the request names may then be a plugin's. The services
//! mark inline work with [`inline`]; the router, about to run plugin code, asks
//! [`plugin_code`] to move it off the executor first.

use std::cell::Cell;

thread_local! {
    /// Set while inline work runs on this (executor) thread.
    static INLINE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `work` marked as inline on the executor (cleared again when it returns or
/// unwinds).
pub fn inline<R>(work: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            INLINE.with(|inline| inline.set(self.0));
        }
    }
    let _reset = Reset(INLINE.with(|inline| inline.replace(true)));
    work()
}

/// Whether this thread runs inline work on the executor now.
pub fn is_inline() -> bool {
    INLINE.with(Cell::get)
}

/// Runs `work`, which runs plugin code, off the executor: inline work on a
/// multi-threaded runtime hands its executor duties to another thread first
/// (`block_in_place`), so the thread that runs the plugin is no longer an executor
/// thread. Elsewhere (already off the executor) it runs as it is.
pub fn plugin_code<R>(work: impl FnOnce() -> R) -> R {
    if !is_inline() {
        return work();
    }
    let multi_threaded = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if !multi_threaded {
        // A current-thread runtime (the endpoint picker with one thread) has no other
        // thread to hand its duties to; the plugin runs here, as the decision said.
        tracing::debug!("plugin code runs inline: the runtime has a single thread");
        return not_inline(work);
    }
    tokio::task::block_in_place(|| not_inline(work))
}

/// Runs `work` unmarked (marked again after, as it was).
fn not_inline<R>(work: impl FnOnce() -> R) -> R {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            INLINE.with(|inline| inline.set(true));
        }
    }
    INLINE.with(|inline| inline.set(false));
    let _reset = Reset;
    work()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_marks_only_the_work_and_plugin_code_clears_it() {
        assert!(!is_inline());
        let seen = inline(|| (is_inline(), plugin_code(is_inline), is_inline()));
        assert_eq!(seen, (true, false, true));
        assert!(!is_inline());
    }

    #[test]
    fn on_a_multi_threaded_runtime_plugin_code_leaves_the_executor() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        let seen = runtime.block_on(async {
            tokio::spawn(async { inline(|| plugin_code(is_inline)) })
                .await
                .unwrap()
        });
        assert!(!seen, "the plugin code ran off the executor");
    }
}
