//! Running a plan on agents: connect, measure clocks, prepare, start every agent at the same
//! instant, collect and merge interval reports, and survive agents that die.
//!
//! Phases are separated by a barrier: every agent finishes (or is lost in) a phase before any
//! starts the next. A run can always be stopped (`stop` resolves): every agent is told to abort
//! and the results so far are still returned.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lockstep_proto::PROTOCOL_VERSION;
use lockstep_proto::v1::{
    AbortRequest, AttachRequest, PrepareRequest, RunEvent, StartRequest,
    VolumeResult as WireVolumeResult, VolumeWork as WireVolumeWork, run_event,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;

use crate::orchestrate::client::{self, Connected};
use crate::results::clock::{self, ClockEstimate};
use crate::results::merge::{Merger, VolumeInfo};
use crate::results::timeline::{FaultWindow, VolumeModel};
use crate::results::{AgentResult, AgentState, Disconnection, PhaseResult, RunResults, RunStatus};

/// The work of one volume.
#[derive(Debug, Clone)]
pub struct VolumeWork {
    pub volume: String,
    pub role: String,
    /// fio job-file text; the agent confines its targets to the volume.
    pub jobfile: String,
    /// Options set on every job (like `--set`).
    pub overrides: BTreeMap<String, String>,
    /// Faults as JSON `FaultSpec`s with `at_ms`/`duration_ms` relative to the phase start.
    pub faults_json: Vec<String>,
    pub model: Option<VolumeModel>,
    pub target_iops: Option<f64>,
}

#[derive(Debug, Clone)]
pub struct AgentWork {
    pub name: String,
    pub address: String,
    pub volumes: Vec<VolumeWork>,
}

/// A window of the run. Phases follow each other with no gap (the workload keeps running);
/// they differ in whether their intervals count for results (a warm-up does not). Laying out
/// files is the barrier before them: every agent has prepared before any starts.
#[derive(Debug, Clone)]
pub struct PhaseSpec {
    pub name: String,
    /// Offset from the synchronized start.
    pub start: Duration,
    pub duration: Duration,
    pub measure: bool,
}

#[derive(Debug, Clone)]
pub struct RunSpec {
    pub run_id: String,
    pub plan_name: String,
    pub interval: Duration,
    pub phases: Vec<PhaseSpec>,
    pub agents: Vec<AgentWork>,
    pub keep_files: bool,
    pub token: Option<String>,
}

/// What the live view is told as the run goes.
pub trait RunObserver: Send {
    fn message(&mut self, text: &str);
    fn phase_started(&mut self, name: &str, duration: Duration, measured: bool);
    /// Called about once per interval with the merge state so far.
    fn tick(&mut self, merger: &Merger, phase_elapsed: Duration);
    fn phase_finished(&mut self, name: &str);
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Client(#[from] client::ClientError),
    #[error("agent '{agent}' refused the work: {message}")]
    Prepare { agent: String, message: String },
    #[error("agent '{agent}' could not start: {message}")]
    Start { agent: String, message: String },
    #[error("writing {what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

enum Ev {
    Event(usize, RunEvent),
    /// The stream broke before the final result; re-attaching.
    Detached(usize, String),
    /// A re-attach worked: the agent replays what it kept, then goes on.
    Reattached(usize),
    /// The stream ended for good (cleanly after Final, or broken and no re-attach worked).
    Ended(usize, Option<String>),
}

/// How long a stopped run waits for the agents' final results after telling them to abort. The
/// figures come from the intervals already streamed; a final result adds the per-job fio
/// figures, stuck IOs and verification, and building it grows with the clone count (2,000
/// clones' histograms take seconds), so the wait is bounded: whatever stops a run, the
/// coordinator ends within a few seconds.
const ABORT_WAIT: Duration = Duration::from_secs(2);

/// How long to keep trying to re-attach to an agent whose stream broke: as long as the agent
/// itself keeps running without a coordinator (its grace period, 10 s when it does not say),
/// plus a margin for the agent to notice.
fn reattach_window(grace_ms: u64) -> Duration {
    let grace = if grace_ms == 0 { 10_000 } else { grace_ms };
    Duration::from_millis(grace) + Duration::from_secs(5)
}

struct AgentRun {
    conn: Connected,
    clock: ClockEstimate,
    state: AgentState,
    errors: Vec<String>,
    start_lateness_ns: Option<i64>,
    /// Last time anything came from it (for the stall warning).
    last_heard: Instant,
    stalled_warned: bool,
    /// Times its stream broke, and whether re-attaching worked.
    disconnections: Vec<Disconnection>,
}

/// Everything the caller needs besides the results: the per-volume final results (fio JSON and
/// whole-run histograms) for the fio-compatible export.
pub struct RunOutput {
    pub results: RunResults,
    pub finals: Vec<(String, WireVolumeResult)>,
}

pub async fn execute(
    spec: RunSpec,
    observer: &mut dyn RunObserver,
    mut stop: watch::Receiver<Option<crate::orchestrate::signals::Stop>>,
    hlog: &mut Option<crate::results::hlog::RunLog>,
) -> Result<RunOutput, RunError> {
    let interval_ms = spec.interval.as_millis().max(1) as u64;
    observer.message(&format!("connecting to {} agents", spec.agents.len()));
    // Connect and handshake with everyone first: a refusal stops the run before any IO.
    let conns = futures_join(spec.agents.iter().map(|a| {
        let token = spec.token.clone();
        let (name, address) = (a.name.clone(), a.address.clone());
        async move { client::connect(&name, &address, token.as_deref()).await }
    }))
    .await;
    let mut agents = Vec::new();
    for c in conns {
        let mut conn = c?;
        if !conn.hello.busy_with_run.is_empty() {
            return Err(RunError::Prepare {
                agent: conn.name.clone(),
                message: format!("busy with run {}", conn.hello.busy_with_run),
            });
        }
        let clock = conn.probe_clock(16).await?;
        agents.push(AgentRun {
            conn,
            clock,
            state: AgentState::Finished,
            errors: Vec::new(),
            start_lateness_ns: None,
            last_heard: Instant::now(),
            stalled_warned: false,
            disconnections: Vec::new(),
        });
    }
    let worst_rtt = agents.iter().map(|a| a.clock.rtt_ns).max().unwrap_or(0);
    observer.message(&format!(
        "clocks: {} agents, offsets {}, worst round trip {:.3} ms",
        agents.len(),
        agents
            .iter()
            .map(|a| format!("{}={:+.3}ms", a.conn.name, a.clock.offset_ns as f64 / 1e6))
            .collect::<Vec<_>>()
            .join(" "),
        worst_rtt as f64 / 1e6
    ));

    let infos: Vec<VolumeInfo> = spec
        .agents
        .iter()
        .flat_map(|a| {
            a.volumes.iter().map(|v| VolumeInfo {
                node: a.name.clone(),
                volume: v.volume.clone(),
                role: v.role.clone(),
                model: v.model.clone(),
                target_iops: v.target_iops,
            })
        })
        .collect();
    let mut merger = Merger::new(interval_ms, &infos);
    let mut phases = Vec::new();
    let mut finals: Vec<(String, WireVolumeResult)> = Vec::new();
    let mut faults: Vec<FaultWindow> = Vec::new();
    let mut aborted = false;
    let mut status_reason = String::new();
    let measured_ms: u64;
    let run_start_ns = client::unix_ns();
    let measured_start_skew;

    let total = spec
        .phases
        .iter()
        .map(|p| p.start + p.duration)
        .max()
        .unwrap_or_default();
    let measured = |index: u64| {
        let mid = Duration::from_millis(index * interval_ms + interval_ms / 2);
        spec.phases
            .iter()
            .any(|p| p.measure && p.start <= mid && mid < p.start + p.duration)
    };
    {
        let phase = PhaseSpec {
            name: "run".into(),
            start: Duration::ZERO,
            duration: total,
            measure: true,
        };
        let live: Vec<usize> = (0..agents.len()).collect();
        // Prepare everywhere (lays out files); any refusal aborts the others.
        observer.message(&format!(
            "preparing {} agents (laying out files)",
            live.len()
        ));
        let run_id = spec.run_id.clone();
        // A stop during the layout (which can take minutes) aborts it on every agent: each
        // stops between chunks, removes what it laid out and answers.
        let (prepared, refusal) = {
            let layout = prepare_all(&agents, &live, &spec, interval_ms, phase.duration);
            tokio::pin!(layout);
            tokio::select! {
                biased;
                r = stop.wait_for(|s| s.is_some()) => {
                    let why = r.ok().and_then(|s| *s).map_or("a stop request", |s| s.describe());
                    aborted = true;
                    status_reason = format!("stopped by {why} during the layout");
                    observer.message(
                        "stopping during the layout: telling every agent to abort (nothing ran)",
                    );
                    abort_all(&agents, &live, &run_id, "stopped by the user").await;
                    let _ = tokio::time::timeout(Duration::from_secs(3), &mut layout).await;
                    (Vec::new(), None)
                }
                r = &mut layout => r,
            }
        };
        if let Some(e) = refusal {
            abort_all(
                &agents,
                &prepared,
                &run_id,
                "another agent refused the work",
            )
            .await;
            return Err(e);
        }

        // One start instant for everyone, far enough ahead for the Start calls to arrive.
        let lead = Duration::from_millis(
            std::env::var("LOCKSTEP_LEAD_MS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(300),
        ) + Duration::from_nanos(worst_rtt.max(0) as u64 * 4);
        let start_ns = client::unix_ns() + lead.as_nanos() as i64;
        let (tx, mut rx) = mpsc::channel::<Ev>(4096);
        for &i in &prepared {
            let mut client = agents[i].conn.client.clone();
            let req = StartRequest {
                protocol_version: PROTOCOL_VERSION,
                run_id: run_id.clone(),
                start_at_agent_ns: agents[i].clock.to_agent(start_ns),
            };
            let stream = client.start(req).await.map_err(|s| RunError::Start {
                agent: agents[i].conn.name.clone(),
                message: agents[i].conn.err(s).to_string(),
            })?;
            let tx = tx.clone();
            let window = reattach_window(agents[i].conn.hello.grace_ms);
            let run_id = run_id.clone();
            tokio::spawn(follow_agent(
                i,
                stream.into_inner(),
                client,
                run_id,
                window,
                tx,
            ));
        }
        drop(tx);
        observer.phase_started(&phase.name, phase.duration, phase.measure);
        let mut finished: Vec<bool> = vec![false; agents.len()];
        let mut pending = prepared.len();
        let mut starts: Vec<i64> = Vec::new();
        let mut tick = tokio::time::interval(spec.interval.min(Duration::from_secs(1)));
        let phase_t0 = Instant::now() + lead;
        let mut abort_deadline: Option<Instant> = None;
        while pending > 0 {
            tokio::select! {
                ev = rx.recv() => {
                    let Some(ev) = ev else { break };
                    match ev {
                        Ev::Event(i, RunEvent { event: Some(e), .. }) => {
                            agents[i].last_heard = Instant::now();
                            match e {
                                run_event::Event::Started(s) => {
                                    let actual = agents[i].clock.to_coordinator(s.actual_start_agent_ns);
                                    starts.push(actual);
                                    let late = actual - start_ns;
                                    agents[i].start_lateness_ns =
                                        Some(agents[i].start_lateness_ns.map_or(late, |l: i64| l.max(late)));
                                }
                                run_event::Event::Interval(iv) => {
                                    let index = iv.index;
                                    let counted = measured(index);
                                    let len_ms = iv.len_ns / 1_000_000;
                                    for v in &iv.volumes {
                                        if counted {
                                            if let Some(h) = hlog.as_mut() {
                                                write_hlog(h, &agents[i].conn.name, index, interval_ms, v)
                                                    .map_err(|source| RunError::Io { what: "intervals.hlog".into(), source })?;
                                            }
                                        }
                                        if let Err(e) = merger.ingest(&agents[i].conn.name, index, len_ms, v, counted) {
                                            agents[i].errors.push(e.to_string());
                                        }
                                    }
                                }
                                run_event::Event::Fault(fe) => {
                                    let w = fault_window(&agents[i], start_ns, &fe);
                                    let what = match (w.end_ms, w.detail.as_deref()) {
                                        (None, None | Some("")) => format!("began at t={:.1}s", w.start_ms as f64 / 1000.0),
                                        (None, Some(d)) => format!("began at t={:.1}s: {d}", w.start_ms as f64 / 1000.0),
                                        (Some(e), None | Some("")) => format!("ended at t={:.1}s", e as f64 / 1000.0),
                                        (Some(e), Some(d)) => format!("ended at t={:.1}s: {d}", e as f64 / 1000.0),
                                    };
                                    if faults.iter().all(|f| !(f.node == w.node && f.fault == w.fault && f.start_ms == w.start_ms && f.end_ms == w.end_ms && f.detail == w.detail)) {
                                        observer.message(&format!("fault {} on {}/{} {what}", w.fault, w.node, w.volume));
                                    }
                                    upsert_fault(&mut faults, w);
                                }
                                run_event::Event::Final(f) => {
                                    if !f.error.is_empty() {
                                        agents[i].errors.push(f.error.clone());
                                    }
                                    for fe in &f.faults {
                                        let w = fault_window(&agents[i], start_ns, fe);
                                        upsert_fault(&mut faults, w);
                                    }
                                    for v in f.volumes {
                                        if !v.error.is_empty() {
                                            agents[i].errors.push(format!("volume {}: {}", v.volume, v.error));
                                        }
                                        finals.push((agents[i].conn.name.clone(), v));
                                    }
                                    if !finished[i] {
                                        finished[i] = true;
                                        pending -= 1;
                                    }
                                }
                            }
                        }
                        Ev::Event(_, RunEvent { event: None, .. }) => {}
                        Ev::Detached(i, why) => {
                            let at_ms = phase_t0.elapsed().as_millis() as u64;
                            observer.message(&format!(
                                "agent {} disconnected at t={:.1}s ({why}); re-attaching for up to {:.0}s (the agent keeps running for its grace period)",
                                agents[i].conn.name, at_ms as f64 / 1000.0,
                                reattach_window(agents[i].conn.hello.grace_ms).as_secs_f64()
                            ));
                            agents[i].disconnections.push(Disconnection { at_ms, reattached_ms: None, reason: why });
                        }
                        Ev::Reattached(i) => {
                            let at_ms = phase_t0.elapsed().as_millis() as u64;
                            agents[i].last_heard = Instant::now();
                            agents[i].stalled_warned = false;
                            let name = agents[i].conn.name.clone();
                            if let Some(d) = agents[i].disconnections.last_mut() {
                                d.reattached_ms = Some(at_ms);
                                observer.message(&format!(
                                    "agent {name} re-attached at t={:.1}s, {:.1}s after it was lost; it replays what it kept",
                                    at_ms as f64 / 1000.0,
                                    at_ms.saturating_sub(d.at_ms) as f64 / 1000.0
                                ));
                            }
                        }
                        Ev::Ended(i, why) => {
                            if !finished[i] {
                                finished[i] = true;
                                pending -= 1;
                                // Lost from when its stream first broke, not from when we gave up.
                                let at_ms = agents[i]
                                    .disconnections
                                    .last()
                                    .filter(|d| d.reattached_ms.is_none())
                                    .map_or_else(|| phase_t0.elapsed().as_millis() as u64, |d| d.at_ms);
                                let reason = why.unwrap_or_else(|| "stream ended without a final result".into());
                                observer.message(&format!("agent {} lost at t={:.1}s: {reason}", agents[i].conn.name, at_ms as f64 / 1000.0));
                                merger.mark_lost(&agents[i].conn.name, at_ms);
                                agents[i].state = AgentState::Lost { at_ms, reason };
                            }
                        }
                    }
                }
                _ = tick.tick() => {
                    observer.tick(&merger, phase_t0.elapsed());
                    let silent_after = spec.interval * 3 + Duration::from_secs(2);
                    for &i in &prepared {
                        let a = &mut agents[i];
                        let detached = a.disconnections.last().is_some_and(|d| d.reattached_ms.is_none());
                        if !finished[i] && !detached && !a.stalled_warned && Instant::now() > phase_t0 && a.last_heard.elapsed() > silent_after {
                            a.stalled_warned = true;
                            let msg = format!("agent {} stalled: nothing for {:.1}s", a.conn.name, a.last_heard.elapsed().as_secs_f64());
                            a.errors.push(msg.clone());
                            observer.message(&msg);
                        }
                    }
                }
                _ = tokio::time::sleep_until(tokio::time::Instant::from_std(abort_deadline.unwrap_or_else(Instant::now))), if abort_deadline.is_some() => {
                    let reason = format!(
                        "no final result within {:.0} s of the abort: its figures end with its last interval",
                        ABORT_WAIT.as_secs_f64()
                    );
                    for &i in &prepared {
                        if !finished[i] {
                            let at_ms = phase_t0.elapsed().as_millis() as u64;
                            observer.message(&format!("agent {}: {reason}", agents[i].conn.name));
                            merger.mark_lost(&agents[i].conn.name, at_ms);
                            agents[i].state = AgentState::Lost { at_ms, reason: reason.clone() };
                        }
                    }
                    break;
                }
                r = stop.wait_for(|s| s.is_some()), if !aborted => {
                    let why = r.ok().and_then(|s| *s).map_or("a stop request", |s| s.describe());
                    aborted = true;
                    status_reason = format!("stopped by {why}");
                    observer.message("stopping: telling every agent to abort (partial results are kept)");
                    // Counted from the stop, not from the answers: a loaded agent is slow to answer.
                    abort_deadline = Some(Instant::now() + ABORT_WAIT);
                    abort_all(&agents, &prepared, &run_id, "stopped by the user").await;
                }
            }
        }
        // Measured time: the measured phases, cut short where the run was stopped.
        let ran_ms = phase_t0.elapsed().as_millis() as u64;
        measured_ms = spec
            .phases
            .iter()
            .filter(|p| p.measure)
            .map(|p| {
                let (s, e) = (
                    p.start.as_millis() as u64,
                    (p.start + p.duration).as_millis() as u64,
                );
                e.min(if aborted { ran_ms } else { e }).saturating_sub(s)
            })
            .sum();
        measured_start_skew = clock::skew_ns(&starts);
        for p in &spec.phases {
            phases.push(PhaseResult {
                name: p.name.clone(),
                measured: p.measure,
                start_unix_ms: (start_ns / 1_000_000) + p.start.as_millis() as i64,
                duration_ms: p.duration.as_millis() as u64,
                start_skew_ns: measured_start_skew,
            });
        }
        observer.phase_finished(&phase.name);
    }

    let seconds = (measured_ms as f64 / 1000.0).max(1e-3);
    let finished = merger.finish(seconds).map_err(|e| RunError::Io {
        what: "merged results".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let mut timeline = merger.timeline();
    timeline.faults = faults.clone();
    let any_lost = agents
        .iter()
        .any(|a| !matches!(a.state, AgentState::Finished));
    let status = if aborted {
        RunStatus::Aborted
    } else if any_lost {
        status_reason = "some agents were lost; their results stop when they were".into();
        RunStatus::Partial
    } else {
        RunStatus::Completed
    };
    let mut warnings = Vec::new();
    for v in &finished.volumes {
        // Little's law: a closed-loop volume whose queue stays well below its configured depth
        // is held back by the load generator, not the storage.
        if v.configured_depth > 0
            && v.outstanding_mean > 0.0
            && v.outstanding_mean < 0.7 * v.configured_depth as f64
        {
            warnings.push(format!(
                "{}/{}: {:.1} IOs in flight on average against a configured depth of {}: the load generator, not the volume, limited this volume (Little's law)",
                v.node, v.volume, v.outstanding_mean, v.configured_depth
            ));
        }
    }
    let results = RunResults {
        lockstep_version: env!("CARGO_PKG_VERSION").into(),
        run_id: spec.run_id.clone(),
        plan: spec.plan_name.clone(),
        status,
        status_reason,
        start_unix_ms: phases
            .iter()
            .find(|p| p.measured)
            .map_or(run_start_ns / 1_000_000, |p| p.start_unix_ms),
        duration_ms: measured_ms,
        interval_ms,
        phases,
        agents: agents
            .iter()
            .map(|a| AgentResult {
                name: a.conn.name.clone(),
                address: a.conn.address.clone(),
                hostname: a.conn.hello.hostname.clone(),
                version: a.conn.hello.agent_version.clone(),
                clock: a.clock,
                start_lateness_ns: a.start_lateness_ns,
                state: a.state.clone(),
                errors: a.errors.clone(),
                disconnections: a.disconnections.clone(),
            })
            .collect(),
        start_skew_ns: measured_start_skew,
        cluster: finished.cluster,
        nodes: finished.nodes,
        volumes: finished.volumes,
        cluster_timeline: finished.cluster_timeline,
        timeline,
        objectives: Vec::new(),
        chokepoint: None,
        faults,
        warnings,
        drill: None,
        stuck_ios: Vec::new(),
        verify: Vec::new(),
        series: None,
    };
    Ok(RunOutput { results, finals })
}

/// Prepares every agent of `live` (checks its work and lays out its files): the agents that
/// prepared, and the first refusal.
async fn prepare_all(
    agents: &[AgentRun],
    live: &[usize],
    spec: &RunSpec,
    interval_ms: u64,
    duration: Duration,
) -> (Vec<usize>, Option<RunError>) {
    let mut prepared = Vec::new();
    let mut refusal = None;
    let calls = live.iter().map(|&i| {
        let mut client = agents[i].conn.client.clone();
        let work = &spec.agents[i];
        let req = PrepareRequest {
            protocol_version: PROTOCOL_VERSION,
            run_id: spec.run_id.clone(),
            work: work
                .volumes
                .iter()
                .map(|v| {
                    let mut overrides: std::collections::HashMap<String, String> =
                        v.overrides.clone().into_iter().collect();
                    overrides.insert("runtime".into(), format!("{}ms", duration.as_millis()));
                    overrides.insert("time_based".into(), "1".into());
                    WireVolumeWork {
                        volume: v.volume.clone(),
                        role: v.role.clone(),
                        jobfile: v.jobfile.clone(),
                        overrides,
                        faults_json: v.faults_json.clone(),
                    }
                })
                .collect(),
            interval_ms,
            keep_files: spec.keep_files,
        };
        async move { (i, client.prepare(req).await) }
    });
    for (i, r) in futures_join(calls).await {
        match r {
            Ok(reply) if reply.get_ref().error.is_empty() => prepared.push(i),
            Ok(reply) => {
                refusal.get_or_insert(RunError::Prepare {
                    agent: agents[i].conn.name.clone(),
                    message: reply.into_inner().error,
                });
            }
            Err(s) => {
                refusal.get_or_insert(RunError::Prepare {
                    agent: agents[i].conn.name.clone(),
                    message: agents[i].conn.err(s).to_string(),
                });
            }
        }
    }
    (prepared, refusal)
}

/// Reads an agent's event stream to the end; when it breaks before the final result, tries to
/// re-attach (the agent keeps its events while nobody listens) until `window` has passed or the
/// agent says it no longer has the run.
async fn follow_agent(
    i: usize,
    mut stream: tonic::Streaming<RunEvent>,
    mut client: client::Client,
    run_id: String,
    window: Duration,
    tx: mpsc::Sender<Ev>,
) {
    // The last event's sequence number: a re-attach asks for what came after it.
    let mut last_seq = 0u64;
    loop {
        let mut got_final = false;
        let broke = loop {
            match stream.next().await {
                Some(Ok(ev)) => {
                    if ev.seq != 0 {
                        if ev.seq <= last_seq {
                            continue;
                        }
                        last_seq = ev.seq;
                    }
                    got_final |= matches!(ev.event, Some(run_event::Event::Final(_)));
                    if tx.send(Ev::Event(i, ev)).await.is_err() {
                        return;
                    }
                }
                Some(Err(s)) => break format!("{}: {}", code_name(s.code()), s.message()),
                None => break "stream ended without a final result".to_string(),
            }
        };
        if got_final {
            let _ = tx.send(Ev::Ended(i, None)).await;
            return;
        }
        if tx.send(Ev::Detached(i, broke.clone())).await.is_err() {
            return;
        }
        let deadline = Instant::now() + window;
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let req = AttachRequest {
                protocol_version: PROTOCOL_VERSION,
                run_id: run_id.clone(),
                after_seq: last_seq,
            };
            let last = match tokio::time::timeout(Duration::from_secs(3), client.attach(req)).await
            {
                Ok(Ok(s)) => {
                    stream = s.into_inner();
                    if tx.send(Ev::Reattached(i)).await.is_err() {
                        return;
                    }
                    break;
                }
                Ok(Err(s)) if s.code() == tonic::Code::NotFound => {
                    let why = format!(
                        "{broke}; then the agent no longer had the run (restarted?): {}",
                        s.message()
                    );
                    let _ = tx.send(Ev::Ended(i, Some(why))).await;
                    return;
                }
                Ok(Err(s)) => format!("{}: {}", code_name(s.code()), s.message()),
                Err(_) => "no answer within 3 s".into(),
            };
            if Instant::now() > deadline {
                let why = format!(
                    "{broke}; re-attaching failed for {:.0}s (last: {last})",
                    window.as_secs_f64()
                );
                let _ = tx.send(Ev::Ended(i, Some(why))).await;
                return;
            }
        }
    }
}

/// A fault event in the coordinator's clock, ms since the synchronized start.
fn fault_window(a: &AgentRun, start_ns: i64, fe: &lockstep_proto::v1::FaultEvent) -> FaultWindow {
    let to_ms = |ns: i64| ((a.clock.to_coordinator(ns) - start_ns).max(0) / 1_000_000) as u64;
    FaultWindow {
        node: a.conn.name.clone(),
        volume: fe.volume.clone(),
        fault: fe.fault.clone(),
        start_ms: to_ms(fe.start_agent_ns),
        end_ms: (fe.end_agent_ns != 0).then(|| to_ms(fe.end_agent_ns)),
        detail: (!fe.detail.is_empty()).then(|| fe.detail.clone()),
    }
}

/// Adds a fault window, or completes the one already known (an agent-wide fault is sent when it
/// begins and again when it ends, then once more in the final result).
fn upsert_fault(faults: &mut Vec<FaultWindow>, w: FaultWindow) {
    match faults.iter_mut().find(|f| {
        f.node == w.node && f.volume == w.volume && f.fault == w.fault && f.start_ms == w.start_ms
    }) {
        Some(f) => {
            if w.end_ms.is_some() {
                f.end_ms = w.end_ms;
            }
            if w.detail.is_some() {
                f.detail = w.detail;
            }
        }
        None => faults.push(w),
    }
}

fn code_name(c: tonic::Code) -> &'static str {
    match c {
        tonic::Code::Unavailable => "connection lost",
        tonic::Code::Cancelled => "cancelled",
        tonic::Code::DeadlineExceeded => "timed out",
        tonic::Code::Unknown => "stream broken",
        _ => "error",
    }
}

fn write_hlog(
    h: &mut crate::results::hlog::RunLog,
    node: &str,
    index: u64,
    interval_ms: u64,
    v: &lockstep_proto::v1::VolumeInterval,
) -> std::io::Result<()> {
    let start_s = (index * interval_ms) as f64 / 1000.0;
    let len_s = interval_ms as f64 / 1000.0;
    for (name, d) in [("read", &v.read), ("write", &v.write)] {
        let Some(d) = d else { continue };
        for (kind, bytes) in [("lat", &d.lat_hist), ("lat_intended", &d.lat_intended_hist)] {
            if bytes.is_empty() {
                continue;
            }
            let max = lockstep_proto::histogram::SparseHistogram::decode(bytes)
                .map(|s| s.max())
                .unwrap_or(0);
            h.write(
                &format!("{node}/{}/{name}/{kind}", v.volume),
                start_s,
                len_s,
                max,
                bytes,
            )?;
        }
    }
    Ok(())
}

async fn abort_all(agents: &[AgentRun], which: &[usize], run_id: &str, reason: &str) {
    let calls = which.iter().map(|&i| {
        let mut c = agents[i].conn.client.clone();
        let req = AbortRequest {
            protocol_version: PROTOCOL_VERSION,
            run_id: run_id.into(),
            reason: reason.into(),
        };
        async move {
            let _ = tokio::time::timeout(Duration::from_secs(3), c.abort(req)).await;
        }
    });
    futures_join(calls).await;
}

/// Runs futures concurrently and returns their outputs in order (a tiny join_all on tokio).
pub async fn futures_join<F, T>(futs: impl IntoIterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let handles: Vec<_> = futs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("task panicked"));
    }
    out
}
