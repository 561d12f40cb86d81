//! What conformance runs a component on: generated fleets (rows, labels, engine
//! reports), the request, the lifecycle script and the saturations an admitter sees.

use super::*;

/// Labels for `count` rows: a quarter have none, the others a zone and a GPU type.
pub(super) fn labels(count: usize, rng: &mut rand::rngs::StdRng) -> Vec<Arc<Labels>> {
    (0..count)
        .map(|_| {
            if rng.gen_bool(0.25) {
                return Labels::none();
            }
            let map: std::collections::BTreeMap<String, String> = [
                ("zone", ["a", "b", "c"][rng.gen_range(0..3)]),
                ("gpu", ["h100", "a100"][rng.gen_range(0..2)]),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
            Labels::new(&map)
        })
        .collect()
}

/// Engine reports for `count` rows: a quarter never scraped, an eighth stale, the others
/// fresh with random queues, KV usage and adapters.
pub(super) fn engine_reports(count: usize, rng: &mut rand::rngs::StdRng) -> Vec<Arc<EngineReport>> {
    (0..count)
        .map(|_| {
            if rng.gen_bool(0.25) {
                return EngineReport::none();
            }
            let adapters = |rng: &mut rand::rngs::StdRng| -> Box<[Box<str>]> {
                ["sql-lora", "chat-lora"]
                    .into_iter()
                    .filter(|_| rng.gen_bool(0.5))
                    .map(Box::from)
                    .collect()
            };
            let report = EngineReport::new();
            let sample = EngineSample {
                running_requests: f64::from(rng.gen_range(0..64u32)),
                waiting_requests: f64::from(rng.gen_range(0..16u32)),
                kv_cache_usage: rng.gen_range(0.0..=1.0),
                running_adapters: Some(adapters(rng)),
                waiting_adapters: Some(adapters(rng)),
                kv_capacity_tokens: None,
            };
            report.record(sample, std::time::Instant::now());
            if rng.gen_bool(0.125) {
                report.mark_failed("conformance: a failed scrape");
            }
            report
        })
        .collect()
}

/// The prompt's size in the request components are called with.
pub(super) const CONFORMANCE_PROMPT: PromptBlocks = PromptBlocks::new(16, 64);

/// The request components are called with: every attribute set, the `x-zone` and
/// `x-tenant` headers among them (what `request_attributes.headers` might list).
pub(super) fn conformance_request() -> RouteRequest {
    RouteRequest {
        attributes: Some(Arc::new(RequestAttributes {
            request_id: "conformance-1".into(),
            model: "conformance".into(),
            lora_adapter: Some("sql-lora".into()),
            tenant: Some("tenant-a".into()),
            headers: vec![
                ("x-tenant".into(), "tenant-a".into()),
                ("x-zone".into(), "a".into()),
            ],
        })),
        ..RouteRequest::default()
    }
}

/// Candidate rows: zeros, maxima, or random values (seeded), every group set.
pub(super) fn rows(count: usize, variant: &str, rng: &mut rand::rngs::StdRng) -> Vec<CandidateRow> {
    (0..count)
        .map(|i| {
            let mut row = CandidateRow::new(WorkerId {
                worker_id: i as u64 + 1,
                dp_rank: (i % 4) as u32,
            });
            match variant {
                "maxima" => {
                    row.cache.device_overlap_blocks = u32::MAX;
                    row.cache.host_overlap_blocks = u32::MAX;
                    row.cache.disk_overlap_blocks = u32::MAX;
                    row.cache.shared_beyond_device_blocks = u32::MAX;
                    row.load.active_prefill_tokens = u64::MAX;
                    row.load.decode_cost_blocks = u64::MAX;
                    row.load.active_requests = u32::MAX;
                    row.preferred_taint_multiplier = f64::MAX;
                }
                "random" => {
                    row.cache.device_overlap_blocks = rng.gen_range(0..64);
                    row.cache.host_overlap_blocks = rng.gen_range(0..64);
                    row.cache.disk_overlap_blocks = rng.gen_range(0..64);
                    row.cache.shared_beyond_device_blocks = rng.gen_range(0..64);
                    row.load.active_prefill_tokens = rng.gen_range(0..100_000);
                    row.load.decode_cost_blocks = rng.gen_range(0..10_000);
                    row.load.active_requests = rng.gen_range(0..256);
                    row.preferred_taint_multiplier = if rng.gen_bool(0.5) {
                        f64::NAN
                    } else {
                        rng.gen_range(0.0..4.0)
                    };
                }
                _ => {} // zeros, and no taint
            }
            row
        })
        .collect()
}

/// Two routed requests' notifications, as the router sends them: one served (one side of
/// a disaggregated pair, named when it ends), one whose worker went away before its first
/// token.
pub(super) fn lifecycle_script() -> [(Lifecycle, Outcome); 5] {
    let worker = WorkerId {
        worker_id: 1,
        dp_rank: 0,
    };
    let outcome = |request_id, prefill: Option<f64>, finish: Option<f64>| Outcome {
        request_id,
        worker,
        to_prefill_complete: prefill.map(Duration::from_secs_f64),
        to_finish: finish.map(Duration::from_secs_f64),
        paired: None,
    };
    let paired = Outcome {
        paired: Some(WorkerId {
            worker_id: 2,
            dp_rank: 0,
        }),
        ..outcome(1, Some(0.25), Some(2.0))
    };
    [
        (Lifecycle::Selected, outcome(1, None, None)),
        (Lifecycle::Selected, outcome(2, None, None)),
        (Lifecycle::PrefillComplete, outcome(1, Some(0.25), None)),
        (Lifecycle::Finished, paired),
        (Lifecycle::Finished, outcome(2, None, Some(0.5))),
    ]
}

/// The partitions an admitter is asked about: idle, half busy with a short queue, and
/// saturated with a full one.
pub(super) fn saturations() -> [(&'static str, Saturation); 3] {
    let idle = Saturation {
        workers: 8,
        queue_capacity: 64,
        ..Saturation::default()
    };
    [
        ("idle", idle),
        (
            "half busy",
            Saturation {
                busy_workers: 4,
                active_requests: 40,
                active_prefill_tokens: 80_000,
                queued: 3,
                queued_tenant: 1,
                ..idle
            },
        ),
        (
            "saturated",
            Saturation {
                busy_workers: 8,
                active_requests: 400,
                active_prefill_tokens: u64::MAX / 2,
                queued: 64,
                queued_tenant: 64,
                ..idle
            },
        ),
    ]
}

/// `--params`: per type (`TYPE={...}`) and for every other type (a bare object).
pub(super) struct GivenParams {
    pub(super) every: String,
    pub(super) per_type: Vec<(String, String)>,
}

impl GivenParams {
    pub(super) fn parse(given: &[String]) -> Result<GivenParams, ConformanceError> {
        let object = |text: &str| {
            serde_json::from_str::<serde_json::Value>(text).is_ok_and(|v| v.is_object())
        };
        let mut out = GivenParams {
            every: "{}".into(),
            per_type: Vec::new(),
        };
        for one in given {
            let one = one.trim();
            match one.split_once('=') {
                Some((name, json)) if !one.starts_with('{') => {
                    if !object(json) {
                        return Err(ConformanceError::TypeParams {
                            name: name.to_owned(),
                            found: json.to_owned(),
                        });
                    }
                    out.per_type.push((name.trim().to_owned(), json.to_owned()));
                }
                _ if object(one) => out.every = one.to_owned(),
                _ => return Err(ConformanceError::Params(one.to_owned())),
            }
        }
        Ok(out)
    }

    pub(super) fn of(&self, type_name: &str) -> &str {
        self.per_type
            .iter()
            .rev()
            .find(|(name, _)| name == type_name)
            .map_or(&self.every, |(_, json)| json)
    }
}

/// What to tell an author whose parameters `type_name` refused.
pub(super) fn params_hint(type_name: &str, given: &str) -> String {
    if given == "{}" {
        format!("give it valid ones with --params '{type_name}={{...}}'")
    } else {
        format!("it was given {given}; give it its own with --params '{type_name}={{...}}'")
    }
}

pub(super) fn params_with_unknown(params: &str) -> String {
    let mut value: serde_json::Value = serde_json::from_str(params).unwrap_or_default();
    if let Some(object) = value.as_object_mut() {
        object.insert(UNKNOWN_KEY.into(), serde_json::Value::Bool(true));
    }
    value.to_string()
}

pub(super) fn owned(params: &str) -> Option<OwnedParams> {
    match serde_json::from_str(params).ok()? {
        // Factories are handed the router's cost knobs as a default config sets them.
        serde_json::Value::Object(object) => Some(OwnedParams::new(object).with_router(Some(
            switchyard_policy::builtin::router_settings(
                &switchyard_config::RouterSettings::default(),
                &serde_json::Map::new(),
            ),
        ))),
        _ => None,
    }
}
