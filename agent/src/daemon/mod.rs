//! The agent daemon (`lockstep-agent serve`): runs the coordinator's work on this node.
//!
//! - `volume`: the volumes this agent may test, and confining jobs to them;
//! - `aggregate`: one interval report per volume from the runner's per-clone intervals;
//! - `metrics`: Prometheus metrics (`/metrics`);
//! - `notify`: readiness and watchdog pings for systemd (`Type=notify`, `WatchdogSec=`);
//! - `tls`: mutual TLS with the operator's CA (`--tls-cert/--tls-key/--tls-ca`);
//! - `peer`: over TLS, which calls the caller's certificate may make (coordinator or mirror);
//! - `run`: the life of a started run (its volumes, agent-wide faults, watchdog, final result);
//! - this module: the gRPC service and the phases of a run (prepare → start at an instant →
//!   stream intervals → final result), with the safety rule that an agent whose coordinator is
//!   gone for longer than the grace period stops its own IO: no runaway load on a production host.

pub mod agent_faults;
pub mod aggregate;
mod batch;
pub mod metrics;
pub mod notify;
mod peer;
mod run;
pub use lockstep_core::tls;
pub mod volume;

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lockstep_proto::histogram::interval_digits;
use lockstep_proto::v1::agent_server::{Agent, AgentServer};
use lockstep_proto::v1::{
    AbortReply, AbortRequest, AttachRequest, ClockProbeReply, ClockProbeRequest, HelloReply,
    HelloRequest, LayoutStatusReply, LayoutStatusRequest, MirrorAck, MirrorWrite, PrepareReply,
    PrepareRequest, RunEvent, StartRequest, Volume, VolumeInterval,
};
use lockstep_proto::{PROTOCOL_VERSION, version_mismatch};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::fault::FaultSpec;
use crate::job::JobSpec;
use crate::jobfile;
use crate::progress::LayoutCount;
use crate::runner::{self, PreparedRun, RunOptions};
use crate::stats::DirStats;
use aggregate::{VolumeEvents, unix_ns};
use metrics::Metrics;
use run::{RunSetup, run, run_panicked};
pub use volume::VolumeConfig;

#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Unique name in the cluster (default: the hostname).
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub volumes: Vec<VolumeConfig>,
    /// Shared token every call must carry (`authorization: Bearer <token>`); None: no check.
    pub token: Option<String>,
    /// How long a run may go on with nobody listening before the agent stops its IO.
    pub grace: Duration,
    pub allow_block_devices: bool,
    pub allow_exec: bool,
}

pub use lockstep_core::host::hostname;

/// Events of one run, delivered to whoever is attached and kept, so a coordinator that
/// re-attaches (or a standby that takes over) misses nothing: each event carries a sequence
/// number and a re-attach asks for what came after the last one it got, which also recovers
/// events that were sent into a connection that turned out to be dead (a network partition
/// loses what was in flight).
pub struct EventHub {
    inner: Mutex<HubInner>,
    metrics: Arc<Metrics>,
}

struct HubInner {
    tx: Option<mpsc::Sender<Result<RunEvent, Status>>>,
    /// Holds each volume's interval until every volume closed it (one report per interval).
    batcher: batch::IntervalBatcher,
    /// The last `HISTORY_LIMIT` events, oldest first.
    history: std::collections::VecDeque<RunEvent>,
    next_seq: u64,
    /// Since when nobody has been listening (None while attached).
    detached_since: Option<Instant>,
    finished: bool,
}

/// Events kept for a re-attach: over an hour of 1 s intervals (one event per interval carries
/// every volume of the agent: daemon/batch.rs).
const HISTORY_LIMIT: usize = 4_000;

impl EventHub {
    #[cfg(test)]
    fn new(metrics: Arc<Metrics>) -> Arc<Self> {
        Self::for_volumes(metrics, 0)
    }

    /// A hub for a run of `volumes` volumes: their intervals go out together.
    fn for_volumes(metrics: Arc<Metrics>, volumes: usize) -> Arc<Self> {
        Arc::new(EventHub {
            inner: Mutex::new(HubInner {
                tx: None,
                batcher: batch::IntervalBatcher::new(volumes),
                history: std::collections::VecDeque::new(),
                next_seq: 1,
                detached_since: Some(Instant::now()),
                finished: false,
            }),
            metrics,
        })
    }

    /// A new listener: replays the events after `after_seq` (0: all that are kept), then gets
    /// live events. A listener already attached is replaced (its stream ends).
    fn attach(&self, after_seq: u64) -> ReceiverStream<Result<RunEvent, Status>> {
        let mut inner = self.inner.lock().unwrap();
        let (tx, rx) = mpsc::channel(HISTORY_LIMIT + 16);
        for ev in inner.history.iter().filter(|e| e.seq > after_seq) {
            let _ = tx.try_send(Ok(ev.clone()));
        }
        if inner.finished {
            // Everything was replayed: closing the channel ends the stream.
            inner.tx = None;
        } else {
            inner.tx = Some(tx);
            inner.detached_since = None;
        }
        ReceiverStream::new(rx)
    }

    fn publish(&self, ev: RunEvent) {
        let mut inner = self.inner.lock().unwrap();
        for ev in inner.batcher.push(ev) {
            Self::send_one(&mut inner, ev);
        }
    }

    fn send_one(inner: &mut HubInner, mut ev: RunEvent) {
        ev.seq = inner.next_seq;
        inner.next_seq += 1;
        if inner.history.len() == HISTORY_LIMIT {
            inner.history.pop_front();
        }
        inner.history.push_back(ev.clone());
        if let Some(tx) = &inner.tx {
            match tx.try_send(Ok(ev)) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    tracing::warn!(
                        "coordinator is not reading interval reports; it gets them on a re-attach"
                    );
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    inner.tx = None;
                    inner.detached_since = Some(Instant::now());
                    tracing::warn!("coordinator stream closed; keeping events for a re-attach");
                }
            }
        }
    }

    /// How long nobody has been listening.
    fn detached_for(&self) -> Option<Duration> {
        let mut inner = self.inner.lock().unwrap();
        if inner.tx.as_ref().is_some_and(|tx| tx.is_closed()) {
            inner.tx = None;
            inner.detached_since = Some(Instant::now());
        }
        inner.detached_since.map(|t| t.elapsed())
    }

    /// Breaks the stream of whoever listens (a `cut_off` fault): they get UNAVAILABLE, and
    /// events are kept for a re-attach from now on.
    fn cut(&self, reason: &str) {
        let mut inner = self.inner.lock().unwrap();
        if let Some(tx) = inner.tx.take() {
            let _ = tx.try_send(Err(Status::unavailable(reason)));
            inner.detached_since = Some(Instant::now());
        }
    }

    /// The run ended: close the stream after the last event.
    fn finish(&self) {
        let mut inner = self.inner.lock().unwrap();
        inner.finished = true;
        inner.tx = None;
    }
}

impl VolumeEvents for Arc<EventHub> {
    fn send(&self, event: RunEvent) {
        self.publish(event);
    }
    fn observe(&self, volume: &str, interval: &VolumeInterval, dirs: &[DirStats; 2]) {
        self.metrics.observe_interval(volume, interval, dirs);
    }
}

struct PreparedVolume {
    name: String,
    run: PreparedRun,
    faults: Vec<FaultSpec>,
    configured_depth: u32,
    open_loop: bool,
    /// The volume's throttle cgroup when it has `kernel_throttle` faults (removed on drop).
    throttle: Option<Arc<crate::fault::kernel::ThrottleGroup>>,
    /// Where its writes are mirrored, if its role mirrors them.
    mirror: Option<lockstep_proto::v1::MirrorTarget>,
}

enum Phase {
    Idle,
    Prepared {
        run_id: String,
        volumes: Vec<PreparedVolume>,
        hub: Arc<EventHub>,
        keep_files: bool,
        /// The plan's reporting interval.
        interval: Duration,
        /// Significant digits of the interval histograms to send.
        histogram_digits: u8,
    },
    Running {
        run_id: String,
        stop: Arc<AtomicBool>,
        hub: Arc<EventHub>,
    },
}

struct Shared {
    cfg: DaemonConfig,
    phase: Mutex<Phase>,
    metrics: Arc<Metrics>,
    /// Set while a `cut_off` fault refuses every call.
    cut_off: Arc<agent_faults::CutOff>,
    /// The last run that ended, so a coordinator that lost the stream near the end can still
    /// re-attach and get the final result.
    last_run: Mutex<Option<(String, Arc<EventHub>)>>,
    /// The run being laid out (Prepare is still working) and its stop flag: an abort or a
    /// shutdown during a layout of gigabytes stops it between chunks.
    preparing: Mutex<Option<(String, Arc<AtomicBool>)>>,
    /// The latest layout's run and byte counts, kept after it ends so that a `LayoutStatus`
    /// asked just after Prepare answered still finds it.
    layout: Mutex<Option<(String, Arc<LayoutCount>)>>,
    /// Set once the agent is shutting down (SIGTERM, SIGINT, its parent gone): no new layout
    /// or run may begin.
    shutting_down: AtomicBool,
    /// Serving over mutual TLS with these files: callers' certificates are checked (`peer`),
    /// and mirror links dial their backups with them.
    tls: Option<tls::TlsIdentity>,
}

impl Shared {
    /// Stops whatever this agent is doing for a coordinator: a layout in progress stops and
    /// removes its files, a prepared run is discarded, a running one stops its IO (its thread
    /// then removes the files and publishes the final result).
    fn stop_all(&self, why: &str) {
        self.shutting_down.store(true, Ordering::Relaxed);
        if let Some((run_id, stop)) = &*self.preparing.lock().unwrap() {
            tracing::warn!("layout of run {run_id} stopped: {why}");
            stop.store(true, Ordering::Relaxed);
        }
        let mut phase = self.phase.lock().unwrap();
        match &mut *phase {
            Phase::Idle => {}
            Phase::Running { run_id, stop, .. } => {
                tracing::warn!("run {run_id} stopped: {why}");
                stop.store(true, Ordering::Relaxed);
            }
            Phase::Prepared { volumes, .. } => {
                for v in volumes.iter_mut() {
                    v.run.discard(false);
                }
                *phase = Phase::Idle;
                self.metrics.set_state(0);
            }
        }
    }

    /// Ends a layout: the run becomes the prepared one, unless the layout failed or was
    /// stopped (then what it laid out is removed). The phase is set before the layout stops
    /// being listed, so that an abort always finds the run in one or the other.
    fn prepared(
        &self,
        req: PrepareRequest,
        histogram_digits: u8,
        laid_out: Result<Vec<PreparedVolume>, String>,
    ) -> Result<(), String> {
        let mut phase = self.phase.lock().unwrap();
        let stopped = self
            .preparing
            .lock()
            .unwrap()
            .take()
            .is_some_and(|(_, s)| s.load(Ordering::Relaxed));
        let volumes = match laid_out {
            Ok(mut volumes) if stopped => {
                for v in &mut volumes {
                    v.run.discard(false);
                }
                Err("stopped during the layout (aborted, or the agent is shutting down)".into())
            }
            other => other,
        };
        let volumes = volumes.inspect_err(|_| self.metrics.set_state(0))?;
        *phase = Phase::Prepared {
            run_id: req.run_id,
            hub: EventHub::for_volumes(self.metrics.clone(), volumes.len()),
            volumes,
            keep_files: req.keep_files,
            // Checked before the layout began (`asked_digits`).
            histogram_digits,
            // The coordinator checks the plan's interval (>= 100 ms); 0 is an old one.
            interval: if req.interval_ms == 0 {
                Duration::from_secs(1)
            } else {
                Duration::from_millis(req.interval_ms.max(10))
            },
        };
        Ok(())
    }

    /// Whether no layout and no run is in progress (their files are then removed).
    fn idle(&self) -> bool {
        // One lock at a time: `prepare` takes the phase, then the layout.
        let laying_out = self.preparing.lock().unwrap().is_some();
        let running = !matches!(*self.phase.lock().unwrap(), Phase::Idle);
        !laying_out && !running
    }
}

#[derive(Clone)]
pub struct AgentService {
    shared: Arc<Shared>,
}

/// The significant digits a Prepare asks the interval histograms to be sent at, checked before
/// anything is laid out (the simulator makes the same check with this function).
pub fn asked_digits(req: &PrepareRequest) -> Result<u8, String> {
    interval_digits(req.histogram_digits)
}

/// A Prepare reply: ready with the digits the agent will send (echoed, so the coordinator can
/// refuse an agent that would send another precision), or refused with `error` (no digits).
/// The simulator answers with this function too.
pub fn prepare_reply(result: Result<u8, String>, warnings: Vec<String>) -> PrepareReply {
    match result {
        Ok(digits) => PrepareReply {
            error: String::new(),
            warnings,
            histogram_digits: u32::from(digits),
        },
        Err(error) => PrepareReply {
            error,
            warnings,
            histogram_digits: 0,
        },
    }
}

fn check_version(v: u32) -> Result<(), Status> {
    if v != PROTOCOL_VERSION {
        return Err(Status::failed_precondition(version_mismatch(
            PROTOCOL_VERSION,
            v,
            "agent",
        )));
    }
    Ok(())
}

impl AgentService {
    pub fn new(cfg: DaemonConfig) -> Self {
        Self::with_tls(cfg, None)
    }

    /// The service of an agent that serves over mutual TLS with `tls` (None: plaintext).
    pub fn with_tls(cfg: DaemonConfig, tls: Option<tls::TlsIdentity>) -> Self {
        let metrics = Arc::new(Metrics::new(&cfg.volumes));
        AgentService {
            shared: Arc::new(Shared {
                cfg,
                phase: Mutex::new(Phase::Idle),
                metrics,
                cut_off: Arc::new(agent_faults::CutOff::default()),
                last_run: Mutex::new(None),
                preparing: Mutex::new(None),
                layout: Mutex::new(None),
                shutting_down: AtomicBool::new(false),
                tls,
            }),
        }
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        self.shared.metrics.clone()
    }

    /// The gRPC service with the token check in front of every call.
    pub fn into_server(
        self,
    ) -> tonic::service::interceptor::InterceptedService<
        AgentServer<AgentService>,
        impl tonic::service::Interceptor + Clone,
    > {
        let token = self.shared.cfg.token.clone();
        let cut_off = self.shared.cut_off.clone();
        AgentServer::with_interceptor(self, move |req: Request<()>| {
            if let Some(why) = cut_off.refusal() {
                return Err(Status::unavailable(why));
            }
            check_token(&token, req)
        })
    }

    /// Over TLS, refuses a caller whose certificate is not a coordinator's (`peer`).
    fn coordinator_only<T>(&self, req: &Request<T>) -> Result<(), Status> {
        peer::from_coordinator(&self.shared.cfg.name, self.shared.tls.is_some(), req)
    }

    fn busy_with(&self) -> String {
        match &*self.shared.phase.lock().unwrap() {
            Phase::Idle => String::new(),
            Phase::Prepared { run_id, .. } | Phase::Running { run_id, .. } => run_id.clone(),
        }
    }

    /// Prepares every volume of a run. Everything that can be refused without writing (job
    /// text, confinement, faults, and the memory/threads/open files the volumes need together)
    /// is checked for all volumes first; then each is laid out, and if one fails the ones
    /// already laid out are removed, so a refused prepare leaves nothing behind.
    /// `stop` ends a layout between chunks; what was laid out for the run is then removed too.
    fn prepare_volumes(
        cfg: &DaemonConfig,
        req: &PrepareRequest,
        stop: &Arc<AtomicBool>,
        count: &Arc<LayoutCount>,
    ) -> Result<Vec<PreparedVolume>, String> {
        let checked = req
            .work
            .iter()
            .map(|work| Self::check_volume(cfg, req, work))
            .collect::<Result<Vec<_>, String>>()?;
        let all: Vec<JobSpec> = checked
            .iter()
            .flat_map(|c| c.jobs.iter().cloned())
            .collect();
        crate::budget::check_host(&all, &crate::budget::host_figures()).map_err(|e| {
            if checked.len() > 1 {
                format!("{} volumes together: {e}", checked.len())
            } else {
                e.to_string()
            }
        })?;
        let total = checked.iter().map(|c| runner::layout_bytes(&c.jobs)).sum();
        count.total.store(total, Ordering::Relaxed);
        let mut out: Vec<PreparedVolume> = Vec::new();
        let mut failure = None;
        for volume in checked {
            match Self::lay_out_volume(cfg, volume, stop, count) {
                Ok(prepared) => out.push(prepared),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
        }
        let stopped = stop.load(Ordering::Relaxed);
        if failure.is_some() || stopped {
            for v in &mut out {
                v.run.discard(false);
            }
        }
        match failure {
            _ if stopped => {
                Err("stopped during the layout (aborted, or the agent is shutting down)".into())
            }
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// One volume's work, parsed and checked; nothing written.
    fn check_volume<'a>(
        cfg: &'a DaemonConfig,
        req: &PrepareRequest,
        work: &'a lockstep_proto::v1::VolumeWork,
    ) -> Result<CheckedVolume<'a>, String> {
        let vol = cfg
            .volumes
            .iter()
            .find(|v| v.name == work.volume)
            .ok_or_else(|| {
                format!(
                    "this agent has no volume '{}' (it has: {})",
                    work.volume,
                    cfg.volumes
                        .iter()
                        .map(|v| v.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })?;
        let origin = std::path::PathBuf::from(format!("{}/{}.fio", req.run_id, work.volume));
        let overrides: Vec<(String, String)> = work
            .overrides
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut jobs: Vec<JobSpec> = jobfile::parse_str(&work.jobfile, &origin, None, &overrides)
            .map_err(|e| format!("volume '{}': {e}", work.volume))?;
        for job in &mut jobs {
            vol.confine(job).map_err(|e| e.to_string())?;
        }
        let faults = crate::fault::wire::from_wire(&work.faults)
            .map_err(|e| format!("volume '{}': {e}", work.volume))?;
        if let Some(m) = &work.mirror {
            if m.backup_address.is_empty() || m.backup_volume.is_empty() {
                return Err(format!(
                    "volume '{}': mirror: the backup's address and volume are required",
                    work.volume
                ));
            }
        }
        for f in faults.iter().filter(|f| f.kind.is_agent_wide()) {
            agent_faults::check(f, cfg.allow_exec)
                .map_err(|e| format!("volume '{}': fault {e}", work.volume))?;
        }
        Ok(CheckedVolume {
            work,
            vol,
            jobs,
            faults,
        })
    }

    /// Lays one checked volume out (`runner::prepare`, which refuses before writing too).
    fn lay_out_volume(
        cfg: &DaemonConfig,
        checked: CheckedVolume<'_>,
        stop: &Arc<AtomicBool>,
        count: &Arc<LayoutCount>,
    ) -> Result<PreparedVolume, String> {
        let CheckedVolume {
            work,
            vol,
            jobs,
            faults,
        } = checked;
        let opts = RunOptions {
            allow_block_devices: cfg.allow_block_devices,
            layout_progress: Box::new(crate::progress::Stoppable {
                inner: count.clone(),
                stop: stop.clone(),
            }),
            ..RunOptions::default()
        };
        // Privilege and device checks for the kernel's throttle, before any file is laid out.
        let throttle = if faults
            .iter()
            .any(|f| matches!(f.kind, crate::fault::FaultKind::KernelThrottle(_)))
        {
            let g = crate::fault::kernel::ThrottleGroup::create(&work.volume, &vol.path)
                .map_err(|e| format!("volume '{}': {e}", work.volume))?;
            Some(Arc::new(g))
        } else {
            None
        };
        let run =
            runner::prepare(&jobs, &opts).map_err(|e| format!("volume '{}': {e}", work.volume))?;
        let open_loop = jobs.iter().any(|j| j.rate.is_limited());
        let configured_depth = if open_loop {
            0
        } else {
            configured_depth(&jobs)
        };
        Ok(PreparedVolume {
            name: work.volume.clone(),
            run,
            faults,
            configured_depth,
            open_loop,
            throttle,
            mirror: work.mirror.clone(),
        })
    }
}

/// A volume's work that passed every check that writes nothing.
struct CheckedVolume<'a> {
    work: &'a lockstep_proto::v1::VolumeWork,
    vol: &'a volume::VolumeConfig,
    jobs: Vec<JobSpec>,
    faults: Vec<FaultSpec>,
}

/// A run id as Status messages show it: quoted with control characters escaped, and cut to
/// `SHOWN_ID_CHARS` characters. The id is the caller's; a message echoing a long one whole
/// outgrows HTTP/2's header limit (gRPC sends the message as a header) and reaches the caller
/// as a bare protocol error instead of the agent's answer.
fn shown_id(id: &str) -> String {
    const SHOWN_ID_CHARS: usize = 64;
    let count = id.chars().count();
    if count <= SHOWN_ID_CHARS {
        return format!("{id:?}");
    }
    let head: String = id.chars().take(SHOWN_ID_CHARS).collect();
    format!("{head:?}... ({count} characters)")
}

/// iodepth x numjobs summed over a volume's jobs, saturating: each is up to u32::MAX (their
/// bounds are the job file's business), and an overflow here panicked the whole Prepare.
/// Jobs that idle by design leave their depth unfilled and are left out: think time between
/// bursts (a WIJ's write-daemon cycle) or an fsync/fdatasync after their writes (a journal,
/// whose time in the sync is no IO in flight). Counting them made the coordinator's
/// Little's-law check blame the load generator for a workload doing what it was told.
fn configured_depth(jobs: &[JobSpec]) -> u32 {
    jobs.iter()
        .filter(|j| j.thinktime.is_zero() && j.fsync == 0 && j.fdatasync == 0)
        .map(|j| j.iodepth.saturating_mul(j.numjobs))
        .fold(0u32, u32::saturating_add)
}

/// The bearer-token rule, shared with the simulated agents (`simulate`) so they refuse what a
/// real agent refuses.
pub(crate) fn check_token(token: &Option<String>, req: Request<()>) -> Result<Request<()>, Status> {
    let Some(want) = token else { return Ok(req) };
    let got = req
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    // Constant-time comparison: the token guards a tool that writes to disks.
    let ok = got.is_some_and(|g| {
        g.len() == want.len()
            && g.bytes()
                .zip(want.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    });
    if ok {
        Ok(req)
    } else {
        Err(Status::unauthenticated("missing or wrong agent token"))
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<RunEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Agent for AgentService {
    async fn hello(&self, req: Request<HelloRequest>) -> Result<Response<HelloReply>, Status> {
        self.coordinator_only(&req)?;
        check_version(req.get_ref().protocol_version)?;
        let cfg = &self.shared.cfg;
        // What the agent says of itself is what it registers in etcd, from one place.
        let me = registration(cfg, String::new(), false);
        Ok(Response::new(HelloReply {
            protocol_version: PROTOCOL_VERSION,
            agent_version: me.version,
            name: me.name,
            hostname: me.hostname,
            labels: me.labels.into_iter().collect(),
            volumes: me.volumes.into_iter().map(Volume::from).collect(),
            capabilities: Some(me.capabilities.into()),
            busy_with_run: self.busy_with(),
            grace_ms: cfg.grace.as_millis() as u64,
        }))
    }

    async fn clock_probe(
        &self,
        req: Request<ClockProbeRequest>,
    ) -> Result<Response<ClockProbeReply>, Status> {
        self.coordinator_only(&req)?;
        check_version(req.get_ref().protocol_version)?;
        Ok(Response::new(ClockProbeReply {
            agent_unix_ns: unix_ns(SystemTime::now()),
        }))
    }

    async fn prepare(
        &self,
        req: Request<PrepareRequest>,
    ) -> Result<Response<PrepareReply>, Status> {
        self.coordinator_only(&req)?;
        let req = req.into_inner();
        check_version(req.protocol_version)?;
        let digits = match asked_digits(&req) {
            Ok(d) => d,
            Err(e) => return Ok(Response::new(prepare_reply(Err(e), Vec::new()))),
        };
        {
            let mut phase = self.shared.phase.lock().unwrap();
            match &mut *phase {
                Phase::Idle => {}
                Phase::Prepared {
                    run_id, volumes, ..
                } if run_id == &req.run_id => {
                    // A repeated prepare of the same run: start over.
                    for v in volumes.iter_mut() {
                        v.run.discard(false);
                    }
                    *phase = Phase::Idle;
                }
                Phase::Prepared { run_id, .. } | Phase::Running { run_id, .. } => {
                    return Err(Status::failed_precondition(format!(
                        "agent '{}' is busy with run {}",
                        self.shared.cfg.name,
                        shown_id(run_id)
                    )));
                }
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        {
            let mut preparing = self.shared.preparing.lock().unwrap();
            if self.shared.shutting_down.load(Ordering::Relaxed) {
                return Err(Status::unavailable("the agent is shutting down"));
            }
            if let Some((run_id, _)) = &*preparing {
                return Err(Status::failed_precondition(format!(
                    "agent '{}' is busy laying out run {run_id}",
                    self.shared.cfg.name
                )));
            }
            *preparing = Some((req.run_id.clone(), stop.clone()));
        }
        let count = Arc::new(LayoutCount::default());
        *self.shared.layout.lock().unwrap() = Some((req.run_id.clone(), count.clone()));
        self.shared.metrics.set_state(1);
        // A coordinator that goes away mid-layout drops this call: stop the layout then (its
        // files are removed), for nobody is left to start or abort the run.
        let mut guard = StopOnDrop(Some(stop.clone()));
        let shared = self.shared.clone();
        let result = tokio::task::spawn_blocking(move || {
            let laid_out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                AgentService::prepare_volumes(&shared.cfg, &req, &stop, &count)
            }))
            .unwrap_or_else(|_| Err("prepare panicked".into()));
            count.finished.store(true, Ordering::Release);
            shared.prepared(req, digits, laid_out)
        })
        .await;
        guard.0 = None;
        match result {
            Ok(Ok(())) => Ok(Response::new(prepare_reply(Ok(digits), Vec::new()))),
            Ok(Err(e)) => Ok(Response::new(prepare_reply(Err(e), Vec::new()))),
            Err(e) => Err(Status::internal(format!("prepare failed: {e}"))),
        }
    }

    async fn layout_status(
        &self,
        req: Request<LayoutStatusRequest>,
    ) -> Result<Response<LayoutStatusReply>, Status> {
        self.coordinator_only(&req)?;
        let req = req.into_inner();
        check_version(req.protocol_version)?;
        match &*self.shared.layout.lock().unwrap() {
            Some((run_id, count)) if *run_id == req.run_id => {
                let (bytes_done, bytes_total, finished) = count.snapshot();
                Ok(Response::new(LayoutStatusReply {
                    bytes_done,
                    bytes_total,
                    finished,
                }))
            }
            _ => Err(Status::not_found(format!(
                "no layout of run {} on this agent",
                shown_id(&req.run_id)
            ))),
        }
    }

    type StartStream = EventStream;

    async fn start(&self, req: Request<StartRequest>) -> Result<Response<EventStream>, Status> {
        self.coordinator_only(&req)?;
        let req = req.into_inner();
        check_version(req.protocol_version)?;
        let mut phase = self.shared.phase.lock().unwrap();
        let (volumes, hub, keep_files, interval, histogram_digits) =
            match std::mem::replace(&mut *phase, Phase::Idle) {
                Phase::Prepared {
                    run_id,
                    volumes,
                    hub,
                    keep_files,
                    interval,
                    histogram_digits,
                } if run_id == req.run_id => (volumes, hub, keep_files, interval, histogram_digits),
                other => {
                    let msg = match &other {
                        Phase::Idle => "nothing prepared".to_string(),
                        Phase::Prepared { run_id, .. } => {
                            format!("prepared run is {}", shown_id(run_id))
                        }
                        Phase::Running { run_id, .. } => {
                            format!("already running {}", shown_id(run_id))
                        }
                    };
                    *phase = other;
                    return Err(Status::failed_precondition(format!(
                        "cannot start run {}: {msg}",
                        shown_id(&req.run_id)
                    )));
                }
            };
        let stop = Arc::new(AtomicBool::new(false));
        *phase = Phase::Running {
            run_id: req.run_id.clone(),
            stop: stop.clone(),
            hub: hub.clone(),
        };
        drop(phase);
        let stream = hub.attach(0);
        let start_at = UNIX_EPOCH + Duration::from_nanos(req.start_at_agent_ns.max(0) as u64);
        tracing::debug!(run = %req.run_id, start_at_ns = req.start_at_agent_ns, now_ns = unix_ns(SystemTime::now()), "start requested");
        let shared = self.shared.clone();
        // A thread name may not hold a NUL (spawning would panic) and Linux shows 15 bytes
        // of it: the id's first printable characters are all it can say.
        let thread_name: String = std::iter::once("run-")
            .flat_map(str::chars)
            .chain(req.run_id.chars().filter(|c| !c.is_control()))
            .take(15)
            .collect();
        let spawned = std::thread::Builder::new()
            .name(thread_name)
            .spawn(move || {
                let run_opts = RunSetup {
                    run_id: req.run_id,
                    start_at,
                    keep_files,
                    interval,
                    histogram_digits,
                };
                let (shared2, hub2, run_id) =
                    (shared.clone(), hub.clone(), run_opts.run_id.clone());
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    run(shared, run_opts, volumes, hub, stop)
                }));
                if let Err(panic) = ran {
                    run_panicked(&shared2, &hub2, run_id, panic_message(&*panic));
                }
            });
        if let Err(e) = spawned {
            // Not running after all: an agent left `Running` with no run would stay busy.
            *self.shared.phase.lock().unwrap() = Phase::Idle;
            self.shared.metrics.set_state(0);
            return Err(Status::internal(format!(
                "cannot start the run thread: {e}"
            )));
        }
        Ok(Response::new(Box::pin(stream)))
    }

    async fn abort(&self, req: Request<AbortRequest>) -> Result<Response<AbortReply>, Status> {
        self.coordinator_only(&req)?;
        let req = req.into_inner();
        check_version(req.protocol_version)?;
        if let Some((run_id, stop)) = &*self.shared.preparing.lock().unwrap()
            && (*run_id == req.run_id || req.run_id.is_empty())
        {
            tracing::warn!(
                "layout of run {run_id} aborted by the coordinator: {}",
                req.reason
            );
            stop.store(true, Ordering::Relaxed);
        }
        let mut phase = self.shared.phase.lock().unwrap();
        match &mut *phase {
            Phase::Running { run_id, stop, .. }
                if *run_id == req.run_id || req.run_id.is_empty() =>
            {
                tracing::warn!("run {run_id} aborted by the coordinator: {}", req.reason);
                stop.store(true, Ordering::Relaxed);
            }
            Phase::Prepared {
                run_id, volumes, ..
            } if *run_id == req.run_id || req.run_id.is_empty() => {
                for v in volumes.iter_mut() {
                    v.run.discard(false);
                }
                *phase = Phase::Idle;
                self.shared.metrics.set_state(0);
            }
            _ => {}
        }
        Ok(Response::new(AbortReply {}))
    }

    type AttachStream = EventStream;

    async fn attach(&self, req: Request<AttachRequest>) -> Result<Response<EventStream>, Status> {
        self.coordinator_only(&req)?;
        let req = req.into_inner();
        check_version(req.protocol_version)?;
        let phase = self.shared.phase.lock().unwrap();
        match &*phase {
            Phase::Running { run_id, hub, .. } if *run_id == req.run_id => {
                Ok(Response::new(Box::pin(hub.attach(req.after_seq))))
            }
            _ => match &*self.shared.last_run.lock().unwrap() {
                // Ended while nobody listened: replay what is left, the final result last.
                Some((run_id, hub)) if *run_id == req.run_id => {
                    Ok(Response::new(Box::pin(hub.attach(req.after_seq))))
                }
                _ => Err(Status::not_found(format!(
                    "run {} is not running on this agent",
                    shown_id(&req.run_id)
                ))),
            },
        }
    }

    type MirrorStream = MirrorAckStream;

    /// A primary's mirrored writes (`crate::mirror::backup`), behind the same token check as
    /// every call; a `cut_off` fault refuses it and breaks a stream in progress. Over TLS, only
    /// the certificate of the agent each write names as its primary is accepted (`peer`).
    async fn mirror(
        &self,
        req: Request<tonic::Streaming<MirrorWrite>>,
    ) -> Result<Response<MirrorAckStream>, Status> {
        let me = self.shared.cfg.name.clone();
        let caller = peer::mirror_caller(&me, self.shared.tls.is_some(), &req)?;
        let volumes = self.shared.cfg.volumes.iter();
        let volumes = Arc::new(
            volumes
                .map(|v| crate::mirror::backup::MirrorVolume {
                    name: v.name.clone(),
                    path: v.path.clone(),
                })
                .collect(),
        );
        let cut_off = self.shared.cut_off.clone();
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(crate::mirror::backup::serve_stream(
            volumes,
            req.into_inner(),
            tx,
            move |w: &MirrorWrite| match cut_off.refusal() {
                Some(why) => Some(Status::unavailable(why)),
                None => caller
                    .as_ref()
                    .and_then(|p| peer::check_primary(&me, p, &w.primary)),
            },
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

type MirrorAckStream = Pin<Box<dyn Stream<Item = Result<MirrorAck, Status>> + Send>>;

/// What a panic said, for the run's error.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_string())
}

/// Serves the agent until `shutdown` resolves. Keepalive pings find a coordinator that died or
/// was paused even when no interval is due, so the grace period starts promptly. With `tls`,
/// every connection must complete a mutual-TLS handshake first, calls are checked against the
/// caller's certificate (`peer`), and mirror links dial their backups over TLS too.
pub async fn serve(
    cfg: DaemonConfig,
    listener: tokio::net::TcpListener,
    metrics_listener: Option<tokio::net::TcpListener>,
    tls: Option<tls::TlsIdentity>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let server_tls = tls.as_ref().map(tls::TlsIdentity::server_config);
    let service = AgentService::with_tls(cfg, tls);
    let shared = service.shared.clone();
    // On shutdown, first stop the layout or run and let it remove its files, then stop serving.
    let shutdown = async move {
        shutdown.await;
        shared.stop_all("the agent is shutting down");
        let until = Instant::now() + SHUTDOWN_WAIT;
        while !shared.idle() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if !shared.idle() {
            tracing::error!(
                "the run did not end within {:.0} s of the shutdown: exiting anyway",
                SHUTDOWN_WAIT.as_secs_f64()
            );
        }
    };
    if let Some(l) = metrics_listener {
        let m = service.metrics();
        tokio::spawn(async move { metrics::serve(l, m).await });
    }
    // No Nagle on accepted connections: a mirror's acks and the interval reports are small
    // messages, and Nagle's wait for the peer's delayed ACK added milliseconds to each.
    let incoming = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        |s| s.and_then(|s| s.set_nodelay(true).map(|()| s)),
    );
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = server_tls {
        builder = builder.tls_config(tls)?;
    }
    builder
        .http2_keepalive_interval(Some(KEEPALIVE))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .add_service(service.into_server())
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// Sets a stop flag when dropped armed (a call cancelled before its end).
struct StopOnDrop(Option<Arc<AtomicBool>>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(s) = &self.0 {
            s.store(true, Ordering::Relaxed);
        }
    }
}

/// How long the agent's connections go without reading anything before the agent pings the
/// coordinator. During a run the agent only sends (its interval reports), so this is how
/// often it pings: every 5 s, and a coordinator cut off is noticed within 8 s of the cut
/// (then `--grace` runs). Every second, as before, it was 10,000 pings a second into a
/// coordinator of 10,000 agents, each woken, timed and answered: most of that coordinator's
/// CPU between intervals (docs/scale.md, "Keepalive"). A coordinator that exits closes its
/// connections and is noticed at once.
pub(crate) const KEEPALIVE: Duration = Duration::from_secs(5);
/// How long a ping may go unanswered before the connection is given up.
pub(crate) const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a shutdown waits for the layout or run in progress to stop and remove its files. An
/// abort takes well under a second; this bound only matters for a device that stopped
/// answering, which must not hold the agent (and its port) for ever.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(3);

/// After the shutdown began, how long the server may take to close its connections before the
/// agent exits anyway (a stream the coordinator stopped reading must not hold it).
const SERVE_DRAIN: Duration = Duration::from_secs(1);

/// Where `lockstep-agent serve` listens and whom it tells about itself.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// gRPC address (port 0 picks one).
    pub listen: String,
    pub metrics_listen: Option<String>,
    /// `host:port` coordinators should dial, published in etcd (default: the bound address,
    /// with the hostname in place of an unspecified IP such as 0.0.0.0).
    pub advertise: Option<String>,
    /// Register in etcd under a lease (`--etcd`).
    pub registry: Option<crate::registry::RegistryOptions>,
    /// Require mutual TLS (`--tls-cert/--tls-key/--tls-ca`).
    pub tls: Option<tls::TlsFiles>,
    /// Shut down when standard input closes (`--exit-with-stdin`; see `parent_gone`).
    pub exit_with_stdin: bool,
}

/// Resolves when standard input reaches its end: `lockstep run --local` gives each agent a pipe
/// it never writes to, and the kernel closes its end when the coordinator exits, however it
/// exits (SIGKILL and a crash included). Unlike PR_SET_PDEATHSIG, which fires when the *thread*
/// that forked the child exits (a tokio worker, not the process) and races the fork, a pipe
/// ends only when every holder of its write end is gone, and needs nothing from the parent.
fn parent_gone() -> tokio::sync::oneshot::Receiver<()> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("parent-watch".into())
        .spawn(move || {
            use std::io::Read;
            let mut buf = [0u8; 256];
            let mut stdin = std::io::stdin().lock();
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            let _ = tx.send(());
        });
    if let Err(e) = spawned {
        // Without the watch the agent would outlive its parent: refuse to run instead.
        tracing::error!("cannot watch standard input: {e}");
        std::process::exit(2);
    }
    rx
}

/// The address to publish: `--advertise`, else the bound address (hostname for 0.0.0.0/::).
fn advertised(opts: &ServeOptions, bound: std::net::SocketAddr) -> String {
    match &opts.advertise {
        Some(a) => a.clone(),
        None if bound.ip().is_unspecified() => format!("{}:{}", hostname(), bound.port()),
        None => bound.to_string(),
    }
}

/// The agent as it describes itself: in etcd's registry and, the same, in its Hello reply.
fn registration(cfg: &DaemonConfig, address: String, tls: bool) -> crate::registry::Registration {
    use crate::registry::{RegisteredCapabilities, RegisteredVolume, Registration};
    Registration {
        name: cfg.name.clone(),
        address,
        labels: cfg.labels.clone(),
        volumes: cfg
            .volumes
            .iter()
            .map(|v| RegisteredVolume {
                name: v.name.clone(),
                path: v.path.display().to_string(),
                size_bytes: v.size_bytes,
                kind: v.kind.clone(),
                provisioned_iops: v.provisioned_iops,
                provisioned_mib_s: v.provisioned_mib_s,
            })
            .collect(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        protocol_version: PROTOCOL_VERSION,
        capabilities: RegisteredCapabilities {
            io_uring: crate::engine::uring_available(),
            engines: vec![
                "io_uring".into(),
                "libaio".into(),
                "psync".into(),
                "null".into(),
            ],
            exec_allowed: cfg.allow_exec,
            block_devices_allowed: cfg.allow_block_devices,
        },
        tls,
        hostname: hostname(),
        registered_unix_ms: (unix_ns(SystemTime::now()) / 1_000_000) as u64,
    }
}

/// `lockstep-agent serve`: checks the volumes, binds, prints `listening on ADDR` (a line a
/// parent process can read to find a port-0 address), tells systemd it is ready, registers in
/// etcd when asked, and serves until SIGINT/SIGTERM (then revokes its etcd lease, so it leaves
/// the registry at once).
pub fn serve_blocking(cfg: DaemonConfig, opts: ServeOptions) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::io::Write;
    for v in &cfg.volumes {
        v.check()?;
    }
    let mut names = std::collections::HashSet::new();
    for v in &cfg.volumes {
        anyhow::ensure!(
            names.insert(&v.name),
            "--volume {}: the name is given twice",
            v.name
        );
    }
    let tls = opts.tls.as_ref().map(tls::TlsFiles::load).transpose()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listen = &opts.listen;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("--listen {listen}"))?;
        let metrics = match &opts.metrics_listen {
            Some(m) => Some(
                tokio::net::TcpListener::bind(m)
                    .await
                    .with_context(|| format!("--metrics-listen {m}"))?,
            ),
            None => None,
        };
        let bound = listener.local_addr()?;
        let mut out = std::io::stdout();
        writeln!(out, "listening on {bound}")?;
        if let Some(m) = &metrics {
            writeln!(out, "metrics on http://{}/metrics", m.local_addr()?)?;
        }
        out.flush()?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let registry = opts.registry.clone().map(|r| {
            let reg = registration(&cfg, advertised(&opts, bound), opts.tls.is_some());
            tokio::spawn(crate::registry::keep_registered(
                r,
                reg,
                stopped(stop_rx.clone()),
            ))
        });
        notify::ready(&format!("serving on {bound}"));
        if let Some(every) = notify::watchdog_interval() {
            tokio::spawn(notify::watchdog(every));
        }
        // The handlers are installed before anything is laid out: SIGTERM is a clean stop at
        // every phase, like SIGINT.
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        let parent = opts.exit_with_stdin.then(parent_gone);
        tokio::spawn(async move {
            let parent = async {
                match parent {
                    Some(rx) => {
                        let _ = rx.await;
                    }
                    None => std::future::pending().await,
                }
            };
            let why = tokio::select! {
                _ = tokio::signal::ctrl_c() => "SIGINT",
                _ = term.recv() => "SIGTERM",
                _ = parent => "its parent is gone (standard input closed)",
            };
            tracing::warn!("shutting down: {why}");
            notify::stopping();
            let _ = stop_tx.send(true);
        });
        let drain_rx = stop_rx.clone();
        let drain_deadline = async move {
            stopped(drain_rx).await;
            tokio::time::sleep(SHUTDOWN_WAIT + SERVE_DRAIN).await;
        };
        tokio::select! {
            r = serve(cfg, listener, metrics, tls, stopped(stop_rx)) => r.context("serving")?,
            _ = drain_deadline => tracing::warn!("connections still open at the shutdown: closed"),
        }
        if let Some(r) = registry {
            // The lease revoke is bounded by its own timeout.
            let _ = r.await;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_proto::v1::run_event;
    use tokio_stream::StreamExt;

    /// An agent with one directory volume per name.
    fn config(volumes: &[(&str, &std::path::Path)]) -> DaemonConfig {
        DaemonConfig {
            name: "a".into(),
            labels: BTreeMap::new(),
            volumes: volumes
                .iter()
                .map(|(name, path)| volume::VolumeConfig {
                    name: name.to_string(),
                    path: path.to_path_buf(),
                    size_bytes: 0,
                    kind: String::new(),
                    provisioned_iops: 0,
                    provisioned_mib_s: 0,
                })
                .collect(),
            token: None,
            grace: Duration::from_secs(5),
            allow_block_devices: false,
            allow_exec: false,
        }
    }

    fn request(work: &[(&str, String)]) -> PrepareRequest {
        PrepareRequest {
            protocol_version: PROTOCOL_VERSION,
            run_id: "r".into(),
            work: work
                .iter()
                .map(|(volume, jobfile)| lockstep_proto::v1::VolumeWork {
                    volume: volume.to_string(),
                    role: "w".into(),
                    jobfile: jobfile.clone(),
                    overrides: Default::default(),
                    faults: Vec::new(),
                    mirror: None,
                })
                .collect(),
            interval_ms: 1000,
            keep_files: false,
            histogram_digits: 0,
        }
    }

    /// A volume refused after another was laid out leaves nothing behind on either.
    #[test]
    fn a_refused_volume_removes_what_the_others_laid_out() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let cfg = config(&[("a", a.path()), ("b", b.path())]);
        let req = request(&[
            ("a", "[j]\nrw=read\nsize=1m\n".into()),
            ("b", "[j]\nrw=write\nsize=1p\n".into()),
        ]);
        let e = AgentService::prepare_volumes(
            &cfg,
            &req,
            &Arc::new(AtomicBool::new(false)),
            &Default::default(),
        )
        .err()
        .expect("refused");
        assert!(
            e.starts_with("volume 'b': the files to lay out need"),
            "{e}"
        );
        assert_eq!(
            std::fs::read_dir(a.path()).unwrap().count(),
            0,
            "a was left laid out"
        );
        assert_eq!(std::fs::read_dir(b.path()).unwrap().count(), 0);
    }

    /// `LayoutStatus`'s counts: the total over every volume is known before the first byte
    /// (it does not grow volume by volume), and a finished layout has written all of it.
    /// Write-only files are allocated, not written, and count for nothing.
    #[test]
    fn the_layout_count_covers_every_volume_from_the_start() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let cfg = config(&[("a", a.path()), ("b", b.path())]);
        let req = request(&[
            ("a", "[j]\nrw=read\nsize=3m\n".into()),
            (
                "b",
                "[j]\nrw=randread\nsize=2m\nnumjobs=2\n[w]\nrw=write\nsize=8m\n".into(),
            ),
        ]);
        let count = Arc::new(LayoutCount::default());
        let mut volumes =
            AgentService::prepare_volumes(&cfg, &req, &Arc::new(AtomicBool::new(false)), &count)
                .unwrap();
        let (done, total, _) = count.snapshot();
        assert_eq!((done, total), (7 << 20, 7 << 20));
        for v in &mut volumes {
            v.run.discard(false);
        }
    }

    /// The memory estimate covers every volume of the agent together: each of these needs
    /// 60% of the available memory, which is refused for the two, before any layout.
    #[test]
    fn the_memory_estimate_covers_all_volumes_together() {
        let available = crate::budget::host_figures()
            .mem_available
            .expect("MemAvailable is readable");
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let cfg = config(&[("a", a.path()), ("b", b.path())]);
        let depth = (available / 10 * 6 / (16 << 20)).max(1);
        let job = format!("[j]\nioengine=null\nrw=read\nsize=1m\nbs=16m\niodepth={depth}\n");
        let alone = request(&[("a", job.clone())]);
        assert!(
            AgentService::prepare_volumes(
                &cfg,
                &alone,
                &Arc::new(AtomicBool::new(false)),
                &Default::default()
            )
            .is_ok()
        );
        let both = request(&[("a", job.clone()), ("b", job)]);
        let e = AgentService::prepare_volumes(
            &cfg,
            &both,
            &Arc::new(AtomicBool::new(false)),
            &Default::default(),
        )
        .err()
        .expect("refused");
        assert!(
            e.contains("of memory") && e.contains("available (MemAvailable)"),
            "{e}"
        );
    }

    fn started(volume: &str) -> RunEvent {
        RunEvent {
            seq: 0,
            event: Some(run_event::Event::Started(lockstep_proto::v1::Started {
                actual_start_agent_ns: 1,
                volume: volume.into(),
            })),
        }
    }

    async fn drain(mut s: ReceiverStream<Result<RunEvent, Status>>) -> Vec<u64> {
        let mut seqs = Vec::new();
        while let Some(Ok(ev)) = s.next().await {
            seqs.push(ev.seq);
        }
        seqs
    }

    /// A re-attach gets exactly the events after the last one the coordinator saw, including
    /// those the agent had already sent into a connection that died.
    #[tokio::test]
    async fn a_reattach_replays_what_came_after_the_last_event_seen() {
        let hub = EventHub::new(Arc::new(Metrics::new(&[])));
        let first = hub.attach(0);
        for v in ["a", "b", "c"] {
            hub.publish(started(v));
        }
        // The first listener got 1..=3 (as far as the agent knows); the coordinator only saw 1.
        drop(first);
        let second = hub.attach(1);
        hub.publish(started("d"));
        hub.finish();
        assert_eq!(drain(second).await, vec![2, 3, 4]);
        // After the end, a late re-attach still gets the rest and the stream closes.
        assert_eq!(drain(hub.attach(3)).await, vec![4]);
        assert_eq!(drain(hub.attach(0)).await, vec![1, 2, 3, 4]);
    }

    fn service(volume: &std::path::Path) -> AgentService {
        AgentService::new(DaemonConfig {
            name: "t".into(),
            labels: BTreeMap::new(),
            volumes: vec![VolumeConfig {
                name: "data".into(),
                path: volume.to_path_buf(),
                size_bytes: 0,
                kind: String::new(),
                provisioned_iops: 0,
                provisioned_mib_s: 0,
            }],
            token: None,
            grace: Duration::from_secs(5),
            allow_block_devices: false,
            allow_exec: false,
        })
    }

    /// Found by the gRPC fuzz test: a run id is the caller's, and echoing a long one whole in
    /// a Status message broke HTTP/2's header limit (the caller got a protocol error).
    #[test]
    fn run_ids_in_messages_are_escaped_and_cut() {
        assert_eq!(shown_id("r1"), "\"r1\"");
        assert_eq!(shown_id("a\nb\0"), "\"a\\nb\\0\"");
        let long = shown_id(&"é".repeat(100_000));
        assert!(long.len() < 200, "{long}");
        assert!(long.ends_with("... (100000 characters)"), "{long}");
    }

    #[tokio::test]
    async fn unknown_long_run_ids_get_a_short_answer() {
        let dir = tempfile::tempdir().unwrap();
        let svc = service(dir.path());
        let err = svc
            .attach(Request::new(AttachRequest {
                protocol_version: PROTOCOL_VERSION,
                run_id: "r".repeat(50_000),
                after_seq: 0,
            }))
            .await
            .err()
            .expect("no such run");
        assert_eq!(err.code(), tonic::Code::NotFound);
        assert!(err.message().len() < 200, "{}", err.message());
    }

    /// Found reading the handlers for the gRPC fuzz test: the configured depth (iodepth x
    /// numjobs, summed) overflowed u32 and the Prepare panicked ("prepare panicked"). The
    /// runner's buffer-memory check now refuses such jobs first; the sum saturates anyway.
    #[test]
    fn a_huge_configured_depth_saturates() {
        let job = |iodepth: u32, numjobs: u32| {
            let mut j = JobSpec::with_defaults("j", crate::job::Origin::default());
            j.iodepth = iodepth;
            j.numjobs = numjobs;
            j
        };
        assert_eq!(configured_depth(&[job(4, 2), job(8, 1)]), 16);
        assert_eq!(configured_depth(&[job(u32::MAX, 2)]), u32::MAX);
        assert_eq!(
            configured_depth(&[job(1 << 31, 1), job(1 << 31, 1)]),
            u32::MAX
        );
    }

    /// Found running examples/iris-pair.toml: the WIJ (bursts, then think time) and the journal
    /// (fdatasync after every write) keep few IOs in flight by design, and the run said "the
    /// load generator is the limit" for them. Such jobs configure no depth to fill.
    #[test]
    fn jobs_that_idle_by_design_configure_no_depth() {
        let job = |f: &dyn Fn(&mut JobSpec)| {
            let mut j = JobSpec::with_defaults("j", crate::job::Origin::default());
            j.iodepth = 16;
            f(&mut j);
            j
        };
        let wij = job(&|j| {
            j.thinktime = Duration::from_secs(2);
            j.thinktime_blocks = 256;
        });
        let journal = job(&|j| j.fdatasync = 1);
        let fsynced = job(&|j| j.fsync = 8);
        let plain = job(&|_| {});
        assert_eq!(configured_depth(&[wij, journal, fsynced.clone()]), 0);
        assert_eq!(configured_depth(&[plain, fsynced]), 16);
    }

    /// A run that panics (the gRPC fuzz test drove a clone into an allocation failure, which
    /// panicked it) must end with a final result that says so and leave the agent idle; it
    /// used to leave the agent busy with the dead run for good.
    #[tokio::test]
    async fn a_run_that_panics_ends_with_a_final_result_and_an_idle_agent() {
        let dir = tempfile::tempdir().unwrap();
        let svc = service(dir.path());
        let hub = EventHub::new(svc.shared.metrics.clone());
        *svc.shared.phase.lock().unwrap() = Phase::Running {
            run_id: "r".into(),
            stop: Arc::new(AtomicBool::new(false)),
            hub: hub.clone(),
        };
        let stream = hub.attach(0);
        let payload = std::panic::catch_unwind(|| panic!("boom {}", 42)).unwrap_err();
        run_panicked(&svc.shared, &hub, "r".into(), panic_message(&*payload));
        assert_eq!(svc.busy_with(), "");
        let events: Vec<_> = stream.collect().await;
        let Some(Ok(RunEvent {
            event: Some(run_event::Event::Final(f)),
            ..
        })) = events.last()
        else {
            panic!("no final result: {events:?}");
        };
        assert_eq!(f.error, "the agent's run failed: boom 42");
        let payload = std::panic::catch_unwind(|| panic!("plain")).unwrap_err();
        assert_eq!(panic_message(&*payload), "plain");
    }

    /// Found while writing the gRPC fuzz test: a run id with a NUL made the run thread's name invalid and
    /// `start` panicked after marking the agent busy, which then refused every run for good.
    #[tokio::test]
    async fn a_run_id_with_a_nul_starts_and_ends() {
        let dir = tempfile::tempdir().unwrap();
        let svc = service(dir.path());
        let run_id = "r\0x".to_string();
        let reply = svc
            .prepare(Request::new(PrepareRequest {
                protocol_version: PROTOCOL_VERSION,
                run_id: run_id.clone(),
                work: vec![lockstep_proto::v1::VolumeWork {
                    volume: "data".into(),
                    role: "r".into(),
                    jobfile: "[j]\nioengine=null\nsize=1m\nruntime=100ms\ntime_based\n".into(),
                    overrides: Default::default(),
                    faults: Vec::new(),
                    mirror: None,
                }],
                interval_ms: 100,
                keep_files: false,
                histogram_digits: 2,
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.error, "");
        assert_eq!(reply.histogram_digits, 2, "the digits it will send, echoed");
        let stream = svc
            .start(Request::new(StartRequest {
                protocol_version: PROTOCOL_VERSION,
                run_id,
                start_at_agent_ns: unix_ns(SystemTime::now()),
            }))
            .await
            .map_err(|s| s.to_string())
            .expect("started");
        let events: Vec<_> = stream.into_inner().collect().await;
        assert!(
            events.iter().any(|e| matches!(
                e,
                Ok(RunEvent {
                    event: Some(run_event::Event::Final(_)),
                    ..
                })
            )),
            "no final result"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while !svc.busy_with().is_empty() {
            assert!(Instant::now() < deadline, "still busy");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn a_cut_breaks_the_stream_and_the_events_wait_for_a_reattach() {
        let hub = EventHub::new(Arc::new(Metrics::new(&[])));
        let mut s = hub.attach(0);
        hub.publish(started("a"));
        hub.cut("cut off");
        hub.publish(started("b"));
        assert_eq!(s.next().await.unwrap().unwrap().seq, 1);
        let err = s.next().await.unwrap().unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable);
        assert!(hub.detached_for().is_some());
        hub.finish();
        assert_eq!(drain(hub.attach(1)).await, vec![2]);
    }
}
