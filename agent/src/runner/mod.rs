//! Runs jobs: one OS thread per job clone, each with its own engine, buffers and generator.
//!
//! The hot loop (`io_loop`) takes a clock reading at the top of each pass, one after each
//! submit and one when completions are seen (one for all of them), records into per-interval
//! histograms, and folds them into the job's totals once per interval, so per-IO cost is a
//! generator step, an engine queue and three histogram increments. On io_uring it interleaves
//! as fio does: one IO per submit, the completions made visible by that submit taken without a
//! system call, and a wait only when no slot is free.
//!
//! Time line of a clone: set-up (open, allocate) → start barrier shared by its stonewall group →
//! `startdelay` → `ramp_time` (IO runs, nothing is kept) → timed part (`runtime`, or until the
//! generator is done) → `end_fsync` → verify. Groups (split at `stonewall`) run one after the other.
//!
//! The files: this one (options, `prepare`, `execute`), `group` (a stonewall group's threads
//! and start barrier), `clone` (one clone's set-up and start), `io_loop` (the IO loop as a
//! state machine), `buffers`, `clock` (the synchronized start and the loop's sleeps).

mod buffers;
mod clock;
mod clone;
mod group;
mod io_loop;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

pub use clock::{RestorePolicy, wait_until_realtime};

use crate::budget;
use crate::engine;
use crate::fault::{IoFault, IoGate};
use crate::job::{EngineKind, JobSpec};
use crate::layout::{self, CreatedFiles, LayoutError, LayoutProgress, PlannedFile};
use crate::limits;
use crate::report::RunReport;
use crate::stats::{DirStats, IntervalSummary};
use crate::verify;
use group::run_group;

/// A finished interval of one job clone, with its own (not cumulative) histograms. The agent
/// daemon ships these to the coordinator; a standalone run ignores them.
pub struct IntervalSnapshot<'a> {
    /// Which interval of the clone's timed part this is (0-based).
    pub index: usize,
    pub job_index: usize,
    pub job_name: &'a str,
    pub clone: u32,
    pub summary: &'a IntervalSummary,
    pub dirs: &'a [DirStats; 2],
}

pub trait IntervalSink: Send + Sync {
    fn on_interval(&self, snapshot: IntervalSnapshot<'_>);
    /// IO of a stonewall group began (every clone of the group passed the start barrier).
    fn on_group_started(&self, _groupid: u32, _at: SystemTime) {}
    /// A clone finished; it reports no more intervals.
    fn on_clone_done(&self, _job_index: usize, _clone: u32) {}
}

/// Faults for one job clone's IO path (built by the caller from a plan's fault schedule).
#[derive(Default)]
pub struct CloneFaults {
    pub gate: Option<Box<dyn IoGate>>,
    pub fault: Option<Box<dyn IoFault>>,
    /// Called first on the clone's thread, before its engine starts any thread of its own
    /// (the kernel throttle moves the thread into its cgroup here). An error ends the clone.
    pub enter: Option<Box<dyn FnOnce() -> Result<(), String> + Send>>,
    /// Where the clone's writes are mirrored (a plan role's `mirror`), see `crate::mirror`.
    pub mirror: Option<Box<dyn MirrorHook>>,
}

/// The IO loop's side of a mirror: each write finished locally is handed over, and in sync
/// mode its completion waits until the mirror releases its sequence number (the backup's ack,
/// or a fail-over). Only an atomic load per pass while writes wait, so the loop stays cheap.
pub trait MirrorHook: Send {
    /// The clone's files, before its first write: `written`'s `file` indexes them, and a
    /// catch-up reads what the backup missed back from them.
    fn files(&mut self, files: &[crate::layout::PlannedFile]);
    /// A write of `data` (the IO's own buffer: the bytes the file now holds) at `offset` of
    /// file `file` finished locally at `done`, `local_ns` after it was ready (fio's lat:
    /// submission and completion). `Some(seq)`: the IO completes only once
    /// `released() >= seq`.
    fn written(
        &mut self,
        file: u32,
        offset: u64,
        data: &[u8],
        local_ns: u64,
        done: Instant,
    ) -> Option<u64>;
    /// Every held write up to this sequence number may complete.
    fn released(&self) -> u64;
    /// Sleeps until `released() >= seq` or `until`: the loop's wait when only writes held for
    /// the mirror are in flight, woken by the ack itself rather than by polling.
    fn wait_released(&self, seq: u64, until: Instant);
    /// The held write `seq` completed for the job at `at`, `total_ns` after it was ready.
    fn finished(&mut self, seq: u64, total_ns: u64, at: Instant);
}

/// Builds the faults of (job index, clone); `None` for no faults.
pub type FaultFactory = dyn Fn(usize, u32) -> CloneFaults + Send + Sync;

/// Cumulative counters for a live view, updated once per interval by every clone.
#[derive(Debug, Default)]
pub struct LiveCounters {
    pub ios: [AtomicU64; 2],
    pub bytes: [AtomicU64; 2],
    pub errors: AtomicU64,
    /// Clones still running.
    pub running: AtomicU64,
}

pub struct RunOptions {
    pub allow_block_devices: bool,
    pub keep_files: bool,
    /// Set to stop every job early (Ctrl-C, coordinator abort); results so far are kept.
    pub stop: Arc<AtomicBool>,
    pub interval: Duration,
    pub sink: Option<Arc<dyn IntervalSink>>,
    pub live: Arc<LiveCounters>,
    pub faults: Option<Arc<FaultFactory>>,
    /// Draws layout progress (a hidden bar when not on a terminal).
    pub layout_progress: Box<dyn LayoutProgress + Send + Sync>,
    /// Begin IO at this instant of the system clock (the coordinator's synchronized start,
    /// already converted to this host's clock); every clone is set up and waiting before it.
    pub start_at: Option<SystemTime>,
    /// A verifying clone's state table larger than this goes to a file on the volume
    /// (`verify::IN_MEMORY_LIMIT`; tests make it small).
    pub verify_memory_limit: u64,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            allow_block_devices: false,
            keep_files: false,
            stop: Arc::new(AtomicBool::new(false)),
            interval: Duration::from_secs(1),
            sink: None,
            live: Arc::new(LiveCounters::default()),
            faults: None,
            layout_progress: Box::new(layout::NoProgress),
            start_at: None,
            verify_memory_limit: verify::IN_MEMORY_LIMIT,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("job '{job}': {message}")]
    Setup { job: String, message: String },
    /// The run does not fit the host (memory, threads, open files, disk): refused before IO.
    #[error(transparent)]
    Budget(#[from] budget::BudgetError),
}

/// Runs every job of a job file and returns what they measured: `prepare` then `execute`.
/// Set-up problems (bad targets, layout failures) are errors before any timed IO; IO errors
/// during the run end the job that hit them (as fio's default `continue_on_error=none`) and are
/// reported in its `JobReport`, unless the job's `continue_on_error` covers them: then they are
/// counted and the job goes on (see `errpolicy`).
pub fn run_jobs(jobs: &[JobSpec], opts: &RunOptions) -> Result<RunReport, RunError> {
    Ok(prepare(jobs, opts)?.execute(opts))
}

/// Jobs whose targets are checked and laid out, ready to start at an instant: the agent daemon
/// prepares before the coordinator's synchronized start so that no layout delays it.
pub struct PreparedRun {
    jobs: Vec<JobSpec>,
    plans: Vec<Vec<Vec<PlannedFile>>>,
    created: CreatedFiles,
}

/// Validates every job, checks that the run fits the host's memory, threads and open files,
/// plans every file and checks that they fit the free disk space (anything refused is
/// refused before anything is written) and lays files out: files that are read or verified
/// are filled with data first.
pub fn prepare(jobs: &[JobSpec], opts: &RunOptions) -> Result<PreparedRun, RunError> {
    let mut clones = 0u64;
    for job in jobs {
        validate(job)?;
        clones += job.numjobs as u64;
        if let Some(problem) = limits::total_jobs_problem(clones) {
            return Err(RunError::Setup {
                job: job.name.clone(),
                message: format!("{}: numjobs={}: {problem}", job.origin, job.numjobs),
            });
        }
    }
    budget::check_host(jobs, &budget::host_figures())?;
    let mut plans: Vec<Vec<Vec<PlannedFile>>> = Vec::new();
    for job in jobs {
        let mut per_clone = Vec::new();
        for clone in 0..job.numjobs {
            per_clone.push(if job.engine == EngineKind::Null {
                Vec::new()
            } else {
                layout::plan_files(job, clone)?
            });
        }
        plans.push(per_clone);
    }
    check_verified_files_are_private(jobs, &plans)?;
    let all_files: Vec<PlannedFile> = plans.iter().flatten().flatten().cloned().collect();
    budget::check_disk(&budget::disk_needs(&all_files))?;
    let mut created = CreatedFiles::default();
    let needs_data = |j: &JobSpec| j.pattern.reads() || j.verify.is_some();
    let files_of = |want_data: bool| -> Vec<PlannedFile> {
        jobs.iter()
            .zip(&plans)
            .filter(|(j, _)| needs_data(j) == want_data)
            .flat_map(|(_, p)| p.iter().flatten().cloned())
            .collect()
    };
    let steps = [(files_of(true), true), (files_of(false), false)];
    for (files, fill) in &steps {
        if let Err(e) = layout::lay_out(
            files,
            *fill,
            opts.allow_block_devices,
            &mut created,
            &*opts.layout_progress,
        ) {
            created.remove_all();
            return Err(e.into());
        }
    }
    Ok(PreparedRun {
        jobs: jobs.to_vec(),
        plans,
        created,
    })
}

/// The bytes `prepare` will write to lay these jobs out (`layout::bytes_to_fill` over the files
/// it fills with data), for a progress total known before the first byte. Jobs whose files
/// cannot be planned count for nothing: `prepare` refuses them with the reason.
pub fn layout_bytes(jobs: &[JobSpec]) -> u64 {
    let files: Vec<PlannedFile> = jobs
        .iter()
        .filter(|j| j.engine != EngineKind::Null && (j.pattern.reads() || j.verify.is_some()))
        .flat_map(|j| (0..j.numjobs).map(move |clone| (j, clone)))
        .filter_map(|(j, clone)| layout::plan_files(j, clone).ok())
        .flatten()
        .collect();
    layout::bytes_to_fill(&files)
}

impl PreparedRun {
    pub fn jobs(&self) -> &[JobSpec] {
        &self.jobs
    }

    /// Runs the jobs now, group after group (split at `stonewall`), then removes the files it
    /// created unless asked to keep them.
    pub fn execute(mut self, opts: &RunOptions) -> RunReport {
        let started = SystemTime::now();
        let t_start = Instant::now();
        let jobs = &self.jobs;
        let mut reports = Vec::new();
        let mut groupid = 0u32;
        let mut i = 0;
        while i < jobs.len() {
            let mut end = i + 1;
            while end < jobs.len() && !jobs[end].stonewall {
                end += 1;
            }
            if opts.stop.load(Ordering::Relaxed) {
                break;
            }
            reports.extend(run_group(jobs, &self.plans, i..end, groupid, opts));
            groupid += 1;
            i = end;
        }
        // Files whose device stopped answering stay: removing them would wait on it too.
        self.created.files.retain(|f| {
            let p = &f.path;
            let abandoned = reports.iter().any(|r| r.abandoned.contains(p));
            if abandoned {
                tracing::warn!(
                    "{}: left in place, its device stopped answering; remove it once the device is back",
                    p.display()
                );
            }
            !abandoned
        });
        self.discard(opts.keep_files);
        // A verify state is only worth keeping beside the data it describes.
        for r in &mut reports {
            if let Some(v) = r.verify.as_mut() {
                let scope = &r.spec.scope;
                v.state_files.retain(|sp| {
                    let keep = verify::data_files_exist(std::path::Path::new(sp));
                    if !keep {
                        let _ = scope.remove(std::path::Path::new(sp));
                    }
                    keep
                });
            }
        }
        RunReport {
            jobs: reports,
            started,
            elapsed: t_start.elapsed(),
        }
    }

    /// Removes what `prepare` created (unless `keep`), for a run that will not start.
    pub fn discard(&mut self, keep: bool) {
        if !keep {
            for problem in self.created.remove_all() {
                tracing::warn!("{problem}");
            }
        }
    }
}

/// A verifying clone keeps the generation of every block it wrote, so no other clone may
/// write its files: clones sharing a file (`filename=` with `numjobs` > 1, or two jobs naming
/// one file) would overwrite each other's blocks and every overwritten block would be
/// reported as lost. Refused before anything is written.
fn check_verified_files_are_private(
    jobs: &[JobSpec],
    plans: &[Vec<Vec<PlannedFile>>],
) -> Result<(), RunError> {
    let mut writers: HashMap<&std::path::Path, Vec<(usize, u32)>> = HashMap::new();
    for (j, per_clone) in plans.iter().enumerate() {
        if !jobs[j].pattern.writes() {
            continue;
        }
        for (c, files) in per_clone.iter().enumerate() {
            for f in files {
                let users = writers.entry(f.path.as_path()).or_default();
                if !users.contains(&(j, c as u32)) {
                    users.push((j, c as u32));
                }
            }
        }
    }
    for (path, users) in &writers {
        if users.len() < 2 {
            continue;
        }
        if let Some(&(j, _)) = users.iter().find(|&&(j, _)| jobs[j].verify.is_some()) {
            let who: Vec<String> = users
                .iter()
                .map(|&(j, c)| format!("'{}' clone {c}", jobs[j].name))
                .collect();
            return Err(RunError::Setup {
                job: jobs[j].name.clone(),
                message: format!(
                    "verify=crc32c needs files no other job or clone writes, but {} is written by {}; \
                     verification is per clone, so give each clone its own files (drop filename= and \
                     use directory=, or numjobs=1)",
                    path.display(),
                    who.join(", ")
                ),
            });
        }
    }
    Ok(())
}

fn validate(job: &JobSpec) -> Result<(), RunError> {
    let err = |message: String| RunError::Setup {
        job: job.name.clone(),
        message,
    };
    if let Some(problem) = limits::numjobs_problem(job.numjobs) {
        return Err(err(format!(
            "{}: numjobs={}: {problem}",
            job.origin, job.numjobs
        )));
    }
    if let Some(problem) = limits::iodepth_problem(job.engine, job.iodepth) {
        return Err(err(format!(
            "{}: iodepth={}: {problem}",
            job.origin, job.iodepth
        )));
    }
    // Where io_uring is refused, io_uring and libaio jobs fall back to a thread per IO in
    // flight; a depth that fallback cannot run is refused now, not when the clone starts.
    let uring = matches!(job.engine, EngineKind::IoUring | EngineKind::Libaio);
    if uring && job.iodepth > limits::MAX_SYNC_WORKERS && !engine::uring_available() {
        return Err(err(format!(
            "{}: iodepth={}: io_uring is not available here, and the pread/pwrite fallback \
             runs at most {} IOs in flight (one thread each); lower iodepth or allow io_uring",
            job.origin,
            job.iodepth,
            limits::MAX_SYNC_WORKERS
        )));
    }
    if job.time_based && job.runtime.is_none() {
        return Err(err(
            "time_based needs runtime= (otherwise the job never ends)".into(),
        ));
    }
    if job.direct {
        for &(bs, _) in job.bs.iter().flatten() {
            if bs % 512 != 0 {
                return Err(err(format!(
                    "direct=1 needs block sizes that are multiples of 512; bs={bs}"
                )));
            }
        }
    }
    if job.max_bs() > u32::MAX as u64 / 2 {
        return Err(err(format!(
            "block size {} is too large (at most 1 GiB)",
            job.max_bs()
        )));
    }
    if job.verify.is_some() && job.pattern.writes() {
        verify::check_job(job).map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Jobs that did not come from a job file (built in code, or edited after parsing) meet the
    /// same limits before anything is planned or written.
    #[test]
    fn validate_bounds_clones_and_depth() {
        let origin = crate::job::Origin {
            file: "t.fio".into(),
            line: 3,
        };
        let mut j = JobSpec::with_defaults("j", origin);
        j.iodepth = 100_000;
        let e = validate(&j).unwrap_err().to_string();
        assert!(
            e.contains("t.fio:3") && e.contains("iodepth=100000: at most 65536"),
            "{e}"
        );
        j.iodepth = 1;
        j.numjobs = 100_000;
        let e = validate(&j).unwrap_err().to_string();
        assert!(e.contains("numjobs=100000: at most 4096"), "{e}");
        j.numjobs = 1;
        j.engine = EngineKind::IoUring;
        j.iodepth = 40_000;
        let e = validate(&j).unwrap_err().to_string();
        assert!(
            e.contains("iodepth=40000: at most 32768 with ioengine=io_uring"),
            "{e}"
        );
    }
}
