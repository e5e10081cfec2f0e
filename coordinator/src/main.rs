use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use lockstep::app::{self as cli, AgentSource, RunRequest, RunSettings};
use lockstep::orchestrate::local::LocalShape;

/// lockstep: one storage benchmark across a whole cluster, started in lockstep, with the
/// volume that holds the cluster back named.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a plan on agents (with --local N: N agents on this machine, no infrastructure).
    Run {
        #[command(flatten)]
        run: RunCli,
        #[command(flatten)]
        tls: TlsArgs,
    },
    /// A coordinator service: campaign for leadership in etcd; as leader, run submitted plans
    /// and take over the runs of a leader that died.
    Coordinator {
        #[arg(long, env = "LOCKSTEP_ETCD", value_name = "URL[,URL...]")]
        etcd: String,
        #[arg(long, default_value = lockstep_core::registry::DEFAULT_PREFIX)]
        etcd_prefix: String,
        /// This coordinator's name (default: the hostname).
        #[arg(long)]
        name: Option<String>,
        /// Results go to DIR/<run id>/ (shared storage lets a standby write there too).
        #[arg(long, default_value = "lockstep-runs")]
        runs_dir: PathBuf,
        /// Election lease TTL: how long a dead leader keeps the lead.
        #[arg(long, default_value = "3s", value_parser = parse_secs)]
        leader_ttl: std::time::Duration,
        /// Token the agents require (or LOCKSTEP_TOKEN).
        #[arg(long, env = "LOCKSTEP_TOKEN", hide_env_values = true)]
        token: Option<String>,
        #[command(flatten)]
        tls: TlsArgs,
    },
    /// Write a run's interval histograms (its data/ directory) as an HdrHistogram interval log,
    /// for HdrHistogram's own tools (HistogramLogProcessor, HdrHistogramVisualizer).
    ExportHlog {
        /// The run's results directory.
        dir: PathBuf,
        /// Where to write (default: DIR/intervals.hlog).
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
    /// Queue a plan for the leading coordinator (`lockstep coordinator`); prints the run id.
    Submit {
        plan: PathBuf,
        #[arg(long, env = "LOCKSTEP_ETCD", value_name = "URL[,URL...]")]
        etcd: String,
        #[arg(long, default_value = lockstep_core::registry::DEFAULT_PREFIX)]
        etcd_prefix: String,
        /// Wait for the run to end; exit 0 completed, 1 partial or aborted, 2 failed.
        #[arg(long)]
        wait: bool,
    },
    /// The leading coordinator and the runs recorded in etcd.
    Runs {
        #[arg(long, env = "LOCKSTEP_ETCD", value_name = "URL[,URL...]")]
        etcd: String,
        #[arg(long, default_value = lockstep_core::registry::DEFAULT_PREFIX)]
        etcd_prefix: String,
        #[arg(long)]
        json: bool,
    },
    /// Make a test CA and mutual-TLS certificates for agents (by name) and coordinators.
    Certs {
        /// Directory for ca.pem, ca.key, NAME.pem, NAME.key (created; nothing is overwritten).
        #[arg(long)]
        out: PathBuf,
        /// Agent names (their --name), comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        agents: Vec<String>,
        /// Coordinator certificate names, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "coordinator")]
        coordinators: Vec<String>,
    },
    /// List the live agents registered in etcd, with labels, volumes and versions.
    Agents {
        #[arg(long, env = "LOCKSTEP_ETCD", value_name = "URL[,URL...]")]
        etcd: String,
        #[arg(long, default_value = lockstep_core::registry::DEFAULT_PREFIX)]
        etcd_prefix: String,
        #[arg(long)]
        json: bool,
        /// After the list, print each agent that joins (+), changes (~) or leaves (-), from an
        /// etcd watch, until interrupted.
        #[arg(long)]
        watch: bool,
    },
    /// What changed between runs: per role, node and volume, IOPS, MB/s and p50/p99/p99.9 of
    /// each, the change, and whether it is beyond the runs' interval-to-interval noise. The
    /// first run is the baseline.
    Compare {
        #[arg(required = true, num_args = 2.., value_name = "RUN_DIR")]
        runs: Vec<PathBuf>,
        /// Also write the comparison as an HTML page.
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
        /// Exit 1 when a figure got worse by more than PCT percent, beyond the noise.
        #[arg(long, value_name = "PCT")]
        fail_on_regression: Option<f64>,
    },
    /// Re-render a finished run from its results directory.
    Report {
        dir: PathBuf,
        #[arg(long)]
        json: bool,
        /// The HTML report (charts, heatmap, sortable tables): to FILE, or to stdout without one.
        #[arg(long, value_name = "FILE", num_args = 0..=1, conflicts_with = "json")]
        html: Option<Option<PathBuf>>,
    },
}

/// `lockstep run`'s arguments; [`RunCli::into_request`] is all the CLI does with them.
#[derive(clap::Args)]
struct RunCli {
    plan: PathBuf,
    /// Start N agents on this machine, each on its own directory ("data"); NxM: N agents of M
    /// volumes each ("data1" .. "dataM", like a datanode's disks).
    #[arg(long, value_name = "N[xM]")]
    local: Option<LocalShape>,
    /// With --local: start the agents with --allow-exec, so the plan's exec faults may run
    /// commands on this machine.
    #[arg(long, requires = "local")]
    allow_exec: bool,
    /// Results directory (default: a new one under ./lockstep-runs/).
    #[arg(long)]
    output: Option<PathBuf>,
    /// An agent by address, in addition to the plan's [[agent]] list.
    #[arg(long = "agent", value_name = "NAME=HOST:PORT", value_parser = parse_agent)]
    agents: Vec<(String, String)>,
    /// Agents by address from a file of `NAME=HOST:PORT` lines (`#` comments), in addition to
    /// the plan's and --agent (for clusters too big for a command line).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["local", "etcd"])]
    agents_file: Option<PathBuf>,
    /// Token the agents require (or LOCKSTEP_TOKEN).
    #[arg(long, env = "LOCKSTEP_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Print results.json instead of the text report.
    #[arg(long)]
    json: bool,
    /// Keep the files the agents created.
    #[arg(long)]
    keep_files: bool,
    /// Exit non-zero when a chokepoint (a volume or node) is found.
    #[arg(long)]
    fail_on_chokepoint: bool,
    /// Serve Prometheus metrics of the run at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<String>,
    /// Take the agents from the etcd registry (plans select them by label).
    #[arg(
        long,
        env = "LOCKSTEP_ETCD",
        value_name = "URL[,URL...]",
        conflicts_with = "local"
    )]
    etcd: Option<String>,
    /// The registry's key prefix in etcd.
    #[arg(long, default_value = lockstep_core::registry::DEFAULT_PREFIX)]
    etcd_prefix: String,
}

impl RunCli {
    fn into_request(self) -> anyhow::Result<RunRequest> {
        let agents = match (self.local, self.etcd) {
            (Some(shape), _) => AgentSource::Local {
                shape,
                allow_exec: self.allow_exec,
            },
            (None, Some(etcd)) => AgentSource::Registry {
                endpoints: lockstep_core::registry::parse_endpoints(&etcd),
                prefix: self.etcd_prefix,
            },
            (None, None) => {
                let mut agents = self.agents;
                if let Some(f) = &self.agents_file {
                    agents.extend(cli::agents_file(f)?);
                }
                AgentSource::Listed(agents)
            }
        };
        Ok(RunRequest {
            plan: self.plan,
            agents,
            output: self.output,
            settings: RunSettings {
                token: self.token,
                json: self.json,
                keep_files: self.keep_files,
                fail_on_chokepoint: self.fail_on_chokepoint,
                metrics_listen: self.metrics_listen,
            },
        })
    }
}

/// Mutual TLS to the agents: all three files or none.
#[derive(clap::Args)]
struct TlsArgs {
    /// This coordinator's certificate (PEM; `lockstep certs` makes a test set).
    #[arg(long, env = "LOCKSTEP_TLS_CERT", value_name = "PEM")]
    tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, env = "LOCKSTEP_TLS_KEY", value_name = "PEM")]
    tls_key: Option<PathBuf>,
    /// The CA the agents' certificates must chain to (PEM).
    #[arg(long, env = "LOCKSTEP_TLS_CA", value_name = "PEM")]
    tls_ca: Option<PathBuf>,
}

impl TlsArgs {
    fn apply(self) -> anyhow::Result<()> {
        use lockstep_core::tls::TlsFiles;
        if let Some(files) = TlsFiles::from_flags(self.tls_cert, self.tls_key, self.tls_ca)? {
            lockstep::orchestrate::client::use_tls(&files)?;
        }
        Ok(())
    }
}

fn parse_secs(s: &str) -> Result<std::time::Duration, String> {
    let secs = s.strip_suffix('s').unwrap_or(s);
    secs.parse::<f64>()
        .ok()
        .filter(|x| *x >= 1.0)
        .map(std::time::Duration::from_secs_f64)
        .ok_or_else(|| format!("expected seconds (at least 1), e.g. 3s, got '{s}'"))
}

fn parse_agent(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((n, a)) if !n.is_empty() && !a.is_empty() => Ok((n.into(), a.into())),
        _ => Err(format!("expected NAME=HOST:PORT, got '{s}'")),
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LOCKSTEP_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal: logs kept in files and CI output stay readable.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match Cli::parse().command {
        Command::Run { run, tls } => tls
            .apply()
            .and_then(|()| run.into_request())
            .and_then(cli::run_command),
        Command::Compare {
            runs,
            html,
            fail_on_regression,
        } => lockstep::app::compare::compare_command(&runs, html.as_deref(), fail_on_regression),
        Command::Report { dir, json, html } => cli::report_command(&dir, json, html),
        Command::ExportHlog { dir, output } => cli::export_hlog(&dir, output.as_deref()),
        Command::Agents {
            etcd,
            etcd_prefix,
            json,
            watch,
        } => lockstep::orchestrate::registry::agents_command(&etcd, &etcd_prefix, json, watch),
        Command::Certs {
            out,
            agents,
            coordinators,
        } => lockstep::app::certs::certs_command(&out, &agents, &coordinators),
        Command::Coordinator {
            etcd,
            etcd_prefix,
            name,
            runs_dir,
            leader_ttl,
            token,
            tls,
        } => tls.apply().and_then(|()| {
            lockstep::service::leader::coordinator_command(
                lockstep::service::leader::CoordinatorOptions {
                    endpoints: lockstep_core::registry::parse_endpoints(&etcd),
                    prefix: etcd_prefix,
                    name: name.unwrap_or_else(lockstep_core::host::hostname),
                    runs_dir,
                    leader_ttl,
                    token,
                },
            )
        }),
        Command::Submit {
            plan,
            etcd,
            etcd_prefix,
            wait,
        } => lockstep::service::leader::submit_command(
            &lockstep_core::registry::parse_endpoints(&etcd),
            &etcd_prefix,
            &plan,
            wait,
        ),
        Command::Runs {
            etcd,
            etcd_prefix,
            json,
        } => lockstep::service::leader::runs_command(
            &lockstep_core::registry::parse_endpoints(&etcd),
            &etcd_prefix,
            json,
        ),
    };
    result.unwrap_or_else(|e| {
        eprintln!("lockstep: error: {e:#}");
        ExitCode::from(2)
    })
}
