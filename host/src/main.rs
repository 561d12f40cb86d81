//! The `switchyard` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use switchyard::config::ConfigSource;
use switchyard::startup::{start, Startup};

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
    /// Load every plugin, run every check, build every instance; print a summary.
    Check {
        /// The config file; the embedded default config when omitted.
        #[arg(long)]
        config: Option<PathBuf>,
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

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Check { config } => match startup(config.as_ref()) {
            Some(startup) => {
                print!("{}", switchyard::summary::check_summary(&startup));
                ExitCode::SUCCESS
            }
            None => ExitCode::FAILURE,
        },
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
