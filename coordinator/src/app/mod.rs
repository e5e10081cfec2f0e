//! The `lockstep` commands, called by `main.rs` after argument parsing.
//!
//! `run`: plan → agents (local children or given by address) → resolved assignment → run →
//! results directory (results.json, fio.json, timeline.csv, intervals.hlog, report.txt) →
//! report on stdout, exit code from objectives (and the chokepoint with --fail-on-chokepoint).
//! `report`: re-renders a finished run from its directory.

pub mod certs;
pub mod compare;
mod curve;
mod export_hlog;
pub mod live;
mod series;
mod sweep;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use lockstep_core::fault::FaultKind;

use crate::analysis::chokepoint::{self, AnalysisOptions, Verdict};
use crate::app::live::LiveView;
use crate::export;
use crate::orchestrate::local::{LocalCluster, LocalShape};
use crate::orchestrate::run::{self, AgentWork, PhaseSpec, RunSpec, VolumeWork};
use crate::plan::{self, AgentInfo, AgentVolume, Assignment, Plan};
use crate::results::timeline::VolumeModel;
use crate::results::{RunResults, RunStatus};

/// Where a run's agents come from.
pub enum AgentSource {
    /// `--local N` or `NxM`: agents started on this machine, each volume on its own
    /// directory, stopped when the run ends. `allow_exec` lets the plan's exec faults run
    /// commands here.
    Local { shape: LocalShape, allow_exec: bool },
    /// The live agents of the etcd registry (plans select them by label); the plan's
    /// `[[agent]]` list is not used.
    Registry {
        endpoints: Vec<String>,
        prefix: String,
    },
    /// The plan's `[[agent]]` list and these `NAME=HOST:PORT` besides.
    Listed(Vec<(String, String)>),
}

/// A run as a user asks for it: the plan file, its agents and where the results go.
pub struct RunRequest {
    pub plan: PathBuf,
    pub agents: AgentSource,
    /// Results directory (default: a new one under `./lockstep-runs/`).
    pub output: Option<PathBuf>,
    pub settings: RunSettings,
}

/// How a run is carried out and reported, whoever asked for it (the CLI or the coordinator
/// service).
#[derive(Debug, Clone, Default)]
pub struct RunSettings {
    /// The token the agents require.
    pub token: Option<String>,
    /// Print results.json instead of the text report (and no progress lines).
    pub json: bool,
    /// Keep the files the agents created.
    pub keep_files: bool,
    /// A named chokepoint (volume or node) is a failure (exit 1).
    pub fail_on_chokepoint: bool,
    /// Serve Prometheus metrics of the run here.
    pub metrics_listen: Option<String>,
}

/// What a finished run (or series) left: its results, as written to `results.json`, and the
/// exit code they give.
pub struct RunOutcome {
    pub results: RunResults,
    pub code: ExitCode,
}

/// Exit codes (the table is in docs/exit-codes.md): 0 all good; 1 an objective failed (including
/// one that could not be judged because data it covers is missing: a lost agent, missing
/// intervals, stuck IOs, a verification that could not run), verification found a lost, stale
/// or corrupted block, or a chokepoint with --fail-on-chokepoint; 2 the run could not be done
/// (bad plan, unreachable agent); 130 stopped with Ctrl-C (SIGINT); 143 stopped with SIGTERM.
/// The stops keep partial results; a CI gate must treat every non-zero code as a failure.
pub const EXIT_OBJECTIVE: u8 = 1;
pub use crate::orchestrate::signals::{EXIT_INTERRUPTED, EXIT_TERMINATED};
pub use export_hlog::export_hlog;
/// The run finished and its report went to stdout, but a results file could not be written
/// (a full or read-only disk); the error names each file.
pub const EXIT_RESULTS_UNWRITTEN: u8 = 3;

fn default_output(plan: &Plan) -> PathBuf {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    // UTC date-time without pulling in a date crate: days since epoch to a civil date.
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let (y, m, d) = civil_from_days(days);
    let stamp = format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    );
    let name = plan::file_safe_name(&plan.name);
    PathBuf::from("lockstep-runs").join(format!("{stamp}-{name}"))
}

/// Howard Hinnant's days-to-civil algorithm (proleptic Gregorian, UTC).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Creates a run's results directory and proves it writable before any agent does IO; a
/// directory that holds a run's results already is refused, never overwritten.
pub fn prepare_output_dir(dir: &Path) -> anyhow::Result<()> {
    if dir.join("results.json").exists() {
        bail!(
            "{} already holds a run's results; choose another --output",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating the results directory {}", dir.display()))?;
    export::check_writable(dir)
        .with_context(|| format!("the results directory {} is not writable", dir.display()))
}

/// Asks each agent given by address who it is (hello), for resolving the plan against it.
async fn discover(
    agents: &[(String, String, std::collections::BTreeMap<String, String>)],
    token: Option<&str>,
) -> anyhow::Result<Vec<AgentInfo>> {
    // Every agent's Hello, `FAN_OUT` at a time rather than one after the other: a round trip
    // and a connection set-up each, 10,000 of them in a row held the run back for seconds.
    let hellos = crate::orchestrate::run::fan_out(
        crate::orchestrate::run::FAN_OUT,
        agents.iter().map(|(name, address, _)| {
            let (name, address, token) = (name.clone(), address.clone(), token.map(String::from));
            async move {
                use crate::orchestrate::client::{KEEPALIVE, connect};
                connect(&name, &address, token.as_deref(), KEEPALIVE)
                    .await
                    .map(|c| c.hello)
            }
        }),
    )
    .await;
    let mut out = Vec::new();
    for ((name, address, plan_labels), hello) in agents.iter().zip(hellos) {
        let hello = hello?;
        let mut labels: std::collections::BTreeMap<String, String> =
            hello.labels.clone().into_iter().collect();
        labels.extend(plan_labels.clone());
        out.push(AgentInfo {
            name: name.clone(),
            address: address.clone(),
            labels,
            volumes: hello
                .volumes
                .iter()
                .map(|v| AgentVolume {
                    name: v.name.clone(),
                    path: PathBuf::from(&v.path),
                    size_bytes: v.size_bytes,
                    kind: v.kind.clone(),
                    provisioned_iops: (v.provisioned_iops > 0).then_some(v.provisioned_iops),
                    provisioned_mib_s: (v.provisioned_mib_s > 0).then_some(v.provisioned_mib_s),
                })
                .collect(),
        });
    }
    Ok(out)
}

/// `--agents-file`: one `NAME=HOST:PORT` a line; blank lines and `#` comments are skipped.
/// Errors name the file and line (a name given twice too: the second would shadow the first).
pub fn agents_file(path: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--agents-file {}", path.display()))?;
    parse_agents_file(&text)
        .map_err(|(line, why)| anyhow::anyhow!("{}:{line}: {why}", path.display()))
}

fn parse_agents_file(text: &str) -> Result<Vec<(String, String)>, (usize, String)> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashMap::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let (name, address) = match line.split_once('=') {
            Some((n, a)) if !n.trim().is_empty() && !a.trim().is_empty() => {
                (n.trim().to_string(), a.trim().to_string())
            }
            _ => return Err((n + 1, format!("expected NAME=HOST:PORT, got '{line}'"))),
        };
        if let Some(first) = seen.insert(name.clone(), n + 1) {
            return Err((
                n + 1,
                format!("agent '{name}' is already listed on line {first}"),
            ));
        }
        out.push((name, address));
    }
    Ok(out)
}

/// Checks every fault as the agents will receive it (its window as resolved) before anything
/// starts, so a problem is refused with the plan line rather than by an agent mid-run.
fn check_faults(plan: &Plan, a: &Assignment) -> anyhow::Result<()> {
    for f in &a.faults {
        f.fault.scheduled_spec().validate().map_err(|e| {
            anyhow::anyhow!(
                "{}:{}: {}: {e}",
                plan.origin.display(),
                f.line,
                f.fault.label
            )
        })?;
    }
    Ok(())
}

fn model_of(v: &AgentVolume, faults: &[crate::plan::FaultAssignment]) -> Option<VolumeModel> {
    // An emulated EBS volume is judged as that volume type.
    for f in faults {
        if let FaultKind::Ebs(e) = &f.spec.kind {
            return Some(VolumeModel {
                kind: e.volume_type.name().to_string(),
                size_gib: e.size_gib as f64,
                provisioned_iops: e.provisioned_iops,
                provisioned_mib_s: e.provisioned_mib_s,
            });
        }
    }
    (!v.kind.is_empty()).then(|| VolumeModel {
        kind: v.kind.clone(),
        size_gib: v.size_bytes as f64 / (1u64 << 30) as f64,
        provisioned_iops: v.provisioned_iops,
        provisioned_mib_s: v.provisioned_mib_s,
    })
}

fn run_spec(run_id: &str, a: &Assignment, keep_files: bool, token: Option<String>) -> RunSpec {
    RunSpec {
        run_id: run_id.to_string(),
        plan_name: a.plan.clone(),
        interval: a.interval,
        histogram_digits: a.histogram_digits,
        phases: a
            .phases
            .iter()
            .map(|p| PhaseSpec {
                name: p.name.clone(),
                start: p.start,
                duration: p.duration,
                measure: p.measure,
            })
            .collect(),
        agents: a
            .agents
            .iter()
            .map(|ag| AgentWork {
                name: ag.agent.clone(),
                address: ag.address.clone(),
                volumes: ag
                    .volumes
                    .iter()
                    .map(|v| VolumeWork {
                        volume: v.volume.name.clone(),
                        role: v.role.clone(),
                        jobfile: v.job_text.clone(),
                        overrides: v.overrides.clone(),
                        faults: v.faults.iter().map(|f| f.wire()).collect(),
                        model: model_of(&v.volume, &v.faults),
                        target_iops: v.rate_iops.map(|r| r as f64),
                        mirror: v.mirror.as_ref().map(|m| m.wire()),
                    })
                    .collect(),
            })
            .collect(),
        keep_files,
        token,
    }
}

/// The finder's options for this run: emulated EBS volumes drain their credits `time_scale`
/// times faster, and forecasts must know it.
pub fn analysis_options(a: &Assignment) -> AnalysisOptions {
    let mut opts = AnalysisOptions::default();
    for (ag, v) in a.volumes() {
        for f in &v.faults {
            if let FaultKind::Ebs(e) = &f.spec.kind {
                opts.time_scales.push(chokepoint::VolumeTimeScale {
                    node: ag.agent.clone(),
                    volume: v.volume.name.clone(),
                    time_scale: e.time_scale,
                });
            }
        }
    }
    opts
}

/// `lockstep run`: loads the plan, finds or starts the agents, runs it and reports.
pub fn run_command(req: RunRequest) -> anyhow::Result<ExitCode> {
    let plan = plan::load(&req.plan)?;
    let out_dir = req.output.clone().unwrap_or_else(|| default_output(&plan));
    prepare_output_dir(&out_dir)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run_async(req, plan, out_dir))
}

async fn run_async(req: RunRequest, plan: Plan, out_dir: PathBuf) -> anyhow::Result<ExitCode> {
    // Before any agent starts: a stop during their start or layout is an orderly one too.
    crate::orchestrate::signals::install();
    let mut settings = req.settings;
    let mut local = None;
    let infos = match req.agents {
        AgentSource::Local { shape, allow_exec } => {
            let cluster = start_local(shape, allow_exec, &out_dir, settings.json).await?;
            let infos = local_infos(&cluster);
            settings.token = Some(cluster.token.clone());
            local = Some(cluster);
            infos
        }
        AgentSource::Registry { endpoints, prefix } => {
            crate::orchestrate::registry::agent_infos(&endpoints, &prefix).await?
        }
        AgentSource::Listed(extra) => {
            let mut list: Vec<(String, String, std::collections::BTreeMap<String, String>)> = plan
                .agents
                .iter()
                .map(|a| (a.name.clone(), a.address.clone(), a.labels.clone()))
                .collect();
            list.extend(extra.into_iter().map(|(n, a)| (n, a, Default::default())));
            anyhow::ensure!(
                !list.is_empty(),
                "{}: the plan lists no [[agent]]; add some, pass --agent NAME=HOST:PORT, or try --local N",
                plan.origin.display()
            );
            discover(&list, settings.token.as_deref()).await?
        }
    };
    let outcome = run_plan(&settings, &plan, &infos, None, &out_dir).await;
    if let Some(c) = local {
        tracing::debug!("stopping the local agents");
        c.shutdown(settings.keep_files).await;
    }
    tracing::debug!("run done");
    Ok(outcome?.code)
}

async fn start_local(
    shape: LocalShape,
    allow_exec: bool,
    out_dir: &Path,
    quiet: bool,
) -> anyhow::Result<LocalCluster> {
    let volumes_root = out_dir.join("volumes");
    if !quiet {
        let each = match shape.volumes_per_agent {
            1 => String::new(),
            m => format!(" of {m} volumes each"),
        };
        eprintln!(
            "lockstep: starting {} local agents{each}, volumes under {}",
            shape.agents,
            volumes_root.display()
        );
    }
    Ok(LocalCluster::start(shape, &volumes_root, Duration::from_secs(5), allow_exec).await?)
}

fn local_infos(cluster: &LocalCluster) -> Vec<AgentInfo> {
    cluster
        .agents
        .iter()
        .map(|a| AgentInfo {
            name: a.name.clone(),
            address: a.address.clone(),
            labels: [("node".to_string(), a.name.clone())].into_iter().collect(),
            volumes: a
                .volumes
                .iter()
                .map(|(name, dir)| AgentVolume {
                    name: name.clone(),
                    path: dir.clone(),
                    kind: "local".into(),
                    ..Default::default()
                })
                .collect(),
        })
        .collect()
}

/// Runs a loaded plan on these agents: a rate curve, a depth sweep or a single run, by what the
/// plan asks for. `assignment` is the plan already resolved against `infos`, when the caller
/// has it (single runs only use it).
pub async fn run_plan(
    settings: &RunSettings,
    plan: &Plan,
    infos: &[AgentInfo],
    assignment: Option<Assignment>,
    out_dir: &Path,
) -> anyhow::Result<RunOutcome> {
    // A plan has at most one kind of series (the plan refuses both).
    if !crate::analysis::curve::curve_roles(plan).is_empty() {
        curve::run(settings, plan, infos, out_dir).await
    } else if !crate::analysis::sweep::sweep_roles(plan).is_empty() {
        sweep::run(settings, plan, infos, out_dir).await
    } else {
        let assignment = match assignment {
            Some(a) => a,
            None => plan::resolve(plan, infos)?,
        };
        run_resolved(settings, plan, &assignment, out_dir).await
    }
}

/// One run of a resolved plan, to its results directory and report.
pub(crate) async fn run_resolved(
    settings: &RunSettings,
    plan: &Plan,
    assignment: &Assignment,
    out_dir: &Path,
) -> anyhow::Result<RunOutcome> {
    check_faults(plan, assignment)?;
    let run_id = out_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "run".into());
    let spec = run_spec(
        &run_id,
        assignment,
        settings.keep_files,
        settings.token.clone(),
    );
    let stop_rx = crate::orchestrate::signals::watch();
    let data_dir = out_dir.join(crate::results::store::DATA_DIR);
    let mut live = LiveView::new(assignment.run_length(), settings.json);
    live.analysis = analysis_options(assignment);
    live.scheduled_faults = scheduled_faults(assignment);
    if let Some(addr) = &settings.metrics_listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("--metrics-listen {addr}"))?;
        let m = std::sync::Arc::new(crate::export::metrics::CoordinatorMetrics::default());
        live.metrics = Some(m.clone());
        eprintln!(
            "lockstep: metrics on http://{}/metrics",
            listener.local_addr()?
        );
        tokio::spawn(lockstep_core::metrics::serve(listener, m));
    }
    let outcome = run::execute(spec, &mut live, stop_rx, Some(&data_dir)).await;
    live.finish();
    let mut results = outcome?;
    let mut unwritten: Vec<String> = results
        .data
        .iter()
        .filter_map(|d| d.error.as_ref())
        .map(|e| format!("the data files ({}): {e}", data_dir.display()))
        .collect();
    crate::analysis::drill::collect_finals(&mut results);
    results.mirror = crate::analysis::mirror::analyze(&results);
    results.objectives = crate::analysis::objectives::evaluate(assignment, &results);
    let opts = analysis_options(assignment);
    let mut analysis = chokepoint::analyze(&results.timeline, &opts);
    analysis.forecast_before_cliff =
        chokepoint::forecast_before_cliff(&results.timeline, &opts, &analysis);
    analysis.phases =
        chokepoint::analyze_phases(&results.timeline, &measured_phases(&results), &opts);
    let blamed = matches!(analysis.verdict, Verdict::Volume(_) | Verdict::Node(_));
    results.chokepoint = Some(analysis);
    if !results.faults.is_empty() && unwritten.is_empty() {
        // The drill report reads back the raw histograms this run just wrote.
        let entries = crate::results::store::read_entries(out_dir)
            .map_err(anyhow::Error::msg)
            .context("reading the run's interval histograms for the drill report")?;
        let d = crate::analysis::drill::analyze(
            &entries,
            &results.timeline,
            &results.faults,
            &Default::default(),
        );
        results.drill = Some(d);
    }
    // The report reaches stdout before any file is written: a full or read-only results disk
    // must not take the measurements with it.
    if settings.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        print!("{}", export::text::render(&results));
    }
    if let Err(e) = export::write_run_dir(out_dir, &results, &export::RUN_DIR) {
        unwritten.push(e.to_string());
    }
    if !unwritten.is_empty() {
        eprintln!(
            "lockstep: error: results not written: {} (the report above is complete)",
            unwritten.join("; ")
        );
        return Ok(RunOutcome {
            results,
            code: ExitCode::from(EXIT_RESULTS_UNWRITTEN),
        });
    }
    eprintln!("lockstep: results in {}", out_dir.display());
    let code = exit_code(&results, blamed && settings.fail_on_chokepoint);
    Ok(RunOutcome { results, code })
}

/// The plan's fault windows per volume, as the agents name them.
fn scheduled_faults(a: &Assignment) -> Vec<crate::results::timeline::FaultWindow> {
    let ms = |d: Duration| d.as_millis() as u64;
    a.volumes()
        .flat_map(|(ag, v)| {
            v.faults
                .iter()
                .map(move |f| crate::results::timeline::FaultWindow {
                    node: ag.agent.clone(),
                    volume: v.volume.name.clone(),
                    fault: f.kind.clone(),
                    start_ms: ms(f.at),
                    end_ms: f.duration.map(|d| ms(f.at + d)),
                    detail: None,
                })
        })
        .collect()
}

/// The measured phases' windows when there are several (a single phase is the whole run).
fn measured_phases(r: &RunResults) -> Vec<chokepoint::PhaseWindow> {
    let windows: Vec<chokepoint::PhaseWindow> = r
        .phases
        .iter()
        .filter(|p| p.measured)
        .map(|p| {
            let start_ms = (p.start_unix_ms - r.start_unix_ms).max(0) as u64;
            chokepoint::PhaseWindow {
                name: p.name.clone(),
                start_ms,
                end_ms: start_ms + p.duration_ms,
            }
        })
        .collect();
    if windows.len() >= 2 {
        windows
    } else {
        Vec::new()
    }
}

fn exit_code(r: &RunResults, chokepoint_fails: bool) -> ExitCode {
    if r.status == RunStatus::Aborted {
        ExitCode::from(interrupted_code())
    } else if r.objectives_failed() || r.verify_failed() || chokepoint_fails {
        ExitCode::from(EXIT_OBJECTIVE)
    } else {
        ExitCode::SUCCESS
    }
}

/// The exit code of a stopped run: 143 when SIGTERM stopped it, else 130 (Ctrl-C).
pub fn interrupted_code() -> u8 {
    crate::orchestrate::signals::received().map_or(EXIT_INTERRUPTED, |s| s.exit_code())
}

/// `lockstep report DIR`: re-renders a finished run. `html`: `Some(None)` prints report.html,
/// `Some(Some(FILE))` writes it to FILE.
pub fn report_command(
    dir: &Path,
    json: bool,
    html: Option<Option<PathBuf>>,
) -> anyhow::Result<ExitCode> {
    let mut r = export::read_run_dir(dir).map_err(anyhow::Error::msg)?;
    if let Some(to) = html {
        export::read_timeline(dir, &mut r).map_err(anyhow::Error::msg)?;
        // A long run (thousands of volumes x hours) takes a while: say what is going on.
        let started = std::time::Instant::now();
        eprintln!(
            "lockstep: rendering report.html ({} volumes x {} intervals)",
            r.timeline.volumes.len(),
            r.cluster_timeline.len()
        );
        let page = export::html::render(&r);
        eprintln!(
            "lockstep: report.html rendered in {:.1} s ({:.1} MB)",
            started.elapsed().as_secs_f64(),
            page.len() as f64 / 1e6
        );
        match to {
            Some(file) => export::write_atomically(&file, page.as_bytes())
                .with_context(|| format!("writing {}", file.display()))?,
            None => print!("{page}"),
        }
    } else if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", export::text::render(&r));
    }
    Ok(if r.objectives_failed() || r.verify_failed() {
        ExitCode::from(EXIT_OBJECTIVE)
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_779), (2026, 11, 22));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn an_agents_file_skips_comments_and_names_the_bad_line() {
        let ok =
            parse_agents_file("# sim\nagent-0=127.0.0.1:7000\n\n agent-1 = h:1 # two\n").unwrap();
        assert_eq!(
            ok,
            [
                ("agent-0".to_string(), "127.0.0.1:7000".to_string()),
                ("agent-1".to_string(), "h:1".to_string())
            ]
        );
        let (line, why) = parse_agents_file("a=h:1\nb h:2\n").unwrap_err();
        assert_eq!(line, 2);
        assert!(why.contains("expected NAME=HOST:PORT"), "{why}");
        let (line, why) = parse_agents_file("a=h:1\nb=h:2\na=h:3\n").unwrap_err();
        assert_eq!(
            (line, why.as_str()),
            (3, "agent 'a' is already listed on line 1")
        );
    }
}
