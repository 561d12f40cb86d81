//! The checks of one type, run in the child: a component's outputs on every fleet and
//! variant (`test_component`), an admitter's answers (`test_admitter`), a policy's
//! selections and notifications (`test_policy`), each reported as findings.

use super::*;

/// What is wrong with one output, if anything.
pub(super) fn judge(
    output: &RawOutput,
    count: usize,
    candidates: &Candidates,
) -> Option<(&'static str, String)> {
    match output {
        RawOutput::Keep(keep) => keep.iter().position(|&k| k > 1).map(|row| {
            (
                "filter mask is 0 or 1",
                format!(
                    "wrote {} for worker {} (row {row})",
                    keep[row],
                    candidates.worker(row).worker_id
                ),
            )
        }),
        RawOutput::Costs(costs) => costs.iter().position(|c| !c.is_finite()).map(|row| {
            (
                "scorer costs are finite",
                format!(
                    "cost {} for worker {} (row {row})",
                    costs[row],
                    candidates.worker(row).worker_id
                ),
            )
        }),
        RawOutput::Row(row) if *row >= count => Some((
            "picker row in range",
            format!("returned row {row} of {count} candidates"),
        )),
        RawOutput::Row(_) => None,
    }
}

pub(super) fn unknown_parameters_refused(refused: bool) {
    finding(
        "unknown parameters refused",
        refused,
        if refused {
            String::new()
        } else {
            format!("accepted `{UNKNOWN_KEY}`: a misspelt key would be silently ignored; refuse keys you do not know")
        },
    );
}

/// An admitter, asked about requests with and without a tenant in partitions from idle to
/// saturated: its answers must be valid (the router checks them as it does when serving)
/// and, unless random by design, the same for the same input, from any thread.
pub(super) fn test_admitter(stage: &mut Stage, allow_random: bool) {
    let mut with_tenant = conformance_request();
    let mut without = conformance_request();
    if let Some(attributes) = &without.attributes {
        let mut anonymous = RequestAttributes::clone(attributes);
        anonymous.tenant = None;
        without.attributes = Some(Arc::new(anonymous));
    }
    let mut failures: Vec<(&str, String)> = Vec::new();
    let mut error = ErrorBuffer::new();
    let mut ask = |stage: &mut Stage, request: &RouteRequest, saturation: &Saturation| {
        request.with_abi(CONFORMANCE_PROMPT, |raw| {
            stage.admit(raw, saturation, &mut error)
        })
    };
    for (request, who) in [(&mut with_tenant, "tenant-a"), (&mut without, "no tenant")] {
        for (name, saturation) in saturations() {
            emit(&Line::Phase(format!(
                "asking it about a request of {who}, {name}"
            )));
            let first = ask(stage, request, &saturation);
            let second = ask(stage, request, &saturation);
            match (&first, &second) {
                (Err(e), _) | (_, Err(e)) => failures.push((
                    "answers are valid",
                    format!("{who}, {name}: {} {}", e.status.name(), e.message),
                )),
                (Ok(a), Ok(b)) if a != b && !allow_random => failures.push((
                    "same input, same output",
                    format!("{who}, {name}: answered {a:?}, then {b:?} (pass --allow-random if the type is random or stateful by design, as a rate limit is)"),
                )),
                _ => {}
            }
            request.strict_priority = 0;
        }
    }
    emit(&Line::Phase("asking it from another thread".into()));
    let (_, saturation) = saturations()[1];
    let here = ask(stage, &with_tenant, &saturation).ok();
    let there = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let mut error = ErrorBuffer::new();
                with_tenant
                    .with_abi(CONFORMANCE_PROMPT, |raw| {
                        stage.admit(raw, &saturation, &mut error)
                    })
                    .ok()
            })
            .join()
            .ok()
            .flatten()
    });
    if !allow_random && here.is_some() && here != there {
        failures.push((
            "another thread, same output",
            format!("answered {here:?} here and {there:?} on another thread"),
        ));
    }
    for check in [
        "answers are valid",
        "same input, same output",
        "another thread, same output",
    ] {
        match failures.iter().find(|(c, _)| *c == check) {
            Some((_, detail)) => finding(check, false, detail.clone()),
            None => finding(check, true, ""),
        }
    }
    emit(&Line::Phase("timing it".into()));
    let calls = 2_000;
    let started = Instant::now();
    for _ in 0..calls {
        let _ = ask(stage, &with_tenant, &saturation);
    }
    let per_call = started.elapsed().as_nanos() as f64 / f64::from(calls);
    // An admitter sees no candidates: its time is per call only.
    emit(&Line::Timing {
        ns_per_call: per_call,
        ns_per_candidate: None,
    });
}

pub(super) fn test_component(stage: &mut Stage, allow_random: bool) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let request = conformance_request();
    let mut failures: Vec<(&str, String)> = Vec::new();
    let mut candidates = Candidates::default();
    for &count in &FLEETS {
        for variant in ["zeros", "maxima", "random"] {
            emit(&Line::Phase(format!(
                "calling it on {count} candidates ({variant} values)"
            )));
            candidates.fill(stage.inputs, rows(count, variant, &mut rng));
            candidates.fill_labels(labels(count, &mut rng));
            candidates.fill_engine(engine_reports(count, &mut rng));
            let costs: Vec<f64> = (0..count).map(|i| (i % 7) as f64).collect();
            let first = match stage.call_once(&request, CONFORMANCE_PROMPT, &candidates, &costs) {
                Ok(output) => output,
                Err(e) => {
                    failures.push((
                        "calls succeed",
                        format!(
                            "{count} candidates ({variant}): {} {}",
                            e.status.name(),
                            e.message
                        ),
                    ));
                    continue;
                }
            };
            if let Some(problem) = judge(&first, count, &candidates) {
                failures.push((
                    problem.0,
                    format!("{count} candidates ({variant}): {}", problem.1),
                ));
            }
            emit(&Line::Phase(format!(
                "calling it again on the same {count} candidates ({variant})"
            )));
            if let Ok(second) = stage.call_once(&request, CONFORMANCE_PROMPT, &candidates, &costs) {
                if !same(&second, &first) && !allow_random {
                    failures.push(("same input, same output", format!("{count} candidates ({variant}): two calls answered differently (pass --allow-random if the type is random by design)")));
                }
            }
        }
    }
    other_thread_and_notifications(
        stage,
        &request,
        &mut candidates,
        &mut rng,
        allow_random,
        &mut failures,
    );
    report_failures(stage, &failures);
    emit(&Line::Phase("timing it on 1,024 candidates".into()));
    candidates.fill(stage.inputs, rows(1024, "random", &mut rng));
    candidates.fill_labels(labels(1024, &mut rng));
    candidates.fill_engine(engine_reports(1024, &mut rng));
    let costs = vec![1.0; 1024];
    let calls = 200;
    let started = Instant::now();
    for _ in 0..calls {
        let _ = stage.call_once(&request, CONFORMANCE_PROMPT, &candidates, &costs);
    }
    let per_call = started.elapsed().as_nanos() as f64 / f64::from(calls);
    emit(&Line::Timing {
        ns_per_call: per_call,
        ns_per_candidate: Some(per_call / 1024.0),
    });
}

/// A call from another thread answers as one from this thread; the lifecycle
/// notifications (if the component takes them) succeed.
pub(super) fn other_thread_and_notifications(
    stage: &mut Stage,
    request: &RouteRequest,
    candidates: &mut Candidates,
    rng: &mut rand::rngs::StdRng,
    allow_random: bool,
    failures: &mut Vec<(&'static str, String)>,
) {
    emit(&Line::Phase("calling it from another thread".into()));
    candidates.fill(stage.inputs, rows(64, "random", rng));
    candidates.fill_labels(labels(64, rng));
    candidates.fill_engine(engine_reports(64, rng));
    let costs = vec![1.0; 64];
    let here = stage
        .call_once(request, CONFORMANCE_PROMPT, &*candidates, &costs)
        .ok();
    let there = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                stage
                    .call_once(request, CONFORMANCE_PROMPT, &*candidates, &costs)
                    .ok()
            })
            .join()
            .ok()
            .flatten()
    });
    let agree = match (&here, &there) {
        (Some(a), Some(b)) => same(a, b),
        (a, b) => a.is_none() && b.is_none(),
    };
    if !allow_random && here.is_some() && !agree {
        failures.push((
            "another thread, same output",
            "a call from another thread answered differently".into(),
        ));
    }
    if stage.notified() {
        emit(&Line::Phase(
            "delivering its lifecycle notifications".into(),
        ));
        let mut error = ErrorBuffer::new();
        for (event, outcome) in lifecycle_script() {
            let result = request.with_abi(CONFORMANCE_PROMPT, |raw| {
                let selected = (event == Lifecycle::Selected).then_some(&*raw);
                stage.notify(event, selected, &outcome, &mut error)
            });
            if let Err(e) = result {
                failures.push((
                    "lifecycle notifications succeed",
                    format!("{}: {} {}", event.callback(), e.status.name(), e.message),
                ));
            }
        }
    }
}

/// One finding per check that applies to the component's kind: its first failure.
pub(super) fn report_failures(stage: &Stage, failures: &[(&str, String)]) {
    let kind = stage.kind;
    for check in [
        "lifecycle notifications succeed",
        "calls succeed",
        "filter mask is 0 or 1",
        "scorer costs are finite",
        "picker row in range",
        "same input, same output",
        "another thread, same output",
    ] {
        let relevant = match check {
            "lifecycle notifications succeed" => stage.notified(),
            "filter mask is 0 or 1" => kind == ComponentKind::Filter,
            "scorer costs are finite" => kind == ComponentKind::Scorer,
            "picker row in range" => kind == ComponentKind::Picker,
            _ => true,
        };
        if !relevant {
            continue;
        }
        match failures.iter().find(|(c, _)| *c == check) {
            Some((_, detail)) => finding(check, false, detail.clone()),
            None => finding(check, true, ""),
        }
    }
}

/// What the policy's lifecycle notifications failed with, the first failure.
pub(super) fn policy_notifications(
    selector: &mut Selector,
    request: &RouteRequest,
) -> Option<String> {
    let mut failed = None;
    for (event, outcome) in lifecycle_script() {
        let failures = if event == Lifecycle::Selected {
            selector.notify_selected(request, CONFORMANCE_PROMPT, &outcome)
        } else {
            selector.policy.notify(event, None, &outcome)
        };
        if let Some((component, e)) = failures.into_iter().next() {
            failed = failed.or(Some(format!(
                "{} of `{component}`: {} {}",
                event.callback(),
                e.status.name(),
                e.message
            )));
        }
    }
    failed
}

pub(super) fn test_policy(policy: Policy, allow_random: bool) {
    let mut selector = Selector::new(policy);
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let request = conformance_request();
    let mut failure = None;
    for &count in &FLEETS {
        for variant in ["zeros", "maxima", "random"] {
            emit(&Line::Phase(format!(
                "selecting among {count} candidates ({variant} values)"
            )));
            let fleet = rows(count, variant, &mut rng);
            let extras = RowExtras {
                labels: labels(count, &mut rng),
                engine: engine_reports(count, &mut rng),
            };
            let first = selector.select(
                &request,
                CONFORMANCE_PROMPT,
                CandidatesFrom::Rows(&fleet, &extras),
                None,
            );
            let second = selector.select(
                &request,
                CONFORMANCE_PROMPT,
                CandidatesFrom::Rows(&fleet, &extras),
                None,
            );
            match (&first, &second) {
                (Err(e), _) if !e.is_no_worker() => failure = failure.or(Some(("selections succeed", format!("{count} candidates ({variant}): {e}")))),
                (Ok(a), Ok(b)) if a != b && !allow_random => failure = failure.or(Some(("same input, same output", format!("{count} candidates ({variant}): picked worker {} then {} (pass --allow-random if the type is random by design)", a.worker_id, b.worker_id)))),
                _ => {}
            }
        }
    }
    match failure {
        Some((check, detail)) => finding(check, false, detail),
        None => finding("selections succeed", true, ""),
    }
    if selector.policy.notified() {
        let failed = policy_notifications(&mut selector, &request);
        finding(
            "lifecycle notifications succeed",
            failed.is_none(),
            failed.unwrap_or_default(),
        );
    }
    let fleet = rows(1024, "random", &mut rng);
    let extras = RowExtras {
        labels: labels(1024, &mut rng),
        engine: engine_reports(1024, &mut rng),
    };
    let calls = 200;
    let started = Instant::now();
    for _ in 0..calls {
        let _ = selector.select(
            &request,
            CONFORMANCE_PROMPT,
            CandidatesFrom::Rows(&fleet, &extras),
            None,
        );
    }
    let per_call = started.elapsed().as_nanos() as f64 / f64::from(calls);
    emit(&Line::Timing {
        ns_per_call: per_call,
        ns_per_candidate: Some(per_call / 1024.0),
    });
}
