//! The life of a started run, on its own thread: every volume's jobs on threads of their own,
//! agent-wide faults on theirs, a watchdog for the coordinator's presence, then the final
//! result. `ActiveRun` holds what those threads share; `run` sequences its steps:
//!
//! ```text
//! start (state: running) → scheduled IO-path fault events
//!   → run_volumes: watchdog, agent-wide faults, one thread per volume (run_volume), joined
//!   → finish: the final result (with the run's error), the agent idle again
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use lockstep_proto::v1::{DirTotals, FaultEvent, FinalResult, RunEvent, VolumeResult, run_event};

use super::aggregate::{VolumeAggregator, unix_ns};
use super::{EventHub, Phase, PreparedVolume, Shared, agent_faults, panic_message};
use crate::fault::FaultSpec;
use crate::report::fio_json;
use crate::runner::{self, CloneFaults, RunOptions};
use crate::stats::DirStats;

/// A mirrored volume's link settings and the figures its clones' links add up into.
type MirrorSetup = (
    crate::mirror::LinkConfig,
    Arc<Mutex<crate::mirror::MirrorStats>>,
);

/// What `Prepare` and `Start` said about a run.
pub(super) struct RunSetup {
    pub(super) run_id: String,
    /// The synchronized start, in this agent's clock.
    pub(super) start_at: SystemTime,
    pub(super) keep_files: bool,
    /// Reporting interval.
    pub(super) interval: Duration,
    /// Significant digits of the interval histograms sent (`histogram_digits`).
    pub(super) histogram_digits: u8,
}

/// A started run: what its threads share.
struct ActiveRun {
    shared: Arc<Shared>,
    setup: RunSetup,
    hub: Arc<EventHub>,
    /// Set to stop every volume's IO (an abort, a shutdown, the watchdog).
    stop: Arc<AtomicBool>,
    /// Set by the watchdog: nobody listened for longer than the grace period.
    lost_coordinator: Arc<AtomicBool>,
    /// Set once every volume is done: the watchdog and the agent-wide faults end.
    done: Arc<AtomicBool>,
}

pub(super) fn run(
    shared: Arc<Shared>,
    setup: RunSetup,
    volumes: Vec<PreparedVolume>,
    hub: Arc<EventHub>,
    stop: Arc<AtomicBool>,
) {
    let run = ActiveRun::start(shared, setup, hub, stop);
    let mut fault_events = run.scheduled_fault_events(&volumes);
    let results = run.run_volumes(volumes, &mut fault_events);
    run.finish(results, fault_events);
}

impl ActiveRun {
    fn start(
        shared: Arc<Shared>,
        setup: RunSetup,
        hub: Arc<EventHub>,
        stop: Arc<AtomicBool>,
    ) -> Self {
        shared.metrics.set_state(2);
        ActiveRun {
            shared,
            setup,
            hub,
            stop,
            lost_coordinator: Arc::new(AtomicBool::new(false)),
            done: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The IO-path faults' windows as scheduled from the start instant. Agent-wide faults
    /// are recorded as they actually happen (`run_volumes`).
    fn scheduled_fault_events(&self, volumes: &[PreparedVolume]) -> Vec<FaultEvent> {
        let start_at = self.setup.start_at;
        let mut fault_events = Vec::new();
        for v in volumes {
            for f in v.faults.iter().filter(|f| !f.kind.is_agent_wide()) {
                let start = start_at + Duration::from_millis(f.at_ms);
                fault_events.push(FaultEvent {
                    volume: v.name.clone(),
                    fault: f.name().to_string(),
                    start_agent_ns: unix_ns(start),
                    end_agent_ns: f
                        .duration_ms
                        .map_or(0, |d| unix_ns(start + Duration::from_millis(d))),
                    detail: String::new(),
                });
            }
        }
        fault_events
    }

    /// The run's volumes as (name, configured path), for agent-wide faults.
    fn volume_paths(&self, volumes: &[PreparedVolume]) -> Vec<(String, String)> {
        volumes
            .iter()
            .map(|v| {
                let path = self
                    .shared
                    .cfg
                    .volumes
                    .iter()
                    .find(|c| c.name == v.name)
                    .map(|c| c.path.display().to_string())
                    .unwrap_or_default();
                (v.name.clone(), path)
            })
            .collect()
    }

    /// Runs every volume on a thread of its own, with the watchdog and the agent-wide faults
    /// beside them; adds the agent-wide faults' events to `fault_events`.
    fn run_volumes(
        &self,
        volumes: Vec<PreparedVolume>,
        fault_events: &mut Vec<FaultEvent>,
    ) -> Vec<VolumeResult> {
        let agent_wide = agent_faults::collect(volumes.iter().map(|v| v.faults.as_slice()));
        let start = self.start_instant();
        let clock: crate::fault::AgentClock =
            Arc::new(move || Instant::now().saturating_duration_since(start).as_nanos() as u64);
        let instances =
            crate::fault::instance_gates(volumes.iter().map(|v| v.faults.as_slice()), clock);
        let instances = &instances;
        let volume_paths = self.volume_paths(&volumes);
        std::thread::scope(|scope| {
            scope.spawn(|| self.watchdog());
            // Agent-wide faults, each on a thread of its own, timed from the start instant.
            let agent_fault_threads: Vec<_> = agent_wide
                .into_iter()
                .map(|f| {
                    let ctx = agent_faults::Context {
                        hub: self.hub.clone(),
                        cut_off: self.shared.cut_off.clone(),
                        run_id: self.setup.run_id.clone(),
                        agent: self.shared.cfg.name.clone(),
                        volumes: volume_paths.clone(),
                        done: self.done.clone(),
                    };
                    scope.spawn(move || agent_faults::run(f, start, ctx))
                })
                .collect();
            let handles: Vec<_> = volumes
                .into_iter()
                .map(|v| {
                    (
                        v.name.clone(),
                        scope.spawn(move || self.run_volume(v, instances)),
                    )
                })
                .collect();
            // A panicking volume thread is that volume's error, not the run's end: panicking
            // here would leave the watchdog waiting for `done` and the scope (and the agent,
            // busy with this run) waiting for the watchdog, for ever.
            let results = handles
                .into_iter()
                .map(|(volume, h)| {
                    h.join().unwrap_or_else(|panic| {
                        let error = format!("the volume's run failed: {}", panic_message(&*panic));
                        tracing::error!("volume {volume}: {error}");
                        VolumeResult {
                            volume,
                            error,
                            ..VolumeResult::default()
                        }
                    })
                })
                .collect();
            self.done.store(true, Ordering::Relaxed);
            for t in agent_fault_threads {
                match t.join() {
                    Ok(events) => fault_events.extend(events),
                    Err(panic) => {
                        tracing::error!("a fault thread failed: {}", panic_message(&*panic))
                    }
                }
            }
            results
        })
    }

    /// Nobody listening for longer than the grace period stops the IO.
    fn watchdog(&self) {
        let grace = self.shared.cfg.grace;
        while !self.done.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
            if let Some(d) = self.hub.detached_for() {
                if d > grace && !self.stop.load(Ordering::Relaxed) {
                    tracing::error!(
                        "no coordinator for {:.1}s (grace {:.1}s): stopping IO",
                        d.as_secs_f64(),
                        grace.as_secs_f64()
                    );
                    self.lost_coordinator.store(true, Ordering::Relaxed);
                    self.stop.store(true, Ordering::Relaxed);
                }
            }
        }
    }

    /// One volume's jobs, with its IO-path faults and kernel throttle, and its result.
    /// `instances`: the agent's shared `instance` gates (`fault::instance_gates`).
    fn run_volume(
        &self,
        v: PreparedVolume,
        instances: &[crate::fault::InstanceShare],
    ) -> VolumeResult {
        let faults = Arc::new(v.faults);
        let names = faults.clone();
        let aggregator = VolumeAggregator::new(
            v.name.clone(),
            v.run.jobs().iter().map(|j| j.numjobs as usize).sum(),
            v.configured_depth,
            v.open_loop,
            self.setup.histogram_digits,
            Box::new(move |t_ms| {
                crate::fault::active_faults(&names, t_ms * 1_000_000)
                    .into_iter()
                    .map(String::from)
                    .collect()
            }),
            self.hub.clone(),
        );
        let throttle = v.throttle.clone();
        let limits_done = Arc::new(AtomicBool::new(false));
        let io_started = Arc::new(std::sync::OnceLock::new());
        if let Some(t) = &throttle {
            schedule_throttle(
                t.clone(),
                &faults,
                io_started.clone(),
                self.stop.clone(),
                limits_done.clone(),
            );
        }
        let mirror = v.mirror.as_ref().map(|m| self.mirror_of(&v.name, m));
        let opts = RunOptions {
            stop: self.stop.clone(),
            keep_files: self.setup.keep_files,
            interval: self.setup.interval,
            start_at: Some(self.setup.start_at),
            sink: Some(Arc::new(StartTap {
                inner: aggregator,
                started: io_started,
            })),
            faults: self.clone_faults(faults, throttle, instances, mirror.clone()),
            ..RunOptions::default()
        };
        let report = v.run.execute(&opts);
        limits_done.store(true, Ordering::Relaxed);
        let mut result = volume_result(v.name, v.open_loop, &report);
        if let (Some((cfg, sink)), Some(m)) = (mirror, &v.mirror) {
            let stats = sink.lock().unwrap();
            result.mirror = Some(stats.to_wire(&cfg.backup_agent, m.sync, m.delay_us));
        }
        result
    }

    /// The synchronized start as this host's `Instant`: the shared gates' clock, the agent-wide
    /// faults and the mirror links all count from it.
    fn start_instant(&self) -> Instant {
        let until = self.setup.start_at.duration_since(SystemTime::now());
        Instant::now() + until.unwrap_or_default()
    }

    /// A mirrored volume's link settings (each clone starts its own link) and the figures its
    /// links add up into.
    fn mirror_of(&self, volume: &str, m: &lockstep_proto::v1::MirrorTarget) -> MirrorSetup {
        let cfg = crate::mirror::LinkConfig {
            run_id: self.setup.run_id.clone(),
            primary: format!("{}/{volume}", self.shared.cfg.name),
            backup_agent: m.backup_agent.clone(),
            backup_address: m.backup_address.clone(),
            tls: self.shared.tls.clone(),
            backup_volume: m.backup_volume.clone(),
            sync: m.sync,
            delay: Duration::from_micros(m.delay_us),
            failover_after: (m.failover_after_ms > 0)
                .then(|| Duration::from_millis(m.failover_after_ms)),
            token: self.shared.cfg.token.clone(),
            origin: self.start_instant(),
            keep_files: self.setup.keep_files,
            catch_up: !m.no_catch_up,
            stop: self.stop.clone(),
        };
        (
            cfg,
            Arc::new(Mutex::new(crate::mirror::MirrorStats::default())),
        )
    }

    /// The faults of each of a volume's clones: `None` when the volume has none.
    fn clone_faults(
        &self,
        faults: Arc<Vec<FaultSpec>>,
        throttle: Option<Arc<crate::fault::kernel::ThrottleGroup>>,
        instances: &[crate::fault::InstanceShare],
        mirror: Option<MirrorSetup>,
    ) -> Option<Arc<runner::FaultFactory>> {
        if faults.is_empty() && mirror.is_none() {
            return None;
        }
        let fault_seed = unix_ns(self.setup.start_at) as u64;
        // One gate per volume, shared by its clones: numjobs=4 on an emulated 3,000-IOPS
        // volume still gets 3,000 IOPS in all, not 12,000. An instance's gate is shared wider,
        // by every volume of the agent that carries it.
        let gate = crate::fault::build_volume_gate(&faults, fault_seed, instances)
            .map(crate::fault::SharedGate::new);
        Some(Arc::new(move |job: usize, clone: u32| {
            let seed = fault_seed ^ ((job as u64) << 32) ^ clone as u64;
            CloneFaults {
                gate: gate
                    .clone()
                    .map(|g| Box::new(g) as Box<dyn crate::fault::IoGate>),
                fault: crate::fault::build_fault(&faults, seed),
                enter: throttle.clone().map(|t| {
                    Box::new(move || t.enter_current_thread().map_err(|e| e.to_string()))
                        as Box<dyn FnOnce() -> Result<(), String> + Send>
                }),
                mirror: mirror.as_ref().and_then(|(cfg, sink)| {
                    match crate::mirror::MirrorLink::start(cfg.clone(), sink.clone()) {
                        Ok(link) => Some(Box::new(link) as Box<dyn runner::MirrorHook>),
                        Err(e) => {
                            let mut s = sink.lock().unwrap();
                            s.link_error = format!("cannot start the mirror link: {e}");
                            None
                        }
                    }
                }),
            }
        }))
    }

    /// Publishes the final result with the run's error, and the agent is idle again.
    fn finish(self, results: Vec<VolumeResult>, fault_events: Vec<FaultEvent>) {
        let shared = &self.shared;
        let error = if self.lost_coordinator.load(Ordering::Relaxed) {
            format!(
                "coordinator lost for longer than the grace period ({:.1}s): IO stopped",
                shared.cfg.grace.as_secs_f64()
            )
        } else if self.stop.load(Ordering::Relaxed) {
            "aborted".to_string()
        } else {
            String::new()
        };
        let hub = &self.hub;
        hub.publish(RunEvent {
            seq: 0,
            event: Some(run_event::Event::Final(FinalResult {
                volumes: results,
                error,
                faults: fault_events,
            })),
        });
        hub.finish();
        *shared.last_run.lock().unwrap() = Some((self.setup.run_id, hub.clone()));
        *shared.phase.lock().unwrap() = Phase::Idle;
        shared.metrics.run_ended();
    }
}

/// A volume's result from its jobs' reports: the first job's error, totals, fio JSON, stuck
/// IOs and verification.
fn volume_result(
    volume: String,
    open_loop: bool,
    report: &crate::report::RunReport,
) -> VolumeResult {
    let error = report
        .jobs
        .iter()
        .find_map(|j| j.error.clone())
        .unwrap_or_default();
    let mut totals = [DirStats::new(open_loop), DirStats::new(open_loop)];
    for j in &report.jobs {
        totals[0].merge(&j.stats.dirs[0]);
        totals[1].merge(&j.stats.dirs[1]);
    }
    VolumeResult {
        volume,
        fio_json: fio_json::to_string(report),
        error,
        verify_json: verify_json(report),
        read: Some(dir_totals(&totals[0])),
        write: Some(dir_totals(&totals[1])),
        stuck: stuck_ios(report),
        stuck_count: report.jobs.iter().map(|j| j.stats.stuck_count).sum(),
        mirror: None,
    }
}

/// The run thread itself panicked (outside the volumes' threads): the coordinator still gets
/// a final result saying so, and the agent is idle again, not busy for ever with a run that
/// no longer exists.
pub(super) fn run_panicked(shared: &Shared, hub: &Arc<EventHub>, run_id: String, message: String) {
    tracing::error!("run {run_id} failed: {message}");
    hub.publish(RunEvent {
        seq: 0,
        event: Some(run_event::Event::Final(FinalResult {
            volumes: Vec::new(),
            error: format!("the agent's run failed: {message}"),
            faults: Vec::new(),
        })),
    });
    hub.finish();
    *shared.last_run.lock().unwrap_or_else(|e| e.into_inner()) = Some((run_id, hub.clone()));
    *shared.phase.lock().unwrap_or_else(|e| e.into_inner()) = Phase::Idle;
    shared.metrics.set_state(0);
}

/// Forwards to the volume's aggregator and notes when its IO actually began: the clones'
/// intervals and IO-path fault windows count from that instant, so the kernel throttle's
/// windows must too (an agent that starts late under load would otherwise throttle the wrong
/// intervals).
struct StartTap<S: runner::IntervalSink> {
    inner: S,
    /// On the monotonic clock, as the clones time their intervals and IO-path faults (the
    /// wall clock may be stepped or slewed during a run).
    started: Arc<std::sync::OnceLock<Instant>>,
}

impl<S: runner::IntervalSink> runner::IntervalSink for StartTap<S> {
    fn on_interval(&self, snapshot: runner::IntervalSnapshot<'_>) {
        self.inner.on_interval(snapshot)
    }
    fn on_group_started(&self, groupid: u32, at: SystemTime) {
        if groupid == 0 {
            let _ = self.started.set(Instant::now());
        }
        self.inner.on_group_started(groupid, at)
    }
    fn on_clone_done(&self, job_index: usize, clone: u32) {
        self.inner.on_clone_done(job_index, clone)
    }
}

/// Writes a volume's `kernel_throttle` limits at each window edge (the lowest limit per field
/// among the open windows), counted from when the volume's IO began, until its jobs are done
/// or the run is stopped; the cgroup removes its limits when it is dropped.
fn schedule_throttle(
    group: Arc<crate::fault::kernel::ThrottleGroup>,
    faults: &[FaultSpec],
    io_started: Arc<std::sync::OnceLock<Instant>>,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
) {
    let specs: Vec<(u64, Option<u64>, crate::fault::KernelThrottleSpec)> = faults
        .iter()
        .filter_map(|f| match &f.kind {
            crate::fault::FaultKind::KernelThrottle(k) => {
                Some((f.at_ms, f.duration_ms.map(|d| f.at_ms + d), k.clone()))
            }
            _ => None,
        })
        .collect();
    let mut edges: Vec<u64> = specs
        .iter()
        .flat_map(|(at, end, _)| std::iter::once(*at).chain(*end))
        .collect();
    edges.sort_unstable();
    edges.dedup();
    let spawned = std::thread::Builder::new()
        .name("kernel-throttle".into())
        .spawn(move || {
            let start_at = loop {
                if done.load(Ordering::Relaxed) || stop.load(Ordering::Relaxed) {
                    return;
                }
                match io_started.get() {
                    Some(t) => break *t,
                    None => std::thread::sleep(Duration::from_millis(1)),
                }
            };
            for t_ms in edges {
                let at = start_at + Duration::from_millis(t_ms);
                loop {
                    if done.load(Ordering::Relaxed) || stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let left = at.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    std::thread::sleep(left.min(Duration::from_millis(20)));
                }
                let limits = crate::fault::kernel::active_limits(&specs, t_ms);
                if let Err(e) = group.set(limits.as_ref()) {
                    tracing::error!("{e}");
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!("kernel_throttle: cannot start its scheduler thread: {e}");
    }
}

/// The volume's verification findings merged over its jobs (`VerifyReport` as JSON), or
/// empty when no job verified.
fn verify_json(report: &crate::report::RunReport) -> String {
    let mut merged: Option<crate::verify::VerifyReport> = None;
    for r in report.jobs.iter().filter_map(|j| j.verify.as_ref()) {
        merged.get_or_insert_with(Default::default).merge(r);
    }
    merged
        .map(|m| serde_json::to_string(&m).unwrap_or_default())
        .unwrap_or_default()
}

fn stuck_ios(report: &crate::report::RunReport) -> Vec<lockstep_proto::v1::StuckIo> {
    report
        .jobs
        .iter()
        .flat_map(|j| &j.stats.stuck)
        .map(|s| lockstep_proto::v1::StuckIo {
            offset: s.offset,
            len: s.len,
            direction: s.direction.name().into(),
            start_ms: s.start_ms,
            latency_ms: s.latency_ms,
            file: s.file.clone(),
            completed: s.completed,
        })
        .collect()
}

fn dir_totals(d: &DirStats) -> DirTotals {
    let enc = |h: &hdrhistogram::Histogram<u64>| {
        if h.is_empty() {
            Vec::new()
        } else {
            lockstep_proto::histogram::encode(h).unwrap_or_default()
        }
    };
    DirTotals {
        slat_hist: enc(&d.slat),
        clat_hist: enc(&d.clat),
        lat_hist: enc(&d.lat),
        lat_intended_hist: d.lat_intended.as_ref().map(enc).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tokio_stream::StreamExt;

    use super::*;
    use crate::daemon::{AgentService, DaemonConfig};

    fn service(grace: Duration) -> AgentService {
        AgentService::new(DaemonConfig {
            name: "t".into(),
            labels: BTreeMap::new(),
            volumes: Vec::new(),
            token: None,
            grace,
            allow_block_devices: false,
            allow_exec: false,
        })
    }

    fn setup() -> RunSetup {
        RunSetup {
            run_id: "r".into(),
            start_at: SystemTime::now(),
            keep_files: false,
            interval: Duration::from_millis(100),
            histogram_digits: 3,
        }
    }

    /// The final result is the last event of the run's stream.
    async fn final_error(hub: &EventHub) -> String {
        let events: Vec<_> = hub.attach(0).collect().await;
        match events.last() {
            Some(Ok(RunEvent {
                event: Some(run_event::Event::Final(f)),
                ..
            })) => f.error.clone(),
            other => panic!("no final result: {other:?}"),
        }
    }

    /// Nobody attached for longer than the grace period: the watchdog stops the run's IO and
    /// `finish` says why; the agent is idle again.
    #[tokio::test]
    async fn the_watchdog_stops_a_run_nobody_listens_to() {
        let svc = service(Duration::ZERO);
        let hub = EventHub::new(svc.shared.metrics.clone());
        let stop = Arc::new(AtomicBool::new(false));
        let run = ActiveRun::start(svc.shared.clone(), setup(), hub.clone(), stop.clone());
        std::thread::scope(|scope| {
            scope.spawn(|| run.watchdog());
            let t = Instant::now();
            while !stop.load(Ordering::Relaxed) && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(10));
            }
            run.done.store(true, Ordering::Relaxed);
        });
        assert!(
            stop.load(Ordering::Relaxed),
            "the watchdog did not stop the IO"
        );
        assert!(run.lost_coordinator.load(Ordering::Relaxed));
        run.finish(Vec::new(), Vec::new());
        assert_eq!(
            final_error(&hub).await,
            "coordinator lost for longer than the grace period (0.0s): IO stopped"
        );
        assert_eq!(svc.busy_with(), "");
    }

    /// With a coordinator attached the watchdog lets the run be: a run (here of no volumes)
    /// ends with no error, or "aborted" when it was stopped.
    #[tokio::test]
    async fn a_listened_to_run_ends_clean_or_aborted() {
        for (stopped, error) in [(false, ""), (true, "aborted")] {
            let svc = service(Duration::from_secs(60));
            let hub = EventHub::new(svc.shared.metrics.clone());
            let _listening = hub.attach(0);
            let stop = Arc::new(AtomicBool::new(stopped));
            run(svc.shared.clone(), setup(), Vec::new(), hub.clone(), stop);
            assert_eq!(final_error(&hub).await, error);
            assert_eq!(svc.busy_with(), "");
        }
    }
}
