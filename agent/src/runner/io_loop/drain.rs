//! Drain: the end of the run. When to stop (deadline, failure, a stop request), giving up on
//! IOs a device never answers, and what follows the last IO: the last interval, end_fsync,
//! the thread's CPU use, verification, or the resources left to a dead device.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use super::super::clone::{thread_rusage, tv};
use super::tick::absolute;
use super::{IoLoop, Slot};
use crate::job::JobSpec;
use crate::job::errpolicy::{self, ErrorCount, ErrorKind};
use crate::layout::PlannedFile;
use crate::stats::{JobStats, STUCK_LIMIT, StuckIo, record};
use crate::verify::{self, VerifyReport};

impl IoLoop<'_> {
    /// Whether the loop is stopping (the deadline passed, an IO failed, a stop was asked);
    /// once stopping, the deadline is brought to now so that completions seen later are not
    /// held back any more.
    #[inline]
    pub(super) fn stopping(&mut self, now: Instant) -> bool {
        let time_up = self.deadline.is_some_and(|d| now >= d);
        let stopping = time_up || self.failure.is_some() || self.opts.stop.load(Ordering::Relaxed);
        if stopping {
            self.deadline = Some(now.min(self.deadline.unwrap_or(now)));
        }
        stopping
    }

    /// Draining with nothing seen: once no IO has completed for the drain limit, the IOs
    /// still in flight are given up on. True when they were (the loop ends).
    pub(super) fn give_up_if_quiet(&mut self, now: Instant) -> bool {
        let since = *self.last_progress.get_or_insert(now);
        // A last look first: after a pause of this process (SIGSTOP, a VM freeze) the
        // completions may be there, only not yet seen.
        if now.saturating_duration_since(since) < self.drain_limit
            || !self
                .engine
                .reap(0, Some(Duration::ZERO), &mut self.completions)
                .is_ok_and(|()| self.completions.is_empty())
        {
            return false;
        }
        self.abandoned = self.inflight;
        let msg = give_up(
            &mut self.report.stats,
            self.plan,
            &mut self.slots,
            self.t0,
            now,
            self.deadline.map(|d| now.saturating_duration_since(d)),
            self.drain_limit,
        );
        self.failure = Some(match self.failure.take() {
            Some(f) => format!("{f}; then {msg}"),
            None => msg,
        });
        true
    }

    /// fsync (or fdatasync) of every file of the clone, timed when measuring.
    pub(super) fn sync(&mut self) {
        let job = self.job;
        for f in &self.files {
            let t = Instant::now();
            let r = if job.fdatasync > 0 && job.fsync == 0 {
                f.sync_data()
            } else {
                f.sync_all()
            };
            if let Err(e) = r {
                self.failure
                    .get_or_insert_with(|| format!("fsync failed: {e}"));
            }
            if self.measuring {
                let stats = &mut self.report.stats;
                stats.sync.ios += 1;
                record(&mut stats.sync.lat, t.elapsed().as_nanos() as u64);
            }
        }
    }

    /// Ends the run after the last pass: the last interval, end_fsync, the thread's CPU use,
    /// then verification, or, when IOs were given up on, the resources left to the device.
    /// The clone's error, if any.
    pub(in crate::runner) fn finish(mut self) -> Result<(), String> {
        let end = Instant::now();
        if self.measuring {
            self.area += self.inflight as f64
                * end.saturating_duration_since(self.last_now).as_nanos() as u64 as f64;
            self.close_interval(self.last_tick, end);
            self.report.stats.runtime = end - self.timed_start;
        }
        if self.failure.is_none() && self.job.end_fsync && !self.null {
            self.sync();
        }
        let ru = thread_rusage();
        let ru_start = &self.ru_start;
        let stats = &mut self.report.stats;
        stats.usr_cpu = tv(ru.ru_utime).saturating_sub(tv(ru_start.ru_utime));
        stats.sys_cpu = tv(ru.ru_stime).saturating_sub(tv(ru_start.ru_stime));
        stats.ctx = (ru.ru_nvcsw + ru.ru_nivcsw - ru_start.ru_nvcsw - ru_start.ru_nivcsw) as u64;
        stats.minf = (ru.ru_minflt - ru_start.ru_minflt) as u64;
        stats.majf = (ru.ru_majflt - ru_start.ru_majflt) as u64;
        self.report.started = SystemTime::now() - (end - self.timed_start);
        if self.abandoned > 0 {
            self.leave_to_device()
        } else {
            self.verify()
        }
    }

    /// The kernel still owns the IOs given up on: it may yet write into their buffers, and
    /// closing, syncing, verifying or removing the files would wait on the same device (a
    /// FUSE close sends a flush). So the engine, the buffers and the open files are left to
    /// the process, a bounded leak per clone, and the files stay where they are.
    fn leave_to_device(self) -> Result<(), String> {
        std::mem::forget(self.engine);
        std::mem::forget(self.buffers);
        std::mem::forget(self.files);
        if let Some(h) = self.checkpointing {
            drop(h); // detached: it may be writing to the same device
        }
        self.report.abandoned = self.plan.iter().map(|f| f.path.clone()).collect();
        if self.verifying && !self.vstate.is_empty() {
            self.report.verify = Some(VerifyReport {
                errors: vec![format!(
                    "not verified: {} IO(s) never completed (the device stopped answering)",
                    self.abandoned
                )],
                ..Default::default()
            });
        }
        Err(self.failure.unwrap_or_default())
    }

    /// Closes the engine, then checks and saves what a verifying clone wrote.
    fn verify(self) -> Result<(), String> {
        let mut failure = self.failure;
        // The ring goes before the buffers it registered.
        drop(self.engine);
        // The final state must not be overwritten by a checkpoint still being written.
        if let Some(h) = self.checkpointing {
            let _ = h.join();
        }
        let (job, plan, vstate, report) = (self.job, self.plan, &self.vstate, self.report);
        if self.verifying && !vstate.is_empty() {
            let names: Vec<String> = plan.iter().map(|f| absolute(&f.path)).collect();
            let mut r = if self.opts.stop.load(Ordering::Relaxed) {
                VerifyReport {
                    errors: vec!["stopped before verification".into()],
                    ..Default::default()
                }
            } else {
                verify::check(vstate, &self.files, &names)
            };
            if let Some(first) = plan.first().filter(|f| verify::state_has_a_place(&f.scope)) {
                let sp = verify::state_path(&first.path, &job.name, self.clone);
                match verify::save(&first.scope, &sp, &job.name, self.clone, &names, vstate) {
                    Ok(()) => r.state_files.push(absolute(&sp)),
                    Err(e) => r.errors.push(format!("saving the verify state: {e}")),
                }
            }
            if r.bad() > 0
                && failure.is_none()
                && !verify_goes_on(job, &mut report.stats.errors, r.bad())
            {
                let first: Vec<String> = r
                    .findings
                    .iter()
                    .take(10)
                    .map(|f| format!("{}@{}: {:?}", f.file, f.offset, f.kind))
                    .collect();
                failure = Some(format!(
                    "verify (crc32c) failed on {} of {} blocks of job '{}': {}",
                    r.bad(),
                    r.blocks,
                    job.name,
                    first.join(", ")
                ));
            }
            report.verify = Some(r);
        }
        match failure {
            Some(f) => Err(f),
            None => Ok(()),
        }
    }
}

/// Counts the blocks verification found bad as fio counts verify errors (EILSEQ each) and
/// says whether they leave the job without an error (`continue_on_error=verify` or `all`).
fn verify_goes_on(job: &JobSpec, count: &mut ErrorCount, bad: u64) -> bool {
    job.on_error
        .on_error(count, ErrorKind::Verify, errpolicy::EILSEQ, bad)
}

/// Gives up on the IOs still in flight after the job's end: each is listed as stuck, not
/// completed, and the returned message says how many, for how long and what it means.
fn give_up(
    stats: &mut JobStats,
    files: &[PlannedFile],
    slots: &mut [Option<Slot>],
    t0: Instant,
    now: Instant,
    past_end: Option<Duration>,
    quiet_for: Duration,
) -> String {
    let mut n = 0;
    for s in slots.iter_mut().flatten() {
        let age = now.saturating_duration_since(s.ready).as_nanos() as u64;
        s.stuck = Some(note_stuck(stats, files, s, t0, age, false));
        n += 1;
    }
    let mut names: Vec<String> = files.iter().map(|f| f.path.display().to_string()).collect();
    names.dedup();
    format!(
        "the device stopped answering: {n} IO(s) still in flight {:.1} s after the job's end, none \
         completed for {:.1} s (stuck_timeout); gave up waiting for them (listed as stuck IOs). \
         Files left in place: {}",
        past_end.unwrap_or_default().as_secs_f64(),
        quiet_for.as_secs_f64(),
        names.join(", ")
    )
}

/// Lists (or updates) a stuck IO; returns its index in the list (`u32::MAX`: counted, not
/// listed, the list being full).
pub(super) fn note_stuck(
    stats: &mut JobStats,
    files: &[PlannedFile],
    slot: &Slot,
    t0: Instant,
    took_ns: u64,
    completed: bool,
) -> u32 {
    let latency_ms = took_ns / 1_000_000;
    if let Some(i) = slot.stuck {
        if let Some(s) = stats.stuck.get_mut(i as usize) {
            s.latency_ms = latency_ms;
            s.completed = completed;
        }
        return i;
    }
    stats.stuck_count += 1;
    if stats.stuck.len() >= STUCK_LIMIT {
        return u32::MAX;
    }
    stats.stuck.push(StuckIo {
        file: files
            .get(slot.file as usize)
            .map(|f| f.path.display().to_string())
            .unwrap_or_default(),
        offset: slot.offset,
        len: slot.len,
        direction: slot.dir,
        start_ms: slot.ready.saturating_duration_since(t0).as_millis() as u64,
        latency_ms,
        completed,
    });
    (stats.stuck.len() - 1) as u32
}
