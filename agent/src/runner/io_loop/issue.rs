//! Issue: IOs from the generator through the gate and the faults to the engine.

use std::time::{Duration, Instant};

use super::{IoLoop, Slot};
use crate::engine::{Completion, IoOp};
use crate::fault::{Admission, Outcome};
use crate::job::Direction;
use crate::stats::depth_bucket;
use crate::verify;
use crate::workload::IoRequest;

impl IoLoop<'_> {
    /// Delivers the completions held by a fault that are due (all of them when stopping).
    #[inline]
    pub(super) fn release_held(&mut self, now: Instant, stopping: bool) {
        if let Some(m) = self
            .mirror
            .as_ref()
            .filter(|_| !self.mirror_held.is_empty())
        {
            let released = m.released();
            while let Some(&(seq, c)) = self.mirror_held.front() {
                if seq > released && !stopping {
                    break;
                }
                self.mirror_held.pop_front();
                self.completions.push(c);
            }
        }
        if !self.held.is_empty() {
            let mut i = 0;
            while i < self.held.len() {
                if self.held[i].0 <= now || stopping {
                    self.completions.push(self.held.swap_remove(i).1);
                } else {
                    i += 1;
                }
            }
        }
    }

    /// Starts the gated IOs whose time has come (all of them when stopping).
    #[inline]
    pub(super) fn start_gated(&mut self, now: Instant, stopping: bool) {
        self.queued_now.clear();
        while let Some(&(t, op)) = self.gated.front() {
            if t > now && !stopping {
                break;
            }
            self.gated.pop_front();
            match self.engine.queue(op) {
                Ok(()) => self.queued_now.push(op.tag),
                Err(e) => {
                    self.failure.get_or_insert(e.to_string());
                    self.completions.push(Completion {
                        tag: op.tag,
                        result: -(libc::EIO as i64),
                    });
                }
            }
        }
    }

    /// Issues as many IOs as the depth, the rate, thinktime and fsync allow (one per pass on
    /// an interleaving engine).
    #[inline]
    pub(super) fn issue(&mut self, now: Instant, stopping: bool) {
        let mut issued_this_pass = 0usize;
        self.more_to_issue = false;
        while !stopping && !self.exhausted && !self.sync_pending {
            let Some(&slot_idx) = self.free.last() else {
                break;
            };
            if issued_this_pass >= self.issue_per_pass {
                self.more_to_issue = true;
                break;
            }
            issued_this_pass += 1;
            if !self.issue_one(now, slot_idx) {
                break;
            }
        }
    }

    /// Issues one IO into the free slot `slot_idx`; false when no more may be issued in this
    /// pass (not yet time, generator done, a deferred write, an engine error).
    #[inline]
    fn issue_one(&mut self, now: Instant, slot_idx: u32) -> bool {
        let Some((req, intended)) = self.next_request(now) else {
            return false;
        };
        // A gated volume (cap, EBS model) takes the IO now and starts it when its bucket
        // admits it, in order: the IO counts as outstanding from now and its latency
        // includes the wait (slat), as on a throttled cloud volume where the application
        // sees deep queues and long latencies, not fewer IOs in flight.
        let mut admit_at = now;
        if let Some(g) = self.gate.as_mut() {
            let gate_now = (now - self.t0).as_nanos() as u64;
            if let Admission::At(t) = g.admit(gate_now, req.dir, req.len) {
                admit_at = self.t0 + Duration::from_nanos(t);
            }
            g.charge((admit_at - self.t0).as_nanos() as u64, req.dir, req.len);
        }
        let outcome = match self.fault.as_mut() {
            Some(f) => f.on_issue((now - self.t0).as_nanos() as u64, req.dir, req.len),
            None => Outcome::Deliver,
        };
        self.free.pop();
        let len = req.len as u32;
        let mut generation = 0;
        if self.verifying && req.dir == Direction::Write {
            generation = self.vstate.issue(req.file as u32, req.offset, len);
            verify::fill_block(
                self.buffers.slice(slot_idx as usize, len as usize),
                req.file as u32,
                req.offset,
                generation,
                self.vstate.seed,
            );
        }
        self.slots[slot_idx as usize] = Some(Slot {
            dir: req.dir,
            file: req.file as u32,
            offset: req.offset,
            len,
            ready: now,
            submitted: now,
            intended,
            outcome,
            generation,
            stuck: None,
            mirror_seq: 0,
        });
        if !self.start(now, slot_idx, &req, outcome, admit_at) {
            return false;
        }
        self.issued(now, req.dir, intended);
        true
    }

    /// The next IO to issue and its intended instant (open loop), unless thinktime, the rate
    /// or a write to a block still in flight holds it, or the generator is done.
    #[inline]
    fn next_request(&mut self, now: Instant) -> Option<(IoRequest, Option<Instant>)> {
        if let Some(t) = self.not_before {
            if now < t {
                return None;
            }
            self.not_before = None;
        }
        let intended = match self.next_intended {
            Some(t) if t > now => return None,
            other => other,
        };
        let req = match self.deferred.take() {
            Some(r) => r,
            None => match self.generator.next() {
                Some(r) => r,
                None => {
                    self.exhausted = true;
                    return None;
                }
            },
        };
        if self.verifying
            && req.dir == Direction::Write
            && self.vstate.busy(req.file as u32, req.offset)
        {
            // Its intended time is not consumed: the wait counts in its latency.
            self.deferred = Some(req);
            return None;
        }
        Some((req, intended))
    }

    /// Hands the IO in `slot_idx` to the engine (or to the gate's queue, or completes it at
    /// once for a fault that never reaches the device); false when the engine refused it.
    #[inline]
    fn start(
        &mut self,
        now: Instant,
        slot_idx: u32,
        req: &IoRequest,
        outcome: Outcome,
        admit_at: Instant,
    ) -> bool {
        let len = req.len as u32;
        let fail_now = matches!(outcome, Outcome::FailEio | Outcome::DropWrite);
        if fail_now {
            // Faults that never reach the device complete "at once" below.
            let result = if matches!(outcome, Outcome::DropWrite) {
                len as i64
            } else {
                -(libc::EIO as i64)
            };
            self.completions.push(Completion {
                tag: slot_idx,
                result,
            });
            self.queued_now.push(slot_idx);
            return true;
        }
        let op = IoOp {
            dir: req.dir,
            fd: if self.null { -1 } else { self.fds[req.file] },
            file: req.file as u32,
            offset: req.offset,
            len,
            buf: self.buffers.slot(slot_idx as usize),
            tag: slot_idx,
        };
        if admit_at > now {
            self.gated.push_back((admit_at, op));
        } else if let Err(e) = self.engine.queue(op) {
            self.failure = Some(e.to_string());
            self.free.push(slot_idx);
            self.slots[slot_idx as usize] = None;
            return false;
        } else {
            self.queued_now.push(slot_idx);
            // fio's default iodepth_batch_submit=1: each IO goes to the device as soon
            // as it is ready, so the first of a refill does not wait for the others'
            // submission (an O_DIRECT submit does the block-layer work inline).
            if self.queued_now.len() >= self.submit_batch {
                self.commit();
                self.queued_now.clear();
            }
        }
        true
    }

    /// The bookkeeping of an IO just issued: depth, the next intended instant, thinktime and
    /// fsync counts.
    #[inline]
    fn issued(&mut self, now: Instant, dir: Direction, intended: Option<Instant>) {
        // The queue-depth integral is advanced at every change of the depth, so the
        // interval's mean outstanding IOs is exact (Little's law checks depend on it); the
        // top of the pass already brought it to `now`, the instant of this issue.
        debug_assert!(self.last_now >= now);
        self.inflight += 1;
        if self.measuring {
            self.report.stats.depth_hist[depth_bucket(self.inflight as u32)] += 1;
        }
        if let (Some(r), Some(_)) = (self.rate.as_mut(), intended) {
            self.next_intended = Some(self.t0 + Duration::from_nanos(r.next_intended_ns()));
        }
        let job = self.job;
        if !job.thinktime.is_zero() {
            self.since_think += 1;
            if self.since_think >= job.thinktime_blocks.max(1) {
                self.since_think = 0;
                self.not_before = Some(now + job.thinktime);
            }
        }
        if dir == Direction::Write && self.sync_every > 0 {
            self.writes_since_sync += 1;
            if self.writes_since_sync >= self.sync_every {
                self.writes_since_sync = 0;
                self.sync_pending = true;
            }
        }
    }

    /// Submits what the pass queued (the gated IOs it started, the faults' instant
    /// completions) and stamps their submission.
    #[inline]
    pub(super) fn submit_queued(&mut self) {
        if !self.queued_now.is_empty() {
            self.commit();
        }
    }

    /// Hands the queued IOs to the device and stamps their submission instant.
    #[inline]
    fn commit(&mut self) {
        if let Err(e) = self.engine.commit() {
            self.failure = Some(e.to_string());
        }
        let t_sub = Instant::now();
        for &s in &self.queued_now {
            if let Some(slot) = self.slots[s as usize].as_mut() {
                slot.submitted = t_sub;
            }
        }
    }
}
