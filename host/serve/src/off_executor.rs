//! Where a request's parsing and selection run. Plugin code never runs on the async
//! executor's threads: when the request's policy instance or an admitter is a plugin
//! library's (its filters, scorers, pickers, admitters or policy type are in the
//! request's path, or an isolated call may wait on another process), or a tokenizer
//! runs, or the input is large, the work goes to the blocking pool. Otherwise only the
//! router's own code runs, bounded by `INLINE_INPUT_BYTES` of input, and it runs inline:
//! the two thread hand-offs the pool costs (a futex wake each way) are most of a small
//! request's CPU (docs/BENCHMARKS.md, the Envoy endpoint picker). A router that loads a
//! plugin for one instance still serves its built-in instances inline.

use std::panic::AssertUnwindSafe;

use switchyard_fleet::router::Router;
use switchyard_policy::registry::Origin;

/// The most input (a request body) parsed and selected on the executor's thread: a
/// JSON parse and a block hash of this much take tens of microseconds.
pub const INLINE_INPUT_BYTES: usize = 64 << 10;

/// Whether work over `input_bytes` of input for policy `instance` (the default instance
/// when `None`) may run inline: the input is small, and no plugin library is loaded in
/// the router's current generation, or that instance and every admitter are the
/// router's own. An unknown instance is not: its error comes from the blocking pool.
pub fn inline_ok(router: &Router, input_bytes: usize, instance: Option<&str>) -> bool {
    if input_bytes > INLINE_INPUT_BYTES {
        return false;
    }
    let generation = router.generation();
    let startup = &generation.startup;
    if startup.registry.plugins().is_empty() {
        return true;
    }
    // Any role's default: the decision is made before the role is known to this check.
    let ours = |name: &str| {
        startup
            .instance(name)
            .is_some_and(|i| i.runs_only_router_code())
    };
    let admitters_ours = startup
        .admitters
        .iter()
        .all(|a| matches!(a.component.origin, Origin::Builtin));
    admitters_ours
        && instance.map_or_else(
            || {
                switchyard_plugin_sdk::WorkerType::ALL
                    .into_iter()
                    .all(|role| ours(startup.default_for(role)))
            },
            ours,
        )
}

/// Work that did not finish: it panicked inline, or its blocking task did not end.
#[derive(Debug, thiserror::Error)]
pub enum Unfinished {
    /// The panic's message.
    #[error("{0}")]
    Panicked(String),
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
}

/// Runs `work` inline when `inline`, else on the blocking pool; a panic in it is an
/// error (its message), not a crash, either way.
pub async fn run<T: Send + 'static>(
    inline: bool,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Unfinished> {
    if inline {
        // Marked inline: should a reload have made the request's instance a plugin's
        // since the decision, the router moves that plugin code off this thread.
        let work = || switchyard_fleet::executor::inline(work);
        return std::panic::catch_unwind(AssertUnwindSafe(work)).map_err(|panic| {
            Unfinished::Panicked(
                panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "it panicked".to_owned()),
            )
        });
    }
    Ok(tokio::task::spawn_blocking(work).await?)
}

#[cfg(test)]
mod tests {
    use super::{run, Unfinished};

    #[tokio::test]
    async fn both_ways_answer_and_a_panic_is_an_error() {
        assert_eq!(run(true, || 7).await.unwrap(), 7);
        assert_eq!(run(false, || 7).await.unwrap(), 7);
        let inline = run(true, || -> u32 { panic!("deliberate") }).await;
        assert!(matches!(inline, Err(Unfinished::Panicked(m)) if m == "deliberate"));
        let pooled = run(false, || -> u32 { panic!("deliberate") }).await;
        assert!(pooled.is_err_and(|e| e.to_string().contains("panicked")));
    }
}
