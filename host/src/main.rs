//! The `switchyard` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use switchyard::config::ConfigSource;
use switchyard::pipeline::{CandidateRow, Selector};
use switchyard::registry::PartitionKey;
use switchyard::request::RequestContext;
use switchyard::router::Router;
use switchyard::startup::{start, Startup};
use switchyard_plugin_sdk::{WorkerId, WorkerType};

#[derive(Parser)]
#[command(
    name = "switchyard",
    version,
    about = "LLM inference request router with plugin worker-selection policies"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the router's HTTP service (the embedded default config without --config).
    Serve {
        #[arg(long)]
        config: Option<PathBuf>,
        /// Address to listen on; loopback by default.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
    },
    /// Load every plugin, run every check, build every instance; print a summary.
    Check {
        /// The config file; the embedded default config when omitted.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Dry-run one selection through a configured instance, without a running router.
    Select {
        #[arg(long)]
        config: Option<PathBuf>,
        /// Instance name; the config's default when omitted.
        #[arg(long)]
        instance: Option<String>,
        /// Prompt size in KV blocks.
        #[arg(long, default_value_t = 16)]
        blocks: u64,
        /// A candidate as ID:DEVICE_OVERLAP_BLOCKS:ACTIVE_REQUESTS (repeat for each worker).
        #[arg(long = "worker", value_parser = parse_worker, required = true)]
        workers: Vec<CandidateRow>,
    },
    /// Replay a request trace (Mooncake JSONL) against simulated workers, per policy.
    Replay {
        /// The trace: one JSON object per line with timestamp (ms), input_length,
        /// output_length and hash_ids.
        #[arg(long)]
        trace: PathBuf,
        /// Simulated workers.
        #[arg(long, default_value_t = 8)]
        workers: usize,
        /// Instance names to compare (repeat). Without --config: default, least-busy,
        /// kv-overlap, load-only (built-in).
        #[arg(long = "policy", required = true)]
        policies: Vec<String>,
        /// A config whose instances (and plugins) the policies name.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Prefix-cache capacity of each worker, in blocks.
        #[arg(long, default_value_t = 4096)]
        cache_blocks: usize,
        /// Prefill throughput of each worker, tokens per second.
        #[arg(long, default_value_t = 20_000.0)]
        prefill_tps: f64,
        /// Decode speed of each request, tokens per second.
        #[arg(long, default_value_t = 40.0)]
        decode_tps: f64,
        /// Tokens per block of the trace's hash_ids.
        #[arg(long, default_value_t = 512)]
        block_size: u32,
        /// Where to write the CSV.
        #[arg(long, default_value = "replay.csv")]
        csv: PathBuf,
        /// Where to write the SVG chart.
        #[arg(long, default_value = "replay.svg")]
        svg: PathBuf,
    },
    /// Work with one plugin library.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Print a plugin's descriptor and registered types.
    Inspect {
        file: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn parse_worker(text: &str) -> Result<CandidateRow, String> {
    let fields: Vec<&str> = text.split(':').collect();
    let [id, device, active] = fields[..] else {
        return Err(format!(
            "expected ID:DEVICE_OVERLAP_BLOCKS:ACTIVE_REQUESTS, found `{text}`"
        ));
    };
    let number = |what: &str, s: &str| {
        s.parse::<u64>()
            .map_err(|_| format!("{what} must be a whole number, found `{s}` in `{text}`"))
    };
    let mut row = CandidateRow::new(WorkerId {
        worker_id: number("ID", id)?,
        dp_rank: 0,
    });
    row.cache.device_overlap_blocks = number("DEVICE_OVERLAP_BLOCKS", device)? as u32;
    row.load.active_requests = number("ACTIVE_REQUESTS", active)? as u32;
    Ok(row)
}

/// Parses the config and runs startup; prints every error and returns None on failure.
fn startup(config: Option<&PathBuf>) -> Option<Startup> {
    let source = match config {
        Some(path) => ConfigSource::from_file(path),
        None => ConfigSource::embedded(),
    };
    let source = match source {
        Ok(source) => source,
        Err(e) => {
            eprintln!("error: {e}");
            return None;
        }
    };
    match start(source) {
        Ok(startup) => Some(startup),
        Err(errors) => {
            for e in &errors {
                eprintln!("error: {e}");
            }
            eprintln!("{} error(s); nothing was started", errors.len());
            None
        }
    }
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

#[allow(clippy::too_many_arguments)]
fn run_replay(
    trace_path: &std::path::Path,
    workers: usize,
    policies: &[String],
    config: Option<&PathBuf>,
    cache_blocks: usize,
    prefill_tps: f64,
    decode_tps: f64,
    block_size: u32,
    csv_path: &std::path::Path,
    svg_path: &std::path::Path,
) -> Result<(), String> {
    use switchyard::replay;
    for (name, value) in [("--prefill-tps", prefill_tps), ("--decode-tps", decode_tps)] {
        if !(value.is_finite() && value > 0.0) {
            return Err(format!("{name} must be a positive number, got {value}"));
        }
    }
    if workers == 0 || block_size == 0 || cache_blocks == 0 {
        return Err("--workers, --block-size and --cache-blocks must be at least 1".into());
    }
    let trace = replay::read_trace(trace_path).map_err(|e| e.to_string())?;
    let params = replay::SimParams {
        workers,
        cache_blocks,
        prefill_tokens_per_s: prefill_tps,
        decode_tokens_per_s: decode_tps,
        block_size,
    };
    let fresh_router = || -> Result<Router, String> {
        let source = match config {
            Some(path) => ConfigSource::from_file(path),
            None => ConfigSource::parse(
                REPLAY_BUILTIN_CONFIG.into(),
                "<replay built-in config>".into(),
                PathBuf::new(),
            ),
        }
        .map_err(|e| e.to_string())?;
        let mut startup = start(source).map_err(|errors| {
            errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        })?;
        startup.source.config.workers.clear();
        startup.source.config.router.block_size = block_size;
        if let Some(unknown) = policies.iter().find(|p| startup.instance(p).is_none()) {
            let names: Vec<_> = startup.instances.iter().map(|i| i.name.as_str()).collect();
            return Err(format!(
                "--policy {unknown}: no such instance; available: {}",
                names.join(", ")
            ));
        }
        Router::new(startup).map_err(|e| e.to_string())
    };
    fresh_router()?;
    let mut reports = Vec::new();
    for policy in policies {
        let router = fresh_router()?;
        let bar = indicatif::ProgressBar::new(trace.len() as u64).with_message(policy.clone());
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg:>16} [{bar:40}] {pos}/{len} requests ({per_sec})",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        let report = replay::replay(&router, &trace, params, policy, |n| {
            bar.set_position(n as u64)
        })
        .map_err(|e| e.to_string())?;
        bar.finish_and_clear();
        reports.push(report);
    }
    print!("{}", replay::table(&reports));
    std::fs::write(csv_path, replay::csv(&reports))
        .map_err(|e| format!("{}: cannot write the CSV: {e}", csv_path.display()))?;
    let title = format!(
        "{} requests, {workers} workers, {cache_blocks}-block LRU caches, prefill {prefill_tps} tok/s, decode {decode_tps} tok/s",
        trace.len()
    );
    std::fs::write(svg_path, replay::svg(&reports, &title))
        .map_err(|e| format!("{}: cannot write the SVG: {e}", svg_path.display()))?;
    println!("wrote {} and {}", csv_path.display(), svg_path.display());
    Ok(())
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Serve { config, listen } => {
            let Some(startup) = startup(config.as_ref()) else {
                return ExitCode::FAILURE;
            };
            print!("{}", switchyard::summary::check_summary(&startup));
            let router = match Router::new(startup) {
                Ok(router) => std::sync::Arc::new(router),
                Err(e) => {
                    eprintln!("error: in `workers:` of the config: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    eprintln!("error: cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(switchyard::http_service::serve(router, listen)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Replay {
            trace,
            workers,
            policies,
            config,
            cache_blocks,
            prefill_tps,
            decode_tps,
            block_size,
            csv,
            svg,
        } => {
            match run_replay(
                &trace,
                workers,
                &policies,
                config.as_ref(),
                cache_blocks,
                prefill_tps,
                decode_tps,
                block_size,
                &csv,
                &svg,
            ) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Check { config } => match startup(config.as_ref()) {
            Some(startup) => {
                print!("{}", switchyard::summary::check_summary(&startup));
                ExitCode::SUCCESS
            }
            None => ExitCode::FAILURE,
        },
        Command::Select {
            config,
            instance,
            blocks,
            workers,
        } => {
            let Some(startup) = startup(config.as_ref()) else {
                return ExitCode::FAILURE;
            };
            let name = instance.unwrap_or_else(|| startup.default_instance.clone());
            let Some(factory) = startup.instance(&name) else {
                let names: Vec<_> = startup.instances.iter().map(|i| i.name.as_str()).collect();
                eprintln!(
                    "error: no instance `{name}`; the config has: {}",
                    names.join(", ")
                );
                return ExitCode::FAILURE;
            };
            let policy = match factory.build(&PartitionKey::new("dry-run", WorkerType::Select)) {
                Ok(policy) => policy,
                Err(e) => {
                    eprintln!("error: instance `{name}` cannot be built: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let request = RequestContext::new(startup.source.config.router.block_size, blocks);
            match Selector::new(policy).select(&request, workers) {
                Ok(worker) => {
                    println!("worker {} dp_rank {}", worker.worker_id, worker.dp_rank);
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: instance `{name}`: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Plugin {
            command: PluginCommand::Inspect { file, json },
        } => match switchyard::summary::inspect(&file) {
            Ok((inspection, text)) => {
                if json {
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&inspection).expect("serializable")
                    );
                } else {
                    print!("{text}");
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
