//! The `switchyard` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use switchyard::fleet::router::Router;
use switchyard::startup::Startup;
use switchyard::tools::engine_sim::{self, EngineSimArgs};
use switchyard::tools::replay::{self, ReplayArgs};
use switchyard::tools::summary;

#[derive(Parser)]
#[command(
    name = "switchyard",
    version,
    about = "LLM inference request router with plugin worker-selection policies"
)]
struct Cli {
    /// Log lines as text (coloured only on a terminal) or as one JSON object per line,
    /// for log collectors. `RUST_LOG` sets the level (default `info`).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "SWITCHYARD_LOG_FORMAT"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Logs go to stderr: colour escape codes only when it is a terminal. The ZeroMQ crate
/// logs every peer reconnection at info and warn; the KV-event subscriber reports what
/// matters about its publishers itself, so by default only the crate's errors show.
fn init_logs(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,zeromq=error".into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => logs.json().with_current_span(false).init(),
    }
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
        /// Also serve the Envoy endpoint picker (ext_proc gRPC) on this address; overrides
        /// the config's `ext_proc.listen`.
        #[arg(long, value_name = "ADDR")]
        ext_proc: Option<std::net::SocketAddr>,
        /// Serve a non-loopback address without API keys (a lab network only; see
        /// docs/security.md). Same as `auth.insecure: true`.
        #[arg(long)]
        insecure: bool,
    },
    /// Load every plugin, run every check, build every instance; print a summary.
    Check {
        /// The config file; the embedded default config when omitted.
        #[arg(long)]
        config: Option<PathBuf>,
        /// The Envoy dynamic module's filter_config (its JSON text, as in Envoy's config),
        /// checked, then the switchyard config it names.
        #[arg(long, conflicts_with = "config")]
        envoy_filter_config: Option<String>,
    },
    /// Dry-run one selection through a configured instance, without a running router.
    Select(switchyard::tools::dry_run::SelectArgs),
    /// Replay a request trace (Mooncake JSONL) against simulated workers, per policy.
    Replay(ReplayArgs),
    /// Run a simulated OpenAI-compatible inference engine (for tests, benchmarks, demos).
    EngineSim(EngineSimArgs),
    /// Send a request trace (Mooncake JSONL) to a running server at the trace's times,
    /// streamed; print the time-to-first-token quantiles.
    SendTrace(switchyard::tools::send_trace::SendTraceArgs),
    /// Internal: exercise one plugin in this child process (see startup::probe).
    /// The isolated plugin process (`isolation: process`), started by the router.
    #[command(name = "__isolated-plugins", hide = true)]
    IsolatedPlugins,
    /// Internal: test one plugin type in this child process (see tools::conformance).
    #[command(name = "__plugin-test", hide = true)]
    PluginTestChild,
    /// Work with one plugin library.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Create a plugin project that builds out of the box (Rust, C or C++).
    New(switchyard::tools::scaffold::NewArgs),
    /// Conformance run of a plugin library: every type on generated fleets, each in a
    /// child process; a table (or JSON) and exit status 1 on any finding.
    Test(switchyard::tools::conformance::TestArgs),
    /// Print a plugin's descriptor and registered types.
    Inspect {
        file: PathBuf,
        /// Load the library into this process and run its registration (without it, only
        /// the file's manifest is read and no code of the library runs).
        #[arg(long)]
        load: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Parses the config and runs startup; prints every error and returns None on failure.
fn startup(config: Option<&PathBuf>) -> Option<Startup> {
    startup_probed(config, false)
}

/// Like `startup`; with `probe`, every plugin is first exercised in a child process
/// (`check` and `serve`), and one that crashes there stops startup before it is loaded.
fn startup_probed(config: Option<&PathBuf>, probe: bool) -> Option<Startup> {
    match switchyard::startup::load(config.map(PathBuf::as_path), probe) {
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

/// Prints the config's security warnings and the Dynamo variables set but not read
/// (`check`, and `serve` at startup).
fn warn_hardening(startup: &Startup) {
    for warning in switchyard::config::hardening::warnings(&startup.source) {
        eprintln!("warning: {warning}");
    }
    for warning in switchyard::startup::unread_dynamo_env() {
        eprintln!("warning: {warning}");
    }
}

/// Prints what the config asks policies to read that nothing feeds (`check`, `serve`).
fn warn_unfed_inputs(startup: &Startup) {
    for warning in summary::unfed_input_warnings(startup) {
        eprintln!("warning: {warning}");
    }
}

/// Runs a server future on a multi-threaded runtime until it returns.
fn serve_until_signal(server: impl std::future::Future<Output = std::io::Result<()>>) -> ExitCode {
    // Every proxied request holds a client and an engine socket: raise the soft limit on
    // open files to the hard limit, as servers do, instead of failing at ~500 streams.
    if let Err(e) = rlimit::increase_nofile_limit(u64::MAX) {
        tracing::warn!(error = %e, "could not raise the open-file limit");
    }
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
    match runtime.block_on(server) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A command whose output goes to a pipe that closes (`switchyard replay | head`) ends
/// as other Unix tools do, by SIGPIPE, instead of a panic in `println!`. Servers keep
/// ignoring SIGPIPE (Rust's default): a client's closed socket is an error to handle.
fn end_quietly_on_closed_stdout() {
    use nix::sys::signal::{signal, SigHandler, Signal};
    // SAFETY: restoring the default disposition installs no handler code; it runs before
    // any thread is started.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logs(cli.log_format);
    // One TLS crypto provider for every client and listener of the process.
    switchyard::engines::tls::install_default_provider();
    if !matches!(cli.command, Command::Serve { .. } | Command::EngineSim(_)) {
        end_quietly_on_closed_stdout();
    }
    match cli.command {
        Command::Serve {
            config,
            listen,
            ext_proc,
            insecure,
        } => serve(config.as_ref(), listen, ext_proc, insecure),
        Command::EngineSim(args) => serve_until_signal(engine_sim::run(args)),
        Command::IsolatedPlugins => {
            ExitCode::from(u8::try_from(switchyard::isolation::child::run()).unwrap_or(2))
        }
        Command::Replay(args) => reported(replay::run(&args), |()| {}),
        Command::SendTrace(args) => {
            reported(switchyard::tools::send_trace::run(&args), |summary| {
                println!(
                    "{}",
                    serde_json::to_string(&summary).expect("a summary serializes")
                );
            })
        }
        Command::Check {
            config,
            envoy_filter_config: None,
        } => check(config.as_ref()),
        Command::Check {
            envoy_filter_config: Some(json),
            ..
        } => check_envoy_filter_config(&json),
        Command::Select(args) => {
            let Some(startup) = startup(args.config.as_ref()) else {
                return ExitCode::FAILURE;
            };
            reported(switchyard::tools::dry_run::run(&args, &startup), |out| {
                print!("{out}");
            })
        }
        Command::PluginTestChild => {
            ExitCode::from(u8::try_from(switchyard::tools::conformance::run_child()).unwrap_or(2))
        }
        Command::Plugin {
            command: PluginCommand::Test(args),
        } => plugin_test(&args),
        Command::Plugin {
            command: PluginCommand::New(args),
        } => reported(switchyard::tools::scaffold::new_plugin(&args), |dir| {
            println!(
                "created {}: build and check it with {}/test.sh",
                dir.display(),
                dir.display()
            );
        }),
        Command::Plugin {
            command: PluginCommand::Inspect { file, load, json },
        } => inspect(&file, load, json),
    }
}

/// Success prints what `ok` prints; an error is printed on stderr and fails the exit status.
fn reported<T, E: std::fmt::Display>(result: Result<T, E>, ok: impl FnOnce(T)) -> ExitCode {
    match result {
        Ok(value) => {
            ok(value);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `switchyard serve`: the router until SIGINT or SIGTERM.
fn serve(
    config: Option<&PathBuf>,
    listen: std::net::SocketAddr,
    ext_proc: Option<std::net::SocketAddr>,
    insecure: bool,
) -> ExitCode {
    let Some(startup) = startup_probed(config, true) else {
        return ExitCode::FAILURE;
    };
    print!("{}", summary::check_summary(&startup));
    warn_unfed_inputs(&startup);
    // On loopback only this machine's users reach it; beyond, say what is open.
    if !listen.ip().to_canonical().is_loopback() {
        warn_hardening(&startup);
    }
    let mut ext_proc_settings = startup.config().ext_proc.clone();
    if let Some(address) = ext_proc {
        match &mut ext_proc_settings {
            Some(settings) => settings.listen = address,
            None => {
                ext_proc_settings = Some(switchyard::config::ExtProcSettings::listening(address))
            }
        }
    }
    let router = match Router::new(startup) {
        Ok(router) => std::sync::Arc::new(router),
        Err(e) => {
            eprintln!("error: in `workers:` of the config: {e}");
            return ExitCode::FAILURE;
        }
    };
    serve_until_signal(switchyard::serve::http_service::serve(
        router,
        switchyard::serve::http_service::ServeOptions {
            listen,
            ext_proc: ext_proc_settings,
            insecure,
        },
    ))
}

/// `switchyard check`: loads everything `serve` would, starts nothing.
fn check(config: Option<&PathBuf>) -> ExitCode {
    let Some(startup) = startup_probed(config, true) else {
        return ExitCode::FAILURE;
    };
    // The lines printed, as `serve` would refuse to start.
    let mut errors: Vec<String> = Vec::new();
    let tokenizers =
        switchyard::serve::frontend::load_tokenizers(&startup.source).unwrap_or_else(|refused| {
            errors.extend(refused.iter().map(ToString::to_string));
            Default::default()
        });
    if errors.is_empty() {
        let tls = switchyard::engines::tls::check_files(&startup.source);
        errors.extend(tls.iter().map(ToString::to_string));
        errors.extend(check_token_file(&startup.source));
    }
    if !errors.is_empty() {
        for e in &errors {
            eprintln!("error: {e}");
        }
        eprintln!("{} error(s); nothing was started", errors.len());
        return ExitCode::FAILURE;
    }
    print!("{}", summary::check_summary(&startup));
    warn_hardening(&startup);
    warn_unfed_inputs(&startup);
    if !tokenizers.is_empty() {
        println!(
            "tokenizers: {} model(s) tokenize their prompts",
            tokenizers.len()
        );
    }
    ExitCode::SUCCESS
}

/// `check --envoy-filter-config`: the Envoy module's filter_config read as the module
/// reads it, then against the switchyard config it names (a headers-only filter cannot
/// feed a config that routes on the prompt), then that config checked.
fn check_envoy_filter_config(json: &str) -> ExitCode {
    use switchyard::config::envoy_module::EnvoyModuleSettings;
    let settings = match EnvoyModuleSettings::parse(json.as_bytes()) {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    // A config that does not read is reported by `check` below, with its lines.
    let source = switchyard::config::ConfigSource::from_file(&settings.config).ok();
    if let Some(e) = source.and_then(|s| settings.check_config(&s).err()) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    println!(
        "envoy filter config: ok (config {}, listen {}, probe {}, {})",
        settings.config.display(),
        settings.listen.map_or("-".to_owned(), |l| l.to_string()),
        settings.probe,
        settings
            .model_header()
            .map_or("reads the body".to_owned(), |h| format!(
                "headers only, model in `{h}`"
            ))
    );
    check(Some(&settings.config))
}

/// `replicas.token_file` read as `serve` would (through the file gate); the error line.
fn check_token_file(source: &switchyard::config::ConfigSource) -> Option<String> {
    use switchyard_plugin_host::file_gate::{read_text, FileKind};
    let path = source.config.replicas.as_ref()?.token_file.as_ref()?;
    let resolved = source.resolve(path);
    let error = read_text(&resolved, FileKind::Token).err()?;
    let message = format!("replicas.token_file {}: {error}", resolved.display());
    let value = path.to_string_lossy();
    Some(
        source
            .error_at("token_file", &value, 0, message)
            .to_string(),
    )
}

/// `switchyard plugin test`: the conformance suite's table (or JSON); exit 2 when it could not run.
fn plugin_test(args: &switchyard::tools::conformance::TestArgs) -> ExitCode {
    match switchyard::tools::conformance::run(args) {
        Ok(reports) => {
            if let Some(warning) = switchyard::tools::conformance::optimization_warning(&args.file)
            {
                eprintln!("warning: {warning}");
            }
            if args.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&reports).unwrap_or_default()
                );
            } else {
                print!(
                    "{}",
                    switchyard::tools::conformance::table(&args.file, &reports)
                );
            }
            if reports.iter().all(|r| r.passed()) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// `switchyard plugin inspect`: a library this router would refuse is shown, and the exit
/// status says so.
fn inspect(file: &std::path::Path, load: bool, json: bool) -> ExitCode {
    let shown = if load {
        summary::inspect_loaded(file)
            .map(|(i, text)| (serde_json::to_string_pretty(&i), text, false))
    } else {
        summary::inspect_file(file).map(|(i, text)| {
            let refused = i.refused.is_some();
            (serde_json::to_string_pretty(&i), text, refused)
        })
    };
    match shown {
        Ok((as_json, text, refused)) => {
            if json {
                println!("{}", as_json.expect("serializable"));
            } else {
                print!("{text}");
            }
            if refused {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
