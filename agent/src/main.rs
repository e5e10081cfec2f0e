use std::path::PathBuf;

use clap::{Parser, Subcommand};
use lockstep_agent::standalone::{self, OutputFormat, StandaloneArgs};

/// lockstep's agent: runs fio-equivalent workloads on this machine's volumes.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a fio job file on this machine, like `fio JOBFILE`.
    Run {
        jobfile: PathBuf,
        /// normal (fio's human summary) or json (fio's JSON structure).
        #[arg(long, default_value = "normal")]
        output_format: OutputFormat,
        /// Write the report here (atomically) instead of standard output.
        #[arg(long)]
        output: Option<PathBuf>,
        /// Override or add an option for every job, e.g. --set directory=/mnt/test.
        #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_override)]
        overrides: Vec<(String, String)>,
        /// Allow raw block devices as targets (refused anyway if mounted or carrying a signature).
        #[arg(long)]
        allow_block_devices: bool,
        /// Keep the files lockstep created (removed at the end by default).
        #[arg(long)]
        keep_files: bool,
    },
}

fn parse_override(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ if !s.trim().is_empty() && !s.contains('=') => Ok((s.trim().to_string(), String::new())),
        _ => Err(format!("expected KEY=VALUE, got '{s}'")),
    }
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LOCKSTEP_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run { jobfile, output_format, output, overrides, allow_block_devices, keep_files } => {
            standalone::run(&StandaloneArgs {
                jobfile,
                format: output_format,
                output,
                overrides,
                allow_block_devices,
                keep_files,
            })
        }
    };
    match result {
        Ok(outcome) if outcome.failed || outcome.interrupted => std::process::ExitCode::from(1),
        Ok(_) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lockstep-agent: error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
