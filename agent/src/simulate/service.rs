//! One simulated agent: the real gRPC service (`lockstep.v1.Agent`) with no IO behind it.
//!
//! It answers every call the coordinator makes of a real agent, with the same checks where the
//! coordinator could notice a difference (protocol version, token, busy, unknown volumes, job
//! files the core parser refuses), and streams intervals drawn from the shared pools on the
//! real schedule (one report per interval with all its volumes, from the start instant in its
//! own, possibly offset, clock).

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockstep_proto::v1::agent_server::Agent;
use lockstep_proto::v1::{
    AbortReply, AbortRequest, AttachRequest, Capabilities, ClockProbeReply, ClockProbeRequest,
    DirInterval, DirTotals, FinalResult, HelloReply, HelloRequest, IntervalReport,
    LayoutStatusReply, LayoutStatusRequest, PrepareReply, PrepareRequest, RunEvent, StartRequest,
    Started, Volume, VolumeInterval, VolumeResult, run_event,
};
use lockstep_proto::{PROTOCOL_VERSION, version_mismatch};
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::pool::{Pool, pick};

/// The pools every simulated agent of the process draws from.
pub struct Pools {
    pub read: Pool,
    pub write: Pool,
    /// The slow volume's, from mid-run (`--slow`).
    pub slow_read: Pool,
    pub slow_write: Pool,
    /// One permit: the final results are built one at a time (see `stream_run`).
    pub finals: tokio::sync::Semaphore,
}

/// What happens to a simulated agent mid-run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    Healthy,
    /// Its first volume is 1.5x slower from mid-run (the chokepoint the finder should name).
    Slow,
    /// It stops streaming and closes its server mid-run, as a crashed host would.
    Lost,
}

/// What one simulated agent is.
pub struct SimAgentConfig {
    pub name: String,
    pub volumes: Vec<String>,
    pub token: Option<String>,
    pub grace: Duration,
    /// Its clock minus the real one.
    pub clock_offset_ns: i64,
    pub fate: Fate,
    pub seed: u64,
}

/// A simulated volume's work, from its job file.
#[derive(Debug, Clone)]
struct SimVolume {
    name: String,
    reads: bool,
    writes: bool,
    configured_depth: u32,
}

#[derive(Debug, Clone)]
struct SimRun {
    run_id: String,
    interval: Duration,
    runtime: Duration,
    volumes: Vec<SimVolume>,
    /// Significant digits of the interval histograms sent (`histogram_digits`).
    digits: u8,
}

enum Phase {
    Idle,
    Prepared(SimRun),
    Running {
        run_id: String,
        stop: watch::Sender<bool>,
    },
}

#[derive(Clone)]
pub struct SimAgent {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: SimAgentConfig,
    pools: Arc<Pools>,
    phase: Mutex<Phase>,
    /// Closes this agent's server (`Fate::Lost`).
    lose: watch::Sender<bool>,
}

impl SimAgent {
    pub fn new(cfg: SimAgentConfig, pools: Arc<Pools>, lose: watch::Sender<bool>) -> Self {
        SimAgent {
            inner: Arc::new(Inner {
                cfg,
                pools,
                phase: Mutex::new(Phase::Idle),
                lose,
            }),
        }
    }

    fn now_agent_ns(&self) -> i64 {
        unix_ns() + self.inner.cfg.clock_offset_ns
    }

    fn busy_with(&self) -> String {
        match &*self.inner.phase.lock().unwrap() {
            Phase::Idle => String::new(),
            Phase::Prepared(r) => r.run_id.clone(),
            Phase::Running { run_id, .. } => run_id.clone(),
        }
    }
}

fn unix_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
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

/// Checks one volume's work as a real agent would, short of laying files out: the volume
/// exists, and the job file parses with the core parser (with the coordinator's overrides,
/// which carry the run's `runtime` and `time_based`). Returns the volume and the runtime.
fn check_work(
    volumes: &[String],
    run_id: &str,
    work: &lockstep_proto::v1::VolumeWork,
) -> Result<(SimVolume, Option<Duration>), String> {
    if !volumes.contains(&work.volume) {
        return Err(format!(
            "this agent has no volume '{}' (it has: {})",
            work.volume,
            volumes.join(", ")
        ));
    }
    let origin = std::path::PathBuf::from(format!("{run_id}/{}.fio", work.volume));
    let overrides: Vec<(String, String)> = work
        .overrides
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let jobs = lockstep_core::jobfile::parse_str(&work.jobfile, &origin, None, &overrides)
        .map_err(|e| format!("volume '{}': {e}", work.volume))?;
    let runtime = jobs
        .iter()
        .filter(|j| j.time_based)
        .filter_map(|j| j.runtime.map(|r| r + j.ramp_time + j.startdelay))
        .max();
    let volume = SimVolume {
        name: work.volume.clone(),
        reads: jobs.iter().any(|j| j.pattern.reads()),
        writes: jobs.iter().any(|j| j.pattern.writes()),
        configured_depth: jobs
            .iter()
            .map(|j| j.iodepth.saturating_mul(j.numjobs))
            .fold(0u32, u32::saturating_add),
    };
    Ok((volume, runtime))
}

type EventStream = Pin<Box<dyn Stream<Item = Result<RunEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Agent for SimAgent {
    async fn hello(&self, req: Request<HelloRequest>) -> Result<Response<HelloReply>, Status> {
        check_version(req.get_ref().protocol_version)?;
        let cfg = &self.inner.cfg;
        Ok(Response::new(HelloReply {
            protocol_version: PROTOCOL_VERSION,
            agent_version: env!("CARGO_PKG_VERSION").into(),
            name: cfg.name.clone(),
            hostname: format!("sim-{}", cfg.name),
            labels: [("simulated".to_string(), "true".to_string())]
                .into_iter()
                .collect(),
            volumes: cfg
                .volumes
                .iter()
                .map(|v| Volume {
                    name: v.clone(),
                    path: format!("/simulated/{}/{v}", cfg.name),
                    size_bytes: 100 << 30,
                    kind: "local".into(),
                    provisioned_iops: 0,
                    provisioned_mib_s: 0,
                })
                .collect(),
            capabilities: Some(Capabilities {
                io_uring: false,
                engines: vec!["null".into()],
                exec_allowed: false,
                block_devices_allowed: false,
            }),
            busy_with_run: self.busy_with(),
            grace_ms: cfg.grace.as_millis() as u64,
        }))
    }

    async fn clock_probe(
        &self,
        req: Request<ClockProbeRequest>,
    ) -> Result<Response<ClockProbeReply>, Status> {
        check_version(req.get_ref().protocol_version)?;
        Ok(Response::new(ClockProbeReply {
            agent_unix_ns: self.now_agent_ns(),
        }))
    }

    async fn prepare(
        &self,
        req: Request<PrepareRequest>,
    ) -> Result<Response<PrepareReply>, Status> {
        let req = req.into_inner();
        check_version(req.protocol_version)?;
        let reply = |result: Result<u8, String>, warnings: Vec<String>| {
            Ok(Response::new(crate::daemon::prepare_reply(
                result, warnings,
            )))
        };
        let digits = match crate::daemon::asked_digits(&req) {
            Ok(d) => d,
            Err(e) => return reply(Err(e), Vec::new()),
        };
        let mut phase = self.inner.phase.lock().unwrap();
        match &*phase {
            Phase::Running { run_id, .. } => {
                return Err(Status::failed_precondition(format!(
                    "agent '{}' is busy with run {run_id:?}",
                    self.inner.cfg.name
                )));
            }
            Phase::Prepared(r) if r.run_id != req.run_id => {
                return Err(Status::failed_precondition(format!(
                    "agent '{}' is busy with run {:?}",
                    self.inner.cfg.name, r.run_id
                )));
            }
            _ => {}
        }
        let mut volumes = Vec::new();
        let mut runtime = None;
        for work in &req.work {
            match check_work(&self.inner.cfg.volumes, &req.run_id, work) {
                Ok((v, r)) => {
                    volumes.push(v);
                    runtime = runtime.max(r);
                }
                Err(e) => return reply(Err(e), Vec::new()),
            }
        }
        let Some(runtime) = runtime else {
            return reply(
                Err("a simulated agent runs time_based jobs with a runtime only (the coordinator sets both)".into()),
                Vec::new(),
            );
        };
        let warnings = if req.work.iter().any(|w| !w.faults.is_empty()) {
            vec!["a simulated agent ignores IO-path faults".to_string()]
        } else {
            Vec::new()
        };
        *phase = Phase::Prepared(SimRun {
            run_id: req.run_id,
            interval: Duration::from_millis(req.interval_ms.max(10)),
            runtime,
            volumes,
            digits,
        });
        reply(Ok(digits), warnings)
    }

    /// A simulated agent lays nothing out: its layout is over as soon as it is prepared.
    async fn layout_status(
        &self,
        req: Request<LayoutStatusRequest>,
    ) -> Result<Response<LayoutStatusReply>, Status> {
        check_version(req.get_ref().protocol_version)?;
        Ok(Response::new(LayoutStatusReply {
            bytes_done: 0,
            bytes_total: 0,
            finished: true,
        }))
    }

    type StartStream = EventStream;

    async fn start(&self, req: Request<StartRequest>) -> Result<Response<EventStream>, Status> {
        let req = req.into_inner();
        check_version(req.protocol_version)?;
        let mut phase = self.inner.phase.lock().unwrap();
        let run = match std::mem::replace(&mut *phase, Phase::Idle) {
            Phase::Prepared(r) if r.run_id == req.run_id => r,
            other => {
                *phase = other;
                return Err(Status::failed_precondition(format!(
                    "cannot start run {:?}: it is not the prepared one",
                    req.run_id
                )));
            }
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        *phase = Phase::Running {
            run_id: run.run_id.clone(),
            stop: stop_tx,
        };
        drop(phase);
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(stream_run(
            self.clone(),
            run,
            req.start_at_agent_ns,
            tx,
            stop_rx,
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn abort(&self, req: Request<AbortRequest>) -> Result<Response<AbortReply>, Status> {
        let req = req.into_inner();
        check_version(req.protocol_version)?;
        let mut phase = self.inner.phase.lock().unwrap();
        match &*phase {
            Phase::Running { run_id, stop } if *run_id == req.run_id || req.run_id.is_empty() => {
                let _ = stop.send(true);
            }
            Phase::Prepared(r) if r.run_id == req.run_id || req.run_id.is_empty() => {
                *phase = Phase::Idle;
            }
            _ => {}
        }
        Ok(Response::new(AbortReply {}))
    }

    type AttachStream = EventStream;

    async fn attach(&self, req: Request<AttachRequest>) -> Result<Response<EventStream>, Status> {
        check_version(req.get_ref().protocol_version)?;
        // NOT_FOUND tells the coordinator at once that nothing can be replayed.
        Err(Status::not_found(
            "a simulated agent keeps no events to replay on a re-attach",
        ))
    }

    type MirrorStream =
        Pin<Box<dyn Stream<Item = Result<lockstep_proto::v1::MirrorAck, Status>> + Send>>;

    async fn mirror(
        &self,
        _req: Request<tonic::Streaming<lockstep_proto::v1::MirrorWrite>>,
    ) -> Result<Response<Self::MirrorStream>, Status> {
        Err(Status::unimplemented(
            "a simulated agent has no volume to mirror writes to",
        ))
    }
}

/// Which pool and which uses a direction of a volume draws from in an interval.
struct DirDraw<'a> {
    pool: &'a Pool,
    uses: &'a mut Vec<u32>,
}

/// One volume's counters for the run: how often each pool entry was streamed, per direction
/// and per speed, so the final result is exactly the sum of the intervals.
struct VolumeTally {
    seed: u64,
    uses: [Vec<u32>; 4],
}

/// The run on its own task: wait for the start instant in this agent's clock, stream one
/// report per interval on the real schedule, then the final result (or, for a lost agent,
/// nothing: the stream breaks and the server closes mid-run).
async fn stream_run(
    agent: SimAgent,
    run: SimRun,
    start_at_agent_ns: i64,
    tx: mpsc::Sender<Result<RunEvent, Status>>,
    mut stop: watch::Receiver<bool>,
) {
    let inner = &agent.inner;
    let wait_ns = (start_at_agent_ns - agent.now_agent_ns()).max(0) as u64;
    let t0 = tokio::time::Instant::now() + Duration::from_nanos(wait_ns);
    tokio::time::sleep_until(t0).await;
    let actual = agent.now_agent_ns();
    let mut seq = 0u64;
    let mut send = |event: run_event::Event| {
        seq += 1;
        RunEvent {
            seq,
            event: Some(event),
        }
    };
    for v in &run.volumes {
        let ev = send(run_event::Event::Started(Started {
            actual_start_agent_ns: actual,
            volume: v.name.clone(),
        }));
        if tx.send(Ok(ev)).await.is_err() {
            return end_run(&agent);
        }
    }
    let pools = &inner.pools;
    let mut tallies: Vec<VolumeTally> = (0..run.volumes.len())
        .map(|j| VolumeTally {
            seed: inner.cfg.seed ^ ((j as u64 + 1) << 40),
            uses: std::array::from_fn(|_| Vec::new()),
        })
        .collect();
    let count = run
        .runtime
        .as_nanos()
        .div_ceil(run.interval.as_nanos().max(1)) as u64;
    let mut error = String::new();
    for k in 0..count {
        let end = t0 + run.interval * (k as u32 + 1);
        tokio::select! {
            _ = tokio::time::sleep_until(end) => {}
            _ = stop.wait_for(|s| *s) => {
                error = "aborted by the coordinator".into();
                break;
            }
        }
        if inner.cfg.fate == Fate::Lost && k >= count / 2 {
            let _ = tx
                .send(Err(Status::unavailable("simulated agent lost mid-run")))
                .await;
            let _ = inner.lose.send(true);
            return end_run(&agent);
        }
        let slow_from = if inner.cfg.fate == Fate::Slow {
            count / 2
        } else {
            u64::MAX
        };
        let report = interval_report(&run, pools, &mut tallies, k, slow_from, &agent);
        if tx.send(Ok(send(report))).await.is_err() {
            return end_run(&agent);
        }
    }
    // Every agent of the process ends its run in the same instant. Building 1,000 final
    // results on 1,000 blocking threads at once took the cores from the runtime's workers for
    // long enough that the HTTP/2 keepalive gave up on every connection and the coordinator
    // lost all 1,000 agents at the end of a 60 s run (docs/scale.md). One at a time, the
    // workers keep a core; the coordinator waits for the finals anyway.
    let finals = {
        let (pools, volumes) = (inner.pools.clone(), run.volumes.clone());
        let permit = inner.pools.finals.acquire().await;
        let built =
            tokio::task::spawn_blocking(move || final_volumes(&pools, &volumes, &tallies)).await;
        drop(permit);
        built.unwrap_or_default()
    };
    let ev = send(run_event::Event::Final(FinalResult {
        volumes: finals,
        error,
        faults: Vec::new(),
    }));
    let _ = tx.send(Ok(ev)).await;
    end_run(&agent)
}

fn end_run(agent: &SimAgent) {
    *agent.inner.phase.lock().unwrap() = Phase::Idle;
}

/// Interval `k` of every volume: volume 0 of a slow agent uses the slow pools from `slow_from`.
fn interval_report(
    run: &SimRun,
    pools: &Pools,
    tallies: &mut [VolumeTally],
    k: u64,
    slow_from: u64,
    agent: &SimAgent,
) -> run_event::Event {
    let len_s = run.interval.as_secs_f64();
    let volumes = run
        .volumes
        .iter()
        .zip(tallies.iter_mut())
        .enumerate()
        .map(|(j, (v, tally))| {
            let slow = j == 0 && k >= slow_from;
            let [r, w, sr, sw] = &mut tally.uses;
            let (read, write) = if slow {
                (
                    DirDraw {
                        pool: &pools.slow_read,
                        uses: sr,
                    },
                    DirDraw {
                        pool: &pools.slow_write,
                        uses: sw,
                    },
                )
            } else {
                (
                    DirDraw {
                        pool: &pools.read,
                        uses: r,
                    },
                    DirDraw {
                        pool: &pools.write,
                        uses: w,
                    },
                )
            };
            let mut outstanding = 0.0;
            let mut dir = |on: bool, d: DirDraw<'_>, salt: u64| {
                if !on {
                    return DirInterval::default();
                }
                let e = pick(tally.seed ^ salt, k, d.pool.len());
                if d.uses.is_empty() {
                    d.uses.resize(d.pool.len(), 0);
                }
                d.uses[e] += 1;
                let entry = &d.pool.entries[e];
                // Little's law: IOs in flight = rate x latency.
                outstanding += entry.ios as f64 / len_s * entry.mean_ns / 1e9;
                DirInterval {
                    ios: entry.ios,
                    bytes: entry.ios * 4096,
                    errors: 0,
                    clat_hist: Vec::new(),
                    lat_hist: entry.encoded_at(run.digits).to_vec(),
                    lat_intended_hist: Vec::new(),
                }
            };
            let read = dir(v.reads, read, 0x5EAD);
            let write = dir(v.writes, write, 0x3217E);
            VolumeInterval {
                volume: v.name.clone(),
                read: Some(read),
                write: Some(write),
                outstanding,
                configured_depth: v.configured_depth,
                active_faults: Vec::new(),
            }
        })
        .collect();
    run_event::Event::Interval(IntervalReport {
        index: k,
        end_agent_ns: agent.now_agent_ns(),
        len_ns: run.interval.as_nanos() as u64,
        volumes,
    })
}

/// Each volume's whole-run histograms: the sum of the pool entries it streamed.
fn final_volumes(
    pools: &Pools,
    volumes: &[SimVolume],
    tallies: &[VolumeTally],
) -> Vec<VolumeResult> {
    let encode = |parts: [(&Pool, &Vec<u32>); 2]| {
        let mut h = lockstep_core::stats::latency_histogram();
        for (pool, uses) in parts {
            pool.add_total(&mut h, uses);
        }
        if h.is_empty() {
            return None;
        }
        let bytes = lockstep_proto::histogram::encode(&h).ok()?;
        Some(DirTotals {
            slat_hist: Vec::new(),
            clat_hist: bytes.clone(),
            lat_hist: bytes,
            lat_intended_hist: Vec::new(),
        })
    };
    volumes
        .iter()
        .zip(tallies)
        .map(|(v, t)| {
            let [r, w, sr, sw] = &t.uses;
            VolumeResult {
                volume: v.name.clone(),
                read: encode([(&pools.read, r), (&pools.slow_read, sr)]),
                write: encode([(&pools.write, w), (&pools.slow_write, sw)]),
                ..Default::default()
            }
        })
        .collect()
}
