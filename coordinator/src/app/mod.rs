//! The `lockstep` commands, called by `main.rs` after argument parsing.
//!
//! `run`: plan → agents (local children or given by address) → resolved assignment → run →
//! results directory (results.json, fio.json, timeline.csv, intervals.hlog, report.txt) →
//! report on stdout, exit code from objectives (and the chokepoint with --fail-on-chokepoint).
//! `report`: re-renders a finished run from its directory.

pub mod certs;
mod curve;
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
use crate::orchestrate::local::LocalCluster;
use crate::orchestrate::run::{self, AgentWork, PhaseSpec, RunSpec, VolumeWork};
use crate::plan::{self, AgentInfo, AgentVolume, Assignment, Plan};
use crate::results::hlog::HlogWriter;
use crate::results::timeline::VolumeModel;
use crate::results::{ObjectiveResult, RunResults, RunStatus};

pub struct RunArgs {
    pub plan: PathBuf,
    pub local: Option<usize>,
    /// Start the local agents with `--allow-exec`.
    pub allow_exec: bool,
    pub output: Option<PathBuf>,
    /// Extra agents `NAME=HOST:PORT` (added to the plan's `[[agent]]` list).
    pub agents: Vec<(String, String)>,
    pub token: Option<String>,
    pub json: bool,
    pub keep_files: bool,
    pub fail_on_chokepoint: bool,
    /// Serve Prometheus metrics of the run here.
    pub metrics_listen: Option<String>,
    /// Take the agents from the etcd registry at these URLs (comma-separated).
    pub etcd: Option<String>,
    /// The registry's key prefix.
    pub etcd_prefix: String,
}

/// Exit codes (the table is in docs/exit-codes.md): 0 all good; 1 an objective failed (including
/// one that could not be judged because data it covers is missing: a lost agent, missing
/// intervals, stuck IOs, a verification that could not run), verification found a lost, stale
/// or corrupted block, or a chokepoint with --fail-on-chokepoint; 2 the run could not be done
/// (bad plan, unreachable agent); 130 stopped with Ctrl-C (SIGINT); 143 stopped with SIGTERM.
/// The stops keep partial results; a CI gate must treat every non-zero code as a failure.
pub const EXIT_OBJECTIVE: u8 = 1;
pub use crate::orchestrate::signals::{EXIT_INTERRUPTED, EXIT_TERMINATED};
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
    let name: String = plan
        .name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
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

fn prepare_output_dir(dir: &Path) -> anyhow::Result<()> {
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
    let mut out = Vec::new();
    for (name, address, plan_labels) in agents {
        let c = crate::orchestrate::client::connect(name, address, token).await?;
        let mut labels: std::collections::BTreeMap<String, String> =
            c.hello.labels.clone().into_iter().collect();
        labels.extend(plan_labels.clone());
        out.push(AgentInfo {
            name: name.clone(),
            address: address.clone(),
            labels,
            volumes: c
                .hello
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

/// What the credit forecast said before a credit cliff, against when the cliff came.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ForecastCheck {
    pub node: String,
    pub volume: String,
    /// The forecast used the data up to here (half-way to the onset, as a live view would).
    pub made_at_ms: u64,
    pub predicted_ms: u64,
    pub actual_onset_ms: u64,
    /// (predicted - actual) / actual onset, percent.
    pub error_pct: f64,
}

/// For a credit-exhaustion chokepoint: the forecast the finder makes from the timeline cut
/// half-way to the onset (what the live view showed then), compared with the actual onset.
pub fn forecast_before_cliff(
    t: &crate::results::timeline::Timeline,
    opts: &AnalysisOptions,
    final_report: &chokepoint::ChokepointReport,
) -> Option<ForecastCheck> {
    let Verdict::Volume(v) = &final_report.verdict else {
        return None;
    };
    if v.kind != chokepoint::ChokepointKind::CreditExhaustion || v.onset_ms == 0 {
        return None;
    }
    let cut = v.onset_ms / 2;
    let mut early = t.clone();
    for s in &mut early.volumes {
        s.points.retain(|p| p.t_ms <= cut);
    }
    let r = chokepoint::analyze(&early, opts);
    let f = r
        .forecasts
        .iter()
        .find(|f| f.node == v.node && f.volume == v.volume)?;
    let predicted = f.runs_out_at_ms?;
    Some(ForecastCheck {
        node: v.node.clone(),
        volume: v.volume.clone(),
        made_at_ms: cut,
        predicted_ms: predicted,
        actual_onset_ms: v.onset_ms,
        error_pct: (predicted as f64 - v.onset_ms as f64) / v.onset_ms as f64 * 100.0,
    })
}

/// Evaluates the plan's objectives on the results (latency from merged histograms). An
/// objective fails on every volume, node or cluster it covers whose data is incomplete (see
/// `results::incomplete_volumes`), with the reason: what was not measured cannot pass.
/// Expects the stuck IOs and verification results already collected into `r`.
pub fn evaluate_objectives(a: &Assignment, r: &RunResults) -> Vec<ObjectiveResult> {
    use crate::plan::{Metric, Scope};
    let gaps = crate::results::incomplete_volumes(r);
    let gaps_of = |pick: &dyn Fn(&str, &str) -> bool| -> Vec<String> {
        gaps.iter()
            .filter(|((n, v), _)| pick(n, v))
            .flat_map(|((n, v), why)| why.iter().map(move |w| format!("{n}/{v}: {w}")))
            .collect()
    };
    let role_of = |node: &str, volume: &str| -> String {
        r.volumes
            .iter()
            .find(|v| v.node == node && v.volume == volume)
            .map(|v| v.role.clone())
            .unwrap_or_default()
    };
    let lat_value = |s: &crate::results::Summary,
                     dir: Option<lockstep_core::job::Direction>,
                     m: Metric|
     -> Option<f64> {
        let d = match dir {
            Some(lockstep_core::job::Direction::Read) => &s.read,
            Some(lockstep_core::job::Direction::Write) => &s.write,
            None => &s.total,
        };
        if d.ios == 0 {
            return None;
        }
        let l = d.lat_intended.as_ref().unwrap_or(&d.lat);
        Some(match m {
            Metric::Percentile(p) => l
                .percentiles
                .get(&crate::results::percentile_key(p))
                .copied()? as f64,
            Metric::Mean => l.mean_ns,
            Metric::Max => l.max_ns as f64,
            _ => return None,
        })
    };
    // Lowest per-interval throughput of a set of volumes (summed per interval).
    // Only intervals of measured phases count (the timeline also shows the warm-up).
    let measured = |t_ms: u64| {
        let mid = std::time::Duration::from_millis(t_ms.saturating_sub(r.interval_ms / 2));
        a.phases
            .iter()
            .any(|p| p.measure && p.start <= mid && mid < p.start + p.duration)
    };
    let min_rate = |vols: &[&crate::results::timeline::VolumeSeries],
                    bytes: bool,
                    dir: Option<lockstep_core::job::Direction>|
     -> Option<f64> {
        let mut per: std::collections::BTreeMap<u64, f64> = Default::default();
        for v in vols {
            for p in v.points.iter().filter(|p| measured(p.t_ms)) {
                let secs = p.len_ms.max(1) as f64 / 1000.0;
                let pick = |a: [u64; 2]| match dir {
                    Some(d) => a[d as usize],
                    None => a[0] + a[1],
                };
                let x = if bytes { pick(p.bytes) } else { pick(p.ios) } as f64 / secs;
                *per.entry(p.t_ms).or_default() += x;
            }
        }
        per.values().copied().reduce(f64::min)
    };
    let fmt_value = |m: Metric, v: f64| -> String {
        match m {
            Metric::IopsMin => format!("{v:.0} IOPS"),
            Metric::MbpsMin => format!("{:.1} MB/s", v / 1e6),
            _ => format!("{:.3} ms", v / 1e6),
        }
    };
    a.objectives
        .iter()
        .map(|o| {
            let in_role = |role: &str| o.role.as_deref().is_none_or(|r| r == role);
            // Incomplete data first, whatever the scope (a node or the cluster with a volume
            // missing is incomplete too): the figures below are judged on what is left.
            let mut failures = gaps_of(&|n, v| in_role(&role_of(n, v)));
            let mut check =
                |who: String,
                 summary: &crate::results::Summary,
                 series: Vec<&crate::results::timeline::VolumeSeries>| {
                    let value = match o.metric {
                        Metric::IopsMin => min_rate(&series, false, o.direction),
                        Metric::MbpsMin => min_rate(&series, true, o.direction),
                        m => lat_value(summary, o.direction, m),
                    };
                    match value {
                        Some(v) if !o.holds(v) => {
                            failures.push(format!("{who}: {} {}", o.metric, fmt_value(o.metric, v)))
                        }
                        Some(_) => {}
                        None => {}
                    }
                };
            match o.scope {
                Scope::Volume => {
                    for v in r.volumes.iter().filter(|v| in_role(&v.role)) {
                        let s: Vec<_> = r
                            .timeline
                            .volumes
                            .iter()
                            .filter(|s| s.node == v.node && s.volume == v.volume)
                            .collect();
                        check(format!("{}/{}", v.node, v.volume), &v.summary, s);
                    }
                }
                Scope::Node => {
                    for n in &r.nodes {
                        let s: Vec<_> = r
                            .timeline
                            .volumes
                            .iter()
                            .filter(|s| s.node == n.node && in_role(&s.role))
                            .collect();
                        check(n.node.clone(), &n.summary, s);
                    }
                }
                Scope::Cluster => {
                    let s: Vec<_> = r
                        .timeline
                        .volumes
                        .iter()
                        .filter(|s| in_role(&s.role))
                        .collect();
                    check("cluster".into(), &r.cluster, s);
                }
            }
            ObjectiveResult {
                objective: o.to_string(),
                passed: failures.is_empty(),
                failures,
            }
        })
        .collect()
}

pub fn run_command(args: RunArgs) -> anyhow::Result<ExitCode> {
    let plan = plan::load(&args.plan)?;
    let out_dir = args.output.clone().unwrap_or_else(|| default_output(&plan));
    prepare_output_dir(&out_dir)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run_async(args, plan, out_dir))
}

async fn run_async(args: RunArgs, plan: Plan, out_dir: PathBuf) -> anyhow::Result<ExitCode> {
    // Before any agent starts: a stop during their start or layout is an orderly one too.
    crate::orchestrate::signals::install();
    let mut local = None;
    let (infos, token) = if let Some(n) = args.local {
        anyhow::ensure!(n >= 1, "--local needs at least 1 agent");
        let volumes_root = out_dir.join("volumes");
        if !args.json {
            eprintln!(
                "lockstep: starting {n} local agents, volumes under {}",
                volumes_root.display()
            );
        }
        let cluster =
            LocalCluster::start(n, &volumes_root, Duration::from_secs(5), args.allow_exec).await?;
        let infos = cluster
            .agents
            .iter()
            .map(|a| AgentInfo {
                name: a.name.clone(),
                address: a.address.clone(),
                labels: [("node".to_string(), a.name.clone())].into_iter().collect(),
                volumes: vec![AgentVolume {
                    name: "data".into(),
                    path: a.dir.clone(),
                    kind: "local".into(),
                    ..Default::default()
                }],
            })
            .collect();
        let token = Some(cluster.token.clone());
        local = Some(cluster);
        (infos, token)
    } else if let Some(etcd) = &args.etcd {
        // Live agents from the registry; the plan's [[agent]] list is not used.
        let endpoints = lockstep_core::registry::parse_endpoints(etcd);
        (
            crate::orchestrate::registry::agent_infos(&endpoints, &args.etcd_prefix).await?,
            args.token.clone(),
        )
    } else {
        let mut list: Vec<(String, String, std::collections::BTreeMap<String, String>)> = plan
            .agents
            .iter()
            .map(|a| (a.name.clone(), a.address.clone(), a.labels.clone()))
            .collect();
        for (n, addr) in &args.agents {
            list.push((n.clone(), addr.clone(), Default::default()));
        }
        anyhow::ensure!(
            !list.is_empty(),
            "{}: the plan lists no [[agent]]; add some, pass --agent NAME=HOST:PORT, or try --local N",
            plan.origin.display()
        );
        (
            discover(&list, args.token.as_deref()).await?,
            args.token.clone(),
        )
    };
    // A plan has at most one kind of series (the plan refuses both).
    let outcome = if !crate::analysis::curve::curve_roles(&plan).is_empty() {
        curve::run(&args, &plan, &infos, token, &out_dir).await
    } else if !crate::analysis::sweep::sweep_roles(&plan).is_empty() {
        sweep::run(&args, &plan, &infos, token, &out_dir).await
    } else {
        run_resolved(&args, &plan, &infos, token, &out_dir).await
    };
    if let Some(c) = local {
        tracing::debug!("stopping the local agents");
        c.shutdown(args.keep_files).await;
    }
    tracing::debug!("run done");
    outcome
}

pub(crate) async fn run_resolved(
    args: &RunArgs,
    plan: &Plan,
    infos: &[AgentInfo],
    token: Option<String>,
    out_dir: &Path,
) -> anyhow::Result<ExitCode> {
    let assignment = plan::resolve(plan, infos)?;
    check_faults(plan, &assignment)?;
    let run_id = out_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "run".into());
    let spec = run_spec(&run_id, &assignment, args.keep_files, token);
    let stop_rx = crate::orchestrate::signals::watch();
    let hlog_path = out_dir.join("intervals.hlog");
    // Never through a link left in the results directory.
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&hlog_path)
            .with_context(|| format!("creating {}", hlog_path.display()))?
    };
    let mut hlog = Some(HlogWriter::new(
        std::io::BufWriter::new(crate::results::hlog::KeepGoing::new(file)),
        crate::orchestrate::client::unix_ns() / 1_000_000,
    )?);
    let mut live = LiveView::new(assignment.run_length(), args.json);
    live.analysis = analysis_options(&assignment);
    if let Some(addr) = &args.metrics_listen {
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
    let outcome = run::execute(spec, &mut live, stop_rx, &mut hlog).await;
    live.finish();
    let mut unwritten = Vec::new();
    if let Some(h) = hlog.take() {
        let failure = match h.into_inner().into_inner() {
            Ok(kept) => kept.error,
            Err(e) => Some(e.into_error()),
        };
        if let Some(e) = failure {
            unwritten.push(format!("{}: {e}", hlog_path.display()));
        }
    }
    let output = outcome?;
    let mut results = output.results;
    crate::analysis::drill::collect_finals(&mut results, &output.finals);
    results.objectives = evaluate_objectives(&assignment, &results);
    let analysis = chokepoint::analyze(&results.timeline, &analysis_options(&assignment));
    let text = chokepoint::render_text(&analysis);
    let blamed = matches!(analysis.verdict, Verdict::Volume(_) | Verdict::Node(_));
    let mut value = serde_json::to_value(&analysis)?;
    let before =
        forecast_before_cliff(&results.timeline, &analysis_options(&assignment), &analysis);
    let mut text = text;
    if let Some(b) = &before {
        text.push_str(&format!(
            "forecast made before the cliff, at t={:.0}s: credits run out at t={:.0}s; they did at t={:.0}s ({:+.1}%)\n",
            b.made_at_ms as f64 / 1000.0,
            b.predicted_ms as f64 / 1000.0,
            b.actual_onset_ms as f64 / 1000.0,
            b.error_pct
        ));
    }
    if let Some(o) = value.as_object_mut() {
        o.insert("text".into(), serde_json::Value::String(text));
        o.insert(
            "forecast_before_cliff".into(),
            serde_json::to_value(&before)?,
        );
    }
    results.chokepoint = Some(value);
    if !results.faults.is_empty() && unwritten.is_empty() {
        // The drill report reads back the raw histograms this run just wrote.
        let entries = crate::results::hlog::read(&hlog_path)
            .context("reading intervals.hlog for the drill report")?;
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
    if args.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        print!("{}", export::text::render(&results));
    }
    let fio = export::fio::document(&results, &output.finals);
    let fio = serde_json::to_string_pretty(&fio)?.into_bytes();
    for written in [
        export::write_run_dir(out_dir, &results),
        export::write_all_or_name_failures(out_dir, &[("fio.json", fio)]),
    ] {
        if let Err(e) = written {
            unwritten.push(e.to_string());
        }
    }
    if !unwritten.is_empty() {
        eprintln!(
            "lockstep: error: results not written: {} (the report above is complete)",
            unwritten.join("; ")
        );
        return Ok(ExitCode::from(EXIT_RESULTS_UNWRITTEN));
    }
    eprintln!("lockstep: results in {}", out_dir.display());
    Ok(exit_code(&results, blamed && args.fail_on_chokepoint))
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

/// `lockstep report DIR`: re-renders a finished run.
pub fn report_command(dir: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let r = export::read_run_dir(dir).map_err(anyhow::Error::msg)?;
    if json {
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
}
