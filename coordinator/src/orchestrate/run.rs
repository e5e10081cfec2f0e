//! Running a plan on agents: connect, measure clocks, prepare, start every agent at the same
//! instant, collect and merge interval reports, and survive agents that die.
//!
//! Phases are separated by a barrier: every agent finishes (or is lost in) a phase before any
//! starts the next. A run can always be stopped (`stop` resolves): every agent is told to abort
//! and the results so far are still returned.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lockstep_proto::PROTOCOL_VERSION;
use lockstep_proto::histogram::check_echoed_digits;
use lockstep_proto::v1::{
    AbortRequest, AttachRequest, PrepareRequest, RunEvent, StartRequest,
    VolumeWork as WireVolumeWork, run_event,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;

use super::lag::LagMeter;
use super::streams::{AgentTrack, Ev, Streams, reattach_window};
use crate::orchestrate::client::{self, Connected};
use crate::results::DataFiles;
use crate::results::keeper::Keep;
use crate::results::merge::{Merger, PlannedVolume};
use crate::results::store::{Manifest, StoreReader, StoreWriter, StoredVolume};
use crate::results::timeline::VolumeModel;
use crate::results::{AgentResult, AgentState, RunResults, RunStatus};

/// The work of one volume.
#[derive(Debug, Clone)]
pub struct VolumeWork {
    pub volume: String,
    pub role: String,
    /// fio job-file text; the agent confines its targets to the volume.
    pub jobfile: String,
    /// Options set on every job (like `--set`).
    pub overrides: BTreeMap<String, String>,
    /// Typed faults (core/src/fault/wire.rs) with `at_ms`/`duration_ms` relative to the phase
    /// start.
    pub faults: Vec<lockstep_proto::v1::Fault>,
    pub model: Option<VolumeModel>,
    pub target_iops: Option<f64>,
    /// Where this volume's writes are mirrored (a role's `mirror`), with the backup's address.
    pub mirror: Option<lockstep_proto::v1::MirrorTarget>,
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
    /// Significant digits of the interval histograms agents send (2 or 3): every agent must
    /// echo it in its Prepare reply, so histograms of two precisions never meet in the merge.
    pub histogram_digits: u8,
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
    /// About once a second while agents lay out files, and once more (`finished`) when every
    /// layout is done; only when there are bytes to write.
    fn layout_progress(&mut self, _progress: &super::layout::LayoutProgress) {}
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

type StopRx = watch::Receiver<Option<crate::orchestrate::signals::Stop>>;

fn stop_reason(
    r: Result<watch::Ref<'_, Option<crate::orchestrate::signals::Stop>>, watch::error::RecvError>,
) -> &'static str {
    r.ok()
        .and_then(|s| *s)
        .map_or("a stop request", |s| s.describe())
}

/// Runs `spec`: connect and handshake with every agent (a refusal stops the run before any IO),
/// prepare everywhere, start at one instant, then follow the streams to the end or a stop.
pub async fn execute(
    spec: RunSpec,
    observer: &mut dyn RunObserver,
    mut stop: StopRx,
    data_dir: Option<&Path>,
) -> Result<RunResults, RunError> {
    let run_start_ns = client::unix_ns();
    let began = Instant::now();
    let (conns, tracks, connecting) = connect_all(&spec, observer).await?;
    let worst_rtt = tracks.iter().map(|t| t.clock.rtt_ns).max().unwrap_or(0);
    let infos: Vec<PlannedVolume> = spec
        .agents
        .iter()
        .flat_map(|a| {
            a.volumes.iter().map(|v| PlannedVolume {
                node: a.name.clone(),
                volume: v.volume.clone(),
                role: v.role.clone(),
                model: v.model.clone(),
                target_iops: v.target_iops,
            })
        })
        .collect();
    let total = spec
        .phases
        .iter()
        .map(|p| p.start + p.duration)
        .max()
        .unwrap_or_default();
    let interval_ms = spec.interval.as_millis().max(1) as u64;
    // A results disk that is full or failing does not stop the run: its measurements still
    // reach the report (on stdout), the timeline stays in memory, and the error is named at
    // the end.
    let mut store_error = None;
    let store = data_dir.and_then(|dir| {
        StoreWriter::create(dir, &manifest(interval_ms, &infos))
            .inspect_err(|e| store_error = Some(format!("{}: {e}", dir.display())))
            .ok()
    });
    let planned = (total.as_millis() as u64).div_ceil(interval_ms);
    let mut streams = Streams {
        tracks,
        merger: {
            let m = Merger::new(interval_ms, &infos).planned_intervals(planned);
            if store.is_some() {
                m.points_on_disk()
            } else {
                m
            }
        },
        finals: Vec::new(),
        faults: Vec::new(),
        starts: Vec::new(),
        pending: 0,
        prepared: Vec::new(),
        start_ns: 0,
        phase_t0: Instant::now(),
        interval: spec.interval,
        phases: &spec.phases,
        store: store.as_ref(),
        aborted: false,
        status_reason: String::new(),
        abort_deadline: None,
    };
    let prepared = prepare_or_stop(&conns, &spec, total, &mut stop, &mut streams, observer).await?;
    // One start instant for everyone, far enough ahead for the Start calls to arrive.
    let lead = start_lead(prepared.len(), worst_rtt, connecting);
    streams.start_ns = client::unix_ns() + lead.as_nanos() as i64;
    streams.phase_t0 = Instant::now() + lead;
    let (tx, rx) = mpsc::channel::<Ev>(4096);
    let heard = Heard::new(conns.len());
    start_all(&conns, &streams, &prepared, &spec.run_id, tx, &heard).await?;
    streams.pending = prepared.len();
    streams.prepared = prepared;
    observer.phase_started("run", total, true);
    follow(
        &conns,
        &spec,
        &mut streams,
        rx,
        &mut stop,
        observer,
        (began, &heard),
    )
    .await?;
    observer.phase_finished("run");
    let keep = streams.merger.keep();
    let mut results = into_output(&spec, &conns, streams, run_start_ns)?;
    if let (Some(store), Some(dir)) = (store, data_dir) {
        results.data = Some(finish_store(store, dir, keep.fold, &results));
        if let Some(d) = &mut results.data {
            d.histogram_digits = spec.histogram_digits;
        }
        read_back_timeline(dir, &keep, &mut results);
    }
    if let Some(error) = store_error {
        results.data = Some(DataFiles {
            error: Some(error),
            histogram_digits: spec.histogram_digits,
            ..Default::default()
        });
    }
    Ok(results)
}

/// The run's timeline from its data files (the merger kept only the recent points).
fn read_back_timeline(dir: &Path, keep: &Keep, results: &mut RunResults) {
    let Some(run_dir) = dir.parent() else { return };
    let faults = std::mem::take(&mut results.timeline.faults);
    let meta = std::mem::take(&mut results.timeline);
    match StoreReader::open(run_dir).and_then(|r| r.timeline(keep, meta)) {
        Ok(t) => results.timeline = t,
        Err(e) => {
            let d = results.data.get_or_insert_with(Default::default);
            d.error
                .get_or_insert(format!("reading the timeline back: {e}"));
        }
    }
    results.timeline.faults = faults;
}

/// The data files' manifest: the run's volumes in the merger's order (their ids).
fn manifest(interval_ms: u64, infos: &[PlannedVolume]) -> Manifest {
    Manifest::new(
        interval_ms,
        infos
            .iter()
            .map(|v| StoredVolume {
                node: v.node.clone(),
                volume: v.volume.clone(),
                role: v.role.clone(),
            })
            .collect(),
    )
}

/// Writes what is queued, then the manifest with the start instant, and says what is there.
fn finish_store(store: StoreWriter, dir: &Path, fold: u64, r: &RunResults) -> DataFiles {
    let stats = store.finish();
    let mut error = stats.error;
    let manifest_path = dir.join(crate::results::store::MANIFEST);
    let rewritten = std::fs::read(&manifest_path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Manifest>(&b).ok())
        .map(|mut m| {
            m.start_unix_ms = r.start_unix_ms;
            serde_json::to_vec_pretty(&m)
                .map_err(std::io::Error::other)
                .and_then(|json| {
                    lockstep_core::atomic_file::write_atomically(&manifest_path, &json)
                })
        });
    if let Some(Err(e)) = rewritten {
        error.get_or_insert(format!("{}: {e}", manifest_path.display()));
    }
    DataFiles {
        dir: crate::results::store::DATA_DIR.into(),
        timeline_fold: fold,
        histogram_digits: lockstep_proto::histogram::RECORDED_DIGITS,
        blocks: stats.blocks,
        histogram_bytes: stats.raw_bytes,
        stored_bytes: stats.stored_bytes,
        error,
    }
}

/// Calls to agents in flight at once. Every call is a task of its own; without a bound,
/// 10,000 agents are 10,000 simultaneous connection set-ups (SYN backlogs overflow, connects
/// time out) and a pile of half-served calls that all finish late. 256 keeps a LAN's pipe
/// full: a call takes about a round trip, so this is 256 calls per round trip.
pub const FAN_OUT: usize = 256;

/// Clock probes in flight at once: a probe's round trip bounds its offset's error, and every
/// probe in flight on this machine's few cores adds to the others' round trips.
const CLOCK_FAN_OUT: usize = 32;

/// Connects to every agent (at most `FAN_OUT` at once), refuses a busy one, and measures each
/// clock. Also returns how long connecting took (the start lead's yardstick).
async fn connect_all(
    spec: &RunSpec,
    observer: &mut dyn RunObserver,
) -> Result<(Vec<Connected>, Vec<AgentTrack>, Duration), RunError> {
    observer.message(&format!("connecting to {} agents", spec.agents.len()));
    let t = Instant::now();
    let conns = fan_out(
        FAN_OUT,
        spec.agents.iter().map(|a| {
            let token = spec.token.clone();
            let (name, address) = (a.name.clone(), a.address.clone());
            let keepalive = client::keepalive_for(spec.interval);
            async move { client::connect(&name, &address, token.as_deref(), keepalive).await }
        }),
    )
    .await;
    let connecting = t.elapsed();
    let mut out = Vec::with_capacity(conns.len());
    for c in conns {
        let conn = c?;
        if !conn.hello.busy_with_run.is_empty() {
            return Err(RunError::Prepare {
                agent: conn.name.clone(),
                message: format!("busy with run {}", conn.hello.busy_with_run),
            });
        }
        out.push(conn);
    }
    let probed = fan_out(
        CLOCK_FAN_OUT,
        out.into_iter().map(|mut conn| async move {
            let clock = conn.probe_clock(16).await;
            (conn, clock)
        }),
    )
    .await;
    let mut out = Vec::with_capacity(probed.len());
    let mut tracks = Vec::with_capacity(probed.len());
    for (conn, clock) in probed {
        tracks.push(AgentTrack::new(
            conn.name.clone(),
            clock?,
            conn.hello.grace_ms,
        ));
        out.push(conn);
    }
    observer.message(&clocks_message(&tracks));
    Ok((out, tracks, connecting))
}

/// The clocks line of the live view: every offset for a few agents, the range for many (a line
/// of 10,000 offsets helps nobody; `results.json` has them all).
fn clocks_message(tracks: &[AgentTrack]) -> String {
    let worst_rtt = tracks.iter().map(|t| t.clock.rtt_ns).max().unwrap_or(0);
    let ms = |ns: i64| ns as f64 / 1e6;
    let offsets = if tracks.len() <= 20 {
        tracks
            .iter()
            .map(|t| format!("{}={:+.3}ms", t.name, ms(t.clock.offset_ns)))
            .collect::<Vec<_>>()
            .join(" ")
    } else {
        let lo = tracks.iter().min_by_key(|t| t.clock.offset_ns);
        let hi = tracks.iter().max_by_key(|t| t.clock.offset_ns);
        match (lo, hi) {
            (Some(lo), Some(hi)) => format!(
                "from {:+.3}ms ({}) to {:+.3}ms ({})",
                ms(lo.clock.offset_ns),
                lo.name,
                ms(hi.clock.offset_ns),
                hi.name
            ),
            _ => String::new(),
        }
    };
    format!(
        "clocks: {} agents, offsets {offsets}, worst round trip {:.3} ms",
        tracks.len(),
        ms(worst_rtt)
    )
}

/// Prepares everywhere (lays out files); any refusal aborts the others. A stop during the
/// layout (which can take minutes) aborts it on every agent: each stops between chunks, removes
/// what it laid out and answers; nothing is started then.
async fn prepare_or_stop(
    conns: &[Connected],
    spec: &RunSpec,
    total: Duration,
    stop: &mut StopRx,
    streams: &mut Streams<'_>,
    observer: &mut dyn RunObserver,
) -> Result<Vec<usize>, RunError> {
    let live: Vec<usize> = (0..conns.len()).collect();
    observer.message(&format!(
        "preparing {} agents (laying out files)",
        live.len()
    ));
    let interval_ms = spec.interval.as_millis().max(1) as u64;
    let layout = prepare_all(conns, &live, spec, interval_ms, total);
    tokio::pin!(layout);
    let watched = live
        .iter()
        .map(|&i| (conns[i].name.clone(), conns[i].client.clone()))
        .collect();
    let began = Instant::now();
    let mut progress = super::layout::watch(watched, spec.run_id.clone());
    let mut last = super::layout::LayoutProgress::default();
    let (prepared, refusal) = loop {
        tokio::select! {
            biased;
            r = stop.wait_for(|s| s.is_some()) => {
                let why = stop_reason(r);
                streams.aborted = true;
                streams.status_reason = format!("stopped by {why} during the layout");
                observer.message("stopping during the layout: telling every agent to abort (nothing ran)");
                abort_all(conns, &live, &spec.run_id, "stopped by the user").await;
                let _ = tokio::time::timeout(Duration::from_secs(3), &mut layout).await;
                break (Vec::new(), None);
            }
            r = &mut layout => break r,
            Some(p) = progress.recv() => {
                if p.total > 0 {
                    observer.layout_progress(&p);
                }
                last = p;
            }
        }
    };
    // Dropping the receiver ends the watch.
    drop(progress);
    if refusal.is_none() && prepared.len() == live.len() && last.total > 0 {
        // Every Prepare answered "ready": every layout wrote all it had to.
        observer.layout_progress(&super::layout::LayoutProgress {
            done: last.total,
            slowest: None,
            finished: true,
            elapsed: began.elapsed(),
            ..last
        });
    }
    if let Some(e) = refusal {
        abort_all(
            conns,
            &prepared,
            &spec.run_id,
            "another agent refused the work",
        )
        .await;
        return Err(e);
    }
    Ok(prepared)
}

/// Sends Start to every prepared agent (at most `FAN_OUT` at once) and follows each stream on a
/// task of its own. If an agent refuses, the ones already started are aborted.
async fn start_all(
    conns: &[Connected],
    streams: &Streams<'_>,
    prepared: &[usize],
    run_id: &str,
    tx: mpsc::Sender<Ev>,
    heard: &Arc<Heard>,
) -> Result<(), RunError> {
    let calls = prepared.iter().map(|&i| {
        let mut client = conns[i].client.clone();
        let req = StartRequest {
            protocol_version: PROTOCOL_VERSION,
            run_id: run_id.to_string(),
            start_at_agent_ns: streams.tracks[i].clock.to_agent(streams.start_ns),
        };
        async move {
            let r = client.start(req).await;
            (i, client, r)
        }
    });
    let mut started = Vec::new();
    let mut refusal = None;
    for (i, client, r) in fan_out(FAN_OUT, calls).await {
        match r {
            Ok(stream) => {
                let window = reattach_window(conns[i].hello.grace_ms);
                tokio::spawn(follow_agent(
                    i,
                    stream.into_inner(),
                    client,
                    run_id.to_string(),
                    window,
                    tx.clone(),
                    heard.clone(),
                ));
                started.push(i);
            }
            Err(s) => {
                refusal.get_or_insert(RunError::Start {
                    agent: conns[i].name.clone(),
                    message: conns[i].err(s).to_string(),
                });
            }
        }
    }
    if let Some(e) = refusal {
        abort_all(conns, &started, run_id, "another agent could not start").await;
        return Err(e);
    }
    Ok(())
}

/// How far ahead the start instant is set: far enough for every Start call to arrive. The
/// calls go out `FAN_OUT` at a time, so sending them all takes longer the more agents there
/// are and the busier the agents' hosts: at least `START_LEAD_PER_AGENT` each, and at least
/// as long as connecting to them all took (`connecting`: a connection set-up and a call each,
/// at the same fan-out, so no less work than the Start calls). With 10,000 simulated agents
/// on 2 cores, a lead of 250 us per agent (2.8 s) left the last agents starting 6.2 s late
/// (docs/scale.md). On top: the base lead and the slowest round trips. `LOCKSTEP_LEAD_MS`
/// replaces the base.
fn start_lead(agents: usize, worst_rtt_ns: i64, connecting: Duration) -> Duration {
    let base = Duration::from_millis(
        std::env::var("LOCKSTEP_LEAD_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(300),
    );
    base + (START_LEAD_PER_AGENT * agents as u32).max(connecting)
        + Duration::from_nanos(worst_rtt_ns.max(0) as u64 * 4)
}

const START_LEAD_PER_AGENT: Duration = Duration::from_micros(250);

/// The run loop: every event goes to its method on `Streams`; a stop aborts every agent and
/// waits at most `ABORT_WAIT` for their final results.
///
/// Merging is CPU work on the loop's thread: it runs "in place" (`off_the_io_threads`), so the
/// runtime moves the socket tasks to other threads meanwhile. On the runtime's own threads, a
/// loop busy merging for a second at a time (8,000 volumes) left the streams' tasks unpolled:
/// keepalive pings went unanswered and agents dropped the connections as dead.
async fn follow(
    conns: &[Connected],
    spec: &RunSpec,
    streams: &mut Streams<'_>,
    mut rx: mpsc::Receiver<Ev>,
    stop: &mut StopRx,
    observer: &mut dyn RunObserver,
    (began, heard): (Instant, &Heard),
) -> Result<(), RunError> {
    let mut tick = tokio::time::interval(spec.interval.min(Duration::from_secs(1)));
    let mut lag = LagReport::new(streams.interval, began);
    while streams.pending > 0 {
        let deadline = streams.abort_deadline.unwrap_or_else(Instant::now);
        let ev = tokio::select! {
            ev = rx.recv() => match ev {
                Some(ev) => ev,
                None => break,
            },
            _ = tick.tick() => {
                heard.refresh(&mut streams.tracks);
                off_the_io_threads(|| streams.on_tick(observer));
                continue;
            }
            _ = tokio::time::sleep_until(deadline.into()), if streams.abort_deadline.is_some() => {
                streams.on_abort_deadline(observer);
                break;
            }
            r = stop.wait_for(|s| s.is_some()), if !streams.aborted => {
                streams.on_stop(stop_reason(r), observer);
                abort_all(conns, &streams.prepared, &spec.run_id, "stopped by the user").await;
                continue;
            }
        };
        off_the_io_threads(|| -> Result<(), RunError> {
            lag.observe(&ev, streams, observer);
            streams.on_event(ev, observer)?;
            // What else is queued, in the same hand-off (each costs a thread switch), for a
            // bounded time so ticks and stops are still seen.
            let t = Instant::now();
            while t.elapsed() < BATCH_TIME {
                let Ok(ev) = rx.try_recv() else { break };
                lag.observe(&ev, streams, observer);
                streams.on_event(ev, observer)?;
            }
            Ok(())
        })?;
    }
    lag.finish(observer);
    Ok(())
}

/// How long the run loop handles queued events in one go before it looks at ticks and stops.
const BATCH_TIME: Duration = Duration::from_millis(50);

/// Runs CPU work of the run loop with the runtime's other tasks moved off this thread
/// (`block_in_place`), on a multi-threaded runtime; on a single-threaded one (the coordinator
/// service's helpers), in place as it is.
fn off_the_io_threads<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// When each agent's stream last delivered anything, as its task saw it. The run loop's own
/// record (`AgentTrack::last_heard`) is when it handled the event: when merging falls behind,
/// every agent would look stalled though all are streaming.
pub struct Heard {
    base: Instant,
    /// Milliseconds since `base`, per agent; 0: nothing yet.
    ms: Vec<AtomicU64>,
}

impl Heard {
    fn new(agents: usize) -> Arc<Self> {
        Arc::new(Heard {
            base: Instant::now(),
            ms: (0..agents).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    fn mark(&self, i: usize) {
        let ms = self.base.elapsed().as_millis().max(1) as u64;
        self.ms[i].store(ms, Ordering::Relaxed);
    }

    /// Moves each track's `last_heard` up to what its stream's task saw.
    fn refresh(&self, tracks: &mut [AgentTrack]) {
        for (t, ms) in tracks.iter_mut().zip(&self.ms) {
            let ms = ms.load(Ordering::Relaxed);
            if ms > 0 {
                t.last_heard = t.last_heard.max(self.base + Duration::from_millis(ms));
            }
        }
    }
}

/// The interval lag as the run loop sees it (`lag::LagMeter`), told to the live view: a line
/// when the coordinator falls behind (at most one per `BEHIND_EVERY` intervals) and a summary
/// at the end, with how long after connecting began the first interval was complete.
struct LagReport {
    meter: LagMeter,
    interval_ms: u64,
    began: Instant,
    first_complete: Option<Duration>,
    last_said: Option<u64>,
    /// Agents lost so far (their streams ended without a final result).
    lost: usize,
}

const BEHIND_EVERY: u64 = 10;

impl LagReport {
    fn new(interval: Duration, began: Instant) -> Self {
        let interval_ms = interval.as_millis().max(1) as u64;
        LagReport {
            meter: LagMeter::new(interval_ms),
            interval_ms,
            began,
            first_complete: None,
            last_said: None,
            lost: 0,
        }
    }

    fn observe(&mut self, ev: &Ev, streams: &Streams<'_>, observer: &mut dyn RunObserver) {
        if let Ev::Ended(_, Some(_)) = ev {
            self.lost += 1;
        }
        let Ev::Event(
            _,
            RunEvent {
                event: Some(run_event::Event::Interval(iv)),
                ..
            },
        ) = ev
        else {
            return;
        };
        let at_ms = Instant::now()
            .saturating_duration_since(streams.phase_t0)
            .as_millis() as u64;
        // Every agent started and not lost sends every interval (one that already sent its
        // final result sent them all before it: `pending` would undercount).
        let expected = streams.prepared.len().saturating_sub(self.lost);
        for c in self.meter.arrived(iv.index, at_ms, expected) {
            self.first_complete
                .get_or_insert_with(|| self.began.elapsed());
            let quiet = self.last_said.is_some_and(|i| c.index < i + BEHIND_EVERY);
            if c.lag_ms > self.interval_ms / 2 && !quiet {
                self.last_said = Some(c.index);
                observer.message(&format!(
                    "behind: interval {} complete {:.2} s after its end",
                    c.index,
                    c.lag_ms as f64 / 1000.0
                ));
            }
        }
    }

    fn finish(mut self, observer: &mut dyn RunObserver) {
        self.meter.finish();
        let (Some(s), Some(first)) = (self.meter.summary(), self.first_complete) else {
            return;
        };
        observer.message(&format!(
            "interval lag: median {} ms, last 10 intervals {} ms, worst {} ms (interval {}), over {} intervals; first interval complete {:.2} s after connecting began",
            s.median_ms,
            s.last_median_ms,
            s.worst.lag_ms,
            s.worst.index,
            s.intervals,
            first.as_secs_f64()
        ));
    }
}

/// The run's results from what the streams delivered.
fn into_output(
    spec: &RunSpec,
    conns: &[Connected],
    streams: Streams<'_>,
    run_start_ns: i64,
) -> Result<RunResults, RunError> {
    let measured_ms = streams.measured_ms();
    let (phases, measured_start_skew) = streams.phase_results();
    let seconds = (measured_ms as f64 / 1000.0).max(1e-3);
    let finished = streams.merger.finish(seconds).map_err(|e| RunError::Io {
        what: "merged results".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let mut timeline = streams.merger.timeline();
    timeline.faults = streams.faults.clone();
    let any_lost = streams
        .tracks
        .iter()
        .any(|t| !matches!(t.state, AgentState::Finished));
    let mut status_reason = streams.status_reason;
    let status = if streams.aborted {
        RunStatus::Aborted
    } else if any_lost {
        status_reason = "some agents were lost; their results stop when they were".into();
        RunStatus::Partial
    } else {
        RunStatus::Completed
    };
    let warnings = littles_law_warnings(&finished.volumes);
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
        interval_ms: spec.interval.as_millis().max(1) as u64,
        phases,
        agents: conns
            .iter()
            .zip(&streams.tracks)
            .map(|(c, t)| AgentResult {
                name: t.name.clone(),
                address: c.address.clone(),
                hostname: c.hello.hostname.clone(),
                version: c.hello.agent_version.clone(),
                clock: t.clock,
                start_lateness_ns: t.start_lateness_ns,
                state: t.state.clone(),
                errors: t.errors.clone(),
                disconnections: t.disconnections.clone(),
            })
            .collect(),
        start_skew_ns: measured_start_skew,
        cluster: finished.cluster,
        nodes: finished.nodes,
        volumes: finished.volumes,
        cluster_timeline: finished.cluster_timeline,
        timeline,
        finals: streams.finals,
        objectives: Vec::new(),
        chokepoint: None,
        faults: streams.faults,
        warnings,
        drill: None,
        mirror: None,
        stuck_ios: Vec::new(),
        verify: Vec::new(),
        series: None,
        data: None,
    };
    Ok(results)
}

/// Little's law: a closed-loop volume whose queue stays well below its configured depth is held
/// back by the load generator, not the storage.
fn littles_law_warnings(volumes: &[crate::results::VolumeResult]) -> Vec<String> {
    volumes
        .iter()
        .filter(|v| {
            v.configured_depth > 0
                && v.outstanding_mean > 0.0
                && v.outstanding_mean < 0.7 * v.configured_depth as f64
        })
        .map(|v| {
            format!(
                "{}/{}: {:.1} IOs in flight on average against a configured depth of {}: the load generator, not the volume, limited this volume (Little's law)",
                v.node, v.volume, v.outstanding_mean, v.configured_depth
            )
        })
        .collect()
}

/// Prepares every agent of `live` (checks its work and lays out its files): the agents that
/// prepared, and the first refusal.
async fn prepare_all(
    agents: &[Connected],
    live: &[usize],
    spec: &RunSpec,
    interval_ms: u64,
    duration: Duration,
) -> (Vec<usize>, Option<RunError>) {
    let mut prepared = Vec::new();
    let mut refusal = None;
    let calls = live.iter().map(|&i| {
        let mut client = agents[i].client.clone();
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
                        faults: v.faults.clone(),
                        mirror: v.mirror.clone(),
                    }
                })
                .collect(),
            interval_ms,
            keep_files: spec.keep_files,
            histogram_digits: u32::from(spec.histogram_digits),
        };
        async move { (i, client.prepare(req).await) }
    });
    for (i, r) in futures_join(calls).await {
        match r {
            Ok(reply) if reply.get_ref().error.is_empty() => {
                let echoed = reply.get_ref().histogram_digits;
                match check_echoed_digits(spec.histogram_digits, echoed) {
                    Ok(()) => prepared.push(i),
                    Err(message) => {
                        // Prepared, but not part of the run: it is aborted with the others.
                        prepared.push(i);
                        refusal.get_or_insert(RunError::Prepare {
                            agent: agents[i].name.clone(),
                            message,
                        });
                    }
                }
            }
            Ok(reply) => {
                refusal.get_or_insert(RunError::Prepare {
                    agent: agents[i].name.clone(),
                    message: reply.into_inner().error,
                });
            }
            Err(s) => {
                refusal.get_or_insert(RunError::Prepare {
                    agent: agents[i].name.clone(),
                    message: agents[i].err(s).to_string(),
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
    heard: Arc<Heard>,
) {
    // The last event's sequence number: a re-attach asks for what came after it.
    let mut last_seq = 0u64;
    loop {
        let mut got_final = false;
        let broke = loop {
            match stream.next().await {
                Some(Ok(ev)) => {
                    heard.mark(i);
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

fn code_name(c: tonic::Code) -> &'static str {
    match c {
        tonic::Code::Unavailable => "connection lost",
        tonic::Code::Cancelled => "cancelled",
        tonic::Code::DeadlineExceeded => "timed out",
        tonic::Code::Unknown => "stream broken",
        _ => "error",
    }
}

async fn abort_all(agents: &[Connected], which: &[usize], run_id: &str, reason: &str) {
    let calls = which.iter().map(|&i| {
        let mut c = agents[i].client.clone();
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

/// Runs futures concurrently and returns their outputs in order (a tiny join_all on tokio),
/// at most `FAN_OUT` at once.
pub async fn futures_join<F, T>(futs: impl IntoIterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    fan_out(FAN_OUT, futs).await
}

/// Runs futures as tasks, at most `limit` at once, and returns their outputs in order.
pub async fn fan_out<F, T>(limit: usize, futs: impl IntoIterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(limit.max(1)));
    let handles: Vec<_> = futs
        .into_iter()
        .map(|f| {
            let gate = gate.clone();
            tokio::spawn(async move {
                let _permit = gate
                    .acquire_owned()
                    .await
                    .expect("the gate is never closed");
                f.await
            })
        })
        .collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("task panicked"));
    }
    out
}
