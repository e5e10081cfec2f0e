//! Turns the runner's per-clone intervals into one interval report per volume.
//!
//! Every clone of a volume's jobs closes its interval k at about the same instant (their timed
//! parts start together after the start barrier), so interval k of the volume is the merge of
//! interval k of every clone: complete once each clone still running has reported k. A clone
//! that finished reports nothing more and is not waited for. Histograms are merged (exact), not
//! averaged, and shipped as HdrHistogram V2 (`lockstep_proto::histogram::encode`).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockstep_proto::histogram::encode_at;
use lockstep_proto::v1::{
    DirInterval, IntervalReport, RunEvent, Started, VolumeInterval, run_event,
};

use crate::runner::{IntervalSink, IntervalSnapshot};
use crate::stats::DirStats;

/// Where finished volume intervals go (the daemon's event hub), plus the live metrics.
pub trait VolumeEvents: Send + Sync {
    fn send(&self, event: RunEvent);
    fn observe(&self, volume: &str, interval: &VolumeInterval, dirs: &[DirStats; 2]);
}

struct Partial {
    reported: usize,
    end: Duration,
    len: Duration,
    dirs: [DirStats; 2],
    outstanding: f64,
}

struct State {
    /// Clones that finished, with the number of intervals each reported.
    done: Vec<usize>,
    /// Intervals reported so far by each clone (job index, clone).
    per_clone: std::collections::HashMap<(usize, u32), usize>,
    pending: BTreeMap<usize, Partial>,
    next: usize,
    started_sent: bool,
}

pub struct VolumeAggregator<E: VolumeEvents> {
    volume: String,
    clones: usize,
    configured_depth: u32,
    open_loop: bool,
    /// Significant digits the interval histograms are sent at (recorded at 3, coarsened
    /// exactly to 2 when the plan asks: `histogram::coarsen`).
    digits: u8,
    /// Faults active at a time offset (ms since start), for the timeline.
    active_faults: Box<dyn Fn(u64) -> Vec<String> + Send + Sync>,
    events: E,
    state: Mutex<State>,
}

pub fn unix_ns(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

impl<E: VolumeEvents> VolumeAggregator<E> {
    pub fn new(
        volume: String,
        clones: usize,
        configured_depth: u32,
        open_loop: bool,
        digits: u8,
        active_faults: Box<dyn Fn(u64) -> Vec<String> + Send + Sync>,
        events: E,
    ) -> Self {
        VolumeAggregator {
            volume,
            clones,
            configured_depth,
            open_loop,
            digits,
            active_faults,
            events,
            state: Mutex::new(State {
                done: Vec::new(),
                per_clone: Default::default(),
                pending: BTreeMap::new(),
                next: 0,
                started_sent: false,
            }),
        }
    }

    /// Emits every interval that is complete, in order.
    fn flush(&self, st: &mut State) {
        loop {
            let k = st.next;
            let finished_before = st.done.iter().filter(|&&n| n <= k).count();
            let expected = self.clones.saturating_sub(finished_before);
            let Some(p) = st.pending.get(&k) else {
                if expected == 0 && st.pending.is_empty() {
                    return;
                }
                // Interval k never came from anyone still running: skip to what exists.
                if expected == 0 {
                    st.next = *st.pending.keys().next().unwrap();
                    continue;
                }
                return;
            };
            if p.reported < expected {
                return;
            }
            let p = st.pending.remove(&k).unwrap();
            st.next += 1;
            self.emit(k, p);
        }
    }

    fn emit(&self, k: usize, p: Partial) {
        let dir = |d: &DirStats| DirInterval {
            ios: d.ios,
            bytes: d.bytes,
            errors: d.errors,
            // clat and slat travel once, in the final result; intervals carry what is judged.
            clat_hist: Vec::new(),
            lat_hist: if d.ios > 0 {
                encode_at(&d.lat, self.digits).unwrap_or_default()
            } else {
                Vec::new()
            },
            lat_intended_hist: match &d.lat_intended {
                Some(h) if self.open_loop && d.ios > 0 => {
                    encode_at(h, self.digits).unwrap_or_default()
                }
                _ => Vec::new(),
            },
        };
        let vi = VolumeInterval {
            volume: self.volume.clone(),
            read: Some(dir(&p.dirs[0])),
            write: Some(dir(&p.dirs[1])),
            outstanding: p.outstanding,
            configured_depth: self.configured_depth,
            active_faults: (self.active_faults)(p.end.as_millis() as u64),
        };
        self.events.observe(&self.volume, &vi, &p.dirs);
        self.events.send(RunEvent {
            seq: 0,
            event: Some(run_event::Event::Interval(IntervalReport {
                index: k as u64,
                end_agent_ns: unix_ns(SystemTime::now()),
                len_ns: p.len.as_nanos() as u64,
                volumes: vec![vi],
            })),
        });
    }
}

impl<E: VolumeEvents> IntervalSink for VolumeAggregator<E> {
    fn on_interval(&self, s: IntervalSnapshot<'_>) {
        let mut st = self.state.lock().unwrap();
        let open_loop = self.open_loop;
        let p = st.pending.entry(s.index).or_insert_with(|| Partial {
            reported: 0,
            end: Duration::ZERO,
            len: Duration::ZERO,
            dirs: [DirStats::new(open_loop), DirStats::new(open_loop)],
            outstanding: 0.0,
        });
        p.reported += 1;
        p.end = p.end.max(s.summary.end);
        p.len = p.len.max(s.summary.len);
        p.dirs[0].merge(&s.dirs[0]);
        p.dirs[1].merge(&s.dirs[1]);
        // What the volume was asked to work on: finished IOs waiting for the job thread are
        // the load generator's queue, not the volume's (the chokepoint finder compares this
        // with the configured depth to tell a short generator from a slow volume).
        p.outstanding += s.summary.outstanding - s.summary.waiting;
        st.per_clone.insert((s.job_index, s.clone), s.index + 1);
        self.flush(&mut st);
    }

    fn on_group_started(&self, groupid: u32, at: SystemTime) {
        let mut st = self.state.lock().unwrap();
        if groupid == 0 && !st.started_sent {
            st.started_sent = true;
            tracing::debug!(volume = %self.volume, at_ns = unix_ns(at), now_ns = unix_ns(SystemTime::now()), "io started");
            self.events.send(RunEvent {
                seq: 0,
                event: Some(run_event::Event::Started(Started {
                    actual_start_agent_ns: unix_ns(at),
                    volume: self.volume.clone(),
                })),
            });
        }
    }

    fn on_clone_done(&self, job_index: usize, clone: u32) {
        let mut st = self.state.lock().unwrap();
        // The clone's intervals all arrived before it finished (same thread): it will not
        // report interval `reported` or any later one.
        let reported = st.per_clone.get(&(job_index, clone)).copied().unwrap_or(0);
        st.done.push(reported);
        self.flush(&mut st);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{IntervalSummary, record};
    use std::sync::Arc;

    #[derive(Clone, Default)]
    struct Collect(Arc<Mutex<Vec<(u64, u64)>>>);
    impl VolumeEvents for Collect {
        fn send(&self, e: RunEvent) {
            if let Some(run_event::Event::Interval(iv)) = e.event {
                let ios = iv.volumes[0].read.as_ref().unwrap().ios;
                self.0.lock().unwrap().push((iv.index, ios));
            }
        }
        fn observe(&self, _: &str, _: &VolumeInterval, _: &[DirStats; 2]) {}
    }

    fn snap(agg: &VolumeAggregator<Collect>, clone: u32, index: usize, ios: u64) {
        let mut d = [DirStats::new(false), DirStats::new(false)];
        d[0].ios = ios;
        record(&mut d[0].lat, 1000);
        let summary = IntervalSummary {
            end: Duration::from_secs(index as u64 + 1),
            ..Default::default()
        };
        agg.on_interval(IntervalSnapshot {
            index,
            job_index: 0,
            job_name: "j",
            clone,
            summary: &summary,
            dirs: &d,
        });
    }

    /// Under `histogram_digits = 2` the interval histogram goes out coarsened (exactly: same
    /// count, the 2-digit bucket of the recorded value); under 3 as recorded.
    #[test]
    fn interval_histograms_are_sent_at_the_runs_digits() {
        #[derive(Clone, Default)]
        struct Hists(Arc<Mutex<Vec<Vec<u8>>>>);
        impl VolumeEvents for Hists {
            fn send(&self, e: RunEvent) {
                if let Some(run_event::Event::Interval(iv)) = e.event {
                    let read = iv.volumes[0].read.clone().unwrap();
                    self.0.lock().unwrap().push(read.lat_hist);
                }
            }
            fn observe(&self, _: &str, _: &VolumeInterval, _: &[DirStats; 2]) {}
        }
        for digits in [3u8, 2] {
            let c = Hists::default();
            let agg = VolumeAggregator::new(
                "v".into(),
                1,
                1,
                false,
                digits,
                Box::new(|_| vec![]),
                c.clone(),
            );
            let mut d = [DirStats::new(false), DirStats::new(false)];
            d[0].ios = 3;
            for v in [123_456, 123_457, 987_654] {
                record(&mut d[0].lat, v);
            }
            agg.on_interval(IntervalSnapshot {
                index: 0,
                job_index: 0,
                job_name: "j",
                clone: 0,
                summary: &IntervalSummary::default(),
                dirs: &d,
            });
            let sent = c.0.lock().unwrap().clone();
            let h = lockstep_proto::histogram::SparseHistogram::decode(&sent[0]).unwrap();
            assert_eq!((h.geometry.sigfig, h.len()), (digits, 3));
            // 3 digits tell 123,456 from 123,457 apart only at this magnitude's 64 ns buckets,
            // so both share one bucket either way; 987,654 has its own.
            assert_eq!(h.buckets_in_use(), 2);
            let g = h.geometry;
            assert_eq!(h.max(), g.highest_equivalent(g.index_of(987_654)));
        }
    }

    #[test]
    fn merges_clones_by_interval_and_waits_for_all() {
        let c = Collect::default();
        let agg =
            VolumeAggregator::new("v".into(), 2, 2, false, 3, Box::new(|_| vec![]), c.clone());
        snap(&agg, 0, 0, 10);
        assert!(
            c.0.lock().unwrap().is_empty(),
            "must wait for the second clone"
        );
        snap(&agg, 1, 0, 5);
        snap(&agg, 0, 1, 7);
        assert_eq!(*c.0.lock().unwrap(), vec![(0, 15)]);
        // The other clone finishes after interval 0: interval 1 no longer waits for it.
        agg.on_clone_done(0, 1);
        assert_eq!(*c.0.lock().unwrap(), vec![(0, 15), (1, 7)]);
    }
}
