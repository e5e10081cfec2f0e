//! Tick: what happens on the clock rather than on an IO: the end of the ramp, interval
//! boundaries (with the IOs stuck past the timeout), verify checkpoints, and the waits of a
//! loop with nothing in flight (rate, thinktime).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::super::IntervalSnapshot;
use super::super::clock::sleep_until_unless_stopped;
use super::super::clone::thread_rusage;
use super::drain::note_stuck;
use super::{IoLoop, VERIFY_CHECKPOINT_EVERY};
use crate::stats::IntervalSummary;
use crate::verify;

impl IoLoop<'_> {
    /// The clock's events of this pass: the ramp's end, then any interval boundary passed.
    #[inline]
    pub(super) fn tick(&mut self, now: Instant) {
        if !self.measuring && now >= self.ramp_end {
            self.start_measuring(now);
        }
        if self.measuring && now >= self.next_tick {
            self.interval_due(now);
        }
    }

    /// The ramp is over: what it measured is dropped and the timed part begins at `now`.
    fn start_measuring(&mut self, now: Instant) {
        self.measuring = true;
        self.timed_start = now;
        for d in self.iv.iter_mut() {
            d.reset();
        }
        let stats = &mut self.report.stats;
        stats.sync = Default::default();
        stats.depth_hist = [0; 7];
        self.next_tick = now + self.interval;
        self.last_tick = now;
        self.area = 0.0;
        self.wait_area = 0.0;
        self.ru_start = thread_rusage();
    }

    /// An interval boundary has passed: list the IOs stuck so far, close the interval (and
    /// any missed ones), and checkpoint the verify state when due.
    fn interval_due(&mut self, now: Instant) {
        if self.stuck_ns > 0 {
            // IOs still in flight past the timeout are listed now, not only if they ever
            // complete (a hung device never answers).
            for s in self.slots.iter_mut().flatten() {
                let age = now.saturating_duration_since(s.ready).as_nanos() as u64;
                if s.stuck.is_none() && age > self.stuck_ns {
                    s.stuck = Some(note_stuck(
                        &mut self.report.stats,
                        self.plan,
                        s,
                        self.t0,
                        age,
                        false,
                    ));
                }
            }
        }
        // Intervals stay on the clock: when the thread was held up well past a boundary (a
        // pause fault stopped the process, a long preemption), the interval closes at its
        // boundary and any it missed close empty, so interval N is always N..N+1 intervals
        // after the start, as on every other clone and agent it is merged with. A tick
        // seen a little late closes then, as usual.
        while now >= self.next_tick {
            let end = if now - self.next_tick <= self.interval / 10 {
                now
            } else {
                self.next_tick
            };
            self.close_interval(self.last_tick, end);
            self.last_tick = end;
            self.next_tick += self.interval;
        }
        if self.verifying
            && now >= self.next_checkpoint
            && !self.vstate.is_empty()
            && self.checkpointing.as_ref().is_none_or(|h| h.is_finished())
        {
            self.next_checkpoint = now + VERIFY_CHECKPOINT_EVERY;
            self.checkpoint();
        }
    }

    /// Saves a copy of the verify state on a thread of its own.
    fn checkpoint(&mut self) {
        let Some(first) = self.plan.first() else {
            return;
        };
        if !verify::state_has_a_place(&first.scope) {
            return;
        }
        let job = self.job;
        let path = verify::state_path(&first.path, &job.name, self.clone);
        let names: Vec<String> = self.plan.iter().map(|f| absolute(&f.path)).collect();
        let (snapshot, name, clone) = (self.vstate.live_view(), job.name.clone(), self.clone);
        let scope = first.scope.clone();
        self.checkpointing = Some(std::thread::spawn(move || {
            if let Err(e) = verify::save_checkpoint(&scope, &path, &name, clone, &names, &snapshot)
            {
                tracing::warn!("verify checkpoint: {e}");
            }
        }));
    }

    /// Closes the interval `start..end`: the live counters, the sink (the daemon ships it),
    /// the job's totals and interval list; the interval's histograms and the integrals of IOs
    /// in flight and of finished IOs waiting to be handled (`area`, `wait_area`, IO·ns) start
    /// again from zero.
    pub(super) fn close_interval(&mut self, start: Instant, end: Instant) {
        let len = end - start;
        let mean = |a: f64| {
            if len.is_zero() {
                0.0
            } else {
                a / len.as_nanos() as f64
            }
        };
        let iv = &mut self.iv;
        let summary = IntervalSummary {
            end: end - self.timed_start,
            len,
            ios: [iv[0].ios, iv[1].ios],
            bytes: [iv[0].bytes, iv[1].bytes],
            errors: [iv[0].errors, iv[1].errors],
            outstanding: mean(self.area),
            waiting: mean(self.wait_area),
        };
        let live = &self.opts.live;
        for d in 0..2 {
            live.ios[d].fetch_add(iv[d].ios, Ordering::Relaxed);
            live.bytes[d].fetch_add(iv[d].bytes, Ordering::Relaxed);
            live.errors.fetch_add(iv[d].errors, Ordering::Relaxed);
        }
        let stats = &mut self.report.stats;
        if let Some(sink) = &self.opts.sink {
            sink.on_interval(IntervalSnapshot {
                index: stats.intervals.len(),
                job_index: self.job_index,
                job_name: &self.job.name,
                clone: self.clone,
                summary: &summary,
                dirs: iv,
            });
        }
        stats.dirs[0].merge(&iv[0]);
        stats.dirs[1].merge(&iv[1]);
        stats.intervals.push(summary);
        iv[0].reset();
        iv[1].reset();
        self.area = 0.0;
        self.wait_area = 0.0;
    }

    /// Nothing in flight: a pending fsync runs, the job ends (done or stopping), or the loop
    /// waits for the next intended issue time or thinktime. True when the loop is over.
    pub(super) fn idle(&mut self, now: Instant, stopping: bool) -> bool {
        if self.sync_pending {
            self.sync_pending = false;
            self.sync();
            return false;
        }
        if self.exhausted || stopping {
            return true;
        }
        let wake = [self.next_intended, self.not_before]
            .into_iter()
            .flatten()
            .min();
        if let Some(w) = wake {
            let limit = (now + Duration::from_millis(50)).min(self.next_tick);
            sleep_until_unless_stopped(w.min(limit), &self.opts.stop);
        }
        false
    }
}

pub(super) fn absolute(p: &std::path::Path) -> String {
    std::path::absolute(p)
        .unwrap_or_else(|_| p.to_path_buf())
        .display()
        .to_string()
}
