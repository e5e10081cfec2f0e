//! Several coordinators, one leader: an etcd election picks the coordinator that runs plans, run
//! state lives in etcd, and a standby that becomes leader takes over the runs of a dead one.
//!
//! `lockstep coordinator --etcd URL --name c1 --runs-dir DIR` campaigns for leadership under a
//! lease of `leader_ttl` (kept alive every ttl/3). The leader runs the plans submitted with
//! `lockstep submit PLAN --etcd URL`, one at a time, on the agents of the registry, writing
//! results under `DIR/<run id>/`. Keys (default prefix `/lockstep`):
//! - `<prefix>/election/…`: etcd's election keys (the leader's value is a [`LeaderInfo`]);
//! - `<prefix>/runs/<run id>`: a [`RunState`] (plan text, status, leader, agents, output dir,
//!   history), written by the leader only while it holds its election key (an etcd
//!   transaction compares the key), so a leader that lost its lease cannot overwrite a run
//!   its successor took over.
//!
//! Takeover: when a leader dies its lease expires (within `leader_ttl`) and a standby's
//! campaign returns. The new leader finds every run still marked `running` by someone else,
//! tells each of its agents to abort it (they would stop by themselves after their grace
//! period anyway), writes `results.json` with status `aborted` and the reason, and records the
//! takeover in the run's state: no run is lost without a trace. It does not resume collecting
//! (the intervals the old leader had merged died with it); see `docs/cluster.md`.
//!
//! A leader whose lease cannot be renewed exits: under systemd it restarts as a standby.

use crate::orchestrate::client;
use crate::plan::{AgentInfo, Assignment, Plan};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, LeaderKey, PutOptions, Txn, TxnOp};
use lockstep_core::registry::{LIST_PAGE, connect_options, etcd_message, get_prefix_paged};
use lockstep_proto::PROTOCOL_VERSION;
use lockstep_proto::v1::AbortRequest;
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("etcd at {endpoints}: {message}")]
    Etcd { endpoints: String, message: String },
    #[error(
        "leadership lost: the election lease could not be renewed ({0}); exiting so a standby leads"
    )]
    Lost(String),
    #[error("{0}")]
    Other(String),
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The elected coordinator, as its election value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaderInfo {
    pub name: String,
    pub hostname: String,
    pub pid: u32,
    pub since_unix_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunLifecycle {
    Queued,
    Running,
    Completed,
    /// Finished, but some agents were lost.
    Partial,
    /// Stopped early: Ctrl-C, or taken over by a standby after the leader died.
    Aborted,
    /// Could not be run (bad plan, no agents, unreachable agents).
    Failed,
}

impl RunLifecycle {
    pub fn is_terminal(self) -> bool {
        !matches!(self, RunLifecycle::Queued | RunLifecycle::Running)
    }
}

/// A phase of the plan, as offsets from the run's start (the synchronized start is a second or
/// so after `started_unix_ms`, when every agent has prepared).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunPhase {
    pub name: String,
    pub start_ms: u64,
    pub duration_ms: u64,
    pub measured: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunAgent {
    pub name: String,
    pub address: String,
}

/// A run as recorded in etcd.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    pub run_id: String,
    /// The plan file's name when it was submitted.
    pub plan_file: String,
    pub plan_text: String,
    pub status: RunLifecycle,
    #[serde(default)]
    pub reason: String,
    /// The coordinator that runs (or ran, or took over) it.
    #[serde(default)]
    pub leader: String,
    /// Where its results go (on the leader's host, or shared storage).
    #[serde(default)]
    pub output_dir: String,
    #[serde(default)]
    pub agents: Vec<RunAgent>,
    pub submitted_unix_ms: u64,
    #[serde(default)]
    pub started_unix_ms: Option<u64>,
    #[serde(default)]
    pub run_length_ms: u64,
    #[serde(default)]
    pub phases: Vec<RunPhase>,
    #[serde(default)]
    pub finished_unix_ms: Option<u64>,
    /// Set when a standby took the run over.
    #[serde(default)]
    pub taken_over_unix_ms: Option<u64>,
    /// One line per transition, oldest first.
    #[serde(default)]
    pub history: Vec<String>,
}

impl RunState {
    /// The phase the run is in `at_ms` after it started (approximately: the start barrier is
    /// not recorded), or None before the first and after the last.
    pub fn phase_at(&self, at_ms: u64) -> Option<&RunPhase> {
        self.phases
            .iter()
            .find(|p| at_ms >= p.start_ms && at_ms < p.start_ms + p.duration_ms)
    }

    fn note(&mut self, who: &str, what: &str) {
        self.history.push(format!("{} {who}: {what}", now_ms()));
    }
}

fn election_name(prefix: &str) -> String {
    format!("{}/election", prefix.trim_end_matches('/'))
}

fn runs_prefix(prefix: &str) -> String {
    format!("{}/runs/", prefix.trim_end_matches('/'))
}

fn run_key(prefix: &str, run_id: &str) -> String {
    format!("{}{run_id}", runs_prefix(prefix))
}

struct Etcd {
    client: Client,
    endpoints: String,
}

impl Etcd {
    async fn connect(endpoints: &[String], options: ConnectOptions) -> Result<Etcd, LeaderError> {
        let joined = endpoints.join(",");
        let client = Client::connect(endpoints, Some(options))
            .await
            .map_err(|e| LeaderError::Etcd {
                endpoints: joined.clone(),
                message: etcd_message(&e),
            })?;
        Ok(Etcd {
            client,
            endpoints: joined,
        })
    }

    fn err(&self, e: etcd_client::Error) -> LeaderError {
        LeaderError::Etcd {
            endpoints: self.endpoints.clone(),
            message: etcd_message(&e),
        }
    }

    /// Every recorded run, read in pages: a run of 10,000 agents records about 0.5 MB of
    /// agents, so a handful of them no longer fit the client's 4 MiB for one response.
    async fn runs(&mut self, prefix: &str) -> Result<Vec<RunState>, LeaderError> {
        let (kvs, _) = get_prefix_paged(&mut self.client, &runs_prefix(prefix), LIST_PAGE)
            .await
            .map_err(|e| self.err(e))?;
        let mut out: Vec<RunState> = kvs
            .iter()
            .filter_map(|kv| serde_json::from_slice(kv.value()).ok())
            .collect();
        out.sort_by_key(|r| (r.submitted_unix_ms, r.run_id.clone()));
        Ok(out)
    }

    async fn run(&mut self, prefix: &str, run_id: &str) -> Result<Option<RunState>, LeaderError> {
        let resp = self
            .client
            .get(run_key(prefix, run_id), None)
            .await
            .map_err(|e| self.err(e))?;
        Ok(resp
            .kvs()
            .first()
            .and_then(|kv| serde_json::from_slice(kv.value()).ok()))
    }

    /// Writes a run's state only while `leader` is still the elected key (fencing).
    async fn put_as_leader(
        &mut self,
        prefix: &str,
        leader: &LeaderKey,
        state: &RunState,
    ) -> Result<(), LeaderError> {
        let value = serde_json::to_vec(state).expect("run state serializes");
        let txn = Txn::new()
            .when([Compare::version(
                leader.key().to_vec(),
                CompareOp::Greater,
                0,
            )])
            .and_then([TxnOp::put(run_key(prefix, &state.run_id), value, None)]);
        let resp = self.client.txn(txn).await.map_err(|e| self.err(e))?;
        if resp.succeeded() {
            Ok(())
        } else {
            Err(LeaderError::Lost("the election key is gone".into()))
        }
    }
}

/// The current leader, if any.
pub async fn current_leader(
    endpoints: &[String],
    prefix: &str,
) -> Result<Option<LeaderInfo>, LeaderError> {
    let mut etcd = Etcd::connect(endpoints, connect_options()).await?;
    match etcd.client.leader(election_name(prefix)).await {
        Ok(r) => Ok(r
            .kv()
            .and_then(|kv| serde_json::from_slice(kv.value()).ok())),
        // "election: no leader" is an answer, not a failure.
        Err(e) if etcd_message(&e).contains("no leader") => Ok(None),
        Err(e) => Err(etcd.err(e)),
    }
}

/// A run's state, if any.
pub async fn run_state(
    endpoints: &[String],
    prefix: &str,
    run_id: &str,
) -> Result<Option<RunState>, LeaderError> {
    Etcd::connect(endpoints, connect_options())
        .await?
        .run(prefix, run_id)
        .await
}

/// Queues a plan for the leader; returns its run id.
pub async fn submit(endpoints: &[String], prefix: &str, plan: &Path) -> anyhow::Result<String> {
    let text = crate::plan::read_plan_text(plan)?;
    // Refuse a bad plan here, with its line, rather than in the leader's log.
    let parsed = crate::plan::load(plan)?;
    let stem = crate::plan::file_safe_name(&parsed.name);
    let run_id = format!("{}-{stem}", now_ms());
    let mut state = RunState {
        run_id: run_id.clone(),
        plan_file: plan
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        plan_text: text,
        status: RunLifecycle::Queued,
        reason: String::new(),
        leader: String::new(),
        output_dir: String::new(),
        agents: Vec::new(),
        submitted_unix_ms: now_ms(),
        started_unix_ms: None,
        run_length_ms: 0,
        phases: Vec::new(),
        finished_unix_ms: None,
        taken_over_unix_ms: None,
        history: Vec::new(),
    };
    state.note("submit", "queued");
    let mut etcd = Etcd::connect(endpoints, connect_options()).await?;
    etcd.client
        .put(
            run_key(prefix, &run_id),
            serde_json::to_vec(&state)?,
            Some(PutOptions::new()),
        )
        .await
        .map_err(|e| etcd.err(e))?;
    Ok(run_id)
}

/// How a coordinator service runs.
#[derive(Debug, Clone)]
pub struct CoordinatorOptions {
    pub endpoints: Vec<String>,
    pub prefix: String,
    pub name: String,
    /// Results go to `runs_dir/<run id>/`.
    pub runs_dir: PathBuf,
    pub leader_ttl: Duration,
    pub token: Option<String>,
}

/// Campaigns, then leads until `shutdown` or a lost lease.
pub async fn serve(
    opts: CoordinatorOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), LeaderError> {
    let mut shutdown = std::pin::pin!(shutdown);
    // The campaign blocks until elected: no request timeout on this client.
    let election_options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
        .with_keep_alive_while_idle(true);
    let mut etcd = Etcd::connect(&opts.endpoints, election_options).await?;
    let ttl = opts.leader_ttl.as_secs().max(1) as i64;
    let lease = etcd
        .client
        .lease_grant(ttl, None)
        .await
        .map_err(|e| etcd.err(e))?
        .id();
    let (mut keeper, mut acks) = etcd
        .client
        .lease_keep_alive(lease)
        .await
        .map_err(|e| etcd.err(e))?;
    // Keep the lease alive from the start: a standby's lease must not lapse while it waits.
    let (lost_tx, mut lost_rx) = tokio::sync::watch::channel(None::<String>);
    let every = (opts.leader_ttl / 3).max(Duration::from_millis(300));
    let keepalive = tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            let why = match keeper.keep_alive().await {
                Err(e) => Some(etcd_message(&e)),
                Ok(()) => {
                    match tokio::time::timeout(Duration::from_secs(2).max(every), acks.message())
                        .await
                    {
                        Ok(Ok(Some(r))) if r.ttl() > 0 => None,
                        Ok(Ok(Some(_))) | Ok(Ok(None)) => Some("the lease expired".to_string()),
                        Ok(Err(e)) => Some(etcd_message(&e)),
                        Err(_) => Some("no keep-alive answer".to_string()),
                    }
                }
            };
            if let Some(why) = why {
                let _ = lost_tx.send(Some(why));
                return;
            }
        }
    });
    let me = LeaderInfo {
        name: opts.name.clone(),
        hostname: lockstep_core::host::hostname(),
        pid: std::process::id(),
        since_unix_ms: 0,
    };
    tracing::info!(name = %opts.name, "campaigning for leadership");
    eprintln!(
        "lockstep coordinator {}: standby, campaigning for leadership",
        opts.name
    );
    let campaign = etcd.client.campaign(
        election_name(&opts.prefix),
        serde_json::to_vec(&me).unwrap(),
        lease,
    );
    let leader_key = tokio::select! {
        r = campaign => r.map_err(|e| etcd.err(e))?.leader().cloned().ok_or_else(|| LeaderError::Other("campaign returned no leader key".into()))?,
        _ = &mut shutdown => {
            keepalive.abort();
            let _ = etcd.client.lease_revoke(lease).await;
            return Ok(());
        }
        _ = lost_rx.changed() => return Err(LeaderError::Lost(lost_rx.borrow().clone().unwrap_or_default())),
    };
    let elected_at = now_ms();
    eprintln!("lockstep coordinator {}: leader", opts.name);
    // The election value said since 0: update it to when we won (for `lockstep runs`).
    let _ = etcd
        .client
        .proclaim(
            serde_json::to_vec(&LeaderInfo {
                since_unix_ms: elected_at,
                ..me.clone()
            })
            .unwrap(),
            Some(etcd_client::ProclaimOptions::new().with_leader(leader_key.clone())),
        )
        .await;
    let mut data = Etcd::connect(&opts.endpoints, connect_options()).await?;
    let result = lead(&opts, &mut data, &leader_key, &mut shutdown, &mut lost_rx).await;
    keepalive.abort();
    // Step down at once on a clean exit: a standby need not wait for the TTL.
    let _ = etcd.client.lease_revoke(lease).await;
    result
}

async fn lead(
    opts: &CoordinatorOptions,
    etcd: &mut Etcd,
    leader: &LeaderKey,
    shutdown: &mut (impl std::future::Future<Output = ()> + Unpin),
    lost: &mut tokio::sync::watch::Receiver<Option<String>>,
) -> Result<(), LeaderError> {
    // Runs another leader was running when it died.
    for mut run in etcd.runs(&opts.prefix).await? {
        if run.status == RunLifecycle::Running {
            take_over(opts, etcd, leader, &mut run).await?;
        }
    }
    loop {
        if let Some(mut run) = etcd
            .runs(&opts.prefix)
            .await?
            .into_iter()
            .find(|r| r.status == RunLifecycle::Queued)
        {
            execute(opts, etcd, leader, &mut run, lost).await?;
            continue;
        }
        tokio::select! {
            _ = &mut *shutdown => return Ok(()),
            _ = lost.changed() => return Err(LeaderError::Lost(lost.borrow().clone().unwrap_or_default())),
            _ = tokio::time::sleep(Duration::from_millis(300)) => {}
        }
    }
}

/// Runs one queued plan to its end, recording it in etcd before and after.
async fn execute(
    opts: &CoordinatorOptions,
    etcd: &mut Etcd,
    leader: &LeaderKey,
    run: &mut RunState,
    lost: &mut tokio::sync::watch::Receiver<Option<String>>,
) -> Result<(), LeaderError> {
    let out_dir = opts.runs_dir.join(&run.run_id);
    let plan_path = opts.runs_dir.join(format!("{}.plan.toml", run.run_id));
    run.leader = opts.name.clone();
    run.output_dir = out_dir.display().to_string();
    let prepared: Result<(Plan, Vec<AgentInfo>, Assignment), String> = async {
        std::fs::create_dir_all(&opts.runs_dir)
            .map_err(|e| format!("{}: {e}", opts.runs_dir.display()))?;
        std::fs::write(&plan_path, &run.plan_text)
            .map_err(|e| format!("{}: {e}", plan_path.display()))?;
        let plan = crate::plan::load(&plan_path).map_err(|e| e.to_string())?;
        crate::app::prepare_output_dir(&out_dir).map_err(|e| format!("{e:#}"))?;
        let infos = crate::orchestrate::registry::agent_infos(&opts.endpoints, &opts.prefix)
            .await
            .map_err(|e| e.to_string())?;
        let assignment = crate::plan::resolve(&plan, &infos).map_err(|e| e.to_string())?;
        Ok((plan, infos, assignment))
    }
    .await;
    let (plan, infos, assignment) = match prepared {
        Ok(p) => p,
        Err(e) => {
            run.status = RunLifecycle::Failed;
            run.reason = e.clone();
            run.finished_unix_ms = Some(now_ms());
            run.note(&opts.name, &format!("failed: {e}"));
            return etcd.put_as_leader(&opts.prefix, leader, run).await;
        }
    };
    run.agents = assignment
        .agents
        .iter()
        .map(|a| RunAgent {
            name: a.agent.clone(),
            address: a.address.clone(),
        })
        .collect();
    run.run_length_ms = assignment.run_length().as_millis() as u64;
    run.phases = assignment
        .phases
        .iter()
        .map(|p| RunPhase {
            name: p.name.clone(),
            start_ms: p.start.as_millis() as u64,
            duration_ms: p.duration.as_millis() as u64,
            measured: p.measure,
        })
        .collect();
    run.status = RunLifecycle::Running;
    run.started_unix_ms = Some(now_ms());
    run.note(
        &opts.name,
        &format!("running on {} agents", run.agents.len()),
    );
    etcd.put_as_leader(&opts.prefix, leader, run).await?;
    eprintln!(
        "lockstep coordinator {}: running {} on {} agents",
        opts.name,
        run.run_id,
        run.agents.len()
    );
    let settings = crate::app::RunSettings {
        token: opts.token.clone(),
        ..Default::default()
    };
    // A stop of the service ends the run in order, as it does a CLI run.
    crate::orchestrate::signals::install();
    let outcome = tokio::select! {
        r = crate::app::run_plan(&settings, &plan, &infos, Some(assignment), &out_dir) => r,
        _ = lost.changed() => return Err(LeaderError::Lost(lost.borrow().clone().unwrap_or_default())),
    };
    match outcome {
        Ok(o) => {
            run.status = match o.results.status {
                crate::results::RunStatus::Completed => RunLifecycle::Completed,
                crate::results::RunStatus::Partial => RunLifecycle::Partial,
                crate::results::RunStatus::Aborted => RunLifecycle::Aborted,
            };
            run.reason = o.results.status_reason;
        }
        Err(e) => {
            run.status = RunLifecycle::Failed;
            run.reason = format!("{e:#}");
        }
    }
    run.finished_unix_ms = Some(now_ms());
    run.note(&opts.name, &format!("{:?}", run.status).to_lowercase());
    etcd.put_as_leader(&opts.prefix, leader, run).await
}

/// A run whose leader died mid-run: abort it on every agent, write `results.json` saying so,
/// and record the takeover.
async fn take_over(
    opts: &CoordinatorOptions,
    etcd: &mut Etcd,
    leader: &LeaderKey,
    run: &mut RunState,
) -> Result<(), LeaderError> {
    let t = now_ms();
    let old = run.leader.clone();
    eprintln!(
        "lockstep coordinator {}: taking over run {} from {old}",
        opts.name, run.run_id
    );
    let mut per_agent = Vec::new();
    let mut agent_results = Vec::new();
    for a in &run.agents {
        let token = opts.token.as_deref();
        let (what, hello) =
            match client::connect(&a.name, &a.address, token, client::KEEPALIVE).await {
                Ok(mut c) => {
                    let was_running = c.hello.busy_with_run == run.run_id;
                    let req = AbortRequest {
                        protocol_version: PROTOCOL_VERSION,
                        run_id: run.run_id.clone(),
                        reason: format!(
                            "coordinator {old} lost; standby {} aborts the run",
                            opts.name
                        ),
                    };
                    let what = match c.client.abort(req).await {
                        Ok(_) if was_running => "was still running it: aborted".to_string(),
                        Ok(_) => "had already stopped it".to_string(),
                        Err(e) => format!("abort failed: {}", e.message()),
                    };
                    (what, Some(c.hello))
                }
                Err(e) => (format!("unreachable: {e}"), None),
            };
        per_agent.push(format!("{}: {what}", a.name));
        agent_results.push(serde_json::json!({
            "name": a.name,
            "address": a.address,
            "hostname": hello.as_ref().map(|h| h.hostname.clone()).unwrap_or_default(),
            "version": hello.as_ref().map(|h| h.agent_version.clone()).unwrap_or_default(),
            "clock": crate::results::clock::ClockEstimate::default(),
            "state": {"state": "lost", "at_ms": t.saturating_sub(run.started_unix_ms.unwrap_or(t)), "reason": format!("coordinator {old} lost; {what}")},
            "errors": [],
        }));
    }
    let at_ms = t.saturating_sub(run.started_unix_ms.unwrap_or(t));
    let phase = run
        .phase_at(at_ms)
        .map(|p| format!(" (phase '{}')", p.name))
        .unwrap_or_default();
    let reason = format!(
        "coordinator {old} was lost mid-run; standby {} took over {:.1} s after the run started{phase} and aborted it on every agent ({}). \
         The intervals {old} had collected were lost with it.",
        opts.name,
        at_ms as f64 / 1000.0,
        per_agent.join("; ")
    );
    let out_dir = PathBuf::from(&run.output_dir);
    if !out_dir.as_os_str().is_empty() && !out_dir.join("results.json").exists() {
        if let Err(e) = write_takeover_results(&out_dir, run, &reason, agent_results) {
            tracing::warn!("{}: cannot write results.json: {e}", out_dir.display());
        }
    }
    run.status = RunLifecycle::Aborted;
    run.reason = reason.clone();
    run.leader = opts.name.clone();
    run.taken_over_unix_ms = Some(t);
    run.finished_unix_ms = Some(now_ms());
    run.note(&opts.name, &format!("took over from {old}: {reason}"));
    etcd.put_as_leader(&opts.prefix, leader, run).await
}

/// `results.json` of a run nobody could finish collecting: status, reason, agents; no figures.
fn write_takeover_results(
    dir: &Path,
    run: &RunState,
    reason: &str,
    agents: Vec<serde_json::Value>,
) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let summary =
        serde_json::to_value(crate::results::Summary::default()).map_err(|e| e.to_string())?;
    let plan_name = toml::from_str::<toml::Value>(&run.plan_text)
        .ok()
        .and_then(|v| v.get("name").and_then(|n| n.as_str()).map(String::from))
        .unwrap_or_else(|| run.plan_file.trim_end_matches(".toml").to_string());
    let value = serde_json::json!({
        "lockstep_version": env!("CARGO_PKG_VERSION"),
        "run_id": run.run_id,
        "plan": plan_name,
        "status": "aborted",
        "status_reason": reason,
        "start_unix_ms": run.started_unix_ms.unwrap_or(0),
        "duration_ms": now_ms().saturating_sub(run.started_unix_ms.unwrap_or(now_ms())),
        "interval_ms": 1000,
        "phases": [],
        "agents": agents,
        "start_skew_ns": null,
        "cluster": summary,
        "nodes": [],
        "volumes": [],
        "cluster_timeline": [],
        "objectives": [],
        "warnings": [reason],
    });
    // Through the results type when it accepts this, so `lockstep report DIR` renders it.
    match serde_json::from_value::<crate::results::RunResults>(value.clone()) {
        Ok(r) => {
            use crate::export::{ResultsJson, TextReport, TimelineCsv, TimelineJson};
            crate::export::write_run_dir(
                dir,
                &r,
                &[&TextReport, &ResultsJson, &TimelineJson, &TimelineCsv],
            )
            .map_err(|e| e.to_string())
        }
        Err(_) => crate::export::write_atomically(
            &dir.join("results.json"),
            &serde_json::to_vec_pretty(&value).unwrap(),
        )
        .map_err(|e| e.to_string()),
    }
}

/// `lockstep coordinator`: a coordinator service (leader or standby) until SIGINT/SIGTERM.
pub fn coordinator_command(opts: CoordinatorOptions) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let shutdown = async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        };
        serve(opts, shutdown).await?;
        Ok(ExitCode::SUCCESS)
    })
}

/// `lockstep submit PLAN --etcd URL [--wait]`: prints the run id; with --wait, waits for the
/// run to end and exits like `lockstep run` (0 completed, 1 partial/aborted, 2 failed).
pub fn submit_command(
    endpoints: &[String],
    prefix: &str,
    plan: &Path,
    wait: bool,
) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let id = submit(endpoints, prefix, plan).await?;
        println!("{id}");
        if !wait {
            return Ok(ExitCode::SUCCESS);
        }
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if let Some(s) = run_state(endpoints, prefix, &id)
                .await?
                .filter(|s| s.status.is_terminal())
            {
                eprintln!(
                    "lockstep: run {id}: {:?} by {}: {} (results in {})",
                    s.status, s.leader, s.reason, s.output_dir
                );
                return Ok(match s.status {
                    RunLifecycle::Completed => ExitCode::SUCCESS,
                    RunLifecycle::Failed => ExitCode::from(2),
                    _ => ExitCode::from(1),
                });
            }
        }
    })
}

/// `lockstep runs --etcd URL [--json]`: the leader and every recorded run.
pub fn runs_command(endpoints: &[String], prefix: &str, json: bool) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let leader = current_leader(endpoints, prefix).await?;
        let runs = Etcd::connect(endpoints, connect_options())
            .await?
            .runs(prefix)
            .await?;
        if json {
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({"leader": leader, "runs": runs}))?
            );
            return Ok(ExitCode::SUCCESS);
        }
        match &leader {
            Some(l) => println!("leader: {} (pid {} on {})", l.name, l.pid, l.hostname),
            None => println!("leader: none"),
        }
        for r in &runs {
            println!(
                "{}  {:?}  {}  {} agents  {}",
                r.run_id,
                r.status,
                r.leader,
                r.agents.len(),
                r.reason
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        assert_eq!(run_key("/lockstep", "1-x"), "/lockstep/runs/1-x");
        assert_eq!(election_name("/lockstep/"), "/lockstep/election");
        assert!(RunLifecycle::Aborted.is_terminal() && !RunLifecycle::Running.is_terminal());
        assert_eq!(
            serde_json::to_string(&RunLifecycle::Partial).unwrap(),
            "\"partial\""
        );
    }

    #[test]
    fn the_phase_at_a_time() {
        let phase = |name: &str, start_ms, duration_ms| RunPhase {
            name: name.into(),
            start_ms,
            duration_ms,
            measured: true,
        };
        let json = r#"{"run_id":"1-x","plan_file":"x.toml","plan_text":"","status":"running","submitted_unix_ms":1}"#;
        let mut s: RunState = serde_json::from_str(json).unwrap();
        s.phases = vec![phase("ramp", 0, 5_000), phase("measure", 5_000, 30_000)];
        assert_eq!(s.phase_at(4_999).unwrap().name, "ramp");
        assert_eq!(s.phase_at(5_000).unwrap().name, "measure");
        assert!(s.phase_at(35_000).is_none());
    }
}
