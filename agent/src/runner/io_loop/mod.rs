//! The IO loop of one job clone, as a state machine: `IoLoop` owns everything the loop
//! changes, and `run` sequences one pass of events:
//!
//! ```text
//! pass:  carry integrals to now → tick (ramp end, intervals, stuck IOs, verify checkpoint)
//!        → stopping? (deadline, failure, stop request)
//!        → release held completions → start gated IOs → issue → submit
//!        → nothing in flight: sync, wait for the rate/thinktime, or end
//!        → draining and quiet too long: give up on the IOs in flight, end
//!        → reap (peek, or wait until something is due) → complete
//! end:   finish (last interval, end_fsync, CPU use, verify, or leave an abandoned device)
//! ```
//!
//! The files by concern: `issue` (generator, gate, faults, engine queue and submit), `reap`
//! (reaping and the completion of each IO), `tick` (intervals, ramp, checkpoints, rate waits),
//! `drain` (the end of the run: stop, give-up on a dead device, end_fsync, verify).
//!
//! On io_uring it interleaves as fio does: one IO per submit, the completions made visible by
//! that submit taken without a system call, and a wait only when no slot is free.

mod drain;
mod issue;
mod reap;
mod tick;

#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::fs::File;
use std::time::{Duration, Instant};

use super::RunOptions;
use super::buffers::Buffers;
use super::clone::{CloneCtx, CloneIo, thread_rusage};
use crate::engine::{Completion, Engine, IoOp};
use crate::fault::{IoFault, IoGate, Outcome};
use crate::job::{Direction, EngineKind, JobSpec};
use crate::layout::PlannedFile;
use crate::rate::RateScheduler;
use crate::report::JobReport;
use crate::stats::DirStats;
use crate::verify::VerifyState;
use crate::workload::{Generator, IoRequest};

/// One IO in flight (or held by a fault, or gated), by slot.
#[derive(Clone, Copy)]
pub(super) struct Slot {
    dir: Direction,
    file: u32,
    offset: u64,
    len: u32,
    ready: Instant,
    submitted: Instant,
    intended: Option<Instant>,
    outcome: Outcome,
    /// Write generation of a verified write (0: not verified).
    generation: u32,
    /// Index in the stuck list once listed while still in flight.
    stuck: Option<u32>,
    /// A write held for its mirror's ack: its sequence number on the mirror (0: none).
    mirror_seq: u64,
}

/// How long the loop may sleep in the engine's wait while writes wait for their mirror's ack
/// and other IOs are at the device: the ack arrives on another thread, and this bounds how
/// late the loop sees it. With only mirror-held writes in flight the loop sleeps on the link
/// instead, which the ack wakes (`MirrorHook::wait_released`).
const MIRROR_POLL: Duration = Duration::from_micros(20);

/// How often a verifying clone checkpoints its state (see `verify::save_checkpoint`).
const VERIFY_CHECKPOINT_EVERY: Duration = Duration::from_secs(2);

/// How long fio waits for a job that does not exit after its end before it gives up on it
/// (`FIO_REAP_TIMEOUT`, 300 s): the drain's limit when `stuck_timeout=0` turns the list off.
const FIO_REAP_TIMEOUT: Duration = Duration::from_secs(300);

/// The state of one clone's IO loop, from the first IO to the end of its run.
pub(super) struct IoLoop<'a> {
    // What the clone runs, and where its results go.
    job: &'a JobSpec,
    /// The clone's planned files (paths, for messages, stuck IOs and verification).
    plan: &'a [PlannedFile],
    opts: &'a RunOptions,
    job_index: usize,
    clone: u32,
    report: &'a mut JobReport,

    // What set-up built.
    files: Vec<File>,
    fds: Vec<i32>,
    generator: Generator,
    engine: Box<dyn Engine>,
    rate: Option<RateScheduler>,
    buffers: Buffers,
    gate: Option<Box<dyn IoGate>>,
    fault: Option<Box<dyn IoFault>>,

    // Settings fixed for the run.
    null: bool,
    verifying: bool,
    stuck_ns: u64,
    /// After the job's end the loop waits for the IOs in flight, as long as they keep
    /// completing. A device that has stopped answering would hold the run (and a cluster's
    /// drill) forever: once nothing has completed for `stuck_timeout` (fio's 300 s when the
    /// list is off), the rest are given up on (see `drain::give_up`).
    drain_limit: Duration,
    /// fio's iodepth_batch_complete_max: completions handled per pass. Below the depth, the
    /// others wait in `seen`, finished, counted in flight and in their clat, as in fio's loop;
    /// `wait_area` integrates how many wait, so the report can tell them from IOs at the
    /// device. fio's null engine hands back every pending completion whatever the maximum
    /// (its getevents ignores max), so it measures the loop without any of them waiting; so
    /// here.
    complete_max: usize,
    reap_all: bool,
    /// Interleaving engines (io_uring): one IO per pass of the loop, then the completions
    /// already visible are looked at without a system call (the submit made them visible). As
    /// in fio's default loop, one of them is taken per pass (`complete_max`,
    /// iodepth_batch_complete_max) and the rest wait, finished, with that wait in their clat;
    /// with `complete_max` at the depth all are taken and timestamped at once, so a completion
    /// is seen at most one submit after the device finished it. Issuing a whole refill before
    /// looking (the loop for other engines) left completions unseen until the refill in
    /// progress ended, and made every IO of a refill wait for the submits ahead of it (slat
    /// 15 us against fio's 2).
    interleave: bool,
    issue_per_pass: usize,
    /// IOs handed to the device per submit call (fio's iodepth_batch_submit default).
    submit_batch: usize,
    sync_every: u32,
    /// The loop's origin: ramp, deadline, rate schedule, gates and faults count from here.
    t0: Instant,
    ramp_end: Instant,
    interval: Duration,

    // Verification.
    vstate: VerifyState,
    /// Checkpoints of the verify state while writing, saved off the IO thread, so an agent
    /// that dies mid-run leaves a state to verify after a restart.
    next_checkpoint: Instant,
    checkpointing: Option<std::thread::JoinHandle<()>>,
    /// A write to a block that already has one in flight waits here (see `verify`).
    deferred: Option<IoRequest>,

    // The end of the run.
    deadline: Option<Instant>,
    failure: Option<String>,
    /// Since the job's end: the last instant an IO completed (or the end itself).
    last_progress: Option<Instant>,
    abandoned: usize,

    // IOs in flight.
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    inflight: usize,
    completions: Vec<Completion>,
    /// Completions seen (with the instant they were seen) and not yet handled.
    seen: VecDeque<(Completion, Instant)>,
    /// The last reap waited (or could have): the next completions may be a burst.
    woke: bool,
    queued_now: Vec<u32>,
    /// IOs taken from the generator and counted in flight, waiting for their gate's instant.
    gated: VecDeque<(Instant, IoOp)>,
    /// Completions held back by a fault (added latency, stall) until their due instant. The
    /// loop never sleeps for them: IOs keep being issued on schedule (open loop) and
    /// intervals keep closing on time while completions are held.
    held: Vec<(Instant, Completion)>,
    /// Where writes are mirrored, and the writes whose completion waits for the mirror (sync
    /// mode), in sequence order. Like `held`, the loop never sleeps for them: it looks at the
    /// mirror's released sequence number every pass, waking at least every `MIRROR_POLL`.
    pub(super) mirror: Option<Box<dyn super::MirrorHook>>,
    mirror_held: VecDeque<(u64, Completion)>,

    // Integrals over the current interval.
    /// Of inflight over time (IO·ns).
    area: f64,
    last_now: Instant,
    /// Of finished IOs waiting to be handled. `seen` only changes where completions are
    /// handled; the integral is carried to there (and to the top of each pass) from here.
    wait_area: f64,
    last_wait: Instant,

    // Intervals.
    iv: [DirStats; 2],
    measuring: bool,
    timed_start: Instant,
    next_tick: Instant,
    last_tick: Instant,
    ru_start: libc::rusage,

    // Issue pacing.
    next_intended: Option<Instant>,
    not_before: Option<Instant>,
    since_think: u32,
    writes_since_sync: u32,
    sync_pending: bool,
    exhausted: bool,
    /// The last pass stopped issuing at `issue_per_pass` with slots still free.
    more_to_issue: bool,
}

impl<'a> IoLoop<'a> {
    pub(super) fn new(
        ctx: &'a CloneCtx<'a>,
        report: &'a mut JobReport,
        io: CloneIo,
        mut gate: Option<Box<dyn IoGate>>,
        fault: Option<Box<dyn IoFault>>,
    ) -> Self {
        let job = ctx.job;
        let depth = job.iodepth.max(1) as usize;
        let null = job.engine == EngineKind::Null;
        let CloneIo {
            files,
            fds,
            generator,
            engine,
            mut rate,
            buffers,
            vstate,
        } = io;
        let next_checkpoint = Instant::now() + VERIFY_CHECKPOINT_EVERY;
        let stuck_ns = job.stuck_timeout.as_nanos() as u64;
        let drain_limit = if stuck_ns > 0 {
            job.stuck_timeout
        } else {
            FIO_REAP_TIMEOUT
        };
        let open_loop = rate.is_some();
        let complete_max = if null {
            depth
        } else {
            job.complete_max.max(1) as usize
        };
        let last_wait = Instant::now();
        let t0 = Instant::now();
        if let Some(g) = gate.as_mut() {
            g.origin(t0);
        }
        let interval = ctx.opts.interval;
        let next_intended = rate
            .as_mut()
            .map(|r| t0 + Duration::from_nanos(r.next_intended_ns()));
        let interleave = engine.capabilities().interleave;
        IoLoop {
            job,
            plan: ctx.files,
            opts: ctx.opts,
            job_index: ctx.job_index,
            clone: ctx.clone,
            report,
            files,
            fds,
            generator,
            engine,
            rate,
            buffers,
            gate,
            fault,
            null,
            verifying: job.verify.is_some() && !null,
            stuck_ns,
            drain_limit,
            complete_max,
            reap_all: complete_max >= depth,
            interleave,
            issue_per_pass: if interleave { 1 } else { usize::MAX },
            submit_batch: 1,
            sync_every: if job.fsync > 0 {
                job.fsync
            } else {
                job.fdatasync
            },
            t0,
            ramp_end: t0 + job.ramp_time,
            interval,
            vstate,
            next_checkpoint,
            checkpointing: None,
            deferred: None,
            deadline: job.runtime.map(|r| t0 + job.ramp_time + r),
            failure: None,
            last_progress: None,
            abandoned: 0,
            slots: vec![None; depth],
            free: (0..depth as u32).rev().collect(),
            inflight: 0,
            completions: Vec::with_capacity(depth),
            seen: VecDeque::with_capacity(depth),
            woke: false,
            queued_now: Vec::with_capacity(depth),
            gated: VecDeque::new(),
            held: Vec::new(),
            mirror: None,
            mirror_held: VecDeque::new(),
            area: 0.0,
            last_now: t0,
            wait_area: 0.0,
            last_wait,
            iv: [DirStats::new(open_loop), DirStats::new(open_loop)],
            measuring: job.ramp_time.is_zero(),
            timed_start: t0,
            next_tick: t0 + interval,
            last_tick: t0,
            ru_start: thread_rusage(),
            next_intended,
            not_before: None,
            since_think: 0,
            writes_since_sync: 0,
            sync_pending: false,
            exhausted: false,
            more_to_issue: false,
        }
    }

    /// Runs passes until the job is done, stopped, failed or given up on; `finish` then
    /// ends the run.
    pub(super) fn run(&mut self) {
        loop {
            let now = Instant::now();
            self.carry_to(now);
            self.tick(now);
            let stopping = self.stopping(now);
            self.release_held(now, stopping);
            self.start_gated(now, stopping);
            self.issue(now, stopping);
            self.submit_queued();
            if self.inflight == 0 {
                if self.idle(now, stopping) {
                    break;
                }
                continue;
            }
            if stopping
                && self.completions.is_empty()
                && self.seen.is_empty()
                && self.give_up_if_quiet(now)
            {
                break;
            }
            self.reap(stopping);
            self.complete(now);
        }
    }

    /// The top of a pass: the depth integrals are carried to `now`.
    #[inline]
    fn carry_to(&mut self, now: Instant) {
        self.area += self.inflight as f64
            * now.saturating_duration_since(self.last_now).as_nanos() as u64 as f64;
        if !self.reap_all {
            // (With every completion handled at once, the few held for one pass are taken out
            // of `area` when handled, so they must not be counted here too.)
            carry_wait(
                &mut self.wait_area,
                &mut self.last_wait,
                self.seen.len(),
                now,
            );
        }
        self.last_now = self.last_now.max(now);
    }
}

/// Carries the integral of finished IOs waiting to be handled (`waiting` of them since `last`)
/// to `to`.
fn carry_wait(area: &mut f64, last: &mut Instant, waiting: usize, to: Instant) {
    *area += waiting as f64 * to.saturating_duration_since(*last).as_nanos() as u64 as f64;
    *last = (*last).max(to);
}
