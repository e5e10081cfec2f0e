//! Reap and complete: completions from the engine, fio's reaping (how many are handled per
//! pass), the faults that hold completions back, and the record of each finished IO.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{IoLoop, Slot, carry_wait};
use crate::engine::{self, Completion};
use crate::fault::Outcome;
use crate::job::errpolicy::{ErrorCount, ErrorKind};
use crate::job::{Direction, JobSpec};
use crate::layout::{self, PlannedFile};
use crate::stats::record;

impl IoLoop<'_> {
    /// Takes the completions that are visible (no system call, no wait) when slots are free
    /// or completions are waiting to be handled; otherwise waits for one, bounded by the
    /// next thing the loop must do on time.
    #[inline]
    pub(super) fn reap(&mut self, stopping: bool) {
        if (self.more_to_issue && self.completions.is_empty()) || !self.seen.is_empty() {
            if let Err(e) = self.engine.peek(&mut self.completions) {
                self.failure = Some(e.to_string());
            }
        } else {
            self.woke = true;
            let mut wake = due_wake(
                stopping,
                self.next_tick,
                self.deadline,
                (!self.sync_pending && !self.exhausted)
                    .then_some([self.next_intended, self.not_before]),
                self.gated.front().map(|g| g.0),
                self.held.iter().map(|h| h.0).min(),
                self.last_progress.map(|t| t + self.drain_limit),
            );
            if let (Some(m), Some(&(seq, _))) = (self.mirror.as_ref(), self.mirror_held.front()) {
                if self.inflight == self.mirror_held.len() && self.completions.is_empty() {
                    // Nothing at the device: sleep until the ack (the link wakes the loop).
                    m.wait_released(seq, wake);
                    return;
                }
                // IOs at the device too: the engine's wait, bounded so the ack is seen soon.
                wake = wake.min(Instant::now() + super::MIRROR_POLL);
            }
            reap_until_due(
                &mut *self.engine,
                &mut self.completions,
                &mut self.failure,
                wake,
            );
        }
    }

    /// Handles the completions of this pass. Completions are timestamped when seen. Coming
    /// out of a wait, an interleaving engine handles only the first one before issuing again,
    /// so a slot is refilled at once instead of after the bookkeeping of a whole burst (a
    /// virtio disk finishes ~31 IOs per interrupt); the rest are handled on the next pass,
    /// with their own timestamps. With fio's reaping this one clock read is also the instant
    /// the pass takes its completions from `seen` (fio reads the clock once per reap too).
    #[inline]
    pub(super) fn complete(&mut self, now: Instant) {
        let t_seen = (!self.completions.is_empty() || (!self.reap_all && !self.seen.is_empty()))
            .then(Instant::now);
        let one_only = self.interleave && self.woke;
        self.woke = false;
        let all_now = self.seen.is_empty()
            && !one_only
            && (self.reap_all || self.completions.len() <= self.complete_max);
        if !self.reap_all && !all_now {
            carry_wait(
                &mut self.wait_area,
                &mut self.last_wait,
                self.seen.len(),
                t_seen.unwrap_or(now),
            );
        }
        // Taken out while they are handled (handling one never touches them), put back after.
        let mut completions = std::mem::take(&mut self.completions);
        if all_now {
            // The usual case: everything seen now is handled now, with one timestamp; the
            // depth integral is carried to it once for the batch.
            let t = t_seen.unwrap_or(now);
            if t >= self.last_now {
                self.area += self.inflight as f64
                    * t.saturating_duration_since(self.last_now).as_nanos() as u64 as f64;
                self.last_now = t;
            }
            let stop_asked = self.opts.stop.load(Ordering::Relaxed);
            for c in completions.drain(..) {
                self.complete_one(c, t, stop_asked, true);
            }
        } else {
            let mut seen = std::mem::take(&mut self.seen);
            if let Some(t) = t_seen {
                seen.extend(completions.drain(..).map(|c| (c, t)));
            }
            let handle = if one_only {
                1
            } else if self.reap_all {
                seen.len()
            } else {
                self.complete_max
            }
            .min(seen.len());
            let stop_asked = self.opts.stop.load(Ordering::Relaxed);
            if self.reap_all {
                for (c, t_done) in seen.drain(..handle) {
                    self.complete_one(c, t_done, stop_asked, false);
                }
            } else {
                // fio's clat ends when its loop takes the completion, not when the kernel
                // posted it: the wait in between is the job's.
                let t = t_seen.unwrap_or(now);
                for (c, _) in seen.drain(..handle) {
                    self.complete_one(c, t, stop_asked, false);
                }
            }
            self.seen = seen;
        }
        self.completions = completions;
    }

    /// One completion, seen at `t_done`: held back by a fault, or the slot is freed and the
    /// IO recorded. `carried`: the depth integral was already carried to `t_done`.
    #[inline]
    fn complete_one(&mut self, c: Completion, t_done: Instant, stop_asked: bool, carried: bool) {
        let stopping_now = stop_asked || self.deadline.is_some_and(|d| t_done >= d);
        let Some(slot) = self.slots[c.tag as usize] else {
            return;
        };
        if let Some(d) = self.due(&slot, t_done).filter(|_| !stopping_now) {
            self.held.push((d, c));
            return;
        }
        if slot.mirror_seq > 0 {
            let took = t_done.saturating_duration_since(slot.ready).as_nanos() as u64;
            if let Some(m) = self.mirror.as_mut() {
                m.finished(slot.mirror_seq, took, t_done);
            }
        } else if slot.dir == Direction::Write && c.result > 0 {
            // Writes that finish while the job stops go to the mirror too (held, then released
            // by the stop): the backup's copy must have every byte the primary's file has.
            if let Some(m) = self.mirror.as_mut() {
                // The local write as fio's lat counts it: submission and completion.
                let local = t_done.saturating_duration_since(slot.ready).as_nanos() as u64;
                let data = self.buffers.bytes(c.tag as usize, c.result as usize);
                if let Some(seq) = m.written(slot.file, slot.offset, data, local, t_done) {
                    if let Some(s) = self.slots[c.tag as usize].as_mut() {
                        s.mirror_seq = seq;
                    }
                    self.mirror_held.push_back((seq, c));
                    return;
                }
            }
        }
        self.slots[c.tag as usize] = None;
        self.free.push(c.tag);
        if self.last_progress.is_some() {
            self.last_progress = Some(t_done);
        }
        // The depth integral: the depth drops at `t_done`. When the integral has already
        // been carried past it (the completion waited for its turn), the IO is taken out of
        // that stretch, within the current interval.
        if carried {
            // Carried to `t_done` by `complete`.
        } else if t_done >= self.last_now {
            self.area += self.inflight as f64
                * t_done.saturating_duration_since(self.last_now).as_nanos() as u64 as f64;
            self.last_now = t_done;
        } else {
            self.area -= self
                .last_now
                .saturating_duration_since(t_done.max(self.last_tick))
                .as_nanos() as u64 as f64;
        }
        self.inflight -= 1;
        if slot.generation > 0 {
            // A short write may have written part of the block: not acknowledged.
            let ok = c.result == slot.len as i64;
            let dropped = matches!(slot.outcome, Outcome::DropWrite);
            self.vstate
                .complete(slot.file, slot.offset, slot.generation, ok, dropped);
        }
        let took = t_done.saturating_duration_since(slot.ready).as_nanos() as u64;
        if self.stuck_ns > 0 && (took > self.stuck_ns || slot.stuck.is_some()) {
            super::drain::note_stuck(
                &mut self.report.stats,
                self.plan,
                &slot,
                self.t0,
                took,
                true,
            );
        }
        self.record(c.result, &slot, t_done, took);
    }

    /// When a completion is due, if a fault holds it: added latency holds it until submission
    /// + delay; a stall holds every completion until the stall ends. The IO stays outstanding
    /// meanwhile.
    #[inline]
    fn due(&self, slot: &Slot, t_done: Instant) -> Option<Instant> {
        let mut due = None;
        if let Outcome::DelayBy(ns) = slot.outcome {
            let d = slot.submitted + Duration::from_nanos(ns);
            if d > t_done {
                due = Some(d);
            }
        }
        if let Some(f) = self.fault.as_ref() {
            if let Some(until) = f.stalled_until((t_done - self.t0).as_nanos() as u64) {
                let d = self.t0 + Duration::from_nanos(until);
                due = Some(due.map_or(d, |x: Instant| x.max(d)));
            }
        }
        due
    }

    /// Records a finished IO in the interval's statistics (or its error, under the job's
    /// `continue_on_error`); `took` is its latency.
    #[inline]
    fn record(&mut self, result: i64, slot: &Slot, t_done: Instant, took: u64) {
        let d = &mut self.iv[slot.dir as usize];
        d.ios += 1;
        if result < 0 {
            d.errors += 1;
            if !goes_on(self.job, &mut self.report.stats.errors, slot.dir, result)
                && self.failure.is_none()
            {
                self.failure = Some(io_failure(self.plan, slot, result));
            }
            return;
        }
        if (result as u64) < slot.len as u64 {
            d.short_ios += 1;
        }
        d.bytes += result as u64;
        // lat is `took`; clat = lat - slat exactly, in whole nanoseconds (one clock
        // subtraction per IO fewer: they are a sixth of the loop's instructions).
        let slat = slot
            .submitted
            .saturating_duration_since(slot.ready)
            .as_nanos() as u64;
        let lat = took;
        let clat = lat.saturating_sub(slat);
        record(&mut d.slat, slat);
        d.saturated += record(&mut d.clat, clat) as u64;
        record(&mut d.lat, lat);
        if let (Some(h), Some(intended)) = (d.lat_intended.as_mut(), slot.intended) {
            record(
                h,
                t_done.saturating_duration_since(intended).as_nanos() as u64,
            );
        }
    }
}

/// The next instant the loop must act at on its own: an interval tick, the deadline, an issue
/// time (rate, thinktime; `None` when no IO may be issued now), a gated IO or a held completion.
///
/// Once stopping, the loop only waits for the IOs in flight, so the deadline (by then past) no
/// longer bounds the wait: it turned every wait of the drain into a poll, which spun for the
/// longest IO's latency (120 ms and ~1,200 system calls after a run of 16 MiB reads).
///
/// `give_up`: while draining, when the IOs still in flight will be given up on.
pub(super) fn due_wake(
    stopping: bool,
    next_tick: Instant,
    deadline: Option<Instant>,
    issue: Option<[Option<Instant>; 2]>,
    gated: Option<Instant>,
    held: Option<Instant>,
    give_up: Option<Instant>,
) -> Instant {
    let deadline = deadline.filter(|_| !stopping);
    let mut wake = deadline.map_or(next_tick, |d| d.min(next_tick));
    for t in issue
        .into_iter()
        .flatten()
        .flatten()
        .chain(gated)
        .chain(held)
        .chain(give_up)
    {
        wake = wake.min(t);
    }
    wake
}

/// Reap: block for one completion (none when some are already waiting to be processed), bounded
/// by `wake`, the next thing the loop must do on time.
fn reap_until_due(
    engine: &mut dyn engine::Engine,
    completions: &mut Vec<Completion>,
    failure: &mut Option<String>,
    wake: Instant,
) {
    let timeout = wake.saturating_duration_since(Instant::now());
    let need_wait = completions.is_empty();
    let res = if need_wait && timeout.is_zero() {
        // Due now: poll without blocking.
        engine.reap(0, Some(Duration::ZERO), completions)
    } else {
        engine.reap(
            if need_wait { 1 } else { 0 },
            Some(timeout.max(Duration::from_micros(1))),
            completions,
        )
    };
    if let Err(e) = res {
        *failure = Some(e.to_string());
    }
}

/// Counts a failed IO under the job's `continue_on_error` and says whether the job goes on
/// (the slot is already free for the next IO) or stops at it, as fio decides.
fn goes_on(job: &JobSpec, count: &mut ErrorCount, dir: Direction, result: i64) -> bool {
    let errno = (-result) as i32;
    job.on_error
        .on_error(count, ErrorKind::of(dir, errno), errno, 1)
}

/// The job's error for a failed IO: what, where, and the OS's reason.
fn io_failure(files: &[PlannedFile], slot: &Slot, result: i64) -> String {
    let path = files
        .get(slot.file as usize)
        .map(|f| f.path.display().to_string())
        .unwrap_or_default();
    format!(
        "{} of {} bytes at offset {} of {path} failed: {}",
        slot.dir.name(),
        slot.len,
        slot.offset,
        errno_text(result)
    )
}

fn errno_text(result: i64) -> String {
    let err = std::io::Error::from_raw_os_error((-result) as i32);
    format!("{err}{}", layout::io_hint(&err))
}
