//! The one poll-until-deadline loop of the tests (and of the benches that start the
//! same processes: they include this file by path), in its sync and async forms.
#![allow(dead_code)]

/// How often `eventually` and its kin look again.
const POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Polls `condition` (every 20 ms) until it holds; fails naming `what` and `deadline`
/// once `deadline` has passed. The one poll-until-deadline loop of the tests.
pub fn eventually(what: &str, deadline: std::time::Duration, mut condition: impl FnMut() -> bool) {
    eventually_ok(what, deadline, || {
        condition().then_some(()).ok_or("not yet")
    });
}

/// Polls `attempt` (every 20 ms) until it gives `Ok`; that value. Fails naming `what`,
/// `deadline` and the last `Err` once `deadline` has passed.
pub fn eventually_ok<T, E: std::fmt::Display>(
    what: &str,
    deadline: std::time::Duration,
    mut attempt: impl FnMut() -> Result<T, E>,
) -> T {
    let started = std::time::Instant::now();
    loop {
        match attempt() {
            Ok(value) => return value,
            Err(last) if started.elapsed() >= deadline => {
                panic!("{what}: not within {deadline:?} (last: {last})")
            }
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

/// `eventually` for async conditions (on a tokio runtime).
pub async fn eventually_async<F: std::future::Future<Output = bool>>(
    what: &str,
    deadline: std::time::Duration,
    mut condition: impl FnMut() -> F,
) {
    eventually_ok_async(what, deadline, || {
        let holds = condition();
        async move { holds.await.then_some(()).ok_or("not yet") }
    })
    .await;
}

/// `eventually_ok` for async attempts (on a tokio runtime).
pub async fn eventually_ok_async<T, E: std::fmt::Display, F>(
    what: &str,
    deadline: std::time::Duration,
    mut attempt: impl FnMut() -> F,
) -> T
where
    F: std::future::Future<Output = Result<T, E>>,
{
    let started = std::time::Instant::now();
    loop {
        match attempt().await {
            Ok(value) => return value,
            Err(last) if started.elapsed() >= deadline => {
                panic!("{what}: not within {deadline:?} (last: {last})")
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}
