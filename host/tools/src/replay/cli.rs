//! `switchyard replay`: its arguments, the built-in policies it compares without a config,
//! and the run that writes the table, CSV and SVG.

use super::*;

/// What `switchyard replay` takes.
#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// The trace: one JSON object per line with timestamp (ms), input_length,
    /// output_length and hash_ids.
    #[arg(long)]
    pub trace: PathBuf,
    /// Simulated workers.
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
    /// Instance names to compare (repeat). Without --config: default, least-busy,
    /// kv-overlap, load-only (built-in).
    #[arg(long = "policy", required = true)]
    pub policies: Vec<String>,
    /// A config whose instances (and plugins) the policies name.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Prefix-cache capacity of each worker, in blocks.
    #[arg(long, default_value_t = 4096)]
    pub cache_blocks: usize,
    /// Prefill throughput of each worker, tokens per second.
    #[arg(long, default_value_t = 20_000.0)]
    pub prefill_tps: f64,
    /// Decode speed of each request, tokens per second.
    #[arg(long, default_value_t = 40.0)]
    pub decode_tps: f64,
    /// Tokens per block of the trace's hash_ids.
    #[arg(long, default_value_t = 512)]
    pub block_size: u32,
    /// Where to write the CSV.
    #[arg(long, default_value = "replay.csv")]
    pub csv: PathBuf,
    /// Where to write the SVG chart.
    #[arg(long, default_value = "replay.svg")]
    pub svg: PathBuf,
    /// How the workers' KV events reach the router: in process, or over ZeroMQ on
    /// loopback in vLLM's wire format (through the router's real subscribers).
    #[arg(long, value_enum, default_value_t = KvTransport::InProcess)]
    pub kv_events: KvTransport,
    /// Spread the trace over this many router replicas (round robin), each a router of
    /// its own; repeatable to compare counts (e.g. --replicas 1 --replicas 4).
    #[arg(long = "replicas", default_value = "1")]
    pub replicas: Vec<usize>,
    /// Whether the replicas share their bookings (what `replicas:` does over NATS), or
    /// each counts only its own; repeatable to compare.
    #[arg(long = "sync", value_enum, default_value = "shared")]
    pub sync: Vec<ReplicaSync>,
    /// LoRA adapters the requests ask for (0: none); see the module's simulation model.
    #[arg(long, default_value_t = 0)]
    pub adapters: u32,
    /// Adapters each worker holds at once (LRU).
    #[arg(long, default_value_t = 4)]
    pub max_loras: usize,
    /// Time a worker takes to load an adapter it does not hold, in milliseconds.
    #[arg(long, default_value_t = 200.0)]
    pub adapter_load_ms: f64,
    /// Trace time between engine samples (what a scraper at this interval sees); 0
    /// samples before every request.
    #[arg(long, default_value_t = 0)]
    pub engine_sample_ms: u64,
    /// Arrivals this many times faster than the trace's timestamps (2: twice the load);
    /// repeatable to compare.
    #[arg(long = "time-scale", default_value = "1")]
    pub time_scales: Vec<f64>,
    /// The share of requests (0 to 1) sent as the low-priority `batch` tenant, the others
    /// as the high-priority `interactive` one; 0: no tenants. Per-tenant TTFT and refusals
    /// are reported beside each policy's row.
    #[arg(long, default_value_t = 0.0)]
    pub batch_share: f64,
    /// With --decode-workers: compare a disaggregated fleet of this many prefill workers
    /// against an aggregated fleet of the same total size (docs/disaggregation.md).
    #[arg(long, requires = "decode_workers")]
    pub prefill_workers: Option<usize>,
    /// The disaggregated fleet's decode workers.
    #[arg(long, requires = "prefill_workers")]
    pub decode_workers: Option<usize>,
    /// Disaggregated: time to move one block's KV from the prefill to the decode worker.
    #[arg(long, default_value_t = 2.0)]
    pub transfer_ms_per_block: f64,
    /// The share of decode speed a worker's prefill takes from the decodes it runs (both
    /// fleets; a decode worker never prefills).
    #[arg(long, default_value_t = 0.5)]
    pub prefill_interference: f64,
    /// Decodes a worker runs at full speed at once (both fleets); past it they share
    /// the worker's speed.
    #[arg(long, default_value_t = 16)]
    pub decode_batch: usize,
}

/// Instances `replay` offers without --config: built-in policies only.
const REPLAY_BUILTIN_CONFIG: &str = "worker_selection:
  instances:
    - {name: least-busy, type: builtin.least-busy}
    - name: kv-overlap
      scorers: [{type: builtin.kv-overlap}]
      picker: {type: builtin.lowest-cost, parameters: {seed: 1}}
    - name: load-only
      scorers: [{type: builtin.active-requests}]
      picker: {type: builtin.lowest-cost, parameters: {seed: 1}}
";

/// `switchyard replay`: every policy over the trace on a fresh router, a table on stdout,
/// a CSV and an SVG chart.
pub fn run(args: &ReplayArgs) -> Result<(), ReplayError> {
    check_args(args)?;
    let trace = read_trace(&args.trace)?;
    fresh_router(args)?;
    if let (Some(p), Some(d)) = (args.prefill_workers, args.decode_workers) {
        if p == 0 || d == 0 {
            return Err(ReplayError::Arguments(
                "--prefill-workers and --decode-workers must be at least 1",
            ));
        }
        return run_disaggregated(args, &trace, p, d);
    }
    let reports = run_aggregated(args, &trace)?;
    write_reports(args, &trace, &reports)
}

/// The numbers the arguments must satisfy, checked before any work.
fn check_args(args: &ReplayArgs) -> Result<(), ReplayError> {
    use ReplayError::Arguments;
    let ReplayArgs {
        workers,
        cache_blocks,
        prefill_tps,
        decode_tps,
        block_size,
        kv_events,
        ref replicas,
        max_loras,
        adapter_load_ms,
        ref time_scales,
        batch_share,
        ..
    } = *args;
    if time_scales.iter().any(|&t| !(t.is_finite() && t > 0.0))
        || !(0.0..=1.0).contains(&batch_share)
    {
        return Err(Arguments(
            "--time-scale must be a positive number and --batch-share from 0 to 1",
        ));
    }
    if !(adapter_load_ms.is_finite() && adapter_load_ms >= 0.0) || max_loras == 0 {
        return Err(Arguments(
            "--adapter-load-ms must be a number >= 0 and --max-loras at least 1",
        ));
    }
    if replicas.contains(&0) {
        return Err(Arguments("--replicas must be at least 1"));
    }
    if kv_events == KvTransport::Zmq && replicas.iter().any(|&n| n > 1) {
        return Err(Arguments("--replicas above 1 needs --kv-events in-process (each replica would need its own subscriptions to the simulated engines)"));
    }
    for (flag, value) in [("--prefill-tps", prefill_tps), ("--decode-tps", decode_tps)] {
        if !(value.is_finite() && value > 0.0) {
            return Err(ReplayError::NotPositive { flag, value });
        }
    }
    if workers == 0 || block_size == 0 || cache_blocks == 0 {
        return Err(Arguments(
            "--workers, --block-size and --cache-blocks must be at least 1",
        ));
    }
    Ok(())
}

/// A router on the config (or the built-in policies), without workers: the replay adds its own.
fn fresh_router(args: &ReplayArgs) -> Result<Arc<Router>, ReplayError> {
    let (config, policies, block_size) = (&args.config, &args.policies, args.block_size);
    let source = match config {
        Some(path) => ConfigSource::from_file(path),
        None => ConfigSource::parse(
            REPLAY_BUILTIN_CONFIG.into(),
            "<replay built-in config>".into(),
            PathBuf::new(),
        ),
    }?;
    let mut startup = start(source).map_err(ReplayError::Startup)?;
    startup.config_mut().workers.clear();
    startup.config_mut().router.block_size = block_size;
    if let Some(unknown) = policies.iter().find(|p| startup.instance(p).is_none()) {
        return Err(ReplayError::UnknownPolicy {
            name: unknown.clone(),
            available: startup.instances.iter().map(|i| i.name.clone()).collect(),
        });
    }
    Router::new(startup)
        .map(Arc::new)
        .map_err(ReplayError::Router)
}

/// `--prefill-workers` and `--decode-workers`: each policy on pairs and on the same
/// engines aggregated.
fn run_disaggregated(
    args: &ReplayArgs,
    trace: &[TraceRequest],
    p: usize,
    d: usize,
) -> Result<(), ReplayError> {
    let ReplayArgs {
        cache_blocks,
        prefill_tps,
        decode_tps,
        block_size,
        ref policies,
        ref time_scales,
        transfer_ms_per_block,
        prefill_interference,
        decode_batch,
        ..
    } = *args;
    let valid = (0.0..1.0).contains(&prefill_interference)
        && transfer_ms_per_block.is_finite()
        && transfer_ms_per_block.is_sign_positive();
    if !valid {
        return Err(ReplayError::Arguments(
            "--prefill-interference is from 0 to below 1, --transfer-ms-per-block at least 0",
        ));
    }
    let mut reports = Vec::new();
    for policy in policies {
        for &time_scale in time_scales {
            for (prefill, decode, fleet) in [
                (
                    p + d,
                    0,
                    format!("{policy} @{time_scale}x aggregated {}", p + d),
                ),
                (
                    p,
                    d,
                    format!("{policy} @{time_scale}x {p} prefill + {d} decode"),
                ),
            ] {
                let params = disaggregated::PairParams {
                    prefill_workers: prefill,
                    decode_workers: decode,
                    cache_blocks,
                    prefill_tokens_per_s: prefill_tps,
                    decode_tokens_per_s: decode_tps,
                    block_size,
                    transfer_ms_per_block,
                    interference: prefill_interference,
                    decode_batch: decode_batch.max(1),
                    time_scale,
                };
                let router = fresh_router(args)?;
                reports.push(disaggregated::replay_pairs(
                    &router, trace, params, policy, fleet,
                )?);
            }
        }
    }
    print!("{}", disaggregated::table(&reports));
    Ok(())
}

/// Each policy at each replica count; with several replicas, each sync mode.
fn run_aggregated(
    args: &ReplayArgs,
    trace: &[TraceRequest],
) -> Result<Vec<PolicyReport>, ReplayError> {
    let params = SimParams {
        workers: args.workers,
        cache_blocks: args.cache_blocks,
        prefill_tokens_per_s: args.prefill_tps,
        decode_tokens_per_s: args.decode_tps,
        block_size: args.block_size,
        kv_events: args.kv_events,
        replicas: 1,
        sync: ReplicaSync::Shared,
        adapters: args.adapters,
        max_loras: args.max_loras,
        adapter_load_s: args.adapter_load_ms / 1e3,
        engine_sample_us: args.engine_sample_ms.saturating_mul(1000),
        time_scale: 1.0,
        batch_share: args.batch_share,
    };
    let (policies, replicas, sync, time_scales) = (
        &args.policies,
        &args.replicas,
        &args.sync,
        &args.time_scales,
    );
    let mut reports = Vec::new();
    let mut runs = Vec::new();
    for policy in policies {
        for &count in replicas {
            let modes: &[ReplicaSync] = if count == 1 {
                &[ReplicaSync::Shared]
            } else {
                sync
            };
            for &mode in modes {
                for &scale in time_scales {
                    runs.push((policy, count, mode, scale));
                }
            }
        }
    }
    for (policy, count, mode, time_scale) in runs {
        let routers = (0..count)
            .map(|_| fresh_router(args))
            .collect::<Result<Vec<_>, _>>()?;
        let params = SimParams {
            replicas: count,
            sync: mode,
            time_scale,
            ..params
        };
        let bar = indicatif::ProgressBar::new(trace.len() as u64).with_message(policy.clone());
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg:>16} [{bar:40}] {pos}/{len} requests ({per_sec})",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        let report = replay(&routers, trace, params, policy, |n| {
            bar.set_position(n as u64)
        })?;
        bar.finish_and_clear();
        reports.push(report);
    }
    Ok(reports)
}

/// The table on stdout, the CSV and the SVG chart.
fn write_reports(
    args: &ReplayArgs,
    trace: &[TraceRequest],
    reports: &[PolicyReport],
) -> Result<(), ReplayError> {
    let (csv_path, svg_path) = (&args.csv, &args.svg);
    let (workers, cache_blocks, prefill_tps, decode_tps) = (
        args.workers,
        args.cache_blocks,
        args.prefill_tps,
        args.decode_tps,
    );
    print!("{}", table(reports));
    std::fs::write(csv_path, csv(reports)).map_err(|source| ReplayError::Write {
        what: "CSV",
        path: csv_path.clone(),
        source,
    })?;
    let title = format!(
        "{} requests, {workers} workers, {cache_blocks}-block LRU caches, prefill {prefill_tps} tok/s, decode {decode_tps} tok/s",
        trace.len()
    );
    std::fs::write(svg_path, svg(reports, &title)).map_err(|source| ReplayError::Write {
        what: "SVG",
        path: svg_path.clone(),
        source,
    })?;
    println!("wrote {} and {}", csv_path.display(), svg_path.display());
    Ok(())
}
