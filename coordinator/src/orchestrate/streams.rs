//! The run loop's state while agents stream their intervals: one method per event (an agent's
//! event, a broken or re-attached stream, a lost agent, the tick, a stop, the abort deadline).
//!
//! Kept apart from the connections, so the bookkeeping (merging, fault windows, lost agents,
//! stalls, the measured time) is driven by plain values and unit-tested with a fake event
//! stream; `run::execute` owns the sockets and only forwards what arrives.

use std::time::{Duration, Instant};

use lockstep_proto::v1::{RunEvent, VolumeResult as WireVolumeResult, run_event};

use super::run::{PhaseSpec, RunError, RunObserver};
use crate::results::clock::{self, ClockEstimate};
use crate::results::merge::Merger;
use crate::results::store::{StoreWriter, format::encode_point, records_len};
use crate::results::timeline::FaultWindow;
use crate::results::{AgentState, Disconnection, PhaseResult};

/// What the coordinator's agent streams deliver to the run loop.
pub enum Ev {
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
pub const ABORT_WAIT: Duration = Duration::from_secs(2);

/// How long to keep trying to re-attach to an agent whose stream broke: as long as the agent
/// itself keeps running without a coordinator (its grace period, 10 s when it does not say),
/// plus a margin for the agent to notice.
pub fn reattach_window(grace_ms: u64) -> Duration {
    let grace = if grace_ms == 0 { 10_000 } else { grace_ms };
    Duration::from_millis(grace) + Duration::from_secs(5)
}

/// What the coordinator knows of one agent during a run.
#[derive(Debug, Clone)]
pub struct AgentTrack {
    pub name: String,
    pub clock: ClockEstimate,
    pub grace_ms: u64,
    pub state: AgentState,
    pub errors: Vec<String>,
    pub start_lateness_ns: Option<i64>,
    /// Last time anything came from it (for the stall warning).
    pub last_heard: Instant,
    pub stalled_warned: bool,
    /// Times its stream broke, and whether re-attaching worked.
    pub disconnections: Vec<Disconnection>,
    /// Its stream is over (final result, or lost).
    pub finished: bool,
}

impl AgentTrack {
    pub fn new(name: String, clock: ClockEstimate, grace_ms: u64) -> Self {
        AgentTrack {
            name,
            clock,
            grace_ms,
            state: AgentState::Finished,
            errors: Vec::new(),
            start_lateness_ns: None,
            last_heard: Instant::now(),
            stalled_warned: false,
            disconnections: Vec::new(),
            finished: false,
        }
    }

    fn detached(&self) -> bool {
        self.disconnections
            .last()
            .is_some_and(|d| d.reattached_ms.is_none())
    }
}

/// Past this many agents stalling in one tick, they get one line, not one each: a switch or a
/// rack gone quiet in a cluster of 10,000 gave thousands of lines (docs/scale.md).
const STALL_LINES: usize = 5;

/// One agent's stall, as its error and as a line of the live view.
fn stall_message(agent: &str, silent_s: f64) -> String {
    format!("agent {agent} stalled: nothing for {silent_s:.1}s")
}

/// The live view's lines for the agents that went silent in one tick, `(agent, seconds)`.
fn stall_lines(stalled: &[(String, f64)]) -> Vec<String> {
    if stalled.len() <= STALL_LINES {
        return stalled
            .iter()
            .map(|(name, s)| stall_message(name, *s))
            .collect();
    }
    let (lo, hi) = stalled
        .iter()
        .fold((f64::MAX, 0f64), |(lo, hi), &(_, s)| (lo.min(s), hi.max(s)));
    let named: Vec<&str> = stalled
        .iter()
        .take(STALL_LINES)
        .map(|s| s.0.as_str())
        .collect();
    vec![format!(
        "{} agents stalled: nothing for {lo:.1}-{hi:.1}s ({} and {} more; results.json has each)",
        stalled.len(),
        named.join(", "),
        stalled.len() - named.len()
    )]
}

/// The streaming phase of a run.
pub struct Streams<'a> {
    pub tracks: Vec<AgentTrack>,
    pub merger: Merger,
    pub finals: Vec<(String, WireVolumeResult)>,
    pub faults: Vec<FaultWindow>,
    /// Each agent's actual start, in the coordinator's clock.
    pub starts: Vec<i64>,
    /// Agents whose stream has not ended.
    pub pending: usize,
    /// Agents that prepared and were started.
    pub prepared: Vec<usize>,
    /// The synchronized start, coordinator clock (ns since the epoch).
    pub start_ns: i64,
    /// The synchronized start on this process's monotonic clock.
    pub phase_t0: Instant,
    pub interval: Duration,
    pub phases: &'a [PhaseSpec],
    /// The run's data files (`data/`), when it writes any.
    pub store: Option<&'a StoreWriter>,
    pub aborted: bool,
    pub status_reason: String,
    pub abort_deadline: Option<Instant>,
}

impl<'a> Streams<'a> {
    fn interval_ms(&self) -> u64 {
        self.interval.as_millis().max(1) as u64
    }

    fn now_ms(&self) -> u64 {
        self.phase_t0.elapsed().as_millis() as u64
    }

    /// Whether interval `index` counts for results: its middle lies in a measured phase.
    pub fn measured(&self, index: u64) -> bool {
        let ms = self.interval_ms();
        let mid = Duration::from_millis(index * ms + ms / 2);
        self.phases
            .iter()
            .any(|p| p.measure && p.start <= mid && mid < p.start + p.duration)
    }

    pub fn on_event(&mut self, ev: Ev, obs: &mut dyn RunObserver) -> Result<(), RunError> {
        match ev {
            Ev::Event(i, RunEvent { event: Some(e), .. }) => {
                self.tracks[i].last_heard = Instant::now();
                match e {
                    run_event::Event::Started(s) => self.on_started(i, s.actual_start_agent_ns),
                    run_event::Event::Interval(iv) => self.on_interval(i, &iv)?,
                    run_event::Event::Fault(fe) => self.on_fault(i, &fe, obs),
                    run_event::Event::Final(f) => self.on_final(i, f),
                }
            }
            Ev::Event(_, RunEvent { event: None, .. }) => {}
            Ev::Detached(i, why) => self.on_detached(i, why, obs),
            Ev::Reattached(i) => self.on_reattached(i, obs),
            Ev::Ended(i, why) => self.on_ended(i, why, obs),
        }
        Ok(())
    }

    fn on_started(&mut self, i: usize, actual_start_agent_ns: i64) {
        let t = &mut self.tracks[i];
        let actual = t.clock.to_coordinator(actual_start_agent_ns);
        self.starts.push(actual);
        let late = actual - self.start_ns;
        t.start_lateness_ns = Some(t.start_lateness_ns.map_or(late, |l| l.max(late)));
    }

    fn on_interval(
        &mut self,
        i: usize,
        iv: &lockstep_proto::v1::IntervalReport,
    ) -> Result<(), RunError> {
        let counted = self.measured(iv.index);
        let len_ms = iv.len_ns / 1_000_000;
        let name = &self.tracks[i].name;
        let mut stored = Vec::with_capacity(iv.volumes.len());
        let mut errors = Vec::new();
        for (v, r) in iv
            .volumes
            .iter()
            .zip(self.merger.ingest_report(name, iv, counted))
        {
            match r {
                Ok((id, point)) => stored.push((id as u32, v, encode_point(&point, counted))),
                Err(e) => errors.push(e.to_string()),
            }
        }
        self.tracks[i].errors.extend(errors);
        if let (Some(store), Some(first), Some(last)) = (
            self.store,
            stored.iter().map(|s| s.0).min(),
            stored.iter().map(|s| s.0).max(),
        ) {
            let records = match counted {
                true => stored.iter().map(|s| records_len(s.1)).sum(),
                false => 0,
            };
            let mut block = store.block(iv.index, len_ms as u32, first, last - first + 1, records);
            for (id, v, point) in &stored {
                block.add_point(*id, point);
                // Warm-up intervals are on the timeline, not in the histograms (results count
                // only measured ones).
                if counted {
                    block.add(*id, v);
                }
            }
            store.write(block);
        }
        Ok(())
    }

    fn on_fault(
        &mut self,
        i: usize,
        fe: &lockstep_proto::v1::FaultEvent,
        obs: &mut dyn RunObserver,
    ) {
        let w = fault_window(&self.tracks[i], self.start_ns, fe);
        let secs = |ms: u64| ms as f64 / 1000.0;
        let what = match (w.end_ms, w.detail.as_deref()) {
            (None, None | Some("")) => format!("began at t={:.1}s", secs(w.start_ms)),
            (None, Some(d)) => format!("began at t={:.1}s: {d}", secs(w.start_ms)),
            (Some(e), None | Some("")) => format!("ended at t={:.1}s", secs(e)),
            (Some(e), Some(d)) => format!("ended at t={:.1}s: {d}", secs(e)),
        };
        // Once per node and window: an agent-wide fault arrives once per volume.
        let known = self.faults.iter().any(|f| {
            f.node == w.node
                && f.fault == w.fault
                && f.start_ms == w.start_ms
                && f.end_ms == w.end_ms
                && f.detail == w.detail
        });
        if !known {
            obs.message(&format!(
                "fault {} on {}/{} {what}",
                w.fault, w.node, w.volume
            ));
        }
        upsert_fault(&mut self.faults, w);
    }

    fn on_final(&mut self, i: usize, f: lockstep_proto::v1::FinalResult) {
        let t = &mut self.tracks[i];
        if !f.error.is_empty() {
            t.errors.push(f.error.clone());
        }
        for fe in &f.faults {
            let w = fault_window(&self.tracks[i], self.start_ns, fe);
            upsert_fault(&mut self.faults, w);
        }
        let name = self.tracks[i].name.clone();
        for v in f.volumes {
            if !v.error.is_empty() {
                self.tracks[i]
                    .errors
                    .push(format!("volume {}: {}", v.volume, v.error));
            }
            self.finals.push((name.clone(), v));
        }
        self.finish(i);
    }

    fn finish(&mut self, i: usize) -> bool {
        if self.tracks[i].finished {
            return false;
        }
        self.tracks[i].finished = true;
        self.pending -= 1;
        true
    }

    fn on_detached(&mut self, i: usize, why: String, obs: &mut dyn RunObserver) {
        let at_ms = self.now_ms();
        let t = &mut self.tracks[i];
        obs.message(&format!(
            "agent {} disconnected at t={:.1}s ({why}); re-attaching for up to {:.0}s (the agent keeps running for its grace period)",
            t.name,
            at_ms as f64 / 1000.0,
            reattach_window(t.grace_ms).as_secs_f64()
        ));
        t.disconnections.push(Disconnection {
            at_ms,
            reattached_ms: None,
            reason: why,
        });
    }

    fn on_reattached(&mut self, i: usize, obs: &mut dyn RunObserver) {
        let at_ms = self.now_ms();
        let t = &mut self.tracks[i];
        t.last_heard = Instant::now();
        t.stalled_warned = false;
        let name = t.name.clone();
        if let Some(d) = t.disconnections.last_mut() {
            d.reattached_ms = Some(at_ms);
            obs.message(&format!(
                "agent {name} re-attached at t={:.1}s, {:.1}s after it was lost; it replays what it kept",
                at_ms as f64 / 1000.0,
                at_ms.saturating_sub(d.at_ms) as f64 / 1000.0
            ));
        }
    }

    fn on_ended(&mut self, i: usize, why: Option<String>, obs: &mut dyn RunObserver) {
        let now_ms = self.now_ms();
        if !self.finish(i) {
            return;
        }
        let t = &mut self.tracks[i];
        // Lost from when its stream first broke, not from when we gave up.
        let at_ms = t
            .disconnections
            .last()
            .filter(|d| d.reattached_ms.is_none())
            .map_or(now_ms, |d| d.at_ms);
        let reason = why.unwrap_or_else(|| "stream ended without a final result".into());
        obs.message(&format!(
            "agent {} lost at t={:.1}s: {reason}",
            t.name,
            at_ms as f64 / 1000.0
        ));
        self.merger.mark_lost(&t.name, at_ms);
        t.state = AgentState::Lost { at_ms, reason };
    }

    /// About once an interval: the live view, and a warning for an agent that went silent.
    pub fn on_tick(&mut self, obs: &mut dyn RunObserver) {
        obs.tick(&self.merger, self.phase_t0.elapsed());
        let silent_after = self.interval * 3 + Duration::from_secs(2);
        let started = Instant::now() > self.phase_t0;
        let mut stalled = Vec::new();
        for &i in &self.prepared {
            let t = &mut self.tracks[i];
            if !t.finished
                && !t.detached()
                && !t.stalled_warned
                && started
                && t.last_heard.elapsed() > silent_after
            {
                t.stalled_warned = true;
                let silent = t.last_heard.elapsed().as_secs_f64();
                t.errors.push(stall_message(&t.name, silent));
                stalled.push((t.name.clone(), silent));
            }
        }
        for line in stall_lines(&stalled) {
            obs.message(&line);
        }
    }

    /// A stop request (`why` names it): the caller tells the agents to abort; their final
    /// results are awaited until `ABORT_WAIT` from now.
    pub fn on_stop(&mut self, why: &str, obs: &mut dyn RunObserver) {
        self.aborted = true;
        self.status_reason = format!("stopped by {why}");
        obs.message("stopping: telling every agent to abort (partial results are kept)");
        // Counted from the stop, not from the answers: a loaded agent is slow to answer.
        self.abort_deadline = Some(Instant::now() + ABORT_WAIT);
    }

    /// The abort's wait is over: agents without a final result are lost from now.
    pub fn on_abort_deadline(&mut self, obs: &mut dyn RunObserver) {
        let reason = format!(
            "no final result within {:.0} s of the abort: its figures end with its last interval",
            ABORT_WAIT.as_secs_f64()
        );
        let at_ms = self.now_ms();
        for &i in &self.prepared {
            let t = &mut self.tracks[i];
            if !t.finished {
                obs.message(&format!("agent {}: {reason}", t.name));
                self.merger.mark_lost(&t.name, at_ms);
                t.state = AgentState::Lost {
                    at_ms,
                    reason: reason.clone(),
                };
            }
        }
    }

    /// Measured time: the measured phases, cut short where the run was stopped.
    pub fn measured_ms(&self) -> u64 {
        let ran_ms = self.now_ms();
        self.phases
            .iter()
            .filter(|p| p.measure)
            .map(|p| {
                let s = p.start.as_millis() as u64;
                let e = (p.start + p.duration).as_millis() as u64;
                e.min(if self.aborted { ran_ms } else { e })
                    .saturating_sub(s)
            })
            .sum()
    }

    /// The phases as run, with the measured start skew.
    pub fn phase_results(&self) -> (Vec<PhaseResult>, Option<i64>) {
        let skew = clock::skew_ns(&self.starts);
        let phases = self
            .phases
            .iter()
            .map(|p| PhaseResult {
                name: p.name.clone(),
                measured: p.measure,
                start_unix_ms: (self.start_ns / 1_000_000) + p.start.as_millis() as i64,
                duration_ms: p.duration.as_millis() as u64,
                start_skew_ns: skew,
            })
            .collect();
        (phases, skew)
    }
}

/// A fault event in the coordinator's clock, ms since the synchronized start.
fn fault_window(t: &AgentTrack, start_ns: i64, fe: &lockstep_proto::v1::FaultEvent) -> FaultWindow {
    let to_ms = |ns: i64| ((t.clock.to_coordinator(ns) - start_ns).max(0) / 1_000_000) as u64;
    FaultWindow {
        node: t.name.clone(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_proto::v1::{
        DirInterval, FaultEvent, FinalResult, IntervalReport, Started, VolumeInterval,
    };

    /// What the live view was told.
    #[derive(Default)]
    struct Log(Vec<String>);

    impl RunObserver for Log {
        fn message(&mut self, text: &str) {
            self.0.push(text.to_string());
        }
        fn phase_started(&mut self, _: &str, _: Duration, _: bool) {}
        fn tick(&mut self, _: &Merger, _: Duration) {}
        fn phase_finished(&mut self, _: &str) {}
    }

    #[test]
    fn a_few_stalled_agents_get_a_line_each_and_many_get_one_line() {
        let few = [("a1".to_string(), 17.46), ("a2".to_string(), 18.0)];
        assert_eq!(
            stall_lines(&few),
            [
                "agent a1 stalled: nothing for 17.5s",
                "agent a2 stalled: nothing for 18.0s"
            ]
        );
        let many: Vec<(String, f64)> = (0..7)
            .map(|i| (format!("agent-{i}"), 17.0 + i as f64 / 10.0))
            .collect();
        assert_eq!(
            stall_lines(&many),
            [
                "7 agents stalled: nothing for 17.0-17.6s (agent-0, agent-1, agent-2, agent-3, \
              agent-4 and 2 more; results.json has each)"
            ]
        );
    }

    fn phases() -> Vec<PhaseSpec> {
        vec![
            PhaseSpec {
                name: "warmup".into(),
                start: Duration::ZERO,
                duration: Duration::from_secs(2),
                measure: false,
            },
            PhaseSpec {
                name: "measure".into(),
                start: Duration::from_secs(2),
                duration: Duration::from_secs(8),
                measure: true,
            },
        ]
    }

    fn streams<'a>(phases: &'a [PhaseSpec], store: Option<&'a StoreWriter>) -> Streams<'a> {
        let names = ["a1", "a2"];
        let infos: Vec<_> = names
            .iter()
            .map(|n| crate::results::merge::PlannedVolume {
                node: n.to_string(),
                volume: "data".into(),
                role: "w".into(),
                model: None,
                target_iops: None,
            })
            .collect();
        Streams {
            tracks: names
                .iter()
                .map(|n| AgentTrack::new(n.to_string(), ClockEstimate::default(), 0))
                .collect(),
            merger: Merger::new(1000, &infos),
            finals: Vec::new(),
            faults: Vec::new(),
            starts: Vec::new(),
            pending: 2,
            prepared: vec![0, 1],
            start_ns: 1_000_000_000,
            phase_t0: Instant::now(),
            interval: Duration::from_secs(1),
            phases,
            store,
            aborted: false,
            status_reason: String::new(),
            abort_deadline: None,
        }
    }

    fn event(i: usize, e: run_event::Event) -> Ev {
        Ev::Event(
            i,
            RunEvent {
                seq: 0,
                event: Some(e),
            },
        )
    }

    fn interval(index: u64, ios: u64) -> run_event::Event {
        run_event::Event::Interval(IntervalReport {
            index,
            end_agent_ns: 0,
            len_ns: 1_000_000_000,
            volumes: vec![VolumeInterval {
                volume: "data".into(),
                read: Some(DirInterval {
                    ios,
                    bytes: ios * 4096,
                    ..Default::default()
                }),
                ..Default::default()
            }],
        })
    }

    #[test]
    fn only_intervals_whose_middle_is_in_a_measured_phase_count() {
        let p = phases();
        let s = streams(&p, None);
        assert!(!s.measured(0) && !s.measured(1));
        assert!(s.measured(2) && s.measured(9));
        assert!(!s.measured(10));
    }

    #[test]
    fn a_broken_stream_that_never_comes_back_is_lost_from_when_it_broke() {
        let p = phases();
        let mut s = streams(&p, None);
        let mut log = Log::default();
        s.on_event(event(0, interval(2, 100)), &mut log).unwrap();
        s.on_event(Ev::Detached(1, "connection lost".into()), &mut log)
            .unwrap();
        let broke_at = s.tracks[1].disconnections[0].at_ms;
        s.on_event(Ev::Ended(1, Some("gave up".into())), &mut log)
            .unwrap();
        // A second end of the same stream changes nothing.
        s.on_event(Ev::Ended(1, None), &mut log).unwrap();
        assert_eq!(s.pending, 1);
        match &s.tracks[1].state {
            AgentState::Lost { at_ms, reason } => {
                assert_eq!(*at_ms, broke_at);
                assert_eq!(reason, "gave up");
            }
            other => panic!("{other:?}"),
        }
        assert!(
            log.0.iter().any(|m| m.starts_with("agent a2 lost at")),
            "{:?}",
            log.0
        );
    }

    #[test]
    fn a_final_result_ends_a_stream_once_and_keeps_its_volumes_and_errors() {
        let p = phases();
        let mut s = streams(&p, None);
        let mut log = Log::default();
        let fin = FinalResult {
            volumes: vec![lockstep_proto::v1::VolumeResult {
                volume: "data".into(),
                error: "device stopped answering".into(),
                ..Default::default()
            }],
            error: String::new(),
            faults: Vec::new(),
        };
        s.on_event(event(0, run_event::Event::Final(fin)), &mut log)
            .unwrap();
        s.on_event(Ev::Ended(0, None), &mut log).unwrap();
        assert_eq!(s.pending, 1);
        assert!(matches!(s.tracks[0].state, AgentState::Finished));
        assert_eq!(s.finals.len(), 1);
        assert_eq!(
            s.tracks[0].errors,
            ["volume data: device stopped answering"]
        );
    }

    #[test]
    fn a_fault_that_begins_and_ends_is_one_window_announced_per_change() {
        let p = phases();
        let mut s = streams(&p, None);
        let mut log = Log::default();
        let fe = |end: i64| {
            run_event::Event::Fault(FaultEvent {
                volume: "data".into(),
                fault: "pause".into(),
                start_agent_ns: 3_000_000_000,
                end_agent_ns: end,
                detail: String::new(),
            })
        };
        s.on_event(event(0, fe(0)), &mut log).unwrap();
        s.on_event(event(0, fe(0)), &mut log).unwrap();
        s.on_event(event(0, fe(5_000_000_000)), &mut log).unwrap();
        assert_eq!(s.faults.len(), 1);
        assert_eq!(
            (s.faults[0].start_ms, s.faults[0].end_ms),
            (2000, Some(4000))
        );
        let said: Vec<_> = log
            .0
            .iter()
            .filter(|m| m.starts_with("fault pause"))
            .collect();
        assert_eq!(said.len(), 2, "{said:?}");
    }

    #[test]
    fn after_a_stop_the_agents_without_a_final_result_are_lost_at_the_deadline() {
        let p = phases();
        let mut s = streams(&p, None);
        let mut log = Log::default();
        s.on_event(
            event(
                0,
                run_event::Event::Started(Started {
                    actual_start_agent_ns: 1_000_500_000,
                    ..Default::default()
                }),
            ),
            &mut log,
        )
        .unwrap();
        s.on_stop("SIGTERM", &mut log);
        assert!(s.aborted && s.abort_deadline.is_some());
        assert_eq!(s.status_reason, "stopped by SIGTERM");
        s.on_abort_deadline(&mut log);
        for t in &s.tracks {
            assert!(matches!(t.state, AgentState::Lost { .. }), "{t:?}");
        }
        // Stopped right away: the measured phase was cut to (almost) nothing.
        assert!(s.measured_ms() < 8000);
        assert_eq!(s.tracks[0].start_lateness_ns, Some(500_000));
    }
}
