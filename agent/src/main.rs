use std::path::PathBuf;

use clap::{Parser, Subcommand};
use lockstep_agent::daemon::{self, DaemonConfig, VolumeConfig};
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
    /// Re-read what verifying jobs wrote, from their saved state (`*.verify-state`, kept with
    /// --keep-files): lost, stale and corrupted blocks by offset, e.g. after a restart.
    /// Exit 0 clean, 1 bad blocks found, 2 the state could not be read.
    Verify {
        /// State files, or directories holding them.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Print the findings as JSON (lockstep's VerifyReport) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Serve a coordinator: run its work on the volumes given here, and nowhere else.
    Serve {
        /// Address to listen on for the coordinator (port 0 picks one; it is printed).
        #[arg(long, default_value = "0.0.0.0:7070")]
        listen: String,
        /// A volume this agent may test: NAME=PATH[,size=60g,kind=gp2,iops=3000,mibs=125].
        #[arg(long = "volume", value_name = "NAME=PATH[,...]", required = true)]
        volumes: Vec<VolumeConfig>,
        /// Name in the cluster (default: the hostname).
        #[arg(long)]
        name: Option<String>,
        /// A label for plans to select this agent by, e.g. --label role=worker.
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_override)]
        labels: Vec<(String, String)>,
        /// Shared token every coordinator call must carry (or LOCKSTEP_TOKEN).
        #[arg(long, env = "LOCKSTEP_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Stop IO when no coordinator has listened for this long during a run.
        #[arg(long, default_value = "10s")]
        grace: String,
        /// Serve Prometheus metrics on this address (GET /metrics).
        #[arg(long)]
        metrics_listen: Option<String>,
        /// Allow raw block devices as volumes (refused anyway if mounted or carrying a signature).
        #[arg(long)]
        allow_block_devices: bool,
        /// Allow exec-style fault actions (commands run on this host). Off by default.
        #[arg(long)]
        allow_exec: bool,
        /// Register in etcd (comma-separated client URLs) under a lease, for `lockstep agents`
        /// and `lockstep run --etcd`.
        #[arg(long, env = "LOCKSTEP_ETCD", value_name = "URL[,URL...]")]
        etcd: Option<String>,
        /// Address coordinators should dial, published in etcd (default: the listen address).
        #[arg(long, env = "LOCKSTEP_ADVERTISE", value_name = "HOST:PORT")]
        advertise: Option<String>,
        /// Lease TTL in etcd: a dead agent is listed for at most this long.
        #[arg(long, default_value = "5s")]
        etcd_ttl: String,
        /// Key prefix in etcd (agents register under PREFIX/agents/NAME).
        #[arg(long, default_value = lockstep_agent::registry::DEFAULT_PREFIX)]
        etcd_prefix: String,
        /// Mutual TLS: this agent's certificate (PEM; `lockstep certs` makes a test set), with
        /// serverAuth, and clientAuth too to dial a mirror backup.
        #[arg(long, env = "LOCKSTEP_TLS_CERT", value_name = "PEM")]
        tls_cert: Option<PathBuf>,
        /// Mutual TLS: this agent's private key (PEM).
        #[arg(long, env = "LOCKSTEP_TLS_KEY", value_name = "PEM")]
        tls_key: Option<PathBuf>,
        /// Mutual TLS: the CA whose certificates coordinators, mirror primaries and mirror
        /// backups must present (PEM).
        #[arg(long, env = "LOCKSTEP_TLS_CA", value_name = "PEM")]
        tls_ca: Option<PathBuf>,
        /// Stop (as on SIGTERM) when standard input closes: how `lockstep run --local` ties its
        /// agents' lives to its own.
        #[arg(long, hide = true)]
        exit_with_stdin: bool,
    },
    /// Simulate N agents of M volumes in this process, each a real gRPC agent on its own port,
    /// to measure the coordinator at scale (no IO: intervals come from pre-made histograms).
    Simulate(SimulateArgs),
}

#[derive(clap::Args)]
struct SimulateArgs {
    /// How many agents (agent-0 .. agent-N-1).
    #[arg(long)]
    agents: usize,
    /// Volumes per agent (data1 .. dataM).
    #[arg(long, default_value_t = 8)]
    volumes: usize,
    /// This many agents (the first ones) get their data1 1.5x slower from mid-run.
    #[arg(long, default_value_t = 0)]
    slow: usize,
    /// This many agents (the last ones) stop streaming and close their server mid-run.
    #[arg(long, default_value_t = 0)]
    lose: usize,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Ports P .. P+N-1 (default: OS-assigned).
    #[arg(long, value_name = "P")]
    base_port: Option<u16>,
    /// Write `name=host:port` lines here, for `lockstep run --agents-file`.
    #[arg(long, value_name = "FILE")]
    addresses: Option<PathBuf>,
    /// Shared token every coordinator call must carry (or LOCKSTEP_TOKEN).
    #[arg(long, env = "LOCKSTEP_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Told to the coordinator as the agents' grace period (how long it tries to re-attach).
    #[arg(long, default_value = "10s")]
    grace: String,
    /// Number the agents from here (several processes make one cluster: agent-0.., agent-5000..).
    #[arg(long, default_value_t = 0)]
    first_index: usize,
    /// Each agent's clock is off by a fixed amount within +-this many milliseconds.
    #[arg(long, default_value_t = 0.0)]
    clock_offset_ms: f64,
    /// Pre-encoded histograms per direction.
    #[arg(long, default_value_t = 128)]
    pool: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn parse_override(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ if !s.trim().is_empty() && !s.contains('=') => Ok((s.trim().to_string(), String::new())),
        _ => Err(format!("expected KEY=VALUE, got '{s}'")),
    }
}

fn simulate(a: SimulateArgs) -> std::process::ExitCode {
    let grace =
        match lockstep_agent::units::parse_time(&a.grace, lockstep_agent::units::TimeUnit::Seconds)
        {
            Ok(g) => g,
            Err(e) => {
                eprintln!("lockstep-agent: error: --grace {}: {e}", a.grace);
                return std::process::ExitCode::from(2);
            }
        };
    let opts = lockstep_agent::simulate::SimOptions {
        agents: a.agents,
        volumes: a.volumes,
        slow: a.slow,
        lose: a.lose,
        host: a.host,
        base_port: a.base_port,
        addresses: a.addresses,
        token: a.token.filter(|t| !t.is_empty()),
        grace,
        first_index: a.first_index,
        clock_offset: std::time::Duration::from_secs_f64(a.clock_offset_ms.abs() / 1000.0),
        pool_size: a.pool,
        seed: a.seed,
    };
    match lockstep_agent::simulate::simulate_blocking(opts) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lockstep-agent: error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LOCKSTEP_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal: logs kept in files and CI output stay readable.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Simulate(a) => return simulate(a),
        Command::Serve {
            listen,
            volumes,
            name,
            labels,
            token,
            grace,
            metrics_listen,
            allow_block_devices,
            allow_exec,
            etcd,
            advertise,
            etcd_ttl,
            etcd_prefix,
            tls_cert,
            tls_key,
            tls_ca,
            exit_with_stdin,
        } => {
            let tls = match daemon::tls::TlsFiles::from_flags(tls_cert, tls_key, tls_ca) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("lockstep-agent: error: {e}");
                    return std::process::ExitCode::from(2);
                }
            };
            let parse_time = |flag: &str, v: &str| {
                lockstep_agent::units::parse_time(v, lockstep_agent::units::TimeUnit::Seconds)
                    .map_err(|e| eprintln!("lockstep-agent: error: {flag} {v}: {e}"))
            };
            let Ok(grace) = parse_time("--grace", &grace) else {
                return std::process::ExitCode::from(2);
            };
            let Ok(ttl) = parse_time("--etcd-ttl", &etcd_ttl) else {
                return std::process::ExitCode::from(2);
            };
            let registry = etcd.filter(|e| !e.trim().is_empty()).map(|e| {
                lockstep_agent::registry::RegistryOptions {
                    endpoints: lockstep_agent::registry::parse_endpoints(&e),
                    prefix: etcd_prefix,
                    ttl,
                }
            });
            let cfg = DaemonConfig {
                name: name.unwrap_or_else(daemon::hostname),
                labels: labels.into_iter().collect(),
                volumes,
                token: token.filter(|t| !t.is_empty()),
                grace,
                allow_block_devices,
                allow_exec,
            };
            let opts = daemon::ServeOptions {
                listen,
                metrics_listen,
                advertise,
                registry,
                tls,
                exit_with_stdin,
            };
            match daemon::serve_blocking(cfg, opts) {
                Ok(()) => return std::process::ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("lockstep-agent: error: {e:#}");
                    return std::process::ExitCode::from(2);
                }
            }
        }
        Command::Verify { paths, json } => {
            let report = match lockstep_agent::verify::verify_paths(&paths) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("lockstep-agent: error: {e}");
                    return std::process::ExitCode::from(2);
                }
            };
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report).unwrap_or_default()
                );
            } else {
                print!("{}", lockstep_agent::verify::render_text(&report));
            }
            return std::process::ExitCode::from(
                if report.bad() > 0 || !report.errors.is_empty() {
                    1
                } else {
                    0
                },
            );
        }
        Command::Run {
            jobfile,
            output_format,
            output,
            overrides,
            allow_block_devices,
            keep_files,
        } => standalone::run(&StandaloneArgs {
            jobfile,
            format: output_format,
            output,
            overrides,
            allow_block_devices,
            keep_files,
        }),
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
